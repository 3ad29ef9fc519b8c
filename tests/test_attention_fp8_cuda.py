"""The Hopper FP8 forward (opforge::attention_fp8): float8_e4m3fn q, k, v with (batch, kv_heads)
descales against the float64 attention of the dequantized inputs, with the allocator poisoned first
(an output row never written is NaN): patterns, GQA, head dims up to 128 (zero-padded in the
launcher), ragged lengths, sinks, softcap, packed sequences with each sequence's factors, CUDA graphs
(the offsets not read), FlashAttention's functions; and the calls it refuses. P is rounded to e4m3 (3
mantissa bits) before P V, so the bound on the output is the FP8 one (rounding P to e4m3 alone gives
about 2.5 % relative RMS error on zero-mean values; measured 1.9-2.5 % on an H100): here the largest
error under 7 % of the output's largest magnitude and the RMS error under 4 %, where a kernel that
pairs a P column with the wrong V row errs by the output's whole scale."""

from __future__ import annotations

import pytest
import torch
from attention_cases import cu_seqlens, fp8_op
from conftest import capture_cuda_graph, poison_cuda_allocator

import opforge
from opforge import reference
from opforge.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

pytestmark = pytest.mark.cuda
FP8 = torch.float8_e4m3fn
DEV = "cuda"


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def fp8_case(B, Hq, Hkv, Sq, Sk, D, Dv=None, spread=40.0):
    """Random FP8 q, k, v (normal values times `spread`, in e4m3's range), positive descales, and the
    dequantized inputs in float64 (on the GPU)."""
    Dv = D if Dv is None else Dv
    q, k, v = (
        torch.randn(B, h, s, d, device=DEV) * spread for h, s, d in ((Hq, Sq, D), (Hkv, Sk, D), (Hkv, Sk, Dv))
    )
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    descales = tuple(torch.rand(B, Hkv, device=DEV) * 0.02 + 0.002 for _ in range(3))
    truth = tuple(
        t.double() * d.double().repeat_interleave(t.shape[1] // Hkv, 1)[:, :, None, None]
        for t, d in zip((q8, k8, v8), descales, strict=True)
    )
    return (q8, k8, v8), descales, truth


def check_fp8_output(got, want):
    """got (bfloat16, no NaN: every row written) within FP8's bound of want (float64)."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert not got.isnan().any(), "an output element the kernel did not write (poisoned: NaN)"
    err = got.double() - want
    scale = want.abs().max().clamp_min(1e-30)
    assert (err.abs().max() / scale).item() <= 0.07, (err.abs().max() / scale).item()
    assert (err.pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30)).item() <= 0.04


def refused_off_hopper(q8, k8, v8) -> bool:
    """On a GPU without the Hopper kernel (not an sm_90 one): FP8 calls raise a NotImplementedError
    saying so (checked here; True: the caller's numbers do not apply), rather than being skipped."""
    if hopper():
        return False
    with pytest.raises(NotImplementedError, match=r"runs on the Hopper kernel"):
        opforge.attention(q8, k8, v8)
    return True


@pytest.mark.parametrize(
    "shape",
    [
        (2, 8, 2, 300, 333, 128, 128),
        (1, 4, 4, 129, 1000, 64, 64),
        (2, 6, 3, 257, 200, 96, 128),
        (1, 2, 1, 1, 77, 128, 64),
    ],
    ids=str,
)
@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(causal=True),
        dict(causal=True, window=(100, 0)),
        dict(window=(37, 64)),
        dict(softcap=3.0),
        "sinks",
    ],
    ids=str,
)
def test_fp8_cuda_matches_dequantized_reference(shape, kw):
    B, Hq, Hkv, Sq, Sk, D, Dv = shape
    (q8, k8, v8), (qd, kd, vd), (q, k, v) = fp8_case(B, Hq, Hkv, Sq, Sk, D, Dv)
    if refused_off_hopper(q8, k8, v8):
        return
    if kw == "sinks":
        kw = dict(causal=True, sinks=torch.randn(Hq, device=DEV) * 2)
    poison_cuda_allocator(B * Hq * Sq * 128 * 4, DEV)
    out, lse = opforge.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, **kw)
    ref_kw = {n: (x.double() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
    want, want_lse = reference.attention(q, k, v, return_lse=True, **ref_kw)
    check_fp8_output(out, want)
    assert lse.dtype == torch.float32
    seen = want_lse.isfinite()
    assert torch.equal(lse.isfinite(), seen)
    torch.testing.assert_close(lse.double()[seen], want_lse[seen], atol=5e-3, rtol=1e-3)


def test_fp8_cuda_without_descales_and_strided_inputs():
    """Descales of None (1) and q, k, v as (B, S, H, D) transposed views (transformers' layout): the
    same attention as of the FP8 values themselves; a descale doubling k halves nothing but the
    scores' scale (the softmax scale times q's and k's descales)."""
    (q8, k8, v8), _, _ = fp8_case(2, 4, 2, 200, 260, 128, spread=1.0)
    if refused_off_hopper(q8, k8, v8):
        return
    want = reference.attention(*(t.double() for t in (q8, k8, v8)), causal=True)
    check_fp8_output(opforge.attention(q8, k8, v8, causal=True), want)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q8, k8, v8))
    check_fp8_output(opforge.attention(qt, kt, vt, causal=True), want)
    two = torch.full((2, 2), 2.0, device=DEV)
    got = opforge.attention(q8, k8, v8, k_descale=two, scale=0.5 / 128**0.5)
    check_fp8_output(got, reference.attention(*(t.double() for t in (q8, k8, v8))))


