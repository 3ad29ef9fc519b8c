"""opforge.attention_varlen (FlashAttention's packed cu_seqlens layout) on the CPU: against the
reference sequence by sequence, random lengths, layouts and arguments, gradients."""

from __future__ import annotations

import pytest
import torch
from attention_cases import (
    TOL,
    VARLEN_LENGTHS,
    VARLEN_PATTERNS,
    assert_varlen_rows,
    cu_seqlens,
    errors,
    poison_cpu_allocator,
    varlen_case,
)

import opforge
from opforge import reference


@pytest.mark.parametrize("heads", [(4, 2, 80), (3, 3, 13)], ids=["gqa d80", "d13"])
@pytest.mark.parametrize("name", list(VARLEN_PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_varlen_matches_reference(dtype, name, heads):
    """Forward (output, LSE) and backward (dq, dk, dv) against the float64 reference run one
    sequence at a time; outputs poisoned before the kernels write them."""
    Hq, Hkv, D = heads
    kw = VARLEN_PATTERNS[name]
    q, k, v, cu_q, cu_k = varlen_case(VARLEN_LENGTHS, Hq, Hkv, D, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    poison_cpu_allocator(q.numel() * q.element_size())
    out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = reference.attention_varlen(qd, kd, vd, cu_q, cu_k, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (Hq, q.shape[0]) and lse.dtype == (
        torch.float64 if dtype == torch.float64 else torch.float32
    )
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())
    assert_varlen_rows(out, lse, VARLEN_LENGTHS, cu_q)
    finite = want_lse.isfinite()
    lse_err = (lse.double() - want_lse)[finite].abs().max().item()
    go = torch.randn_like(out)
    poison_cpu_allocator(k.numel() * k.element_size())
    grads = torch.autograd.grad(out, (q, k, v), go)
    wants = torch.autograd.grad(want, (qd, kd, vd), go.double())
    for g in grads:
        assert not g.isnan().any()
    if dtype in TOL:
        assert (out.double() - want).abs().max().item() <= TOL[dtype] and lse_err <= TOL[dtype] * 10
        for g, w in zip(grads, wants, strict=True):
            assert (g.double() - w).abs().max().item() <= 10 * TOL[dtype] * max(1.0, w.abs().max().item())
    else:  # 16-bit: within 2x the error of PyTorch's own arithmetic in that dtype (the reference in bf16)
        ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
        low = reference.attention_varlen(ql, kl, vl, cu_q, cu_k, **kw)
        err, torch_err = errors(out, want, low)
        assert err <= 2 * torch_err + 1e-3, (err, torch_err)
        assert lse_err <= 1e-3 * max(1.0, want_lse[finite].abs().max().item())
        lows = torch.autograd.grad(low, (ql, kl, vl), go)
        for g, w, lg in zip(grads, wants, lows, strict=True):
            err, torch_err = errors(g, w, lg)
            assert err <= 2 * torch_err + 1e-3 * max(1.0, w.abs().max().item()), (err, torch_err)
    # Keys of sequences without queries get exactly zero gradients.
    for b, (sq, sk) in enumerate(VARLEN_LENGTHS):
        if sk and not sq:
            rows = slice(int(cu_k[b]), int(cu_k[b + 1]))
            assert (grads[1][rows] == 0).all() and (grads[2][rows] == 0).all()


@pytest.mark.slow
def test_varlen_random_lengths():
    """Many sequences of random lengths (fresh every run; int64 offsets), sliding window, float32."""
    B = 12
    lengths = [(int(a), int(b)) for a, b in torch.randint(0, 160, (B, 2))]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 4, 1, 32, index_dtype=torch.int64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(causal=True, window=(40, 0))
    poison_cpu_allocator(q.numel() * 4)
    out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = reference.attention_varlen(qd, kd, vd, cu_q, cu_k, return_lse=True, **kw)
    assert (out.double() - want).abs().max() < 2e-5 and torch.equal(lse.isinf(), want_lse.isinf())
    assert_varlen_rows(out, lse, lengths, cu_q)
    go = torch.randn_like(out)
    poison_cpu_allocator(k.numel() * 4)
    for g, w in zip(
        torch.autograd.grad(out, (q, k, v), go),
        torch.autograd.grad(want, (qd, kd, vd), go.double()),
        strict=True,
    ):
        assert (g.double() - w).abs().max().item() <= 1e-4 * max(1.0, w.abs().max().item())


def test_varlen_one_sequence_is_attention():
    """One packed sequence is opforge.attention of the (1, H, S, D) view (Sq != Sk: the end of the
    keys); each sequence of several is opforge.attention of that sequence alone."""
    q, k, v, cu_q, cu_k = varlen_case([(70, 150)], 4, 2, 16)
    got = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True, window=(30, 5))
    view = [t.transpose(0, 1)[None] for t in (q, k, v)]
    want = opforge.attention(*view, causal=True, window=(30, 5))[0].transpose(0, 1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    lengths = [(40, 60), (100, 20), (17, 17)]
    q, k, v, cu_q, cu_k = varlen_case(lengths, 2, 2, 24)
    got = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    for b in range(len(lengths)):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        alone = opforge.attention(
            q[rq].transpose(0, 1)[None], k[rk].transpose(0, 1)[None], v[rk].transpose(0, 1)[None], causal=True
        )
        torch.testing.assert_close(got[rq], alone[0].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_varlen_layouts_and_arguments():
    """Strided inputs (q, k, v as views of one packed (total, 3, H, D) tensor), int64 offsets,
    max_seqlen_* accepted and changing nothing, the LSE's layout (Hq, total_q), deterministic=."""
    lengths = [(30, 30), (0, 0), (50, 50), (9, 9)]
    total = sum(n for n, _ in lengths)
    qkv_packed = torch.randn(total, 3, 4, 16)
    q, k, v = qkv_packed.unbind(1)
    cu = cu_seqlens([n for n, _ in lengths])
    out, lse = opforge.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
    want, want_lse = reference.attention_varlen(
        q.double(), k.double(), v.double(), cu, cu, causal=True, return_lse=True
    )
    assert (out.double() - want).abs().max() < 2e-5
    assert lse.shape == (4, total) and lse.is_contiguous()
    assert (lse.double() - want_lse).abs().max() < 1e-4
    for kw in (dict(max_seqlen_q=50, max_seqlen_k=50), dict(max_seqlen_q=1, max_seqlen_k=0)):
        assert torch.equal(opforge.attention_varlen(q, k, v, cu.long(), cu.long(), causal=True, **kw), out)
    go = torch.randn_like(out)
    got = []
    for det in (None, True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = opforge.attention_varlen(*leaves, cu, cu, causal=True, deterministic=det)
        got.append(torch.autograd.grad(o, leaves, go))
    for a in got[1:]:
        for x, y in zip(got[0], a, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize(
    "kw", [dict(causal=True), dict(window=(2, 1), softcap=1.5)], ids=["causal", "window softcap"]
)
def test_varlen_gradcheck(kw):
    q, k, v, cu_q, cu_k = varlen_case([(3, 5), (0, 2), (4, 4), (2, 0), (2, 1)], 2, 1, 4, torch.float64)

    def f(q, k, v):
        out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
        return out, torch.where(lse.isfinite(), lse, 0.0)

    assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in (q, k, v)))


def test_varlen_output_is_contiguous():
    """The (total, H, D) output is contiguous whatever q's layout, head-major views included, as the
    docstring says (finding r7: it followed q's layout), with the same values."""
    q, k, v, cu_q, cu_k = varlen_case([(4, 6), (6, 3)], 2, 2, 8)
    want = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    for qv in (
        q,
        q.transpose(0, 1).contiguous().transpose(0, 1),
        q[:, :, None].expand(-1, -1, 2, -1)[:, :, 0],
    ):
        out, lse = opforge.attention_varlen(qv, k, v, cu_q, cu_k, causal=True, return_lse=True)
        assert out.is_contiguous() and lse.is_contiguous()
        assert torch.equal(out, want)
        out.view(out.shape[0], -1)  # (a view needs the contiguous layout)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_nan_stays_in_its_sequence(causal, device):
    """Bad values in one packed sequence's queries, keys, values or output cotangent reach that
    sequence only, though a kernel's tile may run past a sequence's end into the next one's rows: on
    the CPU NaN (NaN in, NaN out, there; every other sequence's output and gradients bit for bit those
    of the call without it); on CUDA huge finite values (the tiles read the next sequence's rows, as
    FlashAttention's do, where a weight of exactly 0 must cancel them; NaN and Inf are not cancelled
    by 0 there: docs/attention.md), the other sequences' outputs bit for bit those of the clean call,
    their gradients to the rounding of the order of additions."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    bad = float("nan") if device == "cpu" else 3e4
    lq, lk = [3, 1, 40, 7, 2], [37, 70, 130, 64, 5]  # (ends mid-tile and on tile boundaries)
    H, Hkv, D = 4, 2, 64
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(sum(lq), H, D, device=device, dtype=dtype)
    k = torch.randn(sum(lk), Hkv, D, device=device, dtype=dtype)
    v = torch.randn(sum(lk), Hkv, D, device=device, dtype=dtype)
    go = torch.randn_like(q)
    qs, ks = cu_q.tolist(), cu_k.tolist()
    qn, kn, vn, gon = q.clone(), k.clone(), v.clone(), go.clone()
    vn[ks[1] : ks[2]] = bad  # sequence 1's values
    gon[qs[1] : qs[2]] = bad  # and its output cotangent
    kn[ks[3]] = bad  # sequence 3's first key and first query
    qn[qs[3]] = bad
    vn[ks[4] - 1] = bad  # sequence 3's last value (the row before sequence 4's keys)

    def run(q_, k_, v_, go_):
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q_, k_, v_))
        out = opforge.attention_varlen(qg, kg, vg, cu_q, cu_k, causal=causal)
        out.backward(go_)
        return out.detach(), qg.grad, kg.grad, vg.grad

    clean, dirty = run(q, k, v, go), run(qn, kn, vn, gon)
    for b in (0, 2, 4):  # (sequences 1 and 3 hold the bad values)
        for name, c, d_ in zip(("out", "dq", "dk", "dv"), clean, dirty, strict=True):
            rows = slice(qs[b], qs[b + 1]) if name in ("out", "dq") else slice(ks[b], ks[b + 1])
            if device == "cpu" or name == "out":
                assert torch.equal(d_[rows], c[rows]), (b, name)
            else:
                torch.testing.assert_close(d_[rows], c[rows], atol=2e-2, rtol=2e-2, msg=f"{(b, name)}")
    if device == "cpu":
        assert dirty[0][qs[1] : qs[2]].isnan().all()  # (every query of sequence 1 sees its values)
    else:
        assert dirty[0][qs[1] : qs[2]].abs().amax() > 100  # (and its huge values)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_padded_rows_past_the_last_offset(causal, device):
    """Offsets ending before the packed length (a padded batch, as transformers pads continuous
    batching's steps and FlashAttention allows): the sequences' rows are those of the call without
    the padding, rows past the last offsets get zeros, an LSE of -inf and zero gradients, and the
    padding's values (NaN here) reach nothing."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lq, lk, pad_q, pad_k = [5, 0, 37, 1], [9, 4, 37, 70], 11, 6
    H, Hkv, D = 4, 2, 64
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device=device)
    nq, nk = sum(lq), sum(lk)
    q = torch.randn(nq + pad_q, H, D, device=device, dtype=dtype)
    k = torch.randn(nk + pad_k, Hkv, D, device=device, dtype=dtype)
    v = torch.randn(nk + pad_k, Hkv, D, device=device, dtype=dtype)
    for t, n in ((q, nq), (k, nk), (v, nk)):
        t[n:] = float("nan")
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = opforge.attention_varlen(qg, kg, vg, cu_q, cu_k, causal=causal, return_lse=True)
    want, want_lse = opforge.attention_varlen(
        q[:nq], k[:nk], v[:nk], cu_q, cu_k, causal=causal, return_lse=True
    )
    assert out.shape == q.shape and lse.shape == (H, nq + pad_q)
    assert torch.equal(out[:nq], want) and torch.equal(lse[:, :nq], want_lse)
    assert (out[nq:] == 0).all() and (lse[:, nq:] == -float("inf")).all()
    go = torch.randn_like(out)
    go[nq:] = float("nan")  # (the padding's cotangent must not reach any gradient either)
    out.backward(go)
    qw, kw_, vw = (t[:n].clone().requires_grad_(True) for t, n in ((q, nq), (k, nk), (v, nk)))
    opforge.attention_varlen(qw, kw_, vw, cu_q, cu_k, causal=causal).backward(go[:nq])
    for g, w, n in ((qg.grad, qw.grad, nq), (kg.grad, kw_.grad, nk), (vg.grad, vw.grad, nk)):
        assert torch.equal(g[:n], w) and (g[n:] == 0).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_varlen_check_offsets_false(device):
    """check_offsets=False (a caller vouching for its offsets): the checked call's outputs (to
    rounding on CUDA), padding rows zeros with an LSE of -inf; on CUDA no synchronization with the device (the offsets are not read on
    the host: sync debug mode "error" raises on any), and bad offsets stay inside the tensors
    (clamped: the call completes, values undefined); the CPU checks them either way."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lq, lk, pad_q, pad_k = [3, 0, 21, 1], [7, 2, 40, 33], 5, 4
    H, Hkv, D = 4, 2, 64
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int64, device=device)
    q = torch.randn(sum(lq) + pad_q, H, D, device=device, dtype=dtype)
    k = torch.randn(sum(lk) + pad_k, Hkv, D, device=device, dtype=dtype)
    v = torch.randn(sum(lk) + pad_k, Hkv, D, device=device, dtype=dtype)
    for causal in (False, True):
        want, want_lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            out, lse = opforge.attention_varlen(
                q, k, v, cu_q, cu_k, causal=causal, return_lse=True, check_offsets=False
            )
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        # (CUDA: the unchecked call runs its kernels on the whole tensors, the checked one on the rows
        # in sequences, which may choose another form: equal to rounding)
        tol = {} if device == "cpu" else {"atol": 1e-2, "rtol": 1e-2}
        torch.testing.assert_close(out, want, **tol)
        torch.testing.assert_close(lse, want_lse, **tol)
        n = sum(lq)
        assert (out[n:] == 0).all() and (lse[:, n:] == -float("inf")).all()
    bad_q = torch.tensor([0, 9, 4, 30, 10**6], dtype=torch.int32, device=device)  # (decreasing, past the end)
    bad_k = torch.tensor([-5, 3, 50, 2, 10**6], dtype=torch.int32, device=device)
    if device == "cpu":
        with pytest.raises(ValueError, match=r"opforge.attention_varlen: cu_seqlens_q must not decrease"):
            opforge.attention_varlen(q, k, v, bad_q, bad_k, check_offsets=False)
    else:
        out = opforge.attention_varlen(q, k, v, bad_q, bad_k, causal=True, check_offsets=False)
        torch.cuda.synchronize()  # (an out-of-bounds access would surface here)
        assert out.shape == q.shape
    with pytest.raises(TypeError, match=r"opforge.attention_varlen: check_offsets must be a bool, got int"):
        opforge.attention_varlen(q, k, v, cu_q, cu_k, check_offsets=1)
