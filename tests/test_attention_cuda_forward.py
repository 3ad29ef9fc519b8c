"""opforge.attention's forward on CUDA: every pattern x float16/bfloat16 x head dims (64, 128, 256 and
padded ones) x odd lengths, block and function masks, layouts, SDPA agreement, streams and CUDA
graphs, opcheck and compile, errors, the kernels by name and the rule's choice, segment ids as
documents, persistent grids."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    PATTERNS,
    opcheck_patterns,
    random_segments,
)
from attention_cuda_cases import (
    DEV,
    SHAPES,
    check_forward,
    check_gradients,
    grads,
    kernel_names,
    kernels_run,
    max_err,
    pattern_kwargs,
    qkv,
    random_block_mask,
    reference_grads,
    sequences,
    varlen_case,
    varlen_forward,
)

import opforge
from opforge import reference
from opforge.masks import block_mask

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_forward_matches_reference(dtype, name, shape):
    B, Hq, _, Sq, Sk, _ = shape
    check_forward(*qkv(*shape, dtype=dtype), pattern_kwargs(name, B, Hq, Sq, Sk))


@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=True),
        dict(causal=True, window=(511, 0)),
        dict(causal=True, prefix_len=1024),
        dict(window=(300, 200)),
    ],
    ids=str,
)
def test_forward_long(kw):
    check_forward(*qkv(1, 2, 1, 4097, 4097, 128), kw)


@pytest.mark.parametrize("block", [(64, 64), (128, 128), (64, 256), (192, 64)], ids=str)
def test_function_masks(block):
    B, H, Sq, Sk = 2, 2, 333, 401
    q, k, v = qkv(B, H, 1, Sq, Sk, 64)
    m = block_mask(
        lambda b, h, i, j: ((i * 7 + j * 3 + h) % 5 != 0) & (j <= i + 20 * b),
        B,
        H,
        Sq,
        Sk,
        block_size=block,
        device=DEV,
    )
    check_forward(q, k, v, dict(mask=m))
    check_forward(q, k, v, dict(mask=m, causal=True, window=(100, 0)))
    check_gradients(q, k, v, dict(mask=m))  # the dK/dV pass reads the bits by query (block sizes)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("block", [(128, 128), (256, 128), (128, 256)], ids=str)
def test_staged_mask_bits(D, block):
    # Mask blocks that hold whole Hopper tiles: the producers stage each partial tile's bits in
    # shared memory (at a row and column offset inside the block where the block is larger), the
    # consumers read them there; ragged last tiles, some blocks empty or full, GQA.
    B, Hq, Hkv, S = 1, 4, 2, 517
    q, k, v = qkv(B, Hq, Hkv, S, S, D)
    table = torch.rand(B, Hq, S, S, device=DEV) < 0.7
    blocks = torch.rand(B, Hq, -(-S // block[0]), -(-S // block[1]), device=DEV)
    full = (blocks > 0.8).repeat_interleave(block[0], 2).repeat_interleave(block[1], 3)[..., :S, :S]
    empty = (blocks < 0.15).repeat_interleave(block[0], 2).repeat_interleave(block[1], 3)[..., :S, :S]
    table = (table | full) & ~empty
    m = block_mask(lambda b, h, i, j: table[b, h, i, j], B, Hq, S, S, block_size=block, device=DEV)
    check_forward(q, k, v, dict(mask=m))
    check_forward(q, k, v, dict(mask=m, causal=True))
    check_gradients(q, k, v, dict(mask=m, causal=True))


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("block", [(128, 128), (256, 128), (128, 64), (128, 256)], ids=str)
def test_sparse_mask_long_rows(D, block):
    # More than 32 tiles a row and a column with long empty stretches: the block-mask forms' walks
    # jump over the empty mask blocks (next_mask_block) from the tile where they stand, to a block
    # that may start inside a tile (block 64 < tile 128) or cover several (256); each head its own.
    B, Hq, Hkv, S = 1, 2, 1, 4672
    q, k, v = qkv(B, Hq, Hkv, S, S, D)
    stripe = torch.tensor([3000, 1200], device=DEV)[None, :, None, None]

    def fn(b, h, i, j):
        near = (i - j).abs() < 150
        column = (j >= stripe) & (j < stripe + 100) & (i % 3 == 0)
        corner = (i >= 4000) & (j < 300 + 64 * h)
        return near | column | corner

    m = block_mask(fn, B, Hq, S, S, block_size=block, device=DEV)
    assert m.block_counts()["empty"] > 0.7 * m.kinds.numel()
    check_forward(q, k, v, dict(mask=m))
    check_gradients(q, k, v, dict(mask=m, causal=True))


def test_layouts():
    """(B, S, H, D) views read in place, output laid out like q; sliced and expanded inputs."""
    B, S, H, D = 2, 130, 4, 64
    qs, ks, vs = (torch.randn(B, S, H, D, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    q, k, v = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
    out = opforge.attention(q, k, v, causal=True)
    assert out.stride(1) < out.stride(2)
    check_forward(q, k, v, dict(causal=True))
    big = torch.randn(B, H, 2 * S, 2 * D, dtype=torch.bfloat16, device=DEV)
    check_forward(big[:, :, ::2, 3 : 3 + D], k, v, {})  # rows not 16-byte aligned: copied
    kx = torch.randn(B, 1, S, D, dtype=torch.bfloat16, device=DEV).expand(B, H, S, D)
    check_forward(q, kx, kx, dict(window=(10, 10)))
    go = torch.randn_like(q)
    got = grads(q, k, v, go, dict(causal=True))
    want = grads(q.contiguous(), k.contiguous(), v.contiguous(), go.contiguous(), dict(causal=True))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_matches_sdpa():
    q, k, v = qkv(2, 8, 8, 1024, 1024, 128)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    err = max_err(opforge.attention(q, k, v, causal=True), want)
    assert err <= 2 * max_err(sdpa(q, k, v, is_causal=True), want) + 1e-3
    kg, vg = k[:, :2], v[:, :2]
    want = reference.attention(q.double(), kg.double(), vg.double())
    assert (
        max_err(opforge.attention(q, kg, vg), want)
        <= 2 * max_err(sdpa(q, kg, vg, enable_gqa=True), want) + 1e-3
    )


def test_stream_and_cuda_graph():
    q, k, v = qkv(2, 4, 2, 300, 300, 128)
    want = opforge.attention(q, k, v, causal=True, window=(64, 0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = opforge.attention(q, k, v, causal=True, window=(64, 0))
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    go = torch.randn_like(q)
    with torch.cuda.stream(side):  # warm-up outside the capture
        torch.autograd.grad(opforge.attention(*leaves, causal=True), leaves, go)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = opforge.attention(*leaves, causal=True)
        dq, dk, dv = torch.autograd.grad(out, leaves, go)
    for t, src in zip(leaves, (q, k, v), strict=True):
        with torch.no_grad():
            t.copy_(torch.randn_like(src))
    graph.replay()
    torch.cuda.synchronize()
    want = grads(*leaves, go, dict(causal=True))
    assert torch.equal(out, opforge.attention(*leaves, causal=True))
    for g, w in zip((dq, dk, dv), want, strict=True):
        assert torch.equal(g, w)


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 137, 145, 64))
    opcheck_patterns(q, k, v, random_segments(1, 145).to(DEV), random_block_mask(1, 4, 137, 145), 0.125)


def test_torch_compile_fullgraph():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 256, 256, 64))
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True, window=(8, 0)), fullgraph=True)
    out = f(q, k, v)
    assert torch.equal(out, opforge.attention(q, k, v, causal=True, window=(8, 0)))
    out.float().sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad.isfinite().all()


def test_errors():
    q, k, v = qkv(1, 2, 2, 16, 16, 64)
    # (RuntimeError: tensors whose dtype or shape the CUDA kernels do not take, docs/adding-an-op.md)
    with pytest.raises(
        RuntimeError, match=r"opforge.attention: on CUDA q, k and v must be float16 or bfloat16, got float32"
    ):
        opforge.attention(q.float(), k.float(), v.float())
    big = torch.randn(1, 2, 16, 288, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RuntimeError, match=r"opforge.attention: head_dim up to 256 on CUDA, got 288"):
        opforge.attention(big, big, big)
    with pytest.raises(RuntimeError, match=r"mask_kinds must be on the same device as q"):
        m = block_mask(lambda b, h, i, j: i >= j, None, None, 16, 16)
        torch.ops.opforge.attention.default(
            q, k, v, 1.0, 0.0, False, -1, -1, 0, None, None, m.kinds, m.index, m.bits, 128, 128
        )


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", ["full", "causal", "sliding", "documents", "block mask", "softcap"])
def test_mma_sync_forward_matches_hopper(name, d):
    """The mma.sync forward (other GPUs' kernel) on this GPU too (variant="mma_sync"), against the
    reference, and the default kernel (the Hopper one on an H100/H200) agrees with it."""
    B, Hq, Hkv, Sq, Sk = 2, 4, 2, 300, 333
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, d)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    default = opforge.attention(q, k, v, **kw)
    check_forward(q, k, v, kw, variant="mma_sync")
    mma = opforge.attention(q, k, v, variant="mma_sync", **kw)
    assert (default.float() - mma.float()).abs().max().item() <= 2e-2
    assert kernels_run(lambda: opforge.attention(q, k, v, variant="mma_sync", **kw)) == {
        "attention_fwd_kernel"
    }


def test_kernel_choice():
    """ "auto" follows the documented rule on this GPU (an H100/H200: the Hopper kernels at every
    head dim, the decode kernels for few rows against many keys), as the profiler sees it, and
    Python asks the same rule (torch.ops.opforge._attention_kernel)."""
    assert torch.cuda.get_device_capability() == (9, 0), "these expectations are an sm_90 GPU's"
    rule = torch.ops.opforge._attention_kernel
    # The Hopper forward's schedule (hopper_fwd_persistent): items of few key tiles (at most 8 on
    # average) at head dims 64 and 128 go to the persistent kernel, longer ones and head dim 256 to
    # a block an item.
    persistent = "attention_fwd_hopper_persistent_kernel"
    for d, fwd, bwd in ((64, "hopper", "hopper"), (128, "hopper", "hopper"), (256, "hopper", "hopper")):
        q, k, v = qkv(1, 4, 2, 300, 300, d)
        assert rule(q.device, 4, 2, 300, 300, d) == fwd
        assert rule(q.device, 4, 2, 300, 300, d, backward=True) == bwd
        go = torch.randn_like(q)
        fwd_kernel = persistent if d <= 128 else "attention_fwd_hopper_kernel"
        want = {fwd_kernel} | (
            {"attention_bwd_hopper_kernel", "attention_bwd_hopper_dq_kernel"}
            if bwd == "hopper"
            else {"attention_bwd_kv_kernel", "attention_bwd_q_kernel"}
        )
        assert kernels_run(lambda q=q, k=k, v=v, go=go: grads(q, k, v, go, dict(causal=True))) == want
        assert kernels_run(lambda q=q, k=k, v=v: opforge.attention(q, k, v, variant="hopper")) == {fwd_kernel}
    q, k, v = qkv(1, 4, 2, 1200, 1200, 128)  # (1200 + 128) / 128 key tiles an item: a block an item
    assert kernels_run(lambda: opforge.attention(q, k, v)) == {"attention_fwd_hopper_kernel"}
    assert kernels_run(lambda: opforge.attention(q, k, v, window=(300, 0))) == {persistent}
    # Decode: 4 rows a kv head against 3000 keys, 32 and 64 rows (two and four m tiles); 65 rows
    # are past the decode kernel's
    q, k, v = qkv(2, 8, 2, 1, 3000, 128)
    assert rule(q.device, 8, 2, 1, 3000, 128) == "decode"
    assert kernels_run(lambda: opforge.attention(q, k, v, causal=True)) == {"attention_decode_mma_kernel"}
    for sq in (8, 16):
        qs = torch.randn(2, 8, sq, 128, dtype=torch.bfloat16, device=DEV)
        assert rule(q.device, 8, 2, sq, 3000, 128) == "decode"
        assert kernels_run(lambda qs=qs: opforge.attention(qs, k, v, causal=True)) == {
            "attention_decode_mma_kernel"
        }
    assert rule(q.device, 8, 2, 17, 3000, 128) == "hopper"
    # Few rows but few keys: the tiled kernel; "decode" forces the split
    q, k, v = qkv(2, 8, 2, 1, 300, 128)
    assert kernels_run(lambda: opforge.attention(q, k, v)) == {persistent}
    check_forward(q, k, v, dict(causal=True), variant="decode")
    assert kernels_run(lambda: opforge.attention(q, k, v, variant="decode")) == {
        "attention_decode_mma_kernel"
    }


def test_variant_errors_cuda():
    q, k, v = qkv(1, 4, 2, 100, 100, 256)
    with pytest.raises(
        ValueError,
        match=r"variant 'tiled' has no kernel here; on CUDA the variants are: auto, "
        r"decode, hopper, mma_sync",
    ):
        opforge.attention(q, k, v, variant="tiled")
    with pytest.raises(
        ValueError,
        match=r"variant 'decode' takes at most 32 query rows \(Sq x the GQA group\) per "
        r"kv head at head dim 256, got 200",
    ):
        opforge.attention(q, k, v, variant="decode")
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = opforge.attention(*leaves, variant="hopper")  # (head dim 256 has a Hopper backward too)
    assert kernels_run(lambda: out.float().sum().backward()) == {
        "attention_bwd_hopper_kernel",
        "attention_bwd_hopper_dq_kernel",
    }


def test_operands_tma_cannot_address():
    """Operands whose strides TMA cannot take (a zero batch stride: an expanded tensor) are copied
    for the Hopper kernels, not sent to another kernel."""
    q = torch.randn(1, 4, 200, 64, dtype=torch.bfloat16, device=DEV).expand(3, 4, 200, 64)
    k, v = (
        torch.randn(1, 2, 200, 64, dtype=torch.bfloat16, device=DEV).expand(3, 2, 200, 64) for _ in range(2)
    )
    assert q.stride(0) == 0
    check_forward(q, k, v, dict(causal=True), variant="hopper")
    assert kernels_run(lambda: opforge.attention(q, k, v, causal=True)) == {
        "attention_fwd_hopper_persistent_kernel"
    }


def test_block_mask_built_on_the_cpu():
    """A mask built without device= (on the CPU) serves CUDA inputs: moved to q's device once and
    kept on the mask, so later calls copy nothing."""
    q, k, v = qkv(2, 4, 2, 300, 300, 128)
    m = block_mask(lambda b, h, i, j: (j <= i) & ((i - j) % 3 != 1), None, None, 300, 300)
    assert m.device.type == "cpu"
    check_forward(q, k, v, dict(mask=m))
    kinds = m.tensors_on(q.device)[0]
    assert kinds.device == q.device
    opforge.attention(q, k, v, mask=m)
    assert m.tensors_on(q.device)[0] is kinds
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        opforge.attention(q, k, v, mask=m)
        torch.cuda.synchronize()
    assert not any("Memcpy HtoD" in e.name for e in prof.events())


@pytest.mark.parametrize("d", [64, 128])
def test_unsorted_segment_ids(d):
    """Segment ids need not be sorted: scattered ids make most tiles partial (the tile walk's
    per-32-row id summaries only bound them)."""
    B, H, S = 2, 4, 700
    q, k, v = qkv(B, H, 2, S, S, d)
    seg = torch.randint(0, 3, (B, S), device=DEV)
    seg[:, 256:512] = 7  # and one contiguous run: full and empty tiles next to partial ones
    for kw in (dict(segment_ids=seg), dict(segment_ids=seg, causal=True, window=(300, 0))):
        check_forward(q, k, v, kw)
        go = torch.randn_like(q)
        got = grads(q, k, v, go, kw)
        want = reference_grads(q.double(), k.double(), v.double(), go.double(), kw)
        low = reference_grads(q, k, v, go, kw)
        for g, w, lo in zip(got, want, low, strict=True):
            assert max_err(g, w) <= 2 * max_err(lo, w) + 2e-3


def document_ids(B, S, max_len):
    """Sorted segment ids (B, S): documents of 1 to max_len tokens, each row numbered from 0 (so that
    rows share ids), lengths around a tile's (127, 128, 129) among them."""
    rows = []
    for _ in range(B):
        lens = [1, 127, 128, 129]
        while sum(lens) < S:
            lens.append(int(torch.randint(1, max_len + 1, ()).item()))
        lens = [lens[i] for i in torch.randperm(len(lens)).tolist()]
        rows.append(torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))[:S])
    return torch.stack(rows).to(DEV)


