"""opforge's attention rows timed in two builds of opforge, alternately, in one lease: the check that a
restructure or a kernel change made no row slower (issue 46's before/after table).

    python benchmarks/tuning/attention/before_after.py rows           # the row names
    python benchmarks/tuning/attention/before_after.py time OUT.json  # this process's opforge, one pass
    python benchmarks/tuning/attention/before_after.py compare A_DIR B_DIR [--passes 3] [--json out.json]
        [--only decode,paged]   (the rows whose names contain one of these words)

`compare` runs `time` in fresh processes with PYTHONPATH=A_DIR then B_DIR (each a tree built in
place, e.g. a commit unpacked by rows_at_commits.sh pack and built with setup.py build_ext
--inplace: house_gpu.sh does both in one lease), alternating A, B, A, B, ... (drift and a neighbour
hit both), and prints per row the median over passes of each build's time, B / A and each build's
spread (max / min over passes: the row's noise); the JSON has them with the device, torch, date and
A_COMMIT / B_COMMIT from the environment. Only the public API is called (opforge.attention,
attention_varlen, block_mask), so any two commits compare. Timing: CUDA events around one call, the
L2 flushed before each (a 256 MiB write), median of 30 after 5 warm-ups.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys

import torch

DEV = "cuda"
BF16 = torch.bfloat16


def _qkv(B, Hq, Hkv, Sq, Sk, D, grad=False):
    q = torch.randn(B, Hq, Sq, D, device=DEV, dtype=BF16, requires_grad=grad)
    k = torch.randn(B, Hkv, Sk, D, device=DEV, dtype=BF16, requires_grad=grad)
    v = torch.randn(B, Hkv, Sk, D, device=DEV, dtype=BF16, requires_grad=grad)
    return q, k, v


def _timed(call, leaves, backward: bool):
    """The timed callable: the forward `call`, or with `backward` the gradients of one forward's
    output with respect to `leaves` (a random cotangent; the graph kept for every repetition)."""
    if not backward:
        return call
    out = call()
    go = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, go, retain_graph=True)


def _forward(B, Hq, Hkv, S, D, **kw):
    import opforge

    def make():
        q, k, v = _qkv(B, Hq, Hkv, S, S, D)
        return lambda: opforge.attention(q, k, v, **kw)

    return make


def _backward(B, Hq, Hkv, S, D, **kw):
    import opforge

    def make():
        q, k, v = _qkv(B, Hq, Hkv, S, S, D, grad=True)
        return _timed(lambda: opforge.attention(q, k, v, **kw), (q, k, v), True)

    return make


def _documents(B, H, S, D, docs, backward=False):
    import opforge

    def make():
        q, k, v = _qkv(B, H, H, S, S, D, grad=backward)
        ids = torch.arange(S, device=DEV).div(S // docs, rounding_mode="floor").expand(B, S).contiguous()
        return _timed(lambda: opforge.attention(q, k, v, causal=True, segment_ids=ids), (q, k, v), backward)

    return make


def _random_blocks(B, H, S, D, density, backward=False):
    import opforge

    def make():
        q, k, v = _qkv(B, H, H, S, S, D, grad=backward)
        g = torch.Generator(device="cpu").manual_seed(0)
        table = (torch.rand(S // 128, S // 128, generator=g) < density).to(DEV)
        bits = torch.rand(S, S, generator=g).to(DEV) < 0.5
        m = opforge.block_mask(
            lambda b, h, i, j: table[i // 128, j // 128] & bits[i, j], None, None, S, S, device=DEV
        )
        return _timed(lambda: opforge.attention(q, k, v, mask=m), (q, k, v), backward)

    return make


def _decode(B, Hq, Hkv, Sk, D, ragged=False, lens=True):
    """One query a sequence against Sk keys: with per-sequence counts (all Sk, or with `ragged` drawn
    in [100, Sk]), or without them (lens=False: the uniform split)."""
    import opforge

    def make():
        q, k, v = _qkv(B, Hq, Hkv, 1, Sk, D)
        g = torch.Generator(device="cpu").manual_seed(0)
        counts = (
            torch.randint(100, Sk + 1, (B,), generator=g)
            if ragged
            else torch.full((B,), Sk, dtype=torch.int64)
        ).to(DEV)
        kw = dict(kv_lens=counts) if lens else {}
        return lambda: opforge.attention(q, k, v, causal=True, **kw)

    return make


def _paged(B, Hq, Hkv, Sk, D, page, Sq=1, low=None):
    """Sq queries a sequence on a paged cache of Sk positions (pages in random order), every sequence
    holding Sk keys or (low) a count drawn in [low, Sk]."""
    import opforge

    def make():
        q = torch.randn(B, Hq, Sq, D, device=DEV, dtype=BF16)
        P = Sk // page
        g = torch.Generator(device="cpu").manual_seed(0)
        table = torch.randperm(B * P, generator=g).view(B, P).to(DEV, torch.int32)
        kc = torch.randn(B * P, page, Hkv, D, device=DEV, dtype=BF16)
        vc = torch.randn_like(kc)
        counts = torch.randint(low, Sk + 1, (B,), generator=g) if low else torch.full((B,), Sk)
        lens = counts.to(DEV, torch.int32)
        return lambda: opforge.attention(q, kc, vc, kv_lens=lens, block_table=table, causal=True)

    return make


def _chunk(B, Hq, Hkv, Sk, D, Sq, blocks=False):
    """A prefill chunk of Sq queries over a contiguous cache of Sk rows with per-sequence counts
    (the KV-cache form; with blocks, a block mask too)."""
    import opforge

    def make():
        q, k, v = _qkv(B, Hq, Hkv, Sq, Sk, D)
        g = torch.Generator(device="cpu").manual_seed(0)
        lens = torch.randint(Sk // 2, Sk + 1, (B,), generator=g).to(DEV)
        kw = dict(kv_lens=lens)
        if blocks:
            table = (torch.rand(Sq // 128, Sk // 128, generator=g) < 0.5).to(DEV)
            kw["mask"] = opforge.block_mask(
                lambda b, h, i, j: table[i // 128, j // 128], None, None, Sq, Sk, device=DEV
            )
        else:
            kw["causal"] = True
        return lambda: opforge.attention(q, k, v, **kw)

    return make


def _varlen(lengths, H, D, backward=False):
    import opforge

    def make():
        total = sum(lengths)
        q = torch.randn(total, H, D, device=DEV, dtype=BF16, requires_grad=backward)
        k = torch.randn(total, H, D, device=DEV, dtype=BF16, requires_grad=backward)
        v = torch.randn(total, H, D, device=DEV, dtype=BF16, requires_grad=backward)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
        return _timed(lambda: opforge.attention_varlen(q, k, v, cu, cu, causal=True), (q, k, v), backward)

    return make


SLIDING = dict(causal=True, window=(511, 0))
ROWS = {
    "fwd causal": _forward(4, 16, 16, 4096, 128, causal=True),
    "fwd full": _forward(4, 16, 16, 4096, 128),
    "fwd GQA 32/8 causal 8k": _forward(2, 32, 8, 8192, 128, causal=True),
    "fwd causal D64": _forward(4, 32, 32, 4096, 64, causal=True),
    "fwd causal D256": _forward(4, 8, 8, 4096, 256, causal=True),
    "fwd sliding 512": _forward(4, 16, 16, 4096, 128, **SLIDING),
    "fwd softcap 50 causal": _forward(4, 16, 16, 4096, 128, causal=True, softcap=50.0),
    "fwd causal 32k": _forward(1, 16, 16, 32768, 128, causal=True),
    "fwd documents 8x512": _documents(4, 16, 4096, 128, 8),
    "fwd random blocks 30%": _random_blocks(4, 16, 4096, 128, 0.3),
    "fwd varlen 8 x ~1k": _varlen([700, 1300, 1024, 512, 1536, 900, 1100, 1022], 16, 128),
    "fwd varlen 64 x ~300": _varlen([100 + (37 * i) % 400 for i in range(64)], 16, 128),
    "fwd random blocks 30% D256": _random_blocks(4, 8, 4096, 256, 0.3),
    "fwd sliding 512 D64": _forward(4, 32, 32, 4096, 64, **SLIDING),
    "fwd chunk 512 kv_lens 8k": _chunk(4, 32, 8, 8192, 128, 512),
    "fwd chunk 512 kv_lens 8k blocks": _chunk(4, 32, 8, 8192, 128, 512, blocks=True),
    "bwd causal": _backward(4, 16, 16, 4096, 128, causal=True),
    "bwd full": _backward(4, 16, 16, 4096, 128),
    "bwd GQA 32/8 causal 8k": _backward(2, 32, 8, 8192, 128, causal=True),
    "bwd causal D64": _backward(4, 32, 32, 4096, 64, causal=True),
    "bwd causal D256": _backward(4, 8, 8, 4096, 256, causal=True),
    "bwd sliding 512": _backward(4, 16, 16, 4096, 128, **SLIDING),
    "bwd causal deterministic": _backward(4, 16, 16, 4096, 128, causal=True, deterministic=True),
    "bwd causal deterministic D256": _backward(4, 8, 8, 4096, 256, causal=True, deterministic=True),
    "bwd random blocks 30% D64": _random_blocks(4, 32, 4096, 64, 0.3, backward=True),
    "bwd documents 8x512": _documents(4, 16, 4096, 128, 8, backward=True),
    "bwd random blocks 30%": _random_blocks(4, 16, 4096, 128, 0.3, backward=True),
    "bwd varlen 8 x ~1k": _varlen([700, 1300, 1024, 512, 1536, 900, 1100, 1022], 16, 128, backward=True),
    "decode B8 32/8 32k": _decode(8, 32, 8, 32768, 128),
    "decode B64 32/8 2k": _decode(64, 32, 8, 2048, 128),
    "decode ragged B16 16k": _decode(16, 32, 8, 16384, 128, ragged=True),
    "decode B8 32/8 32k D64": _decode(8, 32, 8, 32768, 64),
    "decode B8 32/8 32k no lens": _decode(8, 32, 8, 32768, 128, lens=False),
    "decode B64 32/8 2k no lens": _decode(64, 32, 8, 2048, 128, lens=False),
    "decode B1 32/8 8k no lens": _decode(1, 32, 8, 8192, 128, lens=False),
    "decode B128 32/8 1k no lens": _decode(128, 32, 8, 1024, 128, lens=False),
    "decode B256 32/8 2k": _decode(256, 32, 8, 2048, 128),  # (every block reads 256 counts first)
    "paged decode B8 32k page 16": _paged(8, 32, 8, 32768, 128, 16),
    "paged decode B8 32k page 64": _paged(8, 32, 8, 32768, 128, 64),
    "paged decode B32 4k-8k page 16": _paged(32, 32, 8, 8192, 128, 16, low=4096),
    "paged chunk 512 B4 8k page 16": _paged(4, 32, 8, 8192, 128, 16, Sq=512),
}


def time_call(fn, reps: int = 30, warm: int = 5) -> float:
    """Median milliseconds of one call, the L2 flushed before each."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEV)
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _chosen(only: str | None) -> list[str]:
    words = [w for w in (only or "").split(",") if w]
    return [name for name in ROWS if not words or any(w in name for w in words)]


