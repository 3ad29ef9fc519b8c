"""Where a Hopper forward block's time goes: per-block clock64 stamps written by the kernel as
fwd_timeline.patch instruments it (`git show 3b6aa88:benchmarks/tuning/fwd_timeline.patch`, applied to
`git show cdd2bc9:csrc/attention/cuda/attention_fwd_hopper_kernel.cuh`: it does not apply to the current
forward; LOG.md, "Removed tools and patches") (block start, the producer's Q issue and first
K / V issue, each consumer warpgroup's Q arrival, first tile done, last P V done, epilogue done),
read back by the launcher into the file OPFORGE_FWD_TIMELINE names (the patch only), summarised here
per row: the phases' mean cycles, cycles a tile in the main loop, and the idle gap on a
multiprocessor between one block's end and the next block's start.

    python benchmarks/tuning/attention/fwd_timeline.py "causal" "16 packed causal documents" ...
    (rows as attention_cases.py names them; "ROW@IMPL" picks an impl, e.g. "16 packed causal documents@opforge segment_ids")
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

SLOTS = 14


def summarise(path: str, label: str) -> None:
    raw = np.fromfile(path, dtype=np.uint64)
    gx, gy, gz, d = (int(x) for x in raw[:4])
    tl = raw[4:].reshape(-1, SLOTS).astype(np.int64)
    started = tl[:, 1] != 0
    padding = (tl[:, 0] >> 40) & 1 == 1
    ok = started & ~padding & (tl[:, 7] != 0)
    t = tl[ok]
    sm = t[:, 0] & 0xFF
    ntiles = (t[:, 0] >> 8) & 0xFFFFFFFF
    start, end = t[:, 1], np.maximum(t[:, 7], np.where(t[:, 11] != 0, t[:, 11], t[:, 7]))
    ph = {
        "start->producer Q issue": t[:, 2] - start,
        "Q issue->first K/V issued": t[:, 3] - t[:, 2],
        "start->Q arrived (wg1)": t[:, 4] - start,
        "first tile (wg1)": t[:, 5] - t[:, 4],
        "rest of the loop (wg1)": t[:, 6] - t[:, 5],
        "epilogue (wg1)": t[:, 7] - t[:, 6],
        "block total": end - start,
    }
    ph["wg2 end - wg1 end"] = np.where(t[:, 11] != 0, t[:, 11] - t[:, 7], 0)
    more = ntiles > 1
    per_tile = (t[more, 6] - t[more, 5]) / (ntiles[more] - 1)
    gaps = []
    for s in np.unique(sm):
        idx = np.where(sm == s)[0]
        order = idx[np.argsort(start[idx])]
        st, en = start[order], end[order]
        g = st[1:] - en[:-1]
        gaps.extend(g[g > 0].tolist())
    gt0, gt1 = t[:, 12], t[:, 13]
    span_ns = gt1.max() - gt0.min()
    busy = (end - start).sum()
    print(
        f"== {label}: grid {gx}x{gy}x{gz} D{d}, {ok.sum()} blocks ({padding.sum()} padding), "
        f"tiles/block mean {ntiles.mean():.2f} (min {ntiles.min()}, max {ntiles.max()}), "
        f"kernel span {span_ns / 1e3:.1f} us (globaltimer)"
    )
    for k, v in ph.items():
        print(
            f"   {k:28s} mean {v.mean():8.0f} cyc  p50 {np.median(v):8.0f}  p90 {np.percentile(v, 90):8.0f}"
        )
    print(f"   {'cycles a tile (loop)':28s} mean {per_tile.mean():8.0f}  p50 {np.median(per_tile):8.0f}")
    if gaps:
        print(
            f"   {'gap between blocks on an SM':28s} mean {np.mean(gaps):8.0f} cyc  p50 {np.median(gaps):8.0f}  n {len(gaps)}"
        )
    # where the kernel's SM-cycles went: blocks' busy cycles against (SMs x span)
    sms = len(np.unique(sm))
    long = (t[:, 13] - t[:, 12]) > 5000  # blocks of 5 us or more: the SM clock from both timers
    if long.any():
        ghz = np.median((t[long, 7] - t[long, 1]) / (t[long, 13] - t[long, 12]))
        print(f"   SM clock (cycles / globaltimer ns, median over blocks of 5 us or more): {ghz:.2f} GHz")
    cyc_span = span_ns * 1.98  # (cycles at the max clock: an upper bound on the span's cycles)
    print(f"   SMs {sms}, busy cycles / (SMs x span at 1.98 GHz) = {busy / (sms * cyc_span):.2f}")
    tail = [gt1[sm == s].max() for s in np.unique(sm)]
    print(
        f"   tail: SMs' last block end, spread {(max(tail) - min(tail)) / 1e3:.1f} us, median idle at end {(max(tail) - np.median(tail)) / 1e3:.1f} us"
    )


def main(argv: list[str]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for n, arg in enumerate(a for a in argv if not a.startswith("--")):
        row, _, impl = arg.partition("@")
        path = f"/tmp/fwd_timeline_{n}.bin"
        if os.path.exists(path):
            os.remove(path)
        env = dict(os.environ, OPFORGE_FWD_TIMELINE=path)
        cmd = [
            sys.executable,
            os.path.join(here, "attention_cases.py"),
            row,
            "--fwd-only",
            f"--impl={impl or 'opforge'}",
        ]
        subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL)
        if not os.path.exists(path):
            print(f"== {arg}: no timeline written")
            continue
        summarise(path, arg)


if __name__ == "__main__":
    main(sys.argv[1:])
