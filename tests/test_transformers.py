"""opforge attention inside Hugging Face transformers models (small configs, random weights, CPU):
the same logits as the models' eager / sdpa implementations in prefill, the same greedy tokens in
generate(), left-padded batches, packed sequences, training gradients, the mask translation against
transformers' own dense masks, and the errors."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import masking_utils as mu

import opforge
import opforge.integrations.transformers as otf
from opforge.masks import attention_mask

otf.register()

VOCAB = 96


def small(kind: str):
    """(model class, config) of a small model of each family: 2-4 layers, hidden 64, GQA 4/2."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    if kind == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralForCausalLM, transformers.MistralConfig(**common, sliding_window=12)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**common)
    if kind == "qwen2-sliding":  # sliding-window layers from max_window_layers on
        cfg = transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=12, max_window_layers=1
        )
        return transformers.Qwen2ForCausalLM, cfg
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**common, head_dim=16)
    if kind == "gemma2":
        cfg = transformers.Gemma2Config(
            **{**common, "num_hidden_layers": 4},
            head_dim=16,
            sliding_window=12,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=20.0,
            final_logit_softcapping=30.0,
        )
        return transformers.Gemma2ForCausalLM, cfg
    if kind == "gpt-oss":  # attention sinks, a sliding and a full layer, a mixture of experts
        cfg = transformers.GptOssConfig(
            **{**common, "intermediate_size": 64},
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            head_dim=16,
            sliding_window=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
        )
        return transformers.GptOssForCausalLM, cfg
    raise ValueError(kind)


MODELS = ["llama", "mistral", "qwen2", "qwen2-sliding", "qwen3", "gemma2"]


def build(kind: str, impl: str, dtype=torch.float32):
    cls, cfg = small(kind)
    torch.manual_seed(0)  # the same random weights for every implementation
    model = cls(cfg).to(dtype).eval()
    with torch.no_grad():  # (gpt-oss's sinks, initialised near 0, drawn where they change every row)
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.Tensor):
                module.sinks.copy_(torch.randn(module.sinks.shape) * 2)
    model.set_attn_implementation(impl)
    return model


def peers(kind: str) -> list[str]:
    return ["eager"] if kind == "gemma2" else ["eager", "sdpa"]  # (Gemma 2 has no sdpa: softcap)


@pytest.fixture
def masks_made(monkeypatch):
    """Every OpforgeMask the mask function returns during the test."""
    made = []
    real = otf.opforge_mask

    def spy(*args, **kwargs):
        m = real(*args, **kwargs)
        made.append(m)
        return m

    monkeypatch.setitem(mu.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "opforge", spy)
    return made


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 2e-5) -> bool:
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("kind", MODELS)
def test_prefill_logits_match(kind, masks_made):
    ids = torch.randint(1, VOCAB, (2, 40))  # longer than the sliding windows (12)
    with torch.no_grad():
        got = build(kind, "opforge")(ids).logits
        for peer in peers(kind):
            want = build(kind, peer)(ids).logits
            assert close(got, want), (kind, peer, (got - want).abs().max().item())
    # The models' masks are patterns opforge knows: no block mask was evaluated for them.
    assert masks_made and all("mask" not in m.kwargs for m in masks_made)
    if kind in ("mistral", "gemma2", "qwen2-sliding"):
        assert any(m.kwargs.get("window") == (11, 0) for m in masks_made)


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_prefill_bfloat16(kind):
    # bf16 weights and activations: as close to a float32 reference as the peers' bf16 logits.
    ids = torch.randint(1, VOCAB, (2, 40))
    with torch.no_grad():
        ref = build(kind, "eager")(ids).logits
        got = build(kind, "opforge", torch.bfloat16)(ids).logits.float()
        low = build(kind, peers(kind)[-1], torch.bfloat16)(ids).logits.float()
    assert (got - ref).abs().max() <= 2 * (low - ref).abs().max() + 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("kind", MODELS)
def test_generate_left_padded_batch(kind):
    # Two prompts of 9 and 5 tokens, left-padded; 32 greedy steps (past the window of 12).
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    ids[1, :4] = 0
    mask[1, :4] = 0
    gen = dict(max_new_tokens=32, do_sample=False, pad_token_id=0)
    got = build(kind, "opforge").generate(ids, attention_mask=mask, **gen)
    for peer in peers(kind):
        want = build(kind, peer).generate(ids, attention_mask=mask, **gen)
        assert torch.equal(got, want), (kind, peer)
    # Prefill logits of the padded batch at the real tokens, against eager.
    with torch.no_grad():
        a = build(kind, "opforge")(ids, attention_mask=mask).logits
        b = build(kind, "eager")(ids, attention_mask=mask).logits
    real = mask.bool()
    assert close(a[real], b[real])


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_generate_static_cache(kind):
    ids = torch.randint(1, VOCAB, (2, 7))
    gen = dict(max_new_tokens=24, do_sample=False, pad_token_id=0, cache_implementation="static")
    got = build(kind, "opforge").generate(ids, attention_mask=torch.ones_like(ids), **gen)
    want = build(kind, "eager").generate(ids, attention_mask=torch.ones_like(ids), **gen)
    assert torch.equal(got, want)


