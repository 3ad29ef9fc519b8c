"""The package around the ops: the loader's messages, the benchmark harness and CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import weakref
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA

import opforge
from opforge import _loader
from opforge.bench import SPECS, harness
from opforge.bench.harness import Case, Spec
from opforge.bench.timing import last_level_cache_bytes

CPU = torch.device("cpu")


def test_ops_are_registered():
    assert hasattr(torch.ops.opforge, "vector_add")
    schema = str(torch.ops.opforge.vector_add.default._schema)
    assert schema == "opforge::vector_add(Tensor a, Tensor b) -> Tensor"


def test_loader_reports_version_mismatch(monkeypatch):
    config = _loader._build_config()
    monkeypatch.setattr(config, "TORCH_VERSION", "1.0.0")
    with pytest.raises(
        ImportError,
        match=rf"built against torch 1\.0\.0 but torch {re.escape(torch.__version__)} is installed",
    ) as e:
        _loader.load_extension()
    # Both ways out: the torch it was built against (a wheel's user), or a rebuild (a checkout's).
    message = str(e.value)
    assert "Install that torch: pip install torch==1.0.0; or rebuild opforge against this torch" in message


def test_loader_names_the_torch_build_it_needs(monkeypatch):
    """A local version (+cu130, +cpu) can't be pinned in a requirement: the message names it."""
    config = _loader._build_config()
    monkeypatch.setattr(config, "TORCH_VERSION", "1.0.0+cu999")
    with pytest.raises(ImportError, match=r"pip install torch==1\.0\.0 \(its \+cu999 build\)"):
        _loader.load_extension()
    release = torch.__version__.split("+")[0]
    monkeypatch.setattr(config, "TORCH_VERSION", release + "+other")  # same release, other build
    with pytest.raises(ImportError, match=rf"built against torch {re.escape(release)}\+other but"):
        _loader.load_extension()


def test_loader_reports_missing_build(monkeypatch):
    monkeypatch.setattr(_loader, "_build_config", lambda: None)
    real_import = _loader.importlib.import_module

    def fake_import(name, *args):
        if name == "opforge._C":
            raise ImportError("No module named 'opforge._C'")
        return real_import(name, *args)

    monkeypatch.setattr(_loader.importlib, "import_module", fake_import)
    with pytest.raises(ImportError, match=r"compiled extension \(opforge\._C\) is not built; rebuild"):
        _loader.load_extension()


@pytest.mark.slow
def test_harness_runs_checks_and_writes(tmp_path):
    a, b = torch.randn(1000), torch.randn(1000)

    def cases(device, full):
        ok = Case(
            "vector_add",
            "tiny ok",
            {"opforge": lambda: opforge.vector_add(a, b), "torch.add": lambda: a + b},
            check=lambda: None,
            bytes=3 * 4000,
        )
        wrong = Case(
            "vector_add", "tiny wrong", {"opforge": lambda: a}, check=lambda: "planted mismatch", bytes=1
        )
        return [lambda: ok, lambda: wrong]

    result = harness.run([Spec("vector_add", cases)], CPU, full=False, rounds=1)
    ok, wrong = result["rows"]
    assert ok["error"] is None and set(ok["impls"]) == {"opforge", "torch.add"}
    assert ok["impls"]["opforge"]["ms"] > 0 and ok["impls"]["opforge"]["gbps"] > 0
    assert ok["impls"]["torch.add"]["speedup_of_opforge"] == pytest.approx(
        ok["impls"]["torch.add"]["ms"] / ok["impls"]["opforge"]["ms"]
    )
    assert wrong["error"] == "planted mismatch" and wrong["impls"] == {}  # never timed
    for key in ("device", "torch", "date", "commit", "copy_gbps", "llc_bytes"):
        assert key in result["meta"]
    assert result["meta"]["peak_rss_bytes"] > 1 << 20  # a live process with torch loaded
    assert "cuda_max_reserved_bytes" not in result["meta"]  # CUDA's peaks only on CUDA
    paths = harness.write(result, str(tmp_path))
    assert json.load(open(paths[0]))["rows"][0]["case"] == "tiny ok"
    md = open(paths[1]).read()
    assert "FAILED CHECK: planted mismatch" in md and "tiny ok" in md and result["meta"]["torch"] in md
    assert "Peak memory: host RSS" in md and "peak memory: host RSS" in harness.to_table(result)


