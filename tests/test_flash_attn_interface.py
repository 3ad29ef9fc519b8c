"""opforge.flash_attn_interface: FlashAttention's three functions on opforge, checked against
FlashAttention's documented semantics ((B, S, H, D) tensors, bottom-right causal, window_size with
-1 unbounded, softcap 0 = none, the cache written in place) with a float64 reference written here
from those semantics, on the CPU and on CUDA."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
from conftest import DEVICES, capture_cuda_graph, poison_cuda_allocator

from opforge import reference
from opforge.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

MOD = "opforge.flash_attn_interface"


def fa_reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, scale=None):
    """FlashAttention's documented result for one batch of (B, Sq, H, D) q and (B, Sk, Hkv, D) k, v,
    in float64: query i sees key j when j <= i + Sk - Sq (causal) and
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (window, a negative side unbounded); a query that
    sees nothing gets zeros. Returns out (B, Sq, H, D) and the LSE (B, H, Sq)."""
    q, k, v = (t.double() for t in (q, k, v))
    _B, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    k, v = (t.repeat_interleave(h // hk, dim=2) for t in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    left, right = window_size
    if causal:
        ok &= j <= i
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    s = s.masked_fill(~ok, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


CASES = [  # (B, Sq, Sk, H, Hkv, D, causal, window_size, softcap)
    (2, 37, 37, 4, 4, 32, False, (-1, -1), 0.0),
    (2, 37, 37, 4, 2, 32, True, (-1, -1), 0.0),
    (1, 17, 70, 6, 2, 64, True, (-1, -1), 0.0),  # fewer queries than keys: bottom-right
    (1, 70, 17, 4, 1, 64, True, (-1, -1), 0.0),  # more queries than keys: rows that see nothing
    (2, 50, 50, 4, 2, 32, True, (7, 0), 0.0),  # Mistral's window
    (2, 40, 60, 4, 4, 16, False, (5, 9), 0.0),
    (1, 40, 60, 2, 1, 16, False, (-1, 3), 0.0),
    (1, 40, 60, 2, 1, 16, False, (6, -1), 30.0),  # Gemma 2's softcap
    (2, 1, 90, 8, 2, 64, True, (-1, -1), 0.0),  # a decoding step
]


def _close(got, want, dtype):
    tol = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_flash_attn_func_matches_flash_attention_semantics(case, device):
    B, sq, sk, h, hk, d, causal, window, softcap = case
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(B, sq, h, d, device=device, dtype=dtype)
    k = torch.randn(B, sk, hk, d, device=device, dtype=dtype)
    v = torch.randn(B, sk, hk, d, device=device, dtype=dtype)
    poison_cuda_allocator(q.numel() * 8, device)
    out, lse = flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, return_attn_probs=True
    )
    want, want_lse = fa_reference(q.cpu(), k.cpu(), v.cpu(), causal, window, softcap)
    assert out.shape == (B, sq, h, d) and out.dtype == dtype
    assert lse.shape == (B, h, sq) and lse.dtype == torch.float32
    _close(out.cpu(), want, dtype)
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    assert (lse.cpu().double()[seen] - want_lse[seen]).abs().max().item() <= 1e-3
    plain = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
    assert torch.equal(plain, out)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4], CASES[7]], ids=str)
def test_flash_attn_func_gradients(case):
    """Gradients in float64 against the reference's autograd, with the scale and deterministic
    flag passed through."""
    B, sq, sk, h, hk, d, causal, window, softcap = case
    q = torch.randn(B, sq, h, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, sk, hk, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, sk, hk, d, dtype=torch.float64, requires_grad=True)
    go = torch.randn(B, sq, h, d, dtype=torch.float64)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    got = torch.autograd.grad(
        flash_attn_func(q, k, v, softmax_scale=0.3, deterministic=True, **kw), (q, k, v), go
    )
    want = torch.autograd.grad(fa_reference(q, k, v, scale=0.3, **kw)[0], (q, k, v), go)
    for g, w in zip(got, want, strict=False):
        assert (g - w).abs().max().item() <= 1e-9


def _packed(lengths_q, lengths_k, h, hk, d, dtype, device):
    cu = [
        torch.tensor([0, *lens], device=device).cumsum(0).to(torch.int32) for lens in (lengths_q, lengths_k)
    ]
    q = torch.randn(sum(lengths_q), h, d, device=device, dtype=dtype)
    k = torch.randn(sum(lengths_k), hk, d, device=device, dtype=dtype)
    v = torch.randn(sum(lengths_k), hk, d, device=device, dtype=dtype)
    return q, k, v, cu[0], cu[1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "causal, window, softcap",
    [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (9, 0), 0.0), (False, (4, 6), 20.0)],
)
def test_flash_attn_varlen_func_matches_each_sequence(causal, window, softcap, device):
    """Each packed sequence attends to its own keys with the pattern aligned bottom-right in it:
    the reference run on each sequence alone; the LSE is (heads, total_q)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lq, lk = [5, 0, 33, 1, 20], [9, 4, 33, 40, 7]
    q, k, v, cu_q, cu_k = _packed(lq, lk, 6, 2, 32, dtype, device)
    out, lse = flash_attn_varlen_func(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max(lq),
        max(lk),
        causal=causal,
        window_size=window,
        softcap=softcap,
        return_attn_probs=True,
    )
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (6, q.shape[0])
    for b in range(len(lq)):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lq[b] == 0:
            continue
        want, want_lse = fa_reference(
            q[None, rq].cpu(), k[None, rk].cpu(), v[None, rk].cpu(), causal, window, softcap
        )
        _close(out[rq].cpu()[None], want, dtype)
        seen = torch.isfinite(want_lse[0])
        assert torch.equal(torch.isfinite(lse[:, rq].cpu()), seen)


