"""Tuning: paged decode on the CPU, the decode kernel reading the pages in place against the same
kernel on the contiguous cache and on a gathered copy of the pages (the path CUDA calls take for
now), each timed in the same run (torch.utils.benchmark, all threads).

    python benchmarks/tuning/attention/paged_cpu.py
"""

from __future__ import annotations

import torch

import opforge
from opforge.bench.timing import CpuTimer
from opforge.ops.attention.kv_cache import gather_pages


def row(timer, B, H, Hkv, S, D, dtype) -> None:
    q = torch.randn(B, H, 1, D, dtype=dtype)
    k, v = (torch.randn(B, Hkv, S, D, dtype=dtype) for _ in range(2))
    lens = torch.full((B,), S)
    base = timer(lambda: opforge.attention(q, k, v, kv_lens=lens, causal=True))
    # the same cache laid out (B, S, Hkv, D) (transformers' and the pages' row stride: Hkv x D)
    ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    bshd = timer(lambda: opforge.attention(q, ks, vs, kv_lens=lens, causal=True))
    print(
        f"B{B} H{H}/{Hkv} S{S} D{D} {str(dtype)[6:]}: contiguous (B, Hkv, S, D) {base:.2f} ms, (B, S, Hkv, D) {bshd:.2f} ms"
    )
    for ps in (16, 256):
        per = S // ps
        perm = torch.randperm(B * per)
        table = perm.view(B, per).int()
        kc, vc = torch.empty(B * per, ps, Hkv, D, dtype=dtype), torch.empty(B * per, ps, Hkv, D, dtype=dtype)
        kc[perm] = k.transpose(1, 2).reshape(B * per, ps, Hkv, D)
        vc[perm] = v.transpose(1, 2).reshape(B * per, ps, Hkv, D)
        paged = timer(lambda: opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True))  # noqa: B023
        gather = lambda kc=kc, vc=vc, table=table: gather_pages(kc, vc, table, lens)  # noqa: E731
        gathered = timer(lambda: opforge.attention(q, *gather(), kv_lens=lens, causal=True))  # noqa: B023
        print(
            f"B{B} H{H}/{Hkv} S{S} D{D} {str(dtype)[6:]} page {ps}: contiguous {base:.2f} ms, paged in place "
            f"{paged:.2f} ms ({base / paged:.2f}x contiguous), gathered {gathered:.2f} ms ({base / gathered:.2f}x)",
            flush=True,
        )


def main() -> None:
    timer = CpuTimer(min_run_time=0.5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    row(timer, 4, 8, 2, 32768, 64, torch.float32)
    row(timer, 2, 32, 8, 8192, 128, torch.bfloat16)


if __name__ == "__main__":
    main()
