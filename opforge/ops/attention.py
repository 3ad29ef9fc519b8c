"""opforge.attention: fused attention with custom patterns (causal, sliding window, prefix-LM,
packed documents, any block mask), forward and backward, grouped-query attention natively."""

from __future__ import annotations

import math
import numbers

import torch

from opforge.masks import BlockMask, block_mask, split_segments
from opforge.ops._common import check_dtype_in, check_same_device, check_same_dtype, require_tensor

OP = "opforge.attention"
# Window sides and prefixes beyond any sequence length mean "unbounded"; larger values are clamped
# (the kernels clamp further, to Sq + Sk), so that the schema's int64 holds them.
_REACH = 2**62
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    prefix_len: int | None = None,
    segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    mask: BlockMask | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    kv_lens: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale, masked by the pattern) v, without an Sq x Sk matrix in memory.

    Args:
        q: (B, Hq, Sq, D); k, v: (B, Hkv, Sk, D) with Hq a multiple of Hkv (grouped-query attention:
            query head h reads kv head h // (Hq / Hkv), no copy). The SDPA layout; views such as
            ``x.transpose(1, 2)`` of (B, S, H, D) tensors are read in place. float16, bfloat16,
            float32 or float64.
        causal: key j visible to query i when j <= i + Sk - Sq (queries aligned to the end of the
            keys, as FlashAttention does).
        window: (left, right): keys within ``left`` before and ``right`` after the query's position
            (None: unbounded). ``window=(W - 1, 0)`` with causal is the Mistral sliding window.
        prefix_len: the first ``prefix_len`` keys are visible to every query (prefix-LM: with causal,
            bidirectional over the prefix and causal after it).
        segment_ids: (B, Sk) ids (the queries take those of the last Sq positions) or a pair
            (q_segments (B, Sq), kv_segments (B, Sk)): tokens see only their own segment (packed
            documents). Combines with the rest.
        mask: a `BlockMask` (`opforge.block_mask(fn, B, H, Sq, Sk)` or `BlockMask.from_dense`) made
            for this B (or 1), Hq (or 1), Sq and Sk: any pattern; combines with the rest.
        scale: the scores' factor (default 1 / sqrt(D)).
        softcap: scores become ``softcap * tanh(s / softcap)`` (Gemma 2), after the scale.
        kv_lens: per-sequence key counts for batched decoding against a preallocated cache, a (B,)
            int32 / int64 tensor on q's device: sequence b has the keys ``k[b, :, :kv_lens[b]]`` (the
            rest is ignored) and its Sq queries are its last positions (query i at key position
            ``kv_lens[b] - Sq + i``: causal and windows count from there). Counts are read on the
            device only (clamped to [0, Sk]), so a CUDA graph replays the call after the counts are
            updated in place. Decoding calls (Sq x the GQA group <= 32; 64 at CUDA head dims 65-128)
            without gradients run the decode kernel; others (and gradients) build the exact block
            mask first, which reads the counts on the host. segment_ids must then be a pair.
        return_lse: also return the log-sum-exp of each query's scores, (B, Hq, Sq) float32
            (float64 for float64 inputs).

    Returns the output (B, Hq, Sq, D) in q's dtype (laid out like q: (B, S, H, D) underneath when q
    is such a view), and the LSE when asked. A query that sees no key gets zeros and an LSE of -inf.
    Differentiable in q, k and v (the backward is opforge.attention_backward, deterministic).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(OP, name, t)
    _check_ranks(OP, q, k, v)  # (the pattern arguments read the sizes)
    if kv_lens is not None:
        _check_kv_lens(q, kv_lens, segment_ids)
    args = _pattern_args(q, k, causal, window, prefix_len, segment_ids, mask)
    if kv_lens is not None and not _decodes(q, k, v):
        (args, k, v), kv_lens = _kv_lens_as_mask(q, k, v, kv_lens, args, mask), None
    if scale is None:
        # head_dim ** -0.5 keeps a symbolic size symbolic under torch.compile(dynamic=True)
        scale = q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    # (abs(x) < inf: False for NaN too, and a symbolic value under torch.compile stays symbolic)
    elif (
        not isinstance(scale, (numbers.Real, torch.SymFloat))
        or isinstance(scale, bool)
        or not abs(scale) < math.inf
    ):
        raise ValueError(f"{OP}: scale must be a finite number, got {scale!r}")
    elif not torch.compiler.is_compiling() and not isinstance(scale, torch.SymFloat):
        scale = float(scale)
    if softcap is None:
        softcap = 0.0
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool) or not 0 <= softcap < math.inf:
        raise ValueError(f"{OP}: softcap must be a positive number (or None), got {softcap!r}")
    if kv_lens is None:
        out, lse = torch.ops.opforge.attention.default(q, k, v, scale, float(softcap), *args)
    else:
        out, lse = torch.ops.opforge.attention.default(q, k, v, scale, float(softcap), *args, kv_lens)
    return (out, lse) if return_lse else out


