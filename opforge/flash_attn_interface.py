"""FlashAttention's Python API on opforge: code written for ``flash_attn`` / ``flash_attn_interface``
runs on opforge by changing its import.

    from opforge.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

The three functions take FlashAttention-3's parameters (``hopper/flash_attn_interface.py``: the
module this one is named after) and the keywords FlashAttention-2 adds (``dropout_p``,
``alibi_slopes``, ``block_table``), with FlashAttention's semantics. Positional are only the
arguments both releases put first, in the same order (q, k, v; the offsets and maxima of varlen;
the caches and new k, v of the KV-cache call); the rest are keyword-only, because the two releases
order them differently (FlashAttention-2's ``flash_attn_func(q, k, v, dropout_p, softmax_scale,
...)`` against FlashAttention-3's ``(q, k, v, softmax_scale, causal, ...)``): a call written for
either by position gets a TypeError, never the other's meaning (a dropout of 0.0 taken as a scale
of 0 would be uniform attention, silently).

- tensors are (batch, seqlen, heads, head_dim) (packed (total, heads, head_dim) for varlen), read in
  place: opforge's kernels take these layouts as views, with no copy;
- grouped-query attention: q's heads a multiple of k's and v's;
- ``softmax_scale`` (default 1 / sqrt(head_dim)); ``causal`` aligned to the bottom right (query i
  of Sq sees key j of Sk when j <= i + Sk - Sq; a query that sees no key gets zeros);
  ``window_size=(left, right)``: keys in [i + Sk - Sq - left, i + Sk - Sq + right], a negative side
  unbounded (``(-1, -1)``: no window); ``softcap`` (0: none);
- ``deterministic``: the backward's. True asks for the deterministic backward (dQ accumulated in a
  fixed order); False asks for nothing, so ``torch.use_deterministic_algorithms(True)`` still makes
  it deterministic (FlashAttention ignores PyTorch's flag; opforge never runs a nondeterministic
  kernel under it);
- the log-sum-exp when asked (``return_attn_probs=True`` in the first two, as FlashAttention-3 returns
  it: ``(out, softmax_lse)``; ``return_softmax_lse=True`` in ``flash_attn_with_kvcache``): float32
  (float64 for float64 inputs), (batch, heads, seqlen), or (heads, total_q) for varlen; -inf for a
  query that sees no key (the log of an empty sum; FlashAttention's kernels write +inf there when
  they do not split the keys and -inf when they do).

Attention sinks (gpt-oss) are computed in all three: ``learnable_sink`` (FlashAttention's name) or
``s_aux`` (the name of the kernels transformers loads for gpt-oss), a (heads,) tensor of one logit a
query head that every row takes in its softmax with no value (opforge.attention's ``sinks``; give one
of the two names), differentiable.

FP8 inputs (float8_e4m3fn q, k, v with ``q_descale`` / ``k_descale`` / ``v_descale`` (batch, kv_heads)
float32) are opforge.attention's FP8 attention: bfloat16 output, forward only, computed by the Hopper
FP8 kernel (head dims up to 128; not with a KV cache's counts) and the CPU (every path).

What opforge does not compute raises a NotImplementedError naming the argument, never a silent
difference: dropout (``dropout_p > 0``), ALiBi (``alibi_slopes``), rotary embedding (``rotary_cos`` /
``rotary_sin``), ``qv``,
chunked attention (``attention_chunk``), ``seqused_q`` / ``seqused_k``, a left-padded cache
(``cache_leftpad``), paged varlen (``block_table`` in ``flash_attn_varlen_func``), and packed queries
in ``flash_attn_with_kvcache`` (``cu_seqlens_q`` / ``cu_seqlens_k_new``). Arguments that only tune
FlashAttention's own kernels (``num_splits``, ``pack_gqa``, ``sm_margin``, ``scheduler_metadata``) are
accepted and change nothing: opforge picks its kernel by its own rule (docs/attention.md).

Differentiable as opforge.attention is (``flash_attn_func``, ``flash_attn_varlen_func``; FlashAttention
has no backward for ``flash_attn_with_kvcache``, and here the cache write is not differentiable).
None of the three reads a tensor on the host on CUDA except the varlen offsets' check (see
opforge.attention_varlen), so decoding steps are capturable in CUDA graphs with the lengths and page
tables updated in place.
"""

