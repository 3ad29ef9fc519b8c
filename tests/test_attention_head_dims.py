"""v's head dim different from q's and k's (DeepSeek's MLA: q, k (..., 192), v and out (..., 128)): every
path (the pattern kernels, decode with key counts, paged caches, packed sequences, sinks), gradients,
the transforms, FlashAttention's API and the errors, against the float64 reference (a plain softmax
times v, whatever v's width)."""

from __future__ import annotations

import pytest
import torch
from attention_cases import pattern_kwargs, to_pages
from conftest import DEVICES, poison_cuda_allocator

import opforge
from opforge import reference
from opforge.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

DIMS = [(192, 128), (64, 96), (40, 24)]


def qkv(B, Hq, Hkv, Sq, Sk, dqk, dv, dtype, device):
    q = torch.randn(B, Hq, Sq, dqk, dtype=dtype, device=device)
    k = torch.randn(B, Hkv, Sk, dqk, dtype=dtype, device=device)
    v = torch.randn(B, Hkv, Sk, dv, dtype=dtype, device=device)
    return q, k, v


def bound(got, want, low, dtype):
    err = (got.double() - want).abs().max().item()
    if dtype == torch.float64:
        return err <= 1e-9 * max(1.0, want.abs().max().item()), err
    if dtype == torch.float32:
        return err <= 2e-4 * max(1.0, want.abs().max().item()), err
    torch_err = (low.double() - want).abs().max().item()
    return err <= 2 * torch_err + 2e-3, (err, torch_err)


CASES = [
    ("cpu", torch.float64),
    ("cpu", torch.bfloat16),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.cuda),
]


@pytest.mark.parametrize("name", ["full", "causal", "sliding", "documents", "softcap"])
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize(("device", "dtype"), CASES, ids=str)
def test_head_dims_match_reference(device, dtype, dims, name):
    """Output (v's head dim, q's layout), LSE and the gradients of q, k, v (and sinks) against the
    float64 reference."""
    B, Hq, Hkv, Sq, Sk = 2, 4, 2, 70, 90
    q, k, v = qkv(B, Hq, Hkv, Sq, Sk, *dims, dtype, device)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    if "segment_ids" in kw:
        ids = kw["segment_ids"]
        kw["segment_ids"] = tuple(t.to(device) for t in ids) if isinstance(ids, tuple) else ids.to(device)
    sinks = torch.randn(Hq, device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    if device != "cpu":
        poison_cuda_allocator(q.numel() * 8, device)
    out, lse = opforge.attention(*leaves[:3], sinks=leaves[3], return_lse=True, **kw)
    wants = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    want, want_lse = reference.attention(*wants[:3], sinks=wants[3], return_lse=True, **kw)
    lows = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    low, low_lse = reference.attention(*lows[:3], sinks=lows[3].to(dtype), return_lse=True, **kw)
    assert out.shape == (B, Hq, Sq, dims[1]) and out.dtype == dtype and not out.isnan().any()
    ok, err = bound(out, want, low, dtype)
    assert ok, ("out", err)
    assert (lse.double() - want_lse).abs().max().item() <= (1e-9 if dtype == torch.float64 else 2e-2)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), leaves)
    exp = torch.autograd.grad((want * go.double()).sum() + (want_lse * gl.double()).sum(), wants)
    lo = torch.autograd.grad((low.float() * go.float()).sum() + (low_lse.float() * gl.float()).sum(), lows)
    for n, g, w, l0, leaf in zip("qkvs", got, exp, lo, leaves, strict=True):
        assert g.shape == leaf.shape and not g.isnan().any(), n
        ok, err = bound(g, w, l0, dtype)
        assert ok, (n, err)


