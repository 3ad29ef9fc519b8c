"""opforge.attention with per-sequence key counts (kv_lens: NaN past each count, ragged batches) and
paged caches on CUDA: the decode kernels and the chunk forwards, layouts, CUDA graphs replayed with
new counts and tables, paged_kv_append."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    KV_LENS_PATTERNS,
    kv_lens_case,
    to_pages,
)
from attention_cuda_cases import (
    DEV,
    check_forward,
    kernels_run,
    max_err,
    qkv,
)

import opforge
from opforge import reference

pytestmark = pytest.mark.cuda


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


@pytest.mark.parametrize("Hkv", [8, 2])
def test_kv_lens_split_by_tokens_present_cuda_graph(Hkv):
    """The decode kernel's split by the tokens present (each block finds its sequence and chunk from
    a prefix sum of kv_lens on the device), captured once and replayed with counts that move the
    split: more than 32 sequences (the scan's passes), empty ones, one long among short ones, all
    long, all empty; NaN past each count."""
    B, H, S, D = 37, 32, 9000, 128
    q, k, v = qkv(B, H, Hkv, 1, S, D)
    lens = torch.full((B,), S, device=DEV)
    kw = dict(causal=True)
    opforge.attention(q, k, v, kv_lens=lens, **kw)  # warm-up (kernel attributes) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = opforge.attention(q, k, v, kv_lens=lens, return_lse=True, **kw)
    g = torch.Generator(device="cpu").manual_seed(int(torch.randint(1 << 30, ())))
    steps = [
        torch.randint(0, S + 1, (B,), generator=g),
        torch.where(torch.arange(B) == 17, S, torch.randint(0, 200, (B,), generator=g)),
        torch.full((B,), S),
        torch.zeros(B, dtype=torch.long),
        torch.where(torch.arange(B) % 3 == 0, 0, torch.randint(1, 70, (B,), generator=g)),
    ]
    for new in steps:
        lens.copy_(new.to(DEV))
        past = (torch.arange(S, device=DEV)[None, :] >= lens[:, None])[:, None, :, None]
        for t in (k, v):  # (fresh keys each step: NaN only past this step's counts)
            t.copy_(torch.randn_like(t).masked_fill(past, float("nan")))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan")), lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        kc, vc = k.nan_to_num(0.0).double(), v.nan_to_num(0.0).double()
        want, want_lse = reference.attention(q.double(), kc, vc, kv_lens=lens, return_lse=True, **kw)
        assert torch.equal(lse.isinf(), want_lse.isinf()) and not out.isnan().any()
        assert max_err(out, want) < 2e-2
        finite = want_lse.isfinite()
        if finite.any():
            assert (lse[finite].double() - want_lse[finite]).abs().max().item() < 1e-3


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
