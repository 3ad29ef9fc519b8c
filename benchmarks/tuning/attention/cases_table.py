"""Tuning only: attention_cases.py output (cases.txt) as a markdown table for benchmarks/results:
each row's pass, opforge's time and each peer's time with opforge's speed relative to it (peer
time / opforge time; above 1: opforge faster).

    python benchmarks/tuning/attention/cases_table.py cases.txt > table.md
"""

from __future__ import annotations

import re
import sys

PEERS = ("FlashAttention-4", "SDPA cuDNN", "FlexAttention")
LINE = re.compile(r"^(?P<row>.+?) B\d.*? bf16 (?P<pass>fwd\+bwd|fwd|bwd)\s+(?P<rest>opforge .*)$")
IMPL = re.compile(r"(?P<name>[A-Za-z][\w\- ()/.]*?) (?P<ms>[\d.]+) ms \((?P<ratio>[\d.]+)x\)")


def parse(path: str):
    """(row, pass, {impl: ms}) of each line of cases.txt with opforge's time; a deterministic
    backward's pass reads "fwd+bwd deterministic"."""
    for line in open(path, encoding="utf-8"):
        det = "bf16 fwd+bwd deterministic" in line
        m = LINE.match(line.replace("fwd+bwd deterministic", "fwd+bwd").strip())
        if not m:
            continue
        times = {i["name"].strip(): float(i["ms"]) for i in IMPL.finditer(m["rest"])}
        if "opforge" in times:
            yield m["row"], m["pass"] + (" deterministic" if det else ""), times


def main(path: str) -> None:
    print("| row | pass | opforge ms | " + " | ".join(f"{p} ms (opforge \u00d7)" for p in PEERS) + " |")
    print("|---|---|---|" + "---|" * len(PEERS))
    for row, pass_, times in parse(path):
        if pass_.endswith("deterministic"):
            continue  # (against FA4's deterministic backward only: a table of its own)
        ours = times["opforge"]
        cells = [f"{times[p]:.3f} ({times[p] / ours:.2f}\u00d7)" if p in times else "—" for p in PEERS]
        print(f"| {row} | {pass_} | {ours:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
