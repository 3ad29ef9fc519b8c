"""Issue 32's and 47's serving row (tuning; transformers' continuous batching, 5.17 and 5.24+): a Llama-type model with
random weights under ``model.generate_batch``, requests with prompts of mixed lengths and a fixed
number of new tokens each, for each attention implementation in turn in one process: wall time, new
tokens/s, time to first token (median / p90 over requests) and how many requests generated the same
tokens as the first implementation (bf16 greedy decoding may part late on near-ties).

    python benchmarks/tuning/serving/serving_row.py                       # the issue's row on CUDA (opforge, sdpa)
    python benchmarks/tuning/serving/serving_row.py --tiny                # a small model on the CPU (a check)
    python benchmarks/tuning/serving/serving_row.py --impls "paged|sdpa,paged|opforge,sdpa" --check
    python benchmarks/tuning/serving/serving_row.py --impls "paged|opforge,paged|opforge+graphs,sdpa"

An implementation name ending in "+graphs" runs with ContinuousBatchingConfig(use_cuda_graph=True)
(transformers 5.17 turns CUDA graphs on by default only for flash names; "paged|opforge" can ask).
--profile DIR: after the timed runs, each implementation again on 16 of the requests (16 new tokens)
under torch.profiler: the top operators by device and by host time, the host-device synchronizations
(cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy / cudaMemcpyAsync calls, the device-to-host
copies that block), and a Chrome trace per implementation in DIR. (generate_batch runs the model in
its own thread: the operator tables hold the calling thread's operators; kernels and CUDA runtime calls
come from CUPTI, which records every thread.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

import opforge.integrations.transformers as otf


def model_of(tiny: bool, device: torch.device, dtype: torch.dtype):
    if tiny:
        cfg = LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        )  # fmt: skip
    else:  # the issue's: 4 layers of hidden 4096, 32 / 8 heads (head dim 128)
        cfg = LlamaConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval(), cfg.vocab_size


def parting_check(model, prompts, ref, got, device) -> str:
    """Where a request's tokens part from the reference implementation's: the float32 model's logit
    gap between the two tokens chosen at that step (given the prompt and the common prefix), next to
    the bf16 model's own error there (bf16 sdpa's logits against float32's, largest over the
    vocabulary). A near-tie parts on rounding (gap within that error); a wrong kernel parts where
    one token clearly wins."""
    import copy

    exact = copy.deepcopy(model).float()
    exact.set_attn_implementation("sdpa")
    model.set_attn_implementation("sdpa")
    rows = []
    with torch.no_grad():
        for prompt, a, b in zip(prompts, ref, got, strict=True):
            i = next((n for n, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            if i is None:
                continue
            ids = torch.tensor([prompt + list(a[:i])], device=device)
            hi = exact(ids).logits[0, -1].float()
            lo = model(ids).logits[0, -1].float()
            top = int(hi.argmax())
            rows.append(
                (
                    (hi[a[i]] - hi[b[i]]).abs().item(),
                    (lo - hi).abs().max().item(),
                    bool(hi[a[i]] > hi[b[i]]),
                    top in (a[i], b[i]),  # (the step is aligned: float32's choice is one of the two)
                    int(lo.argmax()) == a[i],  # (bf16 sdpa from scratch makes the reference's choice)
                )
            )
    del exact
    if not rows:
        return "no request parted"
    gaps, errs = sorted(r[0] for r in rows), sorted(r[1] for r in rows)
    within = sum(r[0] <= 2 * r[1] for r in rows)
    ref_wins, aligned, fresh = (sum(r[n] for r in rows) for n in (2, 3, 4))
    return (
        f"{len(rows)} parting points: float32 logit gap between the two choices median {statistics.median(gaps):.3f}, "
        f"max {gaps[-1]:.3f}; bf16's own logit error there median {statistics.median(errs):.3f}, max "
        f"{errs[-1]:.3f}; gaps within twice that error: {within}/{len(rows)}; float32 prefers the reference's "
        f"token at {ref_wins}/{len(rows)}; float32's top token is one of the two at {aligned}/{len(rows)}; bf16 sdpa "
        f"from scratch chooses the reference's token at {fresh}/{len(rows)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 with --tiny too")
    ap.add_argument(
        "--impls", default=None, help="default: opforge's name on this release (register()), sdpa"
    )
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--new", type=int, default=None)
    ap.add_argument("--check", action="store_true", help="the logit gaps where tokens part (parting_check)")
    ap.add_argument("--profile", default=None, metavar="DIR", help="profile each implementation (see above)")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny and not args.bf16 else torch.bfloat16
    n_req = args.requests or (8 if args.tiny else 64)
    new = args.new or (8 if args.tiny else 128)
    lo, hi = (10, 60) if args.tiny else (100, 4000)
    if device.type == "cpu":  # (the cache sizes itself from free device memory; fix it on the CPU)
        import transformers.generation.continuous_batching.cache as cb_cache

        for obj in vars(cb_cache).values():
            if isinstance(obj, type) and hasattr(obj, "get_available_memory"):
                obj.get_available_memory = lambda self: 1 << 30
    name = otf.register()  # ("opforge/flash-attn3" on transformers 5.24+, "paged|opforge" before)
    impls = args.impls or f"{name},sdpa"
    model, vocab = model_of(args.tiny, device, dtype)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n_req)]
    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}, {device}, {dtype}: "
        f"{n_req} requests, prompts {lo}-{hi} tokens ({sum(map(len, prompts))} in all), {new} new tokens each"
    )
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1)
    first = None
    checks = []
    for impl in impls.split(","):
        try:
            base, graphs = impl.removesuffix("+graphs"), impl.endswith("+graphs")
            cb = {}
            if graphs:
                from transformers.generation.configuration_utils import ContinuousBatchingConfig

                cb = {"continuous_batching_config": ContinuousBatchingConfig(use_cuda_graph=True)}
            model.set_attn_implementation(base)
            model.generate_batch(
                prompts[:2], generation_config=GenerationConfig(max_new_tokens=4, do_sample=False), **cb
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate_batch(prompts, generation_config=gen, record_timestamps=True, **cb)
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        except Exception as e:  # (a peer that cannot run the row: paged|eager's dense mask at 100k keys)
            print(f"  {impl:16s} failed: {type(e).__name__}: {str(e)[:160]}")
            continue
        # (request ids count up across calls: "req_10" sorts before "req_2"; the numbers give the prompts' order)
        results = sorted(out.values(), key=lambda r: int(r.request_id.rsplit("_", 1)[1]))
        assert [r.prompt_ids for r in results] == prompts
        tokens = [r.generated_tokens for r in results]
        if sum(map(len, tokens)) < n_req * new:  # (transformers logs a failed batch and returns what it has)
            print(f"  {impl:16s} failed: {sum(len(t) < new for t in tokens)} of {n_req} requests incomplete")
            continue
        ttft = sorted(r.timestamps[0] - r.created_time for r in results if r.timestamps)
        same = ""
        if first is not None:  # how far each request's tokens match the first implementation's
            prefix = [
                next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
                for a, b in zip(first[1], tokens, strict=True)
            ]
            same = (
                f", vs {first[0]}: {sum(p == new for p in prefix)}/{n_req} requests identical, first token equal "
                f"in {sum(p > 0 for p in prefix)}/{n_req}, common prefix median {statistics.median(prefix):.0f} tokens"
            )
        if first is None:
            first = (impl, tokens)
        elif args.check:
            checks.append((impl, tokens))
        made = sum(map(len, tokens))
        p90 = ttft[int(0.9 * (len(ttft) - 1))] if ttft else float("nan")
        print(
            f"  {impl:16s} {wall:8.2f} s  {made / wall:8.1f} new tokens/s  TTFT median "
            f"{statistics.median(ttft) if ttft else float('nan'):.2f} s, p90 {p90:.2f} s{same}"
        )

    for impl, tokens in checks:
        print(f"  {impl} vs {first[0]}: {parting_check(model, prompts, first[1], tokens, device)}")
    if args.profile:
        for impl in impls.split(","):
            profile(model, impl, prompts[:16], args.profile)


def profile(model, impl: str, prompts, out_dir: str) -> None:
    """impl on prompts (16 new tokens each) under torch.profiler: where the device and the host spend
    their time, and how often the host waits for the device (the suspects of 5.17's row: a host read
    of the offsets in every layer, the paged cache's gather)."""
    import os

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    base, graphs = impl.removesuffix("+graphs"), impl.endswith("+graphs")
    cb = {}
    if graphs:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        cb = {"continuous_batching_config": ContinuousBatchingConfig(use_cuda_graph=True)}
    model.set_attn_implementation(base)
    gen = GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=-1)
    model.generate_batch(prompts[:2], generation_config=gen, **cb)  # (warm)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        model.generate_batch(prompts, generation_config=gen, **cb)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    os.makedirs(out_dir, exist_ok=True)
    safe = impl.replace("|", "_").replace("/", "_").replace("+", "_")
    prof.export_chrome_trace(os.path.join(out_dir, f"trace_{safe}.json"))
    ev = prof.key_averages()
    syncs = {e.key: e.count for e in ev if "Synchronize" in e.key or e.key.startswith("cudaMemcpy")}
    device_us = sum(e.self_device_time_total for e in ev) if torch.cuda.is_available() else 0.0
    print(
        f"\n== profile {impl}: {len(prompts)} requests x 16 new tokens, {wall:.2f} s wall under the profiler, "
        f"device busy {device_us / 1e6:.2f} s (sum of kernel times)"
    )
    print(f"   host waits / copies: {syncs}")
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(ev.table(sort_by=sort, row_limit=20, max_name_column_width=60))
    print(ev.table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
