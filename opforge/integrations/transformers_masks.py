"""transformers' attention masks as opforge patterns (the "opforge" implementation's mask function,
opforge.integrations.transformers registers it): transformers' mask functions recognised (causal,
sliding windows, packed sequences) and said as opforge.attention's pattern arguments, a padding mask
as segment ids, anything else evaluated into a block mask; see opforge/integrations/transformers.py's
text for the whole contract."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import opforge

NAME = "opforge"
OP = "opforge.integrations.transformers"


@dataclasses.dataclass
class OpforgeMask:
    """What one forward's attention layers of a type (full or sliding) see, for opforge.attention.

    ``kwargs`` are opforge.attention's pattern arguments (causal, window, segment_ids, mask) for
    queries at absolute positions q_offset .. q_offset + q_length - 1 and the first ``keys`` keys of
    the layer's cache (the rest of a static cache is not yet written and never visible). ``padded``:
    a padding mask is part of the pattern (as segment ids)."""

    kwargs: dict[str, Any]
    q_length: int
    kv_length: int
    keys: int
    padded: bool = False

    # transformers reads a mask's shape and rank in places; those of the dense mask it stands for.
    @property
    def shape(self) -> tuple[int, int, int, int]:
        seg = self.kwargs.get("segment_ids")
        batch = seg[0].shape[0] if isinstance(seg, tuple) else 1
        return (batch, 1, self.q_length, self.kv_length)

    @property
    def ndim(self) -> int:
        return 4

    def __getattr__(self, name: str):
        # (attributes the mask lacks: a model that takes it for a tensor. Still an AttributeError, so
        # that hasattr() answers False, but one that says why.)
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{OP}: this model reads the attention mask as a tensor (its .{name}), e.g. to add a score bias "
            f"such as ALiBi to it or to edit it; with attn_implementation='{NAME}' the mask is a pattern "
            f"(OpforgeMask), not a tensor: run this model on 'sdpa' or 'eager'"
        )


# ---- recognising transformers' mask functions ---------------------------------------------------


def _closure(fn) -> dict[str, Any]:
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    cells = getattr(fn, "__closure__", None) or ()
    return {n: c.cell_contents for n, c in zip(names, cells, strict=False)}


_CODES: dict[str, Any] = {}  # qualname -> code object of masking_utils' closures (_closure_codes)


def _closure_codes(mu) -> dict[str, Any]:
    """The code objects of the masking_utils closures _recognise reads, from one call of each factory
    (outside any traced function: register() makes them). A closure is recognised by its code object:
    torch.compile's tracer gives a closure made inside the traced forward its code and cells, but
    not its __qualname__ or __module__."""
    if not _CODES:
        ones = torch.zeros(1, 1, dtype=torch.int64)
        makers = {
            "and_masks.<locals>.and_mask": lambda: mu.and_masks(mu.causal_mask_function),
            "sliding_window_overlay.<locals>.inner_mask": lambda: mu.sliding_window_overlay(2),
            "sliding_window_bidirectional_overlay.<locals>.inner_mask": lambda: (
                mu.sliding_window_bidirectional_overlay(2)
            ),
            "packed_sequence_mask_function.<locals>.inner_mask": lambda: mu.packed_sequence_mask_function(
                ones
            ),
            "remap_positions_for_packed_sequence.<locals>.inner_mask": lambda: (
                mu.remap_positions_for_packed_sequence(mu.causal_mask_function, ones)
            ),
        }
        for qualname, make in makers.items():
            factory = qualname.split(".")[0]
            if hasattr(mu, factory):  # (5.17 has no remap_positions_for_packed_sequence)
                _CODES[qualname] = make().__code__
    return _CODES


def _ours(fn, mu, qualname: str) -> bool:
    """fn is the closure `qualname` of transformers' masking_utils (its code object: not a look-alike
    elsewhere)."""
    code = _closure_codes(mu).get(qualname)
    return code is not None and getattr(fn, "__code__", None) is code


def _parts(fn, mu) -> list | None:
    """The conjuncts of transformers' and_masks(...) trees (fn itself when it is no and_mask)."""
    if _ours(fn, mu, "and_masks.<locals>.and_mask"):
        out = []
        for part in _closure(fn).get("mask_functions", ()):
            sub = _parts(part, mu)
            if sub is None:
                return None
            out += sub
        return out
    return [fn]


def _recognise(mask_function, mu) -> dict[str, Any] | None:
    """opforge pattern arguments equal to transformers' mask function, or None when it is anything
    else (then it is evaluated into a block mask). Keys: causal, window, packed (segment ids)."""
    parts = _parts(mask_function, mu)
    if not parts:
        return None
    out: dict[str, Any] = {"causal": False, "window": None, "packed": None}
    left = right = None
    remapped = False
    seen_base = False

    def base(fn) -> bool:
        nonlocal left, right, seen_base
        if fn is mu.causal_mask_function:
            out["causal"] = True
        elif fn is mu.bidirectional_mask_function:
            pass
        elif _ours(fn, mu, "sliding_window_overlay.<locals>.inner_mask"):
            w = _closure(fn).get("sliding_window")
            if not isinstance(w, int) or w < 1:
                return False
            left = w - 1 if left is None else min(left, w - 1)  # kv > q - w
        elif _ours(fn, mu, "sliding_window_bidirectional_overlay.<locals>.inner_mask"):
            w = _closure(fn).get("sliding_window")
            if not isinstance(w, int) or w < 0:
                return False
            left = w if left is None else min(left, w)  # |q - kv| <= w
            right = w if right is None else min(right, w)
        else:
            return False
        seen_base = True
        return True

    for fn in parts:
        if _ours(fn, mu, "packed_sequence_mask_function.<locals>.inner_mask"):
            seg = _closure(fn).get("packed_sequence_mask")
            if not isinstance(seg, torch.Tensor) or seg.dim() != 2 or out["packed"] is not None:
                return None
            out["packed"] = seg
        elif _ours(fn, mu, "remap_positions_for_packed_sequence.<locals>.inner_mask"):
            # Positions restart at each packed sequence and run on by one inside it (that is how
            # transformers finds the sequences), so the remapped pattern is the plain one within
            # each sequence: valid only together with the packed-sequence segments.
            inner = _parts(_closure(fn).get("mask_function"), mu)
            if inner is None or not all(base(f) for f in inner):
                return None
            remapped = True
        elif not base(fn):
            return None
    if not seen_base or (remapped and out["packed"] is None):
        return None
    if left is not None or right is not None:
        out["window"] = (left, right if right is not None else (0 if out["causal"] else None))
    return out