from __future__ import annotations

import math
import numbers

import torch

from opforge.ops._common import require_tensor
from opforge.ops.attention.api import attention, attention_varlen
from opforge.ops.attention.checks import check_counts, scale_arg
from opforge.ops.attention.kv_cache import check_table_entries, paged_kv_append

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]

_MOD = "opforge.flash_attn_interface"


def _refuse(fn: str, **args) -> None:
    """NotImplementedError for an argument opforge does not compute, when it is set."""
    for name, value in args.items():
        if value is None or value is False:
            continue
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0:
            continue
        what = {
            "dropout_p": "attention dropout (dropout_p > 0)",
            "alibi_slopes": "ALiBi (alibi_slopes)",
            "rotary_cos": "rotary embedding (rotary_cos / rotary_sin): rotate q and k before the call",
            "rotary_sin": "rotary embedding (rotary_cos / rotary_sin): rotate q and k before the call",
            "qv": "qv",
            "attention_chunk": "chunked attention (attention_chunk != 0)",
            "seqused_q": "seqused_q (give each sequence's used length through cu_seqlens_q)",
            "seqused_k": "seqused_k (give each sequence's used length through cu_seqlens_k)",
            "cache_leftpad": "a left-padded cache (cache_leftpad)",
            "block_table": "a paged cache in flash_attn_varlen_func (block_table): use flash_attn_with_kvcache",
            "cu_seqlens_q": "packed queries (cu_seqlens_q) in flash_attn_with_kvcache",
            "cu_seqlens_k_new": "packed new keys (cu_seqlens_k_new) in flash_attn_with_kvcache",
            "rotary_seqlens": "rotary embedding (rotary_seqlens)",
        }[name]
        raise NotImplementedError(f"{_MOD}.{fn}: opforge does not support {what}")


def _sinks(fn: str, s_aux, learnable_sink):
    """The attention sinks under either name (opforge.attention checks the tensor)."""
    if s_aux is not None and learnable_sink is not None:
        raise TypeError(f"{_MOD}.{fn}: give the attention sinks as s_aux or learnable_sink, not both")
    return learnable_sink if learnable_sink is not None else s_aux


def _window(fn: str, window_size) -> tuple[int | None, int | None] | None:
    """FlashAttention's (left, right), a negative side unbounded, as opforge's window (None: none)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"{_MOD}.{fn}: window_size must be a pair (left, right), got {window_size!r}")
    sides = []
    for name, side in zip(("left", "right"), window_size, strict=True):
        if isinstance(side, torch.Tensor) or not isinstance(side, numbers.Integral) or isinstance(side, bool):
            raise TypeError(
                f"{_MOD}.{fn}: window_size's {name} side must be an int, got {type(side).__name__}"
            )
        sides.append(None if side < 0 else int(side))
    return None if sides == [None, None] else (sides[0], sides[1])


def _softcap(fn: str, softcap) -> float | None:
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"{_MOD}.{fn}: softcap must be a number (0: none), got {type(softcap).__name__}")
    if math.isnan(softcap) or softcap < 0:
        raise ValueError(f"{_MOD}.{fn}: softcap must be >= 0 (0: none), got {softcap!r}")
    return float(softcap) if softcap > 0 else None


def _causal(fn: str, causal) -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"{_MOD}.{fn}: causal must be a bool, got {type(causal).__name__}")
    return causal


def _deterministic(fn: str, deterministic) -> bool | None:
    if not isinstance(deterministic, bool):
        raise TypeError(f"{_MOD}.{fn}: deterministic must be a bool, got {type(deterministic).__name__}")
    return True if deterministic else None  # (False: torch.are_deterministic_algorithms_enabled() decides)


def _max_seqlen(fn: str, name: str, n):
    """A maximum FlashAttention takes as an int or a 0-d integer tensor (transformers passes the
    latter): tensors are checked by their type and shape only (their value is never needed), ints
    go on to attention_varlen's own check."""
    if isinstance(n, torch.Tensor):
        if n.dim() != 0 or n.dtype.is_floating_point or n.dtype.is_complex or n.dtype == torch.bool:
            raise TypeError(
                f"{_MOD}.{fn}: {name} must be an int, None or a 0-d integer tensor, got a {n.dtype} tensor "
                f"of shape {list(n.shape)}"
            )
        return None
    return n


