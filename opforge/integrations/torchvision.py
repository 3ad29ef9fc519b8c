"""Make torchvision's NMS (and so its detection models) run on opforge.

    import opforge.integrations.torchvision as otv
    otv.patch()                 # torchvision.ops.nms / batched_nms now call opforge
    with otv.patched():         # or only inside a block
        detections = model(images)

torchvision's detection models call ``torchvision.ops.boxes.batched_nms``, which calls
``torchvision.ops.boxes.nms``; both names (and the ``torchvision.ops`` re-exports) are replaced.
The results are the same boxes in the same order (see docs/nms.md for ties).

torchvision's ``batched_nms`` also takes floating-point (or bool) class ids ``idxs``, where
distinct values are distinct classes; ``opforge.batched_nms`` takes integer ids only, so the
patched function first maps such ids to integers with ``torch.unique(idxs, return_inverse=True)``:
one more sort of ``idxs`` and, on CUDA, one more device-to-host sync. Integer ids go straight
through.

Errors keep torchvision's types where torchvision raises: boxes, scores or ids whose shape, dtype
or device do not fit raise a ``RuntimeError`` (opforge's words). Where torchvision does not raise,
opforge may: a NaN ``iou_threshold`` is a ``ValueError`` (torchvision keeps every box, as no IoU
is > NaN), a threshold that is no real number a ``TypeError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import opforge

_ORIGINALS: dict[tuple[object, str], object] = {}


def _nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    return opforge.nms(boxes, scores, iou_threshold)


def _batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    if isinstance(idxs, torch.Tensor) and (idxs.is_floating_point() or idxs.dtype == torch.bool):
        idxs = torch.unique(idxs, return_inverse=True)[1]  # distinct values: distinct classes
    return opforge.batched_nms(boxes, scores, idxs, iou_threshold)


def _targets():
    import torchvision.ops
    import torchvision.ops.boxes

    return [
        (torchvision.ops.boxes, "nms", _nms),
        (torchvision.ops.boxes, "batched_nms", _batched_nms),
        (torchvision.ops, "nms", _nms),
        (torchvision.ops, "batched_nms", _batched_nms),
    ]


def patch() -> None:
    """Route torchvision.ops.nms and batched_nms to opforge (idempotent)."""
    for module, name, replacement in _targets():
        key = (module, name)
        if key not in _ORIGINALS:
            _ORIGINALS[key] = getattr(module, name)
        setattr(module, name, replacement)


def unpatch() -> None:
    """Restore torchvision's own functions."""
    for (module, name), original in list(_ORIGINALS.items()):
        setattr(module, name, original)
        del _ORIGINALS[(module, name)]


def is_patched() -> bool:
    return bool(_ORIGINALS)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Use opforge's NMS inside the block, torchvision's again after it."""
    was_patched = is_patched()
    patch()
    try:
        yield
    finally:
        if not was_patched:
            unpatch()