@pytest.mark.slow
def test_generate_static_cache_compiled():
    # generate()'s own torch.compile of the forward (as on GPUs with a static cache), here forced on
    # the CPU with dynamo's eager backend: the same tokens as eager attention.
    ids = torch.randint(1, VOCAB, (2, 7))
    cfg = transformers.CompileConfig(backend="eager")
    cfg._compile_all_devices = True
    gen = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, cache_implementation="static")
    for kind in ("llama", "mistral"):  # (causal: the device-only decode mask; sliding: the general one)
        torch._dynamo.reset()
        got = build(kind, "opforge").generate(
            ids, attention_mask=torch.ones_like(ids), compile_config=cfg, **gen
        )
        torch._dynamo.reset()
        want = build(kind, "eager").generate(ids, attention_mask=torch.ones_like(ids), **gen)
        torch._dynamo.reset()
        assert torch.equal(got, want), kind


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_packed_sequences_match_one_by_one(kind, masks_made):
    # DataCollatorWithFlattening-style input: three sequences in one row, positions restarting.
    lengths = [11, 20, 7]
    seqs = [torch.randint(1, VOCAB, (1, n)) for n in lengths]
    ids = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    model = build(kind, "opforge")
    with torch.no_grad():
        packed = model(ids, position_ids=position_ids, use_cache=False).logits  # (as in training)
        alone = torch.cat([model(s).logits for s in seqs], dim=1)
    assert close(packed, alone)
    assert any(isinstance(m.kwargs.get("segment_ids"), tuple) for m in masks_made)


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_packed_sequences_with_flash_kwargs_run_varlen(kind, monkeypatch):
    """DataCollatorWithFlattening(return_flash_attn_kwargs=True)'s cu_seq_lens_q / cu_seq_lens_k
    reach the attention function: opforge.attention_varlen runs every layer, and the logits and
    gradients are those of the sequences one by one."""
    lengths = [11, 20, 7]
    seqs = [torch.randint(1, VOCAB, (1, n)) for n in lengths]
    ids = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 11, 31, 38], dtype=torch.int32)
    calls = []
    real = opforge.attention_varlen
    monkeypatch.setattr(opforge, "attention_varlen", lambda *a, **k: calls.append(k) or real(*a, **k))
    model = build(kind, "opforge")
    flash = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20)
    packed = model(ids, position_ids=position_ids, use_cache=False, **flash).logits
    assert len(calls) == model.config.num_hidden_layers
    with torch.no_grad():
        alone = torch.cat([model(s).logits for s in seqs], dim=1)
    assert close(packed.detach(), alone)
    packed.sum().backward()  # (the varlen backward through every layer)
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_training_step_gradients_match(kind):
    ids = torch.randint(1, VOCAB, (2, 30))
    grads = {}
    for impl in ("opforge", "eager"):
        model = build(kind, impl, dtype=torch.float64).train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads["opforge"].keys() == grads["eager"].keys()
    for name, g in grads["opforge"].items():  # (eager's softmax runs in float32)
        assert close(g, grads["eager"][name], 1e-6), name


def dense(m: otf.OpforgeMask, batch: int) -> torch.Tensor:
    """The (B, 1, q_length, kv_length) bool mask an OpforgeMask stands for."""
    kw = dict(m.kwargs)
    got = attention_mask(batch, 1, m.q_length, m.keys, **kw)
    out = torch.zeros(batch, 1, m.q_length, m.kv_length, dtype=torch.bool)
    out[..., : m.keys] = got
    return out


