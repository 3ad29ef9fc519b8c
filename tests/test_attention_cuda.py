"""opforge.attention on CUDA: every pattern x float16/bfloat16 x head dims (64, 128, 256 and padded
ones) x odd lengths (1, 17, 127, 1000, 4097) against a float64 reference with an explicit boolean
mask, within 2x PyTorch's own error in the dtype; Sq != Sk, GQA, fully masked rows, block and
function masks, softcap, gradients, determinism, the LSE's gradient, layouts, streams, CUDA graphs,
opcheck, compile, errors; the decode kernels (few rows, long caches) and per-sequence key counts
(kv_lens: NaN past each count, ragged batches, a CUDA graph replayed with new counts)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import poison_cuda_allocator
from test_attention import (
    KV_LENS_PATTERNS,
    PATTERNS,
    kv_lens_case,
    opcheck_patterns,
    random_segments,
    to_pages,
)

import opforge
from opforge import reference
from opforge.masks import BlockMask, block_mask

pytestmark = pytest.mark.cuda
DEV = "cuda"

# (B, Hq, Hkv, Sq, Sk, D): one token, odd lengths, Sq != Sk both ways, GQA, padded head dims.
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 2, 2, 17, 17, 128),
    (1, 4, 2, 127, 127, 64),
    (2, 4, 1, 33, 150, 128),
    (1, 2, 2, 150, 40, 256),
    (1, 2, 1, 1000, 1000, 96),
    (1, 2, 2, 300, 260, 40),
    # decode: few queries (x the GQA group) against long caches
    (2, 8, 2, 1, 3000, 128),
    (1, 32, 8, 4, 5000, 64),
    (3, 16, 1, 1, 1100, 128),
    (2, 4, 4, 16, 700, 64),
    (1, 8, 2, 2, 900, 256),
    (2, 6, 3, 3, 1200, 80),
    (1, 32, 8, 16, 2000, 128),  # 64 rows: the decode block's most at head dims 64 and 128
    # (the decode kernel's two and four m tiles: rows 17-32 and 33-64, padded ones too)
    (2, 40, 2, 1, 1800, 128),
    (2, 32, 1, 1, 2000, 64),
    (1, 16, 2, 5, 1500, 64),
    (2, 16, 2, 3, 1500, 256),
    (1, 8, 1, 4, 2500, 256),  # 32 rows: the most at head dim 256
]


def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.bfloat16):
    return (
        torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEV),
        torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEV),
        torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEV),
    )


def random_block_mask(B, H, Sq, Sk, block=64, density=0.5):
    """A function mask over random data: some blocks empty, some full, most partial."""
    table = torch.rand(B, H, Sq, Sk, device=DEV) < density
    blocks = torch.rand(B, H, -(-Sq // block), -(-Sk // block), device=DEV)
    table &= (blocks > 0.2).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    table |= (blocks > 0.85).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    return block_mask(lambda b, h, q, kv: table[b, h, q, kv], B, H, Sq, Sk, block_size=block, device=DEV)


def pattern_kwargs(name, B, H, Sq, Sk):
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        kw["segment_ids"] = (
            random_segments(B, Sk).to(DEV)
            if Sq <= Sk
            else (random_segments(B, Sq).to(DEV), random_segments(B, Sk).to(DEV))
        )
    if kw.pop("mask", False):
        kw["mask"] = random_block_mask(B, H, Sq, Sk)
    return kw


def max_err(got, want):
    return (got.double() - want).abs().max().item() if want.numel() else 0.0


def check_forward(q, k, v, kw, variant="auto"):
    poison_cuda_allocator(q.numel() * q.element_size() * 4, DEV)
    out, lse = opforge.attention(q, k, v, return_lse=True, variant=variant, **kw)
    # (the references read k and v without NaN: the kv_lens tests put NaN past each count, which
    # nothing may read)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    want, want_lse = reference.attention(q.double(), k.double(), v.double(), return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())  # exactly the rows that see nothing
    finite = want_lse.isfinite()
    low = reference.attention(q, k, v, **kw)  # PyTorch's own attention in the dtype
    err, torch_err = max_err(out, want), max_err(low, want)
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)
    if finite.any():
        lse_err = (lse.double() - want_lse)[finite].abs().max().item()
        assert lse_err <= 2e-3 * max(1.0, want_lse[finite].abs().max().item()), lse_err
    if not finite.all():
        assert (out[~finite] == 0).all()


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


def grads(q, k, v, go, kw, variant="auto"):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = opforge.attention(*leaves, variant=variant, **kw) if kw is not None else None
    return torch.autograd.grad(out, leaves, go)


def kernels_run(fn):
    """The names of the CUDA kernels fn launched (profiler), opforge's attention ones."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = set()
    for e in prof.events():
        for kernel in KERNELS:
            if kernel + "<" in e.name or e.name.endswith(kernel):
                names.add(kernel)
    return names