# ---- the mask function --------------------------------------------------------------------------


def _offset(x) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


_MU = None  # transformers.masking_utils, imported once (an import inside a traced function breaks the graph)


def _masking_utils():
    global _MU
    if _MU is None:
        from transformers import masking_utils

        _closure_codes(masking_utils)
        _MU = masking_utils
    return _MU


def _static_decode_mask(
    batch_size, kv_length, q_offset, kv_offset, window, full_padding, device
) -> OpforgeMask:
    """One query of a causal model against a static cache (full or sliding-window layers), from
    device tensors alone: the written slots are the sequences' key counts (opforge.attention's
    kv_lens, read on the device only; the decode kernel reads nothing past them), padded keys a
    segment the query is not in. No host read and no slicing: a CUDA graph can replay the step."""
    written = q_offset.to(device=device, dtype=torch.int64).reshape(-1)[:1] - kv_offset + 1
    out: dict[str, Any] = {"causal": True, "kv_lens": written.clamp(0, kv_length).expand(batch_size)}
    if window is not None:
        out["window"] = window
    if full_padding is not None:
        pad = full_padding[:, kv_offset : kv_offset + kv_length]
        kv_seg = torch.where(pad, 0, -1).to(torch.int64).expand(batch_size, kv_length).contiguous()
        out["segment_ids"] = (torch.zeros(batch_size, 1, dtype=torch.int64, device=device), kv_seg)
    return OpforgeMask(out, 1, kv_length, kv_length, padded=full_padding is not None)


def opforge_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs,
) -> OpforgeMask:
    """transformers' mask interface for the "opforge" implementation (see the module's text)."""
    mu = _MU if _MU is not None else _masking_utils()

    if isinstance(attention_mask, OpforgeMask):
        return attention_mask  # made in advance (generate() with a static cache), given back as the mask
    if mask_function is None:
        mask_function = mu.causal_mask_function
    kv_offset = int(kv_offset)
    pattern = _recognise(mask_function, mu)
    # The padding mask over absolute key positions [0, kv_offset + kv_length) (False past its end).
    full_padding = None
    if attention_mask is not None:
        full_padding = mu.prepare_padding_mask(
            attention_mask.to(device=device, dtype=torch.bool), kv_length, kv_offset
        )
    if (
        isinstance(q_offset, torch.Tensor)
        and q_length == 1
        and pattern is not None
        and pattern["causal"]
        and pattern["packed"] is None
    ):
        # A static cache's decode step (its offset a device tensor): read nothing on the host.
        return _static_decode_mask(
            batch_size, kv_length, q_offset, kv_offset, pattern["window"], full_padding, device
        )
    q_offset = _offset(q_offset)
    padding = None
    if full_padding is not None:
        padding = full_padding[:, kv_offset : kv_offset + kv_length]
        # (a mask of all ones pads nothing; under torch.compile its values are not read (the graph
        # would depend on them): the padding stays, segment ids that change no result)
        if not torch.compiler.is_compiling() and bool(padding.all()):
            padding = None
    # opforge aligns queries to the end of the keys it is given: query i sits at key position
    # i + keys - q_length. transformers' geometry: query i at q_offset + i, key j at kv_offset + j.
    keys = q_offset - kv_offset + q_length
    if pattern is not None and (keys > kv_length or (keys < kv_length and not pattern["causal"])):
        pattern = None  # (a geometry a band cannot say: the mask function decides element by element)
    if pattern is None:
        fn = mask_function
        if padding is not None:
            fn = mu.and_masks(fn, mu.padding_mask_function(full_padding))
        fn = mu.add_offsets_to_mask_function(fn, q_offset, kv_offset)
        block = opforge.block_mask(fn, batch_size, None, q_length, kv_length, device=device)
        return OpforgeMask({"mask": block}, q_length, kv_length, kv_length)
    # Causal with keys < kv_length: a static cache's slots past the queries, invisible to all.
    out: dict[str, Any] = {"causal": pattern["causal"]}
    if pattern["window"] is not None:
        out["window"] = pattern["window"]
    packed, pad = pattern["packed"], None if padding is None else padding[:, :keys]
    if packed is not None or pad is not None:
        dev = packed.device if packed is not None else pad.device
        if packed is not None:
            packed = packed.to(torch.int64).expand(batch_size, -1)
            q_seg, kv_seg = packed, packed
        else:
            q_seg = torch.zeros(batch_size, q_length, dtype=torch.int64, device=dev)
            kv_seg = torch.zeros(batch_size, keys, dtype=torch.int64, device=dev)
        if pad is not None:  # padded keys get an id no query has
            kv_seg = torch.where(pad.to(dev), kv_seg, torch.full_like(kv_seg, -1))
        out["segment_ids"] = (q_seg.contiguous(), kv_seg.contiguous())
    return OpforgeMask(out, q_length, kv_length, keys, padded=pad is not None)
