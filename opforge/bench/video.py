"""Benchmark spec for the video path: opforge.preprocess_frames against the PyTorch chain,
torchvision transforms.v2 and OpenCV; FrameStream against the serial copy-then-process loop and
the measured copy bounds (pinned host->device, host memcpy)."""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec
from opforge.reference.preprocess_frames import torch_chain
from opforge.video import FrameStream

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
H, W = 1080, 1920


def _frames(n: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, 256, (n, H, W, 3), dtype=torch.uint8, device=device)


def _torchvision_v2(letterbox: bool, out_dtype: torch.dtype):
    try:
        from torchvision.transforms import v2
    except ImportError:
        return None
    steps = []
    if letterbox:
        steps += [v2.Resize((360, 640), antialias=False), v2.Pad([0, 140, 0, 140], fill=114)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD), v2.ToDtype(out_dtype)]
    pipeline = v2.Compose(steps)
    return lambda x: pipeline(x.permute(0, 3, 1, 2))


def _preprocess_case(device: torch.device, n: int, letterbox: bool) -> Case:
    x = _frames(n, device)
    kw = dict(mean=MEAN, std=STD, out_dtype=torch.float16)
    if letterbox:
        kw.update(size=640, letterbox=True)

    def ours():
        return opforge.preprocess_frames(x, **kw)

    def check() -> str | None:
        got = ours()[0] if letterbox else ours()
        want = reference.preprocess_frames(x, **kw)
        want = want[0] if letterbox else want
        if not letterbox:
            return (
                None if torch.equal(got, want) else "differs from the PyTorch chain (must be bit-identical)"
            )
        err = (got.float() - want.float()).abs().max().item()
        return None if err <= 0.5 / 255 / min(STD) else f"max error {err:.4f} against the PyTorch chain"

    impls = {"opforge": ours}
    if letterbox:
        impls["torch chain"] = lambda: reference.preprocess_frames(x, **kw)
    else:
        impls["torch chain"] = lambda: torch_chain(x, MEAN, STD)
    tv = _torchvision_v2(letterbox, torch.float16)
    if tv is not None:
        impls["torchvision v2"] = lambda: tv(x)
    out_elems = n * 3 * (640 * 640 if letterbox else H * W)
    return Case(
        op="video",
        name=f"{n}x1080p -> {'letterbox 640' if letterbox else '1080p'} fp16",
        impls=impls,
        check=check,
        bytes=x.numel() + 2 * out_elems,
        frames=n,
        params={"frames": n, "letterbox": letterbox, "out": "fp16"},
    )


def _cpu_blob_case(n: int) -> Case:
    """Letterbox to 640, float32 in [0, 1], BGR frames to RGB: what cv2.dnn.blobFromImages makes."""
    import cv2

    x = _frames(n, torch.device("cpu"))
    frames_np = list(x.numpy())
    kw = dict(size=640, letterbox=True, out_dtype=torch.float32, channels_in="bgr")
    info = opforge.video.letterbox_geometry((H, W), 640)
    top, left = info.pad
    bottom = info.size[0] - info.resized[0] - top
    right = info.size[1] - info.resized[1] - left

    def boxed(f):
        r = cv2.resize(f, (info.resized[1], info.resized[0]), interpolation=cv2.INTER_LINEAR)
        return cv2.copyMakeBorder(r, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114))

    def opencv_blob():
        return cv2.dnn.blobFromImages(
            [boxed(f) for f in frames_np], 1 / 255, (640, 640), (0, 0, 0), swapRB=True
        )

    def opencv_numpy():
        b = np.stack([boxed(f) for f in frames_np])[..., ::-1]
        return np.ascontiguousarray(b.transpose(0, 3, 1, 2), dtype=np.float32) / 255

    def check() -> str | None:
        got = opforge.preprocess_frames(x, **kw)[0]
        err = (got - torch.from_numpy(opencv_blob())).abs().max().item()
        return None if err <= 1.01 / 255 else f"max error {err * 255:.2f} uint8 steps against OpenCV"

    return Case(
        op="video",
        name=f"{n}x1080p -> letterbox 640 fp32 (blob)",
        impls={
            "opforge": lambda: opforge.preprocess_frames(x, **kw),
            "OpenCV blobFromImages": opencv_blob,
            "OpenCV + numpy": opencv_numpy,
            "torch chain": lambda: reference.preprocess_frames(x, **kw),
        },
        check=check,
        bytes=x.numel() + 4 * n * 3 * 640 * 640,
        frames=n,
        params={"frames": n, "letterbox": True, "out": "fp32"},
    )


