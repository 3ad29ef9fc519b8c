"""opforge.attention's backward on the CPU: gradcheck, gradients against the reference, determinism,
the LSE's gradient, training next to SDPA, the deterministic argument."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    PATTERNS,
    pattern_kwargs,
    qkv,
)

import opforge
from opforge import reference


@pytest.mark.parametrize(
    "name", ["full", "causal", "sliding", "prefix", "documents", "block mask", "softcap"]
)
def test_gradcheck(name):
    B, Hq, Hkv, Sq, Sk, D = 1, 2, 1, 11, 13, 4
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    q, k, v = (t.double().requires_grad_() for t in qkv(B, Hq, Hkv, Sq, Sk, D))

    def f(q, k, v):
        out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("shape", [(2, 4, 2, 150, 140, 32), (2, 4, 2, 2, 600, 32)], ids=["tiles", "decode"])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gradients_match_reference(name, shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, D)
    go = torch.randn(B, Hq, Sq, D)
    grads = torch.autograd.grad(
        opforge.attention(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), **kw), (q, k, v), go
    )
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(reference.attention(qd, kd, vd, **kw), (qd, kd, vd), go.double())
    for g, w in zip(grads, want, strict=True):
        assert (g.double() - w).abs().max().item() <= 1e-4 * max(1.0, w.abs().max().item())


def test_backward_is_deterministic():
    q, k, v = (t.requires_grad_() for t in qkv(2, 8, 2, 200, 200, 32))
    go = torch.randn_like(q)
    kw = dict(causal=True, window=(50, 0))
    a = torch.autograd.grad(opforge.attention(q, k, v, **kw), (q, k, v), go)
    b = torch.autograd.grad(opforge.attention(q, k, v, **kw), (q, k, v), go)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_lse_gradient():
    q, k, v = (t.double().requires_grad_() for t in qkv(1, 2, 2, 20, 30, 8))
    _, lse = opforge.attention(q, k, v, causal=True, return_lse=True)
    g = torch.autograd.grad(lse.sum(), (q, k))
    qd, kd = (t.detach().clone().requires_grad_() for t in (q, k))
    _, want = reference.attention(qd, kd, v.detach(), causal=True, return_lse=True)
    w = torch.autograd.grad(want.sum(), (qd, kd))
    for a, b in zip(g, w, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


def test_trains_like_sdpa():
    """A small attention model's loss goes down with opforge attention as it does with SDPA."""

    class Model(torch.nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.attn = attn
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(x).view(B, S, 3, 4, 8).permute(2, 0, 3, 1, 4)
            return self.out(self.attn(q, k, v).transpose(1, 2).reshape(B, S, 32))

    x, y = torch.randn(8, 40, 32), torch.randn(8, 40, 32)
    losses = {}
    for name, attn in {
        "opforge": lambda q, k, v: opforge.attention(q, k, v, causal=True),
        "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }.items():
        torch.manual_seed(1)
        model = Model(attn)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        curve = []
        for _ in range(30):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[name] = curve
    assert losses["opforge"][-1] < 0.8 * losses["opforge"][0]
    assert abs(losses["opforge"][-1] - losses["sdpa"][-1]) < 1e-3 * losses["sdpa"][0]


def test_deterministic_argument():
    """deterministic= (None, True, False) reaches the backward through every path (the op's
    autograd, the torch.func Function, double backward); the CPU backward is deterministic in every
    mode; anything but a bool or None is refused."""
    q, k, v = qkv(1, 4, 2, 40, 70, 16)
    go = torch.randn_like(q)
    got = []
    for det in (None, True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        got.append(
            torch.autograd.grad(opforge.attention(*leaves, causal=True, deterministic=det), leaves, go)
        )
        grad_q = torch.func.grad(
            lambda x, d=det: (opforge.attention(x, k, v, causal=True, deterministic=d) * go).sum()
        )
        assert torch.equal(grad_q(q), got[-1][0])
    for a in got[1:]:
        for x, y in zip(got[0], a, strict=True):
            assert torch.equal(x, y)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    first = torch.autograd.grad(
        opforge.attention(*leaves, causal=True, deterministic=True), leaves, go, create_graph=True
    )
    assert first[0].requires_grad
    pattern = (True, -1, -1, 0, None, None, None, None, None, 128, 128)  # causal .. block_k
    out, lse = torch.ops.opforge.attention.default(q, k, v, 0.25, 0.0, *pattern, deterministic=True)
    raw_backward = torch.ops.opforge.attention_backward.default
    dq, *_ = raw_backward(go, q, k, v, out, lse, None, 0.25, 0.0, *pattern, deterministic=False)
    assert dq.shape == q.shape
    for bad in (1, "yes", torch.tensor(True)):
        with pytest.raises(TypeError, match=r"opforge.attention: deterministic must be a bool or None, got"):
            opforge.attention(q, k, v, deterministic=bad)
