"""Benchmark spec for opforge.attention: against SDPA (is_causal where it applies, a dense bool
mask otherwise) and plain PyTorch attention, in the same run; TFLOP/s count the visible work only.

The CUDA kernels are not built yet (issue 20 in progress): CUDA devices get no cases."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec
from opforge.masks import attention_mask


def _case(device: torch.device, name: str, B: int, H: int, S: int, D: int, kw: dict, backward: bool) -> Case:
    q, k, v = (torch.randn(B, H, S, D, device=device) for _ in range(3))
    dense = attention_mask(B, H, S, S, device=device, **kw)
    visible = int(dense.sum())
    causal_only = kw == {"causal": True}

    def sdpa():
        if causal_only:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if not kw else dense)

    def ours():
        return opforge.attention(q, k, v, **kw)

    def plain():
        return reference.attention(q, k, v, **kw)

    impls = {"opforge": ours, "SDPA" + (" (dense mask)" if kw and not causal_only else ""): sdpa}
    if not backward:
        impls["plain PyTorch"] = plain
    if backward:
        grads = torch.randn_like(q)
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def fwd_bwd(fn):
            def run():
                torch.autograd.grad(fn(), leaves, grads)

            return run

        impls = {name_: fwd_bwd(fn) for name_, fn in impls.items()}

    def check() -> str | None:
        with torch.no_grad():
            err = (
                (ours().double() - reference.attention(q.double(), k.double(), v.double(), **kw))
                .abs()
                .max()
                .item()
            )
        return None if err <= 1e-4 else f"max error {err:.2e} against the float64 reference"

    # 2 flops per multiply-add: forward Q K^T and P V (4 D per visible pair); the backward adds
    # dP = dO V^T, dV, dK, dQ and recomputes Q K^T (10 D), as FlashAttention counts it (2.5x).
    per_pair = 4 * D * (3.5 if backward else 1.0)
    return Case(
        op="attention",
        name=f"{name} B{B} H{H} S{S} D{D} fp32 {'fwd+bwd' if backward else 'fwd'}",
        impls=impls,
        check=check,
        flops=int(visible * per_pair),
        params={"pattern": name, "B": B, "H": H, "S": S, "D": D, "backward": backward},
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if device.type == "cuda":
        return []
    builders = [
        partial(_case, device, "sliding 256", 1, 8, 2048, 64, dict(causal=True, window=(255, 0)), False),
        partial(_case, device, "causal", 1, 8, 2048, 64, dict(causal=True), False),
    ]
    if full:
        builders += [
            partial(_case, device, "full", 1, 8, 2048, 64, {}, False),
            partial(_case, device, "causal", 1, 8, 2048, 64, dict(causal=True), True),
        ]
    return builders


SPEC = Spec(op="attention", cases=cases)
