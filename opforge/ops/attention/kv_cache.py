"""KV caches: per-sequence key counts (kv_lens) over a preallocated cache, paged caches (block_table),
and `paged_kv_append`, which writes new tokens into paged caches.

Which kernel reads a cache, and whether it reads the pages in place, is decided in C++
(opforge::attention_paged, csrc/attention/attention.cpp and the backends): this module only routes
a call that records gradients, or carries segment ids or a block mask (per logical key), to the
differentiable path, where the pages are gathered into one (B, Hkv, S, D) copy and the key counts
become an exact block mask."""

from __future__ import annotations

import torch

from opforge.masks import BlockMask, block_mask
from opforge.ops._common import (
    check_dtype_in,
    check_same_device,
    check_same_dtype,
    dtype_name,
    has_internal_overlap,
    require_tensor,
    transforms_active,
)
from opforge.ops.attention.checks import DTYPES, OP

APPEND_OP = "opforge.paged_kv_append"


def records_gradient(q, k, v, sinks=None) -> bool:
    """Whether this call records a gradient (no kernel here has a kv_lens or paged backward)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))


def pages_by_kernel(q, k_cache, v_cache, segment_ids, mask, sinks=None) -> bool:
    """Whether a paged call goes to opforge::attention_paged (which reads the pages in place where its
    kernels can, else gathers them itself): no gradient to record, no torch.func transform, no
    segment ids or block mask."""
    return (
        segment_ids is None
        and mask is None
        and not transforms_active()
        and not records_gradient(q, k_cache, v_cache, sinks)
    )


def check_table_entries(op: str, block_table, kv_lens, pages: int, page_size: int) -> None:
    """A ValueError naming the first entry of block_table (B, max_pages) that a sequence needs for
    its first kv_lens[b] keys (clamped to the table) and that is not a page in [0, pages): the CPU
    op's check (attention_cpu.cpp, check_cpu_block_table), in its words. Reads the values (CPU)."""
    max_pages = block_table.shape[1]
    n = kv_lens.to(torch.int64).clamp(0, max_pages * page_size)
    entries = block_table.to(torch.int64)
    used = torch.arange(max_pages, device=entries.device)[None, :] * page_size < n[:, None]
    bad = used & ((entries < 0) | (entries >= pages))
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"{op}: block_table[{b}, {j}] = {int(entries[b, j])} is not a page of the caches "
            f"(0 to {pages - 1}), and sequence {b} needs it (kv_lens {int(n[b])})"
        )


