"""FP8 attention (FlashAttention-3's contract): float8_e4m3fn q, k, v with (batch, kv_heads) float32
descale factors, bfloat16 output, forward only. On the CPU against the float64 attention of the
dequantized inputs (every path: patterns, key counts, paged caches, packed sequences with each
sequence's factors, sinks, FlashAttention's functions) and the errors; the CUDA kernel's cases are
test_attention_fp8_cuda.py's."""

from __future__ import annotations

import pytest
import torch
from attention_cases import cu_seqlens, fp8_op, to_pages

import opforge
from opforge import reference
from opforge.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

FP8 = torch.float8_e4m3fn


def fp8_case(B, Hq, Hkv, Sq, Sk, D, device="cpu"):
    """FP8 tensors (values scaled into e4m3's range) and positive descales, and their float64 truth."""
    q, k, v = (torch.randn(B, h, s, D, device=device) * 40 for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    descales = tuple(torch.rand(B, Hkv, device=device) * 0.05 + 0.005 for _ in range(3))
    group = Hq // Hkv
    truth = tuple(
        t.double() * d.double().repeat_interleave(t.shape[1] // Hkv, 1)[:, :, None, None]
        for t, d in zip((q8, k8, v8), descales, strict=True)
    )
    assert group * Hkv == Hq
    return (q8, k8, v8), descales, truth


def rel_err(got, want):
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize(
    "kw", [{}, dict(causal=True), dict(causal=True, window=(20, 0)), dict(softcap=5.0)], ids=str
)
def test_fp8_matches_dequantized_reference(kw):
    """Output (bfloat16) and LSE against the float64 attention of the dequantized inputs: within the
    output's own rounding (bf16: relative 2^-8) and the LSE to float32 accuracy; GQA, and sinks."""
    (q8, k8, v8), (qd, kd, vd), (q, k, v) = fp8_case(2, 8, 2, 70, 90, 64)
    sinks = torch.randn(8)
    out, lse = opforge.attention(
        q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, sinks=sinks, **kw
    )
    want, want_lse = reference.attention(q, k, v, return_lse=True, sinks=sinks.double(), **kw)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and out.shape == want.shape
    assert rel_err(out, want) <= 2**-8
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    plain = opforge.attention(q8, k8, v8, **kw)  # (descales of 1)
    assert rel_err(plain, reference.attention(*(t.double() for t in (q8, k8, v8)), **kw)) <= 2**-8


def test_fp8_kv_lens_paged_varlen_and_flash_api():
    """Decoding with key counts and on paged caches (each sequence's descale after its pages), packed
    sequences (each row scaled by its sequence's factors) and FlashAttention's two functions."""
    (q8, k8, v8), (qd, kd, vd), (q, k, v) = fp8_case(3, 8, 2, 1, 300, 64)
    lens = torch.tensor([300, 0, 123])
    out = opforge.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, kv_lens=lens, causal=True)
    want = reference.attention(q, k, v, kv_lens=lens, causal=True)
    assert rel_err(out, want) <= 2**-8 and (out[1] == 0).all()
    kc, vc, table = to_pages(k8.float(), v8.float(), lens, 16)  # (e4m3 values: exact in float32 and back)
    kc, vc = kc.to(FP8), vc.to(FP8)
    paged = opforge.attention(
        q8, kc, vc, q_descale=qd, k_descale=kd, v_descale=vd, kv_lens=lens, block_table=table, causal=True
    )
    torch.testing.assert_close(paged, out, atol=0, rtol=0)
    lengths = [(5, 9), (40, 40), (0, 3)]
    cu_q, cu_k = cu_seqlens([a for a, _ in lengths]), cu_seqlens([b for _, b in lengths])
    qv = (torch.randn(45, 4, 32) * 30).to(FP8)
    kv_, vv = ((torch.randn(52, 2, 32) * 30).to(FP8) for _ in range(2))
    ds = tuple(torch.rand(3, 2) * 0.1 + 0.01 for _ in range(3))
    got = opforge.attention_varlen(
        qv, kv_, vv, cu_q, cu_k, causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2]
    )
    seq_q = torch.tensor([0] * 5 + [1] * 40)
    seq_k = torch.tensor([0] * 9 + [1] * 40 + [2] * 3)
    scaled = [
        t.double() * d.double().repeat_interleave(t.shape[1] // 2, 1)[rows][:, :, None]
        for t, d, rows in ((qv, ds[0], seq_q), (kv_, ds[1], seq_k), (vv, ds[2], seq_k))
    ]
    want = reference.attention_varlen(*scaled, cu_q, cu_k, causal=True)
    assert got.dtype == torch.bfloat16 and rel_err(got, want) <= 2**-8
    fa = flash_attn_func(*(t.transpose(1, 2) for t in (q8, k8, v8)), q_descale=qd, k_descale=kd, v_descale=vd)
    torch.testing.assert_close(
        fa.transpose(1, 2), opforge.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    )
    fv = flash_attn_varlen_func(
        qv, kv_, vv, cu_q, cu_k, causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2]
    )
    torch.testing.assert_close(fv, got)


def test_fp8_errors():
    """Mixed dtypes, descales of the wrong shape or dtype, descales with bfloat16 inputs and gradients
    are errors naming the argument."""
    (q8, k8, v8), (qd, _, _), _ = fp8_case(2, 4, 2, 5, 7, 16)
    with pytest.raises(RuntimeError, match=r"opforge.attention: FP8 attention .* got k in bfloat16"):
        opforge.attention(q8, k8.to(torch.bfloat16), v8)
    with pytest.raises(
        RuntimeError, match=r"opforge.attention: k_descale must be float32 \(batch, kv_heads\) = \(2, 2\)"
    ):
        opforge.attention(q8, k8, v8, k_descale=torch.ones(2, 4))
    with pytest.raises(RuntimeError, match=r"opforge.attention: q_descale must be float32 .* got float64"):
        opforge.attention(q8, k8, v8, q_descale=qd.double())
    with pytest.raises(RuntimeError, match=r"got q in bfloat16"):
        opforge.attention(*(t.to(torch.bfloat16) for t in (q8, k8, v8)), q_descale=qd)
    with pytest.raises(TypeError, match=r"v_descale must be a tensor or None, got float"):
        opforge.attention(q8, k8, v8, v_descale=0.5)
    with pytest.raises(NotImplementedError, match=r"FP8 attention is forward only \(q requires grad\)"):
        opforge.attention(q8.clone().requires_grad_(), k8, v8)


def test_fp8_op_fake_and_cpu_dispatch():
    """opforge::attention_fp8's fake kernel (torch.compile, meta tensors): a bfloat16 output of v's
    head dim and a float32 LSE, an FP8-only check; on CPU tensors the op has no kernel (the wrapper
    dequantizes there instead)."""
    q, k, v = (torch.empty(2, h, 9, d, device="meta", dtype=FP8) for h, d in ((4, 64), (2, 64), (2, 32)))
    out, lse = fp8_op(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 4, 9, 32)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (2, 4, 9)
    with pytest.raises(RuntimeError, match=r"FP8 attention takes q, k and v in float8_e4m3fn, got v in"):
        fp8_op(q, k, v.to(torch.bfloat16), causal=True)
    (q8, k8, v8), _, _ = fp8_case(1, 2, 1, 4, 4, 16)
    with pytest.raises(NotImplementedError):
        fp8_op(q8, k8, v8)
