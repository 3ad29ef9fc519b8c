"""One benchmark harness for every op.

A spec (``opforge/bench/<op>.py``) lists case builders: cheap zero-argument callables, each of
which allocates one :class:`Case` when called: fresh random inputs, the implementations to time
(opforge first, then its baselines: PyTorch native, the peer library, the plain-PyTorch
reference), a correctness check, and the bytes/flops one call must move or do. The harness builds
the cases one at a time (one case's inputs alive at once), checks opforge's output against the
reference, times every implementation in the same run, interleaved, and reports time, GB/s or
TFLOP/s, and each baseline's time over opforge's (above 1 means opforge is faster). A row whose
timing rounds disagree is measured again, and marked noisy if it still disagrees (see
NOISE_SPREAD). Every time is in ms, every rate in one unit per quantity (GB/s, TFLOP/s, frames/s,
tokens/s), in the table, the markdown and the plot alike.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from opforge.bench.timing import copy_bandwidth_gbps, last_level_cache_bytes, make_timer

# A DRAM-bound rate can beat the copy's a little (another read/write mix, a CPU's write-allocate
# reads uncounted: H200 vector_add at 1 GiB per operand ran 2.5% over it), so only a clear excess
# says "served from cache".
_OVER_CEILING = 1.25
# A bar chart whose values span more than this factor (largest / smallest) is drawn on a log scale.
_LOG_SPAN = 30
# Each round of a row is, per implementation (interleaved), a median over many calls (CPU:
# blocked_autorange over 0.2-0.5 s; CUDA: 10 to 1000 event-timed calls), so the rounds of an
# undisturbed row differ by much less than the ratios are read for (0.9x against 1.1x). An
# implementation whose slowest round is more than 15% over its fastest was disturbed (another
# process, a clock change, a first call's lazy set-up) by about that much: its row is measured
# again, and marked noisy if no attempt gets under it. (A first row once read 0.02x from a noisy
# neighbour; reruns gave 1.00x. On the 2-core CPU machine under a load of 9, vector_add's rounds
# differed by 0.1% to 24%.)
NOISE_SPREAD = 1.15
# Attempts beyond the first for a noisy row: bounded, since one attempt of a slow row (a model's
# generate()) takes minutes.
NOISE_RETRIES = 2
NOISY_MARK = "~"  # before each ratio of a row still noisy after its retries
TIME_UNIT = "ms"  # every time, in the table, the markdown, the JSON ("ms") and the plot
RATIO_LINE = (
    "ratio = baseline time / opforge time (medians, same run): above 1 opforge is faster, below 1 the "
    "baseline is"
)
UNITS_LINE = (
    f"time in {TIME_UNIT} (lower is better); rate in GB/s, TFLOP/s, frames/s or tokens/s (higher is better)"
)


@dataclass
class Case:
    """One row of a benchmark table."""

    op: str
    name: str
    impls: dict[str, Callable[[], Any]]  # the first is opforge's; the others are baselines
    check: Callable[[], str | None] = lambda: None  # returns an error message, or None when correct
    bytes: int | None = None  # bytes one call must move through memory (for GB/s)
    flops: int | None = None  # floating-point operations of one call (for TFLOP/s)
    frames: int | None = None  # video frames one call processes (for frames/s)
    tokens: int | None = None  # tokens one call processes or generates (for tokens/s)
    params: dict[str, Any] = field(default_factory=dict)
    # Entered around the check and the timing (a backend flag set for this case only), or None.
    context: Callable[[], AbstractContextManager[Any]] | None = None


CaseBuilder = Callable[[], Case]  # allocates one case's inputs when called
PlotFn = Callable[[dict[str, Any], str], list[str]]  # (result, out_dir) -> paths written


@dataclass
class Spec:
    """A benchmark spec: which cases to run for a device and a size mode, its extra plots, and a
    line for ``opforge bench --help`` on what it times against what."""

    op: str
    # (device, full) -> builders; listing them allocates nothing, each builds one case.
    cases: Callable[[torch.device, bool], Iterable[CaseBuilder]]
    plots: tuple[PlotFn, ...] = ()  # called by write() besides the generic chart
    about: str = ""  # what is timed against which baselines (for --help)


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


def _fmt_bytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _raised(e: Exception) -> str:
    return f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def peak_memory(device: torch.device) -> dict[str, int]:
    """The process's peak host RSS and, on CUDA, the caching allocator's peaks, in bytes."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peaks = {"peak_rss_bytes": rss if sys.platform == "darwin" else rss * 1024}
    if device.type == "cuda":
        peaks["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        peaks["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return peaks


def cache_resident(row: dict[str, Any], meta: dict[str, Any]) -> bool:
    """Whether a row's GB/s is a cache rate, not a DRAM one: its working set fits in the last-level
    cache (``meta["llc_bytes"]``; None on CUDA, whose timer flushes L2) or a rate clearly beats the
    copy ceiling measured in the same run."""
    if row.get("error") or row.get("bytes") is None:
        return False
    llc = meta.get("llc_bytes")
    if llc is not None and row["bytes"] <= llc:
        return True
    return any(e.get("gbps", 0.0) > _OVER_CEILING * meta["copy_gbps"] for e in row["impls"].values())


Samples = dict[str, list[float]]  # implementation -> its per-round times (ms)


def round_spread(samples: Samples) -> float | None:
    """How far a row's rounds disagree: the largest slowest / fastest round of any implementation
    (1.0: identical rounds); None when no implementation has two rounds to compare."""
    spreads = [max(times) / min(times) for times in samples.values() if len(times) >= 2 and min(times) > 0]
    return max(spreads) if spreads else None


@dataclass
class Measured:
    """The attempt kept for a row: its samples, their spread, how many attempts ran, whether noisy."""

    samples: Samples
    spread: float | None
    attempts: int
    noisy: bool


def measure(
    attempt: Callable[[], Samples],
    retries: int = NOISE_RETRIES,
    threshold: float = NOISE_SPREAD,
    on_retry: Callable[[float, int], None] | None = None,
) -> Measured:
    """Run ``attempt`` (all rounds of a row), and again, up to ``retries`` more times, while the
    least-spread attempt so far has rounds more than ``threshold`` apart; keep that attempt.
    ``on_retry(spread, attempt number)`` is called before each retry. Noisy when even the kept
    attempt is over the threshold; never noisy with one round (nothing to compare)."""
    if retries < 0:
        raise ValueError(f"measure: retries must be >= 0, got {retries}")
    best = attempt()
    best_spread = round_spread(best)
    attempts = 1
    while best_spread is not None and best_spread > threshold and attempts <= retries:
        attempts += 1
        if on_retry is not None:
            on_retry(best_spread, attempts)
        samples = attempt()
        spread = round_spread(samples)
        if spread is not None and spread < best_spread:
            best, best_spread = samples, spread
    noisy = best_spread is not None and best_spread > threshold
    return Measured(best, best_spread, attempts, noisy)


def run_case(
    case: Case,
    timer: Callable[[Callable[[], Any]], float],
    rounds: int,
    retries: int = NOISE_RETRIES,
    on_retry: Callable[[float, int], None] | None = None,
) -> dict[str, Any]:
    """Check opforge's result, then time every implementation, interleaved over ``rounds``; a row
    whose rounds disagree is timed again (:func:`measure`)."""

    def attempt() -> Samples:
        samples: Samples = {name: [] for name in case.impls}
        for _ in range(rounds):
            for name, fn in case.impls.items():
                samples[name].append(timer(fn))
        return samples

    measured = Measured({}, None, 0, False)
    try:  # one failing case (a kernel error, an unsupported GPU) must not end the run
        with case.context() if case.context is not None else contextlib.nullcontext():
            error = case.check()
            if error is None:
                measured = measure(attempt, retries, on_retry=on_retry)
    except Exception as e:  # reported in the table
        error = _raised(e)
        measured = Measured({}, None, 0, False)
    row: dict[str, Any] = {
        "op": case.op,
        "case": case.name,
        "params": case.params,
        "bytes": case.bytes,
        "error": error,
        "impls": {},
        # slowest / fastest round of the least steady implementation, in the attempt kept
        "spread": None if measured.spread is None else round(measured.spread, 4),
        "attempts": measured.attempts,
        "noisy": measured.noisy,
    }
    first = next(iter(case.impls))
    for name, times in measured.samples.items():
        if not times:
            continue
        ms = statistics.median(times)
        # its per-round medians and their slowest / fastest (None with one round)
        entry: dict[str, Any] = {"ms": ms, "rounds_ms": times, "spread": round_spread({name: times})}
        if case.bytes is not None:
            entry["gbps"] = case.bytes / (ms * 1e-3) / 1e9
        if case.flops is not None:
            entry["tflops"] = case.flops / (ms * 1e-3) / 1e12
        if case.frames is not None:
            entry["fps"] = case.frames / (ms * 1e-3)
        if case.tokens is not None:
            entry["tps"] = case.tokens / (ms * 1e-3)
        row["impls"][name] = entry
    if first in row["impls"]:
        ours = row["impls"][first]["ms"]
        for entry in row["impls"].values():
            # baseline time / opforge time: > 1 means opforge is faster (a throughput ratio).
            entry["speedup_of_opforge"] = entry["ms"] / ours
    return row


def _build_and_run(
    op: str,
    build: CaseBuilder,
    timer: Callable[[Callable[[], Any]], float],
    rounds: int,
    tag: str,
    log,
    retries: int = NOISE_RETRIES,
) -> dict[str, Any]:
    """Build one case, run it, and return its row; the case (and its inputs) dies with this frame."""
    try:
        case = build()
    except Exception as e:  # an allocation that does not fit, say: reported, the run goes on
        error = _raised(e)
        print(f"{tag} {op} FAILED TO BUILD: {error}", file=log, flush=True)
        return {
            "op": op,
            "case": "(not built)",
            "params": {},
            "bytes": None,
            "error": error,
            "impls": {},
            "spread": None,
            "attempts": 0,
            "noisy": False,
        }
    print(f"{tag} {case.op} {case.name} ...", file=log, end="", flush=True)

    def on_retry(spread: float, attempt: int) -> None:
        print(
            f" rounds {_spread_pct(spread)} apart, measuring again ({attempt}/{retries + 1}) ...",
            file=log,
            end="",
            flush=True,
        )

    row = run_case(case, timer, rounds, retries, on_retry)
    first = next(iter(row["impls"]), None)
    if row["error"] or first is None:
        status = f" FAILED CHECK: {row['error']}"
    else:
        status = f" {_fmt_ms(row['impls'][first]['ms'])} {TIME_UNIT}"
        if row["noisy"]:
            status += f" NOISY: rounds {_spread_pct(row['spread'])} apart in the steadiest attempt"
    print(status, file=log, flush=True)
    return row


def run(
    specs: Iterable[Spec],
    device: torch.device,
    full: bool,
    rounds: int | None = None,
    log=sys.stderr,
    retries: int = NOISE_RETRIES,
) -> dict[str, Any]:
    """Run every case of every spec on ``device``, building each just before it runs and freeing
    it before the next; return {"meta", "rows"}. ``rounds``: interleaved timing rounds per case
    (default 2, 3 when ``full``); ``retries``: more attempts for a row whose rounds disagree."""
    if rounds is not None and rounds < 1:
        raise ValueError(f"opforge bench: rounds must be >= 1, got {rounds}")
    if retries < 0:
        raise ValueError(f"opforge bench: retries must be >= 0, got {retries}")
    quick = not full
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = make_timer(device, quick)
    rounds = rounds if rounds is not None else default_rounds(full)
    meta = metadata(device, full)
    meta["rounds"] = rounds
    meta["noise_spread"] = NOISE_SPREAD
    meta["retries"] = retries
    meta["copy_gbps"] = copy_bandwidth_gbps(device, quick)
    meta["llc_bytes"] = last_level_cache_bytes(device)
    print(
        f"opforge bench on {meta['device']} | torch {meta['torch']} | {meta['mode']} sizes | "
        f"copy ceiling {meta['copy_gbps']:.0f} GB/s",
        file=log,
        flush=True,
    )
    builders = [(spec.op, build) for spec in specs for build in spec.cases(device, full)]
    rows = []
    for i, (op, build) in enumerate(builders, 1):
        row = _build_and_run(op, build, timer, rounds, f"[{i}/{len(builders)}]", log, retries)
        row["cache_resident"] = cache_resident(row, meta)
        rows.append(row)
        gc.collect()  # inputs held in a reference cycle go now, not after the next case is built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta.update(peak_memory(device))
    return {"meta": meta, "rows": rows}


def default_rounds(full: bool) -> int:
    """Interleaved timing rounds per case when none are asked for: 3 in full mode, 2 in quick."""
    return 3 if full else 2


def _fmt_ms(ms: float) -> str:
    """A time in ms (the one time unit), three significant digits, never in exponent form."""
    return _sig3(ms)


def _sig3(value: float) -> str:
    """``value`` to three significant digits (all the integer digits from 1000 up), no exponent."""
    if value <= 0 or value >= 100:
        return f"{value:.0f}"
    decimals = 2 - math.floor(math.log10(value))
    return f"{value:.{decimals}f}"


def _spread_pct(spread: float | None) -> str:
    """A spread (slowest / fastest round) as the percentage the slowest is over the fastest."""
    return "?" if spread is None else f"{spread - 1:.0%}"


# The rates a row can have, in the order the table and the plot pick its main one: key, unit.
RATES = (("tps", "tokens/s"), ("fps", "frames/s"), ("tflops", "TFLOP/s"), ("gbps", "GB/s"))


def main_rate(entry: dict[str, Any]) -> tuple[str, str]:
    """The (key, unit) of an implementation's main rate, or ("ms", "ms") for a row with none."""
    return next(((key, unit) for key, unit in RATES if key in entry), ("ms", TIME_UNIT))


def _metric(entry: dict[str, Any]) -> str:
    """The main rate in its one unit, and a frame row's GB/s after it."""
    key, unit = main_rate(entry)
    if key == "ms":
        return ""
    text = f"{_sig3(entry[key])} {unit}"
    if key == "fps" and "gbps" in entry:
        text += f", {_sig3(entry['gbps'])} GB/s"
    return text


def _ratio(row: dict[str, Any], j: int, entry: dict[str, Any]) -> str:
    """The ratio cell: each baseline's time over opforge's, marked in a noisy row; opforge's own
    cell says that its row is noisy and by how much."""
    if j == 0:
        return f"{NOISY_MARK} noisy ({_spread_pct(row.get('spread'))})" if row.get("noisy") else ""
    return f"{NOISY_MARK if row.get('noisy') else ''}{entry['speedup_of_opforge']:.2f}x"


def _noise_note(result: dict[str, Any]) -> str:
    """A footnote for the noisy marker when a row carries it; for a one-round run, that the check
    was off; else ""."""
    meta = result["meta"]
    if any(row.get("noisy") for row in result["rows"]):
        limit = f"{meta.get('noise_spread', NOISE_SPREAD) - 1:.0%}"
        attempts = meta.get("retries", NOISE_RETRIES) + 1
        return (
            f"{NOISY_MARK} noisy (N%): in each of {attempts} attempts some implementation's slowest timing "
            f"round was over {limit} slower than its fastest (N%: in the steadiest attempt, shown); the "
            "row's times and ratios are unreliable: rerun it (--ops OP)."
        )
    if meta.get("rounds") == 1:
        return "noise check off: one timing round per case (--rounds 1), so no rounds to compare."
    return ""


_CACHE_LABEL = "(cache-resident)"


def _case_label(row: dict[str, Any]) -> str:
    return f"{row['case']} {_CACHE_LABEL}" if row.get("cache_resident") else row["case"]


def _memory_line(meta: dict[str, Any]) -> str:
    """The run's peak memory, or "" for a result recorded before it was measured."""
    if "peak_rss_bytes" not in meta:
        return ""
    line = f"peak memory: host RSS {_fmt_bytes(meta['peak_rss_bytes'])}"
    if "cuda_max_reserved_bytes" in meta:
        line += (
            f", CUDA reserved {_fmt_bytes(meta['cuda_max_reserved_bytes'])}"
            f" (allocated {_fmt_bytes(meta['cuda_max_allocated_bytes'])})"
        )
    return line


def _cache_note(meta: dict[str, Any]) -> str:
    llc = meta.get("llc_bytes")
    fits = f"the working set fits in the last-level cache ({_fmt_bytes(llc)}) or " if llc else ""
    over = f"{_OVER_CEILING - 1:.0%}"
    return (
        f"{_CACHE_LABEL}: {fits}a rate beats the copy ceiling by over {over}: a cache rate, not a DRAM one."
    )


def to_markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    memory = _memory_line(meta)
    lines = [
        f"# opforge benchmarks: {meta['device']}",
        "",
        f"torch {meta['torch']} (CUDA {meta['cuda']}), Python {meta['python']}, {meta['date']}, "
        f"commit {meta['commit']}, {meta['mode']} sizes. Copy ceiling measured in the same run: "
        f"{meta['copy_gbps']:.0f} GB/s (bytes read + written)."
        + (f" {memory[0].upper()}{memory[1:]}." if memory else ""),
        "",
        f"Each time is a median. {RATIO_LINE[0].upper()}{RATIO_LINE[1:]}. "
        f"{UNITS_LINE[0].upper()}{UNITS_LINE[1:]}.",
        "",
    ]
    if any(row.get("cache_resident") for row in result["rows"]):
        lines += [_cache_note(meta), ""]
    noise = _noise_note(result)
    if noise:
        lines += [noise, ""]
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in result["rows"]:
        by_op.setdefault(row["op"], []).append(row)
    for op, rows in by_op.items():
        lines += [
            f"## {op}",
            "",
            f"| case | impl | time ({TIME_UNIT}) | rate | ratio |",
            "|---|---|---|---|---|",
        ]
        for row in rows:
            if row["error"]:
                lines.append(f"| {row['case']} | opforge | FAILED CHECK: {row['error']} | | |")
                continue
            for j, (name, entry) in enumerate(row["impls"].items()):
                case = _case_label(row) if j == 0 else ""
                lines.append(
                    f"| {case} | {name} | {_fmt_ms(entry['ms'])} | {_metric(entry)} | {_ratio(row, j, entry)} |"
                )
        lines.append("")
    return "\n".join(lines)


def to_table(result: dict[str, Any]) -> str:
    """A plain-text table for the terminal: how the ratio reads and the units over it; the
    footnotes (cache-resident rows, noisy rows) and the run's peak memory under it."""
    w = max([26, *(len(_case_label(row)) for row in result["rows"])])
    header = (
        f"{'op':<12} {'case':<{w}} {'impl':<20} {'time (' + TIME_UNIT + ')':>10} {'rate':>26} {'ratio':>16}"
    )
    out = [RATIO_LINE, UNITS_LINE, "", header, "-" * len(header)]
    for row in result["rows"]:
        if row["error"]:
            out.append(f"{row['op']:<12} {row['case']:<{w}} FAILED CHECK: {row['error']}")
            continue
        for j, (name, entry) in enumerate(row["impls"].items()):
            op, case = (row["op"], _case_label(row)) if j == 0 else ("", "")
            out.append(
                f"{op:<12} {case:<{w}} {name:<20} {_fmt_ms(entry['ms']):>10} {_metric(entry):>26} "
                f"{_ratio(row, j, entry):>16}"
            )
    if any(row.get("cache_resident") for row in result["rows"]):
        out += ["", _cache_note(result["meta"])]
    noise = _noise_note(result)
    if noise:
        out += ["", noise]
    memory = _memory_line(result["meta"])
    return "\n".join([*out, "", memory] if memory else out)


def value_axis(ax, values: Iterable[float], label: str) -> None:
    """A bar chart's value axis, set once its bars are drawn: linear from 0 (a bar's length is its
    value), or, when the positive values span more than _LOG_SPAN (decades), a log scale that the
    label names."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > _LOG_SPAN:
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} (log scale)")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel(label)


def better(key: str) -> str:
    """Which way a quantity reads: a time lower, a rate higher."""
    return "lower is better" if key == "ms" else "higher is better"


def plot(result: dict[str, Any], path: str) -> bool:
    """One panel per op and quantity (an op whose rows have different rates gets a panel for each):
    the rate (or, for rows with none, the time) of every implementation per case, cache-resident
    rows hatched, noisy rows' labels marked; each value axis labelled with its unit, linear from 0,
    or log (and labelled so) where the values span decades; each title says which way the panel
    reads. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    panels: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in result["rows"]:
        if not row["error"] and row["impls"]:
            key, _ = main_rate(next(iter(row["impls"].values())))
            panels.setdefault((row["op"], key), []).append(row)
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False)
    meta = result["meta"]
    for ax, ((op, key), rows) in zip(axes[:, 0], panels.items(), strict=True):
        impls = list(dict.fromkeys(name for row in rows for name in row["impls"]))
        label = dict(RATES).get(key, f"time ({TIME_UNIT})")
        width = 0.8 / len(impls)
        handles = []
        heights: list[float] = []
        for k, name in enumerate(impls):
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(rows))]
            ys = [row["impls"].get(name, {}).get(key, 0.0) for row in rows]
            heights += ys
            bars = ax.bar(xs, ys, width, color=f"C{k}")
            handles.append(Patch(color=f"C{k}", label=name))  # unhatched, whichever bar comes first
            for bar, row in zip(bars, rows, strict=True):
                if row.get("cache_resident"):
                    bar.set_hatch("//")
        if key == "gbps":
            handles.append(
                ax.axhline(meta["copy_gbps"], color="gray", ls="--", lw=1, label="copy ceiling (same run)")
            )
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(
            [
                row["case"]
                + (f"\n{_CACHE_LABEL}" if row.get("cache_resident") else "")
                + (f"\n{NOISY_MARK} noisy" if row.get("noisy") else "")
                for row in rows
            ],
            rotation=20,
            ha="right",
            fontsize=8,
        )
        value_axis(ax, heights, label)
        ax.set_title(
            f"{op}: {label}, {better(key)}\n"
            f"{meta['device']} (torch {meta['torch']}, {meta['date']}, {meta['commit']})",
            fontsize=9,
        )
        if any(row.get("cache_resident") for row in rows):
            handles.append(
                Patch(facecolor="white", edgecolor="black", hatch="//", label="cache-resident: not DRAM")
            )
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(
    result: dict[str, Any], out_dir: str, make_plot: bool = True, specs: Iterable[Spec] = ()
) -> list[str]:
    """Write results.json, results.md and (with matplotlib) results.png into ``out_dir``, and the
    extra plots of ``specs`` (the specs that ran: the matmul ladder, say)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    with open(paths[0], "w") as f:
        json.dump(result, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(to_markdown(result) + "\n")
    if make_plot:
        png = os.path.join(out_dir, "results.png")
        if plot(result, png):
            paths.append(png)
        for fn in dict.fromkeys(fn for spec in specs for fn in spec.plots):  # each plot once
            paths += fn(result, out_dir)
    return paths
