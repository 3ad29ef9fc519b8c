"""Tuning only: one row of the bench's transformers_generate spec by its index (0: B4 2048 + 256,
1: B1 32k + 256), with the bench's harness, its results written like `opforge bench` does; dynamo's
recompiles logged (TORCH_LOGS=recompiles shows which implementation compiled what).

    python benchmarks/tuning/transformers/generate_row.py 1 OUT_DIR
"""

from __future__ import annotations

import sys

import torch

from opforge.bench import harness
from opforge.bench.harness import Spec
from opforge.bench.transformers import generate_cases


def main(argv: list[str]) -> None:
    index, out = int(argv[0]), argv[1]
    device = torch.device("cuda")
    build = generate_cases(device, True)[index]
    spec = Spec(op="transformers_generate", cases=lambda d, f: [build])
    result = harness.run([spec], device, full=True, rounds=1)
    print(harness.to_table(result))
    print("dynamo:", dict(torch._dynamo.utils.counters["stats"]))
    print("wrote", harness.write(result, out, make_plot=False, specs=[spec]))


if __name__ == "__main__":
    main(sys.argv[1:])
