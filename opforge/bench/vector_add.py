"""Benchmark spec for opforge.vector_add: against torch.add and the float64 reference."""

from __future__ import annotations

from collections.abc import Iterator

import torch

import opforge
from opforge import reference
from opforge.bench.harness import Case, Spec

_DTYPE_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _size_name(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def _case(a: torch.Tensor, b: torch.Tensor, name: str) -> Case:
    def check() -> str | None:
        got, want = opforge.vector_add(a, b), reference.vector_add(a, b)
        if not torch.equal(got, want):
            bad = (got != want).sum().item()
            return f"{bad} of {want.numel()} elements differ from the reference"
        return None

    return Case(
        op="vector_add",
        name=name,
        impls={
            "opforge": lambda: opforge.vector_add(a, b),
            "torch.add": lambda: torch.add(a, b),
            "reference (fp64)": lambda: reference.vector_add(a, b),
        },
        check=check,
        bytes=3 * a.numel() * a.element_size(),
        params={"numel": a.numel(), "dtype": str(a.dtype), "layout": name.split()[-1]},
    )


def cases(device: torch.device, full: bool) -> Iterator[Case]:
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
    for dtype in dtypes:
        for n in sizes:
            if not full and dtype != torch.float32 and n != sizes[-1]:
                continue
            a = torch.randn(n, device=device, dtype=dtype)
            b = torch.randn(n, device=device, dtype=dtype)
            yield _case(a, b, f"{_DTYPE_NAMES[dtype]} n={_size_name(n)} contiguous")
    if full:
        # One operand transposed: the strided kernel.
        a = torch.randn(side, side, device=device).t()
        b = torch.randn(side, side, device=device)
        yield _case(a, b, f"fp32 n={_size_name(side * side)} transposed")
        # Offset by one element: dense but not 16-byte aligned.
        n = sizes[-1]
        a = torch.randn(n + 1, device=device)[1:]
        b = torch.randn(n + 1, device=device)[1:]
        yield _case(a, b, f"fp32 n={_size_name(n)} unaligned")


SPEC = Spec(op="vector_add", cases=cases)
