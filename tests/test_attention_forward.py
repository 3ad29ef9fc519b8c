"""opforge.attention's forward on the CPU: every pattern against a float64 reference with an explicit
boolean mask, dtypes, odd lengths, Sq != Sk, GQA, fully masked rows, layouts, SDPA agreement, NaN
and extreme inputs, the kernels by name (variant=)."""

from __future__ import annotations

import math

import pytest
import torch
from attention_cases import (
    DECODE_SHAPES,
    PATTERNS,
    SHAPES,
    TOL,
    errors,
    pattern_kwargs,
    qkv,
    ran,
)

import opforge
from opforge import reference
from opforge.masks import BlockMask, attention_mask, block_mask

# The CPU kernels' tests; the CUDA kernels' (float16/bfloat16) are in test_attention_cuda.py.
DEVICES = ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES + DECODE_SHAPES, ids=str)
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_forward_matches_reference(device, dtype, name, shape):
    B, Hq, _, Sq, Sk, _ = shape
    q, k, v = qkv(*shape, dtype=dtype, device=device)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
    want, want_lse = reference.attention(q.double(), k.double(), v.double(), return_lse=True, **kw)
    assert (
        out.shape == q.shape
        and out.dtype == dtype
        and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    )
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())  # exactly the rows that see nothing
    finite = want_lse.isfinite()
    lse_err = (lse.double() - want_lse)[finite].abs().max().item() if finite.any() else 0.0
    if dtype in TOL:
        assert errors(out, want, want)[0] <= TOL[dtype] and lse_err <= TOL[dtype] * 10
    else:  # 16-bit: within 2x the error of PyTorch's own attention in that dtype
        low = reference.attention(q, k, v, **kw)
        err, torch_err = errors(out, want, low)
        assert err <= 2 * torch_err + 1e-3, (err, torch_err)
        assert lse_err <= 1e-3 * max(1.0, want_lse[finite].abs().max().item() if finite.any() else 0.0)
    if not finite.all():  # fully masked rows: zeros
        assert (out.double()[~finite] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_16_bit(dtype):
    q, k, v = qkv(2, 4, 2, 130, 70, 32, dtype=dtype)
    for kw in (dict(causal=True), dict(window=(20, 20)), dict(prefix_len=10, causal=True, softcap=5.0)):
        want = reference.attention(q.double(), k.double(), v.double(), **kw)
        err, torch_err = errors(opforge.attention(q, k, v, **kw), want, reference.attention(q, k, v, **kw))
        assert err <= 2 * torch_err + 1e-3, (kw, err, torch_err)


def test_fully_masked_rows_and_their_gradients():
    """Rows that see no key: zeros, LSE -inf, no NaN in the output or any gradient; keys no query
    sees get zero dK and dV."""
    B, H, S, D = 1, 2, 70, 16
    dense = torch.rand(B, H, S, S) < 0.3
    dense[:, :, 5] = False  # query 5 sees nothing
    dense[:, :, :, 9] = False  # key 9 is seen by nobody
    mask = BlockMask.from_dense(dense, block_size=64)
    q, k, v = (t.double().requires_grad_() for t in qkv(B, H, H, S, S, D))
    out, lse = opforge.attention(q, k, v, mask=mask, return_lse=True)
    assert (out[:, :, 5] == 0).all() and (lse[:, :, 5] == -math.inf).all()
    (out.sum() + lse[lse.isfinite()].sum()).backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all()
    assert (q.grad[:, :, 5] == 0).all() and (k.grad[:, :, 9] == 0).all() and (v.grad[:, :, 9] == 0).all()
    # Sk = 0: every row sees nothing
    out, lse = opforge.attention(*qkv(1, 2, 2, 4, 0, 8), return_lse=True)
    assert out.shape == (1, 2, 4, 8) and (out == 0).all() and (lse == -math.inf).all()


def test_layouts():
    """(B, S, H, D) tensors viewed as (B, H, S, D) are read in place and the output is laid out
    like q; sliced and expanded inputs work too."""
    B, S, H, D = 2, 50, 4, 16
    qs, ks, vs = (torch.randn(B, S, H, D) for _ in range(3))
    q, k, v = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
    out = opforge.attention(q, k, v, causal=True)
    assert out.stride(1) < out.stride(2)  # (B, S, H, D) underneath
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert (out.double() - want).abs().max() < 2e-5
    big = torch.randn(B, H, 2 * S, 2 * D)
    sliced = big[:, :, ::2, 3 : 3 + D]
    out = opforge.attention(sliced, k, v)
    assert (out.double() - reference.attention(sliced.double(), k.double(), v.double())).abs().max() < 2e-5
    kx = torch.randn(B, 1, S, D).expand(B, H, S, D)
    out = opforge.attention(q, kx, kx)
    assert (out.double() - reference.attention(q.double(), kx.double(), kx.double())).abs().max() < 2e-5


@pytest.mark.parametrize("name", ["causal", "sliding", "softcap", "documents"])
def test_decode_row_layouts(name):
    """Decoding from caches whose rows hold every kv head ((B, S, Hkv, D) views, and heads expanded
    from one): the decode kernel then takes all kv heads of a key block in one task; the same result
    as the reference, with per-sequence key counts too."""
    torch.manual_seed(1)
    B, H, Hkv, Sq, Sk, D = 3, 8, 4, 3, 900, 32
    q, k, v = qkv(B, H, Hkv, Sq, Sk, D)
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        kw["segment_ids"] = (torch.randint(0, 3, (B, Sq)), torch.randint(0, 3, (B, Sk)))
    ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))  # (B, S, Hkv, D) underneath
    k1 = torch.randn(B, 1, Sk, D).expand(B, Hkv, Sk, D)
    lens = torch.tensor([Sk, 17, 600])
    for kk, vv, extra in ((ks, vs, {}), (ks, vs, {"kv_lens": lens}), (k1, k1, {})):
        if "kv_lens" in extra and "segment_ids" in kw:
            continue
        assert torch.ops.opforge._attention_kernel("cpu", H, Hkv, Sq, Sk, D) == "decode"
        out = opforge.attention(q, kk, vv, **kw, **extra)
        want = reference.attention(q.double(), kk.double(), vv.double(), **kw, **extra)
        assert (out.double() - want).abs().max().item() <= 2e-5


