"""Tuning only: decode_lab_kernel.cuh's variants (K/V stages, keys a tile, the one-chunk direct write,
the merge's programmatic launch) against opforge.attention (main's decode kernel) and SDPA on decode
rows, each timed in the same run by the bench's timer and as a CUDA-graph replay, with the host's
enqueue time; to find what made branch wip/decode-ws's kernel slower than main's (LOG.md "Serving
(issue 32)") and whether more stages or 128-key tiles reach SDPA's bandwidth.

    python benchmarks/tuning/decode_lab.py
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from attention_cases import _graphed as graphed  # (the script's folder is on sys.path)
from attention_cases import _host_us as host_us
from torch.utils.cpp_extension import load

import opforge
from opforge.bench.timing import CudaTimer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (stages, keys a tile, direct write, programmatic merge): A is main's kernel's choices
VARIANTS = {
    "A 2x64": (2, 64, False, False),
    "B 2x64 direct": (2, 64, True, False),
    "C 2x64 pdl": (2, 64, False, True),
    "D 2x64 direct+pdl": (2, 64, True, True),
    "E 3x64 direct+pdl": (3, 64, True, True),
    "F 4x64 direct+pdl": (4, 64, True, True),
    "G 2x128 direct+pdl": (2, 128, True, True),
}
ROWS = [  # (B, H, Hkv, S, ragged)
    (8, 32, 8, 32768, False),
    (1, 32, 8, 1024, False),
    (32, 32, 8, 1024, False),
    (1, 32, 8, 131072, False),
    (8, 32, 8, 32768, True),
]


def main() -> None:
    ext = load(
        name="decode_lab",
        sources=[os.path.join(ROOT, "benchmarks/tuning/decode_lab.cu")],
        extra_include_paths=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "benchmarks/tuning")],
        extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a"],
        verbose=False,
    )
    dev = torch.device("cuda")
    timer = CudaTimer(dev, warmup_ms=10, rep_ms=50)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for row in ROWS:
        run_row(ext, timer, sms, dev, *row)
        torch.cuda.empty_cache()


def run_row(ext, timer, sms: int, dev, B: int, H: int, Hkv: int, S: int, ragged: bool) -> None:
    D = 128
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.linspace(S // 8, S, B, device=dev).long() if ragged else None
    nbytes = 2 * Hkv * D * 2 * (B * S if lens is None else int(lens.sum()))
    want = opforge.attention(q, k, v, causal=True, kv_lens=lens)
    mask = None if lens is None else (torch.arange(S, device=dev)[None, :] < lens[:, None])[:, None, None, :]
    fns = {
        "main": lambda: opforge.attention(q, k, v, causal=True, kv_lens=lens),
        "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
    }
    for name, (stages, tile, direct, pdl) in VARIANTS.items():
        per_sm = ext.blocks_per_sm(stages, tile)
        tiles = (S + tile - 1) // tile
        chunks = max(1, min(sms * max(per_sm, 1) // (B * Hkv), tiles // 2))
        out, _ = ext.run(q, k, v, lens, stages, tile, chunks, direct, pdl)
        err = (out.float() - want.float()).abs().max().item()
        fns[f"{name} ({per_sm}/SM, {chunks} chunks, diff {err:.0e})"] = (
            lambda s=stages, t=tile, c=chunks, d=direct, p=pdl: ext.run(q, k, v, lens, s, t, c, d, p)
        )
    print(f"B{B} H{H}/{Hkv} S{S}{' ragged' if ragged else ''} ({nbytes / 1e6:.0f} MB):", flush=True)
    for name, fn in fns.items():
        t = timer(fn)
        g = timer(graphed(fn))
        print(
            f"  {name:48s} {t * 1e3:8.1f} us ({nbytes / t / 1e9:5.2f} TB/s)  graph {g * 1e3:8.1f} us  "
            f"host {host_us(fn):6.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
