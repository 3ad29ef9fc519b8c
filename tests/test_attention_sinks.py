"""Attention sinks (``sinks=``, gpt-oss): one logit a query head in every row's softmax, with no value.
Every kernel and path (tiled / Hopper / mma.sync forward, decode, key counts, paged caches, packed
sequences) against the float64 reference written with the sink as one more score column, gradients of
q, k, v and the sinks, the torch.func transforms, double backward, and the argument errors."""

from __future__ import annotations

import math

import pytest
import torch
from attention_cases import TOL, cu_seqlens, pattern_kwargs, poison_cpu_allocator, qkv, to_pages
from conftest import DEVICES, poison_cuda_allocator

import opforge
from opforge import reference

CUDA = pytest.mark.cuda


def sinks_for(H, device, dtype=torch.float32):
    """Sinks that matter: around the rows' LSE (log of the keys, a few units), some far below (no
    effect) and far above (the sink takes nearly all the weight)."""
    s = torch.randn(H, dtype=torch.float64) * 2 + 3
    s[0] = -30.0
    if H > 2:
        s[-1] = 12.0
    return s.to(device=device, dtype=dtype)


def assert_lse_is_sink(lse, sinks, rows):
    """The LSE of rows that see no key: the sink of their head (to float32 rounding: the CUDA kernels
    take it through the log2 domain)."""
    want = sinks.detach().float().view(-1, 1).expand(-1, rows)
    torch.testing.assert_close(lse.float(), want, atol=1e-5, rtol=1e-6)


def poison(device, nbytes):
    if device == "cpu":
        poison_cpu_allocator(nbytes)
    else:
        poison_cuda_allocator(nbytes, device)


def tolerance_ok(got, want, low, dtype):
    """float32 / float64 against TOL; 16-bit within 2x PyTorch's own error in the dtype (low)."""
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    if dtype in TOL:
        return err <= 10 * TOL[dtype] * max(1.0, want.abs().max().item()), err
    torch_err = (low.double() - want).abs().max().item() if want.numel() else 0.0
    return err <= 2 * torch_err + 2e-3, (err, torch_err)


def run_and_compare(q, k, v, sinks, kw, grad=True, variant="auto"):
    """opforge against the float64 reference (and the reference in the inputs' dtype for the 16-bit
    bound): output, LSE, and with `grad` the gradients of q, k, v and the sinks."""
    dtype, device = q.dtype, q.device
    leaves = [t.detach().clone().requires_grad_(grad) for t in (q, k, v, sinks)]
    poison(str(device), q.numel() * q.element_size() * 4)
    out, lse = opforge.attention(*leaves[:3], sinks=leaves[3], return_lse=True, variant=variant, **kw)
    wants = [t.detach().double().requires_grad_(grad) for t in (q, k, v, sinks)]
    want, want_lse = reference.attention(*wants[:3], sinks=wants[3], return_lse=True, **kw)
    lows = [t.detach().clone().requires_grad_(grad) for t in (q, k, v, sinks)]
    low, low_lse = reference.attention(*lows[:3], sinks=lows[3].to(dtype), return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype and not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())
    ok, err = tolerance_ok(out, want, low, dtype)
    assert ok, ("out", err)
    finite = want_lse.isfinite()
    lse_err = (lse.double() - want_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert lse_err <= (
        1e-8 if dtype == torch.float64 else 2e-3 * max(1.0, want_lse[finite].abs().max().item())
    )
    if not grad:
        return out, lse
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), leaves)
    exp = torch.autograd.grad(
        (want * go.double()).sum() + (want_lse * gl.double()).sum(), wants, retain_graph=True
    )
    # (16-bit: within 2x PyTorch's own gradients in the dtype, of the same objective)
    lo = torch.autograd.grad((low.float() * go.float()).sum() + (low_lse.float() * gl.float()).sum(), lows)
    for name, g, w, l0 in zip(("q", "k", "v", "sinks"), got, exp, lo, strict=True):
        assert g.shape == w.shape and g.dtype == leaves[("q", "k", "v", "sinks").index(name)].dtype
        assert not g.isnan().any(), name
        ok, err = tolerance_ok(g, w, l0, dtype)
        assert ok, (name, err)
    return out, lse


