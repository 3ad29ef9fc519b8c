"""opforge.attention under torch.func (grad, vjp, jacrev, jacfwd, vmap), forward-mode AD and double
backward (gradgradcheck, nonlinear losses, jacrev of jacrev) against float64 references."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from attention_cases import (
    NO_PATTERN,
    TRANSFORM_PATTERNS,
    qkv,
    random_block_mask,
    random_segments,
    small_case,
    varlen_case,
)

import opforge
from opforge import reference
from opforge.masks import BlockMask


@pytest.mark.parametrize("name", TRANSFORM_PATTERNS)
def test_forward_mode_ad(name):
    """torch.func.jvp and torch.autograd.forward_ad give the reference's tangents (output and LSE)."""
    import torch.autograd.forward_ad as fwad

    q, k, v, kw = small_case(name)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))

    def ours(q, k, v):
        return opforge.attention(q, k, v, return_lse=True, **kw)

    def ref(q, k, v):
        out, lse = reference.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    (_, lse), (t_out, t_lse) = torch.func.jvp(ours, (q, k, v), tangents)
    _, (w_out, w_lse) = torch.func.jvp(ref, (q, k, v), tangents)
    assert t_out.abs().max() > 0  # a tangent, not zeros
    seen = lse.isfinite()  # (the reference's tangent is NaN on rows that see nothing; ours 0)
    torch.testing.assert_close(t_out[seen], w_out[seen], atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(t_lse[seen], w_lse[seen], atol=1e-9, rtol=1e-7)
    assert (t_out[~seen] == 0).all() and (t_lse[~seen] == 0).all()
    with fwad.dual_level():
        duals = [fwad.make_dual(t, d) for t, d in zip((q, k, v), tangents, strict=True)]
        tangent = fwad.unpack_dual(opforge.attention(*duals, **kw)).tangent
    torch.testing.assert_close(tangent[seen], w_out[seen], atol=1e-9, rtol=1e-7)


def test_forward_mode_ad_one_operand_and_float32():
    """A tangent for v alone (the others None), and float32 inputs (tangents in float32)."""
    q, k, v = qkv(2, 4, 2, 20, 30, 8)
    dv = torch.randn_like(v)
    _, t = torch.func.jvp(lambda v: opforge.attention(q, k, v, causal=True), (v,), (dv,))
    _, w = torch.func.jvp(
        lambda v: reference.attention(q.double(), k.double(), v, causal=True), (v.double(),), (dv.double(),)
    )
    assert t.dtype == torch.float32
    assert (t.double() - w).abs().max() < 1e-5


@pytest.mark.parametrize("name", TRANSFORM_PATTERNS)
def test_func_grad_vjp_jacrev_jacfwd(name):
    q, k, v, kw = small_case(name, Sq=5, Sk=6, D=3)
    w = torch.randn(1, 2, 5, 3, dtype=torch.float64)

    def loss(f):
        return lambda q, k, v: (f(q, k, v, **kw) * w).sum()

    got = torch.func.grad(loss(opforge.attention), argnums=(0, 1, 2))(q, k, v)
    want = torch.func.grad(loss(reference.attention), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    _, pull = torch.func.vjp(lambda q, k, v: opforge.attention(q, k, v, **kw), q, k, v)
    _, ref_pull = torch.func.vjp(lambda q, k, v: reference.attention(q, k, v, **kw), q, k, v)
    for a, b in zip(pull(w), ref_pull(w), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        got = jac(lambda k: opforge.attention(q, k, v, **kw))(k)
        want = jac(lambda k: reference.attention(q, k, v, **kw))(k)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_vmap():
    """vmap over q alone, and over q, k, v with segments and a block mask (the mapped dimension joins
    the batch); in_dims other than 0."""
    qs, ks, vs = (torch.randn(3, *t.shape) for t in qkv(2, 4, 2, 30, 40, 8))
    seg = random_segments(2, 40)
    mask = random_block_mask(2, 4, 30, 40)
    for kw in (dict(causal=True), dict(segment_ids=seg, mask=mask, softcap=2.0)):
        got = torch.func.vmap(partial(opforge.attention, **kw))(qs, ks, vs)
        want = torch.stack([reference.attention(qs[i], ks[i], vs[i], **kw) for i in range(3)])
        assert (got - want).abs().max() < 2e-5
    got = torch.func.vmap(lambda q: opforge.attention(q, ks[0], vs[0], causal=True), in_dims=2)(
        qs.movedim(0, 2)
    )
    want = torch.stack([reference.attention(qs[i], ks[0], vs[0], causal=True) for i in range(3)])
    assert (got - want).abs().max() < 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["causal", "prefix", "documents", "block mask", "softcap"])
def test_gradgradcheck(name):
    q, k, v, kw = small_case(name, Sq=5, Sk=7, D=3)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def f(q, k, v):
        out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradgradcheck(f, (q, k, v))


def test_double_backward_matches_reference():
    """A gradient penalty: d/dk of |d out/dq . g|^2 equals the reference's, float32 inputs (the dense
    recomputation in float32) and fully masked rows (no NaN)."""
    B, H, S, D = 1, 2, 70, 16
    dense = torch.rand(B, H, S, S) < 0.3
    dense[:, :, 5] = False
    mask = BlockMask.from_dense(dense, block_size=64)
    q, k, v = (t.requires_grad_() for t in qkv(B, H, H, S, S, D))
    g = torch.randn(B, H, S, D)

    def penalty(f, q, k, v):
        (dq,) = torch.autograd.grad(f(q, k, v, mask=mask), q, g, create_graph=True)
        return torch.autograd.grad(dq.pow(2).sum(), (k, v))

    got = penalty(opforge.attention, q, k, v)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = penalty(reference.attention, qd, kd, vd)
    for a, b in zip(got, want, strict=True):
        assert a.isfinite().all()
        assert (a.double() - b).abs().max() <= 1e-4 * max(1.0, b.abs().max().item())


def test_backward_op_alone_is_not_differentiable():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 6, 6, 4))
    out, lse = torch.ops.opforge.attention.default(
        q, k, v, 0.5, 0.0, False, -1, -1, 0, *(None,) * 5, 128, 128
    )
    dq, *_ = torch.ops.opforge.attention_backward.default(
        torch.ones_like(out), q, k, v, out.detach(), lse.detach(), None, 0.5, 0.0, *NO_PATTERN
    )
    with pytest.raises(
        RuntimeError, match=r"opforge.attention_backward is not differentiable when called directly"
    ):
        dq.sum().backward()


