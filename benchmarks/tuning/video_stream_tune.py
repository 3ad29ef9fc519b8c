"""Where FrameStream's time goes from pageable frames (the open gap of issue 19), on a CUDA machine:

- the host memcpy into pinned memory alone, on the main thread and on a worker thread;
- the pinned H2D copy alone;
- both at once (the memcpy of batch k+1 while batch k's DMA runs): the combined ceiling that the
  "slower of the two" bound ignores, since both use host memory bandwidth;
- FrameStream for ring sizes 2, 3, 4, 6, with its stats() (seconds packing, seconds the consumer waited).

    python benchmarks/tuning/video_stream_tune.py [frames] [batch]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np
import torch

import opforge
from opforge.video import FrameStream

H, W = 1080, 1920


def timed(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(n: int = 64, batch: int = 8) -> None:
    rng = np.random.default_rng()
    frames = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]
    ring = [torch.empty((batch, H, W, 3), dtype=torch.uint8).pin_memory() for _ in range(2)]
    dev = torch.empty((batch, H, W, 3), dtype=torch.uint8, device="cuda")
    copy_stream = torch.cuda.Stream()
    gb = n * H * W * 3 / 1e9

    def pack():
        for i, f in enumerate(frames):
            opforge.copy_async(ring[(i // batch) % 2][i % batch], torch.from_numpy(f))

    def dma():
        for i in range(n // batch):
            with torch.cuda.stream(copy_stream):
                opforge.copy_async(dev, ring[i % 2])
        copy_stream.synchronize()

    def both():
        for b in range(n // batch):
            for j in range(batch):
                opforge.copy_async(ring[b % 2][j], torch.from_numpy(frames[b * batch + j]))
            with torch.cuda.stream(copy_stream):
                opforge.copy_async(dev, ring[b % 2])
            if b % 2:  # two buffers: the older one's transfer ends before it is refilled
                copy_stream.synchronize()
        copy_stream.synchronize()

    def worker(fn):
        def run():
            t = threading.Thread(target=fn)
            t.start()
            t.join()

        return run

    for name, fn in [
        ("host memcpy to pinned (main thread)", pack),
        ("host memcpy to pinned (worker thread)", worker(pack)),
        ("pinned H2D copy", dma),
        ("memcpy and H2D together (2 buffers)", both),
    ]:
        s = timed(fn)
        print(f"{name:<40} {s * 1e3:7.2f} ms  {gb / s:6.1f} GB/s  {n / s:8.0f} frames/s", flush=True)
    for ring_size in (2, 3, 4, 6):

        def stream(ring_size=ring_size):
            for _ in FrameStream(frames, batch_size=batch, ring=ring_size, mean=0.5, std=0.5):
                pass

        s = timed(stream)
        fs = FrameStream(frames, batch_size=batch, ring=ring_size, mean=0.5, std=0.5)
        for _ in fs:
            pass
        torch.cuda.synchronize()
        st = fs.stats()
        print(
            f"FrameStream ring {ring_size:<2} {s * 1e3:7.2f} ms  {n / s:8.0f} frames/s  "
            f"packing {st['stage_s'] * 1e3:.1f} ms, consumer waited {st['wait_s'] * 1e3:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