# Every attention kernel by its name (csrc/attention/cuda), for kernels_run.
KERNELS = (
    "attention_fwd_hopper_kernel",
    "attention_fwd_hopper_persistent_kernel",
    "attention_fwd_kernel",
    "attention_decode_mma_kernel",
    "attention_decode_kernel",
    "attention_bwd_hopper_kernel",
    "attention_bwd_hopper_dq_kernel",
    "attention_bwd_kv_kernel",
    "attention_bwd_q_kernel",
)


def reference_grads(q, k, v, go, kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(reference.attention(*leaves, **kw), leaves, go)


def check_gradients(q, k, v, kw):
    go = torch.randn_like(q)
    poison_cuda_allocator(q.numel() * 16, DEV)
    got = grads(q, k, v, go, kw)
    kw = {n: x for n, x in kw.items() if n != "deterministic"}
    want = reference_grads(q.double(), k.double(), v.double(), go.double(), kw)
    low = reference_grads(q, k, v, go, kw)  # PyTorch's own bf16 gradients
    for name_, g, w, lo in zip("qkv", got, want, low, strict=True):
        assert g.shape == w.shape and not g.isnan().any()
        err, torch_err = max_err(g, w), max_err(lo, w)
        assert err <= 2 * torch_err + 2e-3, (name_, err, torch_err)


@pytest.mark.parametrize("d", [64, 128, 256, 80])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gradients_match_reference(name, d):
    B, Hq, Hkv, Sq, Sk = 2, 4, 2, 150, 201
    check_gradients(*qkv(B, Hq, Hkv, Sq, Sk, d), pattern_kwargs(name, B, Hq, Sq, Sk))


def test_gradients_float16_and_lse():
    q, k, v = qkv(1, 4, 4, 200, 200, 64, dtype=torch.float16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = opforge.attention(*leaves, causal=True, softcap=20.0, return_lse=True)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out, lse), leaves, (go, gl))
    dl = [t.double().requires_grad_() for t in (q, k, v)]
    wo, wl = reference.attention(*dl, causal=True, softcap=20.0, return_lse=True)
    want = torch.autograd.grad((wo, wl), dl, (go.double(), gl.double()))
    lo = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    lo_o, lo_l = reference.attention(*lo, causal=True, softcap=20.0, return_lse=True)
    low = torch.autograd.grad((lo_o, lo_l.float()), lo, (go, gl))
    for g, w, lw in zip(got, want, low, strict=True):
        assert max_err(g, w) <= 2 * max_err(lw, w) + 2e-3


def test_fully_masked_rows_and_their_gradients():
    B, H, S, D = 1, 2, 200, 64
    dense = torch.rand(B, H, S, S, device=DEV) < 0.3
    dense[:, :, 5] = False  # query 5 sees nothing
    dense[:, :, :, 9] = False  # key 9 is seen by nobody
    mask = BlockMask.from_dense(dense, block_size=64)
    q, k, v = (t.requires_grad_() for t in qkv(B, H, H, S, S, D))
    out, lse = opforge.attention(q, k, v, mask=mask, return_lse=True)
    assert (out[:, :, 5] == 0).all() and (lse[:, :, 5] == -math.inf).all()
    (out.float().sum() + lse[lse.isfinite()].sum()).backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all()
    assert (q.grad[:, :, 5] == 0).all() and (k.grad[:, :, 9] == 0).all() and (v.grad[:, :, 9] == 0).all()
    out, lse = opforge.attention(*qkv(1, 2, 2, 4, 0, 64), return_lse=True)  # Sk = 0
    assert out.shape == (1, 2, 4, 64) and (out == 0).all() and (lse == -math.inf).all()


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize(
    "name", ["full", "causal", "sliding", "prefix", "documents", "block mask", "softcap"]
)
def test_gradients_many_key_blocks(name, d):
    """dQ summed over many key blocks (9 of 128 keys, 18 of 64 at head dim 256; a GQA group of 4 in
    each), by the default unordered additions and by the deterministic mode."""
    B, Hq, Hkv, Sq, Sk = 1, 8, 2, 330, 1100
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, d)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    check_gradients(q, k, v, kw)
    check_gradients(q, k, v, dict(kw, deterministic=True))


