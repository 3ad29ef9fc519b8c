"""Per-kernel CUDA time of opforge.nms / batched_nms (torch.profiler), to see where the time goes.

Usage: python benchmarks/tuning/nms/nms_profile.py [N ...]   (default 1000 10000 50000)
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

import opforge
from opforge.bench.nms import clustered_boxes, uniform_boxes


def run(label, fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(e.name[:70], [0.0, 0])
            rows[e.name[:70]][0] += e.device_time / iters
            rows[e.name[:70]][1] += 1
    total = sum(v[0] for v in rows.values())
    print(f"== {label}: device time {total:.1f} us per call")
    for name, (t, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"   {t:8.1f} us  x{c // iters:<3d} {name}")


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000, 50000]
    for n in sizes:
        for kind, make in (("uniform", uniform_boxes), ("clustered", clustered_boxes)):
            boxes, scores = make(n, device="cuda")
            idxs = torch.randint(0, 80, (n,), device="cuda")
            run(f"nms {kind} {n}", lambda b=boxes, s=scores: opforge.nms(b, s, 0.5))
            run(
                f"batched_nms 80 {kind} {n}",
                lambda b=boxes, s=scores, c=idxs: opforge.batched_nms(b, s, c, 0.5),
            )


if __name__ == "__main__":
    main()