def test_flash_attn_varlen_func_gradients():
    lq, lk = [6, 11, 3], [6, 20, 9]
    q, k, v, cu_q, cu_k = _packed(lq, lk, 4, 2, 16, torch.float64, "cpu")
    for t in (q, k, v):
        t.requires_grad_(True)
    go = torch.randn_like(q)
    got = torch.autograd.grad(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 11, 20, causal=True), (q, k, v), go)
    outs = []
    for b in range(3):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        outs.append(fa_reference(q[None, rq], k[None, rk], v[None, rk], causal=True)[0][0])
    want = torch.autograd.grad(torch.cat(outs), (q, k, v), go)
    for g, w in zip(got, want, strict=False):
        assert (g - w).abs().max().item() <= 1e-9


def _cache_case(device, dtype, B=3, rows=5, cap=40, hk=2, h=8, d=32):
    """A cache of `rows` rows of `cap` positions, NaN where nothing was written (a read past a
    sequence's keys would show), sequences' lengths before the step, their rows."""
    kc = torch.full((rows, cap, hk, d), float("nan"), device=device, dtype=dtype)
    vc = kc.clone()
    lens = torch.tensor([11, 0, 25], device=device, dtype=torch.int32)[:B]
    idx = torch.tensor([3, 0, 4], device=device, dtype=torch.int32)[:B]
    for b in range(B):
        n = int(lens[b])
        kc[idx[b], :n] = torch.randn(n, hk, d, device=device, dtype=dtype)
        vc[idx[b], :n] = torch.randn(n, hk, d, device=device, dtype=dtype)
    return kc, vc, lens, idx


