"""Attention sinks (gpt-oss): one learned logit a query head, which every row of the head takes in its
softmax's denominator and which carries no value. The kernels add it when they finish a row (the
output scaled by exp(lse - lse'), the LSE lse' = logaddexp(lse, sink)); here the argument's checks,
the same transform in PyTorch ops (for the torch.func transforms, whose Function runs the kernels
without sinks and composes this differentiable step after them) and the sinks' gradient.

The backward needs nothing else: P' = exp(S - lse') are the probabilities with the sink, and the
backward kernels given the output and LSE with the sink compute dS = P' (dP - delta) with
delta = rowsum(dO * out') (the sink's value is 0), exactly the gradients of q, k and v. The sink's own
is d sink = sum over rows of p_sink (grad_lse - delta), p_sink = exp(sink - lse')."""

from __future__ import annotations

import math

import torch

from opforge.ops._common import dtype_name


def check_sinks(op: str, q: torch.Tensor, sinks) -> None:
    """sinks: None or a floating (heads,) tensor on q's device (heads: q.shape[1], in q (B, H, S, D) as
    in attention_varlen's q (total, H, D))."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"{op}: sinks must be a tensor or None, got {type(sinks).__name__}")
    if sinks.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise RuntimeError(
            f"{op}: sinks must be one of (float16, bfloat16, float32, float64), got {dtype_name(sinks.dtype)}"
        )
    heads = q.shape[1]
    if sinks.dim() != 1 or sinks.shape[0] != heads:
        raise RuntimeError(
            f"{op}: sinks must be (heads,) = ({heads},), one logit a query head, got shape {list(sinks.shape)}"
        )
    if sinks.device != q.device:
        raise RuntimeError(f"{op}: sinks must be on q's device ({q.device}), got {sinks.device}")


def apply_sinks(
    out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out', lse') with the sinks, from attention's (out, lse) without them: out (B, H, S, D), lse
    (B, H, S). Differentiable (twice) in all three; a row with neither keys nor a finite sink keeps
    zeros and -inf."""
    s = sinks.to(lse.dtype).view(1, -1, 1).expand_as(lse)
    # (a row with neither keys nor a finite sink: logaddexp(-inf, -inf) would have a NaN derivative)
    none = (lse == -math.inf) & (s == -math.inf)
    total = torch.logaddexp(lse.masked_fill(none, 0.0), s.masked_fill(none, 0.0)).masked_fill(none, -math.inf)
    w = torch.exp(lse - total.masked_fill(none, 0.0))
    return out * w.unsqueeze(-1).to(out.dtype), total


def sink_gradient(
    sinks: torch.Tensor, grad_out, out: torch.Tensor, lse: torch.Tensor, grad_lse
) -> torch.Tensor:
    """d loss / d sinks from the cotangents of the output and LSE (either may be None) and the forward's
    output and LSE with the sinks (out (B, H, S, D), lse (B, H, S)); in the sinks' dtype."""
    dt = lse.dtype
    # p_sink, 0 on rows whose LSE is -inf: the sink is -inf there, or the row is a padded batch's
    # (varlen rows past the last offset, in no sequence)
    # (a sink of +inf, whose rows' LSE is +inf: weight 1)
    diff = sinks.to(dt).view(1, -1, 1) - lse.masked_fill(lse == -math.inf, math.inf)
    p_sink = torch.exp(diff.nan_to_num(0.0, math.inf, -math.inf))
    term = torch.zeros_like(lse) if grad_lse is None else grad_lse.to(dt)
    if grad_out is not None:
        term = term - (grad_out.to(dt) * out.to(dt)).sum(-1)
    return (p_sink * term).sum(dim=(0, 2)).to(sinks.dtype)
