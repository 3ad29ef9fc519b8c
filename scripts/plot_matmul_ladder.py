"""Draws the matmul ladder (opforge/bench/ladder.py) from an `opforge bench --full --ops matmul`
results.json of a GPU run.

    python scripts/plot_matmul_ladder.py benchmarks/results/h200/results.json [out.png]
"""

from __future__ import annotations

import json
import pathlib
import sys

from opforge.bench.ladder import plot_ladder

if __name__ == "__main__":
    src = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_name("ladder.png")
    if not plot_ladder(json.loads(src.read_text()), str(out)):
        sys.exit(f"{src}: no CUDA matmul rows (or no matplotlib)")
    print("wrote", out)
