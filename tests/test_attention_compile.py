"""The attention ops under torch.library.opcheck and torch.compile (fullgraph, dynamic shapes), KV
caches and packed sequences included."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    opcheck_patterns,
    qkv,
    random_block_mask,
    random_segments,
    to_pages,
    varlen_case,
)

import opforge
from opforge import reference


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 37, 45, 16))
    opcheck_patterns(q, k, v, random_segments(1, 45), random_block_mask(1, 4, 37, 45), 0.25)


def test_torch_compile_fullgraph():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 64, 64, 16))
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True, window=(8, 0)), fullgraph=True)
    out = f(q, k, v)
    assert torch.allclose(out, opforge.attention(q, k, v, causal=True, window=(8, 0)))
    out.sum().backward()
    assert q.grad is not None and k.grad is not None


def test_torch_compile_dynamic():
    """dynamic=True: the default scale of a symbolic head_dim and a traced scale argument."""
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True), fullgraph=True, dynamic=True)
    g = torch.compile(lambda q, k, v, s: opforge.attention(q, k, v, scale=s), fullgraph=True, dynamic=True)
    for D in (8, 16):
        q, k, v = qkv(1, 2, 1, 10, 12, D)
        assert torch.allclose(f(q, k, v), opforge.attention(q, k, v, causal=True))
        assert torch.allclose(g(q, k, v, 0.3), opforge.attention(q, k, v, scale=0.3))


def test_torch_compile_dynamic_shapes_do_not_recompile():
    """dynamic=True over more shapes than Dynamo's recompile limit (8): the fake kernels read no size
    as a number (that would specialise the graph on it, one recompilation a shape, and fullgraph
    then fails)."""
    f = torch.compile(lambda q, k, v: opforge.attention(q, k, v, causal=True), fullgraph=True, dynamic=True)
    for S in range(5, 25, 2):
        q, k, v = qkv(2, 4, 2, S, S + 3, 8)
        assert torch.allclose(f(q, k, v), opforge.attention(q, k, v, causal=True))


def test_kv_lens_compiles_without_graph_break():
    q, k, v = qkv(2, 8, 2, 1, 400, 32)
    lens = torch.tensor([400, 123])
    f = torch.compile(lambda q, k, v, n: opforge.attention(q, k, v, kv_lens=n, causal=True), fullgraph=True)
    assert torch.allclose(f(q, k, v, lens), opforge.attention(q, k, v, kv_lens=lens, causal=True))
    lens[1] = 7  # the counts are data: no recompilation, new result
    assert torch.allclose(
        f(q, k, v, lens), reference.attention(q, k, v, kv_lens=lens, causal=True), atol=1e-5
    )


def test_varlen_torch_compile_fullgraph():
    q, k, v, cu_q, cu_k = varlen_case([(20, 30), (0, 5), (40, 40)], 4, 2, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def f(q, k, v, cu_q, cu_k):
        return opforge.attention_varlen(
            q, k, v, cu_q, cu_k, 40, 40, causal=True, window=(8, 0), return_lse=True
        )

    out, lse = torch.compile(f, fullgraph=True)(q, k, v, cu_q, cu_k)
    want, want_lse = f(q, k, v, cu_q, cu_k)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, want_lse)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    for a, b in zip(got, torch.autograd.grad(want, (q, k, v), go), strict=True):
        torch.testing.assert_close(a, b)


def test_varlen_opcheck():
    """torch.library.opcheck of the raw ops (forward and backward) with the offsets, on the (1, H,
    total, D) views of packed tensors."""
    q, k, v, cu_q, cu_k = varlen_case([(7, 11), (0, 3), (20, 9), (5, 0)], 4, 2, 16)
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2).requires_grad_() for t in (q, k, v))
    offsets = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for causal, left, right, softcap in ((True, -1, -1, 0.0), (False, 3, 2, 2.0)):
        args = (q4, k4, v4, 0.25, softcap, causal, left, right, 0, *(None,) * 5, 128, 128)
        torch.library.opcheck(torch.ops.opforge.attention.default, args, offsets)
    out, lse = torch.ops.opforge.attention.default(*args, **offsets)
    bwd = (torch.randn_like(out), q4.detach(), k4.detach(), v4.detach(), out.detach(), lse.detach(), None)
    torch.library.opcheck(
        torch.ops.opforge.attention_backward.default,
        (*bwd, 0.25, 2.0, False, 3, 2, 0, *(None,) * 5, 128, 128),
        offsets,
    )


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_serving_step_compiles_with_dynamic_shapes(paged):
    """A compiled serving step with per-sequence key counts (contiguous or paged caches), fullgraph,
    called for a decode step and then for a chunk of new tokens (another Sq), and compiled with
    dynamic=True (finding r4: failed on the second call, and at once with dynamic=True)."""
    B, H, Hkv, D, P = 2, 4, 2, 8, 4
    k, v = qkv(B, Hkv, Hkv, 1, 6 * P, D)[1:]
    lens = torch.tensor([10, 7], dtype=torch.int32)
    if paged:
        k, v, table = to_pages(k, v, lens, P)
        kw = dict(block_table=table)
    else:
        kw = {}

    def step(q):
        return opforge.attention(q, k, v, kv_lens=lens, causal=True, **kw)

    for dynamic in (None, True):
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
        for sq in (1, 5, 3):
            q = torch.randn(B, H, sq, D)
            assert torch.equal(compiled(q), step(q)), (dynamic, sq)


def test_paged_kv_append_opcheck_and_compile():
    """paged_kv_append is a registered op (it mutates both caches) with a fake: opcheck's schema,
    fake-tensor and AOT checks pass, and a compiled append-then-attend step equals the eager one."""
    B, Hkv, D, P = 2, 2, 8, 4
    k, v = qkv(B, Hkv, Hkv, 1, 6 * P, D)[1:]
    lens = torch.tensor([10, 7], dtype=torch.int32)
    kc, vc, table = to_pages(k, v, lens + 3, P)  # (pages for the 3 new tokens too)
    new = torch.randn(B, Hkv, 3, D)
    torch.library.opcheck(
        torch.ops.opforge.paged_kv_append.default, (kc.clone(), vc.clone(), new, new, table, lens)
    )

    def step(kc, vc, q, new, lens):
        opforge.paged_kv_append(kc, vc, new, new, table, lens)
        return opforge.attention(q, kc, vc, kv_lens=lens + 3, block_table=table, causal=True)

    q = torch.randn(B, 4, 3, D)
    want = step(kc.clone(), vc.clone(), q, new, lens)
    kc2, vc2 = kc.clone(), vc.clone()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(kc2, vc2, q, new, lens)
    assert torch.equal(got, want)
    for cache, n in ((kc2, new), (vc2, new)):  # the new rows were written in place
        for b in range(B):
            for i in range(3):
                p = int(lens[b]) + i
                assert torch.equal(cache[table[b, p // P], p % P], n[b, :, i])


def test_kv_lens_with_gradients_compiles():
    """Calls with per-sequence key counts (contiguous or paged) whose inputs require grad, the path
    that builds an exact block mask from the counts, trace in one graph (the mask's partial blocks a
    size known when it runs) and give eager's output and gradients."""
    q, k, v = qkv(2, 4, 2, 5, 9, 16)
    lens = torch.tensor([6, 9])
    kc, vc = torch.randn(4, 4, 2, 16), torch.randn(4, 4, 2, 16)
    table = torch.tensor([[0, 1], [2, 3]])
    mask = opforge.block_mask(lambda b, h, i, j: (i + j) % 3 != 0, None, None, 5, 9)
    calls = (
        lambda q, k: opforge.attention(q, k, v, kv_lens=lens, causal=True),
        lambda q, k: opforge.attention(q, k, v, kv_lens=lens, window=(3, 1), mask=mask),
        lambda q, k: opforge.attention(q[:, :, :1], kc, vc, kv_lens=torch.tensor([3, 7]), block_table=table),
    )
    for f in calls:
        results = []
        for fn in (f, torch.compile(f, fullgraph=True)):
            qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
            out = fn(qq, kk)
            out.square().sum().backward()
            results.append((out, qq.grad, kk.grad))
        for a, b in zip(*results, strict=True):
            assert (a is None and b is None) or torch.allclose(a, b, atol=1e-6)  # (the paged call: no k)


def test_tensor_scale_under_compile():
    """A one-element tensor scale (taken in eager, as SDPA does) cannot become the op's float
    argument inside a graph: fullgraph fails with a message that says so; without fullgraph the call
    runs (eager at that point) and gives eager's result."""
    q, k, v = qkv(1, 2, 1, 4, 6, 8)
    s = torch.tensor(0.3)
    want = opforge.attention(q, k, v, scale=0.3)
    with pytest.raises(
        Exception, match=r"opforge.attention: under torch.compile, scale must be a Python number"
    ):
        torch.compile(lambda q, s: opforge.attention(q, k, v, scale=s), fullgraph=True)(q, s)
    torch._dynamo.reset()
    assert torch.allclose(torch.compile(lambda q, s: opforge.attention(q, k, v, scale=s))(q, s), want)
