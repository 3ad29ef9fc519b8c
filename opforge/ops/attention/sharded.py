"""What keeps opforge.attention from silently computing shard-local attention under context
parallelism: DTensor inputs, and calls inside torch.distributed.tensor.experimental.context_parallel()
(which patches only torch.nn.functional.scaled_dot_product_attention, so that an opforge call inside it
would see the rank's own shard of the keys), raise with a message that points to ring_attention.

Read from sys.modules: nothing is imported, and a process that never loaded torch.distributed's
tensor packages pays two dictionary lookups a call."""

from __future__ import annotations

import sys

import torch

# (torch 2.11's module and the one after its move)
_CP_MODULES = (
    "torch.distributed.tensor.experimental._context_parallel._attention",
    "torch.distributed.tensor.experimental._attention",
)
_HINT = (
    "use opforge.distributed.ring_attention(q, k, v, group=...) on each rank's shard (the sequence sharded "
    "with opforge.distributed.shard; docs/distributed.md)"
)


def context_parallel_active() -> bool:
    """Whether torch's context_parallel() has scaled_dot_product_attention patched right now."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for name in _CP_MODULES:
        replaced = getattr(sys.modules.get(name), "_replaced_functions", None)
        if replaced and sdpa in replaced:
            return True
    return False


def check_not_sharded(op: str, *tensors) -> None:
    """A TypeError for DTensor operands, a RuntimeError inside context_parallel()."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is not None:
        for t in tensors:
            if isinstance(t, dtensor):
                raise TypeError(
                    f"{op}: got a DTensor ({t.placements}); opforge.attention computes on local tensors, and on a "
                    f"sequence-sharded DTensor it would attend to the local shard only: {_HINT}"
                )
    if context_parallel_active():
        raise RuntimeError(
            f"{op}: called inside torch.distributed.tensor.experimental.context_parallel(), which routes only "
            "scaled_dot_product_attention to its ring: this call would attend to the rank's own shard of the "
            f"keys; {_HINT}"
        )