def test_matches_sdpa():
    q, k, v = qkv(2, 4, 4, 100, 100, 32)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert (opforge.attention(q, k, v, causal=True) - sdpa(q, k, v, is_causal=True)).abs().max() < 1e-5
    dense = attention_mask(2, 4, 100, 100, window=(7, 7))
    assert (opforge.attention(q, k, v, window=(7, 7)) - sdpa(q, k, v, attn_mask=dense)).abs().max() < 1e-5
    kg, vg = k[:, :2], v[:, :2]
    assert (opforge.attention(q, kg, vg) - sdpa(q, kg, vg, enable_gqa=True)).abs().max() < 1e-5
    assert (opforge.attention(q, k, v, scale=0.3) - sdpa(q, k, v, scale=0.3)).abs().max() < 1e-5


def test_int64_segment_ids_beyond_int32():
    """Ids that differ only above 32 bits stay different segments."""
    q, k, v = (t.double() for t in qkv(1, 1, 1, 4, 4, 8))
    seg = torch.tensor([[0, 0, 2**32, 2**32]])
    want = reference.attention(q, k, v, segment_ids=seg)
    assert (opforge.attention(q, k, v, segment_ids=seg) - want).abs().max() < 1e-12
    assert (want - reference.attention(q, k, v)).abs().max() > 1e-3  # the segments matter here


@pytest.mark.parametrize(
    "kw", [dict(window=(None, 2**63 - 1)), dict(window=(2**70, 2**63 - 1)), dict(prefix_len=2**70)]
)
def test_huge_window_and_prefix(kw):
    """Sides and prefixes beyond the sequence mean 'everything', without an overflow."""
    q, k, v = (t.double() for t in qkv(1, 2, 2, 7, 11, 8))
    want = reference.attention(q, k, v)
    assert (opforge.attention(q, k, v, **kw) - want).abs().max() < 1e-12
    assert (reference.attention(q, k, v, **kw) - want).abs().max() < 1e-12


def test_block_mask_without_keys():
    m = block_mask(lambda b, h, q, kv: q >= kv, None, None, 10, 0)
    assert m.to_dense().shape == (1, 1, 10, 0)
    assert BlockMask.from_dense(torch.ones(0, 0, dtype=torch.bool)).shape == (1, 1, 0, 0)
    out = opforge.attention(*qkv(1, 1, 1, 10, 0, 8), mask=m)
    assert out.shape == (1, 1, 10, 8) and (out == 0).all()


def test_unsorted_segment_ids():
    """Segment ids need not be sorted or contiguous (tokens of one id may be scattered)."""
    B, H, S, D = 2, 2, 150, 16
    q, k, v = (t.requires_grad_() for t in qkv(B, H, H, S, S, D))
    seg = torch.randint(0, 3, (B, S))
    for kw in (dict(segment_ids=seg), dict(segment_ids=seg, causal=True, window=(40, 0))):
        out = opforge.attention(q, k, v, **kw)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        want = reference.attention(qd, kd, vd, **kw)
        assert (out.double() - want).abs().max() < 2e-5
        go = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), go)
        ref = torch.autograd.grad(want, (qd, kd, vd), go.double())
        for g, w in zip(got, ref, strict=True):
            assert (g.double() - w).abs().max() <= 1e-4 * max(1.0, w.abs().max().item())


