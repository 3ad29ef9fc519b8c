"""Benchmark spec for opforge.matmul: the ladder of variants against cuBLAS (torch.matmul), and
the CPU GEMM against torch.matmul (oneDNN/MKL), in the same run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

import opforge
from opforge.bench.harness import Case, Spec

_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
_EPS = {torch.float32: 2**-23, torch.float64: 2**-52, torch.float16: 2**-10, torch.bfloat16: 2**-7}


def _case(device, dtype, m: int, k: int, n: int, variant: str, baseline: str) -> Case:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)

    def check() -> str | None:
        got = opforge.matmul(a, b, variant=variant).double()
        want = torch.matmul(a.double(), b.double())
        scale = torch.matmul(a.double().abs(), b.double().abs()).clamp(min=1e-30)
        err = ((got - want).abs() / scale).max().item()
        limit = 2 * _EPS[dtype] if dtype in (torch.float16, torch.bfloat16) else 4 * _EPS[dtype] * k**0.5
        return None if err <= limit else f"relative error {err:.3g} > {limit:.3g}"

    shape = f"{m}^3" if m == k == n else f"{m}x{k}x{n}"
    return Case(
        op="matmul",
        name=f"{_NAMES[dtype]} {shape} {variant}",
        impls={
            "opforge": lambda: opforge.matmul(a, b, variant=variant),
            baseline: lambda: torch.matmul(a, b),
        },
        check=check,
        flops=2 * m * n * k,
        params={"m": m, "k": k, "n": n, "dtype": str(dtype), "variant": variant},
    )


def cases(device: torch.device, full: bool) -> Iterator[Case]:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 rungs against cuBLAS's true fp32
        shapes = (
            [(s, s, s) for s in (1024, 2048, 4096, 8192)] + [(8192, 1024, 8192)] if full else [(4096,) * 3]
        )
        skip = set(os.environ.get("OPFORGE_SKIP_VARIANTS", "").split(","))  # a variant known to fail here
        variants = [v for v in ("naive", "smem_tiled", "register_blocked", "warp_tiled") if v not in skip]
        for m, k, n in shapes:
            for variant in variants:
                yield _case(device, torch.float32, m, k, n, variant, "cuBLAS fp32 (torch.matmul)")
        half_variants = ["mma", "wgmma"] if torch.cuda.get_device_capability(device) == (9, 0) else ["mma"]
        half_variants = [v for v in half_variants if v not in skip]
        for dtype in (torch.bfloat16, torch.float16) if full else (torch.bfloat16,):
            for m, k, n in shapes:
                for variant in half_variants:
                    yield _case(device, dtype, m, k, n, variant, f"cuBLAS {_NAMES[dtype]} (torch.matmul)")
    else:
        sizes = [256, 512, 1024, 2048] if full else [1024]
        for s in sizes:
            yield _case(device, torch.float32, s, s, s, "auto", "torch.matmul")
        if full:
            yield _case(device, torch.float64, 512, 512, 512, "auto", "torch.matmul")
            yield _case(device, torch.bfloat16, 1024, 1024, 1024, "auto", "torch.matmul")
            yield _case(device, torch.float32, 4096, 256, 256, "auto", "torch.matmul")


SPEC = Spec(op="matmul", cases=cases)
