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

Contents: checksums prove the files are the ones written, not that they fit this run. `load`
checks first that meta.json's step is the one in the directory's name and in checksums.json and
not beyond the config's `steps`, and that every model parameter is in the checkpoint with the
model's shape (from DCP's `.metadata`, before anything is read: a checkpoint of another model
size otherwise fails deep inside DCP, or loads part of a larger model without a word); after the
load, that the scheduler is at that step and that no weight or optimizer moment is NaN or
infinite. Each is a CheckpointError naming the checkpoint; nothing on disk is changed.

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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict
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


# --- contents ---------------------------------------------------------------------------------
def read_step(path: Path) -> int:
    """meta.json's step, which must be the step of the directory's name and of checksums.json."""
    try:
        step = json.loads((path / "meta.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path}: meta.json unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"checkpoint {path}: meta.json step {step!r} is not a step number")
    named = int(m.group(1)) if (m := _STEP.match(path.name)) else step
    try:
        summed = json.loads((path / CHECKSUMS).read_text()).get("step", step)
    except (OSError, ValueError, AttributeError):
        summed = step  # problem() has judged checksums.json already
    if named != step or summed != step:
        raise CheckpointError(
            f"checkpoint {path}: meta.json says step {step}, but the directory is {path.name} and"
            f" {CHECKSUMS} says step {summed}: meta.json was edited or copied from another checkpoint"
        )
    return step


def _shape(size) -> str:
    return "[" + ", ".join(map(str, size)) + "]"


def check_fits(path: Path, model_state: dict) -> None:
    """Every tensor of `model_state` (a model state dict: global shapes, also for FSDP's DTensors)
    is in the checkpoint's `.metadata` with its shape, and the checkpoint holds no model tensor
    beyond them. Reads `.metadata` only; raises CheckpointError naming the first difference."""
    try:
        saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - an unpickling failure can be of any type
        raise CheckpointError(f"checkpoint {path}: .metadata unreadable ({type(e).__name__}: {e})") from None
    prefix = "app.model."
    found = []
    for name, tensor in model_state.items():
        meta = saved.get(prefix + name)
        if meta is None:
            found.append(f"parameter {name} is missing from the checkpoint")
        elif not isinstance(meta, TensorStorageMetadata) or tuple(meta.size) != tuple(tensor.shape):
            got = _shape(meta.size) if isinstance(meta, TensorStorageMetadata) else "no tensor"
            found.append(f"parameter {name} has shape {got} in the checkpoint, {_shape(tensor.shape)} in the model")
    extra = sorted(k[len(prefix) :] for k in saved if k.startswith(prefix) and k[len(prefix) :] not in model_state)
    found += [f"the checkpoint holds parameter {name}, the model has none of that name" for name in extra]
    if found:
        more = f" (and {len(found) - 1} more differences)" if len(found) > 1 else ""
        raise CheckpointError(f"checkpoint {path}: {found[0]}{more}: a checkpoint of another model?")


def _sums(state: dict, where: str = "") -> list[tuple[str, torch.Tensor]]:
    """(name, float32 sum of this rank's shard) of every floating tensor in a nested state dict."""
    out = []
    for key, value in state.items():
        if isinstance(value, dict):
            out += _sums(value, f"{where}{key}.")
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            local = value.to_local() if hasattr(value, "to_local") else value
            out.append((f"{where}{key}", local.sum(dtype=torch.float32)))
    return out


def _nonfinite(state: dict) -> list[str]:
    """Names of the tensors of a (nested) state dict holding NaN or inf, from this rank's shards.
    A sum is non-finite iff an element is (weights and moments are far from float32's range), and
    needs no temporary the size of the tensor; one device sync per device."""
    by_device: dict[torch.device, list] = {}
    for name, total in _sums(state):
        by_device.setdefault(total.device, []).append((name, total))
    bad = []
    for group in by_device.values():
        finite = torch.isfinite(torch.stack([t for _, t in group])).tolist()
        bad += [name for (name, _), ok in zip(group, finite) if not ok]
    return bad


def load(path: Path, *, model, optimizer, scheduler, loader, max_step: int | None = None) -> int:
    """Restores everything in place; returns the checkpoint's step. Raises CheckpointError, the
    same on every rank, when the checkpoint does not fit this run (module docstring, "Contents");
    `max_step`: the config's `steps`."""
    step = read_step(path)
    if max_step is not None and step > max_step:
        raise CheckpointError(
            f"checkpoint {path}: step {step} is beyond steps: {max_step} (a checkpoint of a longer run?"
            " train into another directory, or raise steps)"
        )
    check_fits(path, get_model_state_dict(model))
    states = _states(model, optimizer, scheduler, loader)
    try:
        dcp.load(states, checkpoint_id=str(path))
    except CheckpointException as e:  # every rank's failure, gathered by DCP: report the first
        first = next(iter(e.failures.values()))[0]
        raise CheckpointError(f"checkpoint {path}: cannot be loaded ({type(first).__name__}: {first})") from None
    except ValueError as e:  # a Stateful's own check: the data loader's seq_len and token directory
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    if scheduler.last_epoch != step:
        raise CheckpointError(
            f"checkpoint {path}: meta.json says step {step}, its scheduler state step {scheduler.last_epoch}:"
            " meta.json was edited or copied from another checkpoint"
        )
    bad = sorted({n for part in _everyone(_nonfinite(states["app"].state_dict())) for n in part})
    if bad:
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"checkpoint {path}: {bad[0]}{more} holds NaN or infinite values: training from it cannot"
            " recover; resume from an earlier checkpoint (move this one aside)"
        )
    return step


def load_model_state(path: Path, model) -> None:
    """Only the model weights, without a process group (export, evaluation)."""
    state = {"app": {"model": model.state_dict()}}
    check_fits(path, state["app"]["model"])
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["app"]["model"])
