"""Issue 32's decode grid (tuning): one query token a sequence against a KV cache, opforge against
SDPA (and FlexAttention on the rows marked so), each row timed in the same run by the bench's timer
(median of event-timed calls, L2 flushed before each), TB/s of the K/V bytes the visible keys take
(each KV head once) next to the copy ceiling measured in the same run. Paged rows: opforge on a paged
cache (page size P, pages in random order) against opforge on the same cache contiguous; prefill rows:
a chunk of new queries (causal: the cache's last keys) the same way.

    python benchmarks/tuning/attention/decode_grid.py                    # every row
    python benchmarks/tuning/attention/decode_grid.py --rows core,gqa    # some groups
    python benchmarks/tuning/attention/decode_grid.py --one 3 --impl opforge   # row 3's call only, 3 times (ncu)
    python benchmarks/tuning/attention/decode_grid.py --list
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import opforge
from opforge import reference
from opforge.bench.timing import CudaTimer, copy_bandwidth_gbps

_GB = 1 << 30


def grid() -> list[dict]:
    rows = []
    # core: D128, GQA 32/8, batch x cache (caches whose K/V fit in 24 GB)
    for B in (1, 8, 32, 128):
        for cache in (1024, 8192, 32768, 131072, 262144):
            if 2 * B * 8 * cache * 128 * 2 <= 24 * _GB:
                rows.append(dict(group="core", B=B, H=32, Hkv=8, cache=cache, D=128))
    # GQA groups 1-16 at B 8 x 32k and B 1 x 128k
    for B, cache in ((8, 32768), (1, 131072)):
        for H, Hkv in ((32, 32), (32, 16), (32, 4), (32, 2), (64, 4)):
            rows.append(dict(group="gqa", B=B, H=H, Hkv=Hkv, cache=cache, D=128))
    # head dims
    for D in (64, 256):
        for B, cache in ((8, 32768), (1, 131072), (64, 4096)):
            rows.append(dict(group="dims", B=B, H=32, Hkv=8, cache=cache, D=D))
    # per-sequence lengths (cache / 8 .. cache), SDPA with a length mask
    for B, cache, H, Hkv in ((8, 32768, 32, 8), (32, 8192, 32, 8), (8, 32768, 32, 32)):
        rows.append(dict(group="ragged", B=B, H=H, Hkv=Hkv, cache=cache, D=128, ragged=True))
    # paged against contiguous (opforge both), page sizes 16-256
    for ps in (16, 64, 256):
        rows.append(dict(group="paged", B=8, H=32, Hkv=8, cache=32768, D=128, page=ps))
    rows.append(dict(group="paged", B=32, H=32, Hkv=8, cache=4096, D=128, page=16, ragged=True))
    # chunked prefill: a chunk of new queries (causal, the last keys) against a paged cache vs contiguous
    for B, cache, chunk, ps in (
        (4, 8192, 512, 16),
        (1, 32768, 2048, 64),
        (8, 4096, 128, 16),
        (16, 2048, 16, 256),
    ):
        rows.append(dict(group="prefill", B=B, H=32, Hkv=8, cache=cache, D=128, page=ps, chunk=chunk))
    # the cache as (B, S, Hkv, D) (a row holds every kv head, as a page does) against (B, Hkv, S, D)
    rows.append(dict(group="layout", B=8, H=32, Hkv=8, cache=32768, D=128, layout=True))
    rows.append(dict(group="layout", B=32, H=32, Hkv=8, cache=4096, D=128, layout=True))
    # 17-64 rows a kv head (the decode kernel's two and four m tiles; MQA, speculative tokens, short
    # chunks): the decode kernel against SDPA and the tiled forwards by name
    for B, H, Hkv, cache, chunk, D in (
        (1, 32, 1, 131072, 1, 128),
        (8, 64, 2, 32768, 1, 128),
        (16, 32, 8, 2048, 16, 128),
        (4, 32, 8, 8192, 8, 128),
        (8, 32, 1, 32768, 1, 64),
        (4, 32, 8, 8192, 16, 64),
        (4, 32, 8, 8192, 8, 256),
    ):
        rows.append(dict(group="rows", B=B, H=H, Hkv=Hkv, cache=cache, D=D, chunk=chunk, variants=True))
    for i, r in enumerate(rows):
        r["id"] = i
    return rows


def label(r: dict) -> str:
    extra = (" ragged" if r.get("ragged") else "") + (f" paged {r['page']}" if r.get("page") else "")
    extra += f" chunk {r['chunk']}" if r.get("chunk") else ""
    return f"B{r['B']} H{r['H']}/{r['Hkv']} cache {r['cache']} D{r['D']}{extra}"


def build(r: dict, dev: torch.device) -> tuple[dict, int, callable]:
    """The row's implementations (opforge first), the K/V bytes visible, and a correctness check."""
    B, H, Hkv, S, D = r["B"], r["H"], r["Hkv"], r["cache"], r["D"]
    dt = torch.bfloat16
    q = torch.randn(B, H, r.get("chunk", 1), D, device=dev, dtype=dt)
    k, v = (torch.randn(B, Hkv, S, D, device=dev, dtype=dt) for _ in range(2))
    gqa = H != Hkv
    kw: dict = {"causal": True}
    lens = None
    if r.get("ragged"):
        g = torch.Generator(device="cpu").manual_seed(r["id"])
        lens = torch.randint(S // 8, S + 1, (B,), generator=g).to(dev)
        kw["kv_lens"] = lens
        nbytes = int(lens.sum()) * Hkv * 2 * D * 2
    else:
        nbytes = 2 * B * Hkv * S * D * 2
    impls = {"opforge": lambda: opforge.attention(q, k, v, **kw)}
    if r.get("layout"):
        kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))  # (B, S, Hkv, D) storage
        impls = {
            "opforge (B,S,Hkv,D)": lambda: opforge.attention(q, kt, vt, **kw),
            "opforge (B,Hkv,S,D)": lambda: opforge.attention(q, k, v, **kw),
        }
    elif r.get("page"):
        ps = r["page"]
        per = S // ps
        perm = torch.randperm(B * per, device=dev)
        table = perm.view(B, per).int()
        kc = torch.empty(B * per, ps, Hkv, D, device=dev, dtype=dt)
        vc = torch.empty_like(kc)
        kc[perm] = k.transpose(1, 2).reshape(B * per, ps, Hkv, D)
        vc[perm] = v.transpose(1, 2).reshape(B * per, ps, Hkv, D)
        klen = lens if lens is not None else torch.full((B,), S, device=dev, dtype=torch.long)
        kwp = dict(causal=True, kv_lens=klen, block_table=table)
        impls = {
            "opforge paged": lambda: opforge.attention(q, kc, vc, **kwp),
            "opforge contiguous": lambda: opforge.attention(q, k, v, **kw),
        }
        if r.get("chunk") and lens is None:  # (the contiguous cache with the counts too: the same kernel)
            impls["contiguous kv_lens"] = lambda: opforge.attention(q, k, v, causal=True, kv_lens=klen)
    elif lens is not None:
        keep = (torch.arange(S, device=dev)[None, :] < lens[:, None])[:, None, None, :]
        impls["SDPA (length mask)"] = lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, enable_gqa=gqa
        )
    else:
        impls["SDPA"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    if r.get("variants"):  # (the same call on each tiled forward by name)
        for variant in ("hopper", "mma_sync"):
            impls[variant] = lambda variant=variant: opforge.attention(q, k, v, variant=variant, **kw)

    def check() -> float:
        first = next(iter(impls.values()))()
        # the float64 reference on two sequences (the first and the last) where it is small, else the peer
        if S * Hkv <= (1 << 20) and q.shape[2] * S * H <= (1 << 26):
            rows = [0, B - 1]
            sub = {n: (t[rows] if n == "kv_lens" else t) for n, t in kw.items()}
            want = reference.attention(q[rows].double(), k[rows].double(), v[rows].double(), **sub)
            return (first[rows].double() - want).abs().max().item()
        return (first.float() - list(impls.values())[1]().float()).abs().max().item()

    return impls, nbytes, check


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="core,gqa,dims,ragged,paged,prefill,rows,layout")
    ap.add_argument("--one", type=int, default=None)
    ap.add_argument("--impl", default="opforge")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = grid()
    if args.list:
        for r in rows:
            print(r["id"], r["group"], label(r))
        return
    dev = torch.device("cuda")
    if args.one is not None:
        impls, _, _ = build(rows[args.one], dev)
        fn = next(f for n, f in impls.items() if n.startswith(args.impl))
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return
    timer = CudaTimer(dev, warmup_ms=10, rep_ms=60)
    ceiling = copy_bandwidth_gbps(dev, quick=False) / 1e3
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__}; copy ceiling {ceiling:.2f} TB/s (read + write)"
    )
    groups = set(args.rows.split(","))
    out = []
    for r in rows:
        if r["group"] not in groups:
            continue
        impls, nbytes, check = build(r, dev)
        err = check()
        times = {n: timer(f) for n, f in impls.items()}
        names = list(times)
        first, second = names[0], names[1]
        ratio = times[second] / times[first]
        tbs = nbytes / (times[first] * 1e-3) / 1e12
        print(
            f"{r['id']:3d} {r['group']:6s} {label(r):40s} {first} {times[first] * 1e3:9.1f} us {tbs:5.2f} TB/s "
            f"({tbs / ceiling:4.2f} ceil) | {second} {times[second] * 1e3:9.1f} us | x{ratio:5.2f}  err {err:.1e}"
            + "".join(f" | {n} {times[n] * 1e3:.1f} us" for n in names[2:]),
            flush=True,
        )
        out.append(dict(r, times_ms=times, bytes=nbytes, tbs=tbs, ceiling_tbs=ceiling, ratio=ratio, err=err))
        del impls
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
