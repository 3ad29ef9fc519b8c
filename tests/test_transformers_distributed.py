"""A training step of a small Llama-type model with opforge attention under torch.distributed: DDP
and FSDP2 (fully_shard) over 2 CPU processes (gloo) give the gradients of one process on the whole
batch."""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

import opforge.integrations.transformers as otf

WORLD = 2


def _model() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double()
    model.set_attn_implementation("opforge")
    return model


def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 24), generator=g)


def _reference_grads() -> dict[str, torch.Tensor]:
    model = _model()
    ids = _batch()
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _worker(rank: int, port: int, mode: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        otf.register()
        model = _model()
        ids = _batch().chunk(WORLD)[rank]  # equal shards: the mean of shard losses is the full loss
        if mode == "ddp":
            wrapped = torch.nn.parallel.DistributedDataParallel(model)
            wrapped(ids, labels=ids).loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            del wrapped
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (WORLD,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            model(ids, labels=ids).loss.backward()
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(grads, os.path.join(out_dir, "grads.pt"))
        # Both ranks done with every collective before either tears the group down (a rank that
        # left early once ended the other's gloo thread with std::terminate).
        dist.barrier()
        del model, grads
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: after every collective completed and the group was
    # destroyed, gloo's threads still ended a rank with std::terminate (SIGABRT) while C++ statics
    # were destroyed at exit, about 1 run in 10 (an error above still raises and fails the test).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_distributed_training_step_matches_one_process(mode):
    otf.register()
    want = _reference_grads()
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(_free_port(), mode, out_dir), nprocs=WORLD, join=True)
        got = torch.load(os.path.join(out_dir, "grads.pt"))
    assert got.keys() == want.keys()
    for name, g in got.items():
        w = want[name]
        assert (g - w).abs().max().item() <= 1e-10 * max(1.0, w.abs().max().item()), name
