"""Tuning only (issue 47, session 2): CPU decode on paged caches against the contiguous caches, in
one process (run it with PYTHONPATH set to each of two builds in turn, alternating, for a
before/after): float32 and bfloat16, pages of 16 and 256 in random order, every sequence full.

    PYTHONPATH=/path/to/build python benchmarks/tuning/serving/paged_cpu_inplace.py
"""

from __future__ import annotations

import time

import torch

import opforge


def bench(fn, reps: int = 30) -> float:
    """Median milliseconds over reps calls after 3 warm-ups."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    for B, H, Hkv, D, S, dt in [
        (4, 8, 2, 64, 8192, torch.float32),
        (4, 8, 2, 64, 32768, torch.float32),
        (2, 32, 8, 128, 8192, torch.float32),
        (4, 8, 2, 64, 8192, torch.bfloat16),
    ]:
        q = torch.randn(B, H, 1, D, dtype=dt)
        k, v = torch.randn(B, Hkv, S, D, dtype=dt), torch.randn(B, Hkv, S, D, dtype=dt)
        lens = torch.full((B,), S)
        res = []
        for ps in (16, 256):
            P = S // ps
            perm = torch.randperm(B * P)
            table = perm.view(B, P).int()
            kc, vc = torch.empty(B * P, ps, Hkv, D, dtype=dt), torch.empty(B * P, ps, Hkv, D, dtype=dt)
            kc[perm] = k.transpose(1, 2).reshape(B * P, ps, Hkv, D)
            vc[perm] = v.transpose(1, 2).reshape(B * P, ps, Hkv, D)
            res.append(
                (
                    ps,
                    bench(lambda: opforge.attention(q, kc, vc, causal=True, kv_lens=lens, block_table=table)),
                )
            )
        # (the contiguous caches: (B, Hkv, S, D), and (B, S, Hkv, D) where a row holds every kv head, as a page does)
        kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        tc = bench(lambda: opforge.attention(q, k, v, causal=True, kv_lens=lens))
        tr = bench(lambda: opforge.attention(q, kt, vt, causal=True, kv_lens=lens))
        pages = ", ".join(f"pages {ps} {t:.2f} ms ({tc / t:.2f}x)" for ps, t in res)
        print(
            f"B{B} {H}/{Hkv} D{D} S{S} {dt}: contiguous {tc:.2f} ms, (B,S,Hkv,D) {tr:.2f} ms, {pages}",
            flush=True,
        )


if __name__ == "__main__":
    main()
