"""Hugging Face transformers models on opforge attention.

    import opforge.integrations.transformers as otf
    otf.register()                                   # once: the "opforge" implementation
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="opforge")
    model.set_attn_implementation("opforge")         # or switch a loaded model

``register()`` adds an attention function to transformers' ``AttentionInterface`` and a mask
function to its ``AttentionMaskInterface``, both under ``"opforge"`` (a name without "flash":
transformers switches on flash-attention behaviour, such as unpadding, for those).

The mask function runs once per forward and mask type (the models build one mask for their full
layers and one for their sliding-window layers) and returns an `OpforgeMask`: the pattern in
opforge's terms (causal, a window, segment ids for packed sequences and padding) when transformers'
mask function is one it builds from its own parts (causal, sliding window, bidirectional, packed
sequences, a padding mask), otherwise the mask function itself evaluated once into an
``opforge.block_mask`` (never dropped: a backend without a mask function would get no mask and lose
causality). The attention function reads q, k, v as transformers passes them ((B, H, S, D), the KV
cache appended, grouped-query heads without ``repeat_kv``), ``scaling`` and ``softcap`` (Gemma 2),
and returns (B, S, H, D) as the other implementations do.

Packed sequences with FlashAttention's boundary kwargs (``cu_seq_lens_q`` / ``cu_seq_lens_k``, which
``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` adds and the models hand every attention
function) run on ``opforge.attention_varlen``: each sequence's tiles on their own, no tile straddling
two sequences. Without those kwargs (position ids alone) the mask function's segment ids say where
the sequences are (packed documents of one row).

Not supported (a clear error instead of a silent difference): attention dropout while training
(``attention_dropout > 0``), ``output_attentions=True`` (no S x S matrix exists to return).
"""

from __future__ import annotations

import dataclasses
import weakref
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
    the layer's cache (the rest of a static cache is not yet written and never visible)."""

    kwargs: dict[str, Any]
    q_length: int
    kv_length: int
    keys: int

    # transformers reads a mask's shape and rank in places; those of the dense mask it stands for.
    @property
    def shape(self) -> tuple[int, int, int, int]:
        seg = self.kwargs.get("segment_ids")
        batch = seg[0].shape[0] if isinstance(seg, tuple) else 1
        return (batch, 1, self.q_length, self.kv_length)

    @property
    def ndim(self) -> int:
        return 4


# ---- recognising transformers' mask functions ---------------------------------------------------


def _closure(fn) -> dict[str, Any]:
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    cells = getattr(fn, "__closure__", None) or ()
    return {n: c.cell_contents for n, c in zip(names, cells, strict=False)}


def _ours(fn, mu, qualname: str) -> bool:
    """fn is the closure `qualname` of transformers' masking_utils (not a look-alike elsewhere)."""
    return getattr(fn, "__qualname__", "") == qualname and getattr(fn, "__module__", "") == mu.__name__


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
    return OpforgeMask(out, 1, kv_length, kv_length)


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
        if bool(padding.all()):
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
    return OpforgeMask(out, q_length, kv_length, keys)


# ---- the attention function ---------------------------------------------------------------------


# The last 4-D mask converted (a weak reference, its version, the BlockMask): every layer of a
# forward gets the same tensor, which is classified once instead of once a layer.
_LAST_DENSE: tuple | None = None


def _block_mask_of(mask: torch.Tensor) -> opforge.BlockMask:
    """A 4-D mask given to the model as is: bool, True = visible (SDPA's reading); integer, 0 or 1
    (1 = visible, as bool); float, added to the scores (eager's), so 0 = visible and the dtype's most
    negative values = masked."""
    global _LAST_DENSE
    if _LAST_DENSE is not None and _LAST_DENSE[0]() is mask and _LAST_DENSE[1] == mask._version:
        return _LAST_DENSE[2]
    m = mask
    if m.dtype.is_floating_point:
        if not bool(((m == 0) | (m <= torch.finfo(m.dtype).min / 2)).all()):
            raise ValueError(
                f"{OP}: a float attention_mask must hold 0 (visible) or large negative values (masked); "
                "opforge attention takes masks, not additive score biases"
            )
        m = m == 0
    elif m.dtype != torch.bool:
        other = m[(m != 0) & (m != 1)]
        if other.numel():
            raise ValueError(
                f"{OP}: an integer attention_mask must hold only 0 (masked) and 1 (visible), as a bool one "
                f"holds False and True, got {other[0].item()}"
            )
        m = m != 0
    block = opforge.BlockMask.from_dense(m)
    _LAST_DENSE = (weakref.ref(mask), mask._version, block)
    return block


