"""opforge.attention with per-sequence key counts (kv_lens) and paged caches (block_table), and
opforge.paged_kv_append, on the CPU."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    KV_LENS_PATTERNS,
    KV_LENS_SHAPES,
    check_kv_lens,
    kv_lens_case,
    qkv,
    to_pages,
)

import opforge
from opforge import reference


@pytest.mark.parametrize("shape", KV_LENS_SHAPES, ids=str)
@pytest.mark.parametrize("name", KV_LENS_PATTERNS)
def test_kv_lens_matches_reference(name, shape):
    check_kv_lens(*kv_lens_case(shape, name), tol=2e-5)


@pytest.mark.parametrize("page_size", [16, 7, 256])
@pytest.mark.parametrize("shape", [*KV_LENS_SHAPES[:3], KV_LENS_SHAPES[-1]], ids=str)
@pytest.mark.parametrize("name", ["full", "causal", "sliding", "softcap"])
def test_paged_cache_matches_reference(name, shape, page_size):
    """attention(q, k_cache, v_cache, kv_lens=, block_table=) reads sequence b's key j from its
    page: the result of the contiguous cache's call, against the float64 reference."""
    q, k, v, lens, kw = kv_lens_case(shape, name)
    kc, vc, table = to_pages(k, v, lens, page_size)
    out, lse = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, return_lse=True, **kw)
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    want, want_lse = reference.attention(q.double(), kd, vd, kv_lens=lens, return_lse=True, **kw)
    assert not out.isnan().any()
    assert (out.double() - want).abs().max().item() <= 2e-5
    assert torch.equal(lse.isinf(), want_lse.isinf())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [7, 16, 256])
@pytest.mark.parametrize("name", ["causal", "sliding", "softcap", "prefix"])
def test_paged_decode_reads_the_pages_in_place(name, page_size, dtype):
    """A decoding call on paged caches runs the decode kernel on the pages themselves (no gathered
    copy: no index_select in the profile) and gives the contiguous cache's result (the same kernel
    and key blocks; the split into chunks may differ with the table's length); q with gradients
    gathers the pages instead."""
    torch.manual_seed(page_size)
    q, k, v, lens, kw = kv_lens_case((3, 8, 2, 2, 700, 32), name, dtype=dtype)
    kc, vc, table = to_pages(k, v, lens, page_size)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, return_lse=True, **kw)
    ops = {e.name for e in prof.events()}
    assert "opforge::attention_paged" in ops and not any("index_select" in n for n in ops)
    want, want_lse = opforge.attention(q, k, v, kv_lens=lens, return_lse=True, **kw)
    tight = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=8e-3, rtol=0)
    torch.testing.assert_close(out, want, **tight)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-6)
    qg = q.detach().clone().requires_grad_(True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = opforge.attention(qg, kc, vc, kv_lens=lens, block_table=table, **kw)
    assert any("index_select" in e.name for e in prof.events())
    kd, vd = k.double().nan_to_num(0.0), v.double().nan_to_num(0.0)
    ref = reference.attention(q.double(), kd, vd, kv_lens=lens, **kw)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert (got.double() - ref).abs().max().item() <= tol


def test_paged_kv_append_then_attend():
    """Prompts written by paged_kv_append (a sequence alone, then chunks for the whole batch from
    different lengths), then decode steps of one token: the caches hold each token at its page and
    slot (nothing else written), and attention over them equals the contiguous cache's."""
    torch.manual_seed(0)
    B, H, Hkv, D, ps = 3, 4, 2, 16, 8
    table = torch.randperm(40)[:24].view(B, 8).to(torch.int32)
    kc = torch.full((40, ps, Hkv, D), float("nan"))
    vc = kc.clone()
    full_k, full_v = torch.randn(B, Hkv, 64, D), torch.randn(B, Hkv, 64, D)
    lens = torch.tensor([3, 0, 10])
    for b in range(B):  # each sequence's first tokens on its own
        n = int(lens[b])
        opforge.paged_kv_append(
            kc,
            vc,
            full_k[b : b + 1, :, :n],
            full_v[b : b + 1, :, :n],
            table[b : b + 1],
            torch.zeros(1, dtype=torch.int64),
        )
    for n in (5, 9, 16):  # then chunks for all, each at its own length
        idx = lens[:, None] + torch.arange(n)[None, :]
        k_new = torch.stack([full_k[b][:, idx[b]] for b in range(B)])
        v_new = torch.stack([full_v[b][:, idx[b]] for b in range(B)])
        opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens.to(torch.int32))
        lens += n
    for _ in range(3):  # decode: one new token a sequence, then attend
        k_new = torch.stack([full_k[b, :, int(lens[b]) : int(lens[b]) + 1] for b in range(B)])
        v_new = torch.stack([full_v[b, :, int(lens[b]) : int(lens[b]) + 1] for b in range(B)])
        opforge.paged_kv_append(kc, vc, k_new, v_new, table, lens)
        lens += 1
        q = torch.randn(B, H, 1, D)
        out = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True)
        want = opforge.attention(q, full_k, full_v, kv_lens=lens, causal=True)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    written = torch.zeros(40, ps, dtype=torch.bool)
    for b in range(B):
        for pos in range(int(lens[b])):
            page, slot = table[b, pos // ps], pos % ps
            written[page, slot] = True
            assert torch.equal(kc[page, slot], full_k[b, :, pos]) and torch.equal(
                vc[page, slot], full_v[b, :, pos]
            )
    assert kc[~written].isnan().all() and vc[~written].isnan().all()


def test_kv_lens_full_counts_equal_no_counts():
    q, k, v = qkv(2, 4, 2, 2, 500, 32)
    lens = torch.tensor([500, 500])
    for kw in (dict(causal=True), dict(causal=True, window=(99, 0)), {}):
        assert torch.allclose(
            opforge.attention(q, k, v, kv_lens=lens, **kw), opforge.attention(q, k, v, **kw), atol=1e-6
        )


def test_kv_lens_is_a_prefix_of_the_cache():
    """Sequence b with kv_lens equals the same sequence with its cache cut to its count."""
    q, k, v = qkv(3, 8, 2, 2, 600, 32)
    lens = torch.tensor([600, 257, 33])
    out = opforge.attention(q, k, v, kv_lens=lens, causal=True, window=(127, 0))
    for b, n in enumerate(lens.tolist()):
        one = opforge.attention(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=True, window=(127, 0)
        )
        assert torch.allclose(out[b : b + 1], one, atol=1e-6)


def test_kv_lens_gradients_match_reference():
    q, k, v, lens, kw = kv_lens_case((2, 4, 2, 3, 150, 16), "sliding", dtype=torch.float64)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = opforge.attention(q, k, v, kv_lens=lens, **kw)
    want = reference.attention(q, k, v, kv_lens=lens, **kw)
    g = torch.randn_like(out)
    got_grads = torch.autograd.grad(out, (q, k, v), g)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    assert (out - want).abs().max().item() < 1e-10
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a - b).abs().max().item() < 1e-9


