"""Per-kernel GPU time of opforge.attention's forward and backward (torch.profiler), for the bench's
CUDA rows or any shape: where the time of a fwd+bwd goes (forward, prep, main backward, dQ
conversion, allocations' fills).

    python benchmarks/tuning/attention/attention_kernel_times.py [B H Hkv S D] [--full] [--deterministic] [--dv=N]

causal unless --full; --dv: v's head dim (DeepSeek's MLA: D 192, --dv=128).
"""

from __future__ import annotations

import collections
import sys

import torch

import opforge


def main(argv: list[str]) -> None:
    nums = [int(a) for a in argv if not a.startswith("--")] or [4, 16, 16, 4096, 128]
    B, H, Hkv, S, D = nums
    causal = "--full" not in argv
    det = "--deterministic" in argv
    dv = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--dv=")), D)
    dev = torch.device("cuda")
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, Hkv, S, dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(B, H, S, dv, device=dev, dtype=torch.bfloat16)

    def step():
        out = opforge.attention(q, k, v, causal=causal, deterministic=det)
        torch.autograd.grad(out, (q, k, v), go)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    reps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    total = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:90]] += e.device_time / reps
    print(f"B{B} H{H}/{Hkv} S{S} D{D} Dv{dv} causal={causal} deterministic={det}: per fwd+bwd, us")
    for name, us in total.most_common(12):
        print(f"  {us:9.1f}  {name}")
    print(f"  {sum(total.values()):9.1f}  total")


if __name__ == "__main__":
    main(sys.argv[1:])
