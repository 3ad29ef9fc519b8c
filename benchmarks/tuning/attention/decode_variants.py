"""Tuning only: the tensor-core decode kernel (one m tile, D128) at other traits than the shipped ones
(2 stages at 3 blocks an SM, the shipped contiguous and paged kernel; 3 stages, the paged kernel
before edd7f5d) and other splits
(uniform: chunk counts around the shipped choice; tokens present: blocks for 1, 2, 4 or 8 waves of
resident blocks), on rows where the split matters (B8 x 32k, B64 x 2k, each with and without kv_lens;
a ragged B16 x U(100, 16k)), against SDPA in the same run; and on paged caches (B32 x U(4k, 8k), pages
of 16 and 64, the serving bench's row) against opforge on the pages and on the same keys contiguous.
Each variant's output is checked against opforge.attention's.

    python benchmarks/tuning/attention/decode_variants.py [--only contiguous|paged] [--variants 0,3]
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

import opforge
from opforge.bench.timing import CudaTimer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["contiguous", "paged"], default=None)
    ap.add_argument("--variants", default=None, help="comma-separated variant numbers (default: all)")
    args = ap.parse_args()
    ext = load(
        name="decode_variants",
        sources=[os.path.join(ROOT, "benchmarks/tuning/attention/decode_variants.cu")],
        extra_include_paths=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "benchmarks/tuning/attention")],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++20",
            "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a",
        ],
        verbose=False,
    )
    dev = torch.device("cuda")
    timer = CudaTimer(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    names = [
        "2 stages 3 blocks",
        "3 stages",
    ]
    per_sm = [ext.blocks_per_sm(i) for i in range(len(names))]
    print("blocks an SM:", dict(zip(names, per_sm, strict=True)))
    chosen = [int(x) for x in args.variants.split(",")] if args.variants else list(range(len(names)))
    names = [n if i in chosen else None for i, n in enumerate(names)]
    slots_of = [sms * n for n in per_sm]
    if args.only != "contiguous":
        for page_size in (16, 64):
            run_paged_row(ext, timer, names, slots_of, page_size)
            torch.cuda.empty_cache()
    if args.only == "paged":
        return
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = [
        ("B8 32k", 8, 32768, None),
        ("B8 32k kv_lens", 8, 32768, torch.full((8,), 32768)),
        ("B64 2k", 64, 2048, None),
        ("B64 2k kv_lens", 64, 2048, torch.full((64,), 2048)),
        ("ragged B16 U(100,16k)", 16, 16384, torch.randint(100, 16385, (16,), generator=g)),
    ]
    for label, B, S, lens in rows:
        run_row(ext, timer, names, slots_of, label, B, S, lens)
        torch.cuda.empty_cache()


def run_paged_row(ext, timer, names, slots_of, page_size: int) -> None:
    """The serving bench's paged row: B32, 32 / 8 heads, D128, lengths U(4k, 8k), pages of page_size in
    random order; opforge on the pages and on the same keys contiguous, then every variant on the pages
    at the shipped split and at 1, 2, 4 waves."""
    B, H, Hkv, D, S = 32, 32, 8, 128, 8192
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(page_size)
    lens = torch.randint(4096, S + 1, (B,), generator=g).to(dev)
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    per = S // page_size
    perm = torch.randperm(B * per, device=dev)
    table = perm.view(B, per).to(torch.int32).contiguous()
    kc, vc = (torch.empty(B * per, page_size, Hkv, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kc[perm] = k.transpose(1, 2).reshape(B * per, page_size, Hkv, D)
    vc[perm] = v.transpose(1, 2).reshape(B * per, page_size, Hkv, D)
    nbytes = 2 * Hkv * D * 2 * int(lens.sum())
    want = opforge.attention(q, k, v, causal=True, kv_lens=lens)
    paged = timer(lambda: opforge.attention(q, kc, vc, causal=True, kv_lens=lens, block_table=table))
    contiguous = timer(lambda: opforge.attention(q, k, v, causal=True, kv_lens=lens))
    print(
        f"paged B32 U(4k,8k) pages {page_size}: opforge paged {paged * 1e3:.1f} us ({nbytes / paged / 1e9:.2f} TB/s), "
        f"contiguous {contiguous * 1e3:.1f} us ({contiguous / paged:.2f}x paged/contiguous speed)"
    )
    for variant, name in enumerate(names):
        if name is None:
            continue
        for waves in (0, 1, 2, 4):
            got = time_variant(
                ext, timer, want, name, (q, kc, vc, lens, variant, 0, waves, slots_of[variant], table)
            )
            if got is not None:
                t, err, split = got
                print(
                    f"  {name:22s} {split:14s}: {t * 1e3:6.1f} us ({nbytes / t / 1e9:.2f} TB/s, "
                    f"{paged / t:.2f}x opforge paged, {contiguous / t:.2f}x contiguous), max diff {err:.1e}"
                )


def time_variant(ext, timer, want, name, args):
    """ext.run(*args) (args: q, k, v, lens, variant, chunks, waves, slots, table) timed, with its
    largest difference from `want` and the split's label; None (said) when the variant cannot run."""
    chunks, waves = args[5], args[6]
    try:
        out, _ = ext.run(*args)
    except RuntimeError as e:
        print(f"  {name} chunks {chunks} waves {waves}: {str(e).splitlines()[0]}")
        return None
    err = (out.float() - want.float()).abs().max().item()
    split = (
        "shipped split" if (chunks, waves) == (0, 0) else f"chunks {chunks}" if chunks else f"waves {waves}"
    )
    return timer(lambda: ext.run(*args)), err, split


def run_row(ext, timer, names, slots_of, label, B, S, lens) -> None:
    """One row: SDPA, opforge.attention, then every traits variant at each split."""
    H, Hkv, D = 32, 8, 128
    dev = torch.device("cuda")
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    lens = None if lens is None else lens.to(dev)
    nbytes = 2 * Hkv * D * 2 * (B * S if lens is None else int(lens.sum()))
    want = opforge.attention(q, k, v, causal=True, kv_lens=lens)
    mask = None if lens is None else (torch.arange(S, device=dev)[None, :] < lens[:, None])[:, None, None, :]
    sdpa = timer(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    shipped = timer(lambda: opforge.attention(q, k, v, causal=True, kv_lens=lens))
    print(
        f"{label}: SDPA {sdpa * 1e3:.1f} us ({nbytes / sdpa / 1e9:.2f} TB/s); opforge.attention "
        f"{shipped * 1e3:.1f} us ({sdpa / shipped:.2f}x SDPA)"
    )
    for variant, name in enumerate(names):
        if name is None:
            continue
        slots = slots_of[variant]
        splits = [(0, 0)]  # (chunks, waves); (0, 0): the shipped split
        splits += [(0, w) for w in (1, 2, 4, 8)] if lens is not None else []
        if lens is None:
            one_wave = max(1, slots // (B * Hkv))
            splits += [(c, 0) for c in sorted({one_wave, 2 * one_wave, 3 * one_wave, 4 * one_wave})]
        for chunks, waves in splits:
            got = time_variant(ext, timer, want, name, (q, k, v, lens, variant, chunks, waves, slots, None))
            if got is not None:
                t, err, split = got
                print(
                    f"  {name:22s} {split:14s}: {t * 1e3:6.1f} us ({nbytes / t / 1e9:.2f} TB/s, "
                    f"{sdpa / t:.2f}x SDPA), max diff {err:.1e}"
                )


if __name__ == "__main__":
    main()
