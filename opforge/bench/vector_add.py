"""Benchmark spec for opforge.vector_add: against torch.add and the float64 reference."""

from __future__ import annotations

import math
from functools import partial

import torch

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec

_DTYPE_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _size_name(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def _case(device: torch.device, dtype: torch.dtype, n: int, layout: str) -> Case:
    """Allocate one case's inputs: called by the harness just before the case runs."""
    if layout == "transposed":  # one operand transposed: the strided kernel
        side = math.isqrt(n)
        a = torch.randn(side, side, device=device, dtype=dtype).t()
        b = torch.randn(side, side, device=device, dtype=dtype)
    elif layout == "unaligned":  # offset by one element: dense but not 16-byte aligned
        a = torch.randn(n + 1, device=device, dtype=dtype)[1:]
        b = torch.randn(n + 1, device=device, dtype=dtype)[1:]
    else:
        a = torch.randn(n, device=device, dtype=dtype)
        b = torch.randn(n, device=device, dtype=dtype)

    def check() -> str | None:
        got, want = opforge.vector_add(a, b), reference.vector_add(a, b)
        if not torch.equal(got, want):
            bad = (got != want).sum().item()
            return f"{bad} of {want.numel()} elements differ from the reference"
        return None

    return Case(
        op="vector_add",
        name=f"{_DTYPE_NAMES[dtype]} n={_size_name(n)} {layout}",
        impls={
            "opforge": lambda: opforge.vector_add(a, b),
            "torch.add": lambda: torch.add(a, b),
            "reference (fp64)": lambda: reference.vector_add(a, b),
        },
        check=check,
        bytes=3 * a.numel() * a.element_size(),
        params={"numel": a.numel(), "dtype": str(a.dtype), "layout": layout},
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if device.type == "cuda":
        sizes = [1 << 20, 1 << 24, 1 << 26, 1 << 28] if full else [1 << 20, 1 << 26]
        dtypes = (
            [torch.float32, torch.bfloat16, torch.float16, torch.float64]
            if full
            else [torch.float32, torch.bfloat16]
        )
        side = 8192
    else:
        sizes = [1 << 16, 1 << 20, 1 << 24] if full else [1 << 20, 1 << 24]
        dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64] if full else [torch.float32]
        side = 4096
    builders: list[CaseBuilder] = [
        partial(_case, device, dtype, n, "contiguous")
        for dtype in dtypes
        for n in sizes
        if full or dtype == torch.float32 or n == sizes[-1]
    ]
    if full:
        builders.append(partial(_case, device, torch.float32, side * side, "transposed"))
        builders.append(partial(_case, device, torch.float32, sizes[-1], "unaligned"))
    return builders


SPEC = Spec(op="vector_add", cases=cases, about="opforge.vector_add vs torch.add and the float64 reference")
