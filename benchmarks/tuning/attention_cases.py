"""A few rows of the attention benchmark by name (the harness runs whole specs): each built,
checked and timed against its peers exactly as `opforge bench --full --ops attention` does.

    python benchmarks/tuning/attention_cases.py "documents 8x512" "random blocks 30%" [--fwd-only]

--opforge-only: only opforge's impl of each row, run three times unchecked and untimed (for
Nsight Compute: `ncu --kernel-name regex:hopper --launch-skip 3 --launch-count 3 ...`).
"""

from __future__ import annotations

import sys

import torch

from opforge.bench import attention as spec
from opforge.bench.harness import run_case
from opforge.bench.timing import CudaTimer


def main(argv: list[str]) -> None:
    fwd_only = "--fwd-only" in argv
    opforge_only = "--opforge-only" in argv
    names = [a for a in argv if not a.startswith("--")]
    device = torch.device("cuda")
    timer = CudaTimer(device)
    for build in spec.cases(device, full=True):
        label = build.args[1]
        if label not in names or (fwd_only and build.args[8]):
            continue
        if opforge_only:
            run = build().impls["opforge"]
            for _ in range(3):
                run()
            torch.cuda.synchronize(device)
            print(label, "fwd" if not build.args[8] else "fwd+bwd", "ran", flush=True)
            continue
        row = run_case(build(), timer, rounds=2)
        cells = "  ".join(
            f"{k} {v['ms']:.3f} ms ({v['speedup_of_opforge']:.2f}x)" for k, v in row["impls"].items()
        )
        print(f"{row['case']:52s} {row['error'] or ''} {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