CPU_DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CUDA_DTYPES = [torch.bfloat16, torch.float16]
CASES = [  # (device, dtype)
    *(("cpu", d) for d in CPU_DTYPES),
    *(pytest.param("cuda", d, marks=CUDA) for d in CUDA_DTYPES),
]
SHAPES = [(2, 4, 2, 37, 53, 64), (1, 8, 1, 130, 130, 128), (2, 2, 2, 1, 300, 64), (1, 4, 4, 70, 20, 32)]
NAMES = ["full", "causal", "sliding", "documents", "block mask", "softcap"]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("device", "dtype"), CASES, ids=str)
def test_sinks_match_reference(device, dtype, name, shape):
    """Output, LSE and the gradients of q, k, v and the sinks against the float64 reference, on every
    pattern (the kernel the rule picks: tiled / decode on the CPU; Hopper, mma.sync or decode on CUDA)."""
    B, Hq, _, Sq, Sk, _ = shape
    q, k, v = qkv(*shape, dtype=dtype, device=device)
    kw = pattern_kwargs(name, B, Hq, Sq, Sk)
    kw = {n: (x.to(device) if hasattr(x, "to") and not isinstance(x, tuple) else x) for n, x in kw.items()}
    if "segment_ids" in kw and isinstance(kw["segment_ids"], tuple):
        kw["segment_ids"] = tuple(t.to(device) for t in kw["segment_ids"])
    run_and_compare(
        q, k, v, sinks_for(Hq, device, torch.float64 if dtype == torch.float64 else torch.float32), kw
    )