def gather_pages(k_cache, v_cache, block_table, kv_lens) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as (B, Hkv, max_pages x page_size, D) views of one gathered copy of each sequence's
    pages (after checks.check_paged; differentiable). On the CPU (eager) a table entry a sequence
    needs that is not a page is a ValueError, as in the CPU op (attention_cpu.cpp,
    check_cpu_block_table); elsewhere, and under the torch.func transforms (where a mapped kv_lens
    has no values to test on the host), entries are clamped into range, as the device kernels do."""
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    B, max_pages = block_table.shape
    if block_table.device.type == "cpu" and not torch.compiler.is_compiling() and not transforms_active():
        check_table_entries(OP, block_table, kv_lens, pages, page_size)
    table = block_table.to(torch.int64).clamp(0, pages - 1).flatten()
    k, v = (
        t.index_select(0, table).view(B, max_pages * page_size, *t.shape[2:]).transpose(1, 2)
        for t in (k_cache, v_cache)
    )
    return k, v


def kv_lens_as_mask(q, k, v, kv_lens, args, mask):
    """The pattern arguments with the per-sequence key counts, the band and prefix and any block mask
    folded into one exact block mask (the segments stay as they are), and k, v with the slots past
    each count zeroed (a preallocated cache may hold anything there; masked keys still meet P V).
    The mask is built from the counts' values (read on the host) by the op _kv_lens_block_mask, so
    that torch.compile traces the call (its partial blocks' count a size known when it runs): the
    path of calls that record gradients."""
    causal, left, right, prefix, q_seg, kv_seg = args[:6]
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if 0 in (B, H, sq, sk):  # (no score to mask: an empty output, or rows that see no key either way)
        return args, k, v
    n = kv_lens.to(torch.int64).clamp(0, sk)
    written = (torch.arange(sk, device=k.device)[None, :] < n[:, None])[:, None, :, None]
    k, v = k.where(written, 0), v.where(written, 0)
    given = (
        (mask.kinds, mask.index, mask.bits, *mask.block_size)
        if mask is not None
        else (None, None, None, 128, 128)
    )
    kinds, index, bits = torch.ops.opforge._kv_lens_block_mask(
        n, H, sq, sk, causal, left, right, prefix, *given
    )
    return (False, -1, -1, 0, q_seg, kv_seg, kinds, index, bits, *given[3:]), k, v


@torch.library.custom_op("opforge::_kv_lens_block_mask", mutates_args=())
def _kv_lens_block_mask(
    n: torch.Tensor,
    heads: int,
    sq: int,
    sk: int,
    causal: bool,
    left: int,
    right: int,
    prefix: int,
    kinds: torch.Tensor | None,
    index: torch.Tensor | None,
    bits: torch.Tensor | None,
    block_q: int,
    block_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv_lens_as_mask's block mask (kinds, index, bits of opforge.block_mask) for counts n (B,)
    int64 in [0, sk]: sequence b's queries at the end of its n[b] keys, the band (causal: right 0)
    and prefix, and the given block mask (kinds, index, bits; None: none) of (block_q, block_k)."""
    B = n.shape[0]
    dense = (
        BlockMask(kinds, index, bits, (kinds.shape[0], kinds.shape[1], sq, sk), (block_q, block_k)).to_dense()
        if kinds is not None
        else None
    )
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

    per_head = heads if dense is not None and dense.shape[1] > 1 else None
    m = block_mask(fn, B, per_head, sq, sk, block_size=(block_q, block_k), device=n.device)
    return m.kinds, m.index, m.bits


@_kv_lens_block_mask.register_fake
def _(n, heads, sq, sk, causal, left, right, prefix, kinds, index, bits, block_q, block_k):
    nq, nk = -(-sq // block_q), -(-sk // block_k)
    h = heads if kinds is not None and kinds.shape[1] > 1 else 1
    partial = torch.library.get_ctx().new_dynamic_size()  # (the partial blocks: known when it runs)
    return (
        n.new_empty((n.shape[0], h, nq, nk), dtype=torch.uint8),
        n.new_empty((n.shape[0], h, nq, nk), dtype=torch.int32),
        n.new_empty((partial, block_q, block_k // 32), dtype=torch.int32),
    )


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
    page_size), a negative count or a page outside [0, num_pages): a ValueError on the CPU (eager or
    compiled); on CUDA that token is not written. Tokens of different sequences must not share a page
    position. Float caches (float16, bfloat16, float32, float64), not expanded views (elements sharing
    memory: a RuntimeError, as an in-place op raises). Not differentiable: with gradients
    enabled, neither the caches nor k, v may require grad (a RuntimeError).
    The registered op is ``torch.ops.opforge.paged_kv_append`` (it mutates both caches).
    """
    for name, t in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("k", k),
        ("v", v),
        ("block_table", block_table),
        ("kv_lens", kv_lens),
    ):
        require_tensor(APPEND_OP, name, t)
    torch.ops.opforge.paged_kv_append(k_cache, v_cache, k, v, block_table, kv_lens)


def _check_append(k_cache, v_cache, k, v, block_table, kv_lens) -> None:
    """paged_kv_append's checks (the wrapper's, the registered op's and its fake's: one exception a
    condition whichever is called)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise RuntimeError(f"{APPEND_OP}: {name} must be 4-D, got {t.dim()}-D")
        check_same_device(APPEND_OP, name, t, "k_cache", k_cache)
        check_same_dtype(APPEND_OP, name, t, "k_cache", k_cache)
    check_dtype_in(APPEND_OP, "k_cache", k_cache, DTYPES)
    if k_cache.shape != v_cache.shape:
        raise RuntimeError(
            f"{APPEND_OP}: k_cache and v_cache must have the same shape, got {list(k_cache.shape)} and "
            f"{list(v_cache.shape)}"
        )
    if k.shape != v.shape:
        raise RuntimeError(
            f"{APPEND_OP}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}"
        )
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    B = k.shape[0]
    if (k.shape[1], k.shape[3]) != (kv_heads, head_dim):
        raise RuntimeError(
            f"{APPEND_OP}: k must be (batch, kv_heads, new tokens, head_dim) with the caches' kv_heads "
            f"and head_dim ({kv_heads}, {head_dim}), got {list(k.shape)}"
        )
    for name, t in (("block_table", block_table), ("kv_lens", kv_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise RuntimeError(
                f"{APPEND_OP}: {name} must be one of (int32, int64), got {dtype_name(t.dtype)}"
            )
        check_same_device(APPEND_OP, name, t, "k_cache", k_cache)
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
        raise RuntimeError(
            f"{APPEND_OP}: block_table must be (batch, max_pages) = ({B}, >= 1), got shape "
            f"{list(block_table.shape)}"
        )
    if kv_lens.dim() != 1 or kv_lens.shape[0] != B:
        raise RuntimeError(f"{APPEND_OP}: kv_lens must be (batch,) = ({B},), got shape {list(kv_lens.shape)}")
    if k_cache.shape[0] < 1 or k_cache.shape[1] < 1:
        raise RuntimeError(f"{APPEND_OP}: the caches have no pages, shape {list(k_cache.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if has_internal_overlap(t):
            raise RuntimeError(
                f"{APPEND_OP}: {name} has elements that share memory (an expanded or overlapping view); it "
                "cannot be written in place"
            )


# The op (csrc/registration.cpp) has C++ kernels: the CPU's (csrc/attention/cpu/paged_append_cpu.cpp:
# every token's place checked, then one parallel pass of row copies) and CUDA's
# (csrc/attention/cuda/paged_append_cuda.cpp: one block a token, its place looked up on the device,
# tokens without one skipped); its fake kernel checks what the kernels check before data.
@torch.library.register_fake("opforge::paged_kv_append")
def _(k_cache, v_cache, k, v, block_table, kv_lens) -> None:
    _check_append(k_cache, v_cache, k, v, block_table, kv_lens)


# Not differentiable: the new tokens would get no gradient and the caches' gradients would ignore
# the rows written over. PyTorch registers no autograd formula for an op that mutates its inputs, so
# tensors that require grad (with gradients enabled) are refused by the op's Autograd kernel (this
# check, then the op below autograd), the wrapper's calls and the raw op's alike (the op is defined
# in C++ without one).
_AUTOGRAD_LIB = torch.library.Library("opforge", "IMPL")


def _append_autograd(k_cache, v_cache, k, v, block_table, kv_lens) -> None:
    if torch.is_grad_enabled():
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
            if t.requires_grad:
                raise RuntimeError(
                    f"{APPEND_OP}: {name} requires grad, but appending to a KV cache is not differentiable "
                    "(it writes in place): append detached tensors, or under torch.no_grad()"
                )
    with torch._C._AutoDispatchBelowAutograd():
        torch.ops.opforge.paged_kv_append(k_cache, v_cache, k, v, block_table, kv_lens)


_AUTOGRAD_LIB.impl("paged_kv_append", _append_autograd, "Autograd")