GEOMETRIES = [
    # (q_length, kv_length, q_offset, kv_offset): prefill, decode with a dynamic cache, chunked
    # prefill, a full sliding-window cache (offset keys), a static cache's prefill and decode.
    (16, 16, 0, 0),
    (1, 23, 22, 0),
    (5, 30, 25, 0),
    (3, 14, 40, 29),
    (9, 32, 0, 0),
    (1, 32, 12, 0),
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize(
    "pattern", ["causal", "sliding", "bidirectional", "bidirectional sliding", "chunked"]
)
@pytest.mark.parametrize("padded", [False, True])
def test_mask_translation_matches_transformers(pattern, geometry, padded):
    q_length, kv_length, q_offset, kv_offset = geometry
    B = 3
    fn = {
        "causal": mu.causal_mask_function,
        "sliding": mu.sliding_window_causal_mask_function(6),
        "bidirectional": mu.bidirectional_mask_function,
        "bidirectional sliding": mu.sliding_window_bidirectional_mask_function(4),
        "chunked": mu.chunked_causal_mask_function(5, torch.zeros(B, dtype=torch.long)),  # (not a pattern)
    }[pattern]
    am = None
    if padded:
        am = torch.ones(B, kv_offset + kv_length, dtype=torch.bool)
        am[1, : kv_offset + 3] = False  # left padding
        am[2, -2:] = False
    args = dict(batch_size=B, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset)
    want = mu.sdpa_mask(**args, mask_function=fn, attention_mask=am, allow_is_causal_skip=False)
    got = otf.opforge_mask(**args, mask_function=fn, attention_mask=am)
    assert isinstance(got, otf.OpforgeMask)
    # A band says the pattern unless it is not one (chunked), or keys past the queries' last one
    # exist (a static cache) and the pattern is not causal.
    keys = q_offset - kv_offset + q_length
    banded = pattern != "chunked" and (keys == kv_length or pattern in ("causal", "sliding"))
    assert ("mask" not in got.kwargs) == banded
    assert torch.equal(dense(got, B), want.expand(B, 1, q_length, kv_length))


@pytest.mark.parametrize("padded", [None, False, True], ids=["no mask", "unpadded", "padded"])
@pytest.mark.parametrize(
    "pattern,kv_length,q_offset,kv_offset",
    # a static cache's full layer part-written; a sliding layer filling up, and full (offset keys)
    [("causal", 32, 12, 0), ("sliding", 6, 3, 0), ("sliding", 6, 40, 35)],
    ids=str,
)
def test_static_cache_decode_mask_reads_nothing_on_the_host(pattern, kv_length, q_offset, kv_offset, padded):
    # A static cache's decode step: q_offset a tensor; the written slots become kv_lens (a device
    # tensor: no host read, no slicing), padding a segment.
    B = 2
    fn = mu.causal_mask_function if pattern == "causal" else mu.sliding_window_causal_mask_function(6)
    am = torch.ones(B, q_offset + 1, dtype=torch.bool)
    if padded:
        am[1, :4] = False
    args = dict(
        batch_size=B, q_length=1, kv_length=kv_length, q_offset=torch.tensor(q_offset), kv_offset=kv_offset
    )
    got = otf.opforge_mask(**args, mask_function=fn, attention_mask=am)
    assert got.keys == kv_length and got.kwargs["causal"] is True and "mask" not in got.kwargs
    lens = got.kwargs["kv_lens"]
    assert isinstance(lens, torch.Tensor) and lens.tolist() == [q_offset - kv_offset + 1] * B
    # (an all-ones padding mask is not looked at on the host: it becomes segments too)
    assert ("segment_ids" in got.kwargs) == (am is not None)
    want = mu.sdpa_mask(**args, mask_function=fn, attention_mask=am, allow_is_causal_skip=False)
    assert torch.equal(dense(got, B), want.expand(B, 1, 1, kv_length))


def test_packed_mask_translation():
    position_ids = torch.cat([torch.arange(n) for n in (4, 7, 3)])[None].expand(2, -1)
    packed = mu.find_packed_sequence_indices(position_ids)
    # (transformers >= 5.2x remaps positions per packed sequence; earlier 5.x applies the pattern as is)
    remap = getattr(mu, "remap_positions_for_packed_sequence", lambda fn, _: fn)
    for base in (mu.causal_mask_function, mu.sliding_window_causal_mask_function(3)):
        fn = mu.and_masks(remap(base, position_ids), mu.packed_sequence_mask_function(packed))
        args = dict(batch_size=2, q_length=14, kv_length=14)
        want = mu.sdpa_mask(**args, mask_function=fn, allow_is_causal_skip=False)
        got = otf.opforge_mask(**args, mask_function=fn)
        assert "mask" not in got.kwargs and isinstance(got.kwargs["segment_ids"], tuple)
        assert torch.equal(dense(got, 2), want)


def test_look_alike_mask_function_is_not_taken_for_a_pattern():
    # A function of another module that happens to share transformers' closure names.
    def sliding_window_overlay(sliding_window):
        def inner_mask(b, h, q, kv):
            return (kv > q - sliding_window) & ((q + kv) % 3 != 0)

        inner_mask.__qualname__ = "sliding_window_overlay.<locals>.inner_mask"  # transformers' name
        return inner_mask

    fn = mu.and_masks(sliding_window_overlay(5), mu.causal_mask_function)
    args = dict(batch_size=1, q_length=24, kv_length=24)
    got = otf.opforge_mask(**args, mask_function=fn)
    assert "mask" in got.kwargs
    assert torch.equal(dense(got, 1), mu.sdpa_mask(**args, mask_function=fn, allow_is_causal_skip=False))


def test_unknown_mask_function_becomes_a_block_mask():
    # A custom overlay (or_masks): evaluated once into an opforge.block_mask, never dropped.
    def prefix4(b, h, q, kv):
        return kv < 4

    fn = mu.or_masks(mu.causal_mask_function, prefix4)
    args = dict(batch_size=2, q_length=20, kv_length=20)
    got = otf.opforge_mask(**args, mask_function=fn)
    assert isinstance(got.kwargs["mask"], opforge.BlockMask)
    want = mu.sdpa_mask(**args, mask_function=fn, allow_is_causal_skip=False)
    assert torch.equal(dense(got, 2), want.expand(2, 1, 20, 20))


def test_errors():
    with pytest.raises(ValueError, match="must not contain 'flash'"):
        otf.register("my_flash")
    model = build("llama", "opforge").train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ids = torch.randint(1, VOCAB, (1, 8))
    with pytest.raises(NotImplementedError, match="attention dropout"):
        model(ids)
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 16)
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="output_attentions"):
        otf.opforge_attention(attn.eval(), q, k, v, None, output_attentions=True)
    with pytest.raises(TypeError, match="attention_mask must come from"):
        otf.opforge_attention(attn, q, k, v, "causal")
    with pytest.raises(ValueError, match="not additive score biases"):
        otf.opforge_attention(attn, q, k, v, torch.randn(1, 1, 8, 8))