@pytest.mark.slow
def test_varlen_transforms():
    """torch.func.grad and jvp (forward mode) match the reference; vmap over q, k, v folds the mapped
    dimension into the heads; double backward (gradgradcheck); mapped offsets are refused."""
    lengths = [(3, 5), (0, 2), (4, 4), (2, 0)]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 2, 1, 3, torch.float64)
    kw = dict(causal=True, softcap=2.0)
    w = torch.randn_like(q)

    def loss(f):
        return lambda q, k, v: (f(q, k, v, cu_q, cu_k, **kw) * w).sum()

    got = torch.func.grad(loss(opforge.attention_varlen), argnums=(0, 1, 2))(q, k, v)
    want = torch.func.grad(loss(reference.attention_varlen), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    _, t_out = torch.func.jvp(
        lambda q, k, v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw), (q, k, v), tangents
    )
    _, w_out = torch.func.jvp(
        lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, **kw), (q, k, v), tangents
    )
    # (the last sequence has no keys: the reference's tangent is NaN there, ours 0)
    seen = torch.ones(q.shape[0], dtype=torch.bool)
    seen[int(cu_q[3]) : int(cu_q[4])] = False
    assert t_out.abs().max() > 0
    torch.testing.assert_close(t_out[seen], w_out[seen], atol=1e-9, rtol=1e-7)
    assert (t_out[~seen] == 0).all()
    qs, ks, vs = (torch.randn(3, *t.shape, dtype=torch.float64) for t in (q, k, v))
    mapped = torch.func.vmap(lambda q, k, v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw))(qs, ks, vs)
    loop = torch.stack([reference.attention_varlen(qs[i], ks[i], vs[i], cu_q, cu_k, **kw) for i in range(3)])
    torch.testing.assert_close(mapped, loop, atol=1e-10, rtol=1e-8)
    one_k = torch.func.vmap(lambda q: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw), in_dims=1)(
        qs.movedim(0, 1)
    )
    torch.testing.assert_close(
        one_k, torch.stack([reference.attention_varlen(qs[i], k, v, cu_q, cu_k, **kw) for i in range(3)])
    )
    jac = torch.func.jacrev(lambda v: opforge.attention_varlen(q, k, v, cu_q, cu_k, **kw))(v)
    torch.testing.assert_close(
        jac, torch.func.jacrev(lambda v: reference.attention_varlen(q, k, v, cu_q, cu_k, **kw))(v)
    )

    def f(q, k, v):
        out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradgradcheck(f, tuple(t.clone().requires_grad_() for t in (q, k, v)))
    with pytest.raises(
        NotImplementedError, match=r"opforge.attention_varlen: vmap over cu_seqlens_q is not supported"
    ):
        torch.func.vmap(lambda c: opforge.attention_varlen(q, k, v, c, cu_k))(torch.stack([cu_q, cu_q]))


