"""opforge.distributed.ring_attention on the GPU (bfloat16, the CUDA kernels): with one GPU, world
size 1 over NCCL and two processes over gloo (device tensors through host memory), against the float64
attention of the whole sequence: causal with and without load balance, full, a sliding window. (The
scaling across GPUs needs a machine with several: benchmarks/tuning/distributed/ring_scaling.py.)"""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp
from ring_cases import cuda_worker

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("backend,world", [("nccl", 1), ("gloo", 2)])
def test_ring_attention_cuda(backend, world, tmp_path):
    mp.spawn(cuda_worker, args=(world, str(tmp_path / "init"), backend), nprocs=world, join=True)
