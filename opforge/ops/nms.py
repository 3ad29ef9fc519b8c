"""opforge.nms, batched_nms and nms_padded: torchvision's NMS contract, faster."""

from __future__ import annotations

import math

import torch

from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    dtype_name,
    require_tensor,
)

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Non-maximum suppression, with ``torchvision.ops.nms``'s contract.

    Args:
        boxes: ``(N, 4)`` boxes as ``(x1, y1, x2, y2)``; float32, float16, bfloat16 or float64
            (IoU math in float32 for the 16-bit types, float64 for float64); CPU or CUDA.
        scores: ``(N,)`` scores, same dtype and device as ``boxes``.
        iou_threshold: a box is discarded when its IoU with a kept, higher-scoring box is
            greater than this (an IoU exactly at the threshold does not suppress). Any real
            number torchvision takes: an int, float or bool, a NumPy scalar or 0-d array, a
            one-element tensor, a ``Fraction`` or ``Decimal``; it is converted to a Python float.

    Returns:
        int64 tensor of the indices of the kept boxes, by decreasing score. Equal scores are
        taken lower index first; NaN scores sort first (as in ``torch.sort``). A box with a NaN
        coordinate neither suppresses nor is suppressed; degenerate boxes (zero or negative
        area) go through the same formula as in torchvision. Empty input gives an empty result.

    On CUDA everything runs on the device; the only device->host copy is the read of the kept
    count. ``nms_padded`` avoids even that.
    """
    iou_threshold = _check_python_args("opforge.nms", boxes, scores, iou_threshold)
    return torch.ops.opforge.nms.default(boxes, scores, iou_threshold)


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS within each category, with ``torchvision.ops.batched_nms``'s contract.

    Boxes with different ``idxs`` (an integer tensor of shape ``(N,)``) never suppress each
    other. Returns the int64 indices of the kept boxes by decreasing score across categories
    (equal scores: lower index first). Each category is its own segment of the work, so the cost
    does not grow with the square of all boxes.
    """
    iou_threshold = _check_python_args("opforge.batched_nms", boxes, scores, iou_threshold)
    require_tensor("opforge.batched_nms", "idxs", idxs)
    return torch.ops.opforge.batched_nms.default(boxes, scores, idxs, iou_threshold)


def nms_padded(
    boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, idxs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``nms`` (or ``batched_nms`` when ``idxs`` is given) without any host synchronisation.

    Returns ``(keep, num_kept)``: ``keep`` has ``N`` int64 entries, the kept indices first (by
    decreasing score) and ``-1`` after them; ``num_kept`` is a 0-d int64 tensor on the same
    device. Fixed output shapes make a detector's post-processing capturable in a CUDA graph.
    """
    iou_threshold = _check_python_args("opforge.nms_padded", boxes, scores, iou_threshold)
    if idxs is not None:
        require_tensor("opforge.nms_padded", "idxs", idxs)
    return torch.ops.opforge.nms_padded.default(boxes, scores, iou_threshold, idxs)


def _check_python_args(op: str, boxes, scores, iou_threshold) -> float:
    require_tensor(op, "boxes", boxes)
    require_tensor(op, "scores", scores)
    return _iou_threshold(op, iou_threshold)


def _iou_threshold(op: str, value) -> float:
    """``value`` as a Python float, accepting the numbers torchvision's nms accepts.

    torchvision's schema argument ``float iou_threshold`` takes what converts through
    ``__float__`` or ``__index__``: Python and NumPy numbers (bools too), NumPy 0-d arrays,
    tensors of one element (not on the meta device), ``Fraction``, ``Decimal``. Complex values,
    which torchvision truncates with a warning (NumPy, tensors), and strings are refused.
    """
    if isinstance(value, torch.Tensor):
        got = f"a {dtype_name(value.dtype)} tensor of shape {list(value.shape)} on {value.device}"
        ok = value.numel() == 1 and not value.is_complex() and not value.is_meta
        value = value.detach()  # no warning for requires_grad
    else:
        got = type(value).__name__
        kind = getattr(getattr(value, "dtype", None), "kind", None)  # NumPy scalars and arrays
        if kind:
            ok = kind in "biuf"  # bool, int, unsigned, float: not complex, str, datetime
        else:
            ok = hasattr(value, "__float__") or hasattr(value, "__index__")
    if ok:
        try:
            return float(value)
        except OverflowError:  # an int such as 10**400
            raise OverflowError(f"{op}: iou_threshold is too large to convert to a float ({got})") from None
        except (TypeError, ValueError):  # e.g. a signalling Decimal NaN
            pass
    raise TypeError(
        f"{op}: iou_threshold must be a real number (int, float, a NumPy scalar or a one-element "
        f"tensor), got {got}"
    )


def _check(op: str, boxes, scores, idxs, iou_threshold: float) -> None:
    """check_nms_inputs (csrc/nms/nms.cpp), for fake tensors."""
    n = boxes.shape[0] if boxes.dim() >= 1 else 0
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise RuntimeError(f"{op}: boxes must be a 2-D tensor of shape (N, 4), got {list(boxes.shape)}")
    if scores.dim() != 1 or scores.shape[0] != n:
        raise RuntimeError(
            f"{op}: scores must be a 1-D tensor with one score per box (N={n}), got {list(scores.shape)}"
        )
    check_dtype_in(op, "boxes", boxes, _FLOAT_DTYPES)
    check_same_dtype(op, "scores", scores, "boxes", boxes)
    check_same_device(op, "scores", scores, "boxes", boxes)
    if idxs is not None:
        if idxs.dim() != 1 or idxs.shape[0] != n:
            raise RuntimeError(
                f"{op}: idxs must be a 1-D tensor with one class per box (N={n}), got {list(idxs.shape)}"
            )
        if idxs.dtype.is_floating_point or idxs.dtype.is_complex or idxs.dtype == torch.bool:
            raise RuntimeError(f"{op}: idxs must have an integer dtype, got {dtype_name(idxs.dtype)}")
        check_same_device(op, "idxs", idxs, "boxes", boxes)
    if math.isnan(iou_threshold):
        # A value out of range: ValueError, as the C++ check. (torchvision.ops.nms takes NaN silently
        # and keeps every box, since no IoU is > NaN.)
        raise ValueError(f"{op}: iou_threshold must be a number, got nan")


def _fake_keep(boxes: torch.Tensor) -> torch.Tensor:
    # The number of kept boxes depends on the data: an unbacked size between 0 and N.
    ctx = torch.library.get_ctx()
    count = ctx.new_dynamic_size(min=0)
    return boxes.new_empty((count,), dtype=torch.int64)


@torch.library.register_fake("opforge::nms")
def _(boxes, scores, iou_threshold):
    _check("opforge.nms", boxes, scores, None, iou_threshold)
    return _fake_keep(boxes)


@torch.library.register_fake("opforge::batched_nms")
def _(boxes, scores, idxs, iou_threshold):
    _check("opforge.batched_nms", boxes, scores, idxs, iou_threshold)
    return _fake_keep(boxes)


@torch.library.register_fake("opforge::nms_padded")
def _(boxes, scores, iou_threshold, idxs=None):
    _check("opforge.nms_padded", boxes, scores, idxs, iou_threshold)
    return boxes.new_empty((boxes.shape[0],), dtype=torch.int64), boxes.new_empty((), dtype=torch.int64)
