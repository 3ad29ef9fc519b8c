"""Ceilings for preprocess_frames' convert kernel (32 x 1080p uint8 -> fp16 NCHW: 6.2 MB read and
12.4 MB written per frame), on a CUDA machine: the same traffic moved by PyTorch's simplest
kernels, so that the kernel's GB/s can be read against what this read:write mix reaches.

- uint8 -> fp16 conversion in the same layout (x.to(fp16): 1 byte read, 2 written, no permute);
- an fp16 fill of the output size (writes only);
- clones of the input (uint8) and of the output (fp16): read+write 1:1, the copy ceiling;
- opforge.preprocess_frames itself, with and without mean/std.

    python benchmarks/tuning/video/video_convert_tune.py [frames]
"""

from __future__ import annotations

import sys

import torch

import opforge

H, W = 1080, 1920


def cuda_time(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps / 1e3)
    return sorted(times)[len(times) // 2]


def main(n: int = 32) -> None:
    x = torch.randint(0, 256, (n, H, W, 3), dtype=torch.uint8, device="cuda")
    y = torch.empty((n, 3, H, W), dtype=torch.float16, device="cuda")
    y16 = torch.empty((n, H, W, 3), dtype=torch.float16, device="cuda")
    mb_in, mb_out = x.numel() / 1e6, y.numel() * 2 / 1e6
    rows = [
        ("x.to(fp16) same layout", lambda: y16.copy_(x), mb_in + mb_out),
        ("fp16 fill of the output", lambda: y.fill_(1.0), mb_out),
        ("uint8 clone of the input", lambda: x.clone(), 2 * mb_in),
        ("fp16 clone of the output", lambda: y.clone(), 2 * mb_out),
        ("preprocess_frames scale only", lambda: opforge.preprocess_frames(x), mb_in + mb_out),
        (
            "preprocess_frames ImageNet mean/std",
            lambda: opforge.preprocess_frames(x, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            mb_in + mb_out,
        ),
    ]
    for name, fn, mb in rows:
        s = cuda_time(fn)
        print(f"{name:<40} {s * 1e6:8.1f} us  {mb / 1e3 / s:7.0f} GB/s  {n / s:9.0f} frames/s", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
