"""``opforge demo detect``: frames -> FrameStream -> letterbox preprocessing -> a torchvision
detector -> opforge.batched_nms -> boxes in frame pixels, next to the same pipeline in plain
PyTorch + torchvision (serial copy, torch-chain preprocessing, torchvision.ops.batched_nms), in
the same process.

The detector is torchvision's SSDlite320 (MobileNetV3-Large): random weights unless ``--weights``
names a state dict (nothing is downloaded). The pipelines run its backbone and head on the
letterboxed batch, decode the boxes of the top-scoring (anchor, class) pairs and suppress them
per frame and class in one NMS call (class ids offset per frame).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import opforge
from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry
from opforge.reference.preprocess_frames import preprocess_frames as torch_chain_preprocess
from opforge.video.boxes import scale_boxes
from opforge.video.stream import FrameStream

SIZE = 320
MEAN = STD = (0.5, 0.5, 0.5)  # SSDlite's normalization
IOU = 0.45
TOP_K = 600  # (anchor, class) candidates per frame going into NMS
MAX_DET = 100


def synthetic_clip(n: int, height: int = 1080, width: int = 1920, seed: int = 0) -> list[np.ndarray]:
    """A generated clip: moving colored rectangles on a gradient, uint8 RGB frames."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack(
        [(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)), np.full_like(xx, 96)], -1
    )
    base = base.astype(np.uint8)
    objects = [
        (
            rng.integers(0, width),
            rng.integers(0, height),
            rng.integers(60, 300),
            rng.integers(60, 300),
            rng.integers(-12, 12),
            rng.integers(-8, 8),
            rng.integers(0, 256, 3),
        )
        for _ in range(6)
    ]
    frames = []
    for t in range(n):
        f = base.copy()
        for x, y, w, h, vx, vy, color in objects:
            x0, y0 = int((x + vx * t) % width), int((y + vy * t) % height)
            f[y0 : y0 + h, x0 : x0 + w] = color
        frames.append(f)
    return frames


def build_detector(weights: str | None, device: torch.device, dtype: torch.dtype):
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    torch.manual_seed(0)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    if weights:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    else:
        # Random weights: a random classifier, and the box regression zeroed so that each decoded
        # box is its anchor (random regressions send boxes off the frame, which makes a poor picture).
        # Random convolutions under BatchNorm's default statistics fade to constant features (every
        # score 1/91, ties kept by index: boxes in a corner); statistics measured on frames keep
        # the features, and so the scores, varying with the picture.
        for module in model.head.regression_head.modules():
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.zeros_(module.weight)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
        calibrate_batchnorm(model)
    return model.eval().to(device=device, dtype=dtype)


def calibrate_batchnorm(model, frames: int = 8) -> None:
    """BatchNorm running statistics of a random-weight model, measured on a few generated frames."""
    raw = torch.from_numpy(np.stack(synthetic_clip(frames, 360, 640, seed=1)))
    images, _ = opforge.preprocess_frames(
        raw, size=SIZE, letterbox=True, mean=MEAN, std=STD, out_dtype=torch.float32
    )
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        head = model.head(list(model.backbone(images).values()))
        del head
    model.eval()


class Detector:
    """Backbone + head + box decoding of an SSD-type torchvision model on a letterboxed batch."""

    def __init__(self, model, size: int, device: torch.device, dtype: torch.dtype):
        from torchvision.models.detection.image_list import ImageList

        self.model = model
        with torch.inference_mode():
            probe = torch.zeros(1, 3, size, size, device=device, dtype=dtype)
            features = list(model.backbone(probe).values())
            self.anchors = model.anchor_generator(ImageList(probe, [(size, size)]), features)[0].float()

    def candidates(self, images: torch.Tensor):
        """(boxes (N, K, 4), scores (N, K), class ids offset per frame (N, K)) of the top K pairs."""
        head = self.model.head(list(self.model.backbone(images).values()))
        logits, reg = head["cls_logits"].float(), head["bbox_regression"].float()
        n, _, c = logits.shape
        scores = logits.softmax(-1)[..., 1:].flatten(1)  # class 0 is the background
        top_scores, top = scores.topk(min(TOP_K, scores.shape[1]), dim=1)
        anchor, label = top // (c - 1), top % (c - 1) + 1
        rel = reg.gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
        boxes = decode_boxes(
            rel.reshape(-1, 4), self.anchors[anchor.reshape(-1)], self.model.box_coder.weights
        )
        idxs = label + c * torch.arange(n, device=images.device).unsqueeze(1)
        return boxes.view(n, -1, 4), top_scores, idxs


