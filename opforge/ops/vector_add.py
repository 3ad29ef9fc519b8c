"""opforge.vector_add: the hello-world op, a + b elementwise."""

from __future__ import annotations

import torch

from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    check_same_shape,
    require_tensor,
    transforms_active,
)

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
        (contiguous, channels-last, transposed...), else dense in ``a``'s stride order (that is
        ``torch.empty_like(a)``). 16-bit types are added in float32 and rounded once, so results
        are bit-identical to ``torch.add``.

    Differentiable in both inputs; works under ``torch.compile(fullgraph=True)`` and the
    ``torch.func`` transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and forward-mode AD. Raises
    TypeError for non-tensors and RuntimeError naming ``opforge.vector_add`` and the argument
    for a shape, dtype or device mismatch.
    """
    require_tensor(OP, "a", a)
    require_tensor(OP, "b", b)
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        return _VectorAdd.apply(a, b)
    return torch.ops.opforge.vector_add.default(a, b)


class _VectorAdd(torch.autograd.Function):
    """opforge.vector_add under torch.func transforms and forward-mode AD, which the op's C++
    autograd kernel (csrc/vector_add/vector_add_autograd.cpp) cannot serve: both inputs receive
    the incoming gradient; the tangent is the sum of the tangents."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.opforge.vector_add.default(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad

    @staticmethod
    def jvp(ctx, da, db):
        if da is None or db is None:
            return da if db is None else db
        return vector_add(da, db)


@torch.library.register_vmap("opforge::vector_add")
def _(info, in_dims, a, b):
    """vmap: elementwise, so both operands with the mapped dimension first (an unmapped one
    broadcast along it with stride 0, which the kernels read)."""
    a_dim, b_dim = in_dims
    size = info.batch_size
    a = a.movedim(a_dim, 0) if a_dim is not None else a.unsqueeze(0).expand(size, *a.shape)
    b = b.movedim(b_dim, 0) if b_dim is not None else b.unsqueeze(0).expand(size, *b.shape)
    return torch.ops.opforge.vector_add.default(a, b), 0


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    """check_vector_add_inputs (csrc/vector_add/vector_add.cpp), for fake tensors."""
    check_dtype_in(OP, "a", a, SUPPORTED_DTYPES)
    check_same_dtype(OP, "b", b, "a", a)
    check_same_device(OP, "b", b, "a", a)
    check_same_shape(OP, "b", b, "a", a)


@torch.library.register_fake("opforge::vector_add")
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    # The kernel's rule: empty_like(a) (a's layout when a is dense, else dense in a's stride order).
    return torch.empty_like(a)


# Autograd is registered in C++ (csrc/vector_add/vector_add_autograd.cpp), so LibTorch users get it
# too and Python calls pay no Python-level autograd layer; under torch.func, vector_add() above
# takes _VectorAdd instead.
