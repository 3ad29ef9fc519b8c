"""opforge.vector_add: the hello-world op, a + b elementwise."""

from __future__ import annotations

import torch

from opforge.ops._common import require_tensor

OP = "opforge.vector_add"
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def vector_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return ``a + b``, elementwise.

    Args:
        a: tensor of any shape and strides, float32, float64, float16 or bfloat16, on the CPU or
            a CUDA device.
        b: tensor of the same shape, dtype and device as ``a`` (no broadcasting, no type promotion).

    Returns:
        A new tensor with ``a``'s shape and dtype: ``a``'s memory layout when ``a`` is dense
        (contiguous, channels-last, transposed...), else contiguous. 16-bit types are added in
        float32 and rounded once, so results are bit-identical to ``torch.add``.

    Differentiable in both inputs; works under ``torch.compile(fullgraph=True)``. Raises
    TypeError for non-tensors and RuntimeError naming ``opforge.vector_add`` and the argument
    for a shape, dtype or device mismatch.
    """
    require_tensor(OP, "a", a)
    require_tensor(OP, "b", b)
    return torch.ops.opforge.vector_add.default(a, b)


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    """The C++ checks, repeated word for word for fake tensors (torch.compile, meta)."""
    if a.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise RuntimeError(f"{OP}: a must be one of ({names}), got {str(a.dtype).removeprefix('torch.')}")
    if b.dtype != a.dtype:
        raise RuntimeError(
            f"{OP}: b must have the same dtype as a ({str(a.dtype).removeprefix('torch.')}), "
            f"got {str(b.dtype).removeprefix('torch.')}"
        )
    if b.device != a.device:
        raise RuntimeError(f"{OP}: b must be on the same device as a ({a.device}), got {b.device}")
    if b.shape != a.shape:
        raise RuntimeError(f"{OP}: b must have the same shape as a {list(a.shape)}, got {list(b.shape)}")


@torch.library.register_fake("opforge::vector_add")
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    # Same rule as the kernel: a's layout when a is dense (empty_like preserves it), else contiguous.
    return torch.empty_like(a)


# Autograd is registered in C++ (csrc/vector_add/vector_add_autograd.cpp), so LibTorch users get it
# too and Python calls pay no Python-level autograd layer.
