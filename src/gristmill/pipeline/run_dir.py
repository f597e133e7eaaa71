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

# Settings that change how fast a run goes, never what it writes.
_OUTPUT_NEUTRAL = {("executor", "workers")}


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
    neutral = {".".join(k) for k in _OUTPUT_NEUTRAL}
    a, b = _flatten(old), _flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>") and k not in neutral)
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
