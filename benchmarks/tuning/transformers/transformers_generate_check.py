"""Why generate() tokens differ between implementations: the bench's Mistral-type model (random
weights, bf16) under opforge / sdpa / eager, with a static and a dynamic cache: token agreement
with sdpa, and each step's logits against sdpa's and against eager's (the spread bf16 gives).

    python benchmarks/tuning/transformers/transformers_generate_check.py [prompt] [new]
"""

from __future__ import annotations

import sys

import torch

from opforge.bench.transformers import _models


def main(prompt: int, new: int) -> None:
    device = torch.device("cuda")
    cfg, models = _models(
        device, dict(layers=8, hidden=2048, heads=16, kv_heads=8), ["opforge", "sdpa", "eager"]
    )
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (4, prompt), device=device)
    attn = torch.ones_like(ids)
    for cache in ("static", None):
        gen = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        gen.update(output_logits=True, return_dict_in_generate=True)
        if cache:
            gen["cache_implementation"] = cache
        out = {}
        with torch.no_grad():
            for impl, m in models.items():
                out[impl] = m.generate(ids, attention_mask=attn, **gen)
        ref = out["sdpa"]
        for impl in ("opforge", "eager"):
            same = (out[impl].sequences[:, prompt:] == ref.sequences[:, prompt:]).float().mean().item()
            # logits of the first steps (step 0: the prefill), before any token differs
            diffs = [
                (a.float() - b.float()).abs().max().item()
                for a, b in zip(out[impl].logits[:4], ref.logits[:4], strict=True)
            ]
            print(
                f"cache {cache}: {impl} vs sdpa tokens agree {same:.0%}; first-step logit diffs {[round(d, 3) for d in diffs]}"
            )
        top = torch.stack(ref.logits[:4]).float().topk(2, dim=-1).values
        print(
            f"cache {cache}: sdpa's top-2 logit gaps, first steps: {(top[..., 0] - top[..., 1]).min(-1).values.tolist()}"
        )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*(args + [512, 16][len(args) :]))