def nonlinear_second_order(attn, q0, k0, v0, create_graph, **kw):
    """A gradient penalty's gradient: the first gradients of a loss nonlinear in the output and the
    LSE (so grad_out and grad_lse depend on them), then the gradient of a function of those."""
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    out, lse = attn(q, k, v, return_lse=True, **kw)
    seen = lse.isfinite()
    loss = out.pow(2).sum() + out.sin().sum() + torch.where(seen, lse, 0.0).pow(2).sum()
    gq, gk, gv = torch.autograd.grad(loss, (q, k, v), create_graph=True)
    penalty = gq.pow(2).sum() + (gk * gv).sum() + gv.sin().sum()
    return torch.autograd.grad(penalty, (q, k, v), create_graph=create_graph)


@pytest.mark.parametrize("create_graph", [True, False])
@pytest.mark.parametrize("name", ["full", "causal", "softcap", "documents", "block mask"])
def test_second_derivatives_of_nonlinear_losses(name, create_graph):
    """Second derivatives (gradient penalties, Hessian-vector products) where the loss is nonlinear
    in the output: equal to the float64 reference's, with create_graph or without (finding r1: off by
    their own size, or "backward through the graph a second time")."""
    q, k, v, kw = small_case(name, Hq=4, Hkv=2)
    got = nonlinear_second_order(opforge.attention, q, k, v, create_graph, **kw)
    want = nonlinear_second_order(reference.attention, q, k, v, True, **kw)
    for g, w in zip(got, want, strict=True):
        assert w.abs().max() > 0
        torch.testing.assert_close(g, w, atol=1e-9, rtol=1e-7)


def test_hessian_vector_product_and_third_order():
    """torch.autograd.functional.hvp of a nonlinear loss, and a third derivative (the double
    backward's own backward is differentiable), against the reference."""
    q, k, v, kw = small_case("causal")
    u = torch.randn_like(q)

    def loss(attn):
        return lambda q: attn(q, k, v, **kw).tanh().sum()

    _, got = torch.autograd.functional.hvp(loss(opforge.attention), q, u)
    _, want = torch.autograd.functional.hvp(loss(reference.attention), q, u)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7)

    def third(attn):
        x = q.clone().requires_grad_()
        (g,) = torch.autograd.grad(attn(x, k, v, **kw).pow(3).sum(), x, create_graph=True)
        (h,) = torch.autograd.grad((g * u).sum(), x, create_graph=True)
        return torch.autograd.grad(h.pow(2).sum(), x)[0]

    torch.testing.assert_close(third(opforge.attention), third(reference.attention), atol=1e-8, rtol=1e-6)


def test_varlen_second_derivatives():
    q, k, v, cu_q, cu_k = (
        t.double() if t.is_floating_point() else t for t in varlen_case([(4, 6), (3, 2)], 2, 1, 4)
    )

    def ours(q, k, v, return_lse):
        return opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=return_lse)

    def ref(q, k, v, return_lse):
        return reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=return_lse)

    got = nonlinear_second_order(ours, q, k, v, False)
    want = nonlinear_second_order(ref, q, k, v, True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-9, rtol=1e-7)


