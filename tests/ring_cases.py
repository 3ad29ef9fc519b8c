"""The worker that tests/test_ring_attention.py spawns (a module of its own: spawned processes import
it by name). Each process joins a gloo group through a file, builds the same whole-sequence inputs
(one seed), and checks ring_attention on its shard against single-process opforge.attention on the
whole sequence in float64: the output, its shard of the gradients, and unshard of the output."""

from __future__ import annotations

import torch
import torch.distributed as dist

import opforge
from opforge.distributed import ring_attention, shard, unshard

# (name, B, Hq, Hkv, S, D, Dv, attention kwargs, load_balance)
CASES = [
    ("causal, load-balanced, GQA", 2, 4, 2, 48, 16, 16, dict(causal=True), True),
    ("causal, contiguous", 1, 2, 2, 48, 16, 16, dict(causal=True), False),
    ("full, load-balanced", 1, 2, 1, 48, 8, 16, {}, True),
    ("full, contiguous, softcap", 1, 2, 2, 48, 16, 8, dict(softcap=2.0, scale=0.3), False),
    ("sliding window 5, load-balanced", 1, 2, 1, 48, 16, 16, dict(causal=True, window=(5, 0)), True),
    ("sliding window 13, contiguous", 2, 2, 2, 48, 8, 8, dict(causal=True, window=(13, None)), False),
    ("window (7, 3), load-balanced", 1, 4, 2, 48, 16, 16, dict(window=(7, 3)), True),
    ("window (0, 9), contiguous", 1, 2, 2, 48, 16, 16, dict(window=(0, 9)), False),
]


def check_case(case, rank: int) -> None:
    name, B, Hq, Hkv, S, D, Dv, kw, lb = case
    g = torch.Generator().manual_seed(1234)
    q = torch.randn(B, Hq, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, Dv, generator=g, dtype=torch.float64)
    go = torch.randn(B, Hq, S, Dv, generator=g, dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    want = opforge.attention(*ref, **kw)
    want.backward(go)
    local = [shard(t, load_balance=lb).detach().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, load_balance=lb, **kw)
    out.backward(shard(go, load_balance=lb))
    tol = dict(atol=1e-10, rtol=1e-10, msg=lambda m: f"rank {rank}, {name}: {m}")
    torch.testing.assert_close(out, shard(want.detach(), load_balance=lb), **tol)
    for t, r in zip(local, ref, strict=True):
        torch.testing.assert_close(t.grad, shard(r.grad, load_balance=lb), **tol)
    torch.testing.assert_close(unshard(out.detach(), load_balance=lb), want.detach(), **tol)


def check_errors(rank: int, world: int) -> None:
    """Bad calls raise errors naming the op and the argument (every rank raises the same, before any
    communication)."""
    import pytest

    x = torch.randn(1, 2, 2 * world + 1, 8, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"opforge.distributed.ring_attention: with load_balance=True .* even"
    ):
        ring_attention(x, x, x)
    with pytest.raises(
        ValueError, match=r"opforge.distributed.shard: the sequence length 9 must be a multiple"
    ):
        shard(torch.zeros(1, 1, 9, 1), load_balance=True) if world > 1 else shard(torch.zeros(1, 1, 9, 1))
    y = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match=r"q, k and v must hold the same positions"):
        ring_attention(y, torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
    with pytest.raises(TypeError, match=r"causal must be a bool"):
        ring_attention(y, y, y, causal=1)
    with pytest.raises(ValueError, match=r"window sides must be ints >= 0"):
        ring_attention(y, y, y, window=(-2, 0))


def check_context_parallel_refused(world: int) -> None:
    """opforge.attention inside torch's context_parallel() and on DTensors raises, pointing to
    ring_attention, instead of attending to the local shard."""
    import pytest
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(1, 2, 4 * world, 8)
    with pytest.raises(TypeError, match=r"got a DTensor .* opforge.distributed.ring_attention"):
        d = distribute_tensor(x, mesh, [Shard(2)])
        opforge.attention(d, d, d)
    buf = torch.randn(1, 2, 4 * world, 8)
    with context_parallel(mesh, buffers=[buf], buffer_seq_dims=[2]):
        with pytest.raises(
            RuntimeError, match=r"inside torch.distributed.tensor.experimental.context_parallel"
        ):
            opforge.attention(buf, buf, buf)
        with pytest.raises(RuntimeError, match=r"context_parallel\(\)"):
            opforge.attention_varlen(
                buf[0].transpose(0, 1),
                buf[0].transpose(0, 1),
                buf[0].transpose(0, 1),
                torch.tensor([0, 4 * world], dtype=torch.int32),
                torch.tensor([0, 4 * world], dtype=torch.int32),
            )
    opforge.attention(x, x, x)  # (after the context: computed)


def worker(rank: int, world: int, init_file: str, checks: tuple[str, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        if "cases" in checks:
            for case in CASES:
                check_case(case, rank)
        if "errors" in checks:
            check_errors(rank, world)
        if "context_parallel" in checks:
            check_context_parallel_refused(world)
    finally:
        dist.destroy_process_group()


def check_cuda_case(rank: int, world: int, kw: dict, lb: bool) -> None:
    """bfloat16 on the GPU: the ring's output and gradients within bfloat16's error of the float64
    attention of the same values (the whole sequence, one process, on the CPU)."""
    g = torch.Generator().manual_seed(99)
    B, Hq, Hkv, S, D = 1, 4, 2, 512, 64
    q, k, v, go = (torch.randn(B, h, S, D, generator=g).to(torch.bfloat16) for h in (Hq, Hkv, Hkv, Hq))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    want = opforge.attention(*ref, **kw)
    want.backward(go.double())
    dev = torch.device("cuda", torch.cuda.current_device())
    local = [shard(t, load_balance=lb).to(dev).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*local, load_balance=lb, **kw)
    out.backward(shard(go, load_balance=lb).to(dev))
    tol = dict(atol=3e-2, rtol=3e-2, msg=lambda m: f"rank {rank}, {kw}, load_balance={lb}: {m}")
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), shard(want.detach(), load_balance=lb), **tol)
    for t, r in zip(local, ref, strict=True):
        torch.testing.assert_close(t.grad.double().cpu(), shard(r.grad, load_balance=lb), **tol)


def cuda_worker(rank: int, world: int, init_file: str, backend: str) -> None:
    """On the one GPU: world size 1 over NCCL, or several processes over gloo (the device tensors then
    travel through host memory)."""
    torch.cuda.set_device(0)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for kw, lb in (
            (dict(causal=True), True),
            (dict(causal=True), False),
            ({}, True),
            (dict(causal=True, window=(100, 0)), True),
        ):
            check_cuda_case(rank, world, kw, lb)
    finally:
        dist.destroy_process_group()