def decode_boxes(rel: torch.Tensor, anchors: torch.Tensor, weights) -> torch.Tensor:
    """SSD's box decoding (torchvision's BoxCoder.decode_single) in tensor ops only, so that it can
    be captured in a CUDA graph (decode_single makes a host tensor on every call)."""
    wx, wy, ww, wh = weights
    widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    ctr_x, ctr_y = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
    clip = math.log(1000.0 / 16)
    dw, dh = (rel[:, 2] / ww).clamp(max=clip), (rel[:, 3] / wh).clamp(max=clip)
    x, y = rel[:, 0] / wx * widths + ctr_x, rel[:, 1] / wy * heights + ctr_y
    half_w, half_h = 0.5 * dw.exp() * widths, 0.5 * dh.exp() * heights
    return torch.stack([x - half_w, y - half_h, x + half_w, y + half_h], dim=1)


def split_kept(keep: torch.Tensor, n: int, k: int) -> list[torch.Tensor]:
    """Kept flat indices (by decreasing score) -> per frame, at most MAX_DET each."""
    frame = keep // k
    return [keep[frame == i][:MAX_DET] for i in range(n)]


@dataclass
class StageTimes:
    """Seconds per stage (GPU time from events; host time for the host-side stages) and frames."""

    seconds: dict[str, float] = field(default_factory=dict)
    frames: int = 0
    wall_s: float = 0.0
    _pending: list = field(default_factory=list)

    def add(self, stage: str, s: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + s

    def events(self, device: torch.device, names: list[str]) -> list:
        evs = (
            [torch.cuda.Event(enable_timing=True) for _ in range(len(names) + 1)]
            if device.type == "cuda"
            else []
        )
        self._pending.append((names, evs))
        return evs

    def resolve(self) -> None:
        for names, evs in self._pending:
            if not evs:  # CPU: added as they happened
                continue
            for name, a, b in zip(names, evs[:-1], evs[1:], strict=True):
                self.add(name, a.elapsed_time(b) / 1e3)
        self._pending.clear()


class _Clock:
    """Marks stage boundaries: CUDA events on the GPU, host time on the CPU."""

    def __init__(self, times: StageTimes, device: torch.device, names: list[str]):
        self.times, self.names, self.cuda = times, names, device.type == "cuda"
        self.evs = times.events(device, names)
        self.i, self.t = 0, time.perf_counter()

    def mark(self) -> None:
        if self.cuda:
            self.evs[self.i].record()
        else:
            now = time.perf_counter()
            if self.i > 0:
                self.times.add(self.names[self.i - 1], now - self.t)
            self.t = now
        self.i += 1


def progress(done: int, total: int | None, fps: float, label: str) -> None:
    if total:
        bar = "#" * int(30 * done / total)
        sys.stderr.write(f"\r{label:<8} [{bar:<30}] {done}/{total} frames, {fps:7.1f} frames/s")
    else:
        sys.stderr.write(f"\r{label:<8} {done} frames, {fps:7.1f} frames/s")
    sys.stderr.flush()


def run_opforge(
    frames, args, detector: Detector, device, dtype, on_result: Callable | None = None
) -> StageTimes:
    times = StageTimes()
    kw = dict(size=SIZE, letterbox=True, mean=MEAN, std=STD, out_dtype=dtype)
    graph = None
    start = time.perf_counter()
    stream = FrameStream(frames, batch_size=args.batch, device=device, raw=True)
    for batch in stream:
        raw = batch.frames
        n = raw.shape[0]
        info = letterbox_geometry(tuple(raw.shape[1:3]), SIZE)
        if args.graph and device.type == "cuda" and n == args.batch:
            if graph is None:
                graph = _GraphStep(raw, detector, kw)
            clock = _Clock(times, device, ["preprocess + model + NMS (graph)"])
            clock.mark()
            keep_padded, _ = graph.run(raw)
            clock.mark()
            k = graph.k
            kept = [keep_padded[i, :MAX_DET] for i in range(n)]  # -1 beyond each frame's count
            boxes_all = graph.boxes
        else:
            clock = _Clock(times, device, ["preprocess", "model", "NMS"])
            clock.mark()
            images, _ = opforge.preprocess_frames(raw, **kw)
            clock.mark()
            boxes, scores, idxs = detector.candidates(images)
            clock.mark()
            k = boxes.shape[1]
            keep = opforge.batched_nms(boxes.reshape(-1, 4), scores.reshape(-1), idxs.reshape(-1), IOU)
            clock.mark()
            kept = split_kept(keep, n, k)
            boxes_all = boxes.reshape(-1, 4)
        if on_result is not None:
            on_result(batch.indices, raw, boxes_all, kept, info)
        times.frames += n
        progress(times.frames, stream.total, times.frames / (time.perf_counter() - start), "opforge")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times.wall_s = time.perf_counter() - start
    times.resolve()
    st = stream.stats()
    times.add("source + copy (waited)", st["wait_s"])
    sys.stderr.write("\n")
    return times


class _GraphStep:
    """preprocess + model + decode + nms_padded for a fixed batch shape, captured once."""

    def __init__(self, raw: torch.Tensor, detector: Detector, kw: dict):
        self.raw = raw.clone()
        self.detector, self.kw = detector, kw
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (cuDNN autotuning, lazy init)
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._step()

    def _step(self):
        images, _ = opforge.preprocess_frames(self.raw, **self.kw)
        boxes, scores, idxs = self.detector.candidates(images)
        n, k = scores.shape
        keep, count = opforge.nms_padded(boxes.reshape(-1, 4), scores.reshape(-1), IOU, idxs.reshape(-1))
        self.k, self.boxes = k, boxes.reshape(-1, 4)
        # Per frame, its kept indices in score order (padded with -1): a stable sort by frame.
        frame = torch.where(keep >= 0, keep // k, n)
        order = torch.sort(frame, stable=True).indices
        sorted_keep = keep[order]
        start = torch.searchsorted(frame[order], torch.arange(n + 1, device=keep.device))
        slots = start[:-1].unsqueeze(1) + torch.arange(MAX_DET, device=keep.device)
        valid = slots < start[1:].unsqueeze(1)
        per_frame = torch.where(valid, sorted_keep[slots.clamp(max=keep.numel() - 1)], -1)
        return per_frame, count

    def run(self, raw: torch.Tensor):
        self.raw.copy_(raw)
        self.graph.replay()
        return self.out


def run_plain(frames, args, detector: Detector, device, dtype) -> StageTimes:
    """The plain pipeline: per batch a blocking copy, the torch chain, the model, torchvision NMS."""
    import torchvision

    times = StageTimes()
    start = time.perf_counter()
    total = len(frames) if hasattr(frames, "__len__") else None
    batch: list[torch.Tensor] = []

    def flush(batch):
        t0 = time.perf_counter()
        raw = torch.from_numpy(np.stack([np.asarray(f) for f in batch])).to(device)  # blocking copy
        times.add("source + copy (waited)", time.perf_counter() - t0)
        clock = _Clock(times, device, ["preprocess", "model", "NMS"])
        clock.mark()
        images, _ = torch_chain_preprocess(
            raw, size=SIZE, letterbox=True, mean=MEAN, std=STD, out_dtype=dtype
        )
        clock.mark()
        boxes, scores, idxs = detector.candidates(images)
        clock.mark()
        keep = torchvision.ops.batched_nms(boxes.reshape(-1, 4), scores.reshape(-1), idxs.reshape(-1), IOU)
        clock.mark()
        split_kept(keep, raw.shape[0], boxes.shape[1])
        times.frames += raw.shape[0]
        progress(times.frames, total, times.frames / (time.perf_counter() - start), "plain")

    for item in frames:
        items = [item] if np.asarray(item).ndim == 3 else list(item)
        for f in items:
            batch.append(f)
            if len(batch) == args.batch:
                flush(batch)
                batch = []
    if batch:
        flush(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times.wall_s = time.perf_counter() - start
    times.resolve()
    sys.stderr.write("\n")
    return times


def _table(ours: StageTimes, plain: StageTimes) -> str:
    stages = list(dict.fromkeys([*ours.seconds, *plain.seconds]))
    lines = [f"{'stage':<36} {'opforge':>16} {'plain PyTorch':>16}", "-" * 70]

    def cell(t: StageTimes, stage: str) -> str:
        s = t.seconds.get(stage)
        return f"{t.frames / s:>10.0f} fr/s" if s else f"{'-':>16}"

    for stage in stages:
        lines.append(f"{stage:<36} {cell(ours, stage):>16} {cell(plain, stage):>16}")
    lines.append(
        f"{'end to end (wall clock)':<36} {ours.frames / ours.wall_s:>10.1f} fr/s {plain.frames / plain.wall_s:>10.1f} fr/s"
    )
    lines.append(
        f"opforge's pipeline: {plain.wall_s / ours.wall_s:.2f}x the plain one's frames/s (same process)"
    )
    return "\n".join(lines)


def save_png(path: str, frame: torch.Tensor, boxes: torch.Tensor) -> None:
    from torchvision.io import write_png
    from torchvision.utils import draw_bounding_boxes

    image = frame.permute(2, 0, 1)[:3].cpu().contiguous()
    drawn = draw_bounding_boxes(image, boxes.cpu().float(), colors="red", width=3)
    write_png(drawn, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="opforge demo detect", description=__doc__.split("\n\n")[0])
    p.add_argument("video", nargs="?", help="a video file PyAV can read (default: a generated 1080p clip)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--frames", type=int, default=None, help="frames to run (default: 128 on GPU, 16 on CPU)")
    p.add_argument(
        "--weights", default=None, help="a state dict for torchvision's ssdlite320_mobilenet_v3_large"
    )
    p.add_argument("--save", default=None, help="write a PNG of the first frame with its boxes")
    p.add_argument("--graph", action="store_true", help="capture the per-batch GPU work in a CUDA graph")
    args = p.parse_args(argv)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        print("opforge demo detect: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    if args.graph and device.type != "cuda":
        print("opforge demo detect: --graph needs a CUDA device", file=sys.stderr)
        return 2
    n = args.frames or (128 if device.type == "cuda" else 16)
    if args.video:
        from opforge.video.io import read_frames

        frames = []
        for b in read_frames(args.video, batch_size=args.batch, max_frames=n):
            frames.extend(b)
    else:
        frames = synthetic_clip(n)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    detector = Detector(build_detector(args.weights, device, dtype), SIZE, device, dtype)
    print(
        f"opforge demo detect: {len(frames)} frames of {tuple(frames[0].shape)} on {device}, batch {args.batch}, "
        f"SSDlite320 ({'weights ' + args.weights if args.weights else 'random weights'}), letterbox {SIZE}"
        + (", CUDA graph" if args.graph else ""),
        flush=True,
    )
    saved: dict[str, torch.Tensor] = {}

    def on_result(indices, raw, boxes, kept, info: FrameInfo):
        if args.save and indices.start == 0:
            k = kept[0]
            b = scale_boxes(boxes[k[k >= 0]], info)
            b = b[(b[:, 2] - b[:, 0] > 2) & (b[:, 3] - b[:, 1] > 2)][:20]  # visible after clipping
            saved["frame"], saved["boxes"] = raw[0], b

    with torch.inference_mode():
        for _ in range(2 if device.type == "cuda" else 1):  # the first round warms both up
            plain = run_plain(frames, args, detector, device, dtype)
            ours = run_opforge(frames, args, detector, device, dtype, on_result)
    print(_table(ours, plain))
    if args.save:
        save_png(args.save, saved["frame"], saved["boxes"])
        print(f"wrote {args.save} ({len(saved['boxes'])} boxes drawn, frame 0)")
    return 0