@pytest.mark.parametrize("variant,sq", [("auto", 40), ("tiled", 1), ("decode", 2), ("auto", 1)])
def test_paged_op_reads_in_place_or_gathers(variant, sq):
    """torch.ops.opforge.attention_paged takes every call without gradients: its own kernel choice
    reads the pages in place (the decode kernel on the CPU) or gathers them (the tiled kernel), in C++;
    int64 tables too. The result is the reference's on the same keys."""
    q, k, v = qkv(2, 4, 2, sq, 300, 16)
    lens = torch.tensor([300, 123])
    kc, vc, table = to_pages(k, v, lens, 16)
    for t in (table, table.long()):
        out, lse = torch.ops.opforge.attention_paged(q, kc, vc, lens, t, 0.25, 0.0, True, -1, -1, 0, variant)
        want, want_lse = reference.attention(
            q.double(), k.double(), v.double(), kv_lens=lens, causal=True, scale=0.25, return_lse=True
        )
        assert (out.double() - want).abs().max() < 2e-5 and (lse.double() - want_lse).abs().max() < 2e-5
        assert torch.equal(
            out,
            opforge.attention(
                q, kc, vc, kv_lens=lens, block_table=t, causal=True, scale=0.25, variant=variant
            ),
        )


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
def test_paged_kv_append_refuses_expanded_caches(which):
    """Caches with elements that share memory (an expanded view: two pages one storage) would have
    one token written over another: a RuntimeError naming the argument, from the wrapper, the raw op
    and the fake kernel (torch.compile) alike, before anything is written."""
    D = 8
    bt, lens = torch.tensor([[0], [1]]), torch.tensor([0, 0])
    caches = {"k_cache": torch.zeros(4, 4, 1, D), "v_cache": torch.zeros(4, 4, 1, D)}
    caches[which] = torch.zeros(1, 4, 1, D).expand(4, -1, -1, -1)
    new = torch.randn(2, 1, 1, D)
    words = rf"opforge.paged_kv_append: {which} has elements that share memory"
    for call in (
        opforge.paged_kv_append,
        torch.ops.opforge.paged_kv_append,
        torch.compile(opforge.paged_kv_append, fullgraph=True, backend="eager"),
    ):
        with pytest.raises(RuntimeError, match=words):
            call(caches["k_cache"], caches["v_cache"], new, new, bt, lens)
    assert all(c.count_nonzero() == 0 for c in caches.values())


