"""Hottest SASS instructions of an Nsight Compute source-page CSV (warp-stall samples).

    ncu --section SourceCounters -o prof python3 ...
    ncu -i prof.ncu-rep --page source --print-source sass --csv > src.csv
    python3 benchmarks/tuning/common/ncu_hot.py src.csv [top]

Prints the columns it found, then the `top` instructions by all samples with their stall
columns, and the samples summed per opcode.
"""

from __future__ import annotations

import collections
import csv
import sys


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = [r for r in csv.reader(lines) if r and r[0] != "Kernel Name"]
    header, body = rows[0], rows[1:]

    def col(*keys: str) -> int | None:
        for i, h in enumerate(header):
            if all(k.lower() in h.lower() for k in keys):
                return i
        return None

    src, allc, notc = col("Source"), col("Sampling", "All"), col("Sampling", "Not")
    if src is None or allc is None:
        print("no source / sampling columns")
        return

    def num(x: str) -> float:
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[allc]) for r in body if len(r) > allc) or 1.0
    print(f"instructions {len(body)}, samples {total:.0f}")
    ranked = sorted((r for r in body if len(r) > allc), key=lambda r: -num(r[allc]))
    stalls = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    for r in ranked[:top]:
        nots = f" not-issued {num(r[notc]):6.0f}" if notc is not None else ""
        why = sorted(((num(r[i]), header[i][6:]) for i in stalls), reverse=True)[:3]
        why_s = " ".join(f"{n}:{v:.0f}" for v, n in why if v > 0)
        print(
            f"{100 * num(r[allc]) / total:5.1f}% {num(r[allc]):6.0f}{nots}  {r[0][-5:]}  {r[src].strip()[:60]:60}  {why_s}"
        )
    print(
        "stalls:",
        ", ".join(f"{header[i][6:]} {100 * sum(num(r[i]) for r in body) / total:.1f}%" for i in stalls),
    )
    per_op: collections.Counter[str] = collections.Counter()
    for r in body:
        if len(r) > allc and r[src].strip():
            op = r[src].split()[0]
            if op.startswith("@"):
                op = r[src].split()[1]
            per_op[op.split(".")[0]] += num(r[allc])
    print("per opcode:", ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in per_op.most_common(15)))
    # Executed warp instructions per SASS line (SourceCounters' "Instructions Executed"), where the
    # CSV has them: the total, per opcode, and the kernel's address ranges that execute the most
    # (offsets from its first instruction, as cuobjdump prints them, in 256-instruction windows).
    exc = col("Instructions Executed")
    if exc is None:
        return
    addr = col("Address")
    executed = [(r, num(r[exc])) for r in body if len(r) > exc]
    total_x = sum(x for _, x in executed) or 1.0
    print(f"executed warp instructions {total_x:.0f}")
    per_op_x: collections.Counter[str] = collections.Counter()
    for r, x in executed:
        if r[src].strip():
            words = r[src].split()
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            per_op_x[op.split(".")[0]] += x
    print(
        "executed per opcode:",
        ", ".join(f"{op} {100 * v / total_x:.1f}%" for op, v in per_op_x.most_common(15)),
    )
    if addr is not None:
        try:
            base = min(int(r[addr], 16) for r, _ in executed)
        except ValueError:
            return
        windows: collections.Counter[int] = collections.Counter()
        for r, x in executed:
            windows[(int(r[addr], 16) - base) // (16 * 256)] += x
        print(
            "executed by 4 KB window (offset: share):",
            ", ".join(
                f"{w * 4096:x}: {100 * v / total_x:.1f}%"
                for w, v in sorted(windows.items())
                if v / total_x > 0.01
            ),
        )


if __name__ == "__main__":
    main()