def test_four_d_mask_given_by_the_user():
    model = build("llama", "opforge")
    ids = torch.randint(1, VOCAB, (2, 12))
    allowed = torch.rand(2, 1, 12, 12) < 0.5
    allowed |= torch.eye(12, dtype=torch.bool)  # every row sees itself
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        # bool: True = visible (as SDPA reads it); float: added to the scores (as eager adds it)
        assert close(
            model(ids, attention_mask=allowed).logits,
            build("llama", "sdpa")(ids, attention_mask=allowed).logits,
        )
        assert close(
            model(ids, attention_mask=additive).logits,
            build("llama", "eager")(ids, attention_mask=additive).logits,
        )


def test_four_d_integer_mask():
    """An integer 0/1 mask reads as the bool mask it holds (1 = visible); any other integer is refused
    with a message that says what a 4-D mask may hold."""
    model = build("llama", "opforge")
    ids = torch.randint(1, VOCAB, (2, 12))
    allowed = torch.rand(2, 1, 12, 12) < 0.5
    allowed |= torch.eye(12, dtype=torch.bool)  # every row sees itself
    with torch.no_grad():
        want = model(ids, attention_mask=allowed).logits
        for dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
            assert torch.equal(model(ids, attention_mask=allowed.to(dtype)).logits, want), dtype
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 12, 16)
    k = v = torch.randn(1, 2, 12, 16)
    for bad, value in ((allowed[:1].long() * 2, 2), (allowed[:1].int() - 1, -1)):
        with pytest.raises(
            ValueError,
            match=rf"opforge\.integrations\.transformers: an integer attention_mask must hold only 0 \(masked\) "
            rf"and 1 \(visible\), as a bool one holds False and True, got {value}",
        ):
            otf.opforge_attention(attn, q, k, v, bad)


def test_a_model_that_takes_the_mask_for_a_tensor_is_told_why():
    """Models that read the mask as a tensor (Falcon's ALiBi adds a bias to it, Doge edits it) get an
    AttributeError that names the reason and the implementations to use; hasattr() still answers
    False (the mask is no tensor)."""
    mask = otf.OpforgeMask({"causal": True}, 4, 4, 4)
    assert not hasattr(mask, "dtype") and mask.ndim == 4 and mask.shape == (1, 1, 4, 4)
    with pytest.raises(
        AttributeError, match=r"this model reads the attention mask as a tensor \(its \.dtype\)"
    ):
        mask.dtype  # noqa: B018
    if hasattr(transformers, "DogeConfig"):
        cfg = transformers.DogeConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
        )  # fmt: skip
        model = transformers.DogeForCausalLM._from_config(cfg, attn_implementation="opforge").eval()
        with torch.no_grad(), pytest.raises(AttributeError, match=r"run this model on 'sdpa' or 'eager'"):
            model(torch.randint(1, VOCAB, (1, 6)))


def test_four_d_mask_classified_once_a_forward():
    allowed = torch.rand(1, 1, 40, 40) < 0.5
    first = otf._block_mask_of(allowed)
    assert otf._block_mask_of(allowed) is first  # (every layer gets the same tensor)
    allowed[..., :5] = ~allowed[..., :5]  # changed in place: classified again
    again = otf._block_mask_of(allowed)
    assert again is not first and torch.equal(again.to_dense(), allowed)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_torch_compile_no_graph_break(kind):
    """torch.compile(fullgraph=True) traces the forward: without a mask, with a padding mask (all
    ones, and with padded keys: transformers' usual tokenizer output), and with use_cache=False (where
    transformers, tracing, always adds its packed-sequence mask functions), each as eager gives it."""
    model = build(kind, "opforge")
    ids = torch.randint(1, VOCAB, (2, 16))
    padded = torch.ones_like(ids)
    padded[0, :5] = 0  # (left padding)
    calls = {
        "plain": {},
        "mask of ones": {"attention_mask": torch.ones_like(ids)},
        "padding": {"attention_mask": padded},
        "no cache": {"use_cache": False},
    }
    for name, kw in calls.items():
        torch._dynamo.reset()
        with torch.no_grad():
            want = model(ids, **kw).logits
            explanation = torch._dynamo.explain(model)(ids, **kw)
        assert explanation.graph_break_count == 0, (name, explanation.break_reasons)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        with torch.no_grad():
            got = compiled(ids, **kw).logits
        keep = (kw.get("attention_mask", torch.ones_like(ids)) == 1)[..., None]  # (padded queries: any)
        assert close(torch.where(keep, got, 0), torch.where(keep, want, 0)), name