def _paged(kc, vc, idx, page_size, device):
    """The same caches as pages of `page_size` in a shuffled pool, and their table."""
    rows, cap, hk, d = kc.shape
    per = cap // page_size
    pool = torch.randperm(rows * per + 2, device=device)
    kp = torch.full((rows * per + 2, page_size, hk, d), float("nan"), device=device, dtype=kc.dtype)
    vp = kp.clone()
    table = torch.empty(len(idx), per, dtype=torch.int32, device=device)
    for b, r in enumerate(idx.tolist()):
        for p in range(per):
            page = pool[r * per + p]
            table[b, p] = page
            kp[page] = kc[r, p * page_size : (p + 1) * page_size]
            vp[page] = vc[r, p * page_size : (p + 1) * page_size]
    return kp, vp, table


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["rows", "cache_batch_idx", "page_table", "block_table"])
@pytest.mark.parametrize(
    "s_new, sq, causal, window",
    [(1, 1, True, (-1, -1)), (4, 4, True, (6, 0)), (3, 5, True, (-1, -1)), (0, 2, False, (-1, -1))],
)
def test_flash_attn_with_kvcache_writes_then_attends(s_new, sq, causal, window, layout, device):
    """New keys land at cache_seqlens[b] ... in the sequence's row (or pages), nothing else of the
    cache changes, and q attends to the first cache_seqlens[b] + s_new keys with the pattern
    aligned bottom-right; the result equals the reference on those keys."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    kc, vc, lens, idx = _cache_case(device, dtype)
    B, hk, d, h = 3, kc.shape[2], kc.shape[3], 8
    if layout == "rows":
        kc, vc, idx = (
            kc[idx.long()].clone(),
            vc[idx.long()].clone(),
            torch.arange(B, device=device, dtype=torch.int32),
        )
    before = [
        (kc[r, : int(n)].clone(), vc[r, : int(n)].clone()) for r, n in zip(idx.tolist(), lens, strict=False)
    ]
    q = torch.randn(B, sq, h, d, device=device, dtype=dtype)
    kn = torch.randn(B, s_new, hk, d, device=device, dtype=dtype) if s_new else None
    vn = torch.randn(B, s_new, hk, d, device=device, dtype=dtype) if s_new else None
    kw = dict(cache_seqlens=lens, causal=causal, window_size=window, return_softmax_lse=True)
    if layout in ("page_table", "block_table"):
        kp, vp, table = _paged(kc, vc, idx, 8, device)
        out, lse = flash_attn_with_kvcache(q, kp, vp, kn, vn, **{layout: table}, **kw)
        # the sequences' keys read back through the table
        kc = torch.stack([kp[table[b].long()].flatten(0, 1) for b in range(B)])
        vc = torch.stack([vp[table[b].long()].flatten(0, 1) for b in range(B)])
        idx = torch.arange(B, device=device)
    elif layout == "cache_batch_idx":
        out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_batch_idx=idx, **kw)
    else:
        out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, **kw)
    assert out.shape == (B, sq, h, d) and lse.shape == (B, h, sq)
    for b, r in enumerate(idx.tolist()):
        n = int(lens[b])
        assert torch.equal(kc[r, :n], before[b][0]) and torch.equal(vc[r, :n], before[b][1])
        if s_new:
            assert torch.equal(kc[r, n : n + s_new], kn[b]) and torch.equal(vc[r, n : n + s_new], vn[b])
        assert kc[r, n + s_new :].isnan().all()  # nothing written past the new tokens
        keys, vals = kc[r, : n + s_new], vc[r, : n + s_new]
        want, want_lse = fa_reference(q[b : b + 1].cpu(), keys[None].cpu(), vals[None].cpu(), causal, window)
        _close(out[b : b + 1].cpu(), want, dtype)
        assert torch.equal(torch.isfinite(lse[b].cpu()), torch.isfinite(want_lse[0]))


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_with_kvcache_int_and_absent_lengths(device):
    """cache_seqlens as an int is every sequence's length; absent, the whole cache is attended."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    k = torch.randn(2, 24, 2, 16, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(2, 3, 4, 16, device=device, dtype=dtype)
    got = flash_attn_with_kvcache(q, k, v, cache_seqlens=10, causal=True)
    _close(got.cpu(), fa_reference(q.cpu(), k[:, :10].cpu(), v[:, :10].cpu(), causal=True)[0], dtype)
    got = flash_attn_with_kvcache(q, k, v, causal=True)
    _close(got.cpu(), fa_reference(q.cpu(), k.cpu(), v.cpu(), causal=True)[0], dtype)


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_reads_nothing_on_the_host(paged):
    """A decoding step on CUDA tensors (fake ones: this runs on the CPU too) with new tokens reads
    no tensor on the host (a host read of a fake tensor raises): a CUDA graph captures it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        B, h, hk, d = 4, 8, 2, 64
        q = torch.randn(B, 1, h, d, device="cuda", dtype=torch.bfloat16)
        kn, vn = (torch.randn(B, 1, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lens = torch.zeros(B, dtype=torch.int32, device="cuda")
        if paged:
            kc, vc = (torch.randn(64, 16, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = torch.zeros(B, 8, dtype=torch.int32, device="cuda")
            out = flash_attn_with_kvcache(
                q, kc, vc, kn, vn, cache_seqlens=lens, page_table=table, causal=True
            )
        else:
            kc, vc = (torch.randn(6, 128, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            idx = torch.zeros(B, dtype=torch.int32, device="cuda")
            out = flash_attn_with_kvcache(
                q, kc, vc, kn, vn, cache_seqlens=lens, cache_batch_idx=idx, causal=True
            )
        assert out.shape == (B, 1, h, d)


def _qkv4():
    return torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)


@pytest.mark.parametrize(
    "fn, kwargs, words",
    [
        ("func", dict(dropout_p=0.1), "dropout"),
        ("func", dict(alibi_slopes=torch.ones(2)), "ALiBi"),
        ("func", dict(qv=torch.ones(1)), "qv"),
        ("func", dict(attention_chunk=8), "attention_chunk"),
        ("varlen", dict(seqused_k=torch.ones(1, dtype=torch.int32)), "seqused_k"),
        ("varlen", dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "block_table"),
        ("varlen", dict(dropout_p=0.5), "dropout"),
        ("kvcache", dict(rotary_cos=torch.ones(4, 4), rotary_sin=torch.ones(4, 4)), "rotary"),
        ("kvcache", dict(cache_leftpad=torch.zeros(1, dtype=torch.int32)), "cache_leftpad"),
        ("kvcache", dict(cu_seqlens_q=torch.zeros(2, dtype=torch.int32)), "cu_seqlens_q"),
    ],
)
def test_unsupported_arguments_raise_naming_them(fn, kwargs, words):
    q, k, v = _qkv4()
    with pytest.raises(
        NotImplementedError, match=rf"{MOD}\.flash_attn_\w+: opforge does not support .*{re.escape(words)}"
    ):
        if fn == "func":
            flash_attn_func(q, k, v, **kwargs)
        elif fn == "varlen":
            cu = torch.tensor([0, 4], dtype=torch.int32)
            flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 4, 4, **kwargs)
        else:
            flash_attn_with_kvcache(q, k, v, cache_seqlens=2, **kwargs)


def test_zero_valued_unsupported_arguments_are_accepted():
    """FlashAttention's defaults of the refused features (dropout 0, no chunk) and the tuning knobs
    change nothing."""
    q, k, v = _qkv4()
    want = flash_attn_func(q, k, v, causal=True)
    got = flash_attn_func(
        q, k, v, causal=True, dropout_p=0.0, attention_chunk=0, num_splits=3, pack_gqa=True, sm_margin=4
    )
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda q, k, v: flash_attn_func(q, k, v, window_size=4), TypeError, "window_size must be a pair"),
        (
            lambda q, k, v: flash_attn_func(q, k, v, window_size=(1.5, 0)),
            TypeError,
            "left side must be an int",
        ),
        (lambda q, k, v: flash_attn_func(q, k, v, softcap=-1.0), ValueError, "softcap must be >= 0"),
        (lambda q, k, v: flash_attn_func(q, k, v, softcap=float("nan")), ValueError, "softcap must be >= 0"),
        (lambda q, k, v: flash_attn_func(q, k, v, causal="no"), TypeError, "causal must be a bool"),
        (
            lambda q, k, v: flash_attn_varlen_func(
                q[0], k[0], v[0], torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4, causal=1
            ),
            TypeError,
            "causal must be a bool",
        ),
        (lambda q, k, v: flash_attn_func(q, k, v, softcap=None), TypeError, "softcap must be a number"),
        (
            lambda q, k, v: flash_attn_func(q, k, v, deterministic=None),
            TypeError,
            "deterministic must be a bool",
        ),
        (lambda q, k, v: flash_attn_func(q[0], k, v), RuntimeError, "q must be 4-D"),
        (lambda q, k, v: flash_attn_func(q, k.numpy(), v), TypeError, "k must be a"),
        (lambda q, k, v: flash_attn_varlen_func(q, k, v, None, None), RuntimeError, "q must be 3-D"),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, k, None, cache_seqlens=0),
            TypeError,
            "k and v together",
        ),
        (lambda q, k, v: flash_attn_with_kvcache(q, k, v, k, v), TypeError, "need cache_seqlens"),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_seqlens=-1),
            ValueError,
            r"cache_seqlens \+ seqlen_new must be in \[0, 4\] \(the cache's capacity\), got -1 \+ 0",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_seqlens=5),
            ValueError,
            r"cache_seqlens \+ seqlen_new must be in \[0, 4\] \(the cache's capacity\), got 5 \+ 0",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(
                q, k, v, cache_seqlens=torch.tensor([7], dtype=torch.int32)
            ),
            ValueError,
            r"cache_seqlens\[0\] \+ seqlen_new must be in \[0, 4\] \(the cache's capacity\), got 7 \+ 0",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(
                q, k, v, k[:, :0, :, :3], v[:, :0, :, :3], cache_seqlens=0
            ),
            RuntimeError,
            r"k must be \(batch, seqlen_new, kv_heads, head_dim\) with q's batch 1, the caches' kv_heads and "
            r"head_dim \[2, 8\]",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, k[:, :0].double(), v[:, :0], cache_seqlens=0),
            RuntimeError,
            r"k must be .*got \[1, 0, 2, 8\] \(torch.float64\)",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_seqlens=1.0),
            TypeError,
            "cache_seqlens must be an int",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.ones(2, dtype=torch.int32)),
            RuntimeError,
            r"cache_seqlens must be \(batch,\)",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, torch.cat([k, k]), v, cache_seqlens=1),
            RuntimeError,
            "k_cache's batch 2 must be q's 1",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(q, k, v, cache_seqlens=1, cache_batch_idx=torch.zeros(1)),
            RuntimeError,
            "cache_batch_idx must be one of",
        ),
        (
            lambda q, k, v: flash_attn_with_kvcache(
                q,
                k,
                v,
                cache_seqlens=1,
                page_table=torch.zeros(1, 1, dtype=torch.int32),
                block_table=torch.zeros(1, 1, dtype=torch.int32),
            ),
            TypeError,
            "not both",
        ),
    ],
)
def test_bad_arguments_raise_naming_the_function_and_argument(call, exc, words):
    q, k, v = _qkv4()
    with pytest.raises(exc, match=words) as err:
        call(q, k, v)
    assert str(err.value).startswith("opforge."), str(err.value)


def test_a_cache_write_past_the_end_raises_on_the_cpu():
    k = torch.zeros(1, 8, 2, 8)
    v = torch.zeros(1, 8, 2, 8)
    q, kn, vn = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    with pytest.raises(ValueError, match=r"cache_seqlens \+ seqlen_new must be in \[0, 8\].*got 6 \+ 3"):
        flash_attn_with_kvcache(q, k, v, kn, vn, cache_seqlens=6)
    lens = torch.tensor([6], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] \+ seqlen_new must be in \[0, 8\].*got 6 \+ 3"):
        flash_attn_with_kvcache(q, k, v, kn, vn, cache_seqlens=lens)
    assert k.count_nonzero() == 0 and v.count_nonzero() == 0


def test_varlen_maxima_as_zero_d_tensors():
    """transformers' FlashAttention path passes max_seqlen_q / max_seqlen_k as 0-d integer tensors
    (FlashAttention takes them): the same result as ints; other tensors are a TypeError naming them."""
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 1, 8), torch.randn(9, 1, 8)
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32)
    want = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, causal=True)
    got = flash_attn_varlen_func(q, k, v, cu_q, cu_k, torch.tensor(4), torch.tensor(5), causal=True)
    assert torch.equal(got, want)
    with pytest.raises(
        TypeError, match=r"flash_attn_varlen_func: max_seqlen_k must be an int, None or a 0-d"
    ):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, torch.tensor([5]), causal=True)
    with pytest.raises(
        TypeError, match=r"flash_attn_varlen_func: max_seqlen_q must be an int, None or a 0-d"
    ):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, torch.tensor(4.0), 5, causal=True)


def test_a_page_a_sequence_reads_is_checked_before_writing():
    """On the CPU a table entry a sequence reads that is not a page raises before any new token is
    written (the entry the new token goes to being valid), leaving the caches as they were."""
    kc, vc = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)
    k0, v0 = kc.clone(), vc.clone()
    table = torch.tensor([[9, 2], [0, 1]], dtype=torch.int32)  # (sequence 0 reads page "9", writes page 2)
    lens = torch.tensor([4, 1], dtype=torch.int32)
    q, new = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 9 is not a page of the caches \(0 to 5\)"):
        flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=lens, block_table=table)
    assert torch.equal(kc, k0) and torch.equal(vc, v0)


def test_an_empty_batch_with_new_tokens():
    """No sequence: nothing to write, an empty output (as without new tokens)."""
    z = torch.zeros(0, 8, 2, 16)
    q, new = torch.randn(0, 1, 2, 16), torch.randn(0, 1, 2, 16)
    out = flash_attn_with_kvcache(q, z, z, new, new, cache_seqlens=torch.zeros(0, dtype=torch.int32))
    assert out.shape == (0, 1, 2, 16)


def test_an_expanded_cache_is_not_written():
    """A cache whose sequences share memory (an expanded view) would have each sequence's new tokens
    written over another's: a RuntimeError, as PyTorch's in-place ops raise."""
    kc, vc = (torch.zeros(1, 8, 2, 16).expand(2, -1, -1, -1) for _ in range(2))
    q, new = torch.randn(2, 1, 2, 16), torch.ones(2, 1, 2, 16)
    lens = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="k_cache has elements that share memory"):
        flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=lens)
    assert kc.count_nonzero() == 0


def test_signatures_are_flash_attentions():
    """FlashAttention's parameter names; positional only where FlashAttention-2 and -3 agree (a
    call by position written for either gets a TypeError, not the other's meaning), and the names
    transformers looks for in a flash function's signature to decide what to hand it: with them
    present it passes dropout, windows, softcaps, sinks and the page table, which opforge then
    computes or refuses, rather than dropping them silently."""

    def positional(fn):
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return [n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds]

    def names(fn):
        return list(inspect.signature(fn).parameters)

    assert positional(flash_attn_func) == ["q", "k", "v"]
    assert positional(flash_attn_varlen_func) == [
        "q",
        "k",
        "v",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
    ]
    assert positional(flash_attn_with_kvcache) == ["q", "k_cache", "v_cache", "k", "v"]
    q, k, v = _qkv4()
    with pytest.raises(TypeError):
        flash_attn_func(q, k, v, 0.0)  # (FlashAttention-2's dropout_p, or -3's softmax_scale)
    for fn in (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache):
        for p in ("softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "s_aux", "num_splits"):
            assert p in names(fn), (fn.__name__, p)
    for fn in (flash_attn_func, flash_attn_varlen_func):
        for p in ("dropout_p", "deterministic", "return_attn_probs", "qv", "q_descale", "attention_chunk"):
            assert p in names(fn), (fn.__name__, p)
    for p in (
        "cache_seqlens",
        "cache_batch_idx",
        "page_table",
        "block_table",
        "return_softmax_lse",
        "rotary_cos",
    ):
        assert p in names(flash_attn_with_kvcache), p


@pytest.mark.cuda
@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_replays_in_a_cuda_graph(paged):
    """A decoding step (write the new token, attend) captured once replays step after step with the
    lengths (and the page table) updated in place: each replay writes its token where the lengths
    say and gives a fresh call's result. A padding row (length -1, table -1, as transformers pads
    continuous batching's decode batches) writes nothing and gets zeros."""
    dev, dt = "cuda", torch.bfloat16
    B, h, hk, d, ps, pages = 4, 8, 2, 128, 16, 64
    kc = (
        torch.randn(pages, ps, hk, d, device=dev, dtype=dt)
        if paged
        else torch.randn(B, 256, hk, d, device=dev, dtype=dt)
    )
    vc = torch.randn_like(kc)
    table = torch.randperm(pages, device=dev)[: B * 8].view(B, 8).to(torch.int32)
    lens = torch.tensor([5, 40, 17, 90], device=dev, dtype=torch.int32)
    q = torch.randn(B, 1, h, d, device=dev, dtype=dt)
    kn, vn = torch.randn(B, 1, hk, d, device=dev, dtype=dt), torch.randn(B, 1, hk, d, device=dev, dtype=dt)
    kw = dict(page_table=table) if paged else {}

    def step():
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True, **kw)

    graph, out = capture_cuda_graph(step)
    for it in range(3):
        lens.add_(1 + it)  # (next step's lengths, in place)
        if paged and it == 2:
            lens[3] = -1
            table[3] = -1
        for t in (q, kn, vn):
            t.normal_()
        before = kc.clone()
        graph.replay()
        kc_graph, got = kc.clone(), out.clone()
        kc.copy_(before)
        want = step()
        assert torch.equal(kc, kc_graph)
        assert torch.equal(got, want)
        if paged and it == 2:
            assert (got[3] == 0).all()


