"""A few rows of the attention benchmark by name (the harness runs whole specs): each built,
checked and timed against its peers exactly as `opforge bench --full --ops attention` does.

    python benchmarks/tuning/attention_cases.py "documents 8x512" "random blocks 30%" [--fwd-only]
"""

from __future__ import annotations

import sys

import torch

from opforge.bench import attention as spec
from opforge.bench.harness import run_case
from opforge.bench.timing import CudaTimer


def main(argv: list[str]) -> None:
    fwd_only = "--fwd-only" in argv
    names = [a for a in argv if not a.startswith("--")]
    device = torch.device("cuda")
    timer = CudaTimer(device)
    for build in spec.cases(device, full=True):
        label = build.args[1]
        if label not in names or (fwd_only and build.args[8]):
            continue
        row = run_case(build(), timer, rounds=2)
        cells = "  ".join(
            f"{k} {v['ms']:.3f} ms ({v['speedup_of_opforge']:.2f}x)" for k, v in row["impls"].items()
        )
        print(f"{row['case']:52s} {row['error'] or ''} {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
