"""Issue 48's same-run rows on the GPU: attention sinks (gpt-oss's shapes) and q/k head dim 192 with v 128
(DeepSeek's MLA), forward and forward + backward, opforge against the peers that run them in the same
process: FlashAttention-4 (flash_attn.cute: ``learnable_sink``; 192 / 128), FlexAttention (192 / 128
natively; sinks by the same LSE rescaling opforge's kernels do, after its kernel) and cuDNN attention
(192 / 128, through SDPA's cuDNN backend). A peer that cannot run a row prints why. bf16.

    python benchmarks/tuning/attention/issue48_rows.py [--rows sinks,mla,hdim] [--json out.json]
        [--peers opforge,cuDNN] [--fwd-only]
(FlashAttention-4 from ../shared/tools/fa4_peer.sh: PYTHONPATH as its header says.)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import opforge
from opforge.bench.timing import CudaTimer

ROWS = {
    "sinks": [  # (name, B, Hq, Hkv, S, Dqk, Dv, window)
        ("gpt-oss causal 4k", 2, 64, 8, 4096, 64, 64, None),
        ("gpt-oss sliding 128, 4k", 2, 64, 8, 4096, 64, 64, 128),
        ("gpt-oss causal 16k", 1, 64, 8, 16384, 64, 64, None),
    ],
    "mla": [
        ("DeepSeek MLA 192/128 causal 4k", 2, 128, 128, 4096, 192, 128, None),
        ("DeepSeek MLA 192/128 causal 8k", 1, 128, 128, 8192, 192, 128, None),
    ],
    "hdim": [  # FlashAttention-3's head dims 96 and 192 (opforge pads them to its kernels' 128 / 256)
        ("causal 4k D96", 4, 32, 8, 4096, 96, 96, None),
        ("causal 4k D192", 2, 32, 8, 4096, 192, 192, None),
        ("full 4k D192", 2, 32, 8, 4096, 192, 192, None),
    ],
}


def flops(B, Hq, S, Dqk, Dv, window, backward, causal=True):
    pairs = (S * (S + 1) / 2 if causal else S * S) if window is None else S * min(window, S)
    # 2 flops per multiply-add: the forward's Q K^T and P V; the backward adds S again, dP, dV, dK, dQ
    return B * Hq * pairs * ((8.0 * Dqk + 6.0 * Dv) if backward else 2.0 * (Dqk + Dv))


def opforge_fn(q, k, v, sinks, window, causal=True):
    kw = dict(causal=causal, window=None if window is None else (window - 1, 0))
    return lambda: opforge.attention(q, k, v, sinks=sinks, **kw)


def fa4_fn(q, k, v, sinks, window, causal=True):
    from flash_attn.cute import flash_attn_func  # (the peer: ../shared/tools/fa4_peer.sh)

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    kw = dict(causal=causal, window_size=(-1, -1) if window is None else (window - 1, 0))
    if sinks is not None:
        kw["learnable_sink"] = sinks
    return lambda: flash_attn_func(qt, kt, vt, **kw)[0].transpose(1, 2)  # (back to (B, H, S, D))


def flex_fn(q, k, v, sinks, window, causal=True):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def visible(b, h, i, j):
        return (j <= i) if window is None else ((j <= i) & (i - j < window))

    mask = (
        None
        if not causal
        else create_block_mask(visible, None, None, q.shape[2], k.shape[2], device=q.device)
    )
    flex = torch.compile(flex_attention)
    group = q.shape[1] != k.shape[1]

    def fn():
        if sinks is None:
            return flex(q, k, v, block_mask=mask, enable_gqa=group)
        out, lse = flex(q, k, v, block_mask=mask, enable_gqa=group, return_lse=True)
        w = torch.sigmoid(lse - sinks.view(1, -1, 1))  # (exp(lse) / (exp(lse) + exp(sink)))
        return out * w.unsqueeze(-1).to(out.dtype)

    return fn


def cudnn_fn(q, k, v, sinks, window, causal=True):
    if sinks is not None or window is not None:
        raise RuntimeError("SDPA takes no sinks, and a window only as a dense mask")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]
            )

    return fn


PEERS = {"opforge": opforge_fn, "FlashAttention-4": fa4_fn, "FlexAttention": flex_fn, "cuDNN": cudnn_fn}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="sinks,mla,hdim")
    ap.add_argument("--json", default=None)
    ap.add_argument("--peers", default=",".join(PEERS), help="which of them (default: all)")
    ap.add_argument("--fwd-only", action="store_true")
    args = ap.parse_args()
    timer = CudaTimer(torch.device("cuda"))
    torch._dynamo.config.recompile_limit = 64  # (FlexAttention compiles once per shape and grad mode)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; bf16; ms and TFLOP/s (visible pairs)")
    results = []
    for group in args.rows.split(","):
        for name, B, Hq, Hkv, S, Dqk, Dv, window in ROWS[group]:
            for backward in (False,) if args.fwd_only else (False, True):
                q = torch.randn(B, Hq, S, Dqk, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                k = torch.randn(B, Hkv, S, Dqk, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                v = torch.randn(B, Hkv, S, Dv, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                sinks = torch.randn(Hq, device="cuda", requires_grad=backward) if group == "sinks" else None
                go = torch.randn(B, Hq, S, Dv, device="cuda", dtype=torch.bfloat16)
                row = {"row": name, "pass": "fwd+bwd" if backward else "fwd", "times_ms": {}}
                line = f"  {name:34s} {row['pass']:8s}"
                for peer, make in ((p, PEERS[p]) for p in args.peers.split(",")):
                    try:
                        fwd = make(q, k, v, sinks, window, causal=not name.startswith("full"))
                        fn = (lambda f=fwd, g=go: f().backward(g)) if backward else fwd
                        fn()  # (compilation, JIT)
                        ms = timer(fn)
                    except Exception as e:  # (a peer that cannot run the row says why)
                        line += f" | {peer} n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})"
                        continue
                    row["times_ms"][peer] = ms
                    tf = flops(B, Hq, S, Dqk, Dv, window, backward, not name.startswith("full")) / ms / 1e9
                    ratio = (
                        ""
                        if peer == "opforge"
                        else f", opforge {ms / row['times_ms'].get('opforge', ms):.2f}x"
                    )
                    line += f" | {peer} {ms:.3f} ms {tf:.0f} TF{ratio}"
                print(line, flush=True)
                results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
