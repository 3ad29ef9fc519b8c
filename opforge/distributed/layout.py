"""The sequence layout of context parallelism: which global positions each rank's shard holds, and
shard / unshard between a whole sequence and the shards.

With load balance (the default) the sequence is cut into 2 W chunks of S / (2 W) positions and rank r
holds chunks r and 2 W - 1 - r, in that order: under a causal mask every rank then has the same work
(an early chunk sees few keys, its partner near the end many). Without it rank r holds chunk r of W.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

SHARD_OP = "opforge.distributed.shard"
UNSHARD_OP = "opforge.distributed.unshard"


def group_rank_size(op: str, group) -> tuple[int, int]:
    """(rank, world size) in `group` (None: the default group), which must be initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"{op}: torch.distributed is not initialised: call torch.distributed.init_process_group "
            "(torchrun sets up its environment) first"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def segments(rank: int, world: int, local_len: int, load_balance: bool) -> list[tuple[int, int]]:
    """The (global start, length) runs of positions that `rank`'s shard of `local_len` positions holds,
    in the shard's order."""
    if load_balance:
        c = local_len // 2
        return [(rank * c, c), ((2 * world - 1 - rank) * c, c)]
    return [(rank * local_len, local_len)]


def _check_dim(op: str, x, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a tensor, got {type(x).__name__}")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: dim {dim} is out of range for a {x.dim()}-D tensor")
    return dim % x.dim()


def shard(x: torch.Tensor, dim: int = 2, group=None, load_balance: bool = True) -> torch.Tensor:
    """This rank's shard of the whole sequence `x` (the same tensor on every rank) along `dim` (2: the
    sequence dim of (B, H, S, D)): with load balance chunks r and 2 W - 1 - r of 2 W, else chunk r of
    W. The length must be a multiple of 2 W (W without load balance). Differentiable."""
    dim = _check_dim(SHARD_OP, x, dim)
    rank, world = group_rank_size(SHARD_OP, group)
    chunks = 2 * world if load_balance else world
    n = x.shape[dim]
    if n % chunks:
        raise ValueError(
            f"{SHARD_OP}: the sequence length {n} must be a multiple of {chunks} "
            f"({'2 x ' if load_balance else ''}the world size {world}{', with load balance' if load_balance else ''}): "
            "pad it (and mask the padding) first"
        )
    c = n // chunks
    if load_balance:
        return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (chunks - 1 - rank) * c, c)], dim)
    return x.narrow(dim, rank * c, c).contiguous()


def unshard(x: torch.Tensor, dim: int = 2, group=None, load_balance: bool = True) -> torch.Tensor:
    """The whole sequence from every rank's shard `x` along `dim` (shard's inverse; a collective: every
    rank calls it, with shards of one shape). Differentiable (the gradient goes back to each shard)."""
    dim = _check_dim(UNSHARD_OP, x, dim)
    _, world = group_rank_size(UNSHARD_OP, group)
    if load_balance and x.shape[dim] % 2:
        raise ValueError(
            f"{UNSHARD_OP}: a load-balanced shard holds two equal chunks: its length along dim {dim} must be "
            f"even, got {x.shape[dim]}"
        )
    x = x.contiguous()
    if x.requires_grad and torch.is_grad_enabled():
        import torch.distributed.nn.functional as dist_fn  # (autograd-aware collectives)

        parts = list(dist_fn.all_gather(x, group=group))
    else:
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
    if not load_balance:
        return torch.cat(parts, dim)
    c = x.shape[dim] // 2
    first = [p.narrow(dim, 0, c) for p in parts]
    second = [p.narrow(dim, c, c) for p in reversed(parts)]
    return torch.cat(first + second, dim)
