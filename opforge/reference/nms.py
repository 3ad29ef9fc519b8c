"""Reference NMS: the plain-PyTorch greedy algorithm that defines opforge.nms and batched_nms."""

from __future__ import annotations

import torch


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS, one kept box at a time (the tutorial's "Python version", with tensor math).

    Visit boxes by decreasing score (stable: ties lower index first); keep a box unless a kept
    box overlaps it with IoU > iou_threshold. IoU is torchvision's CPU formula,
    ``inter / (area_kept + area_j - inter)``, in float32 (float64 for float64 boxes), compared
    with the threshold in float64.
    """
    n = boxes.shape[0]
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, stable=True, descending=True).indices
    b = boxes.to(_acc_dtype(boxes.dtype))[order]
    x1, y1, x2, y2 = b.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    alive = torch.ones(n, dtype=torch.bool, device=boxes.device)
    keep = []
    alive_host = alive.cpu()
    for i in range(n):
        if not alive_host[i]:
            continue
        keep.append(i)
        rest = slice(i + 1, n)
        xx1 = torch.maximum(x1[i], x1[rest])
        yy1 = torch.maximum(y1[i], y1[rest])
        xx2 = torch.minimum(x2[i], x2[rest])
        yy2 = torch.minimum(y2[i], y2[rest])
        w = (xx2 - xx1).clamp(min=0)
        h = (yy2 - yy1).clamp(min=0)
        inter = w * h
        iou = inter / (area[i] + area[rest] - inter)
        suppressed = iou.to(torch.float64) > iou_threshold
        alive_host[rest] &= ~suppressed.cpu()
    return order[torch.tensor(keep, dtype=torch.int64, device=boxes.device)]


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS per category, then all kept boxes by decreasing score (ties: lower index first)."""
    keep = []
    for c in torch.unique(idxs):
        members = torch.nonzero(idxs == c).flatten()
        keep.append(members[nms(boxes[members], scores[members], iou_threshold)])
    if not keep:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    kept = torch.sort(torch.cat(keep)).values  # index order, so the stable sort below breaks ties by index
    return kept[torch.sort(scores[kept], stable=True, descending=True).indices]
