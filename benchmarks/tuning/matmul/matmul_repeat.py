"""The benchmark's protocol (opforge.bench's CudaTimer: L2 flushed before each timed call, median
of ~100 ms of calls) repeated: opforge's mma (and wgmma) against cuBLAS at bf16 4096^3, timed in
turn REPEATS times, so one ratio's spread between neighbouring measurements can be read off.

    python benchmarks/tuning/matmul/matmul_repeat.py [REPEATS]
"""

from __future__ import annotations

import statistics
import sys

import torch

import opforge
from opforge.bench.timing import CudaTimer


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    timer = CudaTimer(torch.device("cuda"))
    tf = 2 * n**3 / 1e9
    for variant in ("mma", "wgmma"):
        ratios = []
        for i in range(repeats):
            ours = timer(lambda v=variant: opforge.matmul(a, b, variant=v))
            peer = timer(lambda: torch.matmul(a, b))
            ratios.append(peer / ours)
            print(
                f"{variant} {i}: {tf / ours:6.1f} TFLOP/s | cuBLAS {tf / peer:6.1f} | {peer / ours:.3f}x",
                flush=True,
            )
        print(
            f"{variant} bf16 4096^3 over {repeats}: median {statistics.median(ratios):.3f}x, "
            f"mean {statistics.mean(ratios):.3f}x, min {min(ratios):.3f}x, max {max(ratios):.3f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
