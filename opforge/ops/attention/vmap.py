"""vmap rules of the attention ops: the mapped dimension joins the batch dimension (packed sequences:
the heads), a block mask is shared or repeated along the batch, and a mapped mask falls back to one
call per mapped index."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from opforge.ops.attention.checks import VARLEN_OP
from opforge.ops.attention.schema import ATTENTION, BACKWARD


def _fold(t, dim, size):
    """(size, B, ...) with the mapped dimension first (an unmapped operand broadcast), flattened to
    (size * B, ...)."""
    if t is None:
        return None
    t = t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)
    return t.flatten(0, 1)


def _fold_mask(kinds, index, size):
    """A block mask's kinds and index for the folded batch (bits are shared)."""
    if kinds is None or kinds.shape[0] == 1:
        return kinds, index
    return kinds.repeat(size, 1, 1, 1), index.repeat(size, 1, 1, 1)


def _unfold(t, size):
    if t.dim() == 1:  # (the backward's d sinks without sinks: empty, the same for every index)
        return t.expand(size, *t.shape)
    return t.unflatten(0, (size, t.shape[0] // size))


def _unfold_heads(t, size):
    if t.dim() == 1:
        return t.expand(size, *t.shape)
    return t.unflatten(1, (size, t.shape[1] // size))


def _vmap_loop(op, info, in_dims, args, kwargs):
    """The op once per mapped index (for calls whose mask tensors are mapped), stacked."""
    outs = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if d is not None else a for a, d in zip(args, in_dims, strict=True)]
        outs.append(op(*sliced, **kwargs))
    return tuple(torch.stack(parts) for parts in zip(*outs, strict=True)), (0,) * len(outs[0])


def _fold_heads(t, dim, size):
    """Packed sequences: (1, size * H, ...) with the mapped dimension folded into the heads (their
    batch stays one). Head n * Hq + h of the fold reads kv head (n * Hq + h) // group = n * Hkv +
    h // group: still its own sample's."""
    if t is None:
        return None
    t = t.movedim(dim, 1) if dim is not None else t.unsqueeze(1).expand(t.shape[0], size, *t.shape[1:])
    return t.flatten(1, 2)


def _vmap_varlen(op, info, in_dims, args, kwargs, operands: int, offsets: tuple[int, int], sinks):
    """vmap of packed sequences (cu_seqlens at `offsets`): the first `operands` arguments (q, k, v;
    the backward's grad_out .. grad_lse) folded into the heads, the outputs unfolded from them (the
    sinks, at `sinks`, repeated for the folded heads)."""
    for i, name in zip(offsets, ("cu_seqlens_q", "cu_seqlens_k"), strict=True):
        if in_dims[i] is not None:
            raise NotImplementedError(
                f"{VARLEN_OP}: vmap over {name} is not supported (every mapped index must share the "
                "offsets); map over q, k and v, or call it once per packing"
            )
    size, args = info.batch_size, list(args)
    for i in range(operands):
        args[i] = _fold_heads(args[i], in_dims[i], size)
    if sinks is not None and sinks < len(args) and args[sinks] is not None:
        args[sinks] = args[sinks].repeat(size)
    outs = op(*args, **kwargs)
    return tuple(_unfold_heads(t, size) for t in outs), tuple(1 if t.dim() > 1 else 0 for t in outs)


def _empty_map(rule, info, in_dims, args, kwargs):
    """A rule's result over zero mapped indices: the rule run on one index of zeros (so that every
    output has its shape), the outputs cut to none (folding a size of 0 would lose the sizes it
    multiplies)."""
    one = [
        a if d is None else a.new_zeros((*a.shape[:d], 1, *a.shape[d + 1 :]))
        for a, d in zip(args, in_dims, strict=True)
    ]
    outs, dims = rule(SimpleNamespace(batch_size=1, randomness=info.randomness), in_dims, *one, **kwargs)
    return tuple(t.narrow(d, 0, 0) for t, d in zip(outs, dims, strict=True)), dims


def _vmap_rule(
    op,
    batched: tuple[int, ...],
    mask: tuple[int, int, int],
    operands: int,
    offsets: tuple[int, int],
    sinks: int | None,
):
    """A vmap rule for `op`: the arguments at `batched` (those with a batch dimension: operands,
    segment ids, key counts) get the mapped dimension folded into it; a block mask (kinds, index,
    bits at `mask`) is shared, repeated along the batch where it has one; outputs unfolded. With
    packed sequences (offsets at `offsets`) the mapped dimension joins the heads instead
    (_vmap_varlen)."""

    def rule(info, in_dims, *args, **kwargs):  # (the op's keyword-only options, passed through)
        if sinks is not None and sinks < len(args) and in_dims[sinks] is not None:
            raise NotImplementedError(
                f"{op}: vmap over sinks is not supported (the sinks are one logit a query head, shared by "
                "every mapped index); map over q, k and v"
            )
        if sinks is not None and operands > 3 and sinks < len(args) and args[sinks] is not None:
            raise NotImplementedError(
                f"{op}: vmap of the backward with sinks is not supported (their gradient sums over the "
                "batch); opforge.attention under torch.func differentiates the sinks itself"
            )
        if info.batch_size == 0:  # (jacrev of an empty output): one mapped index of zeros, then none
            return _empty_map(rule, info, in_dims, args, kwargs)
        if any(i < len(args) and args[i] is not None for i in offsets):  # (at their default: not passed)
            return _vmap_varlen(op, info, in_dims, args, kwargs, operands, offsets, sinks)
        if any(in_dims[i] is not None for i in mask):
            return _vmap_loop(op, info, in_dims, args, kwargs)
        size, args = info.batch_size, list(args)
        for i in batched:
            if i < len(args):  # (kv_lens at its default is not passed)
                args[i] = _fold(args[i], in_dims[i], size)
        args[mask[0]], args[mask[1]] = _fold_mask(args[mask[0]], args[mask[1]], size)
        outs = op(*args, **kwargs)
        return tuple(_unfold(t, size) for t in outs), (0,) * len(outs)

    return rule


def _register(schema, operands: tuple[str, ...], batched: tuple[str, ...]) -> None:
    """The vmap rule of one op: `operands` (its leading tensors) and the `batched` arguments (with a
    batch dimension) folded, its block mask's tensors shared, its packed-sequence offsets looked up."""
    op = getattr(torch.ops.opforge, schema.name).default
    positions = tuple(schema.index(n) for n in (*operands, *batched))
    mask = tuple(schema.index(n) for n in ("mask_kinds", "mask_index", "mask_bits"))
    offsets = (schema.index("cu_seqlens_q"), schema.index("cu_seqlens_k"))
    sinks = schema.index("sinks") if "sinks" in schema.names else None
    torch.library.register_vmap(
        f"opforge::{schema.name}", _vmap_rule(op, positions, mask, len(operands), offsets, sinks)
    )


_register(ATTENTION, ("q", "k", "v"), ("q_segments", "kv_segments", "kv_lens"))
_register(BACKWARD, ("grad_out", "q", "k", "v", "out", "lse", "grad_lse"), ("q_segments", "kv_segments"))