@pytest.mark.parametrize("d", [64, 128])
def test_segment_ids_as_documents(d):
    """Sorted segment ids shared by queries and keys are documents: the persistent forward finds
    their runs on the device and attends within each (as varlen), over more runs than one round of
    the search's block covers; ids the device finds are not runs (q's differing from kv's, an id that
    decreases) take the segment path in the same kernel. The backward (segment path) reads the
    forward's LSE."""
    B, S = 2, 4500
    q, k, v = qkv(B, 4, 2, S, S, d)
    seg = document_ids(B, S, 40)
    for kw in (
        dict(segment_ids=seg),
        dict(segment_ids=seg, causal=True),
        dict(segment_ids=seg, causal=True, window=(100, 0), softcap=30.0),
        dict(segment_ids=(seg.int(), seg.clone())),  # equal ids, two tensors
    ):
        check_forward(q, k, v, kw)
    other = seg.clone()
    other[0, 1000] += 1  # q's ids and kv's differ at one position
    check_forward(q, k, v, dict(segment_ids=(seg, other), causal=True))
    down = seg.clone()
    down[1, 2000:2100] = 0  # an id that decreases, then comes back
    check_forward(q, k, v, dict(segment_ids=down, causal=True))
    check_gradients(*qkv(2, 4, 2, 700, 700, d), dict(segment_ids=document_ids(2, 700, 300), causal=True))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_forward_more_work_than_multiprocessors(d):
    """More query blocks than the GPU has multiprocessors (a persistent grid's blocks take several,
    one after another): dense with GQA and a window, a block mask whose empty block rows leave
    items with nothing to see between others, and many packed sequences (empty ones among them)."""
    q, k, v = qkv(2, 16, 4, 1100, 1100, d)
    check_forward(q, k, v, dict(causal=True, window=(700, 0)))
    S = 1300
    q, k, v = qkv(1, 24, 8, S, S, d)
    rows = torch.rand(1, 24, -(-S // 128), 1, device=DEV) < 0.3  # block rows that see nothing
    table = (torch.rand(1, 24, S, S, device=DEV) < 0.6) & ~rows.repeat_interleave(128, 2)[:, :, :S]
    m = block_mask(lambda b, h, i, j: table[b, h, i, j], 1, 24, S, S, block_size=128, device=DEV)
    check_forward(q, k, v, dict(mask=m))
    lens = torch.randint(0, 400, (48,)).tolist()
    lens[3] = lens[17] = 0
    q, k, v, cu_q, cu_k = varlen_case(lens, lens, 8, 2, d)
    out, _ = varlen_forward(q, k, v, cu_q, cu_k, dict(causal=True))
    out = out.transpose(1, 2).squeeze(0)
    for b, (qb, kb, vb) in enumerate(zip(*(sequences(t, cu_q) for t in (q, k, v)), strict=True)):
        a, e = cu_q[b].item(), cu_q[b + 1].item()
        if e == a:
            continue
        want = reference.attention(qb.double(), kb.double(), vb.double(), causal=True)
        low = reference.attention(qb, kb, vb, causal=True)
        got = out[a:e].unsqueeze(0).transpose(1, 2)
        assert max_err(got, want) <= 2 * max_err(low, want) + 1e-3, b


@pytest.mark.parametrize("d", [64, 128])
def test_forward_items_with_nothing_to_see(d):
    """Query blocks that see no key among ones that do, many to a multiprocessor (short items: the
    Hopper forward's persistent kernel, whose blocks take item after item, some ending at once):
    causal and a window with far more queries than keys (bottom-right aligned), GQA, float16 too."""
    q, k, v = qkv(2, 32, 8, 3000, 200, d)
    check_forward(q, k, v, dict(causal=True))
    check_forward(q, k, v, dict(causal=True, window=(64, 0)))
    check_forward(*qkv(1, 16, 4, 2000, 150, d, dtype=torch.float16), dict(causal=True))


def form_of(q, k, kw, backward=False, deterministic=None):
    """torch.ops.opforge._attention_form for an opforge.attention call's arguments."""
    left, right = kw.get("window", (None, None))
    return torch.ops.opforge._attention_form(
        q.device,
        q.shape[1],
        k.shape[1],
        q.shape[2],
        k.shape[2],
        q.shape[3],
        kw.get("kv_lens") is not None,
        "auto",
        backward,
        batch=q.shape[0],
        causal=kw.get("causal", False),
        window_left=-1 if left is None else left,
        window_right=-1 if right is None else right,
        segments=kw.get("segment_ids") is not None,
        block_mask=kw.get("mask") is not None,
        deterministic=deterministic,
    )


# A form's kernels, by the names the profiler reports (demangled: the traits aliases appear as their
# templates, HopperFwdTraits<kD, kBlockN, kStages, kConsumers, kPingPong, kStageMask, kPersistent,
# kKvCache, kDV, kFp8>; compared with the blanks removed): (kernel, traits, other kernels).
def _fwd_traits(mask=False, persistent=False, cache=False):
    flags = ",".join(str(f).lower() for f in (mask, persistent, cache))
    return f"HopperFwdTraits<128,128,2,2,true,{flags},128,false>"


FORWARD_FORMS = {
    "hopper": ("attention_fwd_hopper_kernel<", _fwd_traits(), ()),
    "hopper/mask": ("attention_fwd_hopper_kernel<", _fwd_traits(mask=True), ()),
    "hopper/cache": ("attention_fwd_hopper_kernel<", _fwd_traits(cache=True), ()),
    "hopper/cache_mask": ("attention_fwd_hopper_kernel<", _fwd_traits(mask=True, cache=True), ()),
    "hopper/persistent": ("attention_fwd_hopper_persistent_kernel<", _fwd_traits(persistent=True), ()),
    "hopper/persistent_runs": (
        "attention_fwd_hopper_persistent_kernel<",
        _fwd_traits(persistent=True),
        ("segment_runs",),
    ),
    "mma_sync": ("attention_fwd_kernel<", "FwdTraits<128,128,64>", ()),
    "decode": ("attention_decode_mma_kernel<", "", ()),
}


def test_forms_are_the_kernels_that_run():
    """torch.ops.opforge._attention_form names the form of the Hopper forward (or the kernel) that a
    call runs, for every form: checked against the kernels the profiler sees (their traits structs),
    and the backward's forms likewise."""
    B, H, S, D = 2, 8, 4096, 128
    q, k, v = qkv(B, H, H, S, S, D)
    ids = torch.arange(S, device=DEV).div(512, rounding_mode="floor").expand(B, S).contiguous()
    mask = block_mask(lambda b, h, i, j: (i // 64 + j // 64) % 3 != 0, None, None, 256, S, device=DEV)
    lens = torch.tensor([S, 1000], device=DEV)
    chunk = q[:, :, :256]
    cases = [
        (q, dict(causal=True), "hopper"),
        (q, dict(causal=True, window=(511, 0)), "hopper/persistent"),
        (q, dict(causal=True, segment_ids=ids), "hopper/persistent_runs"),
        (chunk, dict(mask=mask, kv_lens=None), "hopper/mask"),
        (chunk, dict(kv_lens=lens, causal=True), "hopper/cache"),
        (chunk, dict(kv_lens=lens, mask=mask), "hopper/cache_mask"),
        (q[:, :, :1], dict(kv_lens=lens), "decode"),
    ]
    seen = set()
    for qq, kw, form in cases:
        kw = {key: val for key, val in kw.items() if val is not None}
        assert form_of(qq, k, kw) == form, (form, kw.keys())
        names = [
            n.replace(" ", "") for n in kernel_names(lambda qq=qq, kw=kw: opforge.attention(qq, k, v, **kw))
        ]
        kernel, traits, others = FORWARD_FORMS[form]
        assert any(kernel in n and traits in n for n in names), (form, names)
        for other in others:
            assert any(other in n for n in names), (form, other, names)
        if form == "hopper/persistent":
            assert not any("segment_runs" in n for n in names), names
        seen.add(form)
    names = [
        n.replace(" ", "")
        for n in kernel_names(lambda: opforge.attention(q, k, v, causal=True, variant="mma_sync"))
    ]
    kernel, traits, _ = FORWARD_FORMS["mma_sync"]
    assert any(kernel in n and traits in n for n in names), names
    assert seen | {"mma_sync"} == set(FORWARD_FORMS)
    # the backward's forms
    for kw, det, form, traits in (
        (dict(causal=True), False, "hopper", "HopperBwdTraits<128,64,128,2,false,24,240,false,128>"),
        (
            dict(mask=block_mask(lambda b, h, i, j: i >= j, None, None, S, S, device=DEV)),
            False,
            "hopper/mask",
            "HopperBwdTraits<128,64,128,2,false,24,240,true,128>",
        ),
        # (deterministic at head dim 128: the same kernel, its dQ additions ordered at run time; only head
        # dim 256 has a deterministic form of its own, attention_heuristics.h's hopper_bwd_form)
        (dict(causal=True), True, "hopper", "HopperBwdTraits<128,64,128,2,false,24,240,false,128>"),
    ):
        assert form_of(q, k, kw, backward=True, deterministic=det) == form
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = opforge.attention(qg, kg, vg, deterministic=det, **kw)
        names = [n.replace(" ", "") for n in kernel_names(lambda out=out: out.sum().backward())]
        assert any("attention_bwd_hopper_kernel<" in n and traits in n for n in names), (form, names)
