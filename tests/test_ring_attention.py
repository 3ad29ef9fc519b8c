"""opforge.distributed.ring_attention on the CPU with 2, 3 and 4 gloo processes: output and gradients
equal single-process opforge.attention on the whole sequence in float64 (causal with and without load
balance, full, GQA, sliding windows, two-sided windows, softcap, a v head dim of its own); the errors;
opforge.attention refusing DTensors and calls inside torch's context_parallel(). The ring's planning
(which products a step computes, and how many steps) is checked against a dense mask on one process."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.multiprocessing as mp
from ring_cases import worker

from opforge.distributed.layout import segments
from opforge.distributed.ring import plan_pairs, ring_plan


def spawn(world: int, tmp_path, *checks: str) -> None:
    mp.spawn(worker, args=(world, str(tmp_path / "init"), checks), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_matches_one_process(world, tmp_path):
    spawn(world, tmp_path, "cases", *(("errors", "context_parallel") if world == 2 else ()))


def band_mask(q_pos, k_pos, left, right):
    d = k_pos[None, :] - q_pos[:, None]
    return (d >= -left) & (d <= right)


@pytest.mark.parametrize("world,local,lb", [(2, 12, True), (3, 8, True), (4, 6, False), (5, 4, True)])
@pytest.mark.parametrize(
    "left,right", [(math.inf, 0.0), (5.0, 0.0), (math.inf, math.inf), (7.0, 3.0), (0.0, 9.0)]
)
def test_plan_covers_the_band_exactly(world, local, lb, left, right):
    """Every (rank, step): the planned products' rows x keys under their opforge windows are exactly the
    band's visible pairs between the two shards' positions, each pair once; no step past `steps` has any."""
    steps, plans = ring_plan(world, local, lb, left, right)
    pos = [
        torch.tensor([s + i for s, n in segments(r, world, local, lb) for i in range(n)])
        for r in range(world)
    ]
    last = 0
    for r, s in itertools.product(range(world), range(world)):
        src = (r - s) % world
        want = band_mask(pos[r], pos[src], left, right)
        got = torch.zeros_like(want, dtype=torch.int64)
        for p in plans[r][s]:
            lq, lk = p.q1 - p.q0, p.k1 - p.k0
            wl, wr = (math.inf, math.inf) if p.window is None else p.window
            wl = math.inf if wl is None else wl
            wr = math.inf if wr is None else wr
            i = torch.arange(lq)[:, None] + lk - lq  # (bottom-right: query i at key position i + lk - lq)
            j = torch.arange(lk)[None, :]
            got[p.q0 : p.q1, p.k0 : p.k1] += ((j - i >= -wl) & (j - i <= wr)).long()
        assert torch.equal(got, want.long()), (r, s, plans[r][s])
        if want.any():
            last = max(last, s)
    assert steps == last + 1


def test_plan_pairs_are_merged_and_skipped():
    """Load-balanced causal: a step against an earlier rank's block is one product of all queries
    against its first chunk; against a later rank's, the second chunk's queries against the whole
    block; the own block's three products (two diagonals and one full)."""
    runs = [segments(r, 4, 8, True) for r in range(4)]
    assert plan_pairs(runs[2], runs[1], math.inf, 0.0) == (plan_pairs(runs[2], runs[1], math.inf, 0.0)[0],)
    (p,) = plan_pairs(runs[2], runs[1], math.inf, 0.0)
    assert (p.q0, p.q1, p.k0, p.k1, p.window) == (0, 8, 0, 4, None)
    (p,) = plan_pairs(runs[1], runs[2], math.inf, 0.0)
    assert (p.q0, p.q1, p.k0, p.k1, p.window) == (4, 8, 0, 8, None)
    assert len(plan_pairs(runs[1], runs[1], math.inf, 0.0)) == 3
    assert plan_pairs(runs[0], runs[3], 2.0, 0.0) == ()  # (a window that reaches no key of the block)
