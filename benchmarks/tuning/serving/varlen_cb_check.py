"""Issue 32 (tuning): opforge.attention_varlen on continuous-batching-shaped calls (many requests in
one packed row, each request's new tokens bottom-right against its keys, GQA 32/8, D128, bf16)
against each request's float32 SDPA with an explicit bottom-right causal mask. Prints the largest
error per request set and variant, next to bf16 SDPA's own error on the same requests.

    python benchmarks/tuning/serving/varlen_cb_check.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import opforge


def case(lq, lk, dev, H=32, Hkv=8, D=128):
    q = torch.randn(sum(lq), H, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lk), Hkv, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    return q, k, v, cq, ck


def per_request(q, k, v, cq, ck, dtype):
    outs = []
    for b in range(len(cq) - 1):
        a, e, ka, ke = cq[b].item(), cq[b + 1].item(), ck[b].item(), ck[b + 1].item()
        qb, kb, vb = (t.to(dtype).transpose(0, 1)[None] for t in (q[a:e], k[ka:ke], v[ka:ke]))
        sq, sk = e - a, ke - ka
        keep = (
            torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
        )
        outs.append(
            F.scaled_dot_product_attention(qb, kb, vb, attn_mask=keep, enable_gqa=True)[0].transpose(0, 1)
        )
    return torch.cat(outs)


def main() -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    sets = {
        "decode 64 (1 x 100-4256)": ([1] * 64, torch.randint(100, 4257, (64,), generator=g).tolist()),
        "prefill 8 (sq = sk 100-4000)": (lambda n: (n, n))(
            torch.randint(100, 4001, (8,), generator=g).tolist()
        ),
        "chunks (sq < sk)": ([512, 37, 1, 1, 900, 256], [3000, 1037, 2001, 4200, 900, 4000]),
        "mixed 40": (
            [1] * 36 + [1000, 257, 64, 3000],
            [*torch.randint(100, 4257, (36,), generator=g).tolist(), 1000, 2000, 3064, 3000],
        ),
    }
    for name, (lq, lk) in sets.items():
        q, k, v, cq, ck = case(lq, lk, dev)
        want = per_request(q, k, v, cq, ck, torch.float32)
        low = per_request(q, k, v, cq, ck, torch.bfloat16).float()
        line = f"{name:32s} bf16 SDPA err {(low - want).abs().max().item():.2e}"
        for variant in ("auto", "hopper", "mma_sync"):
            try:
                got = opforge.attention_varlen(q, k, v, cq, ck, causal=True, variant=variant).float()
                err = (got - want).abs()
                worst = err.amax(dim=(1, 2))
                bad = [
                    b
                    for b in range(len(lq))
                    if worst[cq[b] : cq[b + 1]].numel() and worst[cq[b] : cq[b + 1]].max() > 0.05
                ]
                line += f" | {variant} {err.max().item():.2e} bad requests {bad[:8]}"
            except Exception as e:
                line += f" | {variant} {type(e).__name__}: {str(e)[:80]}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