def _check_rank(fn: str, rank: int, layout: str, **tensors) -> None:
    for name, t in tensors.items():
        require_tensor(f"{_MOD}.{fn}", name, t)
        if t.dim() != rank:
            raise RuntimeError(f"{_MOD}.{fn}: {name} must be {rank}-D {layout}, got shape {list(t.shape)}")


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    dropout_p: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's ``flash_attn_func`` on opforge.attention.

    Args:
        q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads, head_dim), heads a
            multiple of kv_heads. float16, bfloat16, float32 or float64 (FlashAttention: the first
            two).
        softmax_scale, causal, window_size, softcap, deterministic: as in the module's docstring.
        return_attn_probs: also return the LSE (FlashAttention-3's return: no probabilities).
        The rest: accepted for FlashAttention's signature; the module's docstring says which raise.

    Returns out (batch, seqlen_q, heads, head_dim) in q's dtype (contiguous when q is), and
    ``softmax_lse`` (batch, heads, seqlen_q) with ``return_attn_probs``.
    """
    fn = "flash_attn_func"
    _refuse(
        fn,
        dropout_p=dropout_p,
        alibi_slopes=alibi_slopes,
        qv=qv,
        attention_chunk=attention_chunk,
    )
    _check_rank(fn, 4, "(batch, seqlen, heads, head_dim)", q=q, k=k, v=v)
    res = attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        causal=_causal(fn, causal),
        window=_window(fn, window_size),
        scale=softmax_scale,
        softcap=_softcap(fn, softcap),
        deterministic=_deterministic(fn, deterministic),
        return_lse=return_attn_probs,
        sinks=_sinks(fn, s_aux, learnable_sink),
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )
    if return_attn_probs:
        return res[0].transpose(1, 2), res[1]
    return res.transpose(1, 2)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    dropout_p: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's ``flash_attn_varlen_func`` on opforge.attention_varlen.

    Args:
        q: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim): the sequences' tokens one
            after another.
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 (or int64) offsets: sequence b holds
            ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and ``k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]``
            (checked as opforge.attention_varlen checks them).
        max_seqlen_q, max_seqlen_k: accepted (opforge's kernels find the lengths on the device):
            ints, None, or 0-d integer tensors as transformers' FlashAttention path passes them
            (never read).
        softmax_scale, causal (per sequence, bottom-right), window_size, softcap, deterministic,
        return_attn_probs: as in flash_attn_func.

    Returns out (total_q, heads, head_dim) contiguous, and ``softmax_lse`` (heads, total_q)
    with ``return_attn_probs``.
    """
    fn = "flash_attn_varlen_func"
    _refuse(
        fn,
        dropout_p=dropout_p,
        alibi_slopes=alibi_slopes,
        qv=qv,
        attention_chunk=attention_chunk,
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        block_table=block_table,
    )
    _check_rank(fn, 3, "(total, heads, head_dim)", q=q, k=k, v=v)
    return attention_varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        _max_seqlen(fn, "max_seqlen_q", max_seqlen_q),
        _max_seqlen(fn, "max_seqlen_k", max_seqlen_k),
        causal=_causal(fn, causal),
        window=_window(fn, window_size),
        scale=softmax_scale,
        softcap=_softcap(fn, softcap),
        deterministic=_deterministic(fn, deterministic),
        return_lse=return_attn_probs,
        sinks=_sinks(fn, s_aux, learnable_sink),
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    qv: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    rotary_seqlens: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: torch.Tensor | None = None,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    block_table: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's ``flash_attn_with_kvcache``: new keys and values written into the cache in
    place, then q attends to each sequence's cache.

    Args:
        q: (batch, seqlen_q, heads, head_dim).
        k_cache, v_cache: (batch_cache, seqlen_cache, kv_heads, head_dim) without a page table, or
            (num_pages, page_size, kv_heads, head_dim) with one (any page size), any strides but the
            last.
        k, v: optional new tokens (batch, seqlen_new, kv_heads, head_dim), written into the cache at
            positions ``cache_seqlens[b]``, ``cache_seqlens[b] + 1``, ... (both or neither; checked
            against the caches whatever seqlen_new, 0 included).
        cache_seqlens: int or (batch,) int32 / int64: the keys in each sequence's cache before the
            new ones (None: the whole cache, which then takes no new tokens). Not updated here (add
            seqlen_new afterwards, as with FlashAttention). cache_seqlens + seqlen_new must lie in
            [0, the cache's capacity] (seqlen_cache, or max_pages x page_size): a ValueError for an
            int, and on the CPU for a tensor; on CUDA, where checking a tensor would synchronise, the
            attention clamps its counts into the cache and a new token without a place is not
            written. On the CPU every page a sequence reads is checked before anything is written (a
            call that raises leaves the cache as it was).
        cache_batch_idx: (batch,) int32 / int64: the cache row of each sequence (without a page
            table; default ``arange(batch)``, the cache then having batch rows). Read on the device.
        page_table (FlashAttention-3's name) or block_table (FlashAttention-2's): (batch,
            max_pages) int32 / int64 page indices; sequence b's key j is
            ``k_cache[page_table[b, j // page_size], j % page_size]``.
        softmax_scale, causal (bottom-right: query i at position cache_seqlens[b] + seqlen_new -
            seqlen_q + i), window_size, softcap: as in flash_attn_func.
        return_softmax_lse: also return the LSE (batch, heads, seqlen_q).
        The rest: accepted for FlashAttention's signature; the module's docstring says which raise.

    Each sequence attends to its first cache_seqlens[b] + seqlen_new keys. Nothing is read on the host
    on CUDA: a CUDA graph captures the call, lengths and tables updated in place between replays.

    Returns out (batch, seqlen_q, heads, head_dim), and the LSE with ``return_softmax_lse``.
    """
    fn = "flash_attn_with_kvcache"
    op = f"{_MOD}.{fn}"
    _refuse(
        fn,
        qv=qv,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        rotary_seqlens=rotary_seqlens,
        cache_leftpad=cache_leftpad,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new,
        attention_chunk=attention_chunk,
        alibi_slopes=alibi_slopes,
    )
    _check_rank(fn, 4, "(batch, seqlen, heads, head_dim)", q=q, k_cache=k_cache, v_cache=v_cache)
    if page_table is not None and block_table is not None:
        raise TypeError(f"{op}: give page_table or block_table (the same argument), not both")
    table = page_table if page_table is not None else block_table
    if (k is None) != (v is None):
        raise TypeError(f"{op}: give the new k and v together (got only {'k' if v is None else 'v'})")
    B = q.shape[0]
    if k is not None:  # (checked whatever their length: no new token is no reason to take any shape)
        _check_rank(fn, 4, "(batch, seqlen_new, kv_heads, head_dim)", k=k, v=v)
        if v_cache.shape[-1] != k_cache.shape[-1] or k_cache.dtype == torch.float8_e4m3fn:
            raise NotImplementedError(
                f"{op}: writing new k and v into the cache is not supported for "
                + ("FP8 caches" if k_cache.dtype == torch.float8_e4m3fn else "caches of two head dims")
                + " (opforge.paged_kv_append writes caches of one width in 16- and 32-bit types); write them "
                "into the cache first and call without k and v"
            )
        for name, t in (("k", k), ("v", v)):
            if t.shape[0] != B or t.shape[2:] != k_cache.shape[2:] or t.dtype != k_cache.dtype:
                raise RuntimeError(
                    f"{op}: {name} must be (batch, seqlen_new, kv_heads, head_dim) with q's batch {B}, the "
                    f"caches' kv_heads and head_dim {list(k_cache.shape[2:])} and dtype ({k_cache.dtype}), "
                    f"got {list(t.shape)} ({t.dtype})"
                )
        if k.shape != v.shape:
            raise RuntimeError(
                f"{op}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}"
            )
    dev = q.device
    if table is not None:
        require_tensor(op, "page_table" if page_table is not None else "block_table", table)
        if cache_batch_idx is not None:
            raise TypeError(
                f"{op}: cache_batch_idx is for a cache without a page table; the table says where"
            )
        capacity = table.shape[-1] * k_cache.shape[1] if table.dim() == 2 else 0
    else:
        if cache_batch_idx is not None:
            check_counts(op, "cache_batch_idx", cache_batch_idx, B, q)
        elif k_cache.shape[0] != B:
            raise RuntimeError(
                f"{op}: without cache_batch_idx or a page table the cache has one row a sequence: k_cache's "
                f"batch {k_cache.shape[0]} must be q's {B}"
            )
        capacity = k_cache.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise TypeError(f"{op}: new k and v need cache_seqlens (where to write them)")
        lens = None
    elif isinstance(cache_seqlens, torch.Tensor):
        check_counts(op, "cache_seqlens", cache_seqlens, B, q)
        lens = cache_seqlens
    elif isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        s_in = 0 if k is None else k.shape[1]
        if cache_seqlens < 0 or cache_seqlens + s_in > capacity:
            raise ValueError(
                f"{op}: cache_seqlens + seqlen_new must be in [0, {capacity}] (the cache's capacity), got "
                f"{cache_seqlens} + {s_in}"
            )
        lens = torch.full((B,), int(cache_seqlens), dtype=torch.int32, device=dev)
    else:
        raise TypeError(
            f"{op}: cache_seqlens must be an int or a (batch,) tensor, got {type(cache_seqlens).__name__}"
        )

    # A cache without a page table is a paged one whose pages are its rows (one page a sequence, as
    # long as the cache): cache_batch_idx is then the page table, read on the device.
    if table is None and cache_batch_idx is not None:
        table = cache_batch_idx.view(B, 1)
    # Everything the attention checks without reading data is checked before the cache is written,
    # so that a call that raises leaves the cache as it was (FlashAttention checks first too).
    window, cap = _window(fn, window_size), _softcap(fn, softcap)
    scale_arg(op, q, softmax_scale)
    if q.dtype != k_cache.dtype or q.shape[3] != k_cache.shape[3] or q.shape[2] % max(k_cache.shape[2], 1):
        raise RuntimeError(
            f"{op}: q {list(q.shape)} ({q.dtype}) must have the caches' dtype ({k_cache.dtype}) and head_dim "
            f"({k_cache.shape[3]}), and heads a multiple of theirs ({k_cache.shape[2]})"
        )
    s_new = 0 if k is None else k.shape[1]
    if lens is not None and dev.type == "cpu" and not torch.compiler.is_compiling():
        # (values read where that costs no synchronisation: on the CPU, as the append and the paged
        # attention check their entries there; CUDA clamps into the cache, as opforge.attention's
        # kv_lens, and does not write a token without a place)
        n = lens.to(torch.int64)
        if bool(((n < 0) | (n + s_new > capacity)).any()):
            b = int(((n < 0) | (n + s_new > capacity)).nonzero()[0])
            raise ValueError(
                f"{op}: cache_seqlens[{b}] + seqlen_new must be in [0, {capacity}] (the cache's capacity), "
                f"got {int(n[b])} + {s_new}"
            )
        if s_new and (page_table is not None or block_table is not None):
            # (every page each sequence will read checked before the new tokens are written, so that
            # a call that raises leaves the cache as it was)
            check_table_entries(op, table, n + s_new, k_cache.shape[0], k_cache.shape[1])
    if s_new and B:  # (no new tokens, or no sequence: nothing to write)
        # (a cache without a table: its row b is sequence b's one page)
        rows = table if table is not None else torch.arange(B, device=dev, dtype=torch.int32).view(B, 1)
        paged_kv_append(k_cache, v_cache, k.transpose(1, 2), v.transpose(1, 2), rows, lens)
    if lens is None:
        kv_lens = torch.full((B,), capacity, dtype=torch.int32, device=dev) if table is not None else None
    else:
        kv_lens = lens + s_new if s_new else lens
    kw = dict(
        causal=_causal(fn, causal),
        window=window,
        scale=softmax_scale,
        softcap=cap,
        kv_lens=kv_lens,
        return_lse=return_softmax_lse,
        sinks=_sinks(fn, s_aux, learnable_sink),
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )
    if table is not None:
        res = attention(q.transpose(1, 2), k_cache, v_cache, block_table=table, **kw)
    else:
        res = attention(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), **kw)
    if return_softmax_lse:
        return res[0].transpose(1, 2), res[1]
    return res.transpose(1, 2)
