"""opforge.attention's backward on CUDA: gradients against a float64 reference at every head dim,
float16 and the LSE's gradient, fully masked rows, many key blocks, rows past the last key, the
deterministic mode, the mma.sync backward."""

from __future__ import annotations

import math

import pytest
import torch
from attention_cases import (
    PATTERNS,
)
from attention_cuda_cases import (
    DEV,
    check_gradients,
    grads,
    kernels_run,
    max_err,
    pattern_kwargs,
    qkv,
    reference_grads,
)
from conftest import capture_cuda_graph

import opforge
from opforge import reference
from opforge.masks import BlockMask

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("d", [64, 128, 192, 256, 80, 160])
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


@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize(
    "name", ["full", "causal", "sliding", "prefix", "documents", "block mask", "softcap"]
)
def test_gradients_many_key_blocks(name, d):
    """dQ summed over many key blocks (9 of 128 keys, 18 of 64 at head dims 192 and 256; a GQA group of 4 in
    each), by the default unordered additions and by the deterministic mode."""
    B, Hq, Hkv, Sq, Sk = 1, 8, 2, 330, 1100
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, d)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    check_gradients(q, k, v, kw)
    check_gradients(q, k, v, dict(kw, deterministic=True))


@pytest.mark.parametrize("D", [64, 192, 256])
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


@pytest.mark.parametrize("d", [64, 128, 192, 256])
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


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_backward_under_cuda_graphs(d):
    """deterministic=True captured in a CUDA graph (forward and backward, attention sinks included):
    every replay gives bit-identical gradients, equal to the eager deterministic run's."""
    q, k, v = qkv(2, 16, 2, 700, 1500, d)
    sinks = torch.randn(16, device=DEV)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    go = torch.randn_like(q)

    def step():
        out = opforge.attention(*leaves[:3], causal=True, sinks=leaves[3], deterministic=True)
        return torch.autograd.grad(out, leaves, go)

    eager = step()
    graph, captured = capture_cuda_graph(step)
    replays = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        replays.append([g.clone() for g in captured])
    for replay in replays:
        for x, y in zip(replay, eager, strict=True):
            assert torch.equal(x, y)
