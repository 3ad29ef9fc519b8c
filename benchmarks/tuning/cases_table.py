"""Tuning only: attention_cases.py output (cases.txt) as a markdown table for benchmarks/results:
each row's pass, opforge's time and each peer's time with opforge's speed relative to it (peer
time / opforge time; above 1: opforge faster).

    python benchmarks/tuning/cases_table.py cases.txt > table.md
"""

from __future__ import annotations

import re
import sys

PEERS = ("FlashAttention-4", "SDPA cuDNN", "FlexAttention")
LINE = re.compile(r"^(?P<row>.+?) B\d.*? bf16 (?P<pass>fwd\+bwd|fwd|bwd)\s+(?P<rest>opforge .*)$")
IMPL = re.compile(r"(?P<name>[A-Za-z][\w\- ()/.]*?) (?P<ms>[\d.]+) ms \((?P<ratio>[\d.]+)x\)")


def main(path: str) -> None:
    print("| row | pass | opforge ms | " + " | ".join(f"{p} ms (opforge \u00d7)" for p in PEERS) + " |")
    print("|---|---|---|" + "---|" * len(PEERS))
    for line in open(path, encoding="utf-8"):
        m = LINE.match(line.strip())
        if not m:
            continue
        times = {i["name"].strip(): float(i["ms"]) for i in IMPL.finditer(m["rest"])}
        ours = times.get("opforge")
        if ours is None:
            continue
        cells = [f"{times[p]:.3f} ({times[p] / ours:.2f}\u00d7)" if p in times else "—" for p in PEERS]
        print(f"| {m['row']} | {m['pass']} | {ours:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