@pytest.mark.parametrize("device", DEVICES)
def test_head_dims_decode_paged_varlen(device):
    """Decoding with key counts (a sequence with none), the same keys in paged caches (k and v caches
    of different widths), and packed sequences, against the reference."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    q, k, v = qkv(3, 8, 2, 2, 300, 192, 128, dtype, device)
    lens = torch.tensor([300, 0, 111], device=device)
    out = opforge.attention(q, k, v, kv_lens=lens, causal=True)
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, causal=True)
    assert out.shape == (3, 8, 2, 128)
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=0)
    kc, vc, table = to_pages(k, v, lens.cpu(), 16)
    assert vc.shape[-1] == 128
    paged = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True)
    torch.testing.assert_close(paged, out, atol=tol, rtol=0)
    empty = opforge.attention(q[:, :, :0], kc, vc, kv_lens=lens, block_table=table, causal=True)
    assert empty.shape == (3, 8, 0, 128)
    cu = torch.tensor([0, 5, 5, 40], dtype=torch.int32, device=device)
    qp, kp, vp = (
        t[0].transpose(0, 1)[:40].contiguous() for t in qkv(1, 4, 2, 40, 40, 192, 128, dtype, device)
    )
    packed = opforge.attention_varlen(qp, kp, vp, cu, cu, causal=True)
    want = reference.attention_varlen(qp.double(), kp.double(), vp.double(), cu, cu, causal=True)
    assert packed.shape == (40, 4, 128) and packed.is_contiguous()
    torch.testing.assert_close(packed.double(), want, atol=tol, rtol=0)


def test_head_dims_transforms_opcheck_and_flash_api():
    """torch.func (grad, jvp, vmap), opcheck of both ops (fake kernels give out and dv v's width),
    torch.compile, and FlashAttention's functions with v narrower than q and k."""
    q, k, v = qkv(2, 4, 2, 9, 11, 24, 16, torch.float64, "cpu")
    kw = dict(causal=True)
    got = torch.func.grad(lambda *a: opforge.attention(*a, **kw).sin().sum(), (0, 1, 2))(q, k, v)
    want = torch.func.grad(lambda *a: reference.attention(*a, **kw).sin().sum(), (0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v))
    torch.testing.assert_close(
        torch.func.jvp(lambda *a: opforge.attention(*a, **kw), (q, k, v), tangents),
        torch.func.jvp(lambda *a: reference.attention(*a, **kw), (q, k, v), tangents),
    )
    batched = torch.func.vmap(lambda q: opforge.attention(q, k, v, **kw))(torch.stack([q, -q]))
    torch.testing.assert_close(batched[1], reference.attention(-q, k, v, **kw))
    args = opforge.ops.attention.checks.pattern_args(q, k, True, None, None, None, None)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.opforge.attention.default, (qf, kf, vf, 0.2, 0.0, *args))
    compiled = torch.compile(lambda q: opforge.attention(q, kf, vf, causal=True), fullgraph=True)
    torch.testing.assert_close(compiled(qf), opforge.attention(qf, kf, vf, causal=True))
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    assert out.shape == (2, 9, 4, 16)
    torch.testing.assert_close(out.transpose(1, 2), reference.attention(q, k, v, **kw))
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    packed = flash_attn_varlen_func(
        *(t.transpose(1, 2).flatten(0, 1) for t in (q, k, v)),
        cu,
        torch.tensor([0, 11, 22], dtype=torch.int32),
    )
    assert packed.shape == (18, 4, 16)
    torch.testing.assert_close(  # (each batch row its own sequence: the full attention of it)
        packed.view(2, 9, 4, 16).transpose(1, 2), reference.attention(q, k, v)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_head_dims_errors(device):
    """k and v of other (batch, heads, sequence) sizes, and a backward whose out or grad_out does not
    have v's head dim, are RuntimeErrors naming them."""
    q, k, v = qkv(1, 4, 2, 5, 7, 32, 16, torch.float32 if device == "cpu" else torch.bfloat16, device)
    with pytest.raises(RuntimeError, match=r"opforge.attention: k and v must have the same shape but for"):
        opforge.attention(q, k, v[:, :, :6])
    args = (False, -1, -1, 0, None, None, None, None, None, 128, 128)
    out, lse = torch.ops.opforge.attention(q, k, v, 0.2, 0.0, *args)
    assert out.shape == (1, 4, 5, 16)
    with pytest.raises(
        RuntimeError, match=r"opforge.attention_backward: grad_out must be \(batch, heads, queries\)"
    ):
        torch.ops.opforge.attention_backward(torch.ones_like(q), q, k, v, out, lse, None, 0.2, 0.0, *args)


# The Hopper forward's own head-dim-192 kernels (attention_heuristics.h: hopper_fwd_dims), by the traits
# the profiler names (HopperFwdTraits<kD, kBlockN, kStages, kConsumers, kPingPong, kStageMask,
# kPersistent, kKvCache, kDV>, blanks removed).
NATIVE = {
    (192, 128): "HopperFwdTraits<192,128,2,2,true,false,false,{cache},128,false>",
    (192, 192): "HopperFwdTraits<192,96,2,2,true,false,false,{cache},192,false>",
}


def _check_native(q, k, v, kw, traits, dtype):
    from attention_cuda_cases import kernel_names

    poison_cuda_allocator(q.numel() * 8, "cuda")
    names = [n.replace(" ", "") for n in kernel_names(lambda: opforge.attention(q, k, v, **kw))]
    assert any(traits in n for n in names), (traits, names)
    out, lse = opforge.attention(q, k, v, return_lse=True, **kw)
    kr, vr = k.nan_to_num(0.0), v.nan_to_num(0.0)  # (NaN past the key counts: never read)
    want, want_lse = reference.attention(q.double(), kr.double(), vr.double(), return_lse=True, **kw)
    low = reference.attention(q, kr, vr, **{key: val for key, val in kw.items() if key != "sinks"})
    assert out.shape == (*q.shape[:3], v.shape[-1]) and out.dtype == dtype and not out.isnan().any()
    if "sinks" not in kw:  # (the bound: twice PyTorch's own error in the dtype)
        ok, err = bound(out, want, low, dtype)
        assert ok, err
    else:
        err = (out.double() - want).abs().max().item()
        assert err <= 2e-2, err
    finite = want_lse.isfinite()
    assert torch.equal(lse.isinf(), ~finite)
    assert (lse.double() - want_lse)[finite].abs().max().item() <= 2e-2


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dims", list(NATIVE), ids=lambda d: f"{d[0]}-{d[1]}")
def test_native_head_dim_192_forward(dims, dtype):
    """q, k at 192 with v at 128 or 192 run the Hopper forward's own kernels (not padded to 256):
    the profiler sees their traits, and output and LSE match the float64 reference over many key
    tiles: causal with more keys than queries, a window, softcap, GQA, sinks, key counts (the
    KV-cache form; NaN past each count), v of 96 columns (zero-padded to 128), head dim 160 (to 192)."""
    dqk, dv = dims
    traits = NATIVE[dims]
    q, k, v = qkv(2, 8, 2, 700, 1000, dqk, dv, dtype, "cuda")
    sinks = torch.randn(8, device="cuda")
    for kw in (
        dict(causal=True),
        dict(causal=True, window=(300, 0), softcap=20.0),
        dict(causal=True, sinks=sinks),
        {},
    ):
        _check_native(q, k, v, kw, traits.format(cache="false"), dtype)
    lens = torch.tensor([1000, 333], device="cuda")
    kn, vn = k.clone(), v.clone()
    kn[1, :, 333:], vn[1, :, 333:] = float("nan"), float("nan")
    _check_native(q[:, :, :200], kn, vn, dict(kv_lens=lens, causal=True), traits.format(cache="true"), dtype)
    q2, k2, v2 = qkv(1, 4, 4, 300, 300, 160, dv - 32, dtype, "cuda")
    _check_native(q2, k2, v2, dict(causal=True), traits.format(cache="false"), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [4, 2], ids=lambda r: f"{16 * r}rows")
def test_head_dims_decode_rows_at_the_wider_head_dim(rows):
    """q at 64 with v at 192 decodes at the wider head dim's kernel (256: at most 32 query rows a kv
    head): 64 rows take the tiled kernels, 32 the decode kernel; both match the reference."""
    q, k, v = qkv(1, 16, 1, rows, 2000, 64, 192, torch.bfloat16, "cuda")
    lens = torch.tensor([1500], device="cuda")
    poison_cuda_allocator(q.numel() * 64, "cuda")
    out = opforge.attention(q, k, v, kv_lens=lens, causal=True)
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, causal=True)
    assert out.shape == (1, 16, rows, 192)
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=0)


