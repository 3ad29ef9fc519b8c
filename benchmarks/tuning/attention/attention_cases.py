"""A few rows of the attention benchmark by name (the harness runs whole specs): each built,
checked and timed against its peers exactly as `opforge bench --full --ops attention` does.

    python benchmarks/tuning/attention/attention_cases.py "documents 8x512" "random blocks 30%" [--fwd-only | --bwd-only]

A deterministic backward's row is named with " deterministic" ("causal deterministic").

--opforge-only: only opforge's impl of each row, run three times unchecked and untimed (for
Nsight Compute: `ncu --kernel-name regex:hopper --launch-skip 3 --launch-count 3 ...`).
--impl=NAME: the same for the first impl whose name starts with NAME (a peer's kernels under ncu,
e.g. --impl=FlashAttention-4).

--graphs: also each impl's call captured in a CUDA graph and its replay timed the same way (the GPU
time without the host's launch path), and the host's time to enqueue one call (no sync): a row
whose timed call is shorter than the host's enqueue plus the timer's L2 flush measures the host.
"""

from __future__ import annotations

import sys
import time

import torch

from opforge.bench import attention as spec
from opforge.bench.harness import run_case
from opforge.bench.timing import CudaTimer


def _graphed(fn):
    """fn's work captured once in a CUDA graph: its replay (None when fn cannot be captured)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:
        print(f"    (not capturable: {type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None
    return graph.replay


def _host_us(fn, n: int = 200) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return host


def _graph_report(case, timer) -> None:
    cells = []
    for name, fn in case.impls.items():
        host = _host_us(fn)
        replay = _graphed(fn)
        graph_ms = timer(replay) if replay is not None else float("nan")
        cells.append(f"{name}: graph {graph_ms * 1e3:.1f} us, host enqueue {host:.1f} us")
    print("    " + "; ".join(cells), flush=True)


def main(argv: list[str]) -> None:
    fwd_only = "--fwd-only" in argv
    bwd_only = "--bwd-only" in argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--impl=")), None)
    only = "opforge" if "--opforge-only" in argv else only
    graphs = "--graphs" in argv
    names = [a for a in argv if not a.startswith("--")]
    device = torch.device("cuda")
    timer = CudaTimer(device)
    for build in spec.cases(device, full=True):
        # (a deterministic backward's row: the label plus " deterministic")
        label = build.args[1] + (" deterministic" if build.keywords.get("deterministic") else "")
        # (the backward flag: _cuda_case's 9th argument, _packed_case's keyword, no decode backward)
        backward = build.keywords.get("backward", build.func.__name__ == "_cuda_case" and build.args[8])
        if label not in names or (fwd_only and backward) or (bwd_only and not backward):
            continue
        if only:
            run = next(fn for name, fn in build().impls.items() if name.startswith(only))
            for _ in range(3):
                run()
            torch.cuda.synchronize(device)
            print(label, "ran", flush=True)
            continue
        case = build()
        row = run_case(case, timer, rounds=2)
        cells = "  ".join(
            f"{k} {v['ms']:.3f} ms ({v['speedup_of_opforge']:.2f}x)" for k, v in row["impls"].items()
        )
        print(f"{row['case']:52s} {row['error'] or ''} {cells}", flush=True)
        if graphs:
            _graph_report(case, timer)


if __name__ == "__main__":
    main(sys.argv[1:])
