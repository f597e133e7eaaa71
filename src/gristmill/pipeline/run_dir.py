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
import shutil
from pathlib import Path

import yaml

from gristmill.config import ConfigError

# Settings that change how or where a run goes, never what it writes (key prefixes).
_OUTPUT_NEUTRAL = ("executor.workers", "executor.type", "executor.slurm")


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
    keys = sorted(k for k in set(a) | set(b)
                  if a.get(k, "<unset>") != b.get(k, "<unset>") and not k.startswith(_OUTPUT_NEUTRAL))
    return [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys]


def prepare(run_dir: Path, resolved: dict, force: bool) -> bool:
    """Make the run directory ready; returns True when it resumes an earlier run."""
    config_path = run_dir / "config.yaml"
    resumed = False
    if config_path.is_file():
        if force:
            clear(run_dir)
        else:
            diffs = config_differences(yaml.safe_load(config_path.read_text()), resolved)
            if diffs:
                raise ConfigError(
                    f"{run_dir} holds a run made with another configuration:\n  "
                    + "\n  ".join(diffs)
                    + "\nUse --force to start it over, or --run-dir for a new one."
                )
            resumed = True
    elif run_dir.exists() and any(run_dir.iterdir()) and not force:
        raise ConfigError(f"{run_dir} exists and is not a gristmill run directory; use --force or another --run-dir")
    elif force and run_dir.exists():
        clear(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    return resumed


def clear(run_dir: Path) -> None:
    for child in run_dir.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def write_plan(run_dir: Path, stages) -> None:
    plan = {
        "stages": [
            {"label": s.label, "name": s.name, "tasks": s.tasks, "steps": s.step_names} for s in stages
        ]
    }
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=2))


def completed_tasks(stage_folder: Path) -> int:
    folder = stage_folder / "completions"
    return sum(1 for _ in folder.iterdir()) if folder.is_dir() else 0


def write_jobs(run_dir: Path, jobs: dict[str, str]) -> None:
    """Slurm job ids per stage label, for `pipeline status` (-1: nothing was left to run)."""
    (run_dir / "slurm_jobs.json").write_text(json.dumps(jobs, indent=2))


def read_jobs(run_dir: Path) -> dict[str, str]:
    path = run_dir / "slurm_jobs.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_command(run_dir: Path, argv: list[str]) -> None:
    (run_dir / "command.json").write_text(json.dumps(argv))


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
