"""One benchmark harness for every op.

A spec (``opforge/bench/<op>.py``) yields :class:`Case` objects: fresh random inputs, the
implementations to time (opforge first, then its baselines: PyTorch native, the peer library,
the plain-PyTorch reference), a correctness check, and the bytes/flops one call must move or do.
The harness checks opforge's output against the reference, times every implementation in the
same run, interleaved, and reports time, GB/s or TFLOP/s, and each baseline's time over
opforge's (above 1 means opforge is faster).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from opforge.bench.ladder import plot_ladder
from opforge.bench.timing import copy_bandwidth_gbps, make_timer


@dataclass
class Case:
    """One row of a benchmark table."""

    op: str
    name: str
    impls: dict[str, Callable[[], Any]]  # the first is opforge's; the others are baselines
    check: Callable[[], str | None] = lambda: None  # returns an error message, or None when correct
    bytes: int | None = None  # bytes one call must move through memory (for GB/s)
    flops: int | None = None  # floating-point operations of one call (for TFLOP/s)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Spec:
    """A benchmark spec: which cases to run for a device and a size mode."""

    op: str
    cases: Callable[[torch.device, bool], Iterable[Case]]  # (device, full) -> cases


def _git_commit() -> str:
    """The commit measured: $OPFORGE_COMMIT when set (a copy of the tree without .git), else git's."""
    if os.environ.get("OPFORGE_COMMIT"):
        return os.environ["OPFORGE_COMMIT"]
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def device_slug(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda-" + torch.cuda.get_device_name(device).lower().replace("nvidia ", "").replace(" ", "-")
    return f"cpu-{os.cpu_count()}core"


def metadata(device: torch.device, full: bool) -> dict[str, Any]:
    return {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(),
        "mode": "full" if full else "quick",
        "cpu_variant": torch.ops.opforge._cpu_isa() if hasattr(torch.ops.opforge, "_cpu_isa") else None,
    }


def _fmt_time(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms * 1e3:.1f} us"


def run_case(case: Case, timer: Callable[[Callable[[], Any]], float], rounds: int) -> dict[str, Any]:
    """Check opforge's result, then time every implementation, interleaved over ``rounds``."""
    samples: dict[str, list[float]] = {name: [] for name in case.impls}
    try:  # one failing case (a kernel error, an unsupported GPU) must not end the run
        error = case.check()
        if error is None:
            for _ in range(rounds):
                for name, fn in case.impls.items():
                    samples[name].append(timer(fn))
    except Exception as e:  # reported in the table
        error = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        samples = {name: [] for name in case.impls}
    row: dict[str, Any] = {
        "op": case.op,
        "case": case.name,
        "params": case.params,
        "error": error,
        "impls": {},
    }
    first = next(iter(case.impls))
    for name, times in samples.items():
        if not times:
            continue
        ms = statistics.median(times)
        entry: dict[str, Any] = {"ms": ms}
        if case.bytes is not None:
            entry["gbps"] = case.bytes / (ms * 1e-3) / 1e9
        if case.flops is not None:
            entry["tflops"] = case.flops / (ms * 1e-3) / 1e12
        row["impls"][name] = entry
    if first in row["impls"]:
        ours = row["impls"][first]["ms"]
        for entry in row["impls"].values():
            # baseline time / opforge time: > 1 means opforge is faster (a throughput ratio).
            entry["speedup_of_opforge"] = entry["ms"] / ours
    return row


def run(
    specs: Iterable[Spec], device: torch.device, full: bool, rounds: int | None = None, log=sys.stderr
) -> dict[str, Any]:
    """Run every case of every spec on ``device``; return {"meta", "rows"}."""
    quick = not full
    timer = make_timer(device, quick)
    rounds = rounds if rounds is not None else (3 if full else 2)
    meta = metadata(device, full)
    meta["copy_gbps"] = copy_bandwidth_gbps(device, quick)
    print(
        f"opforge bench on {meta['device']} | torch {meta['torch']} | {meta['mode']} sizes | "
        f"copy ceiling {meta['copy_gbps']:.0f} GB/s",
        file=log,
        flush=True,
    )
    cases = [case for spec in specs for case in spec.cases(device, full)]
    rows = []
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case.op} {case.name} ...", file=log, end="", flush=True)
        row = run_case(case, timer, rounds)
        first = next(iter(row["impls"]), None)
        status = (
            f" FAILED CHECK: {row['error']}"
            if row["error"] or first is None
            else f" {_fmt_time(row['impls'][first]['ms'])}"
        )
        print(status, file=log, flush=True)
        rows.append(row)
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"meta": meta, "rows": rows}


