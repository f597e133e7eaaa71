"""The run directory: resolved config, plan, one folder per stage, merged stats.

    <run_dir>/config.yaml      the configuration as run (defaults filled in)
    <run_dir>/plan.json        stages, their tasks and steps
    <run_dir>/NN_<stage>/      output/, dropped/, logs/, stats/, completions/, stats.json
    <run_dir>/stats.json       merged stats of every stage

Re-running a command finishes what is missing. It must be the same configuration: completed
tasks made with other settings would mix silently into the output, so a changed config is an
error unless `--force` (start over) is given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import yaml
from loguru import logger

from gristmill.config import ConfigError, current_layout
from gristmill.core.files import write_text_atomic
from gristmill.dirlock import LOCK_NAME

# Settings that change how or where a run goes, never what it writes (key prefixes). `run_dir`
# itself is one: a run directory moved or copied elsewhere resumes where it stopped.
_OUTPUT_NEUTRAL = ("executor.workers", "executor.type", "executor.slurm", "executor.ray", "run_dir", "storage")
# How the input's bytes arrive (streamed or cached, read size, patience): the same bytes either way.
_OUTPUT_NEUTRAL += tuple(
    f"input.commoncrawl.{k}"
    for k in ("source", "cache", "read_buffer_bytes", "timeout_s", "retries", "backoff_s")
    + ("min_rate_bytes_s", "rate_window_s", "max_object_bytes")
)
# Written by gristmill in every run directory it creates; `--force` removes nothing from a
# directory without it (or, for directories made before the marker existed, config + plan).
MARKER = ".gristmill-run"
# What gristmill writes at the top of a run directory besides its stage folders (NN_name).
_OWN_FILES = ("config.yaml", "plan.json", "command.json", "slurm_jobs.json", "stats.json", MARKER)
_OWN_FOLDERS = ("tokens", "train")
_STAGE_FOLDER = re.compile(r"^\d{2}_[a-z0-9_]+$")
# What gristmill and datatrove's executors write directly in a stage folder. `--force` removes
# these (a folder whole) and keeps anything else, naming it: a user's notes put beside a
# stage's output are theirs. A stage that writes a new entry here must add it, or `--force`
# would keep it and say so (tests/pipeline/test_run_dir_files.py runs every kind of stage).
_STAGE_OWN_FOLDERS = frozenset(
    (
        # every stage: datatrove's executor, gristmill's executors, filters and writers
        *("completions", "logs", "stats", "usage", "slurm_logs", "output", "dropped", "scores"),
        # exact_dedup, near_dedup phases
        *("hashes", "inputs", "sources", "dups", "filter", "bands", "edges", "shingles", "verified", "removed"),
    )
)
_STAGE_OWN_FILES = frozenset(
    (
        *("executor.json", "executor.pik", "ranks_to_run.json", "launch_script.slurm", "stats.json", "scores.json"),
        *("lsh.json", "clusters.npy", "cluster_sizes.json"),
    )
)


def _flatten(node, prefix="") -> dict[str, object]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(node, list):
        out = {}
        for i, v in enumerate(node):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: node}


def config_differences(old: dict, new: dict) -> list[str]:
    a, b = _flatten(old), _flatten(new)
    keys = sorted(
        k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>") and not k.startswith(_OUTPUT_NEUTRAL)
    )
    return [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys]


def is_run_dir(run_dir: Path) -> bool:
    return (run_dir / MARKER).is_file() or ((run_dir / "config.yaml").is_file() and (run_dir / "plan.json").is_file())


def check_location(run_dir: Path) -> None:
    """Refuse places no run should write into (or `--force` clear): `/`, the home directory and
    its ancestors, a path that is a file. Raised before anything is created or locked."""
    where = Path(os.path.abspath(run_dir))
    home = Path(os.path.abspath(Path.home()))
    if where == Path(where.anchor) or where == home or where in home.parents:
        raise ConfigError(
            f"run_dir {run_dir}: refusing to use {where} as a run directory "
            "(the filesystem root, your home directory or one above it); name a folder of its own"
        )
    if where.exists() and not where.is_dir():
        raise ConfigError(f"run_dir {run_dir}: exists and is not a directory")
    for parent in where.parents:  # `runs/x` where `runs` is a file: say so, not NotADirectoryError
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"run_dir {run_dir}: {parent} is a file, not a directory")
            break
    foreign = _foreign_entries(run_dir) if where.is_dir() and not is_run_dir(where) else []
    if foreign:
        # Never suggest --force here: the directory holds files gristmill did not write.
        raise ConfigError(
            f"{run_dir} exists, is not empty and is not a gristmill run directory"
            f" (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''});"
            " choose a new or empty --run-dir"
        )


def _foreign_entries(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)


def prepare(run_dir: Path, resolved: dict, force: bool) -> bool:
    """Make the run directory ready (the caller holds its lock); True when it resumes a run."""
    check_location(run_dir)
    config_path = run_dir / "config.yaml"
    resumed = False
    if is_run_dir(run_dir):
        if force:
            kept = clear(run_dir)
            if kept:
                logger.warning(f"{run_dir}: --force kept what gristmill did not write: {', '.join(kept)}")
        elif config_path.is_file():
            try:
                old = yaml.safe_load(config_path.read_text())
                if not isinstance(old, dict):
                    raise ValueError(f"expected a mapping, got {type(old).__name__}")
            except (yaml.YAMLError, ValueError, UnicodeDecodeError) as e:
                raise ConfigError(
                    f"{config_path}: unreadable ({str(e).splitlines()[0]}); the earlier run"
                    " cannot be checked against this configuration. Use --force to start"
                    " this run directory over, or another --run-dir"
                ) from None
            # a run made when tokenization was a top-level section compares as its step
            diffs = config_differences(current_layout(old), resolved)
            if diffs:
                raise ConfigError(
                    f"{run_dir} holds a run made with another configuration:\n  "
                    + "\n  ".join(diffs)
                    + "\nUse --force to start it over, or --run-dir for a new one."
                )
            resumed = True
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        run_dir / MARKER, "gristmill run directory: `pipeline run --force` clears what gristmill wrote here\n"
    )
    write_text_atomic(config_path, yaml.safe_dump(resolved, sort_keys=False))
    return resumed


def clear(run_dir: Path) -> list[str]:
    """Remove what gristmill wrote (its files, stage folders, tokens/, train/); keep the rest,
    in the run directory and in its stage folders.

    Returns the names of entries left alone (`NN_stage/name` inside a stage), so the caller can
    say so.
    """
    kept = []
    for child in run_dir.iterdir():
        name = child.name
        if name == LOCK_NAME:
            continue
        if not ours_at_top(name, child.is_dir() and not child.is_symlink()):
            kept.append(name)
        elif _STAGE_FOLDER.match(name) and child.is_dir() and not child.is_symlink():
            kept += _clear_stage(child)
        elif child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    return sorted(kept)


def ours_at_top(name: str, is_dir: bool) -> bool:
    """An entry at the top of a run directory that gristmill wrote (and `--force` removes)."""
    return name in _OWN_FILES or name.endswith(".tmp") or (is_dir and (name in _OWN_FOLDERS or is_stage_folder(name)))


def is_stage_folder(name: str) -> bool:
    return bool(_STAGE_FOLDER.match(name))


def ours_in_stage(name: str, is_dir: bool, is_file: bool | None = None) -> bool:
    """An entry of a stage folder that gristmill or datatrove wrote."""
    is_file = not is_dir if is_file is None else is_file
    return name.endswith(".tmp") or (is_dir and name in _STAGE_OWN_FOLDERS) or (is_file and name in _STAGE_OWN_FILES)


def _clear_stage(folder: Path) -> list[str]:
    """Remove what gristmill writes in a stage folder (and the folder, once empty); the paths,
    relative to the run directory, of the entries kept."""
    kept = []
    for child in folder.iterdir():
        name = child.name
        if child.is_symlink() or not ours_in_stage(name, child.is_dir(), child.is_file()):
            kept.append(f"{folder.name}/{name}")
        elif child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    if not kept:
        folder.rmdir()
    return kept


def write_plan(run_dir: Path, stages) -> None:
    plan = {"stages": [{"label": s.label, "name": s.name, "tasks": s.tasks, "steps": s.step_names} for s in stages]}
    write_text_atomic(run_dir / "plan.json", json.dumps(plan, indent=2))


def completed_tasks(stage_folder: Path) -> int:
    folder = stage_folder / "completions"
    return sum(1 for _ in folder.iterdir()) if folder.is_dir() else 0


def write_jobs(run_dir: Path, jobs: dict[str, str]) -> None:
    """Slurm job ids per stage label, for `pipeline status` (-1: nothing was left to run)."""
    write_text_atomic(run_dir / "slurm_jobs.json", json.dumps(jobs, indent=2))


def read_jobs(run_dir: Path) -> dict[str, str]:
    path = run_dir / "slurm_jobs.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_command(run_dir: Path, argv: list[str]) -> None:
    write_text_atomic(run_dir / "command.json", json.dumps(argv))


def read_command(run_dir: Path) -> list[str] | None:
    path = run_dir / "command.json"
    return json.loads(path.read_text()) if path.is_file() else None


def training_complete(run_dir: Path) -> bool:
    """The `train:` stage reached its last step (`train/summary.json`, written by rank 0)."""
    path = run_dir / "train" / "summary.json"
    if not path.is_file():
        return False
    summary = json.loads(path.read_text())
    return summary.get("steps", 0) >= summary.get("target_steps", 0) > 0
