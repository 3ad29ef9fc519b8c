"""Issue 32 (tuning): is continuous batching itself (transformers' generate_batch) the plain greedy
``generate`` of each request? The issue's model (random weights, bf16), a few requests: each
implementation's generate_batch tokens against ``generate`` with sdpa, request by request (common
prefix lengths), and at the first step where paged|sdpa and generate part, the fresh forward's top
two tokens and their gap.

    python benchmarks/tuning/serving/cb_vs_generate.py [--requests 6] [--new 32]
"""

from __future__ import annotations

import argparse
import random

import torch
from serving_row import model_of
from transformers import GenerationConfig

import opforge.integrations.transformers as otf


def prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    dev = torch.device("cuda")
    otf.register()
    model, vocab = model_of(False, dev, torch.bfloat16)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(100, 4000))] for _ in range(args.requests)]
    model.set_attn_implementation("sdpa")
    plain = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=dev)
            out = model.generate(
                ids, max_new_tokens=args.new, do_sample=False, eos_token_id=-1, pad_token_id=0
            )
            plain.append(out[0, len(p) :].tolist())
    gen = GenerationConfig(max_new_tokens=args.new, do_sample=False, eos_token_id=-1)
    for impl in ("paged|sdpa", "paged|opforge"):
        model.set_attn_implementation(impl)
        out = model.generate_batch(prompts, generation_config=gen)
        toks = [
            r.generated_tokens
            for r in sorted(out.values(), key=lambda r: int(r.request_id.rsplit("_", 1)[1]))
        ]
        print(
            f"{impl:14s} vs generate (sdpa): common prefix per request {[prefix(a, b) for a, b in zip(plain, toks, strict=True)]}"
        )
        if impl == "paged|sdpa":
            model.set_attn_implementation("sdpa")
            with torch.no_grad():
                for p, a, b in zip(prompts, plain, toks, strict=True):
                    i = prefix(a, b)
                    if i < len(a):
                        lo = model(torch.tensor([p + a[:i]], device=dev)).logits[0, -1].float()
                        top = lo.topk(2)
                        print(
                            f"  parts at {i}: generate {a[i]} cb {b[i]}; fresh forward top {top.indices.tolist()} "
                            f"gap {(top.values[0] - top.values[1]).item():.3f}, logit(cb) - logit(generate) "
                            f"{(lo[b[i]] - lo[a[i]]).item():.3f}"
                        )


if __name__ == "__main__":
    main()