def test_small_and_large_numbers_in_range():
    q, k, v = qkv(1, 2, 2, 8, 8, 4)
    for kw in (dict(scale=0.0), dict(scale=1e-30), dict(softcap=1e-30, scale=1e-20), dict(softcap=1e30)):
        want = reference.attention(q.double(), k.double(), v.double(), **kw)
        assert (opforge.attention(q, k, v, **kw).double() - want).abs().max() < 1e-5, kw


def test_prefix_alone_is_prefix_lm():
    """prefix_len without causal or a window: prefix-LM (bidirectional over the prefix, causal after),
    never full attention; the raw op refuses a prefix with no band."""
    q, k, v = qkv(1, 2, 2, 40, 40, 8)
    got = opforge.attention(q, k, v, prefix_len=10)
    assert torch.equal(got, opforge.attention(q, k, v, prefix_len=10, causal=True))
    want = reference.attention(q.double(), k.double(), v.double(), prefix_len=10)
    assert (got.double() - want).abs().max() < 2e-5
    assert (got - opforge.attention(q, k, v)).abs().max() > 1e-3
    visible = attention_mask(1, 1, 40, 40, prefix_len=10)[0, 0]
    assert visible[0, :10].all() and not visible[0, 10:].any() and visible[20, :21].all()
    # With a window the prefix adds to it (no causal implied)
    got = opforge.attention(q, k, v, prefix_len=5, window=(3, 3))
    want = reference.attention(q.double(), k.double(), v.double(), prefix_len=5, window=(3, 3))
    assert (got.double() - want).abs().max() < 2e-5
    raw = torch.ops.opforge.attention.default
    with pytest.raises(ValueError, match=r"prefix_len \(10\) without causal or a window would see every key"):
        raw(q, k, v, 0.25, 0.0, False, -1, -1, 10, *(None,) * 5, 128, 128)


def test_variants_cpu():
    """variant= names the kernel; "auto" follows the rule (decode for few rows against many keys);
    the profiler shows which kernel ran; a named kernel gives the same numbers."""
    q, k, v = qkv(2, 8, 2, 1, 700, 16)  # 4 rows a kv head, 700 keys: auto decodes
    want = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert ran(lambda: opforge.attention(q, k, v, causal=True)) == {"opforge.attention.decode"}
    assert ran(lambda: opforge.attention(q, k, v, causal=True, variant="tiled")) == {
        "opforge.attention.tiled"
    }
    for variant in ("auto", "tiled", "decode"):
        assert (opforge.attention(q, k, v, causal=True, variant=variant).double() - want).abs().max() < 2e-5
    q2, k2, v2 = qkv(1, 2, 2, 50, 60, 16)  # 50 rows: auto tiles, decode takes up to 32
    assert ran(lambda: opforge.attention(q2, k2, v2)) == {"opforge.attention.tiled"}
    assert ran(lambda: opforge.attention(q2[:, :, :3], k2, v2, variant="decode")) == {
        "opforge.attention.decode"
    }
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 700, 16) == "decode"
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 100, 16) == "tiled"
    assert torch.ops.opforge._attention_kernel("cpu", 8, 2, 1, 100, 16, kv_lens=True) == "decode"
    # The backward after a decode forward runs the tiled backward
    qg = q.clone().requires_grad_()
    out = opforge.attention(qg, k, v, causal=True, variant="decode")
    assert ran(lambda: out.sum().backward(), "opforge.attention_backward") == {
        "opforge.attention_backward.tiled"
    }