class _GatheredCache:
    """transformers 5.17's paged cache as continuous batching's attention function sees it: update()
    takes the new tokens' k, v (1, Hkv, T, D) and returns every request's keys and values, cached
    then new, one request after another (Lk, Hkv, D)."""

    def __init__(self, past_k, past_v):
        self.past_k, self.past_v, self.layers = past_k, past_v, []

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        self.layers.append(layer_idx)
        k, v = [], []
        new_k, new_v = key_states[0].transpose(0, 1), value_states[0].transpose(0, 1)
        start = 0
        for pk, pv, n in zip(self.past_k, self.past_v, self.new_counts, strict=True):
            k += [pk, new_k[start : start + n]]
            v += [pv, new_v[start : start + n]]
            start += n
        return torch.cat(k), torch.cat(v)


@pytest.mark.parametrize("window", [None, 5])
def test_paged_attention_under_continuous_batching(window):
    """'paged|opforge' (register()): each request's new tokens attend causally to its cached keys and
    to each other (aligned to the end of its keys), within the layer's sliding window; a padded
    batch's extra rows come back as zeros; against SDPA request by request."""
    torch.manual_seed(0)
    past, new = [0, 9, 3, 17], [6, 1, 4, 2]  # a fresh prefill, decodes, a chunk of a longer prompt
    H, Hkv, D, pad = 4, 2, 16, 3
    cache = _GatheredCache([torch.randn(n, Hkv, D) for n in past], [torch.randn(n, Hkv, D) for n in past])
    cache.new_counts = new
    T = sum(new)
    q = torch.randn(1, H, T + pad, D)
    k, v = torch.randn(1, Hkv, T + pad, D), torch.randn(1, Hkv, T + pad, D)
    cu_q = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    lens = [p + n for p, n in zip(past, new, strict=True)]
    cu_k = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    module = torch.nn.Module()
    module.layer_idx = 3
    kw = {"sliding_window": window} if window else {}
    out, weights = otf.opforge_paged_attention(
        module,
        q,
        k,
        v,
        None,
        scaling=0.3,
        cache=cache,
        cu_seq_lens_q=cu_q,
        cu_seq_lens_k=cu_k,
        max_seqlen_q=max(new),
        max_seqlen_k=max(lens),
        read_index=[None],
        write_index=[None],
        **kw,
    )
    assert weights is None and cache.layers == [3]
    assert out.shape == (1, T + pad, H, D)
    keys, values = cache.update(k, v, 3, None, None)
    for i in range(len(new)):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        qi = q[0, :, qs:qe]
        ki = keys[ks:ke].transpose(0, 1).repeat_interleave(H // Hkv, 0)
        vi = values[ks:ke].transpose(0, 1).repeat_interleave(H // Hkv, 0)
        pos = torch.arange(qe - qs)[:, None] + (ke - ks) - (qe - qs)
        j = torch.arange(ke - ks)[None, :]
        seen = (j <= pos) & ((j > pos - window) if window else True)
        want = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=seen, scale=0.3)
        torch.testing.assert_close(out[0, qs:qe], want.transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert (out[0, T:] == 0).all()


def test_paged_attention_errors_and_registration():
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping["paged|opforge"] is otf.opforge_paged_attention
    module = torch.nn.Module()
    module.layer_idx = 0
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    with pytest.raises(TypeError, match="continuous batching"):
        otf.opforge_paged_attention(module, q, k, k, None)
    cache = _GatheredCache([torch.randn(0, 2, 16)], [torch.randn(0, 2, 16)])
    cache.new_counts = [3]
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="block-table"):
        otf.opforge_paged_attention(
            module, q, k, k, None, cache=cache, cu_seq_lens_q=cu, cu_seq_lens_k=cu, block_table=cu
        )


# ---- every keyword a model passes: implemented, without effect, or refused -----------------------


def test_gpt_oss_attention_sinks_match_eager():
    """gpt-oss hands over its sinks (s_aux=module.sinks; its eager function reads module.sinks): on
    "opforge" its logits are eager's (a sliding and a full layer, a padded batch) and generate()
    gives eager's tokens; both attention functions read the sinks from the module alone as well."""
    ref, model = build("gpt-oss", "eager"), build("gpt-oss", "opforge")
    torch.manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 21))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # (left padding)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask).logits
        assert close(got[mask.bool()], want[mask.bool()], 1e-4)
        gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(model.generate(ids[:1], **gen), ref.generate(ids[:1], **gen))
    attn = model.model.layers[1].self_attn
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    with_sinks = opforge.attention(q, k, k, causal=True, sinks=attn.sinks.detach())
    out, _ = otf.opforge_attention(attn, q, k, k, None)
    torch.testing.assert_close(out, with_sinks.transpose(1, 2))
    cu = torch.tensor([0, 5], dtype=torch.int32)
    cache = _GatheredCache([torch.randn(0, 2, 16)], [torch.randn(0, 2, 16)])
    cache.new_counts = [5]
    paged, _ = otf.opforge_paged_attention(
        attn, q, k, k, None, cache=cache, cu_seq_lens_q=cu, cu_seq_lens_k=cu
    )
    torch.testing.assert_close(paged, with_sinks.transpose(1, 2))
    with pytest.raises(NotImplementedError, match=r"s_aux= of shape \[1, 4, 5, 1\]: per-token sinks"):
        otf.opforge_attention(attn, q, k, k, None, s_aux=torch.zeros(1, 4, 5, 1))
    # (under both names: the same tensor is one set of sinks, two different ones would drop one)
    same, _ = otf.opforge_attention(attn, q, k, k, None, s_aux=attn.sinks, sinks=attn.sinks)
    torch.testing.assert_close(same, with_sinks.transpose(1, 2))
    with pytest.raises(TypeError, match=r"attention sinks given twice, as s_aux= and as sinks="):
        otf.opforge_attention(attn, q, k, k, None, s_aux=attn.sinks, sinks=torch.zeros(4))