@pytest.mark.parametrize("variant", ["hopper", "mma_sync", "decode"])
@pytest.mark.cuda
def test_sinks_every_cuda_kernel(variant):
    """Each CUDA forward kernel's epilogue with sinks (named variants), bf16, head dims 64 / 128 / 256,
    a row that sees no key (kv_lens 0: zeros, the LSE the sink)."""
    for D in (64, 128, 256):
        shape = (3, 8, 2, 2 if variant == "decode" else 150, 700, D)
        q, k, v = qkv(*shape, dtype=torch.bfloat16, device="cuda")
        lens = torch.tensor([700, 0, 333], device="cuda")
        sinks = sinks_for(8, "cuda")
        out, lse = run_and_compare(
            q, k, v, sinks, dict(kv_lens=lens, causal=True), grad=False, variant=variant
        )
        assert (out[1] == 0).all()
        assert_lse_is_sink(lse[1], sinks, shape[3])


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_kv_lens_and_paged(device):
    """Decoding against a cache with key counts (the decode kernel, no gradients) and the same keys in
    paged caches (read in place): the reference's output and LSE; a sequence with no key gets zeros
    and its heads' sinks as LSE."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for B, Hq, Hkv, Sq, Sk, D in [(3, 8, 2, 1, 500, 64), (3, 4, 1, 4, 300, 128)]:
        q, k, v = qkv(B, Hq, Hkv, Sq, Sk, D, dtype=dtype, device=device)
        lens = torch.tensor([Sk, 0, Sk // 3], device=device)
        sinks = sinks_for(Hq, device)
        out, lse = run_and_compare(q, k, v, sinks, dict(kv_lens=lens, causal=True), grad=False)
        assert (out[1] == 0).all()
        assert_lse_is_sink(lse[1], sinks, Sq)
        for page in (16, 64):
            kc, vc, table = to_pages(k, v, lens.cpu(), page)
            paged, paged_lse = opforge.attention(
                q, kc, vc, kv_lens=lens, block_table=table, causal=True, sinks=sinks, return_lse=True
            )
            torch.testing.assert_close(paged, out, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)
            torch.testing.assert_close(paged_lse, lse, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_varlen(device):
    """Packed sequences with sinks against the reference sequence by sequence (gradients of q, k, v
    and the sinks), a sequence with no keys (zeros, the sinks as LSE) and padding rows past the last
    offset (zeros, LSE -inf: no sequence, no sink)."""
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    lengths = [(5, 9), (0, 4), (130, 100), (7, 0), (1, 1), (150, 270)]
    Hq, Hkv, D = 4, 2, 64
    cu_q, cu_k = (cu_seqlens([n[i] for n in lengths]).to(device) for i in (0, 1))
    pad = 3
    q = torch.randn(int(cu_q[-1]) + pad, Hq, D, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), Hkv, D, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), Hkv, D, dtype=dtype, device=device, requires_grad=True)
    sinks = sinks_for(Hq, device, torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
    out, lse = opforge.attention_varlen(q, k, v, cu_q, cu_k, causal=True, sinks=sinks, return_lse=True)
    wants = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    want, want_lse = reference.attention_varlen(
        *wants[:3], cu_q, cu_k, causal=True, sinks=wants[3], return_lse=True
    )
    tol = 1e-9 if dtype == torch.float64 else 3e-2
    assert torch.equal(lse.isinf(), want_lse.isinf())
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=0)
    finite = want_lse.isfinite()
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], atol=tol, rtol=0)
    empty = slice(int(cu_q[3]), int(cu_q[4]))  # (the sequence (7, 0): no keys)
    assert (out[empty] == 0).all()
    assert_lse_is_sink(lse[:, empty], sinks, 7)
    assert (out[-pad:] == 0).all() and (lse[:, -pad:] == -math.inf).all()
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), go)
    exp = torch.autograd.grad(want, wants, go.double())
    for g, w in zip(got, exp, strict=True):
        scale = max(1.0, w.abs().max().item())
        assert (g.double() - w).abs().max().item() <= (1e-8 if dtype == torch.float64 else 5e-2) * scale


def test_sinks_transforms_and_double_backward():
    """torch.func (grad, vmap, jvp) and double backward with sinks against the reference, float64."""
    q, k, v = (t.double() for t in qkv(2, 4, 2, 9, 11, 8))
    sinks = sinks_for(4, "cpu", torch.float64)
    kw = dict(causal=True, window=(4, 0))

    def loss(fn, q, k, v, s):
        out, lse = fn(q, k, v, sinks=s, return_lse=True, **kw)
        return out.sin().sum() + lse.cos().sum()

    for argnums in ((0, 1, 2, 3),):
        got = torch.func.grad(lambda *a: loss(opforge.attention, *a), argnums)(q, k, v, sinks)
        want = torch.func.grad(lambda *a: loss(reference.attention, *a), argnums)(q, k, v, sinks)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    tangents = tuple(torch.randn_like(t) for t in (q, k, v, sinks))
    got = torch.func.jvp(lambda *a: opforge.attention(*a[:3], sinks=a[3], **kw), (q, k, v, sinks), tangents)
    want = torch.func.jvp(
        lambda *a: reference.attention(*a[:3], sinks=a[3], **kw), (q, k, v, sinks), tangents
    )
    torch.testing.assert_close(got, want)
    batched = torch.func.vmap(lambda q: opforge.attention(q, k, v, sinks=sinks, **kw))(
        torch.stack([q, 2 * q])
    )
    torch.testing.assert_close(batched[1], reference.attention(2 * q, k, v, sinks=sinks, **kw))
    # double backward through the registered op (the kernels' first backward, its dense derivative)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    assert torch.autograd.gradgradcheck(
        lambda *a: opforge.attention(*a[:3], sinks=a[3], **kw), leaves, eps=1e-6, atol=1e-5
    )


def test_sinks_opcheck():
    """The registered op with sinks: fake kernel, autograd registration and schema (opcheck)."""
    q, k, v = qkv(1, 4, 2, 33, 40, 16)
    sinks = sinks_for(4, "cpu").requires_grad_()
    q.requires_grad_()
    args = opforge.ops.attention.checks.pattern_args(q, k, True, None, None, None, None)
    torch.library.opcheck(
        torch.ops.opforge.attention.default, (q, k, v, 0.25, 0.0, *args, None, None, None, sinks)
    )
    compiled = torch.compile(lambda q, s: opforge.attention(q, k, v, causal=True, sinks=s), fullgraph=True)
    torch.testing.assert_close(compiled(q, sinks), opforge.attention(q, k, v, causal=True, sinks=sinks))


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_errors(device):
    """Bad sinks name the op and the argument (TypeError for the Python type, RuntimeError for the
    tensor's dtype, shape and device, NotImplementedError for vmap over the sinks)."""
    q, k, v = qkv(1, 4, 2, 5, 7, 8, device=device)
    with pytest.raises(TypeError, match=r"opforge.attention: sinks must be a tensor or None, got list"):
        opforge.attention(q, k, v, sinks=[0.0] * 4)
    with pytest.raises(RuntimeError, match=r"opforge.attention: sinks must be \(heads,\) = \(4,\)"):
        opforge.attention(q, k, v, sinks=torch.zeros(2, device=device))
    with pytest.raises(RuntimeError, match=r"opforge.attention: sinks must be one of .*got int64"):
        opforge.attention(q, k, v, sinks=torch.zeros(4, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match=r"opforge.attention_varlen: sinks must be \(heads,\) = \(4,\)"):
        cu = torch.tensor([0, 5], device=device, dtype=torch.int32)
        opforge.attention_varlen(
            q[0].transpose(0, 1),
            k[0].transpose(0, 1),
            v[0].transpose(0, 1),
            cu,
            cu,
            sinks=torch.zeros(3, device=device),
        )
    other = "meta"
    with pytest.raises(RuntimeError, match=r"opforge.attention: sinks must be on q's device"):
        opforge.attention(q, k, v, sinks=torch.zeros(4, device=other))
    args = opforge.ops.attention.checks.pattern_args(q, k, False, None, None, None, None)
    with pytest.raises(
        RuntimeError, match=r"opforge.attention: sinks must be \(heads,\) = \(4,\), one logit"
    ):
        torch.ops.opforge.attention(q, k, v, 0.3, 0.0, *args, None, None, None, torch.zeros(5, device=device))
    with pytest.raises(NotImplementedError, match="vmap over sinks"):
        torch.func.vmap(
            lambda s: torch.ops.opforge.attention(q, k, v, 0.3, 0.0, *args, None, None, None, s)[0]
        )(torch.zeros(2, 4, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_edge_values_and_sinks_only_gradients(device):
    """A sink of +inf takes all the weight (zeros, LSE +inf, as the reference); a sink of -inf on rows
    that see no key gives no NaN under torch.func; a gradient for the sinks alone (q, k, v frozen)
    through key counts and paged caches; frozen sinks in a double backward."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(2, 4, 2, 3, 200, 64, dtype=dtype, device=device)
    inf = torch.tensor([float("inf"), 0.0, 1.0, -float("inf")], device=device)
    out, lse = opforge.attention(q, k, v, causal=True, sinks=inf, return_lse=True)
    assert (out[:, 0] == 0).all() and (lse[:, 0] == float("inf")).all() and not out.isnan().any()
    lens = torch.tensor([200, 0], device=device)
    sinks = sinks_for(4, device).requires_grad_()
    want_s = sinks.detach().double().requires_grad_()
    want = reference.attention(q.double(), k.double(), v.double(), kv_lens=lens, causal=True, sinks=want_s)
    go = torch.randn_like(want)
    (w,) = torch.autograd.grad(want, want_s, go)
    kc, vc, table = to_pages(k, v, lens.cpu(), 16)
    for kw in (dict(k=k, v=v), dict(k=kc, v=vc, block_table=table)):
        got = opforge.attention(q, kw.pop("k"), kw.pop("v"), kv_lens=lens, causal=True, sinks=sinks, **kw)
        (g,) = torch.autograd.grad(got, sinks, go.to(got.dtype))
        torch.testing.assert_close(g.double(), w, atol=5e-2 if dtype == torch.bfloat16 else 1e-4, rtol=1e-2)
    if device != "cpu":
        return
    qd, kd, vd = (t.double() for t in qkv(1, 2, 1, 4, 5, 8))
    seg = (torch.tensor([[0, 0, 1, 1]]), torch.tensor([[0, 0, 0, 2, 2]]))
    s = torch.tensor([-float("inf"), 0.5], dtype=torch.float64)
    args = (qd, kd, vd, s)

    def loss(fn, q, k, v, s):
        return fn(q, k, v, segment_ids=seg, sinks=s, causal=True).sum()

    got = torch.func.grad(lambda *a: loss(opforge.attention, *a), (0, 1, 2, 3))(*args)
    want = torch.func.grad(lambda *a: loss(reference.attention, *a), (0, 1, 2, 3))(*args)
    for x, y in zip(got, want, strict=True):
        assert not x.isnan().any()
        torch.testing.assert_close(x, y)
    frozen = torch.randn(2, dtype=torch.float64)  # (no grad: the double backward still uses them)
    leaves = [t.clone().requires_grad_() for t in (qd, kd, vd)]
    assert torch.autograd.gradgradcheck(
        lambda *a: opforge.attention(*a, causal=True, sinks=frozen), leaves, eps=1e-6, atol=1e-5
    )
