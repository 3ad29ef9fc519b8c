"""Tuning only: attention_cases.py output (cases.txt) as a bar chart for benchmarks/results: per row
and pass, each peer's time over opforge's (opforge's speed relative to the peer; above 1: opforge
faster), one bar a peer.

    python benchmarks/tuning/attention/cases_plot.py cases.txt out.png "title"
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from cases_table import parse

PEERS = ("FlashAttention-4", "FlashAttention-4 deterministic", "SDPA cuDNN", "FlexAttention")


def main(path: str, out: str, title: str) -> None:
    labels, ratios = [], {p: [] for p in PEERS}
    for row, pass_, times in parse(path):
        labels.append(f"{row} {pass_}")
        for p in PEERS:
            ratios[p].append(times[p] / times["opforge"] if p in times else 0.0)
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(labels) + 1.5))
    width = 0.8 / len(PEERS)
    for i, p in enumerate(PEERS):
        ys = [r + (i - len(PEERS) / 2 + 0.5) * width for r in range(len(labels))]
        ax.barh(ys, ratios[p], height=width, label=p)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("opforge's speed relative to the peer (peer time / opforge time; > 1: opforge faster)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:4])