def _stream_case(device: torch.device, n: int, batch: int, pinned: bool) -> Case:
    """n 1080p frames from host memory through FrameStream, against the serial loop and the bounds."""
    kw = dict(mean=MEAN, std=STD, out_dtype=torch.float16)
    if pinned:
        source = [_frames(batch, torch.device("cpu")).pin_memory() for _ in range(n // batch)]
    else:
        source = [f.numpy() for f in _frames(n, torch.device("cpu"))]  # single pageable frames
    dev_buf = torch.empty((batch, H, W, 3), dtype=torch.uint8, device=device)
    pinned_buf = torch.empty((batch, H, W, 3), dtype=torch.uint8).pin_memory()

    def batches():
        if pinned:
            yield from source
        else:
            for i in range(0, n, batch):
                yield torch.from_numpy(np.stack(source[i : i + batch]))

    def stream():
        last = None
        for b in FrameStream(source, batch_size=batch, device=device, **kw):
            last = b.frames
        torch.cuda.synchronize(device)
        return last

    def serial_chain():
        for b in batches():
            torch_chain(b.to(device), MEAN, STD)
        torch.cuda.synchronize(device)

    def serial_opforge():
        for b in batches():
            opforge.preprocess_frames(b.to(device), **kw)
        torch.cuda.synchronize(device)

    def h2d_only():
        for _ in range(n // batch):
            dev_buf.copy_(pinned_buf, non_blocking=True)
        torch.cuda.synchronize(device)

    def host_memcpy():
        for i in range(0, n, batch):
            for j, f in enumerate(source[i : i + batch]):
                opforge.copy_async(pinned_buf[j], torch.from_numpy(f))

    ring = [] if pinned else [torch.empty_like(pinned_buf).pin_memory() for _ in range(3)]
    done = [torch.cuda.Event() for _ in ring]
    copy_stream = torch.cuda.Stream(device)

    def memcpy_and_h2d():
        """The two copies at once with no Python pipeline: batch k+1 packed while batch k's DMA runs."""
        for b in range(n // batch):
            k = b % 3
            done[k].synchronize()  # slot k's transfer (3 batches ago) has read it
            for j, f in enumerate(source[b * batch : (b + 1) * batch]):
                opforge.copy_async(ring[k][j], torch.from_numpy(f))
            with torch.cuda.stream(copy_stream):
                opforge.copy_async(dev_buf, ring[k])
                done[k].record(copy_stream)
        copy_stream.synchronize()

    def check() -> str | None:
        seen = []
        for b in FrameStream(source, batch_size=batch, device=device, **kw):
            seen.extend(b.indices)
            if b.indices.start == 0:
                first = torch.from_numpy(np.stack(source[:batch])) if not pinned else source[0]
                if not torch.equal(b.frames, reference.preprocess_frames(first.to(device), **kw)):
                    return "the first batch differs from the reference"
        return None if seen == list(range(n)) else "frames lost, repeated or out of order"

    impls = {
        "FrameStream": stream,
        "serial: .to() + torch chain": serial_chain,
        "serial: .to() + opforge": serial_opforge,
        "bound: pinned H2D copy": h2d_only,
    }
    if not pinned:
        impls["bound: host memcpy to pinned"] = host_memcpy
        impls["ceiling: memcpy and H2D at once"] = memcpy_and_h2d
    return Case(
        op="video",
        name=f"stream {n}x1080p from {'pinned' if pinned else 'pageable numpy'} (batch {batch})",
        impls=impls,
        check=check,
        bytes=n * H * W * 3,
        frames=n,
        params={"frames": n, "batch": batch, "source": "pinned" if pinned else "pageable"},
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if device.type == "cuda":
        n = 32
        builders: list[CaseBuilder] = [
            partial(_preprocess_case, device, n, False),
            partial(_preprocess_case, device, n, True),
            partial(_stream_case, device, 64, 8, True),
            partial(_stream_case, device, 64, 8, False),
        ]
        if full:
            builders.insert(2, partial(_preprocess_case, device, 8, False))
        return builders
    builders = [partial(_preprocess_case, device, 4, False), partial(_preprocess_case, device, 4, True)]
    try:
        import cv2  # noqa: F401

        builders.append(partial(_cpu_blob_case, 4))
    except ImportError:
        pass
    return builders


SPEC = Spec(
    op="video",
    cases=cases,
    about="opforge.preprocess_frames vs the PyTorch chain, torchvision v2 and OpenCV; on CUDA FrameStream "
    "vs serial loops and the copy bounds",
)
