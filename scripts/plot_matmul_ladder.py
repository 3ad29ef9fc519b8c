"""Draws the matmul ladder from an `opforge bench --full --ops matmul` results.json: TFLOP/s of
every rung at every size next to cuBLAS measured in the same run (fp32 rungs against cuBLAS fp32
with TF32 off, tensor-core rungs against cuBLAS bf16).

    python scripts/plot_matmul_ladder.py benchmarks/results/h200-matmul/results.json [out.png]
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rate(entry: dict, m: int, k: int, n: int) -> float:
    return 2 * m * n * k / (entry["ms"] * 1e9)


def main() -> None:
    src = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_name("ladder.png")
    data = json.loads(src.read_text())
    rows = [r for r in data["rows"] if r["op"] == "matmul" and not r.get("error")]
    meta = data["meta"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for ax, dtype, title in (
        (axes[0], "torch.float32", "float32: CUDA-core rungs vs cuBLAS (TF32 off)"),
        (axes[1], "torch.bfloat16", "bfloat16: tensor-core rungs vs cuBLAS"),
    ):
        sel = [r for r in rows if r["params"]["dtype"] == dtype]
        shapes = list(dict.fromkeys((r["params"]["m"], r["params"]["k"], r["params"]["n"]) for r in sel))
        variants = list(dict.fromkeys(r["params"]["variant"] for r in sel))
        width = 0.8 / (len(variants) + 1)
        for i, shape in enumerate(shapes):
            here = [r for r in sel if (r["params"]["m"], r["params"]["k"], r["params"]["n"]) == shape]
            peers = [rate(e, *shape) for r in here for name, e in r["impls"].items() if name != "opforge"]
            for j, variant in enumerate(variants):
                for r in here:
                    if r["params"]["variant"] == variant:
                        ax.bar(
                            i + j * width,
                            rate(r["impls"]["opforge"], *shape),
                            width,
                            color=f"C{j}",
                            label=variant if i == 0 else None,
                        )
            x = i + len(variants) * width
            ax.bar(x, max(peers), width, color="0.35", label="cuBLAS" if i == 0 else None)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
        ax.set_xticklabels(["{}x{}x{}".format(*s) if len(set(s)) > 1 else f"{s[0]}³" for s in shapes])
        ax.set_ylabel("TFLOP/s")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"opforge.matmul on {meta['device']} (torch {meta['torch']}, {meta['date']}, {meta['commit']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
