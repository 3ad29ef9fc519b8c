"""The overlap picture of docs/video.md: a CUDA timeline (torch.profiler, kernels and copies per
stream) of 1080p frames from pinned memory through letterbox preprocessing and SSDlite320, once as
the serial loop (copy, then process, one stream) and once through FrameStream (copies on their
own stream under the previous batch's compute).

    python benchmarks/tuning/video/video_timeline.py OUT.png
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

import opforge
from opforge.video import FrameStream
from opforge.video.demo import MEAN, SIZE, STD, Detector, build_detector

BATCH, BATCHES = 8, 6


def trace(fn) -> list[dict]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def main(out: str) -> None:
    device = torch.device("cuda")
    det = Detector(build_detector(None, device, torch.float16), SIZE, device, torch.float16)
    src = [
        torch.randint(0, 256, (BATCH, 1080, 1920, 3), dtype=torch.uint8).pin_memory() for _ in range(BATCHES)
    ]
    kw = dict(size=SIZE, letterbox=True, mean=MEAN, std=STD, out_dtype=torch.float16)

    def serial():
        for b in src:
            images, _ = opforge.preprocess_frames(b.to(device), **kw)
            det.candidates(images)

    def stream():
        for b in FrameStream(src, batch_size=BATCH, **kw):
            det.candidates(b.frames)

    with torch.inference_mode():
        for fn in (serial, stream):  # warm-up (cuDNN, allocator)
            fn()
        torch.cuda.synchronize()
        traces = {"serial loop: .to(), then preprocess + model": trace(serial), "FrameStream": trace(stream)}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 4.6), sharex=True)
    for ax, (title, events) in zip(axes, traces.items(), strict=True):
        t0 = min(e["ts"] for e in events)
        end = max(e["ts"] + e["dur"] for e in events)
        streams = sorted({e["tid"] for e in events}, key=str)
        for row, tid in enumerate(streams):
            for e in events:
                if e["tid"] != tid:
                    continue
                copy = e["cat"] == "gpu_memcpy"
                ax.broken_barh(
                    [((e["ts"] - t0) / 1e3, max(e["dur"], 1) / 1e3)],
                    (row - 0.35, 0.7),
                    color="tab:orange" if copy else "tab:blue",
                )
        ax.set_yticks(range(len(streams)))
        ax.set_yticklabels([f"stream {tid}" for tid in streams], fontsize=8)
        frames = BATCH * BATCHES
        ax.set_title(f"{title}: {frames} frames in {(end - t0) / 1e3:.1f} ms of GPU time", fontsize=9)
    axes[-1].set_xlabel("ms (orange: host->device copies, blue: kernels)")
    fig.suptitle(
        f"{torch.cuda.get_device_name()}, 1080p uint8 frames from pinned memory, letterbox {SIZE} + SSDlite320 fp16",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "video_timeline.png")