def test_paged_kv_append_refuses_gradients():
    """Appending is not differentiable (the new tokens would get no gradient and the caches' would
    ignore the rows written over): with gradients enabled, new tokens or caches (leaves or not) that
    require grad are a RuntimeError naming the argument, from the wrapper and the raw op alike;
    detached tensors, or the same call under no_grad, append."""
    D = 8
    bt, lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([0, 0])
    kc, vc = torch.zeros(4, 4, 1, D), torch.zeros(4, 4, 1, D)
    new = torch.randn(2, 1, 3, D, requires_grad=True)
    w = torch.ones(4, 4, 1, D, requires_grad=True)
    raw = torch.ops.opforge.paged_kv_append
    for call, name in (
        (lambda: opforge.paged_kv_append(kc, vc, new, new.detach(), bt, lens), "k"),
        (lambda: raw(kc, vc, new.detach(), new, bt, lens), "v"),
        (lambda: opforge.paged_kv_append(w * 1, vc, new.detach(), new.detach(), bt, lens), "k_cache"),
        (lambda: raw(kc, w * 1, new.detach(), new.detach(), bt, lens), "v_cache"),
    ):
        with pytest.raises(
            RuntimeError, match=rf"opforge.paged_kv_append: {name} requires grad, but appending"
        ):
            call()
    assert kc.count_nonzero() == 0 and vc.count_nonzero() == 0  # (nothing written)
    with torch.no_grad():
        opforge.paged_kv_append(kc, vc, new, new, bt, lens)
    assert torch.equal(kc[0, :3, 0], new[0, 0].detach())


def test_paged_entries_checked_by_the_cpu_op():
    """On the CPU a table entry a sequence needs that is not a page is a ValueError naming it, from
    the wrapper, the registered op (which reads the pages in place) and the gathered path (q requires
    grad) alike, and under torch.compile; entries past a sequence's pages may hold anything."""
    kc, vc = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)
    table = torch.tensor([[0, 9, 2], [3, 4, 5]])  # (entry 9: not a page, needed by sequence 0)
    lens = torch.tensor([6, 5])
    q = torch.randn(2, 4, 1, 8)
    want = r"block_table\[0, 1\] = 9 is not a page of the caches \(0 to 5\), and sequence 0 needs it"
    raw = torch.ops.opforge.attention_paged.default
    for call in (
        lambda: opforge.attention(q, kc, vc, kv_lens=lens, block_table=table),
        lambda: raw(q, kc, vc, lens, table, 8**-0.5, 0.0, False, -1, -1, 0, "auto"),
        lambda: opforge.attention(q.requires_grad_(), kc, vc, kv_lens=lens, block_table=table),
        lambda: torch.compile(opforge.attention, fullgraph=True)(
            q.detach(), kc, vc, kv_lens=lens, block_table=table
        ),
    ):
        with pytest.raises(ValueError, match=want):
            call()
    short = torch.tensor([4, 5])  # (sequence 0 needs its first page only)
    assert opforge.attention(q.detach(), kc, vc, kv_lens=short, block_table=table).isfinite().all()
    append = torch.compile(opforge.paged_kv_append, fullgraph=True)
    with pytest.raises(
        ValueError, match=r"opforge.paged_kv_append: sequence 0's new token 0 goes to position 6"
    ):
        append(kc, vc, torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8), table, lens)


def test_empty_batch_with_kv_lens_and_gradients():
    """Empty calls with per-sequence key counts and inputs that require grad (the path that builds an
    exact mask from the counts) return what the calls without gradients do."""
    for B, Sq, Sk in ((0, 1, 16), (2, 0, 16), (2, 3, 0)):
        q, k, v = (t.requires_grad_() for t in qkv(B, 4, 2, Sq, Sk, 8))
        lens = torch.full((B,), min(3, Sk), dtype=torch.int32)
        out = opforge.attention(q, k, v, kv_lens=lens, causal=True)
        assert torch.equal(
            out, opforge.attention(q.detach(), k.detach(), v.detach(), kv_lens=lens, causal=True)
        )
        out.sum().backward()
        assert q.grad.shape == q.shape and q.grad.count_nonzero() == 0
