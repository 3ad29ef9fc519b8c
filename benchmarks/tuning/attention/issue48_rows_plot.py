"""Plots issue48_rows.py's JSON: opforge's speed relative to each peer (peer time / opforge time) per
row and pass, one bar per peer that ran the row.

    python benchmarks/tuning/attention/issue48_rows_plot.py results.json out.png [--title TEXT]
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("png")
    ap.add_argument("--title", default="opforge against each peer (peer time / opforge time), same run")
    args = ap.parse_args()
    with open(args.json) as f:
        rows = json.load(f)
    peers = [
        p for p in ("FlashAttention-4", "cuDNN", "FlexAttention") if any(p in r["times_ms"] for r in rows)
    ]
    labels = [f"{r['row']} {r['pass']}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.5))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        ys, xs = [], []
        for j, r in enumerate(rows):
            if peer in r["times_ms"]:
                ys.append(j + (i - (len(peers) - 1) / 2) * width)
                xs.append(r["times_ms"][peer] / r["times_ms"]["opforge"])
        ax.barh(ys, xs, height=width, label=peer)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("opforge's speed relative to the peer (> 1: opforge faster)")
    ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
