"""What attention sinks cost (issue 48: <= 3 % over the same call without them): opforge.attention with
and without ``sinks=`` on the same inputs, timed alternately (A B A B ..., the medians of each), on
forward, forward + backward and decode rows. CUDA only; bf16.

    python benchmarks/tuning/attention/sinks_cost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import opforge
from opforge.bench.timing import CudaTimer

ROWS = [  # (name, B, Hq, Hkv, Sq, Sk, D, kwargs, backward)
    ("causal fwd 4k", 4, 32, 8, 4096, 4096, 128, dict(causal=True), False),
    ("causal fwd 32k", 1, 32, 8, 32768, 32768, 128, dict(causal=True), False),
    ("full fwd 4k D64", 4, 32, 8, 4096, 4096, 64, {}, False),
    ("causal fwd+bwd 4k", 4, 32, 8, 4096, 4096, 128, dict(causal=True), True),
    ("sliding 512 fwd+bwd 4k", 4, 64, 8, 4096, 4096, 64, dict(causal=True, window=(511, 0)), True),
    ("decode B8 32k", 8, 32, 8, 1, 32768, 128, dict(causal=True), False),
    ("decode B64 2k", 64, 64, 8, 1, 2048, 64, dict(causal=True), False),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    timer = CudaTimer(torch.device("cuda"))
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__}; bf16; medians of {args.rounds} alternate rounds"
    )
    for name, B, Hq, Hkv, Sq, Sk, D, kw, backward in ROWS:
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
        k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
        v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
        sinks = torch.randn(Hq, device="cuda", requires_grad=backward)
        go = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16)

        def call(s, q=q, k=k, v=v, kw=kw, backward=backward, go=go):
            def fn():
                out = opforge.attention(q, k, v, sinks=s, **kw)
                if backward:
                    out.backward(go)

            return fn

        times = {"none": [], "sinks": []}
        for _ in range(args.rounds):
            times["none"].append(timer(call(None)))
            times["sinks"].append(timer(call(sinks)))
        a, b = statistics.median(times["none"]), statistics.median(times["sinks"])
        print(f"  {name:26s} no sinks {a:8.3f} ms | sinks {b:8.3f} ms | cost {100 * (b / a - 1):+5.1f} %")


if __name__ == "__main__":
    main()
