"""CPU ops with and without a busy neighbour process: opforge against the op it replaces.

A neighbour running multithreaded torch ops keeps every core busy; a parallel region then waits
for its worker threads to be scheduled (a scheduler tick each), so small work that opforge runs
in parallel can turn slower than the serial peer. Prints the median time of each op quiet and
loaded, and the peer's time over opforge's.

    python benchmarks/tuning/common/cpu_neighbour.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch

import opforge
from opforge.bench.nms import clustered_boxes, uniform_boxes
from opforge.bench.timing import wall_median_ms

# One neighbour running multithreaded torch ops (its threads sleep and wake), and one busy loop
# per core (always runnable): every core has work that competes with our worker threads.
NEIGHBOURS = [
    "import torch\ntorch.set_num_threads(max(2, torch.get_num_threads()))\n"
    "x = torch.randn(1 << 22)\nwhile True:\n    x.add_(1.0)\n",
    *["while True:\n    pass\n"] * 2,
]


def cases():
    import torchvision.ops as tv

    for n, classes in ((1000, 80), (200, 80), (5000, 80), (1000, 1)):
        boxes, scores = clustered_boxes(n)
        idxs = torch.randint(0, classes, (n,))
        if classes == 1:
            yield (
                f"nms {n}",
                lambda b=boxes, s=scores: opforge.nms(b, s, 0.5),
                lambda b=boxes, s=scores: tv.nms(b, s, 0.5),
            )
        else:
            yield (
                f"batched_nms {n} x {classes}",
                lambda b=boxes, s=scores, i=idxs: opforge.batched_nms(b, s, i, 0.5),
                lambda b=boxes, s=scores, i=idxs: tv.batched_nms(b, s, i, 0.5),
            )
    boxes, scores = uniform_boxes(800)
    yield "nms 800 thr -0.5", lambda: opforge.nms(boxes, scores, -0.5), lambda: tv.nms(boxes, scores, -0.5)
    for n in (1 << 12, 1 << 16, 1 << 18, 1 << 20):
        a, b = torch.randn(n), torch.randn(n)
        yield f"vector_add {n}", lambda a=a, b=b: opforge.vector_add(a, b), lambda a=a, b=b: torch.add(a, b)
    for s in (32, 64, 96, 128, 192, 256):
        a, b = torch.randn(s, s), torch.randn(s, s)
        yield f"matmul {s}^3", lambda a=a, b=b: opforge.matmul(a, b), lambda a=a, b=b: torch.matmul(a, b)


def main() -> int:
    rows = {}
    for name, ours, peer in cases():
        rows[name] = [wall_median_ms(ours), wall_median_ms(peer)]
    neighbours = [subprocess.Popen([sys.executable, "-c", code]) for code in NEIGHBOURS]
    try:
        time.sleep(1.0)
        for name, ours, peer in cases():
            rows[name] += [wall_median_ms(ours), wall_median_ms(peer)]
    finally:
        for p in neighbours:
            p.kill()
    print(
        f"{'case':<26} {'quiet: ours':>12} {'peer':>9} {'x':>7} | {'loaded: ours':>12} {'peer':>9} {'x':>7}"
    )
    for name, (oq, pq, ol, pl) in rows.items():
        print(
            f"{name:<26} {oq:10.3f}ms {pq:7.3f}ms {pq / oq:6.2f}x | {ol:10.3f}ms {pl:7.3f}ms {pl / ol:6.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
