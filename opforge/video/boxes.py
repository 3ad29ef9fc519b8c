"""Boxes from a preprocessed (resized or letterboxed) frame back to the frame's pixels."""

from __future__ import annotations

import torch

from opforge.ops.preprocess_frames import FrameInfo


def scale_boxes(boxes: torch.Tensor, info: FrameInfo, *, clip: bool = True) -> torch.Tensor:
    """Map ``(..., 4)`` boxes ``(x1, y1, x2, y2)`` in the coordinates of ``preprocess_frames``'
    output back to the input frame: ``x = (x - left) / ratio_w``, ``y = (y - top) / ratio_h``
    (Ultralytics' ``scale_boxes`` with the letterbox's own gain and pads), then clipped to the frame
    (``[0, W]`` x ``[0, H]``) unless ``clip=False``. Returns a new tensor of the same dtype
    (floating) on the same device."""
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(
            f"opforge.video.scale_boxes: boxes must be a torch.Tensor, got {type(boxes).__name__}"
        )
    if boxes.shape[-1:] != (4,):  # a tensor that does not fit: RuntimeError, as PyTorch's ops
        raise RuntimeError(
            f"opforge.video.scale_boxes: boxes must have shape (..., 4), got {list(boxes.shape)}"
        )
    if not isinstance(info, FrameInfo):
        raise TypeError(f"opforge.video.scale_boxes: info must be a FrameInfo, got {type(info).__name__}")
    out = boxes.float() if not boxes.is_floating_point() else boxes.clone()
    top, left = info.pad
    ratio_h, ratio_w = info.ratio
    out[..., 0::2] = (out[..., 0::2] - left) / ratio_w
    out[..., 1::2] = (out[..., 1::2] - top) / ratio_h
    if clip:
        height, width = info.shape
        out[..., 0::2] = out[..., 0::2].clamp(0, width)
        out[..., 1::2] = out[..., 1::2].clamp(0, height)
    return out