@pytest.mark.cuda
def test_flash_attn_varlen_func_padded_rows_in_a_cuda_graph():
    """transformers' padded continuous-batching step: q has rows past cu_seqlens_q[-1] and the
    offsets change between replays; no host read in the call (it captures), padded rows zeros."""
    dev, dt = "cuda", torch.bfloat16
    total, h, hk, d = 64, 8, 2, 128
    q = torch.randn(total, h, d, device=dev, dtype=dt)
    k, v = (
        torch.randn(3 * total, hk, d, device=dev, dtype=dt),
        torch.randn(3 * total, hk, d, device=dev, dtype=dt),
    )
    cu_q = torch.tensor([0, 10, 11, 40], device=dev, dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 61, 150], device=dev, dtype=torch.int32)

    def step():
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, total, 3 * total, causal=True)

    graph, out = capture_cuda_graph(step)
    cu_q.copy_(torch.tensor([0, 1, 2, 3], device=dev, dtype=torch.int32))
    cu_k.copy_(torch.tensor([0, 100, 101, 180], device=dev, dtype=torch.int32))
    graph.replay()
    want = step()
    assert torch.equal(out, want) and (out[3:] == 0).all()


@pytest.mark.parametrize(
    "bad, exc",
    [
        (dict(softcap=-1.0), ValueError),
        (dict(window_size=(1.5, 0)), TypeError),
        (dict(softmax_scale=float("nan")), ValueError),
        (dict(q_dtype=torch.float32), RuntimeError),
    ],
)
def test_flash_attn_with_kvcache_checks_before_writing(bad, exc):
    """A call that raises leaves the cache as it was (the new tokens are not written first)."""
    kc, vc = torch.zeros(1, 4, 1, 8, dtype=torch.float64), torch.zeros(1, 4, 1, 8, dtype=torch.float64)
    new = torch.ones(1, 1, 1, 8, dtype=torch.float64)
    q = torch.randn(1, 1, 1, 8, dtype=bad.pop("q_dtype", torch.float64))
    with pytest.raises(exc):
        flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=0, **bad)
    assert kc.count_nonzero() == 0 and vc.count_nonzero() == 0


