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

Every keyword a model passes is read (see ``_NO_EFFECT`` and ``_REFUSED`` for the audit of what
transformers 5.17 and 5.25 pass): implemented (``scaling``, ``softcap``, ``sliding_window``,
``is_causal``, ``deterministic``, ``cu_seq_lens_q`` / ``cu_seq_lens_k``, attention sinks: ``s_aux`` /
``sinks`` or ``module.sinks``, gpt-oss), without effect on the result for a reason written down
(``position_ids``: RoPE has used them, ...), or refused with a clear error when set: score biases (``position_bias``, T5),
sparse attention's selected keys (``indices`` / ``block_indices``), ``head_mask``, attention dropout
while training (``attention_dropout > 0``), ``output_attentions=True`` (no S x S matrix exists to
return), packed-sequence offsets the call cannot honour, and any keyword not in the audit (a
TypeError naming it: never a silent difference).

The mask function (transformers' masks as opforge patterns) lives in transformers_masks.py; this
module holds the attention functions, the keyword audit and the registration.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

import opforge
from opforge.integrations.transformers_masks import (
    NAME,
    OP,
    OpforgeMask,
    _masking_utils,
    opforge_mask,
)

# ---- the keywords the models pass ---------------------------------------------------------------
#
# What transformers 5.17 and 5.25 hand an attention function, read from their sources (every model's
# attention_interface(...) call, the keywords their layers spread into it through **kwargs,
# TransformersKwargs, continuous batching's arguments) and from runs of small models. Each keyword is
# implemented (the functions' parameters: dropout, scaling, softcap, sliding_window, is_causal,
# deterministic, cu_seq_lens_q / cu_seq_lens_k; output_attentions=False), refused when set (_REFUSED,
# attention dropout while training, output_attentions=True), or cannot change the result (_NO_EFFECT,
# with why). Any other keyword with a value is refused as well (_check_kwargs): a keyword a later
# transformers adds is an error until it is read here, never a silent difference.

_NO_EFFECT: dict[str, str] = {
    "position_ids": "the layer has rotated q and k by them (RoPE) before the call; packed sequences in them "
    "are read where eager and sdpa read them, by the mask function (create_causal_mask(position_ids=...), "
    "without a padding mask or a cache), whose mask says them as segment ids",
    "position_embeddings": "RoPE's (cos, sin), applied to q and k by the layer before the call",
    "max_length_q": "FlashAttention's maxima of the cu_seq_lens_q / cu_seq_lens_k lengths: "
    "opforge.attention_varlen finds every length from the offsets themselves",
    "max_length_k": "(as max_length_q)",
    "use_cache": "the layer has written k and v to its cache before the call; k and v hold the keys",
    "cache": "the layer's cache, already updated: k and v hold its keys (transformers 5.25's name)",
    "past_key_values": "(as cache: transformers 5.17's name)",
    "output_hidden_states": "an output of the model, not of attention",
    "output_router_logits": "an output of mixture-of-experts routers, not of attention",
    "num_items_in_batch": "the loss's normaliser (gradient accumulation)",
    "seq_idx": "Mamba layers' packed-sequence index (hybrid models); attention's sequences come from the "
    "mask or cu_seq_lens_q / cu_seq_lens_k",
    "logits_indices": "continuous batching's: the rows whose logits the model's head keeps",
    "logits_processor_args": "continuous batching's: the logits processors' arguments",
}

_INSTEAD = "use attn_implementation='eager'"
_REFUSED: dict[str, str] = {
    "position_bias": "a bias added to the scores (position_bias=: T5's relative position bias and the "
    f"models built like it) is not supported: opforge attention takes masks, not score biases; {_INSTEAD}",
    "head_mask": f"head_mask= (a factor on each head's attention weights) is not supported; {_INSTEAD}",
    "indices": "sparse attention's selected keys (indices=: the model folds them into the mask only for "
    "'eager' and 'sdpa') are not supported; use attn_implementation='eager' or 'sdpa'",
    "block_indices": "block-sparse attention's selected key blocks (block_indices=: the model folds them "
    "into the mask only for 'eager' and 'sdpa') are not supported; use attn_implementation='eager' or 'sdpa'",
    "read_index": f"continuous batching's paged-cache arguments (read_index=) need the 'paged|{NAME}' "
    "implementation (transformers 5.17's continuous batching)",
    "write_index": f"continuous batching's paged-cache arguments (write_index=) need the 'paged|{NAME}' "
    "implementation (transformers 5.17's continuous batching)",
    "block_table": f"continuous batching's paged-cache arguments (block_table=) need the 'paged|{NAME}' "
    "implementation (transformers 5.17's continuous batching)",
}


def _check_kwargs(module: torch.nn.Module, kwargs: dict[str, Any], read: frozenset[str]) -> None:
    """Refuse whatever the model passes that the caller does not read (``read``) and that could change
    the result: a refused keyword (NotImplementedError), or any keyword outside the audit that is not
    None (TypeError)."""
    for name, value in kwargs.items():
        if value is None or name in read or name in _NO_EFFECT:
            continue
        if name in _REFUSED:
            raise NotImplementedError(f"{OP}: {_REFUSED[name]}")
        raise TypeError(
            f"{OP}: the model passed {name}= ({type(value).__name__}), which opforge attention does not "
            "read; it is refused rather than ignored, as it may change the result: use another "
            "attn_implementation (such as 'eager') for this model"
        )


def _check_training_options(module: torch.nn.Module, dropout: float, kwargs: dict[str, Any]) -> None:
    # Dropout acts while training only, as in eager's nn.functional.dropout(training=module.training):
    # in eval mode a model may pass its attention_dropout and nothing changes.
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(
            f"{OP}: attention dropout ({dropout}) is not supported while training; set the config's "
            "attention_dropout to 0 or use another attn_implementation"
        )
    if kwargs.get("output_attentions"):
        raise ValueError(
            f"{OP}: output_attentions=True needs the attention weights; use attn_implementation='eager'"
        )


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


_READ = frozenset({"output_attentions", "cu_seq_lens_q", "cu_seq_lens_k", "s_aux", "sinks"})


def _sinks(module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The attention sinks the model hands over (gpt-oss: ``s_aux=self.sinks``; its eager function
    reads ``module.sinks``, so a module holding them gets them whatever the keywords), or None."""
    given = {key: kwargs[key] for key in ("s_aux", "sinks") if kwargs.get(key) is not None}
    if len(given) == 2 and given["s_aux"] is not given["sinks"]:  # (one would be dropped)
        raise TypeError(f"{OP}: attention sinks given twice, as s_aux= and as sinks=; give one")
    name, sinks = next(iter(given.items()), ("module.sinks", getattr(module, "sinks", None)))
    if not isinstance(sinks, torch.Tensor):
        return None
    if sinks.dim() != 1:  # (inkling2's sinks are projected from each token: (B, H, S, 1))
        raise NotImplementedError(
            f"{OP}: attention sinks other than one logit a head ({name}= of shape {list(sinks.shape)}: "
            f"per-token sinks) are not supported; {_INSTEAD}"
        )
    return sinks


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
    deterministic: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface for the "opforge" implementation: (B, S, H, D), None.
    ``deterministic`` (ModernBERT's, FlashAttention's meaning) is the backward's, as in
    opforge.attention."""
    _check_training_options(module, dropout, kwargs)
    _check_kwargs(module, kwargs, _READ)
    padded = False
    if isinstance(attention_mask, OpforgeMask):
        # The mask is the whole pattern, as a mask is for eager and sdpa: the model's mask function
        # holds its window and causality (sliding_window and is_causal are FlashAttention's copies of
        # them, for an implementation that gets no mask).
        kw = dict(attention_mask.kwargs)
        padded = attention_mask.padded
        if attention_mask.keys < key.shape[2]:
            key, value = key[:, :, : attention_mask.keys], value[:, :, : attention_mask.keys]
    elif attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        kw = {"causal": bool(causal)}
        if sliding_window:
            # FlashAttention's reading: keys within sliding_window - 1 on both sides, the later side
            # cut by causality (ModernBERT passes its half window + 1 for |q - k| <= half window).
            w = int(sliding_window) - 1
            kw["window"] = (w, 0 if causal else w)
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        # (as for eager and sdpa, the mask is the pattern: sliding_window and is_causal are in it)
        kw = {"mask": _block_mask_of(attention_mask)}
    else:
        raise TypeError(
            f"{OP}: attention_mask must come from the 'opforge' mask function (register()), be None or a "
            f"4-D tensor, got {type(attention_mask).__name__}"
        )
    common = dict(
        scale=scaling, softcap=softcap or None, deterministic=deterministic, sinks=_sinks(module, kwargs)
    )
    varlen = _varlen(query, key.shape[2], kw, kwargs, padded)
    if varlen is not None:
        cu_q, cu_k = varlen
        kw = {n: x for n, x in kw.items() if n != "segment_ids"}
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (S, H, D) views
        out = opforge.attention_varlen(q, k, v, cu_q, cu_k, **common, **kw)
        return out.unsqueeze(0), None
    out = opforge.attention(query, key, value, **common, **kw)
    return out.transpose(1, 2).contiguous(), None


def _varlen(
    query: torch.Tensor, keys: int, kw: dict[str, Any], kwargs: dict[str, Any], padded: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """FlashAttention's packed-sequence offsets (cu_seq_lens_q, cu_seq_lens_k) on the query's device,
    for opforge.attention_varlen: one row of packed sequences whose pattern is causal, a window or
    none (the sequences' segment ids then say nothing more); None without them. Offsets this call
    cannot honour are refused, never dropped."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    why = None
    if not all(isinstance(c, torch.Tensor) and c.dim() == 1 for c in (cu_q, cu_k)):
        why = (
            f"they must come together, each a 1-D tensor, got {type(cu_q).__name__} and {type(cu_k).__name__}"
        )
    elif query.shape[0] != 1:
        why = f"packed sequences come in one row (batch 1), got a batch of {query.shape[0]}"
    elif "mask" in kw:
        why = "the mask is a block mask (a pattern opforge.attention_varlen does not take)"
    elif "kv_lens" in kw:
        why = "this is a static cache's decode step"
    elif padded:
        why = "a padding mask (attention_mask with zeros) comes with them"
    elif keys != query.shape[2]:
        why = (
            f"the layer attends to {keys} keys for {query.shape[2]} queries (a KV cache holds keys before "
            "these tokens), and the offsets say how the new tokens pack, not the cache"
        )
    if why is not None:
        raise NotImplementedError(
            f"{OP}: cu_seq_lens_q / cu_seq_lens_k (FlashAttention's packed-sequence offsets) cannot be "
            f"honoured here: {why}; pass the packed sequences as one row without padding, or use "
            "another attn_implementation"
        )
    return cu_q.to(query.device), cu_k.to(query.device)


_PAGED_READ = frozenset(
    {
        "output_attentions",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_seqlen_q",
        "max_seqlen_k",
        "read_index",
        "write_index",
        "block_table",
        "sliding_window",
        "s_aux",
        "sinks",
    }
)


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
    is_causal: bool | None = None,
    deterministic: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' continuous batching (``"paged|opforge"``, transformers 5.17's contract): the new
    tokens of every request in one row, q (1, H, T, D) and k, v (1, Hkv, T, D); this function writes
    them into the paged cache (``cache.update``), which returns each request's keys and values
    gathered one request after another, (Lk, Hkv, D), at ``cu_seq_lens_k``. Each request's new
    tokens attend causally to its cached ones and to each other (queries aligned to the end of the
    request's keys), within the layer's sliding window if it has one: opforge.attention_varlen.
    Returns (1, T, H, D), None (rows past the requests' tokens, the padding of a padded batch, are
    zeros). Keywords as for ``opforge_attention`` (max_seqlen_q / max_seqlen_k: maxima that
    opforge.attention_varlen finds from the offsets itself); a mask, ``is_causal=False`` and a block
    table are refused."""
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
    _check_training_options(module, dropout, kwargs)
    _check_kwargs(module, kwargs, _PAGED_READ)
    if attention_mask is not None:
        raise ValueError(
            f"{OP}: 'paged|{NAME}' takes no attention_mask (transformers 5.17's continuous batching gives "
            f"a non-flash paged implementation none: the offsets say where the requests are), got "
            f"{type(attention_mask).__name__}"
        )
    if is_causal is False:
        raise NotImplementedError(
            f"{OP}: 'paged|{NAME}' attends causally (each request's new tokens to its cache and to each "
            "other); is_causal=False is not supported"
        )
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
    # A padded batch (CUDA graphs / compile) has rows past the last request's: they belong to no
    # sequence, and attention_varlen returns zeros for them. transformers builds the offsets itself, so
    # they are not checked on the host (check_offsets=False: no synchronization a layer a step).
    kw: dict[str, Any] = {"causal": True, "check_offsets": False}
    if sliding:
        kw["window"] = (int(sliding) - 1, 0)
    out = opforge.attention_varlen(
        q,
        k,
        v,
        cu_q,
        cu_k,
        per_layer(kwargs.get("max_seqlen_q")),
        per_layer(kwargs.get("max_seqlen_k")),
        scale=scaling,
        softcap=softcap or None,
        deterministic=deterministic,
        sinks=_sinks(module, kwargs),
        **kw,
    )
    return out.unsqueeze(0), None


# transformers >= 5.24 runs continuous batching only on "paged|eager", "sdpa" and flash-named
# implementations, and loads an unknown flash name as a Hub kernel through the `kernels` package
# (a dependency of those releases), whose LOCAL_KERNELS override maps a kernel "repo id" to a local
# directory. register() writes such a directory (a module exporting opforge.flash_attn_interface's
# three functions) and maps this name to it. The name has "flash" and "3" in it: transformers takes
# its block-table decode path (flash_attn_with_kvcache) only for names matching FlashAttention 2 / 3.
FLASH_NAME = "opforge/flash-attn3"
_CB_FLASH_RELEASE = "5.24"
_flash_kernel_dir: str | None = None


def _register_flash_kernel() -> None:
    """FLASH_NAME as a local kernel for the `kernels` package (once a process): a directory in the
    layout it reads (build/torch-universal/ with the module and its metadata.json), removed at exit,
    added to LOCAL_KERNELS (other entries kept)."""
    global _flash_kernel_dir
    import atexit
    import json
    import os
    import shutil
    import tempfile

    if _flash_kernel_dir is None:
        root = tempfile.mkdtemp(prefix="opforge-hf-kernel-")
        atexit.register(shutil.rmtree, root, True)
        variant = os.path.join(root, "build", "torch-universal")
        os.makedirs(variant)
        with open(os.path.join(variant, "__init__.py"), "w") as f:
            f.write(
                '"""opforge\'s FlashAttention API as a transformers kernel (opforge.integrations.transformers)."""\n'
                "from opforge.flash_attn_interface import (  # noqa: F401\n"
                "    flash_attn_func,\n    flash_attn_varlen_func,\n    flash_attn_with_kvcache,\n)\n"
            )
        metadata = {
            "id": "_opforge_flash_attn",  # (the module's name in sys.modules)
            "name": "opforge-flash-attn",
            "version": 1,
            "license": "NOASSERTION",
            "backend": {"type": "cpu"},  # (torch-universal: the module runs wherever opforge does)
            "python-depends": [],
        }
        with open(os.path.join(variant, "metadata.json"), "w") as f:
            json.dump(metadata, f)
        _flash_kernel_dir = root
    entries = [
        e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e and e.split("=")[0] != FLASH_NAME
    ]
    os.environ["LOCAL_KERNELS"] = ":".join([*entries, f"{FLASH_NAME}={_flash_kernel_dir}"])


def register(name: str = NAME) -> str:
    """Register opforge attention with transformers under ``name`` (idempotent), its
    continuous-batching form, and return the implementation name to pass for continuous batching
    (``model.generate_batch``, ``ContinuousBatchingManager``) on the installed release:

    - transformers < 5.24: ``"paged|" + name`` (opforge_paged_attention, on the gathered cache);
    - transformers >= 5.24: ``FLASH_NAME`` (``"opforge/flash-attn3"``), a local kernel exporting
      opforge.flash_attn_interface's three functions through the `kernels` package's LOCAL_KERNELS
      override (set here for this process): transformers then calls flash_attn_varlen_func on the
      gathered cache in prefill steps and, on CUDA, flash_attn_with_kvcache on the pages in decode
      steps.

    ``name`` itself (``"opforge"``) stays the implementation for everything else (prefill, generate,
    training): its mask function gives opforge the model's pattern (windows, packed sequences,
    padding, any mask function), which a flash name does not get. Models that restrict their flash
    implementations to a list (gpt-oss, for its attention sinks) get FLASH_NAME added to it
    (_vouch_flash_kernel), since opforge computes what the list is for."""
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
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__).release >= Version(_CB_FLASH_RELEASE).release:
        _register_flash_kernel()
        _vouch_flash_kernel()
        return FLASH_NAME
    return "paged|" + name


# Models whose flash implementations transformers restricts to a list the model's authors vouch for
# (``_compatible_flash_implementations``: a flash name outside it is replaced by the list's first
# kernel, with a warning), for features every kernel of the list computes and that opforge's computes
# too: gpt-oss, attention sinks (s_aux). FLASH_NAME joins those lists (a new list on the class), so that
# continuous batching runs such a model on opforge instead of fetching another kernel from the Hub.
_VOUCHED_MODELS = {"gpt_oss": "GptOssPreTrainedModel"}


def _vouch_flash_kernel() -> None:
    import importlib

    for module, cls_name in _VOUCHED_MODELS.items():
        try:
            cls = getattr(
                importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name
            )
        except (ImportError, AttributeError):  # (a release without the model)
            continue
        names = list(getattr(cls, "_compatible_flash_implementations", None) or [])
        if names and FLASH_NAME not in names:
            cls._compatible_flash_implementations = [*names, FLASH_NAME]
