"""Attention in plain PyTorch ops for what the kernels do not compute: forward-mode tangents and the
derivatives of the backward (double backward). Everything here is twice differentiable and runs in
float32 (float64 for float64 inputs), taking memory for the (B, Hq, Sq, Sk) scores."""

from __future__ import annotations

import torch

from opforge import reference
from opforge.masks import BlockMask, attention_mask, varlen_mask


def pattern_kwargs(pattern, sq: int, sk: int, kv_lens=None) -> dict:
    """The schema's pattern arguments as the reference's (opforge.masks.attention_mask) keywords."""
    causal, left, right, prefix, q_seg, kv_seg, kinds, index, bits, block_q, block_k = pattern
    kw = dict(
        causal=causal,
        window=(None if left < 0 else left, None if right < 0 else right),
        prefix_len=prefix or None,  # (the schema's 0 is no prefix: causal already says prefix-LM)
        kv_lens=kv_lens,
    )
    if q_seg is not None:
        kw["segment_ids"] = (q_seg, kv_seg)
    if kinds is not None:
        kw["mask"] = BlockMask(
            kinds, index, bits, (kinds.shape[0], kinds.shape[1], sq, sk), (block_q, block_k)
        )
    return kw


def visible(q, k, pattern, kv_lens=None, cu_seqlens=(None, None)) -> torch.Tensor:
    """(B, Hq, Sq, Sk) bool: what each query sees (packed sequences: each its own block)."""
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    kw = pattern_kwargs(pattern, sq, sk, kv_lens)
    if cu_seqlens[0] is not None:
        ok = varlen_mask(
            *cu_seqlens, causal=kw["causal"], window=kw["window"], device=q.device, total_q=sq, total_k=sk
        )
        return ok.expand(B, H, sq, sk)
    return attention_mask(B, H, sq, sk, device=q.device, **kw)


def scores(q, k, scale, softcap):
    """scale * q k^T (softcapped) in the computation's type, and tanh(...) with a softcap."""
    group = q.shape[1] // max(k.shape[1], 1)
    s = torch.matmul(q, k.repeat_interleave(group, dim=1).transpose(-1, -2)) * scale
    if not softcap:
        return s, None
    t = torch.tanh(s / softcap)
    return softcap * t, t


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def forward(q, k, v, scale, softcap, pattern, cu_seqlens=(None, None), sinks=None):
    """(out, lse) of opforge.attention: the reference in float32 (float64 for float64 inputs);
    packed sequences one at a time."""
    sinks = None if sinks is None else sinks.to(compute_dtype(q))
    dt = compute_dtype(q)
    sq, sk = q.shape[2], k.shape[2]
    kw = pattern_kwargs(pattern, sq, sk)
    if cu_seqlens[0] is not None:  # (1, H, total, D) <-> the reference's (total, H, D)
        out, lse = reference.attention_varlen(
            *(t[0].transpose(0, 1).to(dt) for t in (q, k, v)),
            *cu_seqlens,
            causal=kw["causal"],
            window=kw["window"],
            scale=scale,
            softcap=softcap or None,
            return_lse=True,
            sinks=sinks,
        )
        return out.transpose(0, 1)[None], lse[None]
    return reference.attention(
        q.to(dt), k.to(dt), v.to(dt), scale=scale, softcap=softcap or None, return_lse=True, sinks=sinks, **kw
    )


def backward(grad_out, q, k, v, grad_lse, scale, softcap, pattern, cu_seqlens=(None, None), sinks=None):
    """(dq, dk, dv) of opforge.attention at (q, k, v) for the cotangents (grad_out, grad_lse): the
    vector-Jacobian product of `forward` (a function of its five tensor arguments only, out and lse
    recomputed from q, k and v), in the inputs' dtypes."""

    def fn(q, k, v):
        return forward(q, k, v, scale, softcap, pattern, cu_seqlens, sinks)

    (out, lse), pull = torch.func.vjp(fn, q, k, v)
    g_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse.to(lse.dtype)
    return pull((grad_out.to(out.dtype), g_lse))


def tangent(q, k, v, out, lse, dq, dk, dv, scale, softcap, pattern, kv_lens, cu_seqlens=(None, None)):
    """The forward-mode derivative (tangents of out and lse) of attention at (q, k, v) along (dq, dk,
    dv), from the forward's out and LSE: with P = exp(S - lse) the probabilities and dS the scores'
    tangent, d lse = rowsum(P dS) and d out = (P dS) V - d lse * out + P dV. Dense over query rows
    in chunks (about 2^24 scores at a time)."""
    dt = compute_dtype(q)
    B, H, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if out.numel() == 0:
        return torch.zeros_like(out), torch.zeros_like(lse)
    group = H // k.shape[1]
    # (The mask as visible() gives it, a broadcast view where the pattern is the same for every batch
    # row and head, and rows that see nothing, per chunk: the dense (B, Hq, Sq, Sk) mask is never
    # built. NaN LSEs stay NaN: their rows' tangents are NaN as the rows are.)
    seen = visible(q, k, pattern, kv_lens, cu_seqlens)
    some = lse != -torch.inf
    vf = v.to(dt).repeat_interleave(group, dim=1)
    dvf = dv.to(dt).repeat_interleave(group, dim=1) if dv is not None else None
    d_out, d_lse = [], []
    step = max(1, (1 << 24) // max(1, B * H * sk))
    for i0 in range(0, sq, step):
        rows = slice(i0, min(sq, i0 + step))
        qc, lc = q[:, :, rows].to(dt), lse[:, :, rows].to(dt)
        s, t = scores(qc, k.to(dt), scale, softcap)
        m = seen[:, :, rows] & some[:, :, rows, None]
        p = torch.where(m, torch.exp(s - lc[..., None]), 0.0)
        # (keys no row of the chunk sees, slots past a count or padding rows that may hold anything,
        # are zeroed before the products: P = 0 would not cancel a NaN there)
        keys = m.any(dim=2).unsqueeze(-1)  # (.., Sk, 1)
        ds = None
        if dq is not None:
            ds = scores(dq[:, :, rows].to(dt), k.to(dt), scale, 0.0)[0]
        if dk is not None:
            term = scores(qc, dk.to(dt), scale, 0.0)[0]
            ds = term if ds is None else ds + term
        do = torch.zeros_like(out[:, :, rows], dtype=dt)
        dl = torch.zeros_like(lc)
        if ds is not None:
            if t is not None:
                ds = ds * (1 - t * t)
            pds = torch.where(m, p * ds, 0.0)
            dl = pds.sum(-1)
            do = torch.matmul(pds, torch.where(keys, vf, 0.0)) - dl[..., None] * out[:, :, rows].to(dt)
        if dvf is not None:
            do = do + torch.matmul(p, torch.where(keys, dvf, 0.0))
        d_out.append(do)
        d_lse.append(dl)
    return torch.cat(d_out, dim=2).to(out.dtype), torch.cat(d_lse, dim=2).to(lse.dtype)