@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("kw", [{}, dict(causal=True)], ids=["full", "causal"])
def test_backward_rows_past_the_last_key(kw, D):
    """The one-pass backward sums every key row of a block into dQ: the rows past the last key
    (Sk not a multiple of the key block, 128 or 64) must count for nothing, also when every score
    is far below zero (float16: those rows' P and dS would overflow, and inf times their zero K rows
    is NaN)."""
    Sq, Sk = 130, 200
    # q . k about -160 at every D (scaled: about -20)
    base = (1.6 + 0.05 * torch.randn(1, 2, Sk, D, device=DEV)) * (64 / D) ** 0.5
    q, k = (-base[:, :, :Sq]).half(), base.half()
    v = torch.randn(1, 2, Sk, D, device=DEV, dtype=torch.float16)
    check_gradients(q, k, v, kw)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_backward_deterministic_mode(d):
    """deterministic=True, or None under torch.use_deterministic_algorithms(True): bit-identical
    gradients from run to run (many key blocks adding into each query tile's dQ, a GQA group of 8);
    the default run agrees with them to float32 rounding."""
    q, k, v = qkv(2, 16, 2, 700, 3000, d)
    go = torch.randn_like(q)
    for kw in (dict(causal=True), dict(window=(500, 300)), {}):
        first = grads(q, k, v, go, dict(kw, deterministic=True))
        for _ in range(3):
            again = grads(q, k, v, go, dict(kw, deterministic=True))
            for x, y in zip(first, again, strict=True):
                assert torch.equal(x, y)
        fast = grads(q, k, v, go, kw)
        for x, y in zip(first, fast, strict=True):
            assert (x.float() - y.float()).abs().max().item() <= 2e-2 * y.float().abs().max().item()
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        kw = dict(causal=True)
        first = grads(q, k, v, go, kw)
        again = grads(q, k, v, go, kw)
    finally:
        torch.use_deterministic_algorithms(before)
    for x, y in zip(first, again, strict=True):
        assert torch.equal(x, y)
    assert "attention_bwd_hopper_kernel" in kernels_run(
        lambda: grads(q, k, v, go, dict(causal=True, deterministic=True))
    )


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
    with pytest.raises(
        ValueError, match=r"opforge.attention: on CUDA q, k and v must be float16 or bfloat16, got float32"
    ):
        opforge.attention(q.float(), k.float(), v.float())
    big = torch.randn(1, 2, 16, 288, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=r"opforge.attention: head_dim up to 256 on CUDA, got 288"):
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


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", ["causal", "sliding", "prefix", "documents", "block mask", "softcap"])
def test_mma_sync_gradients(name, d):
    """The mma.sync backward passes (other GPUs' kernels) on this GPU too: against the reference,
    and close to the default (Hopper) passes."""
    B, Hq, Hkv, Sq, Sk = 2, 4, 2, 200, 333
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, d)
    go = torch.randn_like(q)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    default = grads(q, k, v, go, kw)
    got = grads(q, k, v, go, kw, variant="mma_sync")
    want = reference_grads(q.double(), k.double(), v.double(), go.double(), kw)
    low = reference_grads(q, k, v, go, kw)
    for g, dflt, w, lo in zip(got, default, want, low, strict=True):
        err, torch_err = max_err(g, w), max_err(lo, w)
        assert err <= 2 * torch_err + 2e-3, (err, torch_err)
        assert max_err(dflt, w) <= 2 * torch_err + 2e-3
    ran = kernels_run(lambda: grads(q, k, v, go, kw, variant="mma_sync"))
    assert ran == {"attention_fwd_kernel", "attention_bwd_kv_kernel", "attention_bwd_q_kernel"}


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


# ---- the decode kernel with per-sequence key counts (kv_lens) ----------------------------------

# (B, Hq, Hkv, Sq, Sk, D): GQA groups of 1-64 rows at every head dim (padded ones too), short and
# long caches; the last has more rows than the decode kernel takes (the block-mask path).
KV_LENS_SHAPES = [
    (3, 32, 8, 1, 5000, 128),
    (2, 8, 2, 4, 1300, 64),
    (3, 16, 1, 1, 777, 256),
    (2, 6, 3, 3, 300, 80),
    (2, 4, 4, 16, 600, 128),
    (2, 64, 1, 1, 500, 128),
    (3, 8, 8, 1, 100, 64),
    (2, 16, 2, 16, 300, 64),
    (40, 8, 8, 1, 700, 128),  # (one chunk a kv head)
    (24, 16, 8, 1, 600, 256),
    (2, 24, 1, 1, 900, 64),  # (the decode kernel's two and four m tiles)
    (2, 8, 2, 12, 1000, 64),
    (2, 16, 4, 6, 700, 256),
    (3, 16, 4, 40, 900, 128),  # (chunks of new queries past the decode kernel's rows: the mma.sync forward)
    (2, 8, 2, 70, 600, 64),
    (2, 8, 4, 33, 500, 256),
]


