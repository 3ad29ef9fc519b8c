"""opforge.distributed.ring_attention: exact attention over a sequence sharded across the ranks of a
process group (context parallelism), on torch.distributed's point-to-point ops.

Each rank holds its queries, keys and values (layout.segments: with load balance two chunks, else one).
The K / V blocks travel around the ring (rank r sends to r + 1, receives from r - 1) while each rank
attends its queries to the block it holds: step s holds the block of rank r - s. A step's products
are planned on global positions (plan_pairs): for each (query run, key run) of the two shards, the
rows and keys the band (causal, window) leaves visible, and the opforge.attention call that computes
exactly them (a window relative to the trimmed runs); blocks no query of the rank sees are skipped,
and the ring stops after the last step any rank needs. The partial outputs merge by their log-sum-
exp. The next block's transfer is posted before the step's products, so that it overlaps them.

The backward is a ring too, with the global output and LSE: each step's products give dq and the
block's dk, dv (opforge.attention_backward on the same trimmed runs); dk / dv accumulate as they
travel with the block (the previous holder's sum arrives while this rank computes its own part) and
go back to their owner at the end. GQA blocks carry the kv heads only. Partial outputs and gradients
accumulate in float32 (float64 for float64 inputs); dk / dv travel in it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from opforge.distributed.layout import group_rank_size, segments
from opforge.ops._common import require_tensor
from opforge.ops.attention.api import attention
from opforge.ops.attention.checks import pattern_args, scale_and_softcap, window_args

OP = "opforge.distributed.ring_attention"
INF = math.inf


@dataclass(frozen=True)
class Pair:
    """One product of a step: local query rows [q0, q1) against the held block's keys [k0, k1), under
    opforge.attention's window (None: every key)."""

    q0: int
    q1: int
    k0: int
    k1: int
    window: tuple[int | None, int | None] | None


def plan_pairs(q_runs, k_runs, left: float, right: float) -> tuple[Pair, ...]:
    """The products between a shard's queries (runs of (global start, length)) and a block's keys under
    the band key - query in [-left, right] (inf: unbounded). Each (query run, key run) pair is trimmed
    to the queries that see a key and the keys a query sees; opforge.attention aligns the trimmed
    runs' ends (bottom-right), so the band becomes the window (left + K_last - P_last, right + P_last -
    K_last), both sides >= 0 after the trim. Unbounded products of adjacent runs are merged."""
    pairs = []
    qo = 0
    for qs, lq in q_runs:
        ko = 0
        for ks, lk in k_runs:
            p0, p1 = max(qs, ks - right), min(qs + lq - 1, ks + lk - 1 + left)
            k0, k1 = max(ks, qs - left), min(ks + lk - 1, qs + lq - 1 + right)
            if p0 <= p1 and k0 <= k1:
                p0, p1, k0, k1 = int(p0), int(p1), int(k0), int(k1)
                # (a side that excludes no key of the trimmed runs is unbounded: query i' of lq' sees
                # keys i' + lk' - lq' - l .. + r, so l >= lk' - 1 and r >= lq' - 1 exclude none)
                lw, rw = left + k1 - p1, right + p1 - k1
                lw = None if lw >= k1 - k0 else int(lw)
                rw = None if rw >= p1 - p0 else int(rw)
                window = None if lw is None and rw is None else (lw, rw)
                pairs.append(Pair(qo + p0 - qs, qo + p1 - qs + 1, ko + k0 - ks, ko + k1 - ks + 1, window))
            ko += lk
        qo += lq
    return _merge_full(pairs)


def _merge_full(pairs: list[Pair]) -> tuple[Pair, ...]:
    """Unbounded products over the same rows and adjacent keys (or the same keys and adjacent rows)
    as one."""
    pairs = list(pairs)
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(pairs):
            for j, b in enumerate(pairs):
                if i == j or a.window is not None or b.window is not None:
                    continue
                if (a.q0, a.q1) == (b.q0, b.q1) and a.k1 == b.k0:
                    pairs[i] = Pair(a.q0, a.q1, a.k0, b.k1, None)
                elif (a.k0, a.k1) == (b.k0, b.k1) and a.q1 == b.q0:
                    pairs[i] = Pair(a.q0, b.q1, a.k0, a.k1, None)
                else:
                    continue
                del pairs[j]
                merged = True
                break
            if merged:
                break
    return tuple(pairs)