@pytest.mark.slow
def test_harness_builds_one_case_at_a_time():
    """A case's inputs are allocated when it is about to run and freed before the next is built,
    whether its check passed, failed or raised."""
    refs: list[weakref.ref] = []
    seen: list[tuple[str, int]] = []

    def alive() -> int:
        return sum(r() is not None for r in refs)

    def build(kind: str) -> Case:
        seen.append(("build", alive()))
        x = torch.randn(1000)
        refs.append(weakref.ref(x))

        def check() -> str | None:
            seen.append(("check", alive()))
            if kind == "raises":
                raise RuntimeError("planted")
            return "planted mismatch" if kind == "wrong" else None

        return Case("t", kind, {"opforge": lambda: x + 1}, check=check)  # the closures keep x alive

    kinds = ["ok", "wrong", "raises", "ok"]
    spec = Spec("t", lambda device, full: [partial(build, k) for k in kinds])
    result = harness.run([spec], CPU, full=False, rounds=1)
    assert [row["case"] for row in result["rows"]] == kinds
    assert [row["error"] is None for row in result["rows"]] == [True, False, False, True]
    assert seen == [("build", 0), ("check", 1)] * len(kinds)
    assert alive() == 0


def test_listing_the_real_cases_allocates_nothing(monkeypatch):
    """The specs list builders; only building a case allocates its inputs (CPU and CUDA lists)."""
    calls: list[str] = []
    for name in ("randn", "rand", "randint", "empty"):
        real = getattr(torch, name)
        monkeypatch.setattr(
            torch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for device in (CPU, torch.device("cuda")):
        builders = {op: list(spec.cases(device, True)) for op, spec in SPECS.items()}
        assert builders["vector_add"] and builders["matmul"] and calls == []  # nms: [] without torchvision
    case = SPECS["vector_add"].cases(CPU, True)[0]()  # the patch sees a build's allocations
    assert isinstance(case, Case) and calls


@pytest.mark.slow
def test_case_context_wraps_check_and_timing():
    events: list[str] = []

    class Context:
        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    def build(raises: bool) -> Case:
        def check() -> str | None:
            events.append("check")
            if raises:
                raise RuntimeError("planted")
            return None

        return Case(
            "t", f"raises={raises}", {"opforge": lambda: events.append("time")}, check, context=Context
        )

    events_of = {}
    for raises in (False, True):
        events.clear()
        (row,) = harness.run([Spec("t", lambda d, f, r=raises: [partial(build, r)])], CPU, False, rounds=1)[
            "rows"
        ]
        events_of[raises] = list(dict.fromkeys(events))  # the timer calls the impl many times
        assert (row["error"] is None) != raises
    assert events_of[False] == ["enter", "check", "time", "exit"] and events[-1] == "exit"
    assert events_of[True] == ["enter", "check", "exit"]


@pytest.mark.parametrize("initial", [True, False])
def test_matmul_spec_restores_tf32(monkeypatch, initial):
    """The real matmul spec runs fp32 with TF32 off and leaves the caller's setting as it was."""
    flags: list[bool] = []
    real = opforge.matmul

    def spy(*args, **kwargs):
        flags.append(torch.backends.cuda.matmul.allow_tf32)
        return real(*args, **kwargs)

    monkeypatch.setattr(opforge, "matmul", spy)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = initial
    try:
        result = harness.run([SPECS["matmul"]], CPU, full=False, rounds=1)
        after = torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert after == initial
    assert all(row["error"] is None for row in result["rows"])
    assert flags and not any(flags)  # every fp32 call ran with TF32 off


def test_cache_resident_rows_are_labelled(tmp_path, monkeypatch):
    meta = {
        "device": "CPU",
        "device_type": "cpu",
        "torch": "x",
        "cuda": None,
        "python": "3",
        "mode": "quick",
        "date": "d",
        "commit": "c",
        "copy_gbps": 50.0,
        "llc_bytes": 32 << 20,
    }

    def row(case, nbytes, gbps):
        impls = {"opforge": {"ms": 1.0, "gbps": gbps, "speedup_of_opforge": 1.0}}
        return {
            "op": "vector_add",
            "case": case,
            "params": {},
            "bytes": nbytes,
            "error": None,
            "impls": impls,
        }

    rows = [row("fits", 12 << 20, 40.0), row("fast", 1 << 30, 200.0), row("dram", 1 << 30, 52.0)]
    assert [harness.cache_resident(r, meta) for r in rows] == [True, True, False]
    cuda = dict(meta, device_type="cuda", llc_bytes=None)  # L2 flushed: only the rate says
    assert [harness.cache_resident(r, cuda) for r in rows] == [False, True, False]
    assert not harness.cache_resident(row("nms", None, 0.0), meta)
    for r in rows:
        r["cache_resident"] = harness.cache_resident(r, meta)
    result = {"meta": meta, "rows": rows}
    for text in (harness.to_markdown(result), harness.to_table(result)):
        assert "fits (cache-resident)" in text and "fast (cache-resident)" in text
        assert "dram (cache-resident)" not in text and "dram" in text
    harness.write(result, str(tmp_path), make_plot=False)
    assert [r["cache_resident"] for r in json.load(open(tmp_path / "results.json"))["rows"]] == [
        True,
        True,
        False,
    ]

    plt = pytest.importorskip("matplotlib.pyplot")
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    assert harness.plot(result, str(tmp_path / "results.png"))
    ax = figs[0].axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert [bool(p.get_hatch()) for p in bars] == [True, True, False]
    assert ["cache-resident" in t.get_text() for t in ax.get_xticklabels()] == [True, True, False]


def test_last_level_cache_bytes(tmp_path):
    for index, size in (("index0", "32K"), ("index2", "1024K"), ("index3", "32M")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert last_level_cache_bytes(CPU, str(tmp_path / "index*" / "size")) == 32 << 20
    assert last_level_cache_bytes(CPU, str(tmp_path / "none*")) > 0  # the fallback
    assert last_level_cache_bytes(torch.device("cuda")) is None


def test_spec_plots_are_written_by_write(tmp_path):
    calls: list[str] = []

    def extra(result, out_dir):
        calls.append(out_dir)
        path = os.path.join(out_dir, "extra.txt")
        open(path, "w").write(str(len(result["rows"])))
        return [path]

    spec = Spec("t", lambda device, full: [], plots=(extra,))
    result = {
        "meta": {
            "device": "x",
            "torch": "x",
            "cuda": None,
            "python": "3",
            "date": "d",
            "commit": "c",
            "mode": "quick",
            "copy_gbps": 1.0,
        },
        "rows": [],
    }
    paths = harness.write(result, str(tmp_path), specs=[spec, spec])
    assert calls == [str(tmp_path)] and str(tmp_path / "extra.txt") in paths  # once, though listed twice
    harness.write(result, str(tmp_path), make_plot=False, specs=[spec])
    assert len(calls) == 1


def test_matmul_ladder_plot(tmp_path):
    """write() adds ladder.png through the matmul spec's plots for a CUDA run with matmul rows (a
    synthetic result), not for a CPU one, and not without the spec: the harness has no ladder."""
    pytest.importorskip("matplotlib")

    def row(dtype, variant, ms):
        params = {"m": 64, "k": 64, "n": 64, "dtype": dtype, "variant": variant}
        impls = {
            "opforge": {"ms": ms, "speedup_of_opforge": 1.0},
            "cuBLAS (torch.matmul)": {"ms": ms / 2, "speedup_of_opforge": 0.5},
        }
        return {"op": "matmul", "case": f"{dtype} {variant}", "params": params, "error": None, "impls": impls}

    meta = {
        "device": "GPU",
        "device_type": "cuda",
        "torch": "x",
        "cuda": "13.0",
        "python": "3",
        "mode": "full",
        "date": "d",
        "commit": "c",
        "copy_gbps": 1.0,
    }
    rows = [
        row("torch.float32", "naive", 2.0),
        row("torch.float32", "warp_tiled", 1.0),
        row("torch.bfloat16", "wgmma", 0.5),
    ]
    matmul = [SPECS["matmul"]]
    paths = harness.write({"meta": meta, "rows": rows}, str(tmp_path / "gpu"), specs=matmul)
    assert (
        str(tmp_path / "gpu" / "ladder.png") in paths and (tmp_path / "gpu" / "ladder.png").stat().st_size > 0
    )
    paths = harness.write({"meta": meta, "rows": rows}, str(tmp_path / "nospec"))
    assert not any(p.endswith("ladder.png") for p in paths)
    meta_cpu = dict(meta, device_type="cpu")
    paths = harness.write({"meta": meta_cpu, "rows": rows}, str(tmp_path / "cpu"), specs=matmul)
    assert not any(p.endswith("ladder.png") for p in paths)


def _meta(device_type: str) -> dict:
    return {
        "device": "D",
        "device_type": device_type,
        "torch": "x",
        "cuda": None,
        "python": "3",
        "mode": "quick",
        "date": "d",
        "commit": "c",
        "copy_gbps": 50.0,
    }


def _check_value_axes(figs: list, want: list[str]) -> None:
    """Each panel's value axis: linear from 0, or log and labelled so; ``want`` the scales in order."""
    axes = [ax for fig in figs for ax in fig.axes]
    assert [ax.get_yscale() for ax in axes] == want
    for ax in axes:
        if ax.get_yscale() == "log":
            assert ax.get_ylabel().endswith("(log scale)"), ax.get_ylabel()
        else:
            assert ax.get_ylim()[0] == 0 and "log" not in ax.get_ylabel(), (ax.get_title(), ax.get_ylim())


def test_plot_value_axes_start_at_zero_or_are_log(tmp_path, monkeypatch):
    """A bar's length is its value: linear axes start at 0 (tokens/s 9% apart must not look fivefold
    apart), and a panel whose values span decades is on a log scale that its label names."""
    import matplotlib.pyplot as plt

    def row(op, case, key, values):
        impls = {name: {"ms": 1.0, key: v, "speedup_of_opforge": 1.0} for name, v in values.items()}
        return {"op": op, "case": case, "params": {}, "bytes": None, "error": None, "impls": impls}

    base = float(torch.randint(20_000, 30_000, ()))  # tokens/s
    rows = [
        row("transformers", "prefill", "tps", {"opforge": base * 1.09, "sdpa": base}),
        row("transformers", "decode", "tps", {"opforge": base * 1.02, "sdpa": base * 1.05}),
        row("video", "1080p", "fps", {"opforge": base, "torch chain": base / 40}),
        row("vector_add", "64M", "gbps", {"opforge": 41.0, "torch.add": 40.0}),
    ]
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    assert harness.plot({"meta": _meta("cpu"), "rows": rows}, str(tmp_path / "results.png"))
    _check_value_axes(figs, ["linear", "log", "linear"])
    assert [ax.get_ylabel() for ax in figs[0].axes] == ["tokens/s", "frames/s (log scale)", "GB/s"]


def test_ladder_plot_value_axes(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from opforge.bench.ladder import plot_ladder

    def row(dtype, variant, tflops):
        ms = 2 * 64**3 / (tflops * 1e9)
        impls = {"opforge": {"ms": ms}, "cuBLAS (torch.matmul)": {"ms": ms * 0.9}}
        params = {"m": 64, "k": 64, "n": 64, "dtype": dtype, "variant": variant}
        return {"op": "matmul", "case": variant, "params": params, "error": None, "impls": impls}

    rate = float(torch.rand(())) + 1.0
    rows = [
        row("torch.float32", "naive", rate),
        row("torch.float32", "warp_tiled", rate * 40),  # (decades apart: log)
        row("torch.bfloat16", "mma", rate * 300),
        row("torch.bfloat16", "wgmma", rate * 400),
    ]
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    assert plot_ladder({"meta": _meta("cuda"), "rows": rows}, str(tmp_path / "ladder.png"))
    _check_value_axes(figs, ["log", "linear"])


@pytest.mark.slow
def test_cli_bench_cpu(tmp_path, capsys):
    from opforge.cli import main

    rc = main(["bench", "--device", "cpu", "--ops", "vector_add", "--rounds", "1", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "torch.add" in out and "GB/s" in out and "peak memory: host RSS" in out
    assert {"results.json", "results.md"} <= set(os.listdir(tmp_path))
    result = json.load(open(tmp_path / "results.json"))
    meta = result["meta"]
    assert meta["peak_rss_bytes"] > 0 and meta["llc_bytes"] > 0
    for row in result["rows"]:
        assert row["cache_resident"] == harness.cache_resident(row, meta)
        if row["bytes"] <= meta["llc_bytes"]:
            assert row["cache_resident"] and f"{row['case']} (cache-resident)" in out


def test_cli_rejects_unknown_op(capsys):
    from opforge.cli import main

    assert main(["bench", "--device", "cpu", "--ops", "nope"]) == 2
    assert "unknown op" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_opforge():
    """`python -m opforge ...` is the `opforge` command (opforge/cli.py), run from the tree tested."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(opforge.__file__)))

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "opforge", *args]
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)

    done = run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: opforge") and "bench" in done.stdout and "demo" in done.stdout
    done = run("bench", "--ops", "nonexistent")
    assert done.returncode == 2 and "opforge bench: unknown op(s) ['nonexistent']" in done.stderr
    done = run("demo", "detect", "--help")
    assert done.returncode == 0 and "opforge demo detect" in done.stdout and "--graph" in done.stdout


def test_extension_uses_torchs_libstdcxx():
    """The extension links libstdc++ dynamically (one C++ runtime in the process, torch's):
    a statically linked copy crashed while formatting error messages (see setup.py)."""
    import opforge._C

    with open(opforge._C.__file__, "rb") as f:
        assert b"libstdc++.so" in f.read()


def test_error_message_formats_numbers():
    # The shape in this message is the first integer the extension formats through iostreams.
    with pytest.raises(RuntimeError, match=r"\[2, 3\], got \[3, 2\]"):
        opforge.vector_add(torch.ones(2, 3), torch.ones(3, 2))


def test_cpu_variant_follows_aten_cpu_capability():
    isa = torch.ops.opforge._cpu_isa()
    assert isa in ("avx2", "default")
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        assert isa == "default"
    elif torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and platform.machine() == "x86_64":
        assert isa == "avx2"


def test_readme_python_example_runs(capsys):
    """The README's first Python example runs as written, on the GPU or (without one) on the CPU,
    and prints the device and that the op agreed with ``a + b.t()``."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = re.findall(r"^```python\n(.*?)^```", readme.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert blocks, "README.md has no ```python block"
    exec(compile(blocks[0], str(readme), "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out == f"{'cuda' if HAS_CUDA else 'cpu'} True\n"


def build_progress():
    """scripts/build_progress.py (make build's filter of pip's verbose build output) as a module."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "build_progress.py"
    spec = importlib.util.spec_from_file_location("build_progress", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_progress_shows_one_line_per_file():
    """The configuration once (pip runs setup.py twice), one short line per compiled file, the link,
    warnings (colours stripped) and pip's result; nothing else of the build's output."""
    bp = build_progress()
    root = os.getcwd()
    config = [
        "  opforge build configuration:",
        "    torch            2.14.1 (CUDA None)",
        "    CUDA kernels     no (no GPU visible; OPFORGE_CUDA=1 builds them)",
    ]
    lines = [
        *config,
        "  running dist_info",
        *config,
        "  running build_ext",
        f"  [1/2] c++ -MMD -MF /tmp/t/csrc/a.o.d -O3 -c -c {root}/csrc/a.cpp -o /tmp/t/csrc/a.o -std=c++17",
        "  In file included from csrc/a.h:3,",
        "  \x1b[01m\x1b[Kcsrc/a.cpp:7:9:\x1b[m\x1b[K \x1b[01;35m\x1b[Kwarning: \x1b[m\x1b[Kunused variable 'x'",
        f"  [2/2] /usr/local/cuda/bin/nvcc -c -c {root}/csrc/cuda/b.cu -o /tmp/t/b.o -O3 -lineinfo",
        "  g++ -shared /tmp/t/csrc/a.o /tmp/t/b.o -L/usr/lib -o /tmp/l/opforge/_C.cpython-311-x86_64-linux-gnu.so",
        "  copying /tmp/l/opforge/_C.cpython-311-x86_64-linux-gnu.so -> opforge",
        "Successfully installed opforge-0.1.0",
    ]
    filt = bp.Filter()
    shown = [s for line in lines for s in filt.feed(line + "\n")]
    shown += filt.end_block()
    assert shown[:3] == [line[2:] for line in config]
    assert [re.sub(r"\(\d+:\d\d\)$", "(t)", s) for s in shown[3:]] == [
        "[1/2] csrc/a.cpp  (t)",
        "csrc/a.cpp:7:9: warning: unused variable 'x'",
        "[2/2] csrc/cuda/b.cu  (t)",
        "linking _C.cpython-311-x86_64-linux-gnu.so  (t)",
        "Successfully installed opforge-0.1.0",
    ]
    assert filt.compiled == 2


def test_build_progress_prints_a_failure_in_full(tmp_path, capsys):
    """A failed build: its exit status, and ninja's output from the failure to its end in full
    (the command, every line of the compiler's message), then pip's errors; the log keeps it all."""
    bp = build_progress()
    output = [
        "  [1/3] c++ -c -c csrc/a.cpp -o a.o",
        "  FAILED: b.o",
        "  c++ -O3 -c -c csrc/b.cpp -o b.o",
        "  csrc/b.cpp: In function 'int f()':",
        "  csrc/b.cpp:2:10: error: 'y' was not declared in this scope",
        "      2 |   return y;",
        "        |          ^",
        "  [2/3] c++ -O3 -Wall -c -c csrc/c.cpp -o c.o",
        "  ninja: build stopped: subcommand failed.",
        "  Traceback (most recent call last):",
        "  RuntimeError: Error compiling objects for extension",
        "ERROR: Failed to build installable wheels for some pyproject.toml based projects (opforge)",
    ]
    script = "import sys\nfor line in sys.argv[1:]: print(line)\nsys.exit(3)"
    log = tmp_path / "build.log"
    assert bp.main([str(log), "--", sys.executable, "-c", script, *output]) == 3
    printed = capsys.readouterr().out
    failure = printed[printed.index("its output from the failure on:") :].splitlines()
    assert failure[2:] == [
        *output[1:7],
        "  [2/3] csrc/c.cpp",
        output[8],
        output[11],
        "",
        f"the build failed (exit 3); full log: {log}",
    ]
    assert "Traceback" not in printed
    assert log.read_text().splitlines() == output
