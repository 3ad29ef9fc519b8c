"""Benchmark spec for opforge.nms and batched_nms: against torchvision and the Python greedy NMS."""

from __future__ import annotations

import os
from functools import partial

import torch

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec


def distinct(scores: torch.Tensor) -> torch.Tensor:
    """The same order, as distinct values exact in float32: no ties (torchvision orders exact
    ties arbitrarily, so only tie-free inputs have one right answer to compare)."""
    ranks = torch.argsort(torch.argsort(scores, stable=True), stable=True)
    return (ranks.to(torch.float64) + 1) / (scores.numel() + 1)


def uniform_boxes(n: int, device="cpu", dtype=torch.float32, size: float = 1024.0):
    """Boxes of 4 to 124 pixels, uniformly placed in a size x size image; distinct scores."""
    centers = torch.rand(n, 2, dtype=torch.float64) * size
    wh = torch.rand(n, 2, dtype=torch.float64) * 120 + 4
    boxes = torch.cat([centers - wh / 2, centers + wh / 2], 1)
    scores = distinct(torch.rand(n, dtype=torch.float64))
    return boxes.to(device=device, dtype=dtype), scores.to(device=device, dtype=dtype)


def clustered_boxes(n: int, device="cpu", dtype=torch.float32, per_object: int = 30):
    """Detector-like: about per_object jittered boxes around each object, scores near the object's."""
    objects = max(1, n // per_object)
    base, base_scores = uniform_boxes(objects, dtype=torch.float64)
    pick = torch.randint(0, objects, (n,))
    wh = (base[:, 2:] - base[:, :2])[pick]
    boxes = base[pick] + torch.randn(n, 4, dtype=torch.float64) * 0.08 * wh.repeat(1, 2)
    scores = distinct(base_scores[pick] * (1 - 0.2 * torch.rand(n, dtype=torch.float64)))
    return boxes.to(device=device, dtype=dtype), scores.to(device=device, dtype=dtype)


def torchvision_ops():
    """torchvision.ops when torchvision is installed and loads beside this torch, else None."""
    try:
        import torchvision.ops

        torchvision.ops.nms(torch.zeros(1, 4), torch.ones(1), 0.5)
        return torchvision.ops
    except Exception:  # missing, or a build for another torch ("operator torchvision::nms does not exist")
        return None


def _case(device: torch.device, kind: str, n: int, classes: int, with_reference: bool) -> Case:
    """Allocate one case's inputs: called by the harness just before the case runs."""
    tv = torchvision_ops()

    make = uniform_boxes if kind == "uniform" else clustered_boxes
    torch.manual_seed(n * 1000 + classes * 10 + (kind == "clustered"))  # the same sets every run
    boxes, scores = make(n, device=device)
    idxs = torch.randint(0, classes, (n,), device=device)
    thr = 0.5
    if classes == 1:
        impls = {
            "opforge": lambda: opforge.nms(boxes, scores, thr),
            "torchvision": lambda: tv.nms(boxes, scores, thr),
        }
        ref = lambda: reference.nms(boxes, scores, thr)  # noqa: E731
    else:
        impls = {
            "opforge": lambda: opforge.batched_nms(boxes, scores, idxs, thr),
            "torchvision": lambda: tv.batched_nms(boxes, scores, idxs, thr),
        }
        ref = lambda: reference.batched_nms(boxes, scores, idxs, thr)  # noqa: E731
    if with_reference:
        impls["python greedy (reference)"] = ref

    def check() -> str | None:
        got, want = impls["opforge"](), impls["torchvision"]()
        if torch.equal(got.cpu(), want.cpu()):
            return None
        if device.type == "cuda":
            # torchvision's CUDA kernel lets the compiler fuse its IoU into FMAs, so an IoU within an
            # ulp of the threshold can go the other way than in its CPU kernel (IEEE, one rounding
            # per operation), which opforge follows on both devices (docs/nms.md).
            b, s, c = boxes.cpu(), scores.cpu(), idxs.cpu()
            cpu = tv.nms(b, s, thr) if classes == 1 else tv.batched_nms(b, s, c, thr)
            if torch.equal(got.cpu(), cpu):
                print(
                    f"note: {n} {kind} {classes} classes: torchvision CUDA ({want.numel()} kept) differs from"
                    f" torchvision CPU ({cpu.numel()} kept); opforge matches torchvision CPU"
                )
                return None
        # Keep the inputs for a repro (OPFORGE_BENCH_FAILURES: a folder; the GPU scripts set $OUT).
        folder = os.environ.get("OPFORGE_BENCH_FAILURES", ".")
        path = os.path.join(folder, f"nms-failure-{n}-{kind}-{classes}.pt")
        torch.save({"boxes": boxes.cpu(), "scores": scores.cpu(), "idxs": idxs.cpu(), "thr": thr}, path)
        return f"kept {got.numel()} boxes, torchvision {want.numel()}, or in another order (inputs: {path})"

    op = "nms" if classes == 1 else "batched_nms"
    label = (
        (f"{n // 1000}k" if n >= 1000 else str(n))
        + f" {kind}"
        + ("" if classes == 1 else f" {classes} classes")
    )
    return Case(
        op=op, name=label, impls=impls, check=check, params={"n": n, "kind": kind, "classes": classes}
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if torchvision_ops() is None:
        print("opforge bench: torchvision is missing or does not load beside this torch: nms skipped")
        return []
    # 100 and 500 boxes check that small inputs (a detector's per-image NMS) do not regress.
    if device.type == "cuda":
        sizes = [100, 500, 1000, 5000, 10000, 50000] if full else [1000, 10000]
    else:
        sizes = [100, 500, 1000, 5000, 10000] if full else [1000, 10000]
    # The Python greedy loop syncs once per kept box: timed where it takes seconds, not minutes.
    greedy_max = 1000 if device.type == "cuda" else 5000
    return [
        partial(_case, device, kind, n, classes, with_reference=full and n <= greedy_max)
        for classes in (1, 80)
        for kind in ("uniform", "clustered")
        for n in sizes
    ]


SPEC = Spec(
    op="nms",
    cases=cases,
    about="opforge.nms and batched_nms vs torchvision.ops (and the Python greedy loop with --full)",
)
