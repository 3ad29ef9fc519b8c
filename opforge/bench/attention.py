"""Benchmark spec for opforge.attention, in the same run as its peers; TFLOP/s count the visible
work only. CUDA (bfloat16): FlexAttention (compiled, with the equivalent block mask; softcap as its
score_mod), SDPA's flash and cuDNN backends where the pattern is causal or full, SDPA with a dense
mask otherwise, plain PyTorch attention, and FlashAttention-4 (flash_attn.cute) where it is
installed (a peer only, never a dependency: ../shared/tools/fa4_peer.sh) for the patterns it has
(causal, full, windows, softcap; its varlen function on packed documents); rows "... deterministic"
time the deterministic backward against FlashAttention-4's; "16 packed causal documents" times
opforge.attention_varlen and opforge.attention with segment ids on the same documents; the block-mask
rows ("random blocks 30%": partial blocks from a table; "dilated 4 + 128 causal": a mask function,
every fourth key and the 128 nearest; "sliding 256 + 64 sinks (mask fn)": a long row of mostly empty
blocks, 16k keys) give FlexAttention the same mask. CPU (float32):
SDPA (is_causal, or a dense mask) and plain PyTorch."""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.nn.functional as F

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec
from opforge.masks import attention_mask


def _with_backward(
    impls: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, own: dict | None = None
) -> dict:
    """Each impl followed by its backward (gradients of q, k, v for a random output gradient).
    own: impls that read their own (B, S, H, D) copies of the operands: name -> (q, k, v)."""
    own = own or {}
    grads = torch.randn(*q.shape[:-1], v.shape[-1], device=q.device, dtype=q.dtype)  # (the output's shape)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    for copies in own.values():
        for t in copies:
            t.requires_grad_()

    def fwd_bwd(name, fn):
        mine = list(own[name]) if name in own else leaves
        cot = grads.transpose(1, 2).contiguous() if name in own else grads

        def run():
            torch.autograd.grad(fn(), mine, cot)

        return run

    return {name: fwd_bwd(name, fn) for name, fn in impls.items()}


