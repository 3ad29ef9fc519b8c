"""Draws docs/images/attention_masks.png: what each opforge.attention pattern lets a query see, from
the same definitions the kernels and the reference use (opforge.masks). Run after changing them:
python scripts/plot_attention_masks.py"""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from opforge.masks import attention_mask, block_mask

S = 48
docs = torch.tensor([[0] * 14 + [1] * 20 + [2] * 14])
checker = block_mask(
    lambda b, h, q, kv: ((q // 16 + kv // 16) % 2 == 0) & (kv <= q + 8), None, None, S, S, block_size=64
)
PANELS = [
    ("full", {}),
    ("causal=True", dict(causal=True)),
    ("causal, window=(11, 0)\n(sliding window)", dict(causal=True, window=(11, 0))),
    ("window=(6, 6)", dict(window=(6, 6))),
    ("causal, prefix_len=16\n(prefix-LM)", dict(causal=True, prefix_len=16)),
    ("causal, segment_ids\n(packed documents)", dict(causal=True, segment_ids=docs)),
    ("mask=block_mask(fn, ...)\n(any function)", dict(mask=checker)),
]


def main() -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(2.1 * len(PANELS), 2.6))
    for ax, (title, kw) in zip(axes, PANELS, strict=True):
        visible = attention_mask(1, 1, S, S, **kw)[0, 0]
        ax.imshow(visible.numpy(), cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        ax.set_title(title, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("key", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    fig.tight_layout()
    out = pathlib.Path(__file__).resolve().parent.parent / "docs/images/attention_masks.png"
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
