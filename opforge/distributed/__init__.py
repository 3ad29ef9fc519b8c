"""opforge.distributed: attention across GPUs (context parallelism) on torch.distributed.

- ring_attention: exact attention over a sequence sharded along its positions across a process
  group's ranks (K / V blocks travel around the ring; the backward is a ring too);
- shard / unshard: the sequence layout it takes (load-balanced chunks r and 2 W - 1 - r by default);
(opforge.attention refuses DTensor operands and calls inside torch's context_parallel(), pointing
here: opforge/ops/attention/sharded.py.)

docs/distributed.md has a torchrun example, the memory and communication per rank, and FSDP2.
"""

from opforge.distributed.layout import shard, unshard
from opforge.distributed.ring import ring_attention

__all__ = ["ring_attention", "shard", "unshard"]
