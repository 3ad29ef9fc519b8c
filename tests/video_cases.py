"""What the opforge.video tests share: random frames, the batches a FrameStream must deliver and
the checks of its batches. A helper module, not a test module: the test files import it."""

from __future__ import annotations

import numpy as np
import torch

import opforge
from opforge import reference
from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry
from opforge.video import StreamBatch


def rand(n, h, w, c=3) -> torch.Tensor:
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8)


def per_frame(items) -> list[torch.Tensor]:
    """The source's frames one by one, as contiguous CPU (H, W, C) copies."""
    out = []
    for item in items:
        t = torch.from_numpy(np.array(item)) if isinstance(item, np.ndarray) else item.cpu()
        if t.dim() == 3:
            t = t.unsqueeze(0)
        out.extend(t[i].contiguous().clone() for i in range(t.shape[0]))
    return out


def expected_chunks(frames: list[torch.Tensor], batch_size: int) -> list[list[int]]:
    """Batches as FrameStream documents them: runs of equal frame shapes, cut every batch_size."""
    chunks, cur = [], []
    for i, f in enumerate(frames):
        if cur and (f.shape != frames[cur[0]].shape or len(cur) == batch_size):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks


def indices_of(batches) -> list[list[int]]:
    return [list(b.indices) for b in batches]


def geometry_opts(kw: dict) -> dict:
    return {k: kw[k] for k in ("scaleup", "stride", "center") if k in kw}


def check_batch(b: StreamBatch, raw: torch.Tensor, kw: dict, device) -> None:
    """b is the batch of the CPU frames raw, preprocessed with kw on device."""
    assert isinstance(b, StreamBatch)
    assert b.frames.device.type == torch.device(device).type
    result = opforge.preprocess_frames(raw.to(device), **kw)
    want, want_info = result if kw.get("letterbox") else (result, None)
    assert b.frames.shape == want.shape and b.frames.dtype == want.dtype
    assert torch.equal(b.frames, want)
    h, w = raw.shape[1:3]
    if kw.get("letterbox"):
        assert b.info == want_info == letterbox_geometry((h, w), kw["size"], **geometry_opts(kw))
    else:
        size = kw.get("size")
        out = (h, w) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
        assert b.info == FrameInfo((h, w), out, out, (0, 0), (out[0] / h, out[1] / w))
    if "size" not in kw:  # no resize: bit-identical to the plain PyTorch chain on the CPU
        assert torch.equal(b.frames.cpu(), reference.preprocess_frames(raw, **kw))
    assert b.output is None


def check_stream(batches, frames, batch_size, kw, device) -> None:
    chunks = expected_chunks(frames, batch_size)
    assert indices_of(batches) == chunks
    assert [i for b in batches for i in b.indices] == list(range(len(frames)))
    for b, chunk in zip(batches, chunks, strict=True):
        check_batch(b, torch.stack([frames[i] for i in chunk]), kw, device)


def check_raw(batches, frames, batch_size, device) -> None:
    """raw=True batches: the source's uint8 frames, unchanged, in order."""
    chunks = expected_chunks(frames, batch_size)
    assert indices_of(batches) == chunks
    for b, chunk in zip(batches, chunks, strict=True):
        assert b.info is None and b.output is None
        assert b.frames.dtype == torch.uint8 and b.frames.device.type == torch.device(device).type
        assert torch.equal(b.frames.cpu(), torch.stack([frames[i] for i in chunk]))
