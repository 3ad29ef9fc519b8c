"""Where FrameStream's time goes from pageable frames (the open gap of issue 19), on a CUDA machine:

- the host memcpy into pinned memory alone: glibc memcpy or streaming stores (host_copy.c, loaded
  with ctypes) over 8-16 OpenMP threads, and opforge.copy_async (what FrameStream uses) over the
  torch threads, or one fewer;
- the pinned H2D copy alone;
- both at once, pipelined over a ring of 3 pinned batches (the memcpy of batch k+1 while batch k's
  DMA runs): the combined ceiling that the "slower of the two" bound ignores, since both use host
  memory bandwidth;
- that loop on a new thread per pass, on a persistent thread, and split like FrameStream (a
  packing thread handing slots to a consumer that preprocesses on the main thread);
- FrameStream for ring sizes 2, 3, 4 and torch thread counts, with its stats() (seconds packing,
  seconds the consumer waited, seconds the stager waited for a slot).

    gcc -O3 -fopenmp -shared -fPIC -o /tmp/host_copy.so benchmarks/tuning/video/host_copy.c
    python benchmarks/tuning/video/video_stream_tune.py [frames] [batch]
"""

from __future__ import annotations

import ctypes
import os
import queue
import statistics
import sys
import threading
import time

import numpy as np
import torch

import opforge
from opforge.video import FrameStream

H, W = 1080, 1920
LIB = os.environ.get("HOST_COPY_SO", "/tmp/host_copy.so")


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
    ring = [torch.empty((batch, H, W, 3), dtype=torch.uint8).pin_memory() for _ in range(3)]
    done = [torch.cuda.Event() for _ in ring]
    dev = torch.empty((batch, H, W, 3), dtype=torch.uint8, device="cuda")
    copy_stream = torch.cuda.Stream()
    gb = n * H * W * 3 / 1e9
    lib = ctypes.CDLL(LIB)
    lib.copy_parallel.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
    ]
    frame_bytes = H * W * 3
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}", flush=True)

    def packer(kind: str, threads: int):
        def pack_frame(dst: torch.Tensor, f: np.ndarray) -> None:
            if kind == "copy_async":
                opforge.copy_async(dst, torch.from_numpy(f))
            else:
                lib.copy_parallel(dst.data_ptr(), f.ctypes.data, frame_bytes, threads, kind == "stream")

        return pack_frame

    def alone(pack_frame):
        def run():
            for i, f in enumerate(frames):
                pack_frame(ring[(i // batch) % 3][i % batch], f)

        return run

    def dma():
        for i in range(n // batch):
            with torch.cuda.stream(copy_stream):
                opforge.copy_async(dev, ring[i % 3])
        copy_stream.synchronize()

    def together(pack_frame):
        def run():
            for b in range(n // batch):
                k = b % 3
                done[k].synchronize()  # slot k's transfer (3 batches ago) has read it
                for j in range(batch):
                    pack_frame(ring[k][j], frames[b * batch + j])
                with torch.cuda.stream(copy_stream):
                    opforge.copy_async(dev, ring[k])
                    done[k].record(copy_stream)
            copy_stream.synchronize()

        return run

    def report(name: str, s: float) -> None:
        print(f"{name:<48} {s * 1e3:7.2f} ms  {gb / s:6.1f} GB/s  {n / s:8.0f} frames/s", flush=True)

    report("pinned H2D copy", timed(dma))
    old = torch.get_num_threads()
    for kind, threads in [("copy_async", old), ("memcpy", 16), ("stream", 16)]:
        torch.set_num_threads(threads if kind == "copy_async" else old)
        pack = packer(kind, threads)
        report(f"{kind} x{threads} alone", timed(alone(pack)))
        report(f"{kind} x{threads} with the H2D (ring 3)", timed(together(pack)))
    torch.set_num_threads(old)

    # Where FrameStream loses against the loop above: the same loop on a new thread per pass, on
    # one persistent thread, and split like FrameStream (packing thread -> queue -> consumer
    # preprocessing on the main thread, slots handed back through a second queue).
    pack = packer("copy_async", old)

    def new_thread(fn):
        def run():
            t = threading.Thread(target=fn)
            t.start()
            t.join()

        return run

    jobs: queue.Queue = queue.Queue()
    finished: queue.Queue = queue.Queue()

    def worker():
        while (job := jobs.get()) is not None:
            job()
            finished.put(True)

    persistent = threading.Thread(target=worker, daemon=True)
    persistent.start()

    def on_persistent(fn):
        def run():
            jobs.put(fn)
            finished.get()

        return run

    devs = [torch.empty_like(dev) for _ in ring]
    consumed = [torch.cuda.Event() for _ in ring]

    def split_pipeline():
        ready: queue.Queue = queue.Queue()
        free: queue.Queue = queue.Queue()
        for k in range(3):
            free.put(k)
        used = [False] * 3

        def stager():
            for b in range(n // batch):
                k = free.get()
                done[k].synchronize()
                for j in range(batch):
                    pack(ring[k][j], frames[b * batch + j])
                with torch.cuda.stream(copy_stream):
                    if used[k]:
                        copy_stream.wait_event(consumed[k])
                    opforge.copy_async(devs[k], ring[k])
                    done[k].record(copy_stream)
                used[k] = True
                ready.put(k)
            ready.put(None)

        t = threading.Thread(target=stager)
        t.start()
        while (k := ready.get()) is not None:
            torch.cuda.current_stream().wait_event(done[k])
            opforge.preprocess_frames(devs[k], mean=0.5, std=0.5)
            consumed[k].record()
            free.put(k)
        t.join()

    for rep in range(2):
        report(f"copy_async loop with the H2D, new thread ({rep})", timed(new_thread(together(pack))))
        report(
            f"copy_async loop with the H2D, persistent thread ({rep})", timed(on_persistent(together(pack)))
        )
        report(f"split pipeline: stager thread + consumer ({rep})", timed(split_pipeline))
    jobs.put(None)

    for threads in sorted({old - 1, old}) * 2:
        torch.set_num_threads(threads)
        for ring_size in (2, 3):

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
                f"FrameStream threads {threads:<2} ring {ring_size:<2} {s * 1e3:7.2f} ms  {n / s:8.0f} frames/s  "
                f"packing {st['stage_s'] * 1e3:.1f} ms, consumer waited {st['wait_s'] * 1e3:.1f} ms, "
                f"stager waited for slots {st['slot_wait_s'] * 1e3:.1f} ms",
                flush=True,
            )
    torch.set_num_threads(old)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