def time_rows(path: str, only: str | None = None) -> None:
    import opforge

    result = {"opforge": os.path.dirname(os.path.dirname(opforge.__file__)), "rows": {}}
    for name in _chosen(only):
        make = ROWS[name]
        torch.manual_seed(0)
        try:
            result["rows"][name] = time_call(make())
        except Exception as e:  # (a row an older build cannot run: reported, not fatal)
            result["rows"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(result, f)


def compare(a: str, b: str, passes: int, out: str | None, only: str | None = None) -> None:
    runs: dict[str, list[dict]] = {a: [], b: []}
    for i in range(passes):
        for tree in (a, b):
            path = f"/tmp/before_after_{i}_{os.path.basename(tree.rstrip('/'))}.json"
            env = dict(os.environ, PYTHONPATH=tree)
            extra = ["--only", only] if only else []
            subprocess.run([sys.executable, __file__, "time", path, *extra], env=env, check=True)
            with open(path) as f:
                runs[tree].append(json.load(f)["rows"])
    table = {}
    print(
        f"{'row':32s} {'A ms':>10s} {'B ms':>10s} {'B / A':>7s} {'A spread':>9s} {'B spread':>9s}"
        f"   (A = {a}, B = {b}, {passes} passes; spread: max / min over passes)"
    )
    for name in _chosen(only):
        cells = []
        for tree in (a, b):
            vals = [r[name] for r in runs[tree] if isinstance(r[name], float)]
            cells.append(statistics.median(vals) if vals else None)
        ta, tb = cells
        ratio = tb / ta if ta and tb else None
        spread = {
            t: (max(v) / min(v) if (v := [r[name] for r in runs[t] if isinstance(r[name], float)]) else None)
            for t in (a, b)
        }
        table[name] = {
            "a_ms": ta,
            "b_ms": tb,
            "b_over_a": ratio,
            "spread_a": spread[a],
            "spread_b": spread[b],
        }
        fmt = lambda x: f"{x:10.4f}" if x else f"{'-':>10s}"  # noqa: E731
        sp = lambda x: f"{x:9.3f}" if x else f"{'-':>9s}"  # noqa: E731
        r = f"{ratio:7.3f}" if ratio else f"{'-':>7s}"
        print(f"{name:32s} {fmt(ta)} {fmt(tb)} {r} {sp(spread[a])} {sp(spread[b])}")
    if out:
        with open(out, "w") as f:
            json.dump(
                {
                    "a": os.environ.get("A_COMMIT", a),
                    "b": os.environ.get("B_COMMIT", b),
                    "passes": passes,
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "rows": table,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "rows"
    if cmd == "rows":
        print("\n".join(ROWS))
    elif cmd == "time":
        args = sys.argv[2:]
        time_rows(args[0], args[args.index("--only") + 1] if "--only" in args else None)
    elif cmd == "compare":
        args = sys.argv[2:]
        passes = int(args[args.index("--passes") + 1]) if "--passes" in args else 3
        out = args[args.index("--json") + 1] if "--json" in args else None
        only = args[args.index("--only") + 1] if "--only" in args else None
        compare(args[0], args[1], passes, out, only)
