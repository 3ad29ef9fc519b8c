"""Attention in plain PyTorch: the scores matrix, the pattern as an explicit boolean mask
(opforge.masks.attention_mask), softmax, and the values. The tests' oracle in float64, and the
dense computation opforge.attention differentiates for its double backward."""

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
):
    """What opforge.attention computes, in q's dtype (pass float64 tensors for an oracle)."""
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
    seen = visible.any(-1, keepdim=True)
    s = s.masked_fill(~visible, -math.inf).masked_fill(~seen, 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen[..., 0], -math.inf)
    p = torch.softmax(s, dim=-1).masked_fill(~seen, 0.0)
    out = torch.matmul(p, vf)
    return (out, lse) if return_lse else out
