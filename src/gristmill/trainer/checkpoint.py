"""Checkpoints with torch.distributed.checkpoint (DCP), torchtitan style.

Saved as `Stateful` objects: `app` (model + optimizer through `get_state_dict`/`set_state_dict`,
so sharded FSDP2 state is saved per shard and can be loaded on another number of ranks),
`scheduler`, `data` (the global consumed-samples counter) and `rng`. Each checkpoint is written
to `step-NNNNNNNN.tmp/` and renamed to `step-NNNNNNNN/` by rank 0 once every rank has finished
(a crash mid-save never leaves a directory that looks complete); then all but the last `keep`
are deleted. `meta.json` inside holds the step, the train config and the model shape (what
`export-hf` needs).

Integrity: the last file written into a checkpoint is `checksums.json` (size and sha256 of every
other file; written to a temporary name and renamed, so it is complete or absent). A resume
takes the newest checkpoint whose files all match it and says, one line each, which newer ones
it skipped and why: a disk that fills or a node that dies mid-copy leaves truncated files, and a
flipped bit in a `.distcp` file loads without any error and poisons the weights. Without
checksums.json a checkpoint is incomplete. With several ranks, rank 0 lists the checkpoints and
reads their checksums.json, every rank hashes a share of the files, and all see all results, so
every rank takes the same checkpoint.

RNG: the trainer draws no random numbers after init (no dropout), and rank 0's CPU/CUDA
generator states are saved as one replicated entry, so a resume on a different world size loads
the same entry on every rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

_STEP = re.compile(r"^step-(\d{8})$")
CHECKSUMS = "checksums.json"


class CheckpointError(ValueError):
    """No intact checkpoint to resume from, or a named checkpoint that fails its checksums."""


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
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


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
    """A checkpoint directory (checked against its checksums), or a train output / checkpoints
    directory → its newest intact checkpoint (skipped ones reported on stderr)."""
    path = Path(path)
    if (path / "meta.json").is_file():
        why = problem(path)
        if why:
            raise CheckpointError(f"checkpoint {path}: {why}")
        return path
    for candidate in (path / "checkpoints", path):
        if step_dirs(candidate):
            return newest_intact(candidate)
    raise FileNotFoundError(f"{path}: no checkpoint (expected step-NNNNNNNN/ with meta.json)")


# --- integrity -------------------------------------------------------------------------------
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _from_main(obj):
    """Rank 0's `obj` on every rank (the file system may show ranks on other nodes a stale view)."""
    if _rank_world()[1] > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return obj


def _everyone(obj) -> list:
    world = _rank_world()[1]
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def _hash_shared(root: Path, names: list[str]) -> dict[str, dict]:
    """{name: {size, sha256}} of `names` under `root`, each rank hashing every world-th file."""
    rank, world = _rank_world()
    mine = {n: {"size": (root / n).stat().st_size, "sha256": _sha256(root / n)} for n in names[rank::world]}
    return {k: v for part in _everyone(mine) for k, v in part.items()}


def _write_checksums(root: Path, step: int, files: dict[str, dict]) -> None:
    tmp = root / (CHECKSUMS + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(root / CHECKSUMS)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_checksums(path: Path) -> dict | str:
    """checksums.json's file table, or why it cannot be used."""
    f = path / CHECKSUMS
    if not f.is_file():
        return f"no {CHECKSUMS} (the save did not finish, or it was written before checkpoints carried checksums)"
    try:
        files = json.loads(f.read_text())["files"]
        if not files or not all(
            isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str) for v in files.values()
        ):
            raise ValueError("no file entries of {size, sha256}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{CHECKSUMS} unreadable ({e})"
    return files


def _file_problem(root: Path, name: str, want: dict) -> str | None:
    path = root / name
    if not path.is_file():
        return f"{name} missing"
    size = path.stat().st_size
    if size != want["size"]:
        return f"{name} is {size:,} bytes, {CHECKSUMS} says {want['size']:,} (truncated or overwritten)"
    if _sha256(path) != want["sha256"]:
        return f"{name} sha256 mismatch"
    return None


def problem(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None when every file matches
    checksums.json. Collective with a process group: every rank gets the same answer."""
    rank, world = _rank_world()
    table = _from_main(_read_checksums(path) if rank == 0 else None)
    if isinstance(table, str):
        return table
    names = sorted(table)
    mine = [(i, why) for i in range(rank, len(names), world) if (why := _file_problem(path, names[i], table[names[i]]))]
    found = sorted(p for part in _everyone(mine) for p in part)
    if not found:
        return None
    return found[0][1] + (f" (and {len(found) - 1} more files)" if len(found) > 1 else "")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def newest_intact(ckpt_dir: Path, say: Callable[[str], None] = _stderr) -> Path | None:
    """The newest checkpoint in `ckpt_dir` that passes `problem()`; None when there is none at all.
    Each newer one is reported through `say` on rank 0 ("checkpoint step-…: why; skipped").
    Raises CheckpointError when checkpoints exist but none is intact. Collective with a process group."""
    rank, _ = _rank_world()
    names = _from_main([p.name for _, p in step_dirs(ckpt_dir)] if rank == 0 else None)
    for name in reversed(names):
        why = problem(ckpt_dir / name)
        if why is None:
            return ckpt_dir / name
        if rank == 0:
            say(f"checkpoint {name}: {why}; skipped")
    if names:
        raise CheckpointError(
            f"{ckpt_dir}: none of its {len(names)} checkpoints is intact (reasons above); move the"
            " folder aside to train from scratch, or restore a checkpoint from a copy"
        )
    return None


def _states(model, optimizer, scheduler, loader) -> dict:
    return {"app": AppState(model, optimizer), "scheduler": _Wrap(scheduler), "data": _Wrap(loader), "rng": RNGState()}


def save(
    ckpt_dir: Path, step: int, *, model, optimizer, scheduler, loader, meta: dict, keep: int, is_main: bool
) -> Path:
    final = ckpt_dir / f"step-{step:08d}"
    tmp = ckpt_dir / f"step-{step:08d}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_states(model, optimizer, scheduler, loader), checkpoint_id=str(tmp))
    if is_main:
        (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=2))
    dist.barrier()
    sums = _hash_shared(tmp, _from_main(_files(tmp) if is_main else None))
    if is_main:
        _write_checksums(tmp, step, sums)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(ckpt_dir)
        # newer checkpoints than this one exist only when the resume skipped them as damaged:
        # they are not counted, and the save of their step replaces them
        for _, old in [sp for sp in step_dirs(ckpt_dir) if sp[0] <= step][:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: Path, *, model, optimizer, scheduler, loader) -> int:
    """Restores everything in place; returns the checkpoint's step."""
    dcp.load(_states(model, optimizer, scheduler, loader), checkpoint_id=str(path))
    return json.loads((path / "meta.json").read_text())["step"]


def load_model_state(path: Path, model) -> None:
    """Only the model weights, without a process group (export, evaluation)."""
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["app"]["model"])