def check_kv_lens(q, k, v, lens, kw):
    check_forward(q, k, v, {**kw, "kv_lens": lens})


@pytest.mark.parametrize("shape", KV_LENS_SHAPES, ids=str)
@pytest.mark.parametrize("name", KV_LENS_PATTERNS)
def test_kv_lens_matches_reference(name, shape):
    check_kv_lens(*kv_lens_case(shape, name, device=DEV, dtype=torch.bfloat16))


@pytest.mark.parametrize("variant", ["hopper", "mma_sync"])
@pytest.mark.parametrize("shape", [s for s in KV_LENS_SHAPES if s[3] * s[1] // s[2] > 64], ids=str)
@pytest.mark.parametrize("name", ["causal", "sliding", "softcap", "documents", "block mask"])
def test_kv_lens_chunks_on_each_forward(name, shape, variant):
    """A chunk of new queries against per-sequence key counts (NaN past each count) on either tiled
    forward by name: the Hopper forward's KV-cache forms (the ragged last V tile's rows past the count
    zeroed before P V) and the mma.sync forward."""
    q, k, v, lens, kw = kv_lens_case(shape, name, device=DEV, dtype=torch.bfloat16)
    check_forward(q, k, v, {**kw, "kv_lens": lens}, variant=variant)


def test_decode_layouts():
    """transformers' (B, S, H, D) views decode as contiguous tensors do."""
    B, H, Hkv, S, D = 2, 16, 4, 3000, 128
    q = torch.randn(B, 1, H, D, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(B, S, Hkv, D, dtype=torch.bfloat16, device=DEV)
    v = torch.randn(B, S, Hkv, D, dtype=torch.bfloat16, device=DEV)
    views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    dense = tuple(t.contiguous() for t in views)
    for kw in (dict(causal=True), dict(causal=True, window=(1023, 0))):
        assert torch.equal(opforge.attention(*views, **kw), opforge.attention(*dense, **kw))


def test_kv_lens_cuda_graph():
    """A decode step captured once replays with the counts (and the new token's K/V) updated in
    place: nothing is read on the host."""
    B, H, Hkv, S, D = 3, 32, 8, 4096, 128
    q, k, v = qkv(B, H, Hkv, 1, S, D)
    lens = torch.tensor([100, 2000, 4096], device=DEV)
    kw = dict(causal=True, window=(1023, 0))
    opforge.attention(q, k, v, kv_lens=lens, **kw)  # warm-up (kernel attributes) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = opforge.attention(q, k, v, kv_lens=lens, **kw)
    for step in range(3):
        lens.copy_(torch.tensor([101 + step, 2001 + 700 * step, 4096 - step], device=DEV))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, opforge.attention(q, k, v, kv_lens=lens, **kw))
        want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, **kw)
        assert max_err(out, want) < 2e-2


# ---- paged KV caches (block_table) and paged_kv_append ----------------------------------------


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("name", ["causal", "sliding", "softcap"])
def test_paged_cache_matches_reference(name, page_size):
    """Decode and a chunk of queries against paged caches (pages in a random order, garbage table
    entries past each sequence's pages): the contiguous cache's result."""
    # (the last two: one chunk a kv head; head dim 256)
    for shape in (
        (4, 32, 8, 1, 3000, 128),
        (3, 8, 2, 5, 700, 64),
        (48, 8, 8, 1, 900, 128),
        (2, 16, 4, 1, 2000, 256),
        (3, 16, 4, 40, 900, 128),  # (chunked prefill: the Hopper forward's KV-cache form)
        (2, 8, 2, 70, 600, 64),
        (2, 8, 4, 33, 500, 256),
    ):
        q, k, v, lens, kw = kv_lens_case(shape, name, device=DEV, dtype=torch.bfloat16)
        kc, vc, table = to_pages(k, v, lens.cpu(), page_size)
        out = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, **kw)
        kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
        want = reference.attention(q.double(), kd, vd, kv_lens=lens, **kw)
        assert not out.isnan().any()
        assert max_err(out, want) < 2e-2


