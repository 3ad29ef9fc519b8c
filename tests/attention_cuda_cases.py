"""Shared case builders of the CUDA attention tests: shapes (one token, odd lengths, Sq != Sk, GQA,
padded head dims, decode rows), inputs on the GPU, the forward and gradient checks against a
float64 reference within 2x PyTorch's own error in the dtype, the kernels a call ran, packed
sequences."""

from __future__ import annotations

import itertools

import torch
from attention_cases import (
    PATTERNS,
    random_segments,
)
from conftest import poison_cuda_allocator

import opforge
from opforge import reference
from opforge.masks import block_mask

DEV = "cuda"


# (B, Hq, Hkv, Sq, Sk, D): one token, odd lengths, Sq != Sk both ways, GQA, padded head dims.
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 2, 2, 17, 17, 128),
    (1, 4, 2, 127, 127, 64),
    (2, 4, 1, 33, 150, 128),
    (1, 2, 2, 150, 40, 256),
    (1, 2, 1, 1000, 1000, 96),
    (1, 2, 2, 300, 260, 40),
    (1, 4, 2, 200, 330, 160),  # (the Hopper forward and backward at 192: zero-padded from 160)
    # decode: few queries (x the GQA group) against long caches
    (2, 8, 2, 1, 3000, 128),
    (1, 32, 8, 4, 5000, 64),
    (3, 16, 1, 1, 1100, 128),
    (2, 4, 4, 16, 700, 64),
    (1, 8, 2, 2, 900, 256),
    (2, 6, 3, 3, 1200, 80),
    (1, 32, 8, 16, 2000, 128),  # 64 rows: the decode block's most at head dims 64 and 128
    # (the decode kernel's two and four m tiles: rows 17-32 and 33-64, padded ones too)
    (2, 40, 2, 1, 1800, 128),
    (2, 32, 1, 1, 2000, 64),
    (1, 16, 2, 5, 1500, 64),
    (2, 16, 2, 3, 1500, 256),
    (1, 8, 1, 4, 2500, 256),  # 32 rows: the most at head dim 256
]


def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.bfloat16):
    return (
        torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEV),
        torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEV),
        torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEV),
    )


