"""What a run directory holds, wherever it lives: the names gristmill writes and what they mean.

    <run_dir>/config.yaml      the configuration as run (defaults filled in)
    <run_dir>/plan.json        stages, their tasks and steps, and the input files of the plan
    <run_dir>/NN_<stage>/      output/, dropped/, logs/, stats/, completions/, stats.json
    <run_dir>/stats.json       merged stats of every stage

Shared by the local and the object-store run directory (`gristmill.pipeline.rundir`), `--force`
and the stats readers, so that both kinds clear, count and resume by the same rules.
"""

from __future__ import annotations

import re

from gristmill.dirlock import LOCK_NAME

# Written by gristmill in every run directory it creates; `--force` removes nothing from a
# directory without it (or, for directories made before the marker existed, config + plan).
MARKER = ".gristmill-run"
MARKER_TEXT = "gristmill run directory: `pipeline run --force` clears what gristmill wrote here\n"
# What gristmill writes at the top of a run directory besides its stage folders (NN_name).
_OWN_FILES = ("config.yaml", "plan.json", "command.json", "slurm_jobs.json", "stats.json", MARKER)
_OWN_FOLDERS = ("tokens", "train")
_STAGE_FOLDER = re.compile(r"^\d{2}_[a-z0-9_]+$")
# A task's completion marker: `completions/NNNNN`, its rank in five digits (datatrove's name).
# Only these count: an editor's `00001.bak` or a stray object beside them is no completion.
_COMPLETION = re.compile(r"^\d{5}$")
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

#: an entry's kind as a run directory lists it: a folder, a file, or neither (a symbolic link, a
#: socket: never gristmill's, so never removed)
DIR, FILE, OTHER = "dir", "file", "other"


def is_stage_folder(name: str) -> bool:
    return bool(_STAGE_FOLDER.match(name))


def ours_at_top(name: str, kind: str) -> bool:
    """An entry at the top of a run directory that gristmill wrote (and `--force` removes)."""
    if kind == OTHER or name == LOCK_NAME:
        return False
    return (
        name in _OWN_FILES or name.endswith(".tmp") or (kind == DIR and (name in _OWN_FOLDERS or is_stage_folder(name)))
    )


def ours_in_stage(name: str, kind: str) -> bool:
    """An entry of a stage folder that gristmill or datatrove wrote."""
    if kind == OTHER:
        return False
    return (
        name.endswith(".tmp")
        or (kind == DIR and name in _STAGE_OWN_FOLDERS)
        or (kind == FILE and name in _STAGE_OWN_FILES)
    )


def completed_ranks(names, tasks: int | None = None) -> set[int]:
    """The ranks whose completion markers are among `names` (a stage's `completions/` entries):
    names of five digits only, below the stage's task count when it is given."""
    ranks = {int(n) for n in names if _COMPLETION.match(n)}
    return ranks if tasks is None else {r for r in ranks if r < tasks}


def is_run_dir(names) -> bool:
    """Whether a folder's entries are a run directory's (the marker, or config + plan of one
    made before the marker existed)."""
    names = set(names)
    return MARKER in names or ("config.yaml" in names and "plan.json" in names)


def plan_document(stages, inputs: list[dict] | None) -> dict:
    """plan.json: the stages, and the input files the first stage reads (a resume compares them)."""
    plan = {"stages": [{"label": s.label, "name": s.name, "tasks": s.tasks, "steps": s.step_names} for s in stages]}
    if inputs is not None:
        plan["inputs"] = inputs
    return plan
