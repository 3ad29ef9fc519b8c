"""opforge.attention: fused attention with custom patterns (causal, sliding window, prefix-LM,
packed documents, any block mask), forward and backward, grouped-query attention natively; and
opforge.attention_varlen: the same over variable-length sequences packed without padding
(FlashAttention's cu_seqlens layout)."""

from __future__ import annotations

import math
import numbers

import torch

from opforge import reference
from opforge.masks import (
    BlockMask,
    attention_mask,
    block_mask,
    prefix_means_causal,
    split_segments,
    varlen_mask,
)
from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    dtype_name,
    require_tensor,
    transforms_active,
)

OP = "opforge.attention"
VARLEN_OP = "opforge.attention_varlen"
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
    variant: str = "auto",
    deterministic: bool | None = None,
    block_table: torch.Tensor | None = None,
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
        prefix_len: the first ``prefix_len`` keys are visible to every query. Alone (no causal, no
            window) it means prefix-LM: bidirectional over the prefix and causal after it, as with
            ``causal=True``; with a window it adds the prefix to the window's keys.
        segment_ids: (B, Sk) ids (the queries take those of the last Sq positions) or a pair
            (q_segments (B, Sq), kv_segments (B, Sk)): tokens see only their own segment (packed
            documents). Combines with the rest.
        mask: a `BlockMask` (`opforge.block_mask(fn, B, H, Sq, Sk)` or `BlockMask.from_dense`) made
            for this B (or 1), Hq (or 1), Sq and Sk: any pattern; combines with the rest. A mask
            built on another device (the CPU, without ``device=``) is copied to q's device at its
            first use there and the copy kept on the mask.
        scale: the scores' factor (default 1 / sqrt(D)).
        softcap: scores become ``softcap * tanh(s / softcap)`` (Gemma 2), after the scale.
        kv_lens: per-sequence key counts for batched decoding against a preallocated cache, a (B,)
            int32 / int64 tensor on q's device: sequence b has the keys ``k[b, :, :kv_lens[b]]`` (the
            rest is ignored) and its Sq queries are its last positions (query i at key position
            ``kv_lens[b] - Sq + i``: causal and windows count from there). Counts are read on the
            device only (clamped to [0, Sk]), so a CUDA graph replays the call after the counts are
            updated in place. Without gradients the kernels take the counts themselves: decoding
            calls (Sq x the GQA group <= 32 on the CPU; on CUDA 64, 32 at head dims above 128) the
            decode kernel, more query rows (a chunk of new tokens: chunked prefill) the Hopper (or
            mma.sync) forward on CUDA and the tiled kernel on the CPU. With gradients the exact
            block mask is built first, which reads the counts on the host. segment_ids must then be
            a pair.
        block_table: (B, max_pages) int32 / int64 on q's device, with kv_lens: k and v are then paged
            caches (num_pages, page_size, Hkv, D) (FlashAttention's ``flash_attn_with_kvcache`` and
            vLLM's layout; `paged_kv_append` writes new tokens into them) and sequence b's key j is
            ``k[block_table[b, j // page_size], j % page_size]``, for j < kv_lens[b] (at most
            max_pages x page_size < 2^31). Entries past a sequence's pages are not read. On the CPU
            an entry outside [0, num_pages) that a sequence needs raises a ValueError; on CUDA
            (where checking would synchronise), and under torch.compile on either device, it is
            clamped into range. Calls without segment_ids, a mask or gradients read the pages in
            place: on the CPU decoding calls (the decode kernel's), on CUDA decoding calls and
            chunks of new queries (the Hopper forward where the page size divides its key tile of
            128 rows (64 at head dim 256) or is a multiple of it, at least 8; else the mma.sync
            forward) with head dims 64 / 128 / 256 and cache rows at 16-byte boundaries. Others
            gather the pages they address into one (B, Hkv, max_pages x page_size, D) copy first
            (one more read and write of them).
        return_lse: also return the log-sum-exp of each query's scores, (B, Hq, Sq) float32
            (float64 for float64 inputs).
        variant: the kernel. ``"auto"`` (default) follows the rule of docs/attention.md: the decode
            kernel for few query rows (Sq x the GQA group) against many keys, else on the CPU the
            tiled kernel and on CUDA the Hopper one (TMA + wgmma; sm_90 GPUs, sm_90a builds) or the
            mma.sync one (sm_80+). A kernel can be named: ``"tiled"``, ``"decode"`` on the CPU;
            ``"decode"``, ``"hopper"``, ``"mma_sync"`` on CUDA; one that cannot serve the call
            raises a ValueError saying why. The backward runs on the same kind of kernel (the tiled
            one after ``"decode"``: decoding has no backward kernel).
        deterministic: the backward's. ``None`` (default) follows
            ``torch.are_deterministic_algorithms_enabled()`` when the backward runs, as PyTorch's own
            ops do; ``True`` / ``False`` override it. The CUDA Hopper backward adds each key block's
            share of dQ into a float32 workspace in whatever order the blocks finish (fast; dQ may
            differ in its last bits from run to run); deterministic mode orders those additions
            (slower). dK and dV, the forward, the CPU and the mma.sync kernels are always
            deterministic.

    Returns the output (B, Hq, Sq, D) in q's dtype (laid out like q: (B, S, H, D) underneath when q
    is such a view), and the LSE when asked. A query that sees no key gets zeros and an LSE of -inf.
    Differentiable in q, k and v (the backward is opforge.attention_backward), also
    under the torch.func transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and forward-mode AD (the
    tangent is computed densely, query rows in chunks); double backward (create_graph=True, e.g.
    gradgradcheck or a gradient penalty) recomputes the first backward densely in float32 (float64
    for float64 inputs), which takes memory for the (B, Hq, Sq, Sk) scores.

    ``scale`` and ``softcap`` must be numbers the kernels' float32 arithmetic holds (for float16,
    bfloat16 and float32 inputs): magnitudes from about 1.2e-38 to 3.4e38, or 0; a ValueError
    otherwise.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(OP, name, t)
    if block_table is not None:
        _check_paged(q, k, v, block_table, kv_lens)
        if _paged_in_place(q, k, v, block_table, segment_ids, mask, variant):
            _check_options(OP, variant, deterministic)
            causal, left, right, prefix = _pattern_args(q, k, causal, window, prefix_len, None, None)[:4]
            out, lse = torch.ops.opforge.attention_paged.default(
                q,
                k,
                v,
                kv_lens,
                block_table
                if block_table.dtype == torch.int32
                else block_table.clamp(0, k.shape[0] - 1).int(),
                _scale_arg(OP, q, scale),
                _softcap_arg(OP, softcap),
                causal,
                left,
                right,
                prefix,
                variant,
            )
            return (out, lse) if return_lse else out
        k, v = _paged_kv(k, v, block_table)
    _check_ranks(OP, q, k, v)  # (the pattern arguments read the sizes)
    if kv_lens is not None:
        _check_kv_lens(q, kv_lens, segment_ids)
    _check_options(OP, variant, deterministic)
    args = _pattern_args(q, k, causal, window, prefix_len, segment_ids, mask)
    if kv_lens is not None and _kv_lens_kernel(q, k, v, variant) is None:
        (args, k, v), kv_lens = _kv_lens_as_mask(q, k, v, kv_lens, args, mask), None
    scale, softcap = _scale_arg(OP, q, scale), _softcap_arg(OP, softcap)
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        out, lse = _Attention.apply(
            q, k, v, scale, softcap, variant, deterministic, None, None, *args, kv_lens
        )
    else:
        out, lse = torch.ops.opforge.attention.default(
            q,
            k,
            v,
            scale,
            softcap,
            *args,
            *(() if kv_lens is None else (kv_lens,)),
            variant=variant,
            deterministic=deterministic,
        )
    return (out, lse) if return_lse else out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    deterministic: bool | None = None,
    return_lse: bool = False,
    variant: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """opforge.attention over variable-length sequences packed one after another (FlashAttention's
    ``flash_attn_varlen_func`` layout), each attending to its own keys only, with no padding.

    Args:
        q: (total_q, Hq, D); k, v: (total_k, Hkv, D) with Hq a multiple of Hkv (grouped-query
            attention): the B sequences' tokens one after another. Any strides (rows are read in
            place). float16, bfloat16, float32 or float64.
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 or int64 on q's device: sequence b holds the
            queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and the keys
            ``k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]`` (and v's). Each must start at 0, never
            decrease and end at total_q / total_k (a ValueError otherwise; the check reads them on the
            host, which on CUDA is a synchronization, skipped while a CUDA graph is captured).
            Sequences may be empty on either side, and a sequence's query and key counts may differ.
        max_seqlen_q, max_seqlen_k: ints >= 0 or None, accepted for FlashAttention's signature; the
            kernels find every sequence's length from the offsets on the device, so they change
            nothing.
        causal: key j of a sequence visible to its query i when j <= i + sk - sq (sq, sk: that
            sequence's lengths; queries aligned to the end of its keys, as FlashAttention does).
        window: (left, right): keys within ``left`` before and ``right`` after the query's position
            in its sequence (None: unbounded), as in opforge.attention.
        softcap: scores become ``softcap * tanh(s / softcap)`` (Gemma 2), after the scale.
        scale: the scores' factor (default 1 / sqrt(D)).
        deterministic: the backward's, as in opforge.attention.
        return_lse: also return the log-sum-exp of each query's scores, (Hq, total_q) float32
            (float64 for float64 inputs), FlashAttention's varlen layout.
        variant: the kernel, as in opforge.attention (``"decode"`` takes no packed sequences: a
            ValueError).

    Returns the output (total_q, Hq, D) in q's dtype (contiguous), and the LSE when asked. A query
    whose sequence has no keys gets zeros and an LSE of -inf. The pattern (causal, window, softcap)
    applies to each sequence on its own; prefixes, segment ids, block masks and kv_lens do not
    combine with packed sequences. Differentiable in q, k and v (keys no query sees get zero
    gradients), under torch.compile and the torch.func transforms as opforge.attention is (vmap
    maps q, k and v by folding the mapped dimension into the heads; mapped offsets raise a
    NotImplementedError).

    Underneath: the registered op on the views ``x.unsqueeze(0).transpose(1, 2)`` (a batch of one,
    (1, H, total, D)) with ``cu_seqlens_q=`` and ``cu_seqlens_k=``.
    """
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
            raise ValueError(
                f"{VARLEN_OP}: {name} must be 3-D (total tokens, heads, head_dim), got {t.dim()}-D"
            )
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{VARLEN_OP}: {name} must be int32 or int64, got {dtype_name(t.dtype)}")
        if t.dim() != 1 or t.shape[0] < 1:
            raise ValueError(
                f"{VARLEN_OP}: {name} must be 1-D (number of sequences + 1,), got shape {list(t.shape)}"
            )
        check_same_device(VARLEN_OP, name, t, "q", q)
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(
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
    _check_options(VARLEN_OP, variant, deterministic)
    left, right = _window_args(VARLEN_OP, window)
    scale, softcap = _scale_arg(VARLEN_OP, q, scale), _softcap_arg(VARLEN_OP, softcap)
    args = (causal, left, right, 0, None, None, None, None, None, 128, 128)
    # (total, H, D) viewed as the op's batch of one, (1, H, total, D): read in place, and the
    # outputs come back laid out (1, total, H, D) underneath (empty_attention_like).
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        out, lse = _Attention.apply(
            q4, k4, v4, scale, softcap, variant, deterministic, cu_seqlens_q, cu_seqlens_k, *args, None
        )
    else:
        out, lse = torch.ops.opforge.attention.default(
            q4,
            k4,
            v4,
            scale,
            softcap,
            *args,
            variant=variant,
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
        )
    out = out.transpose(1, 2).squeeze(0)
    return (out, lse.squeeze(0)) if return_lse else out


def _check_options(op: str, variant, deterministic) -> None:
    if not isinstance(variant, str):
        raise TypeError(f"{op}: variant must be a str, got {type(variant).__name__}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"{op}: deterministic must be a bool or None, got {type(deterministic).__name__}")


def _scale_arg(op: str, q: torch.Tensor, scale):
    """The scores' factor: 1 / sqrt(head_dim) by default, else a finite number."""
    if scale is None:
        # head_dim ** -0.5 keeps a symbolic size symbolic under torch.compile(dynamic=True)
        return q.shape[-1] ** -0.5 if q.shape[-1] > 0 else 1.0
    # (abs(x) < inf: False for NaN too, and a symbolic value under torch.compile stays symbolic)
    if (
        not isinstance(scale, (numbers.Real, torch.SymFloat))
        or isinstance(scale, bool)
        or not abs(scale) < math.inf
    ):
        raise ValueError(f"{op}: scale must be a finite number, got {scale!r}")
    if not torch.compiler.is_compiling() and not isinstance(scale, torch.SymFloat):
        return float(scale)
    return scale


def _softcap_arg(op: str, softcap) -> float:
    """The softcap as the schema takes it (0: none)."""
    if softcap is None:
        return 0.0
    if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool) or not 0 <= softcap < math.inf:
        raise ValueError(f"{op}: softcap must be a positive number (or None), got {softcap!r}")
    return float(softcap)


def _window_args(op: str, window) -> tuple[int, int]:
    """window=(left, right) as the schema's window_left, window_right (-1: unbounded)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"{op}: window must be a pair (left, right) of ints or None, got {window!r}")
    sides = []
    for side in window:
        if side is None:
            sides.append(-1)
        elif isinstance(side, numbers.Integral) and not isinstance(side, bool) and side >= 0:
            sides.append(min(int(side), _REACH))
        else:
            raise ValueError(f"{op}: window sides must be ints >= 0 or None, got {window!r}")
    return sides[0], sides[1]


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


def _check_paged(q, k_cache, v_cache, block_table, kv_lens) -> None:
    """The checks of block_table, kv_lens and the paged caches (on the CPU: every table entry a
    sequence needs names a page)."""
    require_tensor(OP, "block_table", block_table)
    if q.dim() != 4:
        raise ValueError(f"{OP}: q must be 4-D (batch, heads, sequence, head_dim), got {q.dim()}-D")
    if kv_lens is None:
        raise ValueError(f"{OP}: block_table needs kv_lens (each sequence's key count in its pages)")
    _check_kv_lens(q, kv_lens, None)
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{OP}: block_table must be int32 or int64, got {dtype_name(block_table.dtype)}")
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0] or block_table.shape[1] < 1:
        raise ValueError(
            f"{OP}: block_table must be (batch, max_pages) = ({q.shape[0]}, >= 1), got shape "
            f"{list(block_table.shape)}"
        )
    check_same_device(OP, "block_table", block_table, "q", q)
    for name, t in (("k", k_cache), ("v", v_cache)):
        check_same_device(OP, name, t, "q", q)
        if t.dim() != 4:
            raise ValueError(
                f"{OP}: with block_table, {name} must be a paged cache (num_pages, page_size, kv_heads, "
                f"head_dim), got {t.dim()}-D"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{OP}: the k and v caches must have the same shape, got {list(k_cache.shape)} and "
            f"{list(v_cache.shape)}"
        )
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    if pages < 1 or page_size < 1:
        raise ValueError(f"{OP}: the paged caches have no pages, shape {list(k_cache.shape)}")
    max_pages = block_table.shape[1]
    if max_pages * page_size >= 2**31:
        raise ValueError(
            f"{OP}: a sequence's pages address at most 2^31 - 1 keys, got block_table's {max_pages} pages x "
            f"page_size {page_size}"
        )
    table = block_table.to(torch.int64)
    if table.device.type == "cpu" and not torch.compiler.is_compiling():
        n = kv_lens.to(torch.int64).clamp(0, max_pages * page_size)
        used = torch.arange(max_pages)[None, :] * page_size < n[:, None]
        bad = used & ((table < 0) | (table >= pages))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"{OP}: block_table[{b}, {j}] = {int(table[b, j])} is not a page of the caches "
                f"(0 to {pages - 1}), and sequence {b} needs it (kv_lens {int(n[b])})"
            )


def _paged_in_place(q, k_cache, v_cache, block_table, segment_ids, mask, variant: str) -> bool:
    """Whether a kernel reads this paged call's pages in place (opforge::attention_paged): the decode
    kernel (and on CUDA the Hopper and mma.sync forwards) when it takes the call with its key counts
    (no gradient; _kv_lens_kernel), with no segment ids or block mask (their tensors are per logical
    key) and no torch.func transform; on CUDA with a head dim of 64, 128 or 256 and cache rows at
    16-byte boundaries (opforge::attention_paged then picks the Hopper forward where its boxes tile
    the page size, else mma.sync). Else the pages are gathered first (_paged_kv)."""
    if segment_ids is not None or mask is not None or transforms_active():
        return False
    if q.dim() != 4 or q.shape[3] != k_cache.shape[3] or q.shape[1] % max(k_cache.shape[2], 1):
        return False  # (the general path's checks name the error)
    if q.shape[1] == 0 or q.shape[3] == 0:
        return False  # (the general path's empty result / head_dim error)
    if q.device.type == "cuda":  # (the decode kernels' 16-byte row copies, their head dims)
        if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[3] not in (64, 128, 256):
            return False
        for t in (k_cache, v_cache):
            if (
                t.dtype != q.dtype
                or t.stride(3) != 1
                or t.data_ptr() % 16
                or any(t.stride(d) % 8 or (t.stride(d) == 0 and t.shape[d] > 1) for d in range(3))
            ):
                return False
    elif q.device.type != "cpu":
        return False
    kernel = _kv_lens_kernel(q, k_cache, v_cache, variant, keys=block_table.shape[1] * k_cache.shape[1])
    return kernel == "decode" or (kernel in ("hopper", "mma_sync") and q.device.type == "cuda")


def _paged_kv(k_cache, v_cache, block_table) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as (B, Hkv, max_pages x page_size, D) views of one gathered copy of each sequence's
    pages (after _check_paged)."""
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    B, max_pages = block_table.shape
    table = block_table.to(torch.int64).clamp(0, pages - 1).flatten()
    k, v = (
        t.index_select(0, table).view(B, max_pages * page_size, *t.shape[2:]).transpose(1, 2)
        for t in (k_cache, v_cache)
    )
    return k, v


def _kv_lens_kernel(q, k, v, variant: str, keys: int | None = None) -> str | None:
    """The kernel that takes this call's per-sequence key counts itself, or None where the counts
    become a block mask (_kv_lens_as_mask): a gradient to record (no kernel here has a kv_lens
    backward) or a variant this device has not. Otherwise the kernel rule's answer
    (csrc/attention/attention_heuristics.h, asked through torch.ops.opforge._attention_kernel):
    decode, hopper or mma_sync (CUDA), tiled (CPU). keys: the call's key count where k is not
    (B, Hkv, Sk, D) (paged caches: max_pages x page_size; k's dim 2 is Hkv)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    if variant not in (
        ("auto", "decode", "hopper", "mma_sync") if q.device.type == "cuda" else ("auto", "decode", "tiled")
    ):
        return None
    kv_heads, sk = (k.shape[1], k.shape[2]) if keys is None else (k.shape[2], keys)
    sizes = (q.shape[1], kv_heads, q.shape[2], sk, q.shape[3])
    return _kernel(q.device, *(int(n) for n in sizes), variant)


@torch.compiler.assume_constant_result
def _kernel(device, heads: int, kv_heads: int, sq: int, sk: int, head_dim: int, variant: str) -> str:
    """The rule's kernel for a call with per-sequence key counts (a constant for torch.compile: it
    depends on the sizes only, which the compiled graph is specialised on)."""
    if kv_heads <= 0 or heads <= 0 or head_dim <= 0 or heads % kv_heads:  # (the op's own checks name
        return "tiled"  # the error, or give the empty result)
    return torch.ops.opforge._attention_kernel.default(
        device, heads, kv_heads, sq, sk, head_dim, kv_lens=True, variant=variant
    )


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
    left, right = _window_args(OP, window)
    prefix = 0
    if prefix_len is not None:
        if not isinstance(prefix_len, numbers.Integral) or isinstance(prefix_len, bool) or prefix_len < 0:
            raise ValueError(f"{OP}: prefix_len must be an int >= 0, got {prefix_len!r}")
        prefix = min(int(prefix_len), _REACH)
    causal = prefix_means_causal(causal, window, prefix)  # (a prefix alone: prefix-LM)
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
        kinds, index, bits = mask.tensors_on(q.device)  # (a mask built elsewhere: moved once, kept)
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
def _(q, k, v, scale, softcap, causal, window_left, window_right, prefix_len, *rest, **options):
    _check_qkv(OP, q, k, v)
    return _like(q), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


@torch.library.register_fake("opforge::attention_paged")
def _(q, k_cache, v_cache, kv_lens, block_table, *rest):
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{OP}: with block_table, q must be 4-D and k, v paged caches (num_pages, page_size, kv_heads, "
            f"head_dim) of one shape, got {list(q.shape)}, {list(k_cache.shape)} and {list(v_cache.shape)}"
        )
    for name, t in (("k", k_cache), ("v", v_cache), ("kv_lens", kv_lens), ("block_table", block_table)):
        check_same_device(OP, name, t, "q", q)
    return _like(q), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


@torch.library.register_fake("opforge::attention_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, *rest, **options):
    _check_qkv("opforge.attention_backward", q, k, v)
    return _like(q), _like(k), _like(v)


_PATTERN_ARGS = 11  # causal .. block_k: what the backward takes (kv_lens, the forward's next, it does not)
# The schemas' positions of cu_seqlens_q and cu_seqlens_k (after kv_lens; the backward's after block_k).
_VARLEN_ARGS = (17, 18)
_VARLEN_BACKWARD_ARGS = (20, 21)


def _backward_variant(variant: str) -> str:
    """The backward's kernel for the forward's variant (decoding has no backward kernel)."""
    return "auto" if variant == "decode" else variant


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    q, k, v, scale, softcap, *pattern = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, pattern[:_PATTERN_ARGS]
    ctx.variant = _backward_variant(keyword_only_inputs.get("variant", "auto"))
    ctx.deterministic = keyword_only_inputs.get("deterministic")
    # Packed sequences' offsets (None, None without): the backward takes them as the forward did.
    ctx.cu_seqlens = tuple(inputs[i] if i < len(inputs) else None for i in _VARLEN_ARGS)
    ctx.kv_lens = len(pattern) > _PATTERN_ARGS and pattern[_PATTERN_ARGS] is not None
    ctx.inputs = len(inputs)
    ctx.set_materialize_grads(False)


def _gradients(ctx, grad_out, grad_lse):
    """(dq, dk, dv) by the backward kernels; differentiable again (double backward) when the
    gradients are being recorded (create_graph=True, torch.func)."""
    if ctx.kv_lens:
        raise NotImplementedError(
            "opforge.attention_backward: no gradient through kv_lens' decode kernel; call opforge.attention, "
            "which builds the exact block mask when q, k or v require grad"
        )
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    cu_q, cu_k = ctx.cu_seqlens
    rest = (ctx.scale, ctx.softcap, ctx.variant, ctx.deterministic, cu_q, cu_k, *ctx.pattern)
    if torch.is_grad_enabled():
        return _AttentionBackward.apply(grad_out, q, k, v, out, lse, grad_lse, *rest)
    return torch.ops.opforge.attention_backward.default(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        grad_lse,
        ctx.scale,
        ctx.softcap,
        *ctx.pattern,
        variant=ctx.variant,
        deterministic=ctx.deterministic,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )


def _backward(ctx, grad_out, grad_lse):
    return (*_gradients(ctx, grad_out, grad_lse), *(None,) * (ctx.inputs - 3))


torch.library.register_autograd("opforge::attention", _backward, setup_context=_setup_context)


def _not_differentiable(ctx, *grads):
    raise RuntimeError(
        "opforge.attention_backward is not differentiable when called directly; differentiate "
        "opforge.attention's gradients instead (create_graph=True), which opforge.attention supports"
    )


def _no_context(ctx, inputs, keyword_only_inputs, output):
    pass


def _no_paged_context(ctx, inputs, output):  # (attention_paged has no keyword-only arguments)
    pass


def _paged_not_differentiable(ctx, *grads):
    raise RuntimeError(
        "opforge.attention: torch.ops.opforge.attention_paged has no backward; opforge.attention with "
        "block_table differentiates (it gathers the pages when an input requires grad)"
    )


torch.library.register_autograd("opforge::attention_backward", _not_differentiable, setup_context=_no_context)
torch.library.register_autograd(
    "opforge::attention_paged", _paged_not_differentiable, setup_context=_no_paged_context
)


class _Attention(torch.autograd.Function):
    """opforge.attention under the torch.func transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and
    forward-mode AD, which the op's registered autograd cannot serve: the same backward, the tangent
    computed densely (_tangent) and vmap by the ops' own rules (below)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, scale, softcap, variant, deterministic, cu_seqlens_q, cu_seqlens_k, *pattern):
        return torch.ops.opforge.attention.default(
            q,
            k,
            v,
            scale,
            softcap,
            *pattern,
            variant=variant,
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, scale, softcap, variant, deterministic, cu_q, cu_k, *pattern = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.save_for_forward(q, k, v, out, lse)
        ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, pattern[:_PATTERN_ARGS]
        ctx.variant = _backward_variant(variant)
        ctx.deterministic = deterministic
        ctx.cu_seqlens = (cu_q, cu_k)
        ctx.kv_lens = pattern[_PATTERN_ARGS] if len(pattern) > _PATTERN_ARGS else None
        ctx.inputs = len(inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (*_gradients(ctx, grad_out, grad_lse), *(None,) * (ctx.inputs - 3))

    @staticmethod
    def jvp(ctx, dq, dk, dv, *_):
        q, k, v, out, lse = ctx.saved_tensors
        return _tangent(
            q, k, v, out, lse, dq, dk, dv, ctx.scale, ctx.softcap, ctx.pattern, ctx.kv_lens, ctx.cu_seqlens
        )


class _AttentionBackward(torch.autograd.Function):
    """opforge.attention's backward as a function that can be differentiated again (double backward):
    the forward is the backward kernels; its own backward differentiates a dense recomputation of
    the first backward (_dense) in float32 (float64 for float64 inputs)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        grad_lse,
        scale,
        softcap,
        variant,
        deterministic,
        cu_seqlens_q,
        cu_seqlens_k,
        *pattern,
    ):
        return torch.ops.opforge.attention_backward.default(
            grad_out,
            q,
            k,
            v,
            out,
            lse,
            grad_lse,
            scale,
            softcap,
            *pattern,
            variant=variant,
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        (
            grad_out,
            q,
            k,
            v,
            _out,
            _lse,
            grad_lse,
            scale,
            softcap,
            _variant,
            _deterministic,
            cu_q,
            cu_k,
            *pattern,
        ) = inputs
        ctx.save_for_backward(grad_out, q, k, v, grad_lse)
        ctx.scale, ctx.softcap, ctx.pattern = scale, softcap, pattern
        ctx.cu_seqlens = (cu_q, cu_k)
        ctx.inputs = len(inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, ggq, ggk, ggv):
        grad_out, q, k, v, grad_lse = ctx.saved_tensors
        # out and lse are q, k, v's forward: the recomputation below differentiates through them,
        # so they get no gradient of their own (they would count the same path twice).
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            ins = [t if t.requires_grad else t.detach().requires_grad_() for t in (grad_out, q, k, v)]
            go, qd, kd, vd = ins
            out_d, lse_d = _dense(qd, kd, vd, ctx.scale, ctx.softcap, ctx.pattern, ctx.cu_seqlens)
            outs, cots = [out_d], [go.to(out_d.dtype)]
            if grad_lse is not None:
                gl = grad_lse if grad_lse.requires_grad else grad_lse.detach().requires_grad_()
                ins.append(gl)
                outs.append(lse_d)
                cots.append(gl.to(lse_d.dtype))
            first = torch.autograd.grad(outs, (qd, kd, vd), cots, create_graph=True)
            pairs = [
                (g, gg.to(g.dtype)) for g, gg in zip(first, (ggq, ggk, ggv), strict=True) if gg is not None
            ]
            if not pairs:
                return (None,) * ctx.inputs
            grads = torch.autograd.grad(
                [g for g, _ in pairs], ins, [gg for _, gg in pairs], create_graph=create, allow_unused=True
            )
        grads = [None if g is None else g.to(t.dtype) for g, t in zip(grads, ins, strict=True)]
        d_go, d_q, d_k, d_v = grads[:4]
        d_gl = grads[4] if grad_lse is not None else None
        return (d_go, d_q, d_k, d_v, None, None, d_gl, *(None,) * (ctx.inputs - 7))

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(
            "opforge.attention: forward-mode AD of its gradients (e.g. torch.func.hessian / jacfwd of "
            "jacrev) is not supported; reverse-over-reverse (torch.autograd.grad with create_graph=True, "
            "jacrev of jacrev) is"
        )


def _pattern_kwargs(pattern, sq: int, sk: int, kv_lens=None) -> dict:
    """The schema's pattern arguments as the reference's (opforge.masks.attention_mask) keywords."""
    causal, left, right, prefix, q_seg, kv_seg, kinds, index, bits, block_q, block_k = pattern
    kw = dict(
        causal=causal,
        window=(None if left < 0 else left, None if right < 0 else right),
        prefix_len=prefix,
        kv_lens=kv_lens,
    )
    if q_seg is not None:
        kw["segment_ids"] = (q_seg, kv_seg)
    if kinds is not None:
        kw["mask"] = BlockMask(
            kinds, index, bits, (kinds.shape[0], kinds.shape[1], sq, sk), (block_q, block_k)
        )
    return kw


def _visible(q, k, pattern, kv_lens=None, cu_seqlens=(None, None)) -> torch.Tensor:
    """(B, Hq, Sq, Sk) bool: what each query sees (packed sequences: each its own block)."""
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    kw = _pattern_kwargs(pattern, sq, sk, kv_lens)
    if cu_seqlens[0] is not None:
        ok = varlen_mask(*cu_seqlens, causal=kw["causal"], window=kw["window"], device=q.device)
        return ok.expand(B, H, sq, sk)
    return attention_mask(B, H, sq, sk, device=q.device, **kw)


def _scores(q, k, scale, softcap):
    """scale * q k^T (softcapped) in the computation's type, and tanh(...) with a softcap."""
    group = q.shape[1] // k.shape[1]
    s = torch.matmul(q, k.repeat_interleave(group, dim=1).transpose(-1, -2)) * scale
    if not softcap:
        return s, None
    t = torch.tanh(s / softcap)
    return softcap * t, t


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _dense(q, k, v, scale, softcap, pattern, cu_seqlens=(None, None)):
    """(out, lse) of opforge.attention in plain, twice differentiable PyTorch ops: the reference,
    in float32 (float64 for float64 inputs); packed sequences one at a time."""
    dt = _compute_dtype(q)
    sq, sk = q.shape[2], k.shape[2]
    kw = _pattern_kwargs(pattern, sq, sk)
    if cu_seqlens[0] is not None:  # (1, H, total, D) <-> the reference's (total, H, D)
        out, lse = reference.attention_varlen(
            *(t[0].transpose(0, 1).to(dt) for t in (q, k, v)),
            *cu_seqlens,
            causal=kw["causal"],
            window=kw["window"],
            scale=scale,
            softcap=softcap or None,
            return_lse=True,
        )
        return out.transpose(0, 1)[None], lse[None]
    return reference.attention(
        q.to(dt), k.to(dt), v.to(dt), scale=scale, softcap=softcap or None, return_lse=True, **kw
    )


def _tangent(q, k, v, out, lse, dq, dk, dv, scale, softcap, pattern, kv_lens, cu_seqlens=(None, None)):
    """The forward-mode derivative (tangents of out and lse) of attention at (q, k, v) along (dq, dk,
    dv), from the forward's out and LSE: with P = exp(S - lse) the probabilities and dS the scores'
    tangent, d lse = rowsum(P dS) and d out = (P dS) V - d lse * out + P dV. Dense over query rows
    in chunks (about 2^24 scores at a time), in float32 (float64 for float64 inputs)."""
    dt = _compute_dtype(q)
    group = q.shape[1] // k.shape[1]
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    visible = _visible(q, k, pattern, kv_lens, cu_seqlens) & torch.isfinite(lse)[..., None]
    vf = v.to(dt).repeat_interleave(group, dim=1)
    dvf = dv.to(dt).repeat_interleave(group, dim=1) if dv is not None else None
    d_out, d_lse = [], []
    step = max(1, (1 << 24) // max(1, B * H * sk))
    for i0 in range(0, sq, step):
        rows = slice(i0, min(sq, i0 + step))
        qc, lc = q[:, :, rows].to(dt), lse[:, :, rows].to(dt)
        s, t = _scores(qc, k.to(dt), scale, softcap)
        p = torch.where(visible[:, :, rows], torch.exp(s - lc[..., None]), 0.0)
        ds = None
        if dq is not None:
            ds = _scores(dq[:, :, rows].to(dt), k.to(dt), scale, 0.0)[0]
        if dk is not None:
            term = _scores(qc, dk.to(dt), scale, 0.0)[0]
            ds = term if ds is None else ds + term
        do = torch.zeros_like(out[:, :, rows], dtype=dt)
        dl = torch.zeros_like(lc)
        if ds is not None:
            if t is not None:
                ds = ds * (1 - t * t)
            pds = p * ds
            dl = pds.sum(-1)
            do = torch.matmul(pds, vf) - dl[..., None] * out[:, :, rows].to(dt)
        if dvf is not None:
            do = do + torch.matmul(p, dvf)
        d_out.append(do)
        d_lse.append(dl)
    if sq == 0:
        return torch.zeros_like(out), torch.zeros_like(lse)
    return torch.cat(d_out, dim=2).to(out.dtype), torch.cat(d_lse, dim=2).to(lse.dtype)


# ---- vmap: the mapped dimension joins the batch dimension ---------------------------------------


def _fold(t, dim, size):
    """(size, B, ...) with the mapped dimension first (an unmapped operand broadcast), flattened to
    (size * B, ...)."""
    if t is None:
        return None
    t = t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)
    return t.flatten(0, 1)


def _fold_mask(kinds, index, size):
    """A block mask's kinds and index for the folded batch (bits are shared)."""
    if kinds is None or kinds.shape[0] == 1:
        return kinds, index
    return kinds.repeat(size, 1, 1, 1), index.repeat(size, 1, 1, 1)


def _unfold(t, size):
    return t.unflatten(0, (size, t.shape[0] // size))


def _vmap_loop(op, info, in_dims, args, kwargs):
    """The op once per mapped index (for calls whose mask tensors are mapped), stacked."""
    outs = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if d is not None else a for a, d in zip(args, in_dims, strict=True)]
        outs.append(op(*sliced, **kwargs))
    return tuple(torch.stack(parts) for parts in zip(*outs, strict=True)), (0,) * len(outs[0])


def _fold_heads(t, dim, size):
    """Packed sequences: (1, size * H, ...) with the mapped dimension folded into the heads (their
    batch stays one). Head n * Hq + h of the fold reads kv head (n * Hq + h) // group = n * Hkv +
    h // group: still its own sample's."""
    if t is None:
        return None
    t = t.movedim(dim, 1) if dim is not None else t.unsqueeze(1).expand(t.shape[0], size, *t.shape[1:])
    return t.flatten(1, 2)


def _vmap_varlen(op, info, in_dims, args, kwargs, operands: int, offsets: tuple[int, int]):
    """vmap of packed sequences (cu_seqlens at `offsets`): the first `operands` arguments (q, k, v;
    the backward's grad_out .. grad_lse) folded into the heads, the outputs unfolded from them."""
    for i, name in zip(offsets, ("cu_seqlens_q", "cu_seqlens_k"), strict=True):
        if in_dims[i] is not None:
            raise NotImplementedError(
                f"{VARLEN_OP}: vmap over {name} is not supported (every mapped index must share the "
                "offsets); map over q, k and v, or call it once per packing"
            )
    size, args = info.batch_size, list(args)
    for i in range(operands):
        args[i] = _fold_heads(args[i], in_dims[i], size)
    outs = op(*args, **kwargs)
    return tuple(t.unflatten(1, (size, t.shape[1] // size)) for t in outs), (1,) * len(outs)


def _vmap_rule(
    op, batched: tuple[int, ...], mask: tuple[int, int, int], operands: int, offsets: tuple[int, int]
):
    """A vmap rule for `op`: the arguments at `batched` (those with a batch dimension: operands,
    segment ids, key counts) get the mapped dimension folded into it; a block mask (kinds, index,
    bits at `mask`) is shared, repeated along the batch where it has one; outputs unfolded. With
    packed sequences (offsets at `offsets`) the mapped dimension joins the heads instead
    (_vmap_varlen)."""

    def rule(info, in_dims, *args, variant="auto", deterministic=None):
        kwargs = dict(variant=variant, deterministic=deterministic)
        if any(i < len(args) and args[i] is not None for i in offsets):  # (at their default: not passed)
            return _vmap_varlen(op, info, in_dims, args, kwargs, operands, offsets)
        if any(in_dims[i] is not None for i in mask):
            return _vmap_loop(op, info, in_dims, args, kwargs)
        size, args = info.batch_size, list(args)
        for i in batched:
            if i < len(args):  # (kv_lens at its default is not passed)
                args[i] = _fold(args[i], in_dims[i], size)
        args[mask[0]], args[mask[1]] = _fold_mask(args[mask[0]], args[mask[1]], size)
        outs = op(*args, **kwargs)
        return tuple(_unfold(t, size) for t in outs), (0,) * len(outs)

    return rule


# attention: q, k, v, q_segments, kv_segments, kv_lens; attention_backward: grad_out, q, k, v, out,
# lse, grad_lse, q_segments, kv_segments (the schemas' positions).
torch.library.register_vmap(
    "opforge::attention",
    _vmap_rule(torch.ops.opforge.attention.default, (0, 1, 2, 9, 10, 16), (11, 12, 13), 3, _VARLEN_ARGS),
)
torch.library.register_vmap(
    "opforge::attention_backward",
    _vmap_rule(
        torch.ops.opforge.attention_backward.default,
        (0, 1, 2, 3, 4, 5, 6, 13, 14),
        (15, 16, 17),
        7,
        _VARLEN_BACKWARD_ARGS,
    ),
)


APPEND_OP = "opforge.paged_kv_append"


def paged_kv_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_table: torch.Tensor,
    kv_lens: torch.Tensor,
) -> None:
    """Write new keys and values into paged caches, in place: sequence b's new token i goes to
    position kv_lens[b] + i, that is ``k_cache[block_table[b, p // page_size], p % page_size]``.

    Args:
        k_cache, v_cache: (num_pages, page_size, Hkv, D), as `attention` reads them with
            ``block_table=`` (any strides).
        k, v: (B, Hkv, S_new, D) new tokens (the SDPA layout, views such as ``x.transpose(1, 2)``
            read in place), in the caches' dtype.
        block_table: (B, max_pages) int32 / int64 page indices.
        kv_lens: (B,) int32 / int64, each sequence's key count before these tokens (not updated here:
            add S_new afterwards, e.g. ``kv_lens += S_new``, before attending).

    Nothing is read on the host on CUDA (a CUDA graph captures the call; the lengths and table may
    change in place between replays). A position past the table (kv_lens[b] + i >= max_pages x
    page_size), a negative count or a page outside [0, num_pages): a ValueError on the CPU; on CUDA
    that token is not written (also under torch.compile). Tokens of different sequences must not
    share a page position. Float caches (float16, bfloat16, float32, float64), not requiring grad.
    """
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        require_tensor(APPEND_OP, name, t)
        if t.dim() != 4:
            raise ValueError(f"{APPEND_OP}: {name} must be 4-D, got {t.dim()}-D")
        check_same_device(APPEND_OP, name, t, "k_cache", k_cache)
        check_same_dtype(APPEND_OP, name, t, "k_cache", k_cache)
    check_dtype_in(APPEND_OP, "k_cache", k_cache, DTYPES)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.requires_grad and t.is_leaf and torch.is_grad_enabled():
            raise RuntimeError(
                f"{APPEND_OP}: {name} requires grad; a KV cache is written in place: detach it or "
                "append under torch.no_grad()"
            )
    require_tensor(APPEND_OP, "block_table", block_table)
    require_tensor(APPEND_OP, "kv_lens", kv_lens)
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{APPEND_OP}: k_cache and v_cache must have the same shape, got {list(k_cache.shape)} and "
            f"{list(v_cache.shape)}"
        )
    if k.shape != v.shape:
        raise ValueError(
            f"{APPEND_OP}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}"
        )
    pages, page_size, kv_heads, head_dim = k_cache.shape
    B, _, s_new, _ = k.shape
    if (k.shape[1], k.shape[3]) != (kv_heads, head_dim):
        raise ValueError(
            f"{APPEND_OP}: k must be (batch, kv_heads, new tokens, head_dim) with the caches' kv_heads "
            f"and head_dim ({kv_heads}, {head_dim}), got {list(k.shape)}"
        )
    for name, t in (("block_table", block_table), ("kv_lens", kv_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{APPEND_OP}: {name} must be int32 or int64, got {dtype_name(t.dtype)}")
        check_same_device(APPEND_OP, name, t, "k_cache", k_cache)
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
        raise ValueError(
            f"{APPEND_OP}: block_table must be (batch, max_pages) = ({B}, >= 1), got shape "
            f"{list(block_table.shape)}"
        )
    if kv_lens.dim() != 1 or kv_lens.shape[0] != B:
        raise ValueError(f"{APPEND_OP}: kv_lens must be (batch,) = ({B},), got shape {list(kv_lens.shape)}")
    if pages < 1 or page_size < 1:
        raise ValueError(f"{APPEND_OP}: the caches have no pages, shape {list(k_cache.shape)}")
    if B == 0 or s_new == 0:
        return
    max_pages = block_table.shape[1]
    dev = k_cache.device
    pos = kv_lens.to(torch.int64)[:, None] + torch.arange(s_new, device=dev)[None, :]  # (B, S_new)
    logical = pos.div(page_size, rounding_mode="floor")
    page = block_table.to(torch.int64).gather(1, logical.clamp(0, max_pages - 1))
    valid = (pos >= 0) & (logical < max_pages) & (page >= 0) & (page < pages)
    if dev.type == "cpu" and not torch.compiler.is_compiling() and not bool(valid.all()):
        b, i = (int(x) for x in (~valid).nonzero()[0])
        p, j = int(pos[b, i]), int(logical[b, i])
        if p < 0:
            why = f"kv_lens[{b}] = {int(kv_lens[b])} is negative"
        elif j >= max_pages:
            why = f"past its block_table row ({max_pages} pages x {page_size} positions)"
        else:
            why = f"block_table[{b}, {j}] = {int(block_table[b, j])} is not a page of the caches (0 to {pages - 1})"
        raise ValueError(f"{APPEND_OP}: sequence {b}'s new token {i} goes to position {p}: {why}")
    page, slot = page.flatten(), pos.remainder(page_size).flatten()
    valid = valid.flatten()
    # Tokens that cannot be written (CUDA) write instead, at (0, 0), what ends up there anyway: the
    # token written there if one is, else what is there: every write to a place has one value.
    page, slot = page.where(valid, 0), slot.where(valid, 0)
    at_origin = valid & (page == 0) & (slot == 0)
    for cache, new in ((k_cache, k), (v_cache, v)):
        rows = new.transpose(1, 2).reshape(B * s_new, kv_heads, head_dim)
        # (index_select, not rows[tensor]: a tensor index would read it on the host, which a CUDA
        # graph's capture forbids)
        first = rows.index_select(0, at_origin.to(torch.int32).argmax().view(1))[0]
        origin = torch.where(at_origin.any(), first, cache[0, 0])
        cache.index_put_((page, slot), rows.where(valid[:, None, None], origin))


__all__ = ["attention", "attention_varlen", "paged_kv_append"]
