"""opforge.attention: fused attention with custom patterns (causal, sliding window, prefix-LM,
packed documents, any block mask), forward and backward, grouped-query attention natively; and
opforge.attention_varlen: the same over variable-length sequences packed without padding
(FlashAttention's cu_seqlens layout). The functions users call, with their documentation; the
checks, the KV-cache paths, autograd and vmap live in the package's other modules."""

from __future__ import annotations

import torch

from opforge.masks import BlockMask
from opforge.ops._common import require_tensor, transforms_active
from opforge.ops.attention.autograd import Attention
from opforge.ops.attention.checks import (
    OP,
    VARLEN_OP,
    check_kv_lens,
    check_options,
    check_paged,
    check_ranks,
    check_varlen,
    pattern_args,
    scale_and_softcap,
    window_args,
)
from opforge.ops.attention.fp8 import check_fp8, check_fp8_cuda, dequantize, is_fp8_call, run_fp8_cuda
from opforge.ops.attention.kv_cache import gather_pages, kv_lens_as_mask, pages_by_kernel, records_gradient
from opforge.ops.attention.sharded import check_not_sharded
from opforge.ops.attention.sinks import apply_sinks, check_sinks


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
    sinks: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
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
            bounded window) any value, 0 included, means prefix-LM: bidirectional over the prefix and
            causal after it, as with ``causal=True`` (``prefix_len=0`` is an empty prompt: causal);
            with a window it adds the prefix to the window's keys. None: no prefix.
        segment_ids: (B, Sk) ids (the queries take those of the last Sq positions) or a pair
            (q_segments (B, Sq), kv_segments (B, Sk)): tokens see only their own segment (packed
            documents). Combines with the rest.
        mask: a `BlockMask` (`opforge.block_mask(fn, B, H, Sq, Sk)` or `BlockMask.from_dense`) made
            for this B (or 1), Hq (or 1), Sq and Sk: any pattern; combines with the rest. A mask
            built on another device (the CPU, without ``device=``) is copied to q's device at its
            first use there and the copy kept on the mask.
        scale: the scores' factor (default 1 / sqrt(D)): a number, or a one-element tensor (read on
            the host) as scaled_dot_product_attention takes it.
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
            an entry outside [0, num_pages) that a sequence needs raises a ValueError (eager calls,
            and compiled calls without gradients, whose kernel checks it); on CUDA (where checking
            would synchronise), and in a compiled call with gradients (which gathers the pages
            inside the graph), it is clamped into range. Calls without segment_ids, a mask or gradients go to
            ``torch.ops.opforge.attention_paged``, whose kernels read the pages in place where they
            can: on the CPU decoding calls (the decode kernel's), on CUDA decoding calls and chunks
            of new queries (the Hopper forward where the page size divides its key tile of 128 rows
            (64 at head dim 256) or is a multiple of it, at least 8; else the mma.sync forward) with
            head dims 64 / 128 / 256 and cache rows at 16-byte boundaries; it gathers the pages of
            the others into one (B, Hkv, max_pages x page_size, D) copy first (one more read and
            write of them), as the calls with segment ids, a mask or gradients are gathered.
        sinks: (Hq,) attention sinks (gpt-oss; FlashAttention's ``learnable_sink``): one more logit
            that every row of query head h takes in its softmax, ``sinks[h]``, with no value: the
            output is softmax([scores, sink]) without the sink's column times v, so a row's weights
            sum to less than 1 (a row that sees no key gets zeros and the sink as its LSE). Any
            floating dtype, on q's device; computed in float32 (float64 for float64 inputs), on every
            kernel and path (decode, paged, varlen), differentiable (its gradient too). The kernels
            add it when they finish a row; the backward needs nothing more.
        q_descale, k_descale, v_descale: FP8 attention (FlashAttention-3's contract): q, k and v in
            float8_e4m3fn, their true values the stored ones times these (B, Hkv) float32 factors (None:
            1; q's head h takes kv head h // group's); the output is bfloat16. Forward only. On CUDA
            the Hopper FP8 kernel (head dims up to 128; no mask=, kv_lens or block_table: a
            NotImplementedError, as on other GPUs); the CPU every path (in float32 from the
            dequantized inputs).
        return_lse: also return the log-sum-exp of each query's scores, (B, Hq, Sq) float32
            (float64 for float64 inputs); with sinks, over the scores and the sink.
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
    is such a view), and the LSE when asked. A query that sees no key gets zeros and an LSE of -inf;
    one that sees a NaN score (a NaN in q or in a visible key) gets NaN outputs, a NaN LSE and NaN
    gradients, as scaled_dot_product_attention gives.
    Differentiable in q, k and v (the backward is opforge.attention_backward), also
    under the torch.func transforms (grad, vjp, jacrev, jacfwd, jvp, vmap) and forward-mode AD (the
    tangent is computed densely, query rows in chunks); double backward (create_graph=True, e.g.
    gradgradcheck or a gradient penalty) recomputes the first backward densely in float32 (float64
    for float64 inputs), which takes memory for the (B, Hq, Sq, Sk) scores.

    ``scale`` and ``softcap`` must be numbers the kernels' float32 arithmetic holds (for float16,
    bfloat16 and float32 inputs): magnitudes from about 1.2e-38 to 3.4e38, or 0, and without a
    softcap a scale of magnitude at most 2^64 (scores are multiplied by scale * log2(e) in float32;
    beyond it ordinary scores overflow); a ValueError otherwise. Errors follow PyTorch's
    convention: TypeError for an argument of the wrong Python type, ValueError for a value out of
    range, RuntimeError for tensors whose dtypes, shapes or devices do not fit together.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(OP, name, t)
    if not torch.compiler.is_compiling():
        check_not_sharded(OP, q, k, v)
    check_options(OP, variant, deterministic)
    check_sinks(OP, q, sinks)
    descales = (q_descale, k_descale, v_descale)
    if is_fp8_call(q, k, v, descales):
        if q.device.type == "cuda":  # (the Hopper FP8 kernel)
            check_ranks(OP, q, k, v)
            check_fp8(OP, q, k, v, descales, q.shape[0], k.shape[1])
            check_fp8_cuda(OP, kv_lens, block_table, mask, sinks)
            args = pattern_args(q, k, causal, window, prefix_len, segment_ids, None)
            scale, softcap = scale_and_softcap(OP, q, scale, softcap)
            out, lse = run_fp8_cuda(q, k, v, descales, scale, softcap, args, sinks, variant)
            return (out, lse) if return_lse else out
        if block_table is not None:  # (each sequence's pages, then its descale)
            check_paged(q, k, v, block_table, kv_lens)
            k, v = gather_pages(k, v, block_table, kv_lens)
        check_ranks(OP, q, k, v)
        check_fp8(OP, q, k, v, descales, q.shape[0], k.shape[1])
        res = attention(
            *(dequantize(t, d, 1) for t, d in zip((q, k, v), descales, strict=True)),
            causal=causal,
            window=window,
            prefix_len=prefix_len,
            segment_ids=segment_ids,
            mask=mask,
            scale=scale,
            softcap=softcap,
            kv_lens=kv_lens,
            return_lse=return_lse,
            variant=variant,
            deterministic=deterministic,
            sinks=sinks,
        )
        return (res[0].to(torch.bfloat16), res[1]) if return_lse else res.to(torch.bfloat16)
    if block_table is not None:
        check_paged(q, k, v, block_table, kv_lens)
        if pages_by_kernel(q, k, v, segment_ids, mask, sinks):  # (which kernel, in place or not: C++ decides)
            causal, left, right, prefix = pattern_args(q, k, causal, window, prefix_len, None, None)[:4]
            out, lse = torch.ops.opforge.attention_paged.default(
                q,
                k,
                v,
                kv_lens,
                block_table,
                *scale_and_softcap(OP, q, scale, softcap),
                causal,
                left,
                right,
                prefix,
                variant,
                sinks,
            )
            return (out, lse) if return_lse else out
        k, v = gather_pages(k, v, block_table, kv_lens)
    check_ranks(OP, q, k, v)  # (the pattern arguments read the sizes)
    if kv_lens is not None:
        check_kv_lens(q, kv_lens, segment_ids)
    args = pattern_args(q, k, causal, window, prefix_len, segment_ids, mask)
    if kv_lens is not None and records_gradient(q, k, v, sinks):  # (no kernel has a kv_lens backward)
        (args, k, v), kv_lens = kv_lens_as_mask(q, k, v, kv_lens, args, mask), None
    scale, softcap = scale_and_softcap(OP, q, scale, softcap)
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        out, lse = Attention.apply(
            q, k, v, scale, softcap, variant, deterministic, None, None, *args, kv_lens
        )
        if sinks is not None:  # (composed after the kernels: differentiable under every transform)
            out, lse = apply_sinks(out, lse, sinks)
    else:
        out, lse = torch.ops.opforge.attention.default(
            q,
            k,
            v,
            scale,
            softcap,
            *args,
            kv_lens,
            None,
            None,
            sinks,
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
    check_offsets: bool = True,
    sinks: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
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
            decrease and end at most at total_q / total_k (a ValueError otherwise; the check reads
            them on the host, which on CUDA is a synchronization, skipped while a CUDA graph is
            captured and with check_offsets=False). Rows past the last offset belong to no sequence
            (the padding of a padded batch, as FlashAttention allows): their outputs are zeros,
            their LSE -inf and their gradients zeros. Sequences may be empty on either side, and a sequence's query and key
            counts may differ.
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
        check_offsets: False for a caller that vouches for its offsets (an inference server building
            them itself, as transformers' continuous batching does): on CUDA the forward then does not
            read them on the host, so the call does not synchronize with the device (what a CUDA graph
            capture does anyway). The kernels clamp every offset into the tensors, so bad offsets cannot
            read or write outside them, but their results are undefined; padding rows past the last
            offset are read as masked keys of the last sequence (NaN there can reach it). Like PyTorch's
            ``check_invariants`` for sparse tensors' indices. The CPU checks them either way (reading
            them costs nothing there), and so do the backward and calls under torch.func transforms.
        sinks: (Hq,) attention sinks, as in opforge.attention (rows past the last offset keep zeros and
            an LSE of -inf).
        q_descale, k_descale, v_descale: FP8 attention as in opforge.attention, the factors (B, Hkv)
            one row a sequence.

    Returns the output (total_q, Hq, D) in q's dtype (contiguous, whatever q's layout), and the LSE
    when asked. A query whose sequence has no keys gets zeros and an LSE of -inf. The pattern
    (causal, window, softcap) applies to each sequence on its own; prefixes, segment ids, block masks and kv_lens do not
    combine with packed sequences. Differentiable in q, k and v (keys no query sees get zero
    gradients), under torch.compile and the torch.func transforms as opforge.attention is (vmap
    maps q, k and v by folding the mapped dimension into the heads; mapped offsets raise a
    NotImplementedError).

    Underneath: the registered op on the views ``x.unsqueeze(0).transpose(1, 2)`` (a batch of one,
    (1, H, total, D)) with ``cu_seqlens_q=`` and ``cu_seqlens_k=``.
    """
    if not torch.compiler.is_compiling():
        check_not_sharded(VARLEN_OP, q, k, v)
    descales = (q_descale, k_descale, v_descale)
    if is_fp8_call(q, k, v, descales):
        return _varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, locals())
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)
    check_options(VARLEN_OP, variant, deterministic)
    check_sinks(VARLEN_OP, q, sinks)
    if not isinstance(check_offsets, bool):
        raise TypeError(f"{VARLEN_OP}: check_offsets must be a bool, got {type(check_offsets).__name__}")
    left, right = window_args(VARLEN_OP, window)
    scale, softcap = scale_and_softcap(VARLEN_OP, q, scale, softcap)
    args = (causal, left, right, 0, None, None, None, None, None, 128, 128)
    # (total, H, D) viewed as the op's batch of one, (1, H, total, D): read in place; the output
    # comes back laid out (1, total, H, D) underneath (empty_attention_like), so (total, H, D)
    # contiguous.
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    if transforms_active():  # torch.func / forward-mode AD: the Python autograd.Function
        out, lse = Attention.apply(
            q4, k4, v4, scale, softcap, variant, deterministic, cu_seqlens_q, cu_seqlens_k, *args
        )
        if sinks is not None:  # (composed; rows past the last offset stay in no sequence: LSE -inf)
            out, lse = apply_sinks(out, lse, sinks)
            past = torch.arange(lse.shape[-1], device=lse.device) >= cu_seqlens_q[-1]
            lse = lse.masked_fill(past, -torch.inf)
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
            sinks=sinks,
            check_offsets=check_offsets,
        )
    out = out.transpose(1, 2).squeeze(0)
    return (out, lse.squeeze(0)) if return_lse else out


def _varlen_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, call: dict):
    """attention_varlen of FP8 inputs: checked, dequantized (each row by its sequence's factors), then
    the float32 call; the output bfloat16."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(VARLEN_OP, name, t)
        if t.dim() != 3:
            raise RuntimeError(f"{VARLEN_OP}: {name} must be 3-D (total, heads, head_dim), got {t.dim()}-D")
    require_tensor(VARLEN_OP, "cu_seqlens_q", cu_seqlens_q)
    batch = cu_seqlens_q.shape[0] - 1
    check_fp8(VARLEN_OP, q, k, v, descales, batch, k.shape[1])
    if q.device.type == "cuda":  # (the Hopper FP8 kernel on the packed sequences, as attention_varlen's)
        check_varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            call["max_seqlen_q"],
            call["max_seqlen_k"],
            call["causal"],
            fp8=True,
        )
        if not isinstance(call["check_offsets"], bool):
            raise TypeError(
                f"{VARLEN_OP}: check_offsets must be a bool, got {type(call['check_offsets']).__name__}"
            )
        check_options(VARLEN_OP, call["variant"], call["deterministic"])
        check_fp8_cuda(VARLEN_OP, None, None, None, call["sinks"])
        check_sinks(VARLEN_OP, q, call["sinks"])
        left, right = window_args(VARLEN_OP, call["window"])
        scale, softcap = scale_and_softcap(VARLEN_OP, q, call["scale"], call["softcap"])
        args = (call["causal"], left, right, 0, None, None, None, None, None, 128, 128)
        q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
        out, lse = run_fp8_cuda(
            q4,
            k4,
            v4,
            descales,
            scale,
            softcap,
            args,
            call["sinks"],
            call["variant"],
            (cu_seqlens_q, cu_seqlens_k),
            call["check_offsets"],
        )
        out = out.transpose(1, 2).squeeze(0)
        return (out, lse.squeeze(0)) if call["return_lse"] else out

    def rows_of(t, cu):  # (each row's sequence; rows past the last offset take the last one's)
        rows = torch.arange(t.shape[0], device=t.device)
        return torch.searchsorted(cu[1:].to(torch.int64), rows, right=True).clamp(max=max(batch - 1, 0))

    q, k, v = (
        dequantize(t, d, 1, rows_of(t, cu) if d is not None else None)
        for t, d, cu in zip((q, k, v), descales, (cu_seqlens_q, cu_seqlens_k, cu_seqlens_k), strict=True)
    )
    kw = {n: call[n] for n in ("max_seqlen_q", "max_seqlen_k", "causal", "window", "softcap", "scale")}
    kw.update({n: call[n] for n in ("deterministic", "return_lse", "variant", "check_offsets", "sinks")})
    res = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)
    return (res[0].to(torch.bfloat16), res[1]) if call["return_lse"] else res.to(torch.bfloat16)