def test_paged_decode_reads_the_pages_in_place():
    """A paged decoding call runs the decode kernel on the pages (no gathered copy of them first), a
    chunk too long for the decode kernel the mma.sync forward on them; a block mask, or a gradient,
    gathers them and is still right."""
    q, k, v, lens, kw = kv_lens_case((2, 32, 8, 1, 4000, 128), "causal", device=DEV, dtype=torch.float16)
    kc, vc, table = to_pages(k, v, lens.cpu(), 16)

    def copies(fn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if "index" in e.name.lower() or "gather" in e.name.lower()]

    call = lambda: opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, **kw)  # noqa: E731
    assert kernels_run(call) == {"attention_decode_mma_kernel"}
    assert copies(call) == []
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    assert max_err(call(), reference.attention(q.double(), kd, vd, kv_lens=lens, **kw)) < 2e-2
    q_long = torch.randn(2, 32, 40, 128, dtype=torch.float16, device=DEV)
    want = reference.attention(q_long.double(), kd, vd, kv_lens=lens, **kw)
    for variant, kernel in (("auto", "attention_fwd_hopper_kernel"), ("mma_sync", "attention_fwd_kernel")):
        long_call = lambda variant=variant: opforge.attention(  # noqa: E731
            q_long, kc, vc, kv_lens=lens, block_table=table, variant=variant, **kw
        )
        assert kernels_run(long_call) == {kernel}
        assert copies(long_call) == []
        assert max_err(long_call(), want) < 2e-2

        # the same chunk on the contiguous cache: the same kernel, no block mask built
        def contiguous(variant=variant):
            return opforge.attention(q_long, k, v, kv_lens=lens, variant=variant, **kw)

        assert kernels_run(contiguous) == {kernel}
        assert max_err(contiguous(), want) < 2e-2
    masked = lambda: opforge.attention(  # noqa: E731
        q_long,
        kc,
        vc,
        kv_lens=lens,
        block_table=table,
        mask=opforge.block_mask(lambda b, h, i, j: j % 3 != 0, 2, None, 40, table.shape[1] * 16, device=DEV),
        **kw,
    )
    assert copies(masked) != []
    q_grad = q_long.clone().requires_grad_()
    got = opforge.attention(q_grad, kc, vc, kv_lens=lens, block_table=table, **kw)
    assert max_err(got.detach(), want) < 2e-2
    # the Hopper forward's boxes tile page sizes that divide its key tile or are multiples of it
    kc24, vc24, table24 = to_pages(k, v, lens.cpu(), 24)
    with pytest.raises(
        ValueError, match=r"variant 'hopper' reads paged caches whose page size .* got page size 24"
    ):
        opforge.attention(q_long, kc24, vc24, kv_lens=lens, block_table=table24, variant="hopper", **kw)
    got = opforge.attention(q_long, kc24, vc24, kv_lens=lens, block_table=table24, **kw)
    assert max_err(got, want) < 2e-2


def replay_paged_step(B, H, Hkv, P, S_new, lens_first, lens_next, variant="auto"):
    """A serving step (paged_kv_append of S_new new tokens a sequence, then their attention over the
    pages) captured once in a CUDA graph and replayed with the counts, the table and the tokens
    updated in place (nothing read on the host), the output poisoned before each replay; each
    replay is checked against the reference on the pages in table order. lens_next(i): the counts
    of replay i."""
    D, ps = 128, 16
    pages = B * P
    kc = torch.randn(pages, ps, Hkv, D, dtype=torch.bfloat16, device=DEV)
    vc = torch.randn_like(kc)
    table = torch.randperm(pages, device=DEV).view(B, P).to(torch.int32)
    lens = torch.tensor(lens_first, device=DEV)
    q = torch.randn(B, H, S_new, D, dtype=torch.bfloat16, device=DEV)
    k_new, v_new = (torch.randn(B, Hkv, S_new, D, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    after = torch.empty_like(lens)

    def step():
        opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens)
        after.copy_(lens + S_new)
        return opforge.attention(q, kc, vc, kv_lens=after, block_table=table, causal=True, variant=variant)

    step()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i in range(3):
        lens.copy_(torch.tensor(lens_next(i), device=DEV))
        table.copy_(torch.randperm(pages, device=DEV).view(B, P))
        for t in (q, k_new, v_new):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        k = kc[table.long()].flatten(1, 2).transpose(1, 2)  # (B, Hkv, P x ps, D), the pages in order
        v = vc[table.long()].flatten(1, 2).transpose(1, 2)
        for b in range(B):  # the new tokens in their slots
            assert torch.equal(k[b, :, lens[b] : lens[b] + S_new], k_new[b])
        want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens + S_new, causal=True)
        assert max_err(out, want) < 2e-2


@pytest.mark.parametrize("variant", ["auto", "mma_sync"])
def test_paged_chunk_cuda_graph(variant):
    """A chunked-prefill step (48 new tokens a sequence: the Hopper forward's KV-cache form, or
    mma.sync) replays in a CUDA graph with new counts, table and tokens."""
    replay_paged_step(2, 16, 4, 40, 48, [100, 500], lambda i: [37 + 100 * i, 590 - 7 * i], variant)