@functools.lru_cache(maxsize=64)
def ring_plan(world: int, local_len: int, load_balance: bool, left: float, right: float):
    """(steps, plans): the ring's step count (one past the last step at which any rank has a
    product) and plans[r][s], rank r's products at step s (against rank (r - s) % world's block)."""
    runs = [segments(r, world, local_len, load_balance) for r in range(world)]
    plans = [
        [plan_pairs(runs[r], runs[(r - s) % world], left, right) for s in range(world)] for r in range(world)
    ]
    steps = 1 + max((s for r in range(world) for s in range(world) if plans[r][s]), default=0)
    return steps, plans


@dataclass(frozen=True)
class RingSpec:
    group: object
    rank: int
    world: int
    peers: tuple[int, ...]  # (the group's ranks as global ranks, for the point-to-point ops)
    steps: int
    plan: tuple[tuple[Pair, ...], ...]  # (this rank's products a step)
    scale: float
    softcap: float
    through_host: bool  # (gloo: device tensors travel through host memory)


class _Staged:
    """A receive through host memory (a backend without device point-to-point ops: gloo with CUDA
    tensors): the transfer's requests, then the host buffers copied into the device ones."""

    def __init__(self, reqs, host, dst):
        self.reqs, self.host, self.dst = reqs, host, dst

    def wait(self) -> None:
        for r in self.reqs:
            r.wait()
        for h, d in zip(self.host, self.dst, strict=True):
            d.copy_(h)


def _exchange(spec: RingSpec, send, recv, shift: int = 1):
    """Posts sending `send` to rank + shift and receiving `recv` from rank - shift; the requests."""
    to, frm = spec.peers[(spec.rank + shift) % spec.world], spec.peers[(spec.rank - shift) % spec.world]
    host = spec.through_host and send[0].device.type != "cpu"
    if host:
        send = [t.cpu() for t in send]
        dst, recv = recv, [torch.empty(t.shape, dtype=t.dtype) for t in recv]
    ops = [dist.P2POp(dist.isend, t, to, spec.group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, frm, spec.group) for t in recv]
    reqs = dist.batch_isend_irecv(ops)
    return [_Staged(reqs, recv, dst)] if host else reqs


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _merge(out, lse, o, lse_o, q0: int, q1: int) -> None:
    """Rows [q0, q1) of the running (out, lse) combined with a product's (o, lse_o) by log-sum-exp
    (rows that saw nothing in either keep their zeros and -inf)."""
    lo = lse[:, :, q0:q1]
    new = torch.logaddexp(lo, lse_o)
    none = new == -INF
    a = torch.where(none, 0.0, torch.exp(lo - new)).unsqueeze(-1)
    b = torch.where(none, 0.0, torch.exp(lse_o - new)).unsqueeze(-1)
    out[:, :, q0:q1] = out[:, :, q0:q1] * a + o.to(out.dtype) * b
    lse[:, :, q0:q1] = new


