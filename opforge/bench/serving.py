"""Benchmark spec for serving: decode steps (one query token a sequence) and chunked prefill against
KV caches, contiguous and paged, as an inference server calls attention. Timed in the same run
against SDPA (cuDNN's decode on CUDA; a length mask for ragged batches), opforge on the same keys
contiguous (for the paged rows: what the pages cost) and FlashInfer (the kernels of vLLM and SGLang)
where it is installed (a peer only, never a dependency: ../shared/tools/flashinfer_peer.sh).
GB/s count the K/V bytes of the keys present (each kv head once), the copy ceiling's unit.

CUDA (bfloat16, 32 query / 8 kv heads, head dim 128): decode B8 x 32k and B64 x 2k keys, a ragged
batch (B16, 100-16k keys), paged decode (B32, 4k-8k keys, pages of 16 and 64) and chunked prefill on
pages (B4, 512 new queries on 8k keys); full mode adds the decode grid (batch 1-128 x caches 1k-128k,
GQA groups 1, 8, 16, head dims 64 and 256, ragged batches, pages of 8 and 256, equal lengths on pages,
a 2048-query chunk on 32k keys) and serving_grid.png (each row's share of the copy ceiling, and the
peers' time over opforge's). CPU (float32, 8 / 2 heads, head dim 64): decode and paged decode at B4 x
8k."""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F

import opforge
from opforge import reference
from opforge.bench.harness import Case, CaseBuilder, Spec

_FLASHINFER: object | None = None
_WORKSPACE: dict[torch.device, torch.Tensor] = {}


def _flashinfer():
    """The flashinfer module where it is installed, else None (asked once)."""
    global _FLASHINFER
    if _FLASHINFER is None:
        try:
            import flashinfer

            _FLASHINFER = flashinfer
        except Exception:  # (not installed, or built for another torch: no peer)
            _FLASHINFER = False
    return _FLASHINFER or None


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACE:
        _WORKSPACE[device] = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    return _WORKSPACE[device]


