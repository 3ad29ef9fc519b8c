"""Helpers shared by the op wrappers."""

from __future__ import annotations

from typing import Any

import torch


def require_tensor(op: str, arg: str, value: Any) -> torch.Tensor:
    """Raise a TypeError naming the op and argument when ``value`` is not a tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    return value