@pytest.mark.cuda
def test_native_head_dim_192_paged_hopper():
    """DeepSeek's MLA over paged caches of two widths at FlashMLA's page size 64 (not a multiple of
    the (192, 192) forward's 96-key tile, nor a divisor): the pages are gathered, so the page size
    does not restrict the kernel; variant="hopper" serves it (its KV-cache form), as the form says."""
    q, k, v = qkv(2, 16, 2, 300, 900, 192, 128, torch.bfloat16, "cuda")
    lens = torch.tensor([900, 555], device="cuda")
    kc, vc, table = to_pages(k, v, lens.cpu(), 64)
    out = opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True, variant="hopper")
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, causal=True)
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=0)
    form = torch.ops.opforge._attention_form(
        q.device, 16, 2, 300, 900, 192, True, batch=2, page_size=64, causal=True
    )
    assert form == "hopper/cache", form


@pytest.mark.cuda
def test_native_head_dim_192_varlen():
    """Packed sequences at (192, 128) and (192, 192) against the float64 reference."""
    cu = torch.tensor([0, 130, 131, 600, 1000], dtype=torch.int32, device="cuda")
    for dqk, dv in NATIVE:
        q, k, v = (
            t[0].transpose(0, 1).contiguous()
            for t in qkv(1, 8, 2, 1000, 1000, dqk, dv, torch.bfloat16, "cuda")
        )
        poison_cuda_allocator(q.numel() * 8, "cuda")
        out = opforge.attention_varlen(q, k, v, cu, cu, causal=True)
        want = reference.attention_varlen(q.double(), k.double(), v.double(), cu, cu, causal=True)
        assert out.shape == (1000, 8, dv) and not out.isnan().any()
        torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("dims", list(NATIVE), ids=lambda d: f"{d[0]}-{d[1]}")