def test_fp8_cuda_varlen_graph_and_flash_api():
    """Packed sequences (each row's sequence's descales, an empty sequence, rows past the last
    offset), the same under a CUDA graph (offsets not read), and FlashAttention's functions."""
    if refused_off_hopper(*fp8_case(1, 2, 1, 8, 8, 64)[0]):
        return
    lengths = [(5, 9), (300, 300), (0, 3), (130, 70)]
    cu_q, cu_k = (cu_seqlens([x[i] for x in lengths]).to(DEV) for i in (0, 1))
    tq, tk = int(cu_q[-1]) + 7, int(cu_k[-1])  # (7 rows past the last offset)
    qv = (torch.randn(tq, 4, 128, device=DEV) * 30).to(FP8)
    kv_, vv = ((torch.randn(tk, 2, 128, device=DEV) * 30).to(FP8) for _ in range(2))
    ds = tuple(torch.rand(4, 2, device=DEV) * 0.02 + 0.002 for _ in range(3))
    seq_q = torch.repeat_interleave(
        torch.arange(4, device=DEV), torch.tensor([a for a, _ in lengths], device=DEV)
    )
    seq_k = torch.repeat_interleave(
        torch.arange(4, device=DEV), torch.tensor([b for _, b in lengths], device=DEV)
    )
    scaled = [
        t[: len(rows)].double() * d.double().repeat_interleave(t.shape[1] // 2, 1)[rows][:, :, None]
        for t, d, rows in ((qv, ds[0], seq_q), (kv_, ds[1], seq_k), (vv, ds[2], seq_k))
    ]
    want = reference.attention_varlen(*scaled, cu_q, cu_k, causal=True)
    kw = dict(causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    poison_cuda_allocator(tq * 4 * 128 * 4, DEV)
    got = opforge.attention_varlen(qv, kv_, vv, cu_q, cu_k, **kw)
    check_fp8_output(got[: len(seq_q)], want)
    assert (got[len(seq_q) :] == 0).all()
    graph, graph_out = capture_cuda_graph(lambda: opforge.attention_varlen(qv, kv_, vv, cu_q, cu_k, **kw))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(graph_out, got, atol=0, rtol=0)
    fv = flash_attn_varlen_func(qv, kv_, vv, cu_q, cu_k, **kw)
    torch.testing.assert_close(fv, got, atol=0, rtol=0)
    (q8, k8, v8), (qd, kd, vd), _ = fp8_case(2, 4, 2, 64, 64, 128)
    fa = flash_attn_func(*(t.transpose(1, 2) for t in (q8, k8, v8)), q_descale=qd, k_descale=kd, v_descale=vd)
    torch.testing.assert_close(
        fa.transpose(1, 2),
        opforge.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd),
        atol=0,
        rtol=0,
    )


def test_fp8_cuda_refusals():
    """What the CUDA FP8 kernel does not take raises, naming it (any GPU: the checks come before the
    kernel); on a GPU without the Hopper kernel every FP8 call raises a NotImplementedError."""
    (q8, k8, v8), _, _ = fp8_case(1, 4, 2, 16, 16, 64)
    with pytest.raises(
        NotImplementedError, match=r"FP8 attention on CUDA takes no kv_lens, block_table or mask="
    ):
        opforge.attention(q8, k8, v8, kv_lens=torch.tensor([5], device=DEV))
    with pytest.raises(NotImplementedError, match=r"forward only \(sinks require grad\)"):
        opforge.attention(q8, k8, v8, sinks=torch.zeros(4, device=DEV, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"k_descale must be float32 \(batch, kv_heads\) = \(1, 2\)"):
        opforge.attention(q8, k8, v8, k_descale=torch.ones(1, 4, device=DEV))
    with pytest.raises(
        RuntimeError, match=r"opforge.attention: q must be one of \(float8_e4m3fn\), got bfloat16"
    ):
        fp8_op(q8.to(torch.bfloat16), k8, v8)
    if refused_off_hopper(q8, k8, v8):
        return
    big = (torch.randn(1, 2, 8, 192, device=DEV)).to(FP8)
    with pytest.raises(NotImplementedError, match=r"head dims up to 128, got q's 192"):
        opforge.attention(big, big, big)
    with pytest.raises(ValueError, match=r"variant 'mma_sync' is not an FP8 kernel"):
        opforge.attention(q8, k8, v8, variant="mma_sync")