def test_paged_decode_cuda_graph():
    """A decode step (one new token a sequence: the decode kernel) replays in a CUDA graph with new
    counts, table and token."""
    replay_paged_step(3, 32, 8, 64, 1, [100, 700, 1000], lambda i: [101 + i, 50 + 300 * i, 1020 - i])


def test_paged_kv_append_drops_what_the_table_does_not_hold():
    """On CUDA a new token past its sequence's table, or whose page number is not a page, is not
    written (the CPU raises); every other token is, the one at page 0 slot 0 included, and nothing
    else changes."""
    Hkv, D, ps = 2, 64, 8
    kc = torch.randn(6, ps, Hkv, D, dtype=torch.bfloat16, device=DEV)
    vc = torch.randn_like(kc)
    before_k, before_v = kc.clone(), vc.clone()
    # sequence 0: 2 pages (0, 3), 14 keys: new tokens 14, 15 fit, 16-18 do not; sequence 1: page 9
    # does not exist; sequence 2: page 5 then a negative entry, new tokens at 7 (page 5), 8-11 dropped
    table = torch.tensor([[0, 3], [9, 1], [5, -1]], dtype=torch.int32, device=DEV)
    lens = torch.tensor([14, 0, 7], device=DEV)
    k_new = torch.randn(3, Hkv, 5, D, dtype=torch.bfloat16, device=DEV)
    v_new = torch.randn_like(k_new)
    lens0 = torch.tensor([-2, 0, 7], device=DEV)  # and one with a negative count: its first two dropped
    opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens)
    want_k, want_v = before_k.clone(), before_v.clone()
    for b, page, slot, i in ((0, 3, 6, 0), (0, 3, 7, 1), (2, 5, 7, 0)):
        want_k[page, slot], want_v[page, slot] = k_new[b, :, i], v_new[b, :, i]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    k_new[0, :, 2] = -0.0  # (the token at page 0, slot 0: its sign kept)
    opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens0)  # tokens 2-4 of sequence 0: page 0
    for i in range(2, 5):
        want_k[0, i - 2], want_v[0, i - 2] = k_new[0, :, i], v_new[0, :, i]
    want_k[5, 7], want_v[5, 7] = k_new[2, :, 0], v_new[2, :, 0]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and kc[0, 0].signbit().all()


# ---- packed variable-length sequences (cu_seqlens) -------------------------------------------

# Query and key lengths of the packed sequences: empty ones on either side, one row, tile edges
# (63 / 64 / 65, 127 / 128 / 129), Sq != Sk both ways.
VARLEN_Q = [0, 1, 63, 64, 65, 127, 128, 129, 300, 1000, 7]
VARLEN_K = [5, 0, 64, 200, 65, 127, 128, 129, 280, 1000, 7]
VARLEN_PATTERNS = {
    "full": {},
    "causal": dict(causal=True),
    "sliding": dict(causal=True, window=(64, 0)),
    "window": dict(window=(100, 30)),
    "softcap": dict(causal=True, softcap=30.0),
}


def varlen_case(lens_q, lens_k, hq, hkv, d, dtype=torch.bfloat16):
    """Packed (total, H, D) q, k, v and their int32 offsets."""
    cu = [
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
        for n in (lens_q, lens_k)
    ]
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype, device=DEV)
    k, v = (torch.randn(sum(lens_k), hkv, d, dtype=dtype, device=DEV) for _ in range(2))
    return q, k, v, cu[0], cu[1]


def varlen_args(kw):
    window = kw.get("window", (-1, -1))
    return (
        kw.get("softcap", 0.0),
        kw.get("causal", False),
        window[0],
        window[1],
        0,
        None,
        None,
        None,
        None,
        None,
        128,
        128,
    )


def varlen_forward(q, k, v, cu_q, cu_k, kw, variant="auto", deterministic=None):
    """The op on the (1, H, total, D) views: out (total, H, D), lse (H, total)."""
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    out, lse = torch.ops.opforge.attention.default(
        q4,
        k4,
        v4,
        q.shape[-1] ** -0.5,
        *varlen_args(kw),
        variant=variant,
        deterministic=deterministic,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )
    return out, lse


def varlen_backward(q, k, v, cu_q, cu_k, go, kw, variant="auto", deterministic=None):
    q4, k4, v4, go4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, go))
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, kw, variant, deterministic)
    grads = torch.ops.opforge.attention_backward.default(
        go4,
        q4,
        k4,
        v4,
        out,
        lse,
        None,
        q.shape[-1] ** -0.5,
        *varlen_args(kw),
        variant=variant,
        deterministic=deterministic,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )
    return [g.transpose(1, 2).squeeze(0) for g in grads]


