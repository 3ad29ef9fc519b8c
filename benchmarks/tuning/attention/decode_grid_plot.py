"""Tuning: decode_grid.py's JSON as a chart: each row's K/V bytes rate for opforge and its peer (SDPA,
or for paged rows opforge on the contiguous cache), the copy ceiling measured in the same run.

    python benchmarks/tuning/attention/decode_grid_plot.py grid.json out.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    rows = json.load(open(sys.argv[1]))
    labels, ours, peer, names = [], [], [], set()
    for r in rows:
        (_, t0), (second, t1) = list(r["times_ms"].items())[:2]
        names.add(second)
        extra = (" ragged" if r.get("ragged") else "") + (f" p{r['page']}" if r.get("page") else "")
        labels.append(f"B{r['B']} {r['H']}/{r['Hkv']} {r['cache'] // 1024}k D{r['D']}{extra}")
        ours.append(r["bytes"] / (t0 * 1e-3) / 1e12)
        peer.append(r["bytes"] / (t1 * 1e-3) / 1e12)
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(14, 5))
    ax.bar([i - 0.2 for i in x], ours, 0.4, label="opforge")
    ax.bar([i + 0.2 for i in x], peer, 0.4, label=" / ".join(sorted(names)))
    ax.axhline(rows[0]["ceiling_tbs"], color="gray", ls="--", lw=1, label="copy ceiling (same run)")
    ax.set_xticks(list(x), labels, rotation=75, fontsize=7)
    ax.set_ylabel("TB/s of K/V read")
    ax.set_title("Decode, one query token a sequence, bf16, H200 (decode_grid.py)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