def _metric(entry: dict[str, Any]) -> str:
    if "tflops" in entry:
        t = entry["tflops"]
        return f"{t:.1f} TFLOP/s" if t >= 1 else f"{t * 1e3:.0f} GFLOP/s"
    if "gbps" in entry:
        return f"{entry['gbps']:.0f} GB/s" if entry["gbps"] >= 10 else f"{entry['gbps']:.2f} GB/s"
    return ""


def to_markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# opforge benchmarks: {meta['device']}",
        "",
        f"torch {meta['torch']} (CUDA {meta['cuda']}), Python {meta['python']}, {meta['date']}, "
        f"commit {meta['commit']}, {meta['mode']} sizes. Copy ceiling measured in the same run: "
        f"{meta['copy_gbps']:.0f} GB/s (bytes read + written).",
        "",
        "Each time is a median; `x` is the baseline's time over opforge's in the same run "
        "(above 1: opforge is faster).",
        "",
    ]
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in result["rows"]:
        by_op.setdefault(row["op"], []).append(row)
    for op, rows in by_op.items():
        lines += [f"## {op}", "", "| case | impl | time | rate | opforge speedup |", "|---|---|---|---|---|"]
        for row in rows:
            if row["error"]:
                lines.append(f"| {row['case']} | opforge | FAILED CHECK: {row['error']} | | |")
                continue
            for j, (name, entry) in enumerate(row["impls"].items()):
                ratio = "" if j == 0 else f"{entry['speedup_of_opforge']:.2f}x"
                lines.append(
                    f"| {row['case'] if j == 0 else ''} | {name} | {_fmt_time(entry['ms'])} | {_metric(entry)} | {ratio} |"
                )
        lines.append("")
    return "\n".join(lines)


def to_table(result: dict[str, Any]) -> str:
    """A plain-text table for the terminal."""
    out = []
    header = f"{'op':<12} {'case':<26} {'impl':<20} {'time':>10} {'rate':>16} {'opforge speedup':>16}"
    out.append(header)
    out.append("-" * len(header))
    for row in result["rows"]:
        if row["error"]:
            out.append(f"{row['op']:<12} {row['case']:<26} FAILED CHECK: {row['error']}")
            continue
        for j, (name, entry) in enumerate(row["impls"].items()):
            ratio = "" if j == 0 else f"{entry['speedup_of_opforge']:.2f}x"
            op, case = (row["op"], row["case"]) if j == 0 else ("", "")
            out.append(
                f"{op:<12} {case:<26} {name:<20} {_fmt_time(entry['ms']):>10} {_metric(entry):>16} {ratio:>16}"
            )
    return "\n".join(out)


def plot(result: dict[str, Any], path: str) -> bool:
    """One panel per op: the rate (or time) of every implementation per case. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in result["rows"]:
        if not row["error"]:
            by_op.setdefault(row["op"], []).append(row)
    if not by_op:
        return False
    fig, axes = plt.subplots(len(by_op), 1, figsize=(11, 4.2 * len(by_op)), squeeze=False)
    meta = result["meta"]
    for ax, (op, rows) in zip(axes[:, 0], by_op.items(), strict=True):
        impls = list(dict.fromkeys(name for row in rows for name in row["impls"]))
        sample = rows[0]["impls"][next(iter(rows[0]["impls"]))]
        key, label = (
            ("tflops", "TFLOP/s")
            if "tflops" in sample
            else ("gbps", "GB/s")
            if "gbps" in sample
            else ("ms", "ms")
        )
        width = 0.8 / len(impls)
        for k, name in enumerate(impls):
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(rows))]
            ys = [row["impls"].get(name, {}).get(key, 0.0) for row in rows]
            ax.bar(xs, ys, width, label=name)
        if key == "ms":
            ax.set_yscale("log")
        if key == "gbps":
            ax.axhline(meta["copy_gbps"], color="gray", ls="--", lw=1, label="copy ceiling (same run)")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([row["case"] for row in rows], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(
            f"{op} on {meta['device']} (torch {meta['torch']}, {meta['date']}, {meta['commit']})", fontsize=9
        )
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(result: dict[str, Any], out_dir: str, make_plot: bool = True) -> list[str]:
    """Write results.json, results.md and (with matplotlib) results.png into ``out_dir``, and the
    matmul ladder (ladder.png) when the run has CUDA matmul rows."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    with open(paths[0], "w") as f:
        json.dump(result, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(to_markdown(result) + "\n")
    png = os.path.join(out_dir, "results.png")
    if make_plot and plot(result, png):
        paths.append(png)
    ladder = os.path.join(out_dir, "ladder.png")
    if make_plot and plot_ladder(result, ladder):
        paths.append(ladder)
    return paths
