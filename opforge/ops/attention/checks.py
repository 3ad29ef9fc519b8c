"""Argument checks of opforge.attention and opforge.attention_varlen, and the schema's pattern
arguments built from the keywords. The registered ops check again in C++ (csrc/attention/
attention.cpp) with the same words; these run first so that a Python value of the wrong kind is
named before it reaches the dispatcher.

Exceptions follow PyTorch's convention (docs/adding-an-op.md): TypeError for an argument of the wrong
Python type, ValueError for an argument whose value is out of range (tensor contents included: offsets,
page table entries), RuntimeError for tensors whose dtypes, shapes, devices or layouts do not fit (as
PyTorch's own ops raise), NotImplementedError for what is not supported."""

from __future__ import annotations

import math
import numbers

import torch

from opforge.masks import BlockMask, prefix_means_causal, split_segments
from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    dtype_name,
    require_tensor,
)

OP = "opforge.attention"
VARLEN_OP = "opforge.attention_varlen"
BACKWARD_OP = "opforge.attention_backward"
# Window sides and prefixes beyond any sequence length mean "unbounded"; larger values are clamped
# (the kernels clamp further, to Sq + Sk), so that the schema's int64 holds them.
REACH = 2**62
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# The largest scale magnitude for float16, bfloat16 and float32 inputs without a softcap: the kernels
# multiply scores by scale * log2(e) in float32, which stays finite for |q.k| up to 2^63 with it (a
# larger factor turns ordinary scores into inf and rows into NaN; a softcap bounds the scores, and its
# own checks keep scale / softcap finite). csrc/attention/attention_checks.cpp checks the same bound.
MAX_SCALE = 2.0**64


