"""Process group, and parallelism applied to the plain model from outside (torchtitan's order):
activation checkpointing, then torch.compile per block (the reverse for `ac: full`), then FSDP2
`fully_shard` per block (or group of blocks), on the embedding and the head when there is more
than one group, and at the root.

On GPU: NCCL, `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` — fp32 master weights
and optimizer state, sharded; bf16 compute. On CPU: gloo and fp32. FSDP2 on a CPU gloo mesh
works in torch 2.13 (tested, also at world size 1).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> Dist:
    """From torchrun's environment; without it, a one-process group on this machine."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT") or str(_free_port()),
        )
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=device if backend == "nccl" else None)
    return Dist(rank, world, local, device)


def apply_ac(model: nn.Module, mode: str) -> None:
    """none | full (recompute each block) | selective (per op: keep matmul and attention outputs,
    recompute norms, RoPE, SwiGLU and other cheap elementwise ops).

    With compile, `full` wraps the already compiled blocks (`train.build` compiles first): a
    checkpoint inside the compiled graph leaves the recompute to the compiler, which kept the
    outputs of our Triton kernels anyway (on an H100 at 1B: 1.52 GiB per sequence against
    2.44 without checkpointing and 0.2 expected; `benchmarks/train_memory.py`). `selective`
    must be compiled around (its policy sees each op, which a compiled block hides)."""
    if mode == "none":
        return
    from gristmill.compat.torch import attention_ops, checkpoint_wrapper

    kwargs = {"preserve_rng_state": False}
    if mode == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        from gristmill.trainer.fp8 import scaled_mm_ops

        save = {torch.ops.aten.mm.default, *scaled_mm_ops(), *attention_ops()}  # FP8 matmuls too

        def policy(ctx, op, *args, **kw):
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, policy)
    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, **kwargs)


def apply_compile(model: nn.Module) -> None:
    """Each block compiled on its own (same graph for every layer: compiled once, reused)."""
    for block in model.layers:
        block.compile(fullgraph=False)


def apply_fsdp(
    model: nn.Module, d: Dist, *, param_dtype: torch.dtype, reshard: bool = True, unit_layers: int = 1
) -> None:
    """FSDP2: `unit_layers` consecutive blocks per unit (one all-gather and one reduce-scatter
    each; fewer, larger units cost less host time per step on small models), then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(d.device.type, (d.world,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = list(model.layers)
    units = [layers[i : i + unit_layers] for i in range(0, len(layers), unit_layers)]
    for i, unit in enumerate(units):
        # the last unit's parameters are needed again at once by backward: keep them gathered
        fully_shard(
            unit if len(unit) > 1 else unit[0],
            mesh=mesh,
            mp_policy=mp,
            reshard_after_forward=reshard and i < len(units) - 1,
        )
    if model.output is not None and len(units) > 1:
        # embedding and head as units of their own (torchtitan's layout): a step starts after the
        # embedding's all-gather alone (the head's is issued during the blocks), and the head's
        # gradients (final norm + output layer, vocab × dim) are reduce-scattered beside the
        # blocks' backward, not after all of it with the root's. Not when all blocks are one unit:
        # that layout is chosen for host time, which two more units add to. Measured in
        # docs/benchmarks.md ("Where 2-GPU 1B lost its time").
        fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard([model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    # the root holds the rest: with tied embeddings, the one matrix both ends use
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
