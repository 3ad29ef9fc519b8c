"""Benchmark spec for opforge.matmul: the ladder of variants against cuBLAS (torch.matmul), and
the CPU GEMM against torch.matmul (oneDNN/MKL), in the same run; its extra plot is the ladder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch

import opforge
from opforge.bench.harness import Case, CaseBuilder, Spec
from opforge.bench.ladder import write_ladder

_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
_EPS = {torch.float32: 2**-23, torch.float64: 2**-52, torch.float16: 2**-10, torch.bfloat16: 2**-7}


@contextlib.contextmanager
def tf32_off() -> Iterator[None]:
    """TF32 off (fp32 against cuBLAS's true fp32) inside, the caller's setting restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _case(device, dtype, m: int, k: int, n: int, variant: str, baseline: str) -> Case:
    """Allocate one case's inputs: called by the harness just before the case runs."""
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
        # Every fp32 case, the CPU's too (the flag does nothing there): one path, tested on the CPU.
        context=tf32_off if dtype == torch.float32 else None,
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    builders: list[CaseBuilder] = []
    if device.type == "cuda":
        shapes = (
            [(s, s, s) for s in (1024, 2048, 4096, 8192)] + [(8192, 1024, 8192)] if full else [(4096,) * 3]
        )
        # Every production kernel by name (the rungs' own names pick among them: docs/matmul.md).
        variants = ("naive", "smem_tiled", "register_blocked", "warp_tiled_staged", "warp_tiled_cp_async")
        for m, k, n in shapes:
            for variant in variants:
                builders.append(
                    partial(_case, device, torch.float32, m, k, n, variant, "cuBLAS fp32 (torch.matmul)")
                )
        half_variants = ["mma_cp_async"]
        if torch.cuda.get_device_capability(device) == (9, 0):
            half_variants += ["mma_tma", "mma_ws", "wgmma"]
        for dtype in (torch.bfloat16, torch.float16) if full else (torch.bfloat16,):
            for m, k, n in shapes:
                for variant in half_variants:
                    baseline = f"cuBLAS {_NAMES[dtype]} (torch.matmul)"
                    builders.append(partial(_case, device, dtype, m, k, n, variant, baseline))
    else:
        runs = [(torch.float32, s, s, s) for s in ((256, 512, 1024, 2048) if full else (1024,))]
        if full:
            runs += [(torch.float64, 512, 512, 512), (torch.bfloat16, 1024, 1024, 1024)]
            runs += [(torch.float32, 4096, 256, 256)]
        builders += [partial(_case, device, dt, m, k, n, "auto", "torch.matmul") for dt, m, k, n in runs]
    return builders


SPEC = Spec(
    op="matmul",
    cases=cases,
    plots=(write_ladder,),
    about="opforge.matmul vs torch.matmul (cuBLAS; oneDNN/MKL on the CPU); on CUDA every kernel (ladder.png)",
)