def check_options(op: str, variant, deterministic) -> None:
    if not isinstance(variant, str):
        raise TypeError(f"{op}: variant must be a str, got {type(variant).__name__}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"{op}: deterministic must be a bool or None, got {type(deterministic).__name__}")


def scale_arg(op: str, q: torch.Tensor, scale):
    """The scores' factor: 1 / sqrt(head_dim) by default, else a finite number (a Python number or,
    as torch.nn.functional.scaled_dot_product_attention accepts, a one-element tensor, read on the
    host)."""
    if scale is None:
        # head_dim ** -0.5 keeps a symbolic size symbolic under torch.compile(dynamic=True)
        return q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype.is_complex or scale.dtype == torch.bool:
            raise TypeError(
                f"{op}: scale must be a number or a one-element real tensor, got a {dtype_name(scale.dtype)} "
                f"tensor of shape {list(scale.shape)}"
            )
        if torch.compiler.is_compiling():
            # (its value would be data the graph reads at run time, which a float argument cannot take)
            raise TypeError(f"{op}: under torch.compile, scale must be a Python number, not a tensor")
        scale = scale.item()
    if not isinstance(scale, (numbers.Real, torch.SymFloat)) or isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a number, got {type(scale).__name__}")
    # (abs(x) < inf: False for NaN too, and a symbolic value under torch.compile stays symbolic)
    if not abs(scale) < math.inf:
        raise ValueError(f"{op}: scale must be finite, got {scale!r}")
    if isinstance(scale, torch.SymFloat) or torch.compiler.is_compiling():
        return scale
    return float(scale)


def softcap_arg(op: str, softcap) -> float:
    """The softcap as the schema takes it (0: none)."""
    if softcap is None:
        return 0.0
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
        raise TypeError(f"{op}: softcap must be a number or None, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:
        raise ValueError(f"{op}: softcap must be a positive number (or None), got {softcap!r}")
    return float(softcap)


def scale_and_softcap(op: str, q: torch.Tensor, scale, softcap) -> tuple:
    """The schema's scale and softcap (scale_arg, softcap_arg), and the bound of float32 arithmetic
    (non-float64 inputs) on a scale without a softcap."""
    scale, softcap = scale_arg(op, q, scale), softcap_arg(op, softcap)
    if isinstance(scale, torch.SymFloat) or torch.compiler.is_compiling():
        return scale, softcap  # (the op checks the bound when it runs)
    if q.dtype != torch.float64 and not softcap and abs(scale) > MAX_SCALE:
        raise ValueError(
            f"{op}: scale = {scale!r} is too large for the float32 arithmetic the kernels use for "
            f"{dtype_name(q.dtype)} inputs without a softcap (scores times scale * log2(e) would "
            "overflow): magnitudes up to 2^64 (1.8e19) are accepted"
        )
    return scale, softcap


def window_args(op: str, window) -> tuple[int, int]:
    """window=(left, right) as the schema's window_left, window_right (-1: unbounded)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)):
        raise TypeError(f"{op}: window must be a pair (left, right) of ints or None, got {window!r}")
    if len(window) != 2:
        raise ValueError(f"{op}: window must be a pair (left, right) of ints or None, got {window!r}")
    sides = []
    for side in window:
        if side is None:
            sides.append(-1)
        elif not isinstance(side, numbers.Integral) or isinstance(side, bool):
            raise TypeError(f"{op}: window sides must be ints >= 0 or None, got {window!r}")
        elif side < 0:
            raise ValueError(f"{op}: window sides must be ints >= 0 or None, got {window!r}")
        else:
            sides.append(min(int(side), REACH))
    return sides[0], sides[1]


def check_counts(op: str, name: str, t, batch: int, q: torch.Tensor) -> None:
    """A (batch,) int32 / int64 tensor on q's device (kv_lens)."""
    require_tensor(op, name, t)
    if t.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{op}: {name} must be one of (int32, int64), got {dtype_name(t.dtype)}")
    if t.dim() != 1 or t.shape[0] != batch:
        raise RuntimeError(f"{op}: {name} must be (batch,) = ({batch},), got shape {list(t.shape)}")
    check_same_device(op, name, t, "q", q)


def check_kv_lens(q, kv_lens, segment_ids) -> None:
    check_counts(OP, "kv_lens", kv_lens, q.shape[0], q)
    if isinstance(segment_ids, torch.Tensor):
        raise ValueError(
            f"{OP}: with kv_lens, segment_ids must be a pair (q_segments, kv_segments): one (batch, keys) "
            "tensor gives the queries the ids of the last Sq keys, which kv_lens moves"
        )


def check_paged(q, k_cache, v_cache, block_table, kv_lens) -> None:
    """The checks of block_table, kv_lens and the paged caches (on the CPU: every table entry a
    sequence needs names a page)."""
    require_tensor(OP, "block_table", block_table)
    if q.dim() != 4:
        raise RuntimeError(f"{OP}: q must be 4-D (batch, heads, sequence, head_dim), got {q.dim()}-D")
    if kv_lens is None:
        raise ValueError(f"{OP}: block_table needs kv_lens (each sequence's key count in its pages)")
    check_kv_lens(q, kv_lens, None)
    if block_table.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(
            f"{OP}: block_table must be one of (int32, int64), got {dtype_name(block_table.dtype)}"
        )
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0] or block_table.shape[1] < 1:
        raise RuntimeError(
            f"{OP}: block_table must be (batch, max_pages) = ({q.shape[0]}, >= 1), got shape "
            f"{list(block_table.shape)}"
        )
    check_same_device(OP, "block_table", block_table, "q", q)
    for name, t in (("k", k_cache), ("v", v_cache)):
        check_same_device(OP, name, t, "q", q)
        if t.dim() != 4:
            raise RuntimeError(
                f"{OP}: with block_table, {name} must be a paged cache (num_pages, page_size, kv_heads, "
                f"head_dim), got {t.dim()}-D"
            )
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise RuntimeError(
            f"{OP}: the k and v caches must have the same (num_pages, page_size, kv_heads) sizes, got "
            f"{list(k_cache.shape)} and {list(v_cache.shape)}"
        )
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    if pages < 1 or page_size < 1:
        raise RuntimeError(f"{OP}: the paged caches have no pages, shape {list(k_cache.shape)}")
    max_pages = block_table.shape[1]
    if max_pages * page_size >= 2**31:
        raise RuntimeError(
            f"{OP}: a sequence's pages address at most 2^31 - 1 keys, got block_table's {max_pages} pages x "
            f"page_size {page_size}"
        )
    # (the entries a sequence needs: checked by the CPU op itself, clamped by the device kernels)


def pattern_args(q, k, causal, window, prefix_len, segment_ids, mask) -> tuple:
    """(q and k 4-D.) The schema's pattern arguments: causal, window_left, window_right, prefix_len,
    q_segments, kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k."""
    if not isinstance(causal, bool):
        raise TypeError(f"{OP}: causal must be a bool, got {type(causal).__name__}")
    left, right = window_args(OP, window)
    prefix = 0
    if prefix_len is not None:
        if not isinstance(prefix_len, numbers.Integral) or isinstance(prefix_len, bool):
            raise TypeError(f"{OP}: prefix_len must be an int or None, got {type(prefix_len).__name__}")
        if prefix_len < 0:
            raise ValueError(f"{OP}: prefix_len must be an int >= 0, got {prefix_len!r}")
        prefix = min(int(prefix_len), REACH)
    causal = prefix_means_causal(causal, window, prefix_len)  # (a prefix alone, even 0: prefix-LM)
    q_seg = kv_seg = None
    if segment_ids is not None:
        sq, sk = q.shape[2], k.shape[2]
        if isinstance(segment_ids, torch.Tensor) and (
            segment_ids.dim() != 2 or segment_ids.shape[1] != sk or segment_ids.shape[0] != k.shape[0]
        ):
            raise RuntimeError(
                f"{OP}: segment_ids must be (batch, keys) = ({k.shape[0]}, {sk}) or a pair (q_segments, "
                f"kv_segments), got a tensor of shape {list(segment_ids.shape)}"
            )
        if isinstance(segment_ids, torch.Tensor) and sq > sk:
            raise RuntimeError(
                f"{OP}: one segment_ids tensor (batch, keys) gives the queries the ids of the last Sq keys, "
                f"which needs Sq <= Sk (got {sq} > {sk}): pass a pair (q_segments, kv_segments)"
            )
        q_seg, kv_seg = split_segments(segment_ids, sq, sk)
        for t in (q_seg, kv_seg):
            require_tensor(OP, "segment_ids", t)
            if t.dtype not in (torch.int32, torch.int64):
                raise RuntimeError(
                    f"{OP}: segment_ids must be one of (int32, int64), got {dtype_name(t.dtype)}"
                )
    kinds = index = bits = None
    block_q = block_k = 128
    if mask is not None:
        if not isinstance(mask, BlockMask):
            raise TypeError(
                f"{OP}: mask must be an opforge.BlockMask (opforge.block_mask), got {type(mask).__name__}"
            )
        B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        mb, mh, msq, msk = mask.shape
        if msq != sq or msk != sk or mb not in (1, B) or mh not in (1, H):
            raise RuntimeError(
                f"{OP}: the mask was made for (B, H, Sq, Sk) = {mask.shape}, this call has "
                f"({B}, {H}, {sq}, {sk}) (B and H may be 1)"
            )
        kinds, index, bits = mask.tensors_on(q.device)  # (a mask built elsewhere: moved once, kept)
        block_q, block_k = mask.block_size
    return (causal, left, right, prefix, q_seg, kv_seg, kinds, index, bits, block_q, block_k)


def check_ranks(op: str, q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise RuntimeError(
                f"{op}: {name} must be 4-D (batch, heads, sequence, head_dim), got {t.dim()}-D"
            )


def check_qkv(op: str, q, k, v) -> None:
    """What the kernels need of q, k and v (B, H, S, D) together (also the fake kernels' check)."""
    check_ranks(op, q, k, v)
    check_operands(op, q, k, v, batch=True)


def check_operands(op: str, q, k, v, batch: bool, layout: str = "", fp8: bool = False) -> None:
    """q, k, v of one dtype and device, k and v of one shape but for the head dim (v's may differ:
    DeepSeek's 192 / 128), q's head dim k's, q's heads (dim 1) a multiple of k's, and with `batch` one
    batch size (dim 0). layout: k's dims as the caller names them, for the message. fp8: FP8
    attention's operands (float8_e4m3fn) instead of the float types."""
    check_dtype_in(op, "q", q, (torch.float8_e4m3fn,) if fp8 else DTYPES)
    check_same_dtype(op, "k", k, "q", q)
    check_same_dtype(op, "v", v, "q", q)
    check_same_device(op, "k", k, "q", q)
    check_same_device(op, "v", v, "q", q)
    if k.shape[:-1] != v.shape[:-1]:
        raise RuntimeError(
            f"{op}: k and v must have the same shape{layout} but for the head dim, got {list(k.shape)} and "
            f"{list(v.shape)}"
        )
    if batch and q.shape[0] != k.shape[0]:
        raise RuntimeError(f"{op}: q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise RuntimeError(f"{op}: q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise RuntimeError(
            f"{op}: q's heads must be a multiple of k's and v's heads (grouped-query attention), "
            f"got {q.shape[1]} and {k.shape[1]}"
        )


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, fp8=False) -> None:
    """attention_varlen's arguments in its own terms ((total, H, D) tensors, the offsets), before
    they become the registered op's batch of one."""
    for name, t in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
    ):
        require_tensor(VARLEN_OP, name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise RuntimeError(
                f"{VARLEN_OP}: {name} must be 3-D (total tokens, heads, head_dim), got {t.dim()}-D"
            )
    check_operands(VARLEN_OP, q, k, v, batch=False, layout=" (total_k, kv_heads, head_dim)", fp8=fp8)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype not in (torch.int32, torch.int64):
            raise RuntimeError(
                f"{VARLEN_OP}: {name} must be one of (int32, int64), got {dtype_name(t.dtype)}"
            )
        if t.dim() != 1 or t.shape[0] < 1:
            raise RuntimeError(
                f"{VARLEN_OP}: {name} must be 1-D (number of sequences + 1,), got shape {list(t.shape)}"
            )
        check_same_device(VARLEN_OP, name, t, "q", q)
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise RuntimeError(
            f"{VARLEN_OP}: cu_seqlens_q and cu_seqlens_k must have the same length (sequences + 1), "
            f"got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if n is None:
            continue
        if not isinstance(n, (numbers.Integral, torch.SymInt)) or isinstance(n, bool):
            raise TypeError(f"{VARLEN_OP}: {name} must be an int or None, got {type(n).__name__}")
        if n < 0:
            raise ValueError(f"{VARLEN_OP}: {name} must be >= 0, got {n}")
    if not isinstance(causal, bool):
        raise TypeError(f"{VARLEN_OP}: causal must be a bool, got {type(causal).__name__}")


def lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def empty_like_output(
    t: torch.Tensor, varlen: bool = False, head_dim: int | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A new tensor of t's shape (its last dim head_dim when given: the output takes v's; dtype when
    given: the FP8 forward's bfloat16) laid out as the kernels lay out their outputs
    (empty_attention_like in csrc/attention/attention.cpp): (B, S, H, D) underneath where t is such a
    view, and always for packed sequences (the (total, H, D) output contiguous)."""
    d = t.shape[3] if head_dim is None else head_dim
    dtype = t.dtype if dtype is None else dtype
    if varlen or (t.stride(1) < t.stride(2) and t.shape[1] > 1 and t.shape[2] > 1):
        return t.new_empty((t.shape[0], t.shape[2], t.shape[1], d), dtype=dtype).transpose(1, 2)
    return t.new_empty((*t.shape[:3], d), dtype=dtype)
