"""The package around the ops: the loader's messages, the benchmark harness and CLI."""

from __future__ import annotations

import json
import os
import platform
import re

import pytest
import torch

import opforge
from opforge import _loader
from opforge.bench import harness
from opforge.bench.harness import Case, Spec


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
    ):
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


def test_harness_runs_checks_and_writes(tmp_path):
    a, b = torch.randn(1000), torch.randn(1000)

    def cases(device, full):
        yield Case(
            "vector_add",
            "tiny ok",
            {"opforge": lambda: opforge.vector_add(a, b), "torch.add": lambda: a + b},
            check=lambda: None,
            bytes=3 * 4000,
        )
        yield Case(
            "vector_add", "tiny wrong", {"opforge": lambda: a}, check=lambda: "planted mismatch", bytes=1
        )

    result = harness.run([Spec("vector_add", cases)], torch.device("cpu"), full=False, rounds=1)
    ok, wrong = result["rows"]
    assert ok["error"] is None and set(ok["impls"]) == {"opforge", "torch.add"}
    assert ok["impls"]["opforge"]["ms"] > 0 and ok["impls"]["opforge"]["gbps"] > 0
    assert ok["impls"]["torch.add"]["speedup_of_opforge"] == pytest.approx(
        ok["impls"]["torch.add"]["ms"] / ok["impls"]["opforge"]["ms"]
    )
    assert wrong["error"] == "planted mismatch" and wrong["impls"] == {}  # never timed
    for key in ("device", "torch", "date", "commit", "copy_gbps"):
        assert key in result["meta"]
    paths = harness.write(result, str(tmp_path))
    assert json.load(open(paths[0]))["rows"][0]["case"] == "tiny ok"
    md = open(paths[1]).read()
    assert "FAILED CHECK: planted mismatch" in md and "tiny ok" in md and result["meta"]["torch"] in md


def test_matmul_ladder_plot(tmp_path):
    """write() adds ladder.png for a CUDA run with matmul rows (a synthetic result), not for a CPU one."""
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
    paths = harness.write({"meta": meta, "rows": rows}, str(tmp_path / "gpu"))
    assert (
        str(tmp_path / "gpu" / "ladder.png") in paths and (tmp_path / "gpu" / "ladder.png").stat().st_size > 0
    )
    meta_cpu = dict(meta, device_type="cpu")
    paths = harness.write({"meta": meta_cpu, "rows": rows}, str(tmp_path / "cpu"))
    assert not any(p.endswith("ladder.png") for p in paths)


def test_cli_bench_cpu(tmp_path, capsys):
    from opforge.cli import main

    rc = main(["bench", "--device", "cpu", "--ops", "vector_add", "--rounds", "1", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "torch.add" in out and "GB/s" in out
    assert {"results.json", "results.md"} <= set(os.listdir(tmp_path))


def test_cli_rejects_unknown_op(capsys):
    from opforge.cli import main

    assert main(["bench", "--device", "cpu", "--ops", "nope"]) == 2
    assert "unknown op" in capsys.readouterr().err


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