def test_jacrev_of_jacrev():
    """torch.func.jacrev(jacrev(...)) (documented as supported; finding r2 raised) equals the
    reference's, for a loss nonlinear in the output."""
    q, k, v, kw = small_case("causal", Hq=1, Sq=3, Sk=4, D=3)

    def second(attn):
        return torch.func.jacrev(torch.func.jacrev(lambda q: attn(q, k, v, **kw).sin().sum()))(q)

    got, want = second(opforge.attention), second(reference.attention)
    assert got.shape == (*q.shape, *q.shape) and want.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7)


def test_forward_mode_ad_on_views():
    """Forward-mode AD with q a (B, S, H, D).transpose(1, 2) view and through attention_varlen (finding
    r3: an internal assert of PyTorch on both), against the reference's tangents."""
    import torch.autograd.forward_ad as fwad

    q = torch.randn(1, 6, 2, 8, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(1, 2, 7, 8, dtype=torch.float64) for _ in range(2))
    dq = torch.randn_like(q)
    _, want = torch.func.jvp(lambda q: reference.attention(q, k, v, causal=True), (q,), (dq,))
    with fwad.dual_level():
        out = opforge.attention(fwad.make_dual(q, dq), k, v, causal=True)
        got = fwad.unpack_dual(out).tangent
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)

    qv, kv, vv, cu_q, cu_k = (
        t.double() if t.is_floating_point() else t for t in varlen_case([(5, 4), (3, 6)], 2, 2, 8)
    )
    tangents = tuple(torch.randn_like(t) for t in (qv, kv, vv))
    _, want = torch.func.jvp(
        lambda q, k, v: reference.attention_varlen(q, k, v, cu_q, cu_k, causal=True), (qv, kv, vv), tangents
    )
    for head_major in (False, True):
        q_in = qv.transpose(0, 1).contiguous().transpose(0, 1) if head_major else qv
        with fwad.dual_level():
            duals = [fwad.make_dual(t, d) for t, d in zip((q_in, kv, vv), tangents, strict=True)]
            got = fwad.unpack_dual(opforge.attention_varlen(*duals, cu_q, cu_k, causal=True)).tangent
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_forward_mode_ad_ignores_what_no_query_sees():
    """Forward-mode AD reads no value the forward ignores: NaN in cache slots past kv_lens, in a page
    past a sequence's length, and in varlen padding rows (and in their tangents) leaves every tangent
    the one of the call without those slots (finding: 0 x NaN in the dense tangent's products)."""
    nan = float("nan")
    q = torch.randn(2, 2, 3, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 1, 9, 8, dtype=torch.float64) for _ in range(2))
    tq, tk, tv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    lens = torch.tensor([5, 7])
    kp, vp, tkp, tvp = (t.clone() for t in (k, v, tk, tv))
    for b, n in enumerate(lens.tolist()):
        for t in (kp, vp, tkp, tvp):
            t[b, :, n:] = nan
    for causal in (False, True):
        for b, n in enumerate(lens.tolist()):
            _, want = torch.func.jvp(
                lambda q_, k_, v_, c=causal: opforge.attention(q_, k_, v_, causal=c),
                (q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n]),
                (tq[b : b + 1], tk[b : b + 1, :, :n], tv[b : b + 1, :, :n]),
            )
            _, got = torch.func.jvp(
                lambda q_, k_, v_, c=causal: opforge.attention(q_, k_, v_, causal=c, kv_lens=lens),
                (q, kp, vp),
                (tq, tkp, tvp),
            )
            torch.testing.assert_close(got[b : b + 1], want, atol=1e-10, rtol=1e-8)
    # a paged cache: pages of 3, sequence 0's third page (slots 6-8, past its 5 keys) all NaN
    kc, vc = (t[0, 0].reshape(3, 3, 1, 8).clone() for t in (k, v))
    tkc, tvc = (t[0, 0].reshape(3, 3, 1, 8).clone() for t in (tk, tv))
    for t in (kc, vc, tkc, tvc):
        t[2] = nan
    table, one = torch.tensor([[0, 1, 2]]), torch.tensor([5])
    _, got = torch.func.jvp(
        lambda q_, k_, v_: opforge.attention(q_, k_, v_, kv_lens=one, block_table=table),
        (q[:1], kc, vc),
        (tq[:1], tkc, tvc),
    )
    _, want = torch.func.jvp(
        lambda q_, k_, v_: opforge.attention(q_, k_, v_),
        (q[:1], k[:1, :, :5], v[:1, :, :5]),
        (tq[:1], tk[:1, :, :5], tv[:1, :, :5]),
    )
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)
    # varlen: padding rows past the last offset
    qv, kv_, vv = torch.randn(5, 2, 8, dtype=torch.float64), torch.randn(7, 1, 8, dtype=torch.float64), None
    vv = torch.randn_like(kv_)
    cu_q, cu_k = torch.tensor([0, 3]), torch.tensor([0, 4])
    tangents = [torch.randn_like(t) for t in (qv, kv_, vv)]
    dirty = [t.clone() for t in (qv, kv_, vv)]
    dirty_t = [t.clone() for t in tangents]
    for t, n in zip(dirty + dirty_t, (3, 4, 4) * 2, strict=True):
        t[n:] = nan
    _, got = torch.func.jvp(
        lambda *a: opforge.attention_varlen(*a, cu_q, cu_k, causal=True), tuple(dirty), tuple(dirty_t)
    )
    _, want = torch.func.jvp(
        lambda *a: opforge.attention_varlen(*a, cu_q, cu_k, causal=True),
        (qv[:3], kv_[:4], vv[:4]),
        (tangents[0][:3], tangents[1][:4], tangents[2][:4]),
    )
    torch.testing.assert_close(got[:3], want, atol=1e-10, rtol=1e-8)
    assert (got[3:] == 0).all()