def random_block_mask(B, H, Sq, Sk, block=64, density=0.5):
    """A function mask over random data: some blocks empty, some full, most partial."""
    table = torch.rand(B, H, Sq, Sk, device=DEV) < density
    blocks = torch.rand(B, H, -(-Sq // block), -(-Sk // block), device=DEV)
    table &= (blocks > 0.2).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    table |= (blocks > 0.85).repeat_interleave(block, 2).repeat_interleave(block, 3)[..., :Sq, :Sk]
    return block_mask(lambda b, h, q, kv: table[b, h, q, kv], B, H, Sq, Sk, block_size=block, device=DEV)


def pattern_kwargs(name, B, H, Sq, Sk):
    kw = dict(PATTERNS[name])
    if kw.pop("segments", False):
        kw["segment_ids"] = (
            random_segments(B, Sk).to(DEV)
            if Sq <= Sk
            else (random_segments(B, Sq).to(DEV), random_segments(B, Sk).to(DEV))
        )
    if kw.pop("mask", False):
        kw["mask"] = random_block_mask(B, H, Sq, Sk)
    return kw


def max_err(got, want):
    return (got.double() - want).abs().max().item() if want.numel() else 0.0


def check_forward(q, k, v, kw, variant="auto"):
    poison_cuda_allocator(q.numel() * q.element_size() * 4, DEV)
    out, lse = opforge.attention(q, k, v, return_lse=True, variant=variant, **kw)
    # (the references read k and v without NaN: the kv_lens tests put NaN past each count, which
    # nothing may read)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    want, want_lse = reference.attention(q.double(), k.double(), v.double(), return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(lse.isinf(), want_lse.isinf())  # exactly the rows that see nothing
    finite = want_lse.isfinite()
    low = reference.attention(q, k, v, **kw)  # PyTorch's own attention in the dtype
    err, torch_err = max_err(out, want), max_err(low, want)
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)
    if finite.any():
        lse_err = (lse.double() - want_lse)[finite].abs().max().item()
        assert lse_err <= 2e-3 * max(1.0, want_lse[finite].abs().max().item()), lse_err
    if not finite.all():
        assert (out[~finite] == 0).all()


def grads(q, k, v, go, kw, variant="auto"):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = opforge.attention(*leaves, variant=variant, **kw) if kw is not None else None
    return torch.autograd.grad(out, leaves, go)


def kernels_run(fn):
    """The names of the CUDA kernels fn launched (profiler), opforge's attention ones."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = set()
    for e in prof.events():
        for kernel in KERNELS:
            if kernel + "<" in e.name or e.name.endswith(kernel):
                names.add(kernel)
    return names


def kernel_names(fn) -> list[str]:
    """The full names (template arguments included: the traits structs) of the CUDA kernels fn
    launched, opforge's attention ones."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if "attention" in e.name or "segment_runs" in e.name})


# Every attention kernel by its name (csrc/attention/cuda), for kernels_run.
KERNELS = (
    "attention_fwd_hopper_kernel",
    "attention_fwd_hopper_persistent_kernel",
    "attention_fwd_kernel",
    "attention_decode_mma_kernel",
    "attention_decode_kernel",
    "attention_bwd_hopper_kernel",
    "attention_bwd_hopper_dq_kernel",
    "attention_bwd_kv_kernel",
    "attention_bwd_q_kernel",
)


def reference_grads(q, k, v, go, kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(reference.attention(*leaves, **kw), leaves, go)


def check_gradients(q, k, v, kw):
    go = torch.randn_like(q)
    poison_cuda_allocator(q.numel() * 16, DEV)
    got = grads(q, k, v, go, kw)
    kw = {n: x for n, x in kw.items() if n != "deterministic"}
    want = reference_grads(q.double(), k.double(), v.double(), go.double(), kw)
    low = reference_grads(q, k, v, go, kw)  # PyTorch's own bf16 gradients
    for name_, g, w, lo in zip("qkv", got, want, low, strict=True):
        assert g.shape == w.shape and not g.isnan().any()
        err, torch_err = max_err(g, w), max_err(lo, w)
        assert err <= 2 * torch_err + 2e-3, (name_, err, torch_err)


# Query and key lengths of the packed sequences: empty ones on either side, one row, tile edges
# (63 / 64 / 65, 127 / 128 / 129), Sq != Sk both ways.
VARLEN_Q = [0, 1, 63, 64, 65, 127, 128, 129, 300, 1000, 7]


VARLEN_K = [5, 0, 64, 200, 65, 127, 128, 129, 280, 1000, 7]


VARLEN_PATTERNS = {
    "full": {},
    "causal": dict(causal=True),
    "sliding": dict(causal=True, window=(64, 0)),
    "window": dict(window=(100, 30)),
    "softcap": dict(causal=True, softcap=30.0),
}


def varlen_case(lens_q, lens_k, hq, hkv, d, dtype=torch.bfloat16):
    """Packed (total, H, D) q, k, v and their int32 offsets."""
    cu = [
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
        for n in (lens_q, lens_k)
    ]
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype, device=DEV)
    k, v = (torch.randn(sum(lens_k), hkv, d, dtype=dtype, device=DEV) for _ in range(2))
    return q, k, v, cu[0], cu[1]


def varlen_args(kw):
    window = kw.get("window", (-1, -1))
    return (
        kw.get("softcap", 0.0),
        kw.get("causal", False),
        window[0],
        window[1],
        0,
        None,
        None,
        None,
        None,
        None,
        128,
        128,
    )


def varlen_forward(q, k, v, cu_q, cu_k, kw, variant="auto", deterministic=None):
    """The op on the (1, H, total, D) views: out (total, H, D), lse (H, total)."""
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    out, lse = torch.ops.opforge.attention.default(
        q4,
        k4,
        v4,
        q.shape[-1] ** -0.5,
        *varlen_args(kw),
        variant=variant,
        deterministic=deterministic,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )
    return out, lse


def varlen_backward(q, k, v, cu_q, cu_k, go, kw, variant="auto", deterministic=None):
    q4, k4, v4, go4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, go))
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, kw, variant, deterministic)
    grads = torch.ops.opforge.attention_backward.default(
        go4,
        q4,
        k4,
        v4,
        out,
        lse,
        None,
        q.shape[-1] ** -0.5,
        *varlen_args(kw),
        variant=variant,
        deterministic=deterministic,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
    )
    return [g.transpose(1, 2).squeeze(0) for g in grads[:3]]


def sequences(t, cu):
    """The packed sequences of t (total, H, D) as (1, H, S, D) views."""
    cu = cu.tolist()
    return [t[a:b].unsqueeze(0).transpose(1, 2) for a, b in itertools.pairwise(cu)]
