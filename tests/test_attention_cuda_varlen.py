"""opforge.attention_varlen on CUDA: against the reference sequence by sequence on every kernel,
many sequences, determinism, CUDA graphs with new offsets, errors, invalid offsets under replay."""

from __future__ import annotations

import pytest
import torch
from attention_cuda_cases import (
    DEV,
    VARLEN_K,
    VARLEN_PATTERNS,
    VARLEN_Q,
    kernels_run,
    max_err,
    reference_grads,
    sequences,
    varlen_backward,
    varlen_case,
    varlen_forward,
)
from conftest import capture_cuda_graph, poison_cuda_allocator

from opforge import reference

pytestmark = pytest.mark.cuda


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
    graph, (out, _) = capture_cuda_graph(lambda: varlen_forward(q, k, v, cu_q, cu_k, kw))
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
    with pytest.raises(ValueError, match=r"opforge\.attention_varlen: cu_seqlens_q must not decrease"):
        varlen_forward(q, k, v, bad, cu_k, {})
    with pytest.raises(ValueError, match="cu_seqlens_k must end at most at the packed length 30"):
        varlen_forward(q, k, v, cu_q, torch.tensor([0, 10, 31], dtype=torch.int32, device=DEV), {})
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
    graph, grads = capture_cuda_graph(run)
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


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_padded_deterministic_backward_cuda_graph(causal):
    """A padded batch (offsets ending before the packed length, as transformers' continuous batching
    pads its captured steps) in a CUDA graph with deterministic=True: the prep kernel takes the offsets
    as valid (the ordered dQ additions run), two replays give the same bits, and the sequences' rows
    match the unpadded eager call."""
    lq, lk, pad_q, pad_k = [70, 1, 300, 0, 129], [70, 200, 300, 5, 129], 60, 90
    q, k, v, cu_q, cu_k = varlen_case([*lq[:-1], lq[-1] + pad_q], [*lk[:-1], lk[-1] + pad_k], 8, 2, 128)
    cu_q[-1] -= pad_q
    cu_k[-1] -= pad_k
    nq, nk = sum(lq), sum(lk)
    go = torch.randn_like(q)
    kw = {"causal": causal}
    run = lambda: varlen_backward(q, k, v, cu_q, cu_k, go, kw, deterministic=True)  # noqa: E731
    graph, grads = capture_cuda_graph(run)
    graph.replay()
    first = [g.clone() for g in grads]
    graph.replay()
    torch.cuda.synchronize()
    want = varlen_backward(q[:nq], k[:nk], v[:nk], cu_q, cu_k, go[:nq], kw, deterministic=True)
    for g, f, w, n in zip(grads, first, want, (nq, nk, nk), strict=True):
        assert torch.equal(g, f)
        assert max_err(g[:n], w.double()) <= 2e-2 * max(1.0, w.abs().max().item()) and (g[n:] == 0).all()
