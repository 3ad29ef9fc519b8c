"""opforge.matmul: a @ b by a ladder of kernels, from the tutorial's naive CUDA kernel to tensor cores."""

from __future__ import annotations

import torch

from opforge.ops._common import check_dtype_in, check_same_device, check_same_dtype, require_tensor

OP = "opforge.matmul"
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: Every variant name; "auto" picks the fastest one that can serve the call.
VARIANTS = ("auto", "naive", "smem_tiled", "register_blocked", "warp_tiled", "mma", "wgmma")


def matmul(a: torch.Tensor, b: torch.Tensor, *, variant: str = "auto") -> torch.Tensor:
    """Return ``a @ b``.

    Args:
        a: ``(m, k)`` or batched ``(batch, m, k)``; float32, float64, float16 or bfloat16; any
            strides (transposed views need no copy on the CPU).
        b: ``(k, n)`` or ``(batch, k, n)``: as many dimensions as ``a``, the same batch size,
            dtype and device (no broadcasting, no type promotion).
        variant: the kernel. ``"auto"`` (default) picks the fastest that can serve the call. On
            CUDA the ladder of ``docs/matmul.md`` can be named: ``"naive"``, ``"smem_tiled"``,
            ``"register_blocked"``, ``"warp_tiled"`` (float32), ``"mma"`` and ``"wgmma"``
            (float16/bfloat16; wgmma needs an sm_90 GPU). A variant that cannot serve the call
            raises a ValueError naming those that can.

    Returns:
        ``(m, n)`` or ``(batch, m, n)``, contiguous, of ``a``'s dtype. float16/bfloat16 multiply
        with float32 accumulation and round once; ``k = 0`` gives zeros.

    Differentiable in ``a`` and ``b`` (the backward products use opforge.matmul with the same
    variant); works under ``torch.compile(fullgraph=True)``.
    """
    require_tensor(OP, "a", a)
    require_tensor(OP, "b", b)
    if not isinstance(variant, str):
        raise TypeError(f"{OP}: variant must be a str, got {type(variant).__name__}")
    return torch.ops.opforge.matmul.default(a, b, variant=variant)


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


# Autograd is registered in C++ (csrc/matmul/matmul_autograd.cpp).