def _pages(k: torch.Tensor, v: torch.Tensor, page_size: int) -> tuple[torch.Tensor, ...]:
    """k, v (B, Hkv, S, D) as paged caches (num_pages, page_size, Hkv, D) with the pages in random
    order, and the (B, S / page_size) int32 table."""
    B, Hkv, S, D = k.shape
    per = -(-S // page_size)
    perm = torch.randperm(B * per, device=k.device)
    table = perm.view(B, per).to(torch.int32)
    caches = []
    for t in (k, v):
        padded = F.pad(t, (0, 0, 0, per * page_size - S))
        cache = torch.empty(B * per, page_size, Hkv, D, device=k.device, dtype=k.dtype)
        cache[perm] = padded.transpose(1, 2).reshape(B * per, page_size, Hkv, D)
        caches.append(cache)
    return caches[0], caches[1], table


def _flashinfer_pages(table: torch.Tensor, lens: torch.Tensor, page_size: int):
    """FlashInfer's page description of the same caches: indptr, indices, last_page_len (int32)."""
    n = (lens + page_size - 1) // page_size
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = n.cumsum(0)
    keep = torch.arange(table.shape[1], device=lens.device)[None, :] < n[:, None]
    indices = table[keep].contiguous()
    last = (lens - (n - 1) * page_size).to(torch.int32)
    return indptr, indices, last


def _lengths(B: int, lo: int, hi: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(lo, hi + 1, (B,), generator=g).to(device)


def _decode_case(
    device: torch.device,
    B: int,
    H: int,
    Hkv: int,
    D: int,
    cache: int,
    lens: tuple[int, int] | None = None,
    page_size: int = 0,
    chunk: int = 1,
) -> Case:
    """`chunk` new queries a sequence (1: a decode step; more: chunked prefill, causal) against a cache
    of `cache` positions, every sequence full (lens None) or holding U(lens) keys (kv_lens); paged
    (page_size > 0: opforge on the pages, opforge on the same keys contiguous, FlashInfer's paged
    wrapper) or contiguous (opforge, SDPA, FlashInfer on pages of 16 of the same keys)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(B, H, chunk, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hkv, cache, D, device=device, dtype=dtype) for _ in range(2))
    klen = (
        _lengths(B, lens[0], lens[1], B * cache + page_size, device)
        if lens
        else torch.full((B,), cache, device=device, dtype=torch.long)
    )
    kw: dict = {"causal": True}
    if lens or page_size:
        kw["kv_lens"] = klen
    gqa = H != Hkv
    impls: dict = {}
    fi_pages = page_size or 16
    kc, vc, table = _pages(k, v, fi_pages)
    if page_size:
        impls["opforge paged"] = lambda: opforge.attention(q, kc, vc, block_table=table, **kw)
        impls["opforge contiguous"] = lambda: opforge.attention(q, k, v, **kw)
    else:
        impls["opforge"] = lambda: opforge.attention(q, k, v, **kw)
        if chunk == 1 and lens:
            keep = (torch.arange(cache, device=device)[None, :] < klen[:, None])[:, None, None, :]
            impls["SDPA (length mask)"] = lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, enable_gqa=gqa
            )
        elif chunk == 1:
            impls["SDPA"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    fi = _flashinfer() if device.type == "cuda" else None
    peer = None
    if fi is not None:
        indptr, indices, last = _flashinfer_pages(table, klen.to(torch.int32), fi_pages)
        if chunk == 1:
            # (tensor cores for GQA groups of 4 and more, as FlashInfer advises)
            w = fi.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(device), "NHD", use_tensor_cores=H // Hkv >= 4
            )
            w.plan(indptr, indices, last, H, Hkv, D, fi_pages, q_data_type=dtype, kv_data_type=dtype)
            q3 = q[:, :, 0].contiguous()
            impls["FlashInfer"] = peer = lambda: w.run(q3, (kc, vc))
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), "NHD")
            qo = torch.arange(B + 1, device=device, dtype=torch.int32) * chunk
            w.plan(
                qo,
                indptr,
                indices,
                last,
                H,
                Hkv,
                D,
                fi_pages,
                causal=True,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
            qp = q.transpose(1, 2).reshape(B * chunk, H, D).contiguous()
            impls["FlashInfer"] = peer = lambda: w.run(qp, (kc, vc))

    def check() -> str | None:
        with torch.no_grad():
            first = next(iter(impls.values()))()
            rows = [0, B - 1] if B > 1 else [0]
            part = {key: (val[rows] if key == "kv_lens" else val) for key, val in kw.items()}
            want = reference.attention(q[rows].double(), k[rows].double(), v[rows].double(), **part)
            err = (first[rows].double() - want).abs().max().item()
            if err > 2e-2:
                return f"max error {err:.2e} against the float64 reference"
            if peer is not None:  # (the peer computes the same attention: its call is set up right)
                got = peer().view(B, chunk, H, D).transpose(1, 2) if chunk > 1 else peer()[:, :, None]
                diff = (got.float() - first.float()).abs().max().item()
                if diff > 2e-2:
                    return f"FlashInfer's output differs from opforge's by {diff:.2e}"
        return None

    visible = int(klen.sum()) if (lens or page_size) else B * cache
    kind = "chunked prefill" if chunk > 1 else "decode"
    shape = f"{kind} B{B} H{H}/{Hkv} D{D} " + (f"kv {lens[0]}-{lens[1]}" if lens else f"kv {cache}")
    if chunk > 1:
        shape += f" chunk {chunk}"
    if page_size:
        shape += f" pages {page_size}"
    return Case(
        op="serving",
        name=shape + (" bf16" if dtype == torch.bfloat16 else " fp32"),
        impls=impls,
        check=check,
        bytes=visible * Hkv * 2 * D * k.element_size(),
        params={
            "pattern": kind + (" paged" if page_size else ""),
            "B": B,
            "H": H,
            "Hkv": Hkv,
            "D": D,
            "cache": cache,
            "lens": list(lens) if lens else None,
            "page_size": page_size,
            "chunk": chunk,
        },
    )


def _full_grid(device: torch.device) -> list[CaseBuilder]:
    """The decode grid beyond the quick rows (issue 47): batch x cache at D128 GQA 32/8 (caches whose
    K/V fit in 24 GB), GQA groups 1, 8 and 16, head dims 64 and 256, ragged batches, page sizes 8-256
    and equal-length pages, a second chunked prefill."""
    rows = []
    for B in (1, 8, 32, 128):
        for cache in (1024, 8192, 32768, 131072):
            if (B, cache) not in ((8, 32768), (64, 2048)) and 2 * B * 8 * cache * 128 * 2 <= 24 << 30:
                rows.append(partial(_decode_case, device, B, 32, 8, 128, cache))
    for H, Hkv in ((32, 32), (32, 4), (64, 4)):
        rows.append(partial(_decode_case, device, 8, H, Hkv, 128, 32768))
    for D in (64, 256):
        rows.append(partial(_decode_case, device, 8, 32, 8, D, 32768))
    rows += [
        partial(_decode_case, device, 8, 32, 8, 128, 32768, (4096, 32768)),
        partial(_decode_case, device, 32, 32, 8, 128, 8192, (1024, 8192)),
        partial(_decode_case, device, 32, 32, 8, 128, 8192, (4096, 8192), 8),
        partial(_decode_case, device, 32, 32, 8, 128, 8192, (4096, 8192), 256),
        partial(_decode_case, device, 8, 32, 8, 128, 32768, None, 16),
        partial(_decode_case, device, 1, 32, 8, 128, 32768, None, 64, 2048),
    ]
    return rows


def cases(device: torch.device, full: bool) -> list[CaseBuilder]:
    if device.type != "cuda":
        return [
            partial(_decode_case, device, 4, 8, 2, 64, 8192),
            partial(_decode_case, device, 4, 8, 2, 64, 8192, (1024, 8192), 16),
        ]
    rows = [
        partial(_decode_case, device, 8, 32, 8, 128, 32768),
        partial(_decode_case, device, 64, 32, 8, 128, 2048),
        partial(_decode_case, device, 16, 32, 8, 128, 16384, (100, 16384)),
        partial(_decode_case, device, 32, 32, 8, 128, 8192, (4096, 8192), 16),
        partial(_decode_case, device, 32, 32, 8, 128, 8192, (4096, 8192), 64),
        partial(_decode_case, device, 4, 32, 8, 128, 8192, None, 16, 512),
    ]
    return rows + (_full_grid(device) if full else [])


def write_grid(result: dict, out_dir: str) -> list[str]:
    """serving_grid.png: each serving row's share of the copy ceiling per implementation (the K/V
    bytes present over the time, against the copy measured in the same run), and each peer's time
    over opforge's (above 1: opforge faster). Nothing without matplotlib or serving rows."""
    rows = [r for r in result["rows"] if r["op"] == "serving" and not r["error"] and r["impls"]]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    if not rows:
        return []
    meta = result["meta"]
    # (each row's first implementation is opforge's: on paged rows, opforge on the pages)
    series = ["opforge", *dict.fromkeys(name for r in rows for name in list(r["impls"])[1:])]

    def entry(r, name):
        names = list(r["impls"])
        return r["impls"][names[0]] if name == "opforge" else r["impls"].get(name)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 8.5), sharex=True)
    xs = list(range(len(rows)))
    for k, name in enumerate(series):
        got = [(x, entry(r, name)) for x, r in zip(xs, rows, strict=True) if entry(r, name)]
        top.plot([x for x, _ in got], [e["gbps"] / meta["copy_gbps"] for _, e in got], "o" if k == 0 else "s",
                 color=f"C{k}", label=name, ms=6 if k == 0 else 4)  # fmt: skip
        if k:
            bottom.plot([x for x, _ in got], [e["speedup_of_opforge"] for _, e in got], "s", color=f"C{k}",
                        label=name, ms=4)  # fmt: skip
    top.axhline(1.0, color="gray", ls=":", lw=1)
    top.set_ylabel("share of the copy ceiling")
    top.set_title(
        f"serving rows: the K/V bytes present over the time, against the copy measured in the same run "
        f"({meta['copy_gbps']:.0f} GB/s); higher is better\n{meta['device']}, torch {meta['torch']}, {meta['date']}",
        fontsize=9,
    )
    bottom.axhline(1.0, color="gray", ls=":", lw=1)
    bottom.set_ylabel("peer time / opforge time")
    bottom.set_title("each peer's time over opforge's: above 1 opforge is faster", fontsize=9)
    bottom.set_xticks(xs)
    bottom.set_xticklabels([r["case"] for r in rows], rotation=60, ha="right", fontsize=7)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = os.path.join(out_dir, "serving_grid.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


SPEC = Spec(
    op="serving",
    cases=cases,
    plots=(write_grid,),
    about="decode and chunked prefill on KV caches (contiguous, ragged, paged) vs SDPA, opforge on the "
    "same keys contiguous, and FlashInfer (where installed)",
)