def sequences(t, cu):
    """The packed sequences of t (total, H, D) as (1, H, S, D) views."""
    cu = cu.tolist()
    return [t[a:b].unsqueeze(0).transpose(1, 2) for a, b in itertools.pairwise(cu)]


@pytest.mark.parametrize(
    "d, variant", [(64, "hopper"), (128, "hopper"), (128, "mma_sync"), (256, "auto"), (80, "auto")]
)
@pytest.mark.parametrize("name", list(VARLEN_PATTERNS))
def test_varlen_matches_reference(name, d, variant):
    """Each packed sequence as its own attention (float64 reference, within 2x PyTorch's error in
    bfloat16): the forward (out, LSE) and the backward (dq, dk, dv), a GQA group of 2."""
    kw = VARLEN_PATTERNS[name]
    q, k, v, cu_q, cu_k = varlen_case(VARLEN_Q, VARLEN_K, 4, 2, d)
    go = torch.randn_like(q)
    poison_cuda_allocator(q.numel() * 32, DEV)
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, kw, variant)
    out = out.transpose(1, 2).squeeze(0)
    assert out.shape == q.shape and lse.shape == (1, 4, q.shape[0])
    got_grads = varlen_backward(q, k, v, cu_q, cu_k, go, kw, variant)
    lse = lse[0]
    for b, (qb, kb, vb, gob) in enumerate(
        zip(*(sequences(t, c) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k), (go, cu_q))), strict=True)
    ):
        a, e = cu_q[b].item(), cu_q[b + 1].item()
        ka, ke = cu_k[b].item(), cu_k[b + 1].item()
        got = out[a:e].unsqueeze(0).transpose(1, 2)
        if qb.shape[2] and kb.shape[2]:
            want, want_lse = reference.attention(qb.double(), kb.double(), vb.double(), return_lse=True, **kw)
            low = reference.attention(qb, kb, vb, **kw)
            assert max_err(got, want) <= 2 * max_err(low, want) + 1e-3, b
            finite = want_lse[0].isfinite()
            assert torch.equal(lse[:, a:e].isinf(), ~finite), b
            if finite.any():
                assert (lse[:, a:e].double() - want_lse[0])[finite].abs().max().item() <= 2e-2, b
            want_g = reference_grads(qb.double(), kb.double(), vb.double(), gob.double(), kw)
            low_g = reference_grads(qb, kb, vb, gob, kw)
            for name_, g, w, lo in zip("qkv", got_grads, want_g, low_g, strict=True):
                rows = (a, e) if name_ == "q" else (ka, ke)
                gb = g[rows[0] : rows[1]].unsqueeze(0).transpose(1, 2)
                assert not gb.isnan().any(), (b, name_)
                assert max_err(gb, w) <= 2 * max_err(lo, w) + 2e-3, (b, name_)
        else:  # nothing to see: zeros, LSE -inf, zero gradients
            assert (got == 0).all() and lse[:, a:e].isneginf().all(), b
            assert (got_grads[0][a:e] == 0).all() and (got_grads[1][ka:ke] == 0).all(), b
            assert (got_grads[2][ka:ke] == 0).all(), b


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


@pytest.mark.parametrize("d", [64, 128])
def test_varlen_many_sequences(d):
    """More sequences than a warp's lanes squared: the kernels find a tile's sequence by a 32-way
    warp search (three rounds past 1024 sequences). 1100 short sequences, empty ones among them,
    and longer ones around the rounds' edges; causal, GQA; forward (out, LSE) and backward against
    float64."""
    lens = torch.randint(0, 9, (1100,))
    lens[[0, 31, 32, 500, 1023, 1024, 1099]] = torch.tensor([129, 0, 200, 300, 130, 0, 257])
    lens = lens.tolist()
    q, k, v, cu_q, cu_k = varlen_case(lens, lens, 4, 2, d)
    go = torch.randn_like(q)
    poison_cuda_allocator(q.numel() * 32, DEV)
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, dict(causal=True))
    out = out.transpose(1, 2).squeeze(0)
    got_grads = varlen_backward(q, k, v, cu_q, cu_k, go, dict(causal=True), "auto")
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want, want_lse = reference.attention_varlen(*leaves, cu_q, cu_k, causal=True, return_lse=True)
    want_g = torch.autograd.grad(want, leaves, go.double())
    low_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    low = reference.attention_varlen(*low_leaves, cu_q, cu_k, causal=True)
    low_g = torch.autograd.grad(low, low_leaves, go)
    assert max_err(out, want.detach()) <= 2 * max_err(low.detach(), want.detach()) + 1e-3
    assert (lse[0].double() - want_lse).abs().max().item() <= 2e-2
    for name, g, w, lo in zip("qkv", got_grads, want_g, low_g, strict=True):
        assert not g.isnan().any(), name
        assert max_err(g, w) <= 2 * max_err(lo, w) + 2e-3, name