def _check_kv_lens(q, kv_lens, segment_ids) -> None:
    require_tensor(OP, "kv_lens", kv_lens)
    if kv_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{OP}: kv_lens must be int32 or int64, got {str(kv_lens.dtype).removeprefix('torch.')}"
        )
    if kv_lens.dim() != 1 or kv_lens.shape[0] != q.shape[0]:
        raise ValueError(f"{OP}: kv_lens must be (batch,) = ({q.shape[0]},), got shape {list(kv_lens.shape)}")
    check_same_device(OP, "kv_lens", kv_lens, "q", q)
    if isinstance(segment_ids, torch.Tensor):
        raise ValueError(
            f"{OP}: with kv_lens, segment_ids must be a pair (q_segments, kv_segments): one (batch, keys) "
            "tensor gives the queries the ids of the last Sq keys, which kv_lens moves"
        )


def _decodes(q, k, v) -> bool:
    """Whether the decode kernel takes this call with per-sequence key counts (csrc: use_decode,
    decode_max_rows): no gradient to record and at most 32 query rows a kv head (64 at CUDA head
    dims 65-128)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    rows = q.shape[2] * (q.shape[1] // max(k.shape[1], 1))
    d = q.shape[3]
    return rows <= (64 if q.is_cuda and 64 < d <= 128 else 32)


def _kv_lens_as_mask(q, k, v, kv_lens, args, mask):
    """The pattern arguments with the per-sequence key counts, the band and prefix and any block mask
    folded into one exact block mask (the segments stay as they are), and k, v with the slots past
    each count zeroed (a preallocated cache may hold anything there; masked keys still meet P V)."""
    causal, left, right, prefix, q_seg, kv_seg = args[:6]
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    n = kv_lens.to(torch.int64).clamp(0, sk)
    written = (torch.arange(sk, device=k.device)[None, :] < n[:, None])[:, None, :, None]
    k, v = k.where(written, 0), v.where(written, 0)
    dense = mask.to_dense() if mask is not None else None
    if causal:
        right = 0

    def fn(b, h, qi, kj):
        count = n[b]
        pos = qi + count - sq
        band = torch.ones_like(kj, dtype=torch.bool)
        if right >= 0:
            band = band & (kj <= pos + right)
        if left >= 0:
            band = band & (kj >= pos - left)
        if prefix:
            band = band | (kj < prefix)
        seen = (kj < count) & band
        if dense is not None:
            seen = seen & dense[b % dense.shape[0], h % dense.shape[1], qi, kj]
        return seen

    heads = H if dense is not None and dense.shape[1] > 1 else None
    block = mask.block_size if mask is not None else 128
    m = block_mask(fn, B, heads, sq, sk, block_size=block, device=q.device)
    return (False, -1, -1, 0, q_seg, kv_seg, m.kinds, m.index, m.bits, *m.block_size), k, v


def _pattern_args(q, k, causal, window, prefix_len, segment_ids, mask) -> tuple:
    """(q and k 4-D.) The schema's pattern arguments: causal, window_left, window_right, prefix_len, q_segments,
    kv_segments, mask_kinds, mask_index, mask_bits, block_q, block_k."""
    if not isinstance(causal, bool):
        raise TypeError(f"{OP}: causal must be a bool, got {type(causal).__name__}")
    left = right = -1
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"{OP}: window must be a pair (left, right) of ints or None, got {window!r}")
        sides = []
        for side in window:
            if side is None:
                sides.append(-1)
            elif isinstance(side, numbers.Integral) and not isinstance(side, bool) and side >= 0:
                sides.append(min(int(side), _REACH))
            else:
                raise ValueError(f"{OP}: window sides must be ints >= 0 or None, got {window!r}")
        left, right = sides
    prefix = 0
    if prefix_len is not None:
        if not isinstance(prefix_len, numbers.Integral) or isinstance(prefix_len, bool) or prefix_len < 0:
            raise ValueError(f"{OP}: prefix_len must be an int >= 0, got {prefix_len!r}")
        prefix = min(int(prefix_len), _REACH)
    q_seg = kv_seg = None
    if segment_ids is not None:
        sq, sk = q.shape[2], k.shape[2]
        if isinstance(segment_ids, torch.Tensor) and (
            segment_ids.dim() != 2 or segment_ids.shape[1] != sk or segment_ids.shape[0] != k.shape[0]
        ):
            raise ValueError(
                f"{OP}: segment_ids must be (batch, keys) = ({k.shape[0]}, {sk}) or a pair (q_segments, "
                f"kv_segments), got a tensor of shape {list(segment_ids.shape)}"
            )
        if isinstance(segment_ids, torch.Tensor) and sq > sk:
            raise ValueError(
                f"{OP}: one segment_ids tensor (batch, keys) gives the queries the ids of the last Sq keys, "
                f"which needs Sq <= Sk (got {sq} > {sk}): pass a pair (q_segments, kv_segments)"
            )
        q_seg, kv_seg = split_segments(segment_ids, sq, sk)
        for t in (q_seg, kv_seg):
            require_tensor(OP, "segment_ids", t)
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(
                    f"{OP}: segment_ids must be int32 or int64, got {str(t.dtype).removeprefix('torch.')}"
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
            raise ValueError(
                f"{OP}: the mask was made for (B, H, Sq, Sk) = {mask.shape}, this call has "
                f"({B}, {H}, {sq}, {sk}) (B and H may be 1)"
            )
        kinds, index, bits = mask.kinds, mask.index, mask.bits
        block_q, block_k = mask.block_size
    return (causal, left, right, prefix, q_seg, kv_seg, kinds, index, bits, block_q, block_k)


def _like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor of t's shape laid out as the kernels lay out their outputs (empty_attention_like)."""
    if t.stride(1) < t.stride(2) and t.shape[1] > 1 and t.shape[2] > 1:
        return t.new_empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3])).transpose(1, 2)
    return t.new_empty(t.shape)


