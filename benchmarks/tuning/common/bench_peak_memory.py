"""Peak host and GPU memory of one `opforge bench` run (the harness of any commit).

    python benchmarks/tuning/common/bench_peak_memory.py --full --out DIR

Runs the CLI in this process, then prints the peak resident set size (getrusage) and, on CUDA,
the caching allocator's peak reserved and allocated bytes.
"""

from __future__ import annotations

import resource
import sys

import torch

from opforge.cli import main

rc = main(["bench", *sys.argv[1:]])
rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
line = f"peak host RSS {rss_gib:.2f} GiB"
if torch.cuda.is_available():
    line += (
        f"; GPU peak reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB,"
        f" allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    )
print(line, flush=True)
sys.exit(rc)