@pytest.mark.parametrize("window", [None, (None, None)], ids=["no window", "unbounded window"])
def test_prefix_len_zero_is_an_empty_prompt(window):
    """One rule for every prefix_len: alone it is prefix-LM, so prefix_len=0 (an empty prompt) is
    causal and never lets a query see the future (finding r9: it was full attention); None is no
    prefix. The reference and the kernels agree."""
    q, k, _ = qkv(1, 2, 2, 12, 12, 12)
    v = torch.eye(12).expand(1, 2, 12, 12)  # out = the attention weights
    got = opforge.attention(q, k, v, prefix_len=0, window=window)
    assert torch.equal(got, opforge.attention(q, k, v, causal=True))
    assert got.triu(1).abs().max() == 0  # no weight on a later key
    want = reference.attention(q.double(), k.double(), v.double(), prefix_len=0, window=window)
    assert (got.double() - want).abs().max() < 2e-5
    assert attention_mask(1, 1, 12, 12, prefix_len=0, window=window)[0, 0].equal(
        torch.ones(12, 12, dtype=torch.bool).tril()
    )
    full = opforge.attention(q, k, v, prefix_len=None)
    assert full.triu(1).abs().max() > 0
    # with a bounded window a prefix adds keys to it: 0 adds none
    assert torch.equal(
        opforge.attention(q, k, v, prefix_len=0, window=(2, 2)), opforge.attention(q, k, v, window=(2, 2))
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["tiled", "decode"])
def test_nan_in_nan_out(variant, dtype):
    """A NaN in a query or a key makes the outputs and LSEs of the rows that see it NaN, and the
    gradients NaN, as SDPA does (finding r10: an LSE of -inf and zero gradients hid it); rows that do
    not see it stay as they were."""
    Sq = 1 if variant == "decode" else 6
    q, k, v = qkv(1, 2, 2, Sq, 300, 8, dtype=dtype)
    qn = q.clone()
    qn[0, 0, 0, 0] = math.nan
    out, lse = opforge.attention(qn, k, v, return_lse=True, variant=variant)
    assert out[0, 0, 0].isnan().all() and lse[0, 0, 0].isnan()
    assert not out[0, 1].isnan().any() and not lse[0, 1].isnan().any()
    kn = k.clone()
    kn[0, 1, 290, 3] = math.nan  # the last query row sees key 290 with causal, the first does not
    out, lse = opforge.attention(q, kn, v, return_lse=True, causal=True, variant=variant)
    sees = torch.arange(Sq) + 300 - Sq >= 290
    assert torch.equal(out[0, 1].isnan().all(-1), sees) and torch.equal(lse[0, 1].isnan(), sees)
    assert not out[0, 0].isnan().any()
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), kn.double(), v.double(), is_causal=False, attn_mask=None
    )
    if variant == "tiled" and dtype != torch.bfloat16:  # gradients: NaN where SDPA's are
        qg, kg, vg = (t.clone().requires_grad_() for t in (qn, k, v))
        opforge.attention(qg, kg, vg).sum().backward()
        qs, ks, vs = (t.double().clone().requires_grad_() for t in (qn, k, v))
        torch.nn.functional.scaled_dot_product_attention(qs, ks, vs).sum().backward()
        for g, w in ((qg, qs), (kg, ks), (vg, vs)):
            assert w.grad.isnan().any() and torch.equal(g.grad.isnan(), w.grad.isnan())
    assert want.isnan().any()  # (SDPA: NaN in, NaN out)


def test_scale_as_a_tensor():
    """scale may be a one-element tensor, as torch.nn.functional.scaled_dot_product_attention takes it
    (finding r8: refused as "not a finite number"); other tensors are a TypeError."""
    q, k, v = qkv(1, 2, 2, 5, 7, 8)
    want = opforge.attention(q, k, v, scale=0.5)
    assert torch.equal(opforge.attention(q, k, v, scale=torch.tensor(0.5)), want)
    assert torch.equal(opforge.attention(q, k, v, scale=torch.tensor([0.5], dtype=torch.float64)), want)
    with pytest.raises(TypeError, match=r"opforge.attention: scale must be a number or a one-element real"):
        opforge.attention(q, k, v, scale=torch.tensor([0.5, 0.5]))
    with pytest.raises(TypeError, match=r"opforge.attention: scale must be a number, got str"):
        opforge.attention(q, k, v, scale="0.5")
    with pytest.raises(ValueError, match=r"opforge.attention: scale must be finite, got nan"):
        opforge.attention(q, k, v, scale=torch.tensor(math.nan))


def test_attention_form_cpu():
    """torch.ops.opforge._attention_form on the CPU names the kernel the call runs (no Hopper forms
    there), as the profiler's scopes show; bad sizes are a ValueError naming the op."""
    form = torch.ops.opforge._attention_form
    cpu = torch.device("cpu")
    q, k, v = qkv(1, 8, 2, 1, 600, 16)
    lens = torch.tensor([600])
    assert form(cpu, 8, 2, 1, 600, 16, True) == "decode"
    assert ran(lambda: opforge.attention(q, k, v, kv_lens=lens)) == {"opforge.attention.decode"}
    assert form(cpu, 8, 2, 40, 600, 16, True) == "tiled"
    q40 = torch.randn(1, 8, 40, 16)
    assert ran(lambda: opforge.attention(q40, k, v, kv_lens=lens)) == {"opforge.attention.tiled"}
    assert form(cpu, 8, 2, 1, 600, 16, True, "tiled") == "tiled"
    assert form(cpu, 8, 8, 300, 300, 64, backward=True, causal=True, deterministic=True) == "tiled"
    with pytest.raises(ValueError, match=r"opforge._attention_form: needs heads a multiple of kv_heads"):
        form(cpu, 8, 3, 1, 600, 16)
    with pytest.raises(ValueError, match=r"variant 'hopper' has no kernel here"):
        form(cpu, 8, 2, 1, 600, 16, variant="hopper")
