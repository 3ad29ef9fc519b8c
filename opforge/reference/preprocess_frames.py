"""Reference for opforge.preprocess_frames: the plain PyTorch chain (what the op means, and the
benchmarks' "torch chain" baseline): channel select, permute to NCHW, float, F.interpolate
(bilinear, align_corners=False), F.pad with the pad value, x * scale - mean, / std, cast."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry


def preprocess_frames(
    frames: torch.Tensor,
    *,
    size: int | tuple[int, int] | None = None,
    letterbox: bool = False,
    pad_value: float = 114,
    mean: float | Sequence[float] | None = None,
    std: float | Sequence[float] | None = None,
    scale: float = 1 / 255,
    out_dtype: torch.dtype = torch.float16,
    channels_in: str = "rgb",
    channels_out: str = "rgb",
    scaleup: bool = True,
    stride: int | None = None,
    center: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, FrameInfo]:
    """Same arguments and result as :func:`opforge.preprocess_frames` (NHWC frames)."""
    _, height, width, _ = frames.shape
    if letterbox:
        info = letterbox_geometry((height, width), size, scaleup=scaleup, stride=stride, center=center)
    else:
        out = (height, width) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
        info = FrameInfo((height, width), out, out, (0, 0), (out[0] / height, out[1] / width))
    swap = channels_in[:3] != channels_out
    x = (frames[..., [2, 1, 0]] if swap else frames[..., :3]).permute(0, 3, 1, 2).float()
    if info.resized != (height, width):
        x = F.interpolate(x, size=info.resized, mode="bilinear", align_corners=False, antialias=False)
    top, left = info.pad
    bottom = info.size[0] - info.resized[0] - top
    right = info.size[1] - info.resized[1] - left
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=float(pad_value))
    x = x * scale
    if mean is not None:
        x = x - torch.as_tensor(mean, dtype=torch.float32, device=x.device).expand(3).view(1, 3, 1, 1)
    if std is not None:
        x = x / torch.as_tensor(std, dtype=torch.float32, device=x.device).expand(3).view(1, 3, 1, 1)
    x = x.to(out_dtype).contiguous()
    return (x, info) if letterbox else x


def torch_chain(frames: torch.Tensor, mean: Sequence[float], std: Sequence[float], dtype=torch.float16):
    """The plain per-frame chain people write (the benchmark's baseline without resize):
    permute, float, scale, subtract, divide, cast."""
    m = torch.tensor(mean, device=frames.device).view(1, 3, 1, 1)
    s = torch.tensor(std, device=frames.device).view(1, 3, 1, 1)
    return ((frames.permute(0, 3, 1, 2).float() / 255 - m) / s).to(dtype)
