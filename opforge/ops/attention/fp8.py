"""FP8 attention's inputs (FlashAttention-3's contract): q, k and v in float8_e4m3fn with optional
descale factors ``q_descale``, ``k_descale``, ``v_descale`` (batch, kv_heads) float32, the true values
being the stored ones times their descale (q's head h takes kv head h // group's factor); the output
bfloat16, the LSE float32. Forward only.

What computes it: on CUDA the Hopper FP8 kernel (opforge::attention_fp8: e4m3 tensor-core products,
V transposed in shared memory, P rounded to e4m3 with the row max offset by 8, FlashAttention-3's
design), head dims up to 128, every pattern but a block mask (mask=) and per-sequence key counts
(kv_lens, block_table); other GPUs and those calls raise a NotImplementedError rather than dequantize
into bf16 behind the user's back (slower than bf16 inputs, and not the FP8 tensor-core path a user
asks for). The CPU dequantizes into float32 (exact: an e4m3 value times a float32 factor rounds
once, as the kernels' own float32 products would) and runs the float32 kernels, every path."""

from __future__ import annotations

import torch

from opforge.ops._common import dtype_name

FP8 = torch.float8_e4m3fn
_NAMES = ("q_descale", "k_descale", "v_descale")


def is_fp8_call(q, k, v, descales) -> bool:
    """Whether any operand is FP8 or any descale factor is given."""
    return any(isinstance(t, torch.Tensor) and t.dtype == FP8 for t in (q, k, v)) or any(
        d is not None for d in descales
    )


def check_fp8(op: str, q, k, v, descales, batch: int, kv_heads: int) -> None:
    """q, k, v all float8_e4m3fn, not requiring grad, on a device that computes them; each descale
    None or a float32 (batch, kv_heads) tensor on q's device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != FP8:
            raise RuntimeError(
                f"{op}: FP8 attention (descale factors, or an FP8 operand) takes q, k and v all in float8_e4m3fn, "
                f"got {name} in {dtype_name(t.dtype)}"
            )
        if t.requires_grad:
            raise NotImplementedError(f"{op}: FP8 attention is forward only ({name} requires grad)")
    if q.device.type not in ("cpu", "cuda"):
        raise NotImplementedError(
            f"{op}: FP8 attention on {q.device.type} needs an FP8 kernel, which opforge does not have; "
            "the CPU and CUDA (Hopper) compute it (or pass bfloat16 inputs)"
        )
    for name, d in zip(_NAMES, descales, strict=True):
        if d is None:
            continue
        if not isinstance(d, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor or None, got {type(d).__name__}")
        if d.dtype != torch.float32 or tuple(d.shape) != (batch, kv_heads):
            raise RuntimeError(
                f"{op}: {name} must be float32 (batch, kv_heads) = ({batch}, {kv_heads}), got "
                f"{dtype_name(d.dtype)} {list(d.shape)}"
            )
        if d.device != q.device:
            raise RuntimeError(f"{op}: {name} must be on q's device ({q.device}), got {d.device}")


def check_fp8_cuda(op: str, kv_lens, block_table, mask, sinks) -> None:
    """What the CUDA FP8 kernel does not take: per-sequence key counts and paged caches, a block mask,
    sinks that record a gradient (FP8 attention is forward only)."""
    if kv_lens is not None or block_table is not None or mask is not None:
        raise NotImplementedError(
            f"{op}: FP8 attention on CUDA takes no kv_lens, block_table or mask= yet (the Hopper FP8 kernel's "
            "plain form); the CPU computes them"
        )
    if sinks is not None and sinks.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(f"{op}: FP8 attention is forward only (sinks require grad)")


def run_fp8_cuda(
    q, k, v, descales, scale, softcap, args, sinks, variant, cu_seqlens=(None, None), check_offsets=True
):
    """opforge::attention_fp8 on 4-D q, k, v (the schema's pattern arguments `args`): (out, lse)."""
    return torch.ops.opforge.attention_fp8.default(
        q,
        k,
        v,
        *descales,
        scale,
        softcap,
        *args,
        None,
        *cu_seqlens,
        sinks,
        variant=variant,
        check_offsets=check_offsets,
    )


def dequantize(t: torch.Tensor, descale, heads_dim: int, rows_of=None) -> torch.Tensor:
    """t in float32 times its (batch, kv_heads) descale: heads along `heads_dim` (q's heads map onto
    the kv heads by groups), the batch along dim 0, or for packed sequences each row's sequence
    (`rows_of`: the sequence of each row along dim 0)."""
    x = t.to(torch.float32)
    if descale is None:
        return x
    heads = t.shape[heads_dim]
    f = descale.repeat_interleave(heads // descale.shape[1], dim=1)  # (batch, heads)
    if rows_of is not None:
        f = f[rows_of]  # (rows, heads)
    shape = [1] * t.dim()
    shape[0], shape[heads_dim] = f.shape[0], heads
    return x * f.view(shape)