def _ring_forward(q, k, v, spec: RingSpec):
    acc = _acc_dtype(q)
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=acc, device=q.device)
    lse = torch.full(q.shape[:3], -INF, dtype=acc, device=q.device)
    kv = (k, v)
    for s in range(spec.steps):
        reqs = None
        if s + 1 < spec.steps:
            nxt = (torch.empty_like(k), torch.empty_like(v))
            reqs = _exchange(spec, kv, nxt)
        for p in spec.plan[s]:
            o, lo = attention(
                q[:, :, p.q0 : p.q1],
                kv[0][:, :, p.k0 : p.k1],
                kv[1][:, :, p.k0 : p.k1],
                window=p.window,
                scale=spec.scale,
                softcap=spec.softcap or None,
                return_lse=True,
            )
            _merge(out, lse, o, lo.to(acc), p.q0, p.q1)
        if reqs is not None:
            _wait(reqs)
            kv = nxt
    return out.to(q.dtype), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _ring_backward(grad_out, q, k, v, out, lse, spec: RingSpec):
    acc = _acc_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = (k, v)
    dk = dv = None
    pending = None  # (the previous holder's dk / dv of the block arriving: requests, buffers)
    for s in range(spec.steps):
        reqs = None
        if s + 1 < spec.steps:
            nxt = (torch.empty_like(k), torch.empty_like(v))
            reqs = _exchange(spec, kv, nxt)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for p in spec.plan[s]:
            qs, ks = slice(p.q0, p.q1), slice(p.k0, p.k1)
            kq = q[:, :, qs]
            args = pattern_args(kq, kv[0][:, :, ks], False, p.window, None, None, None)
            gq, gk, gv, _ = torch.ops.opforge.attention_backward.default(
                grad_out[:, :, qs],
                kq,
                kv[0][:, :, ks],
                kv[1][:, :, ks],
                out[:, :, qs],
                lse[:, :, qs].contiguous(),
                None,
                spec.scale,
                spec.softcap,
                *args,
            )
            dq[:, :, qs] += gq
            dk[:, :, ks] += gk
            dv[:, :, ks] += gv
        if pending is not None:
            _wait(pending[0])
            dk += pending[1][0]
            dv += pending[1][1]
            pending = None
        if s + 1 < spec.steps:
            buf = (torch.empty_like(dk), torch.empty_like(dv))
            pending = (_exchange(spec, (dk, dv), buf), buf)
        if reqs is not None:
            _wait(reqs)
            kv = nxt
    shift = (spec.steps - 1) % spec.world
    if shift:  # (the held block's dk / dv back to its owner, rank - (steps - 1))
        home = (torch.empty_like(dk), torch.empty_like(dv))
        _wait(_exchange(spec, (dk, dv), home, -shift))
        dk, dv = home
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec):
        out, lse = _ring_forward(q, k, v, spec)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(grad_out.contiguous(), q, k, v, out, lse, ctx.spec)
        return dq, dk, dv, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    load_balance: bool = True,
) -> torch.Tensor:
    """Attention over a sequence sharded along dim 2 across the ranks of `group`, exact: each rank
    passes its shard (opforge.distributed.shard's layout) and gets its queries' output.

    Args:
        q: (B, Hq, S_local, D); k, v: (B, Hkv, S_local, D) / (..., Dv) (Hq a multiple of Hkv), this
            rank's shard of the whole sequence (self-attention: queries and keys share positions). Every
            rank passes tensors of the same shapes, dtype and device type (CUDA with NCCL, the CPU with
            gloo). Any dtype opforge.attention takes on that device.
        group: the process group (None: the default one).
        causal, window, softcap, scale: as opforge.attention's, on the whole sequence's positions.
        load_balance: the shards hold chunks r and 2 W - 1 - r of 2 W (default; even work under a
            causal mask; S_local must be even), else chunk r of W. It must match how the sequence was
            sharded.

    Returns:
        (B, Hq, S_local, Dv) in q's dtype, differentiable in q, k and v (the backward is a ring too).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(OP, name, t)
        if t.dim() != 4:
            raise RuntimeError(
                f"{OP}: {name} must be 4-D (batch, heads, local sequence, head_dim), got {t.dim()}-D"
            )
    if q.shape[2] != k.shape[2] or k.shape[2] != v.shape[2]:
        raise RuntimeError(
            f"{OP}: q, k and v must hold the same positions (a shard of one sequence: self-attention), got "
            f"{q.shape[2]}, {k.shape[2]} and {v.shape[2]} along dim 2"
        )
    for name, flag in (("causal", causal), ("load_balance", load_balance)):
        if not isinstance(flag, bool):
            raise TypeError(f"{OP}: {name} must be a bool, got {type(flag).__name__}")
    left, right = window_args(OP, window)
    scale, softcap = scale_and_softcap(OP, q, scale, softcap)
    rank, world = group_rank_size(OP, group)
    n = q.shape[2]
    if load_balance and n % 2:
        raise ValueError(
            f"{OP}: with load_balance=True a shard holds two equal chunks (chunks r and 2 W - 1 - r): its "
            f"length must be even, got {n} (shard the sequence with opforge.distributed.shard, whose length "
            "must be a multiple of 2 x the world size)"
        )
    band_left = INF if left < 0 else float(left)
    band_right = 0.0 if causal else INF if right < 0 else float(right)  # (causal: no key after the query)
    steps, plans = ring_plan(world, n, load_balance, band_left, band_right)
    peers = tuple(dist.get_global_rank(group, r) if group is not None else r for r in range(world))
    through_host = dist.get_backend(group) == "gloo"
    spec = RingSpec(
        group,
        rank,
        world,
        peers,
        steps,
        tuple(plans[rank][:steps]),
        float(scale),
        float(softcap),
        through_host,
    )
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), spec)
