"""The matmul ladder plot: TFLOP/s of every rung at every size next to cuBLAS measured in the same
run (fp32 rungs against cuBLAS fp32 with TF32 off, tensor-core rungs against cuBLAS bf16).
The matmul spec's extra plot: `opforge bench` writes it as ladder.png beside results.png when the
run has CUDA matmul rows (scripts/plot_matmul_ladder.py draws it from a results.json)."""

from __future__ import annotations

import os
from typing import Any

from opforge.bench.harness import value_axis


def _rate(entry: dict[str, Any], m: int, k: int, n: int) -> float:
    return 2 * m * n * k / (entry["ms"] * 1e9)


def plot_ladder(result: dict[str, Any], path: str) -> bool:
    """Draw the ladder of a result with CUDA matmul rows into ``path``; False if there are none or
    matplotlib is missing."""
    rows = [r for r in result["rows"] if r["op"] == "matmul" and not r.get("error")]
    if result["meta"].get("device_type") != "cuda" or not rows:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    meta = result["meta"]
    panels = [
        (dtype, title)
        for dtype, title in (
            ("torch.float32", "float32: CUDA-core rungs vs cuBLAS (TF32 off)"),
            ("torch.bfloat16", "bfloat16: tensor-core rungs vs cuBLAS"),
        )
        if any(r["params"]["dtype"] == dtype for r in rows)
    ]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6), squeeze=False)
    for ax, (dtype, title) in zip(axes[0], panels, strict=True):
        sel = [r for r in rows if r["params"]["dtype"] == dtype]
        shapes = list(dict.fromkeys((r["params"]["m"], r["params"]["k"], r["params"]["n"]) for r in sel))
        variants = list(dict.fromkeys(r["params"]["variant"] for r in sel))
        width = 0.8 / (len(variants) + 1)
        heights: list[float] = []
        for i, shape in enumerate(shapes):
            here = [r for r in sel if (r["params"]["m"], r["params"]["k"], r["params"]["n"]) == shape]
            peers = [_rate(e, *shape) for r in here for name, e in r["impls"].items() if name != "opforge"]
            for j, variant in enumerate(variants):
                for r in here:
                    if r["params"]["variant"] == variant:
                        heights.append(_rate(r["impls"]["opforge"], *shape))
                        ax.bar(
                            i + j * width,
                            heights[-1],
                            width,
                            color=f"C{j}",
                            label=variant if i == 0 else None,
                        )
            if peers:
                heights.append(max(peers))
                ax.bar(
                    i + len(variants) * width,
                    max(peers),
                    width,
                    color="0.35",
                    label="cuBLAS" if i == 0 else None,
                )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
        ax.set_xticklabels(["{}x{}x{}".format(*s) if len(set(s)) > 1 else f"{s[0]}³" for s in shapes])
        value_axis(ax, heights, "TFLOP/s")
        ax.set_title(f"{title}\nTFLOP/s, higher is better", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"opforge.matmul on {meta['device']} (torch {meta['torch']}, {meta['date']}, {meta['commit']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_ladder(result: dict[str, Any], out_dir: str) -> list[str]:
    """The matmul spec's plot for harness.write: ladder.png in ``out_dir``, or nothing."""
    path = os.path.join(out_dir, "ladder.png")
    return [path] if plot_ladder(result, path) else []