def test_native_head_dim_192_backward(dims):
    """The Hopper backward at head dim 192 (its head-dim layout in thirds: each warpgroup a 64-column
    panel and half of the third; v of 128 its own: dP 128 deep, dV one panel a warpgroup) runs its own kernel, and dq, dk, dv
    match the float64 reference over many tiles (causal with more keys than queries, a window, full,
    GQA); deterministic mode's kernel gives bitwise equal gradients twice."""
    from attention_cuda_cases import kernel_names

    dqk, dv = dims
    q, k, v = qkv(2, 8, 2, 500, 700, dqk, dv, torch.bfloat16, "cuda")
    go = torch.randn(2, 8, 500, dv, device="cuda", dtype=torch.bfloat16)

    def run(kw):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(opforge.attention(*leaves, **kw), leaves, go)

    names = [n.replace(" ", "") for n in kernel_names(lambda: run(dict(causal=True)))]
    # (HopperBwdTraits<kD, kBlockM, kBlockN, kStages, kDQAtomic, regs, regs, kStageMask, kDV>: v's own
    # head dim at 128)
    assert any(f"HopperBwdTraits<192,64,64,2,true,24,240,false,{dv}>" in n for n in names), names
    for kw in (dict(causal=True), dict(causal=True, window=(200, 0)), {}):
        poison_cuda_allocator(q.numel() * 16, "cuda")
        got = run(kw)
        wants = [t.double().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(reference.attention(*wants, **kw), wants, go.double())
        lows = [t.clone().requires_grad_() for t in (q, k, v)]
        low = torch.autograd.grad(reference.attention(*lows, **kw), lows, go)
        for n, g, w, lo, t in zip("qkv", got, want, low, (q, k, v), strict=True):
            assert g.shape == t.shape and not g.isnan().any(), n
            ok, err = bound(g, w, lo, torch.bfloat16)
            assert ok, (n, kw, err)
    det = dict(causal=True, deterministic=True)
    names = [n.replace(" ", "") for n in kernel_names(lambda: run(det))]
    assert any(f"HopperBwdTraits<192,64,64,1,false,24,240,false,{dv}>" in n for n in names), names
    first, second = run(det), run(det)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    plain = run(dict(causal=True))  # (the same gradients as the plain kernel's, to rounding)
    for a, b in zip(first, plain, strict=True):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("d", [96, 80])
def test_native_head_dim_96_forward(d):
    """Head dims 65-96 run the Hopper forward at 96 (two 64-column panels, S 96 deep, P V 96 wide; 80
    zero-padded to 96), the profiler sees its traits, and causal, a window with GQA, and key counts
    (its KV-cache form) match the float64 reference."""
    from attention_cuda_cases import kernel_names

    q, k, v = qkv(2, 8, 2, 600, 900, d, d, torch.bfloat16, "cuda")
    names = [n.replace(" ", "") for n in kernel_names(lambda: opforge.attention(q, k, v, causal=True))]
    assert any("HopperFwdTraits<96,128,2,2,true,false,false,false,96,false>" in n for n in names), names
    for kw in (dict(causal=True), dict(causal=True, window=(250, 0))):
        _check_native(q, k, v, kw, "HopperFwdTraits<96,128,2,2,true", torch.bfloat16)
    lens = torch.tensor([900, 400], device="cuda")
    _check_native(
        q[:, :, :300],
        k,
        v,
        dict(kv_lens=lens, causal=True),
        "HopperFwdTraits<96,128,2,2,true",
        torch.bfloat16,
    )


@pytest.mark.cuda
@pytest.mark.parametrize(("dqk", "dv"), [(64, 192), (192, 64), (8, 8)])
def test_operands_whole_panels_past_their_width(dqk, dv):
    """Operands much narrower than the kernel's head dims, read in place: whole TMA boxes past a
    tensor's columns (q, k at 64 in the (192, 192) forward and the 192 backward; v, dO at 64 in the
    (192, 128) backward; 8 columns in the 64 kernels) land as zeros and complete their barriers:
    output, LSE and gradients match the float64 reference."""
    q, k, v = qkv(2, 4, 2, 300, 400, dqk, dv, torch.bfloat16, "cuda")
    go = torch.randn(2, 4, 300, dv, device="cuda", dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    poison_cuda_allocator(q.numel() * 32, "cuda")
    out, lse = opforge.attention(*leaves, causal=True, return_lse=True)
    got = torch.autograd.grad(out, leaves, go)
    wants = [t.double().requires_grad_() for t in (q, k, v)]
    want, want_lse = reference.attention(*wants, causal=True, return_lse=True)
    exp = torch.autograd.grad(want, wants, go.double())
    lows = [t.clone().requires_grad_() for t in (q, k, v)]
    low = reference.attention(*lows, causal=True)
    lo = torch.autograd.grad(low, lows, go)
    ok, err = bound(out, want, low, torch.bfloat16)
    assert ok and out.shape == (2, 4, 300, dv), err
    assert (lse.double() - want_lse).abs().max().item() <= 2e-2
    for n, g, w, l0 in zip("qkv", got, exp, lo, strict=True):
        ok, err = bound(g, w, l0, torch.bfloat16)
        assert ok and not g.isnan().any(), (n, err)
