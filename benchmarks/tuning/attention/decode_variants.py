"""Tuning only: the tensor-core decode kernel at staging depths 2-4 and chunk counts from half to
four times the shipped choice (one wave of resident blocks), on the bench's decode rows (B8 32/8
heads D128 32k causal; the same with ragged kv_lens), against SDPA in the same run. Each variant's
output is checked against opforge.attention's first.

    python benchmarks/tuning/attention/decode_variants.py
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
    ext = load(
        name="decode_variants",
        sources=[os.path.join(ROOT, "benchmarks/tuning/attention/decode_variants.cu")],
        extra_include_paths=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "benchmarks/tuning/attention")],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a",
        ],
        verbose=False,
    )
    dev = torch.device("cuda")
    timer = CudaTimer(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    B, H, Hkv, S, D = 8, 32, 8, 32768, 128
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    ragged = torch.linspace(S // 8, S, B, device=dev).long()
    for lens in (None, ragged):
        nbytes = 2 * Hkv * D * 2 * (B * S if lens is None else int(lens.sum()))
        want = opforge.attention(q, k, v, causal=True, kv_lens=lens)
        sdpa_mask = (
            None if lens is None else (torch.arange(S, device=dev)[None, :] < lens[:, None])[:, None, None, :]
        )
        sdpa = timer(
            lambda m=sdpa_mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        )
        print(
            f"{'ragged' if lens is not None else 'causal'}: SDPA {sdpa * 1e3:.1f} us ({nbytes / sdpa / 1e9:.2f} TB/s)"
        )
        for stages in (2, 3, 4):
            per_sm = ext.blocks_per_sm(stages, H // Hkv)
            one_wave = max(1, sms * per_sm // (B * Hkv))
            for factor in (0.5, 1, 2, 4):
                chunks = max(1, int(one_wave * factor))
                try:
                    out, _ = ext.run(q, k, v, lens, stages, chunks)
                except RuntimeError as e:
                    print(f"  stages {stages} chunks {chunks}: {str(e).splitlines()[0]}")
                    continue
                err = (out.float() - want.float()).abs().max().item()
                t = timer(lambda s=stages, c=chunks, n=lens: ext.run(q, k, v, n, s, c))
                print(
                    f"  stages {stages} ({per_sm} blocks/SM) chunks {chunks:3d}: {t * 1e3:6.1f} us "
                    f"({nbytes / t / 1e9:.2f} TB/s, {sdpa / t:.2f}x SDPA), max diff {err:.1e}"
                )


if __name__ == "__main__":
    main()