def test_deepseek_v3_head_dims_match_eager():
    """DeepSeek V3's MLA attends with q and k of one head dim (nope + rope: 24 here, 192 in the model)
    and v of another (16; 128): on "opforge" its logits are eager's and generate() gives eager's
    tokens."""
    cfg = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    models = []
    for impl in ("eager", "opforge"):
        torch.manual_seed(0)
        models.append(transformers.DeepseekV3ForCausalLM(cfg).eval())
        models[-1].set_attn_implementation(impl)
    ref, model = models
    torch.manual_seed(3)
    ids = torch.randint(3, VOCAB, (2, 19))
    with torch.no_grad():
        assert close(model(ids).logits, ref(ids).logits, 1e-4)
        gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(model.generate(ids[:1], **gen), ref.generate(ids[:1], **gen))


def test_t5_position_bias_is_refused():
    # T5 adds its relative position bias to the scores (position_bias=, in every layer).
    cfg = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    # (loaded with the implementation: transformers 5.17's set_attn_implementation leaves T5's encoder
    # and decoder, which hold copies of the config, on sdpa)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg, attn_implementation="opforge").eval()
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad(), pytest.raises(NotImplementedError, match=r"transformers: .*\(position_bias=: T5"):
        model(input_ids=ids, decoder_input_ids=ids)


