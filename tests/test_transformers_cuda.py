"""opforge attention in Hugging Face models on CUDA (bfloat16): prefill logits as close to a float32
reference as sdpa's / eager's bf16 logits are, the same greedy tokens in generate() (a token may
differ only where the reference itself has a near-tie, after which the sequences part), left-padded
batches and packed sequences."""

from __future__ import annotations

import pytest
import torch
from test_transformers import VOCAB, small

import opforge.integrations.transformers as otf

pytestmark = pytest.mark.cuda
DEV = "cuda"
otf.register()


def build(kind: str, impl: str, dtype=torch.bfloat16, **over):
    cls, cfg = small(kind)
    # head dim 64 (the kernels' own size) and a window that several 128-key tiles cross
    cfg.hidden_size, cfg.intermediate_size, cfg.head_dim = 256, 384, 64
    for key, value in over.items():
        setattr(cfg, key, value)
    if getattr(cfg, "sliding_window", None):
        cfg.sliding_window = 150
    if kind == "gemma2":
        cfg.query_pre_attn_scalar = 64
    torch.manual_seed(0)
    model = cls(cfg).to(device=DEV, dtype=dtype).eval()
    model.set_attn_implementation(impl)
    return model


def peer(kind: str) -> str:
    return "eager" if kind == "gemma2" else "sdpa"


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3", "gemma2"])
def test_prefill_logits_bf16(kind):
    ids = torch.randint(1, VOCAB, (2, 400), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding in one row
    with torch.no_grad():
        ref = build(kind, "eager", torch.float32)(ids, attention_mask=mask).logits
        got = build(kind, "opforge")(ids, attention_mask=mask).logits
        low = build(kind, peer(kind))(ids, attention_mask=mask).logits
    real = mask.bool()
    assert err(got[real], ref[real]) <= 2 * err(low[real], ref[real]) + 1e-2


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_generate_greedy_bf16(kind):
    ids = torch.randint(1, VOCAB, (2, 40), device=DEV)
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    gen = dict(max_new_tokens=32, do_sample=False, pad_token_id=0)
    got = build(kind, "opforge").generate(ids, attention_mask=mask, **gen)
    ref_model = build(kind, peer(kind))
    want = ref_model.generate(ids, attention_mask=mask, **gen)
    for row in range(ids.shape[0]):
        diff = (got[row] != want[row]).nonzero()
        if diff.numel() == 0:
            continue
        t = diff[0].item()  # the first differing step: the reference must be near a tie there
        prefix = got[row : row + 1, :t]
        with torch.no_grad():
            logits = (
                ref_model(
                    prefix,
                    attention_mask=torch.cat([mask[row : row + 1], torch.ones_like(prefix[:, 40:])], 1),
                )
                .logits[0, -1]
                .float()
            )
        top = logits.max().item()
        assert top - logits[got[row, t]].item() <= 0.05 * max(1.0, abs(top)), (kind, row, t)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_packed_sequences_bf16(kind):
    lengths = [130, 300, 77]
    seqs = [torch.randint(1, VOCAB, (1, n), device=DEV) for n in lengths]
    ids = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n, device=DEV) for n in lengths])[None]
    model = build(kind, "opforge")
    ref = build(kind, "eager", torch.float32)
    with torch.no_grad():
        packed = model(ids, position_ids=position_ids, use_cache=False).logits
        alone = torch.cat([ref(s).logits for s in seqs], dim=1)
        low = torch.cat([build(kind, "sdpa")(s).logits for s in seqs], dim=1)
    assert err(packed, alone) <= 2 * err(low, alone) + 1e-2


def test_training_step_bf16_gradients():
    ids = torch.randint(1, VOCAB, (2, 300), device=DEV)
    out = {}
    for impl, dtype in (("opforge", torch.bfloat16), ("sdpa", torch.bfloat16), ("eager", torch.float32)):
        model = build("mistral", impl, dtype).train()
        model(ids, labels=ids).loss.backward()
        out[impl] = {n: p.grad.float() for n, p in model.named_parameters()}
    for name, ref in out["eager"].items():
        assert err(out["opforge"][name], ref) <= 2 * err(out["sdpa"][name], ref) + 1e-3, name
