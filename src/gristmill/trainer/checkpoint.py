"""Checkpoints with torch.distributed.checkpoint (DCP), torchtitan style.

Saved as `Stateful` objects: `app` (model + optimizer through `get_state_dict`/`set_state_dict`,
so sharded FSDP2 state is saved per shard and can be loaded on another number of ranks),
`scheduler`, `data` (the global consumed-samples counter) and `rng`. Each checkpoint is written
to `step-NNNNNNNN.tmp/` and renamed to `step-NNNNNNNN/` by rank 0 once every rank has finished
(a crash mid-save never leaves a directory that looks complete); then all but the last `keep`
are deleted. `meta.json` inside holds the step, the train config and the model shape (what
`export-hf` needs).

RNG: the trainer draws no random numbers after init (no dropout), and rank 0's CPU/CUDA
generator states are saved as one replicated entry, so a resume on a different world size loads
the same entry on every rank.
"""

from __future__ import annotations

import json
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

_STEP = re.compile(r"^step-(\d{8})$")


class AppState(Stateful):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def _fp32(self):
        """With master weights (optim.MasterAdamW) the state dicts hold the fp32 masters."""
        return getattr(self.optimizer, "fp32_params", nullcontext)()

    def state_dict(self):
        with self._fp32():
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state):
        with self._fp32():
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])


class RNGState(Stateful):
    def state_dict(self):
        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        # one value for all ranks: broadcast rank 0's, so the replicated entry is consistent
        if dist.is_initialized() and dist.get_world_size() > 1:
            objs = [state]
            dist.broadcast_object_list(objs, src=0)
            state = objs[0]
        return state

    def load_state_dict(self, state):
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


class _Wrap(Stateful):
    """An object with state_dict/load_state_dict (scheduler, data loader) as a DCP Stateful."""

    def __init__(self, obj):
        self.obj = obj

    def state_dict(self):
        return self.obj.state_dict()

    def load_state_dict(self, state):
        self.obj.load_state_dict(state)


def step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest(ckpt_dir: Path) -> Path | None:
    dirs = step_dirs(ckpt_dir)
    return dirs[-1][1] if dirs else None


def resolve(path: str | Path) -> Path:
    """A checkpoint directory, or a train output / checkpoints directory → its latest checkpoint."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return path
    for candidate in (path / "checkpoints", path):
        found = latest(candidate)
        if found is not None:
            return found
    raise FileNotFoundError(f"{path}: no checkpoint (expected step-NNNNNNNN/ with meta.json)")


def _states(model, optimizer, scheduler, loader) -> dict:
    return {"app": AppState(model, optimizer), "scheduler": _Wrap(scheduler), "data": _Wrap(loader),
            "rng": RNGState()}


def save(ckpt_dir: Path, step: int, model, optimizer, scheduler, loader, meta: dict, keep: int, is_main: bool) -> Path:
    final = ckpt_dir / f"step-{step:08d}"
    tmp = ckpt_dir / f"step-{step:08d}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_states(model, optimizer, scheduler, loader), checkpoint_id=str(tmp))
    dist.barrier()
    if is_main:
        (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for _, old in step_dirs(ckpt_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: Path, model, optimizer, scheduler, loader) -> int:
    """Restores everything in place; returns the checkpoint's step."""
    dcp.load(_states(model, optimizer, scheduler, loader), checkpoint_id=str(path))
    return json.loads((path / "meta.json").read_text())["step"]


def load_model_state(path: Path, model) -> None:
    """Only the model weights, without a process group (export, evaluation)."""
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["app"]["model"])