def qkv(batch: int = 1, length: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return (
        torch.randn(batch, 4, length, 16),
        torch.randn(batch, 2, length, 16),
        torch.randn(batch, 2, length, 16),
    )


@pytest.mark.parametrize(
    "name,value,match",
    [
        # Inkling 2's per-token sinks
        ("sinks", torch.zeros(1, 4, 8, 1), r"sinks= of shape \[1, 4, 8, 1\]: per-token sinks.*'eager'"),
        ("position_bias", torch.zeros(1, 4, 8, 8), r"score biases; use attn_implementation='eager'"),
        ("head_mask", torch.ones(4), r"head_mask= .* is not supported"),
        ("indices", torch.zeros(1, 8, 4, dtype=torch.long), r"selected keys \(indices="),  # DeepSeek V3.2
        ("block_indices", torch.zeros(1, 8, 2, dtype=torch.long), r"key blocks \(block_indices="),  # MiniMax
        ("read_index", [torch.arange(8)], r"\(read_index=\) need the 'paged\|opforge' implementation"),
        ("write_index", [torch.arange(8)], r"\(write_index=\) need the 'paged\|opforge' implementation"),
        ("block_table", torch.zeros(1, 1, dtype=torch.int32), r"\(block_table=\) need the 'paged\|opforge'"),
    ],
)
def test_refused_kwargs(name, value, match):
    """What changes the result and opforge does not do is an error naming the argument, never dropped
    (an all-zero bias or sink included: a sink of 0 still adds exp(0) to every denominator)."""
    q, k, v = qkv()
    module = build("llama", "opforge").model.layers[0].self_attn
    assert otf.opforge_attention(module, q, k, v, None, **{name: None})[0].shape == (1, 8, 4, 16)
    with pytest.raises(NotImplementedError, match=r"^opforge\.integrations\.transformers: .*" + match):
        otf.opforge_attention(module, q, k, v, None, **{name: value})


def test_unknown_kwarg_is_refused_not_ignored():
    """A keyword outside the audit (one a later transformers may add, or a user's own that the model
    hands every layer) is a TypeError naming it; None passes (unset)."""
    q, k, v = qkv()
    module = build("llama", "opforge").model.layers[0].self_attn
    with pytest.raises(TypeError, match=r"transformers: the model passed attention_bias= \(Tensor\), which"):
        otf.opforge_attention(module, q, k, v, None, attention_bias=torch.zeros(1, 4, 8, 8))
    assert otf.opforge_attention(module, q, k, v, None, attention_bias=None)[0].shape == (1, 8, 4, 16)
    model = build("llama", "opforge")
    ids = torch.randint(1, VOCAB, (1, 8))
    with torch.no_grad(), pytest.raises(TypeError, match=r"the model passed my_scores_bias= \(Tensor\)"):
        model(ids, my_scores_bias=torch.zeros(1))


def test_kwargs_without_effect_change_nothing():
    """The keywords that cannot change attention's result (position ids, the cache's, the model's
    outputs, the loss's normaliser, continuous batching's head indices, FlashAttention's maxima) give
    the output of the call without them, bit for bit; in a model too (output_hidden_states,
    num_items_in_batch)."""
    q, k, v = qkv()
    module = build("llama", "opforge").model.layers[0].self_attn
    want = otf.opforge_attention(module, q, k, v, None, scaling=0.3)[0]
    extra = dict(
        position_ids=torch.arange(8)[None],
        position_embeddings=(torch.ones(1, 8, 16), torch.zeros(1, 8, 16)),
        max_length_q=8,
        max_length_k=8,
        use_cache=True,
        cache=object(),
        past_key_values=object(),
        output_hidden_states=True,
        output_router_logits=True,
        num_items_in_batch=torch.tensor(5),
        seq_idx=torch.zeros(1, 8, dtype=torch.int32),
        logits_indices=torch.tensor([7]),
        logits_processor_args=torch.zeros(1, 1),
        output_attentions=False,
    )
    assert set(extra) - {"output_attentions"} == set(otf._NO_EFFECT)
    assert torch.equal(otf.opforge_attention(module, q, k, v, None, scaling=0.3, **extra)[0], want)
    model = build("llama", "opforge")
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        a = model(ids).logits
        b = model(ids, output_hidden_states=True, num_items_in_batch=torch.tensor(24)).logits
    assert torch.equal(a, b)


def test_sliding_window_without_a_mask_both_sides():
    """A call without a mask reads sliding_window as FlashAttention does (keys within w - 1 of the
    query, the later side cut when causal): ModernBERT-style bidirectional local attention too."""
    q, k, v = qkv(2, 20)
    module = torch.nn.Module()
    i = torch.arange(20)
    for causal in (True, False):
        module.is_causal = causal
        got = otf.opforge_attention(module, q, k, v, None, sliding_window=5, scaling=0.25)[0]
        seen = (i[None, :] - i[:, None]).abs() <= 4
        if causal:
            seen &= i[None, :] <= i[:, None]
        kr, vr = (t.repeat_interleave(2, 1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=seen, scale=0.25)
        torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_deterministic_reaches_the_kernels(monkeypatch):
    """ModernBERT passes deterministic= (FlashAttention's backward switch): it reaches opforge.attention
    and opforge.attention_varlen, which mean the same by it."""
    seen = []
    for op in ("attention", "attention_varlen"):
        real = getattr(opforge, op)
        monkeypatch.setattr(
            opforge, op, lambda *a, _real=real, **k: seen.append(k["deterministic"]) or _real(*a, **k)
        )
    q, k, v = qkv()
    module = build("llama", "opforge").model.layers[0].self_attn
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    for flag in (True, False):
        otf.opforge_attention(module, q, k, v, None, deterministic=flag)
        otf.opforge_attention(module, q, k, v, None, deterministic=flag, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert seen == [True, True, False, False]


def test_modernbert_local_and_global_layers_match_eager():
    # Bidirectional sliding-window layers (local_attention 8) and global ones, a padded batch; the model
    # passes sliding_window= and deterministic= besides the mask.
    cfg = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        global_attn_every_n_layers=3,
        local_attention=8,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        max_position_embeddings=128,
    )
    ids = torch.randint(3, VOCAB, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    out = {}
    for impl in ("eager", "opforge"):
        torch.manual_seed(0)
        model = transformers.ModernBertModel(cfg).eval()
        model.set_attn_implementation(impl)
        with torch.no_grad():
            out[impl] = model(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert close(out["opforge"][real], out["eager"][real])


def test_packed_offsets_that_cannot_be_honoured_are_refused():
    """cu_seq_lens_q / cu_seq_lens_k say where packed sequences are; a call that cannot run them on
    opforge.attention_varlen refuses them instead of attending across the sequences."""
    err = r"transformers: cu_seq_lens_q / cu_seq_lens_k \(FlashAttention's packed-sequence offsets\) cannot"
    module = build("llama", "opforge").model.layers[0].self_attn
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    q, k, v = qkv(2)
    with pytest.raises(NotImplementedError, match=err + r".*got a batch of 2"):
        otf.opforge_attention(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=err + r".*each a 1-D tensor, got Tensor and NoneType"):
        otf.opforge_attention(module, q, k, v, None, cu_seq_lens_q=cu)
    with pytest.raises(NotImplementedError, match=err + r".*got Tensor and dict"):
        otf.opforge_attention(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k={"full_attention": cu})
    dense_mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match=err + r".*a block mask"):
        otf.opforge_attention(module, q, k, v, dense_mask, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    # A padding mask with the offsets, in a model: the padded keys are not dropped.
    model = build("llama", "opforge")
    ids = torch.randint(1, VOCAB, (1, 8))
    pad = torch.ones_like(ids)
    pad[0, 5:] = 0
    with torch.no_grad(), pytest.raises(NotImplementedError, match=err + r".*a padding mask"):
        model(ids, attention_mask=pad, cu_seq_lens_q=cu, cu_seq_lens_k=cu, use_cache=False)
    # Offsets over the new tokens of a step with a KV cache: the cached keys are not packed by them.
    k_more, v_more = (torch.cat([t, t], dim=2) for t in (k, v))
    with pytest.raises(NotImplementedError, match=err + r".*attends to 16 keys for 8 queries \(a KV cache"):
        otf.opforge_attention(module, q, k_more, v_more, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with torch.no_grad(), pytest.raises(NotImplementedError, match=err + r".*a KV cache holds keys"):
        cache = transformers.DynamicCache(config=model.config)
        model(ids, past_key_values=cache)
        model(
            ids,
            past_key_values=cache,
            position_ids=torch.arange(8, 16)[None],
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
        )


def test_paged_attention_refuses_what_it_would_drop():
    module = torch.nn.Module()
    module.layer_idx = 0
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    cache = _GatheredCache([torch.randn(0, 2, 16)], [torch.randn(0, 2, 16)])
    cache.new_counts = [3]
    cu = torch.tensor([0, 3], dtype=torch.int32)
    args = dict(cache=cache, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with pytest.raises(ValueError, match=r"'paged\|opforge' takes no attention_mask .*got Tensor"):
        otf.opforge_paged_attention(module, q, k, k, torch.ones(1, 1, 3, 3, dtype=torch.bool), **args)
    with pytest.raises(NotImplementedError, match=r"is_causal=False is not supported"):
        otf.opforge_paged_attention(module, q, k, k, None, is_causal=False, **args)
    with pytest.raises(TypeError, match=r"the model passed attention_bias= \(Tensor\)"):
        otf.opforge_paged_attention(module, q, k, k, None, attention_bias=torch.zeros(1), **args)
    with pytest.raises(NotImplementedError, match=r"\(position_bias=: T5"):
        otf.opforge_paged_attention(module, q, k, k, None, position_bias=torch.zeros(1), **args)
    with pytest.raises(ValueError, match="output_attentions"):
        otf.opforge_paged_attention(module, q, k, k, None, output_attentions=True, **args)
    # what continuous batching passes besides runs (5.17's keywords, none refused)
    out, _ = otf.opforge_paged_attention(
        module,
        q,
        k,
        k,
        None,
        **args,
        max_seqlen_q=3,
        max_seqlen_k=3,
        read_index=[None],
        write_index=[None],
        block_table=None,
        logits_indices=torch.tensor([2]),
        logits_processor_args=torch.zeros(1, 1),
        position_ids=torch.arange(3)[None],
        use_cache=False,
        dropout=0.0,
        sliding_window=None,
        is_causal=True,
    )
    assert out.shape == (1, 3, 4, 16)


# ---- continuous batching on the installed release -------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt-oss"])
def test_generate_batch_on_the_installed_release(kind, monkeypatch):
    """register() returns the name continuous batching takes on the installed transformers (5.24+:
    opforge's FlashAttention API as a local kernel; earlier: 'paged|opforge'); generate_batch on it
    gives each prompt plain greedy generate()'s tokens on eager (Mistral's window with prompts past
    it, Gemma 2's softcap and sliding layers), and its attention ran on opforge."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    import opforge.flash_attn_interface as ofa

    name = otf.register()
    release = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    assert name == ("opforge/flash-attn3" if release >= (5, 24) else "paged|opforge")
    calls = []  # (opforge's entries as the FlashAttention functions call them)
    for fn in ("attention", "attention_varlen"):
        real = getattr(ofa, fn)
        monkeypatch.setattr(ofa, fn, (lambda r: lambda *a, **k: calls.append(r.__name__) or r(*a, **k))(real))
    ref, model = build(kind, "eager"), build(kind, name)
    torch.manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,)).tolist() for n in (5, 23, 9, 31)]
    gen = transformers.GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    cb = ContinuousBatchingConfig(num_blocks=32, max_batch_tokens=64)
    out = model.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb)
    assert len(out) == len(prompts)
    for i, p in enumerate(prompts):
        want = ref.generate(torch.tensor([p]), generation_config=gen)[0, len(p) :].tolist()
        assert out[f"req_{i}"].generated_tokens == want, (i, len(p))
    if release >= (5, 24):
        assert "attention_varlen" in calls