def _check_ranks(op: str, q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D (batch, heads, sequence, head_dim), got {t.dim()}-D")


def _check_qkv(op: str, q, k, v) -> None:
    _check_ranks(op, q, k, v)
    check_dtype_in(op, "q", q, DTYPES)
    check_same_dtype(op, "k", k, "q", q)
    check_same_dtype(op, "v", v, "q", q)
    check_same_device(op, "k", k, "q", q)
    check_same_device(op, "v", v, "q", q)
    if k.shape != v.shape:
        raise ValueError(f"{op}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{op}: q and k must have the same head_dim, got {q.shape[3]} and {k.shape[3]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"{op}: q's heads must be a multiple of k's and v's heads (grouped-query attention), "
            f"got {q.shape[1]} and {k.shape[1]}"
        )


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@torch.library.register_fake("opforge::attention")
def _(q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, *rest):
    _check_qkv(OP, q, k, v)
    return _like(q), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


@torch.library.register_fake("opforge::attention_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, *rest):
    _check_qkv("opforge.attention_backward", q, k, v)
    return _like(q), _like(k), _like(v)


_PATTERN_ARGS = 11  # causal .. block_k: what the backward takes (kv_lens, the forward's last, it does not)


def _setup_context(ctx, inputs, output):
    q, k, v, scale, softcap, *pattern = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, pattern[:_PATTERN_ARGS]
    ctx.kv_lens = len(pattern) > _PATTERN_ARGS and pattern[_PATTERN_ARGS] is not None
    ctx.inputs = len(inputs)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    if ctx.kv_lens:
        raise NotImplementedError(
            "opforge.attention_backward: no gradient through kv_lens' decode kernel; call opforge.attention, "
            "which builds the exact block mask when q, k or v require grad"
        )
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.opforge.attention_backward.default(
        grad_out, q, k, v, out, lse, grad_lse, ctx.scale, ctx.softcap, *ctx.pattern
    )
    return (dq, dk, dv) + (None,) * (ctx.inputs - 3)


torch.library.register_autograd("opforge::attention", _backward, setup_context=_setup_context)


__all__ = ["attention"]