def test_varlen_deterministic_and_kernels():
    """deterministic=True: bit-identical gradients from run to run over many packed sequences;
    the Hopper kernels serve varlen calls (head dims 64 and 128)."""
    lens = [700, 1500, 3, 129, 900]
    q, k, v, cu_q, cu_k = varlen_case(lens, lens, 8, 2, 128)
    go = torch.randn_like(q)
    kw = dict(causal=True)
    first = varlen_backward(q, k, v, cu_q, cu_k, go, kw, deterministic=True)
    for _ in range(2):
        again = varlen_backward(q, k, v, cu_q, cu_k, go, kw, deterministic=True)
        for x, y in zip(first, again, strict=True):
            assert torch.equal(x, y)
    fast = varlen_backward(q, k, v, cu_q, cu_k, go, kw)
    for x, y in zip(first, fast, strict=True):
        assert (x.float() - y.float()).abs().max().item() <= 2e-2 * y.float().abs().max().item()
    names = kernels_run(lambda: varlen_backward(q, k, v, cu_q, cu_k, go, kw))
    # (short sequences: the forward's persistent kernel)
    assert {"attention_fwd_hopper_persistent_kernel", "attention_bwd_hopper_kernel"} <= names, names


def test_varlen_cuda_graph_with_new_offsets():
    """A varlen call captured in a CUDA graph (no host synchronization in it) replays with offsets
    updated in place: the same result as a fresh call with the new offsets."""
    q, k, v, cu_q, cu_k = varlen_case([300, 200, 524], [300, 200, 524], 4, 4, 128)
    kw = dict(causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        varlen_forward(q, k, v, cu_q, cu_k, kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = varlen_forward(q, k, v, cu_q, cu_k, kw)
    new = torch.tensor([0, 100, 700, 1024], dtype=torch.int32, device=DEV)
    cu_q.copy_(new)
    cu_k.copy_(new)
    graph.replay()
    want, _ = varlen_forward(q, k, v, new.clone(), new.clone(), kw)
    assert torch.equal(out, want)


def test_varlen_errors_cuda():
    """Offsets read on the host: a ValueError naming the op and the argument."""
    q, k, v, cu_q, cu_k = varlen_case([10, 20], [10, 20], 2, 2, 64)
    bad = torch.tensor([0, 25, 20], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"opforge\.attention: cu_seqlens_q must not decrease"):
        varlen_forward(q, k, v, bad, cu_k, {})
    with pytest.raises(ValueError, match="cu_seqlens_k must end at the packed length 30"):
        varlen_forward(q, k, v, cu_q, torch.tensor([0, 10, 29], dtype=torch.int32, device=DEV), {})
    with pytest.raises(ValueError, match="variant 'decode' does not take packed sequences"):
        varlen_forward(q, k, v, cu_q, cu_k, {}, variant="decode")


@pytest.mark.parametrize(
    "d, lens_q, lens_k, bad_q, bad_k",
    [
        (
            128,
            [128, 128, 128],
            [100, 100, 200],
            None,
            [0, 300, 100, 400],
        ),  # a sequence's key block never runs
        (
            64,
            [100, 100, 200],
            [128, 128, 128],
            [0, 300, 100, 400],
            None,
        ),  # two sequences' tiles share a counter
    ],
)
def test_varlen_deterministic_replay_with_invalid_offsets_finishes(d, lens_q, lens_k, bad_q, bad_k):
    """Offsets only a CUDA-graph replay can bring (no host check there) must not hang the
    deterministic backward's ordered dQ additions: the prep kernel flags them and the replay
    finishes (its values mean nothing); valid offsets replayed again give the fresh result."""
    q, k, v, cu_q, cu_k = varlen_case(lens_q, lens_k, 4, 2, d)
    go = torch.randn_like(q)
    good_q, good_k = cu_q.clone(), cu_k.clone()
    run = lambda: varlen_backward(q, k, v, cu_q, cu_k, go, {}, deterministic=True)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = run()
    if bad_q is not None:
        cu_q.copy_(torch.tensor(bad_q, dtype=torch.int32))
    if bad_k is not None:
        cu_k.copy_(torch.tensor(bad_k, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()  # (a hang would stop here)
    cu_q.copy_(good_q)
    cu_k.copy_(good_k)
    graph.replay()
    want = varlen_backward(q, k, v, good_q, good_k, go, {}, deterministic=True)
    for x, y in zip(grads, want, strict=True):
        assert torch.equal(x, y)