def test_transforms_over_empty_queries():
    """jacrev and vmap over size-0 queries give empty results as SDPA does (finding r6:
    ZeroDivisionError, a false message)."""
    k = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    q0 = torch.randn(1, 2, 0, 8, dtype=torch.float64)
    want = torch.func.jacrev(lambda q: torch.nn.functional.scaled_dot_product_attention(q, k, k))(q0)
    got = torch.func.jacrev(lambda q: opforge.attention(q, k, k))(q0)
    assert got.shape == want.shape == (1, 2, 0, 8, 1, 2, 0, 8)
    kv = torch.randn(4, 2, 8, dtype=torch.float64)
    cq, ck = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    got = torch.func.jacrev(lambda q: opforge.attention_varlen(q, kv, kv, cq, ck))(
        torch.randn(0, 2, 8).double()
    )
    assert got.shape == (0, 2, 8, 0, 2, 8)
    # vmap over a mapped dimension of size 0, and over queries of size 0
    out = torch.func.vmap(lambda q: opforge.attention(q, k, k))(
        torch.randn(0, 1, 2, 5, 8, dtype=torch.float64)
    )
    assert out.shape == (0, 1, 2, 5, 8)
    out = torch.func.vmap(lambda q: opforge.attention(q, k, k))(
        torch.randn(3, 1, 2, 0, 8, dtype=torch.float64)
    )
    assert out.shape == (3, 1, 2, 0, 8)
    out = torch.func.vmap(lambda q: opforge.attention_varlen(q, kv, kv, cq, ck), in_dims=1)(
        torch.randn(0, 3, 2, 8, dtype=torch.float64)
    )
    assert out.shape == (3, 0, 2, 8)
    grads = torch.func.vmap(torch.func.grad(lambda q: opforge.attention(q, k, k).sum()))(
        torch.randn(0, 1, 2, 5, 8, dtype=torch.float64)
    )
    assert grads.shape == (0, 1, 2, 5, 8)


def test_vmap_with_kv_lens():
    """vmap over calls with per-sequence key counts: the counts are mapped with the batch (each
    mapped index its own), as the reference computes them one by one."""
    q, k, v = (t.unflatten(0, (3, 2)) for t in qkv(6, 4, 2, 1, 50, 8))  # (mapped 3, B 2, ...)
    lens = torch.randint(0, 51, (3, 2))
    got = torch.func.vmap(lambda q, k, v, n: opforge.attention(q, k, v, kv_lens=n, causal=True))(
        q, k, v, lens
    )
    for i in range(3):
        want = reference.attention(q[i].double(), k[i].double(), v[i].double(), kv_lens=lens[i], causal=True)
        assert (got[i].double() - want).abs().max() < 2e-5