def test_flash_attn_with_kvcache_no_new_tokens_on_an_empty_cache():
    """Zero new tokens on a cache of no positions: nothing to write, zeros out (FlashAttention's
    result for rows that see no key)."""
    z = torch.zeros(1, 0, 1, 8)
    q = torch.randn(1, 2, 1, 8)
    out = flash_attn_with_kvcache(q, z, z, z, z, cache_seqlens=0)
    assert out.shape == q.shape and (out == 0).all()


def test_attention_sinks_under_both_names():
    """learnable_sink (FlashAttention's name) and s_aux (the gpt-oss kernels') are opforge.attention's
    sinks in all three functions: the reference with the sink column, gradients of the sinks too."""
    q, k, v = (torch.randn(2, 9, 4, 8, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    sinks = torch.randn(4, dtype=torch.float64, requires_grad=True)
    want = reference.attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, sinks=sinks
    )
    for name in ("learnable_sink", "s_aux"):
        out = flash_attn_func(q, k, v, causal=True, **{name: sinks})
        torch.testing.assert_close(out.transpose(1, 2), want)
    (g,) = torch.autograd.grad(out.sum(), sinks)
    (w,) = torch.autograd.grad(want.sum(), sinks)
    torch.testing.assert_close(g, w)
    cu = torch.tensor([0, 9, 18], dtype=torch.int32)
    packed = flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 9, 9, causal=True, s_aux=sinks
    )
    torch.testing.assert_close(packed.view(2, 9, 4, 8).transpose(1, 2), want)
    cached = flash_attn_with_kvcache(q[:, -1:], k, v, cache_seqlens=9, causal=True, s_aux=sinks.detach())
    torch.testing.assert_close(cached.transpose(1, 2), want[:, :, -1:].detach())
    with pytest.raises(
        TypeError, match=r"flash_attn_func: give the attention sinks as s_aux or learnable_sink"
    ):
        flash_attn_func(q, k, v, s_aux=sinks, learnable_sink=sinks)


def test_kvcache_append_refuses_two_widths_and_fp8():
    """New k and v into caches of two head dims, or FP8 caches: a NotImplementedError naming what
    (the attention itself takes them without new tokens)."""
    q = torch.randn(1, 1, 4, 16)
    kc, vc = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 8)
    k, v = torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 8)
    with pytest.raises(NotImplementedError, match="caches of two head dims"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=3)
    assert flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3).shape == (1, 1, 4, 8)
    f8 = torch.float8_e4m3fn
    with pytest.raises(NotImplementedError, match="FP8 caches"):
        flash_attn_with_kvcache(q.to(f8), kc.to(f8), kc.to(f8), k.to(f8), k.to(f8), cache_seqlens=3)
