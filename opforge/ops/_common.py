"""Helpers shared by the op wrappers: argument checks for Python values, and the checks of
csrc/common/checks.h repeated word for word for fake tensors (torch.compile, meta), so that an
error reads the same whether the real kernel or the fake one raised it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad


def require_tensor(op: str, arg: str, value: Any) -> torch.Tensor:
    """Raise a TypeError naming the op and argument when ``value`` is not a tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' rather than 'torch.float32': the names of checks.h's dtype_str."""
    return str(dtype).removeprefix("torch.")


def check_dtype_in(op: str, arg: str, t: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise RuntimeError(f"{op}: {arg} must be one of ({names}), got {dtype_name(t.dtype)}")


def check_same_dtype(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise RuntimeError(
            f"{op}: {arg} must have the same dtype as {ref_arg} ({dtype_name(ref.dtype)}), got {dtype_name(t.dtype)}"
        )


def check_same_device(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise RuntimeError(
            f"{op}: {arg} must be on the same device as {ref_arg} ({ref.device}), got {t.device}"
        )


def check_same_shape(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    if t.shape != ref.shape:
        raise RuntimeError(
            f"{op}: {arg} must have the same shape as {ref_arg} {list(ref.shape)}, got {list(t.shape)}"
        )


def transforms_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jvp, ...) or forward-mode AD is active: the ops'
    C++ autograd kernels cannot serve those (PyTorch refuses C++ autograd Functions there), so the
    wrappers then go through a Python autograd.Function. Plain calls and torch.compile take the
    op directly."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._functorch.peek_interpreter_stack() is not None or _fwad._current_level >= 0


def has_internal_overlap(t: torch.Tensor) -> bool:
    """at::has_internal_overlap(t) == MemOverlap::Yes: a dimension of stride 0 holds more than one
    element (an expanded view). Strides and sizes only, so fake and meta tensors answer too."""
    return any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape, strict=True))
