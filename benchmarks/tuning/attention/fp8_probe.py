"""One FP8 forward row (causal D128 4k, B 4, H 32 / 8) and opforge's bf16 forward on the same values,
timed alone: the quick probe the FP8 experiments (fp8 kernel variants built on the device, ncu) run.

    python benchmarks/tuning/attention/fp8_probe.py [label] [--fp8-only]
"""

from __future__ import annotations

import sys

import torch

import opforge
from opforge.bench.timing import CudaTimer

B, H, HKV, S, D = 4, 32, 8, 4096, 128
label = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "fp8"
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, h, S, D, device="cuda", generator=g) * 0.5 for h in (H, HKV, HKV))
q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
qb, kb, vb = (t.to(torch.bfloat16) for t in (q8, k8, v8))
timer = CudaTimer(torch.device("cuda"))
pairs = B * H * S * (S + 1) / 2
for name, fn in (
    (label, lambda: opforge.attention(q8, k8, v8, causal=True)),
    ("bf16", lambda: opforge.attention(qb, kb, vb, causal=True)),
):
    if name == "bf16" and "--fp8-only" in sys.argv:
        continue
    fn()
    ms = timer(fn)
    print(f"{name:12s} {ms:.3f} ms {4 * pairs * D / ms / 1e9:.0f} TFLOP/s", flush=True)