def opforge_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface for the "opforge" implementation: (B, S, H, D), None."""
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(
            f"{OP}: attention dropout ({dropout}) is not supported while training; set the config's "
            "attention_dropout to 0 or use another attn_implementation"
        )
    if kwargs.get("output_attentions"):
        raise ValueError(
            f"{OP}: output_attentions=True needs the attention weights; use attn_implementation='eager'"
        )
    if isinstance(attention_mask, OpforgeMask):
        kw = dict(attention_mask.kwargs)
        if attention_mask.keys < key.shape[2]:
            key, value = key[:, :, : attention_mask.keys], value[:, :, : attention_mask.keys]
    elif attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        kw = {"causal": bool(causal)}
        if sliding_window and causal:
            kw["window"] = (int(sliding_window) - 1, 0)
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        kw = {"mask": _block_mask_of(attention_mask)}
    else:
        raise TypeError(
            f"{OP}: attention_mask must come from the 'opforge' mask function (register()), be None or a "
            f"4-D tensor, got {type(attention_mask).__name__}"
        )
    varlen = _varlen(query, key, kw, kwargs)
    if varlen is not None:
        cu_q, cu_k = varlen
        kw = {n: x for n, x in kw.items() if n != "segment_ids"}
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (S, H, D) views
        out = opforge.attention_varlen(q, k, v, cu_q, cu_k, scale=scaling, softcap=softcap or None, **kw)
        return out.unsqueeze(0), None
    out = opforge.attention(query, key, value, scale=scaling, softcap=softcap or None, **kw)
    return out.transpose(1, 2).contiguous(), None


def _varlen(query, key, kw, kwargs):
    """FlashAttention's packed-sequence kwargs, where they describe this call: (cu_seq_lens_q,
    cu_seq_lens_k) for one row of packed sequences whose pattern is causal / a window (the
    sequences' segment ids then say nothing more), else None."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if not isinstance(cu_q, torch.Tensor) or not isinstance(cu_k, torch.Tensor):
        return None
    if query.shape[0] != 1 or "mask" in kw or cu_q.dim() != 1 or cu_k.dim() != 1:
        return None
    return cu_q.to(query.device), cu_k.to(query.device)


def opforge_paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    cache=None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' continuous batching (``"paged|opforge"``, transformers 5.17's contract): the new
    tokens of every request in one row, q (1, H, T, D) and k, v (1, Hkv, T, D); this function writes
    them into the paged cache (``cache.update``), which returns each request's keys and values
    gathered one request after another, (Lk, Hkv, D), at ``cu_seq_lens_k``. Each request's new
    tokens attend causally to its cached ones and to each other (queries aligned to the end of the
    request's keys), within the layer's sliding window if it has one: opforge.attention_varlen.
    Returns (1, T, H, D), None (rows past the requests' tokens, the padding of a padded batch, are
    zeros)."""
    if cache is None or not hasattr(cache, "update"):
        raise TypeError(
            f"{OP}: 'paged|{NAME}' runs under transformers' continuous batching, which passes the paged "
            "cache as cache=; call the model through generate_batch / ContinuousBatchingManager"
        )
    if kwargs.get("block_table") is not None:
        raise NotImplementedError(
            f"{OP}: transformers' block-table decode path (flash_attn_with_kvcache's) is not taken by "
            f"'paged|{NAME}'; it should not be offered to a non-flash implementation"
        )
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(f"{OP}: attention dropout ({dropout}) is not supported while training")
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise NotImplementedError(f"{OP}: attention sinks (s_aux) are not supported")
    # The cache's layer type is the module's (as transformers' paged functions read it); the window
    # may also come as a kwarg alone (Mistral), which the cache keeps as full attention.
    layer_type = "sliding_attention" if getattr(module, "sliding_window", None) else "full_attention"
    sliding = getattr(module, "sliding_window", None) or kwargs.get("sliding_window")

    def per_layer(x):  # (models with full and sliding layers get one value per layer type)
        return x[layer_type] if isinstance(x, dict) else x

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), per_layer(kwargs.get("cu_seq_lens_k"))
    if not isinstance(cu_q, torch.Tensor) or not isinstance(cu_k, torch.Tensor):
        raise TypeError(f"{OP}: continuous batching passes cu_seq_lens_q and cu_seq_lens_k tensors")
    k, v = cache.update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs.get("read_index"),
        write_index=kwargs.get("write_index"),
    )
    cu_q, cu_k = cu_q.to(query.device), cu_k.to(query.device)
    q = query[0].transpose(0, 1)  # (T, H, D) view
    # A padded batch (CUDA graphs / compile) has rows past the last request's: garbage, left out.
    nq, nk = torch.stack([cu_q[-1], cu_k[-1].to(cu_q.dtype)]).tolist()  # (one read on the host)
    kw: dict[str, Any] = {"causal": True}
    if sliding:
        kw["window"] = (int(sliding) - 1, 0)
    out = opforge.attention_varlen(
        q[:nq],
        k[:nk],
        v[:nk],
        cu_q,
        cu_k,
        per_layer(kwargs.get("max_seqlen_q")),
        per_layer(kwargs.get("max_seqlen_k")),
        scale=scaling,
        softcap=softcap or None,
        **kw,
    )
    if nq < q.shape[0]:
        out = torch.cat([out, out.new_zeros(q.shape[0] - nq, *out.shape[1:])])
    return out.unsqueeze(0), None


def register(name: str = NAME) -> None:
    """Register opforge attention with transformers under ``name`` (idempotent), and its
    continuous-batching form under ``"paged|" + name``."""
    if "flash" in name:
        raise ValueError(
            f"{OP}: the name must not contain 'flash' (transformers treats those as flash attention)"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _masking_utils()
    AttentionInterface.register(name, opforge_attention)
    AttentionMaskInterface.register(name, opforge_mask)
    AttentionInterface.register("paged|" + name, opforge_paged_attention)