def test_func_transforms_with_kv_lens_pages_and_masks_built_inside():
    """torch.func.grad / jacrev / vjp of calls with per-sequence key counts, with a paged cache, or
    with a block mask built inside the transformed function (whose bits are packed from tensors
    torch.func wraps) equal plain autograd; vmap over the counts of a paged call equals the calls one
    by one."""
    q, k, v = qkv(2, 4, 2, 6, 9, 8, dtype=torch.float64)
    lens = torch.tensor([3, 9])

    def loss(q):
        return opforge.attention(q, k, v, kv_lens=lens, causal=True).sin().sum()

    qq = q.clone().requires_grad_()
    loss(qq).backward()
    assert torch.allclose(torch.func.grad(loss)(q), qq.grad, atol=1e-12)
    jac = torch.func.jacrev(lambda q: opforge.attention(q, k, v, kv_lens=lens))(q)
    assert jac.shape == (*q.shape, *q.shape)
    kc, vc = torch.randn(10, 4, 2, 8, dtype=torch.float64), torch.randn(10, 4, 2, 8, dtype=torch.float64)
    table = torch.tensor([[0, 1, 2], [3, 4, 5]])
    paged = torch.tensor([7, 12])
    one = q[:, :, :1]
    _, pull = torch.func.vjp(lambda q: opforge.attention(q, kc, vc, kv_lens=paged, block_table=table), one)
    g = torch.randn_like(one)
    (got,) = pull(g)
    leaf = one.clone().requires_grad_()
    opforge.attention(leaf, kc, vc, kv_lens=paged, block_table=table).backward(g)
    assert torch.allclose(got, leaf.grad, atol=1e-12)

    def masked(q):
        m = opforge.block_mask(lambda b, h, i, j: i >= j, None, None, 6, 9)
        return opforge.attention(q, k, v, mask=m).square().sum()

    leaf = q.clone().requires_grad_()
    masked(leaf).backward()
    assert torch.allclose(torch.func.grad(masked)(q), leaf.grad, atol=1e-12)
    mapped = torch.tensor([[3, 9], [5, 1]])
    got = torch.func.vmap(lambda n: opforge.attention(one, kc, vc, kv_lens=n, block_table=table))(mapped)
    for i in range(2):
        assert torch.equal(got[i], opforge.attention(one, kc, vc, kv_lens=mapped[i], block_table=table))


def test_forward_over_reverse_raises_the_documented_error():
    """torch.func.hessian and jacfwd of jacrev (forward mode over the backward, unsupported) raise
    the NotImplementedError that names opforge.attention, not an error from inside functorch."""
    q, k, _ = qkv(1, 2, 1, 3, 5, 4)

    def f(q):
        return opforge.attention(q, k, k, causal=True).square().sum()

    kv = k[0].transpose(0, 1)
    varlen = lambda x: opforge.attention_varlen(x, kv, kv, torch.tensor([0, 3]), torch.tensor([0, 5])).sum()  # noqa: E731
    for call in (
        lambda: torch.func.hessian(f)(q),
        lambda: torch.func.jacfwd(torch.func.jacrev(f))(q),
        lambda: torch.func.hessian(varlen)(q[0].transpose(0, 1)),
    ):
        with pytest.raises(NotImplementedError, match=r"opforge.attention: forward-mode AD of its gradients"):
            call()
    # (reverse over forward and plain forward mode still work)
    assert torch.func.jacrev(torch.func.jacfwd(f))(q).shape == (*q.shape, *q.shape)


def test_tangent_never_builds_the_dense_mask():
    """Forward mode's dense tangent works in chunks of about 2^24 scores and reads the pattern as one
    (Sq, Sk) mask shared by every batch row and head: no bool tensor it makes holds more than a chunk
    or that mask (the (B, Hq, Sq, Sk) mask at 32 heads and 32k keys would be 32 GiB)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestBool(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.bool:  # (its memory, not a view's extent)
                    LargestBool.largest = max(LargestBool.largest, t.untyped_storage().nbytes())
            return out

    B, H, S = 1, 64, 1024  # (64 Mi scores: four chunks)
    q, k, v = qkv(B, H, 2, S, S, 2)
    with LargestBool():
        _, tangent = torch.func.jvp(
            lambda q: opforge.attention(q, k, v, causal=True), (q,), (torch.randn_like(q),)
        )
    assert tangent.isfinite().all()
    assert LargestBool.largest <= max(1 << 24, S * S) < B * H * S * S
