"""The ring's scaling on one host of several GPUs (issue 49's acceptance: a 128k-token causal forward +
backward over 2 and 4 GPUs against 1, target >= 1.8x and >= 3.4x), and a profiler trace showing the
NCCL transfers overlapping the attention kernels. Run once per world size, on the same machine:

    torchrun --nproc-per-node 1 benchmarks/tuning/distributed/ring_scaling.py --out DIR
    torchrun --nproc-per-node 2 benchmarks/tuning/distributed/ring_scaling.py --out DIR
    torchrun --nproc-per-node 4 benchmarks/tuning/distributed/ring_scaling.py --out DIR

Rank 0 prints the median forward + backward time (CUDA events around a barrier-aligned call, 10 runs
after 3 warm-ups) and appends it to DIR/ring_scaling.json; with --trace, DIR/ring_trace_w{W}.json is
rank 0's Chrome trace of one call (NCCL's SendRecv kernels on their own stream beside the attention
kernels). The speedup is the W = 1 row's time over each row's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

import opforge  # noqa: F401  (the ops)
from opforge.distributed import ring_attention, shard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/ring")
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.manual_seed(0)
    S, H, Hkv, D = args.seq, args.heads, args.kv_heads, args.head_dim
    full = [torch.randn(1, h, S, D, device="cuda", dtype=torch.bfloat16) for h in (H, Hkv, Hkv)]
    q, k, v = (shard(t).requires_grad_() for t in full)
    del full
    go = torch.randn_like(q)

    def step():
        out = ring_attention(q, k, v, causal=True)
        out.backward(go)
        q.grad = k.grad = v.grad = None

    times = []
    for i in range(13):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    if args.trace:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(args.out, f"ring_trace_w{world}.json"))
    if rank == 0:
        row = {
            "world": world,
            "seq": S,
            "heads": H,
            "kv_heads": Hkv,
            "head_dim": D,
            "fwd_bwd_ms": ms,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
        }
        print(json.dumps(row))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ring_scaling.json"), "a") as f:
            f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
