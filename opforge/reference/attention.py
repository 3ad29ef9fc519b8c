"""Attention in plain PyTorch: the scores matrix, the pattern as an explicit boolean mask
(opforge.masks.attention_mask), softmax, and the values. The tests' oracle in float64, and the
dense computation opforge.attention (and attention_varlen, one sequence at a time) differentiates
for its double backward."""

from __future__ import annotations

import math

import torch

from opforge.masks import BlockMask, attention_mask


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    prefix_len: int | None = None,
    segment_ids=None,
    mask: BlockMask | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    kv_lens: torch.Tensor | None = None,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
):
    """What opforge.attention computes, in q's dtype (pass float64 tensors for an oracle). sinks (Hq,):
    one more score a row of each head takes in its softmax, a column with no value (gpt-oss's
    attention sinks, as transformers' eager attention writes them)."""
    B, hq, sq, d = q.shape
    sk, group = k.shape[2], hq // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kf, vf = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, kf.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    visible = attention_mask(
        B,
        hq,
        sq,
        sk,
        causal=causal,
        window=window,
        prefix_len=prefix_len,
        segment_ids=segment_ids,
        mask=mask,
        kv_lens=kv_lens,
        device=q.device,
    )
    # A row with nothing visible gets zeros and an LSE of -inf; its scores are set to 0 first so
    # that no inf - inf appears anywhere, in the values or in any derivative (opforge.attention's
    # double backward and tangents differentiate this function).
    if sinks is not None:
        # The sink as one more column of scores; a row's LSE over both stays finite where the sink is
        # (no inf - inf then), and P of the keys it does not see is exp(-inf) = 0.
        s = s.masked_fill(~visible, -math.inf)
        column = sinks.to(s.dtype).view(1, hq, 1, 1).expand(B, hq, sq, 1)
        scores = torch.cat([s, column], dim=-1)
        dead = (scores == -math.inf).all(-1, keepdim=True)  # (no key, a sink of -inf: no NaN derivative)
        lse = torch.logsumexp(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead[..., 0], -math.inf)
        p = torch.exp(s - lse.masked_fill(lse == -math.inf, 0.0)[..., None])
        out = torch.matmul(p, vf)
        return (out, lse) if return_lse else out
    seen = visible.any(-1, keepdim=True)
    s = s.masked_fill(~visible, -math.inf).masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen[..., 0], -math.inf)
    p = torch.softmax(s, dim=-1).masked_fill(~seen, 0.0)
    out = torch.matmul(p, vf)
    return (out, lse) if return_lse else out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
):
    """What opforge.attention_varlen computes, in q's dtype: `attention` of each packed sequence on
    its own. q (total_q, Hq, D), k and v (total_k, Hkv, D); sequence b is queries
    ``[cu_seqlens_q[b], cu_seqlens_q[b + 1])`` and keys ``[cu_seqlens_k[b], cu_seqlens_k[b + 1])``;
    rows past the last offsets belong to no sequence (zeros, an LSE of -inf).
    Returns out (total_q, Hq, D) and, with return_lse, lse (Hq, total_q)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for q0, q1, k0, k1 in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        # (S, H, D) rows of one sequence as a batch of one (1, H, S, D)
        qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        out, lse = attention(
            qs,
            ks,
            vs,
            causal=causal,
            window=window,
            scale=scale,
            softcap=softcap,
            return_lse=True,
            sinks=sinks,
        )
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    # Rows past the last offset (the padding of a padded batch) belong to no sequence: zeros, LSE -inf.
    pad = q.shape[0] - cu_q[-1]
    outs.append(q.new_zeros(pad, q.shape[1], v.shape[-1]))
    lses.append(q.new_full((q.shape[1], pad), -math.inf))
    out = torch.cat(outs, dim=0)
    lse = torch.cat(lses, dim=1)
    return (out, lse) if return_lse else out