def _fa4(varlen: bool = False):
    """FlashAttention-4's flash_attn_func (flash_attn_varlen_func) where it is installed (a same-run
    peer), else None."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except Exception:
        return None
    return flash_attn_varlen_func if varlen else flash_attn_func


def _case(device: torch.device, name: str, B: int, H: int, S: int, D: int, kw: dict, backward: bool) -> Case:
    q, k, v = (torch.randn(B, H, S, D, device=device) for _ in range(3))
    dense = attention_mask(B, H, S, S, device=device, **kw)
    visible = int(dense.sum())
    causal_only = kw == {"causal": True}

    def sdpa():
        if causal_only:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if not kw else dense)

    def ours():
        return opforge.attention(q, k, v, **kw)

    def plain():
        return reference.attention(q, k, v, **kw)

    impls = {"opforge": ours, "SDPA" + (" (dense mask)" if kw and not causal_only else ""): sdpa}
    if not backward:
        impls["plain PyTorch"] = plain
    if backward:
        impls = _with_backward(impls, q, k, v)

    def check() -> str | None:
        with torch.no_grad():
            err = (
                (ours().double() - reference.attention(q.double(), k.double(), v.double(), **kw))
                .abs()
                .max()
                .item()
            )
        return None if err <= 1e-4 else f"max error {err:.2e} against the float64 reference"

    # 2 flops per multiply-add: forward Q K^T and P V (4 D per visible pair); the backward adds
    # dP = dO V^T, dV, dK, dQ and recomputes Q K^T (10 D), as FlashAttention counts it (2.5x).
    per_pair = 4 * D * (3.5 if backward else 1.0)
    return Case(
        op="attention",
        name=f"{name} B{B} H{H} S{S} D{D} fp32 {'fwd+bwd' if backward else 'fwd'}",
        impls=impls,
        check=check,
        flops=int(visible * per_pair),
        params={"pattern": name, "B": B, "H": H, "S": S, "D": D, "backward": backward},
    )


# ---- CUDA ----------------------------------------------------------------------------------


def _flex():
    """FlexAttention compiled once per process (each new mask function recompiles its kernel)."""
    global _FLEX
    if _FLEX is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # Every case (its shapes, its mask function) compiles its own kernel: past dynamo's default
        # limit of 8, flex_attention would silently run eagerly (the math path, ~100x slower).
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
        _FLEX = torch.compile(flex_attention)
    return _FLEX


_FLEX = None


def _dilated_mask(b, h, q, kv):
    """Every fourth key, and the 128 nearest, causal (a mask with many partial blocks, as a function:
    opforge.block_mask and FlexAttention's mask_mod take it alike)."""
    return (((kv % 4) == 0) | ((q - kv).abs() < 128)) & (q >= kv)


def _sinks_mask(b, h, q, kv):
    """The 256 nearest keys before each query and the first 64 (attention sinks): a long, sparse mask
    given as a function (most of each row's blocks empty)."""
    return ((q - kv < 256) & (q >= kv)) | (kv < 64)


def _flex_mask_mod(kw: dict, doc: torch.Tensor | None, table: torch.Tensor | None, fn=None):
    """The FlexAttention mask_mod equivalent to opforge's pattern arguments (fn: a mask function both
    take as it is)."""
    window = kw.get("window")
    prefix = kw.get("prefix_len")
    causal = kw.get("causal", False)
    if fn is not None:
        return fn

    def mask_mod(b, h, q, kv):
        if table is not None:
            return table[q, kv]
        keep = q >= kv if causal else q == q
        if window is not None:
            keep = keep & (q - kv <= window[0])
        if prefix is not None:
            keep = keep | (kv < prefix)
        if doc is not None:
            keep = keep & (doc[b, q] == doc[b, kv])
        return keep

    return mask_mod


def _cuda_case(
    device: torch.device,
    name: str,
    B: int,
    Hq: int,
    Hkv: int,
    S: int,
    D: int,
    kw: dict,
    backward: bool,
    docs: int = 0,
    random_blocks: float = 0.0,
    deterministic: bool = False,
    mask_fn=None,
    dv: int = 0,
    sinks: bool = False,
) -> Case:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    dtype = torch.bfloat16
    dv = dv or D  # (v's head dim: DeepSeek's MLA reads values of 128 with q, k of 192)
    q = torch.randn(B, Hq, S, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, S, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, S, dv, device=device, dtype=dtype)
    kw = dict(kw)
    # gpt-oss's attention sinks: opforge's sinks=, FlashAttention-4's learnable_sink, FlexAttention's
    # LSE rescaled after its kernel (SDPA takes none)
    sink = torch.randn(Hq, device=device) if sinks else None
    doc = table = None
    if docs:
        doc = (torch.arange(S, device=device) // (S // docs)).expand(B, S).contiguous()
        kw["segment_ids"] = doc
    extra: dict = {}
    if random_blocks:
        # About random_blocks of the 128 x 128 blocks visible, each partial (90% of its elements).
        nb = -(-S // 128)
        blocks = torch.rand(nb, nb, device=device) < random_blocks
        table = blocks.repeat_interleave(128, 0).repeat_interleave(128, 1)[:S, :S] & (
            torch.rand(S, S, device=device) < 0.9
        )
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        mask = opforge.block_mask(lambda b, h, i, j: table[i, j], None, None, S, S, device=device)
        opforge.attention(q, k, v, mask=mask)
        torch.cuda.synchronize(device)
        extra["opforge first result s"] = round(time.perf_counter() - t0, 3)
        kw["mask"] = mask
    if mask_fn is not None:  # a mask function: opforge.block_mask and Flex's mask_mod both take it
        pos = torch.arange(S, device=device)
        table = mask_fn(None, None, pos[:, None], pos[None, :])  # (the dense form: checks, SDPA)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        mask = opforge.block_mask(mask_fn, None, None, S, S, device=device)
        opforge.attention(q, k, v, mask=mask)
        torch.cuda.synchronize(device)
        extra["opforge first result s"] = round(time.perf_counter() - t0, 3)
        kw["mask"] = mask
    cap = kw.get("softcap")
    masking = {key: val for key, val in kw.items() if key != "softcap"}  # the visibility pattern
    score_mod = None
    if cap:

        def score_mod(score, b, h, i, j):
            return cap * torch.tanh(score / cap)

    mask_mod = _flex_mask_mod(masking, doc, table, mask_fn)
    needs_mask = bool(masking) and masking != {"causal": True}
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    flex_mask = (
        create_block_mask(mask_mod, B if docs else None, None, S, S, device=device, BLOCK_SIZE=128)
        if masking
        else None
    )
    gqa = Hq != Hkv
    flex = _flex()
    flex(q, k, v, block_mask=flex_mask, enable_gqa=gqa, score_mod=score_mod)
    torch.cuda.synchronize(device)
    if random_blocks or mask_fn is not None:
        extra["FlexAttention first result s"] = round(time.perf_counter() - t0, 3)
    # Visible pairs (one mask per batch row only where documents differ by row; per head alike).
    dense = None
    if needs_mask:
        if table is not None:
            dense = table[None, None]
        else:
            pattern = {key: val for key, val in masking.items() if key != "segment_ids"}
            dense = attention_mask(1, 1, S, S, device=device, **pattern)
            if doc is not None:
                dense = dense & (doc[:, None, :, None] == doc[:, None, None, :])
        visible = int(dense.sum()) * Hq * (B if dense.shape[0] == 1 else 1)
    else:
        visible = B * Hq * (S * (S + 1) // 2 if masking else S * S)

    impls = {"opforge": lambda: opforge.attention(q, k, v, **kw, sinks=sink, deterministic=deterministic)}
    impls["FlexAttention"] = lambda: flex(q, k, v, block_mask=flex_mask, enable_gqa=gqa, score_mod=score_mod)
    if sink is not None:

        def flex_sinks():
            out, lse = flex(
                q, k, v, block_mask=flex_mask, enable_gqa=gqa, score_mod=score_mod, return_lse=True
            )
            return out * torch.sigmoid(lse - sink.view(1, -1, 1)).unsqueeze(-1).to(out.dtype)

        impls["FlexAttention"] = flex_sinks
    fa4, own = _fa4(), {}
    if fa4 is not None and not docs and "mask" not in kw and set(kw) <= {"causal", "window", "softcap"}:
        # FlashAttention-4 reads (B, S, H, D): its own contiguous copies.
        q4, k4, v4 = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        fa4_kw = dict(
            causal=kw.get("causal", False), softcap=kw.get("softcap", 0.0), deterministic=deterministic
        )
        if "window" in kw:
            fa4_kw["window_size"] = kw["window"]
        if sink is not None:
            fa4_kw["learnable_sink"] = sink
        label = "FlashAttention-4" + (" deterministic" if deterministic else "")
        impls[label] = lambda: fa4(q4, k4, v4, **fa4_kw)[0]
        own[label] = (q4, k4, v4)
        impls[label]()  # (its JIT compilation, before timing)
    if not needs_mask and not cap and sink is None:
        causal = kw.get("causal", False)
        for label, backend in (
            ("SDPA flash", SDPBackend.FLASH_ATTENTION),
            ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
        ):
            if dv != D and backend == SDPBackend.FLASH_ATTENTION:  # (one head dim for q, k and v)
                continue

            def sdpa(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

            impls[label] = sdpa
    elif name.startswith("sliding 512") or "mask" in kw:
        impls["SDPA (dense mask)"] = lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense, enable_gqa=gqa
        )
    if not backward and name.startswith("sliding 512") and Hq == Hkv:
        impls["plain PyTorch"] = lambda: reference.attention(q, k, v, **kw)
    if deterministic:  # the deterministic backwards only
        impls = {
            name: fn for name, fn in impls.items() if name == "opforge" or name.endswith("deterministic")
        }
    if backward:
        impls = _with_backward(impls, q, k, v, own)

    def check() -> str | None:
        # Batch row 0, the first two heads' group, against float64.
        with torch.no_grad():
            hk = max(1, 2 * Hkv // Hq)
            sub = {key: (val[:1] if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
            if "mask" in kw:
                sub["mask"] = opforge.BlockMask.from_dense(table[None, None], block_size=128)
            qs, ks, vs = q[:1, :2], k[:1, :hk], v[:1, :hk]
            ss = None if sink is None else sink[:2]
            got = opforge.attention(qs, ks, vs, **sub, sinks=ss, deterministic=deterministic).double()
            want = reference.attention(qs.double(), ks.double(), vs.double(), **sub, sinks=ss)
            err = (got - want).abs().max().item()
        return None if err <= 2e-2 else f"max error {err:.2e} against the float64 reference"

    # 2 flops per multiply-add: the forward's Q K^T and P V; the backward adds S again, dP, dV, dK, dQ
    per_pair = 8 * D + 6 * dv if backward else 2 * (D + dv)
    dims = f"D{D}" + (f"/{dv}" if dv != D else "")
    return Case(
        op="attention",
        name=f"{name} B{B} H{Hq}{'/' + str(Hkv) if gqa else ''} S{S} {dims} bf16 {'fwd+bwd' if backward else 'fwd'}"
        + (" deterministic" if deterministic else ""),
        impls=impls,
        check=check,
        flops=int(visible * per_pair),
        params={
            "pattern": name,
            "B": B,
            "H": Hq,
            "Hkv": Hkv,
            "S": S,
            "D": D,
            "Dv": dv,
            "sinks": sinks,
            "backward": backward,
            "deterministic": deterministic,
            **extra,
        },
    )


def _cuda_cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    sliding = dict(causal=True, window=(511, 0))
    rows = [
        ("sliding 512", 4, 16, 16, 4096, 128, sliding, {}),
        ("causal", 4, 16, 16, 4096, 128, dict(causal=True), {}),
    ]
    if full:
        rows += [
            ("full", 4, 16, 16, 4096, 128, {}, {}),
            ("prefix-LM 1024", 4, 16, 16, 4096, 128, dict(causal=True, prefix_len=1024), {}),
            ("documents 8x512", 4, 16, 16, 4096, 128, dict(causal=True), {"docs": 8}),
            ("sliding 512 D64", 4, 32, 32, 4096, 64, sliding, {}),
            ("sliding 512 GQA", 4, 32, 8, 4096, 128, sliding, {}),
            ("sliding 512 D256", 4, 16, 16, 4096, 256, sliding, {}),
            ("random blocks 30%", 4, 16, 16, 4096, 128, {}, {"random_blocks": 0.3}),
            ("dilated 4 + 128 causal", 4, 16, 16, 4096, 128, {}, {"mask_fn": _dilated_mask}),
            ("sliding 256 + 64 sinks (mask fn)", 1, 16, 16, 16384, 128, {}, {"mask_fn": _sinks_mask}),
            ("GQA 32/8 causal", 2, 32, 8, 8192, 128, dict(causal=True), {}),
            ("causal D64", 4, 32, 32, 4096, 64, dict(causal=True), {}),
            ("causal D256", 4, 8, 8, 4096, 256, dict(causal=True), {}),
            ("softcap 50 causal", 4, 16, 16, 4096, 128, dict(causal=True, softcap=50.0), {}),
            # today's models (issue 48): DeepSeek's MLA, head dim 192, gpt-oss's sinks
            ("MLA 192/128 causal", 2, 128, 128, 4096, 192, dict(causal=True), {"dv": 128}),
            ("causal D192", 2, 32, 8, 4096, 192, dict(causal=True), {}),
            ("sinks causal", 2, 64, 8, 4096, 64, dict(causal=True), {"sinks": True}),
            ("sinks sliding 128", 2, 64, 8, 4096, 64, dict(causal=True, window=(127, 0)), {"sinks": True}),
        ]
    builders: list[CaseBuilder] = []
    for name, B, Hq, Hkv, S, D, kw, extra in rows:
        for backward in (False, True):
            builders.append(partial(_cuda_case, device, name, B, Hq, Hkv, S, D, kw, backward, **extra))
    if full:  # packed causal documents: varlen against FlashAttention-4's varlen and Flex
        for backward in (False, True):
            builders.append(
                partial(
                    _packed_case,
                    device,
                    "16 packed causal documents",
                    16,
                    16384,
                    32,
                    8,
                    128,
                    backward=backward,
                )
            )
    if full:  # the deterministic backward against FlashAttention-4's
        for name, B, Hq, Hkv, S, D, kw, extra in rows:
            if name in ("causal", "full", "GQA 32/8 causal", "causal D64", "causal D256"):
                builders.append(
                    partial(_cuda_case, device, name, B, Hq, Hkv, S, D, kw, True, **extra, deterministic=True)
                )
    return builders


def _document_lengths(S: int, docs: int) -> list[int]:
    """docs lengths around S / docs (within +-128, most not multiples of 128) that sum to S."""
    lengths = [S // docs + (i * 397) % 256 - 128 for i in range(docs)]
    lengths[-1] += S - sum(lengths)
    return lengths


def _packed_case(
    device: torch.device, name: str, docs: int, S: int, Hq: int, Hkv: int, D: int, backward: bool
) -> Case:
    """Causal documents packed into one row of S tokens: opforge.attention_varlen (each document's
    tiles on their own), opforge.attention with the documents as segment ids (tiles straddling two
    documents partly computed), FlexAttention with the document mask, FlashAttention-4's varlen."""
    from torch.nn.attention.flex_attention import create_block_mask

    dtype = torch.bfloat16
    lengths = _document_lengths(S, docs)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    doc = torch.repeat_interleave(torch.arange(docs, device=device), torch.tensor(lengths, device=device))[
        None
    ]
    # (1, H, S, D) for opforge.attention and Flex; packed (S, H, D) copies for the varlen impls.
    q = torch.randn(1, Hq, S, D, device=device, dtype=dtype)
    k, v = (torch.randn(1, Hkv, S, D, device=device, dtype=dtype) for _ in range(2))
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
    gqa = Hq != Hkv
    flex = _flex()

    def mask_mod(b, h, i, j):
        return (i >= j) & (doc[0, i] == doc[0, j])

    flex_mask = create_block_mask(mask_mod, None, None, S, S, device=device, BLOCK_SIZE=128)
    impls = {
        "opforge varlen": lambda: opforge.attention_varlen(qp, kp, vp, cu, cu, causal=True).unsqueeze(0),
        "opforge segment_ids": lambda: opforge.attention(q, k, v, causal=True, segment_ids=doc),
        "FlexAttention": lambda: flex(q, k, v, block_mask=flex_mask, enable_gqa=gqa),
    }
    own = {"opforge varlen": (qp, kp, vp)}
    fa4 = _fa4(varlen=True)
    if fa4 is not None:
        longest = max(lengths)
        # (keywords: its positional order has qv between v and the offsets)
        impls["FlashAttention-4 varlen"] = lambda: fa4(
            qp,
            kp,
            vp,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=longest,
            max_seqlen_k=longest,
            causal=True,
        )[0].unsqueeze(0)
        own["FlashAttention-4 varlen"] = (qp, kp, vp)
        impls["FlashAttention-4 varlen"]()  # (its JIT compilation, before timing)
    if backward:
        impls = _with_backward(impls, q, k, v, own)

    def check() -> str | None:
        # The first two documents, heads 0-1 (and their kv heads), against float64.
        with torch.no_grad():
            n, hk = lengths[0] + lengths[1], max(1, 2 * Hkv // Hq)
            got = opforge.attention_varlen(qp[:n, :2], kp[:n, :hk], vp[:n, :hk], cu[:3], cu[:3], causal=True)
            want = reference.attention_varlen(
                qp[:n, :2].double(), kp[:n, :hk].double(), vp[:n, :hk].double(), cu[:3], cu[:3], causal=True
            )
            err = (got.double() - want).abs().max().item()
        return None if err <= 2e-2 else f"max error {err:.2e} against the float64 reference"

    visible = Hq * sum(n * (n + 1) // 2 for n in lengths)
    return Case(
        op="attention",
        name=f"{name} B1 H{Hq}/{Hkv} S{S} D{D} bf16 {'fwd+bwd' if backward else 'fwd'}",
        impls=impls,
        check=check,
        flops=int(visible * 4 * D * (3.5 if backward else 1.0)),
        params={
            "pattern": name,
            "B": 1,
            "H": Hq,
            "Hkv": Hkv,
            "S": S,
            "D": D,
            "docs": docs,
            "backward": backward,
        },
    )


def _decode_case(
    device: torch.device,
    name: str,
    B: int,
    Hq: int,
    Hkv: int,
    cache: int,
    D: int,
    window: int,
    ragged: bool = False,
) -> Case:
    """One query token a sequence against a KV cache of ``cache`` positions (the decode step of
    generation): GB/s count the K/V bytes the visible keys take, each KV head read once. ragged:
    the sequences fill cache / 8 .. cache positions of a preallocated cache (opforge: kv_lens; the
    peers: a length mask)."""
    from torch.nn.attention.flex_attention import create_block_mask

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(B, Hq, 1, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hkv, cache, D, device=device, dtype=dtype) for _ in range(2))
    kw = dict(causal=True, window=(window - 1, 0)) if window else dict(causal=True)
    visible = min(window, cache) if window else cache
    gqa = Hq != Hkv
    if ragged:
        lens = torch.linspace(cache // 8, cache, B, device=device).long()
        kw["kv_lens"] = lens
        keep = (torch.arange(cache, device=device)[None, :] < lens[:, None])[:, None, None, :]
        impls = {
            "opforge": lambda: opforge.attention(q, k, v, **kw),
            "SDPA (length mask)": lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, enable_gqa=gqa
            ),
        }
        if device.type == "cuda":

            def length_mod(b, h, i, j):
                return j < lens[b]

            flex_mask = create_block_mask(length_mod, B, None, 1, cache, device=device, BLOCK_SIZE=128)
            flex = _flex()
            impls["FlexAttention"] = lambda: flex(q, k, v, block_mask=flex_mask, enable_gqa=gqa)
        return _decode_result(
            name, q, k, v, kw, impls, int(lens.sum()) * Hkv * 2 * D * q.element_size(), cache, window
        )
    impls = {"opforge": lambda: opforge.attention(q, k, v, **kw)}
    if window:
        keep = torch.zeros(1, 1, 1, cache, dtype=torch.bool, device=device)
        keep[..., cache - window :] = True
        impls["SDPA (window mask)"] = lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, enable_gqa=gqa
        )
    else:
        impls["SDPA"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if device.type == "cuda":
        start = cache - visible

        def mask_mod(b, h, i, j):
            return j >= start

        flex_mask = create_block_mask(mask_mod, None, None, 1, cache, device=device, BLOCK_SIZE=128)
        flex = _flex()
        impls["FlexAttention"] = lambda: flex(q, k, v, block_mask=flex_mask, enable_gqa=gqa)
    return _decode_result(
        name, q, k, v, kw, impls, 2 * B * Hkv * visible * D * q.element_size(), cache, window
    )


def _decode_result(name, q, k, v, kw, impls, nbytes, cache, window) -> Case:
    B, Hq, _, D = q.shape
    Hkv = k.shape[1]

    def check() -> str | None:
        with torch.no_grad():  # (two sequences: a ragged batch's shortest and longest)
            rows = [0, B - 1] if B > 1 else [0]
            part = {key: (val[rows] if key == "kv_lens" else val) for key, val in kw.items()}
            got = opforge.attention(q[rows], k[rows], v[rows], **part).double()
            want = reference.attention(q[rows].double(), k[rows].double(), v[rows].double(), **part)
            err = (got - want).abs().max().item()
        return None if err <= 2e-2 else f"max error {err:.2e} against the float64 reference"

    return Case(
        op="attention",
        name=f"decode {name} B{B} H{Hq}/{Hkv} cache {cache} D{D} {'bf16' if q.dtype == torch.bfloat16 else 'fp32'}",
        impls=impls,
        check=check,
        bytes=nbytes,
        params={
            "pattern": f"decode {name}",
            "B": B,
            "H": Hq,
            "Hkv": Hkv,
            "cache": cache,
            "D": D,
            "window": window,
        },
    )


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if device.type == "cuda":
        decode = [partial(_decode_case, device, "causal", 8, 32, 8, 32768, 128, 0)]
        if full:
            decode.append(partial(_decode_case, device, "sliding 4096", 1, 32, 8, 131072, 128, 4096))
            decode.append(partial(_decode_case, device, "ragged", 8, 32, 8, 32768, 128, 0, True))
        return _cuda_cases(device, full) + decode
    builders = [
        partial(_case, device, "sliding 256", 1, 8, 2048, 64, dict(causal=True, window=(255, 0)), False),
        partial(_case, device, "causal", 1, 8, 2048, 64, dict(causal=True), False),
    ]
    if full:
        builders += [
            partial(_case, device, "full", 1, 8, 2048, 64, {}, False),
            partial(_case, device, "causal", 1, 8, 2048, 64, dict(causal=True), True),
            partial(_decode_case, device, "causal", 4, 8, 2, 32768, 64, 0),
            partial(_decode_case, device, "sliding 4096", 1, 8, 2, 131072, 64, 4096),
            partial(_decode_case, device, "ragged", 4, 8, 2, 32768, 64, 0, True),
        ]
    return builders


SPEC = Spec(
    op="attention",
    cases=cases,
    about="opforge.attention vs SDPA and plain PyTorch; on CUDA also FlexAttention and FlashAttention-4 "
    "(where installed)",
)
