"""What segment ids as documents cost and gain in the forward (tuning; GPU): for documents aligned
to 128 rows (B4 H16 S4096, 8 of 512) and unaligned packed ones (B1 H32/8 S16384, 16 of ~1024):
  ids ascending   - runs (the persistent forward attends within each run, as varlen);
  ids descending  - not runs: the same kernels (the runs scan included), attending by segment;
  varlen          - opforge.attention_varlen on the same documents (packed case only).
Event-timed medians with the L2 flushed (opforge.bench.timing.CudaTimer), then each call's kernels
with their device times from torch.profiler.

    python benchmarks/tuning/attention/runs_cost.py
"""

from __future__ import annotations

import torch

import opforge
from opforge.bench.attention import _document_lengths
from opforge.bench.timing import CudaTimer


def kernels(fn) -> str:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count > 0:
            rows.append(f"{e.key[:60]} {t / e.count:.1f} us x{e.count // 5}")
    return "; ".join(sorted(rows))


def case(timer: CudaTimer, name: str, B: int, Hq: int, Hkv: int, S: int, lengths: list[int]) -> None:
    dev, dt = timer.device, torch.bfloat16
    q = torch.randn(B, Hq, S, 128, device=dev, dtype=dt)
    k, v = (torch.randn(B, Hkv, S, 128, device=dev, dtype=dt) for _ in range(2))
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))
    up = doc.expand(B, S).contiguous()
    down = (len(lengths) - 1 - doc).expand(B, S).contiguous()
    calls = {
        "runs (ids ascending)": lambda: opforge.attention(q, k, v, causal=True, segment_ids=up),
        "by segment (ids descending)": lambda: opforge.attention(q, k, v, causal=True, segment_ids=down),
    }
    err = (
        (calls["runs (ids ascending)"]().float() - calls["by segment (ids descending)"]().float()).abs().max()
    )
    if B == 1:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        longest = max(lengths)
        calls["varlen"] = lambda: opforge.attention_varlen(qp, kp, vp, cu, cu, longest, longest, causal=True)
    print(f"{name}: runs vs by-segment outputs max |diff| {err.item():.2e}")
    for label, fn in calls.items():
        print(f"  {label:30s} {timer(fn):.3f} ms   {kernels(fn)}")


def main() -> None:
    timer = CudaTimer(torch.device("cuda"))
    case(timer, "aligned 8x512", 4, 16, 16, 4096, [512] * 8)
    case(timer, "packed 16 docs", 1, 32, 8, 16384, _document_lengths(16384, 16))


if __name__ == "__main__":
    main()
