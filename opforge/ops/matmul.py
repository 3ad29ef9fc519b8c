"""opforge.matmul: a @ b by a ladder of kernels, from the tutorial's naive CUDA kernel to tensor cores."""

from __future__ import annotations

import torch

from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    require_tensor,
    transforms_active,
)

OP = "opforge.matmul"
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: Every variant name; "auto" picks the fastest one that can serve the call, "warp_tiled" and
#: "mma" the fastest kernel of their rung.
VARIANTS = (
    "auto",
    "naive",
    "smem_tiled",
    "register_blocked",
    "warp_tiled",
    "warp_tiled_staged",
    "warp_tiled_cp_async",
    "mma",
    "mma_cp_async",
    "mma_tma",
    "mma_ws",
    "wgmma",
)


def matmul(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto") -> torch.Tensor:
    """Return ``a @ b``.

    Args:
        a: ``(m, k)`` or batched ``(batch, m, k)``; float32, float64, float16 or bfloat16; any
            strides (transposed views need no copy on the CPU).
        b: ``(k, n)`` or ``(batch, k, n)``: as many dimensions as ``a``, the same batch size,
            dtype and device (no broadcasting, no type promotion).
        variant: the kernel. ``"auto"`` (default) picks the fastest that can serve the call. On
            CUDA the ladder of ``docs/matmul.md`` can be named: ``"naive"``, ``"smem_tiled"``,
            ``"register_blocked"``, ``"warp_tiled"`` (float32; the fastest of
            ``"warp_tiled_staged"`` and ``"warp_tiled_cp_async"``), ``"mma"`` (float16/bfloat16;
            the fastest of ``"mma_cp_async"``, ``"mma_tma"`` and ``"mma_ws"``) and ``"wgmma"``
            (float16/bfloat16). Every kernel takes every layout (the launcher copies what it
            cannot read); one without code for this GPU (mma_tma: sm_90; mma_ws, wgmma: sm_90a
            builds) or that cannot serve the dtype raises a ValueError saying what it needs.

    Returns:
        ``(m, n)`` or ``(batch, m, n)``, contiguous, of ``a``'s dtype. float16/bfloat16 multiply
        with float32 accumulation and round once; ``k = 0`` gives zeros.

    Differentiable in ``a`` and ``b`` (the backward products use opforge.matmul with the same
    variant); works under ``torch.compile(fullgraph=True)`` and the ``torch.func`` transforms
    (grad, vjp, jacrev, jacfwd, jvp, vmap) and forward-mode AD.
    """
    require_tensor(OP, "a", a)
    require_tensor(OP, "b", b)
    if not isinstance(variant, str):
        raise TypeError(f"{OP}: variant must be a str, got {type(variant).__name__}")
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        return _Matmul.apply(a, b, variant)
    return torch.ops.opforge.matmul.default(a, b, variant=variant)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


class _Matmul(torch.autograd.Function):
    """opforge.matmul under torch.func transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and
    forward-mode AD, which the op's C++ autograd kernel (csrc/matmul/matmul_autograd.cpp) cannot
    serve. The same formulas: da = dc b^T, db = a^T dc; the tangent da b + a db."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor, variant: str) -> torch.Tensor:
        return torch.ops.opforge.matmul.default(a, b, variant=variant)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        a, b, variant = inputs
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)
        ctx.variant = variant

    @staticmethod
    def backward(ctx, dc: torch.Tensor):
        a, b = ctx.saved_tensors
        da = matmul(dc, _t(b), variant=ctx.variant) if ctx.needs_input_grad[0] else None
        db = matmul(_t(a), dc, variant=ctx.variant) if ctx.needs_input_grad[1] else None
        return da, db, None

    @staticmethod
    def jvp(ctx, da, db, _variant):
        a, b = ctx.saved_tensors
        out = None
        if da is not None:
            out = matmul(da, b, variant=ctx.variant)
        if db is not None:
            term = matmul(a, db, variant=ctx.variant)
            out = term if out is None else out + term
        return out


@torch.library.register_vmap("opforge::matmul")
def _(info, in_dims, a, b, *, variant="auto"):
    """vmap: the mapped dimension joins the batch dimension (an unmapped operand is broadcast
    along it with stride 0, which every kernel reads)."""
    a_dim, b_dim = in_dims
    size = info.batch_size
    a = a.movedim(a_dim, 0) if a_dim is not None else a.unsqueeze(0).expand(size, *a.shape)
    b = b.movedim(b_dim, 0) if b_dim is not None else b.unsqueeze(0).expand(size, *b.shape)
    if a.dim() == 3:  # 2-D operands: the mapped dimension is the batch
        return torch.ops.opforge.matmul.default(a, b, variant=variant), 0
    out = torch.ops.opforge.matmul.default(a.flatten(0, 1), b.flatten(0, 1), variant=variant)
    return out.unflatten(0, (size, a.shape[1])), 0


def _check(a: torch.Tensor, b: torch.Tensor, variant: str) -> None:
    """check_matmul_inputs and the variant name check (csrc/matmul/matmul.cpp), for fake tensors."""
    if a.dim() not in (2, 3):
        raise RuntimeError(
            f"{OP}: a must be 2-D (m, k) or 3-D (batch, m, k), got {a.dim()}-D with shape {list(a.shape)}"
        )
    if b.dim() != a.dim():
        raise RuntimeError(
            f"{OP}: b must have as many dimensions as a ({a.dim()}), got {b.dim()}-D with shape {list(b.shape)}"
        )
    if a.dim() == 3 and a.shape[0] != b.shape[0]:
        raise RuntimeError(f"{OP}: b must have a's batch size ({a.shape[0]}), got {b.shape[0]}")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(
            f"{OP}: inner dimensions differ: a is {list(a.shape)} and b is {list(b.shape)}"
            " (a's last dimension must equal b's second to last)"
        )
    check_dtype_in(OP, "a", a, SUPPORTED_DTYPES)
    check_same_dtype(OP, "b", b, "a", a)
    check_same_device(OP, "b", b, "a", a)
    if variant not in VARIANTS:
        raise ValueError(f"{OP}: unknown variant '{variant}'; the variants are: {', '.join(VARIANTS)}")


@torch.library.register_fake("opforge::matmul")
def _(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto") -> torch.Tensor:
    _check(a, b, variant)
    shape = (a.shape[0], b.shape[1]) if a.dim() == 2 else (a.shape[0], a.shape[1], b.shape[2])
    return a.new_empty(shape)


# Autograd is registered in C++ (csrc/matmul/matmul_autograd.cpp): torch.ops.opforge.matmul and
# LibTorch programs get it; under torch.func, matmul() above takes _Matmul instead.
