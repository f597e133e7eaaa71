"""Stages that several variants plan alike run once.

A stage's key is a hash of what decides its output: the key of the stage before it (for the
first stage, the input section and the input files' names and sizes), its name, label and task
count, its steps' names, the parameters of every YAML step it runs (`config_key` of each step id
names the entry of `steps:`), the output settings, and whether its writer splits by language.
Two variants whose plans agree up to a stage have the same keys up to it: the stage runs in the
first variant that reaches it, and every other variant gets that finished folder as hard links
(no copy on disk; the files are written once and only read afterwards).

`<out>/stages.json` records, per key, the variant whose run computed it and the variants that
share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from gristmill.config import RunConfig
from gristmill.core.files import write_text_atomic
from gristmill.core.step import Stage, config_key
from gristmill.pipeline.rundir import layout

_STEP_ID = re.compile(r"^\d{2}_")


def stage_keys(cfg: RunConfig, stages: list[Stage]) -> list[str]:
    """One key per stage of `cfg`'s plan, chained (see the module's docstring)."""
    resolved = cfg.resolved()
    steps = {s.step_id: s for s in cfg.steps}
    prev = _hash(
        {
            "input": resolved["input"],
            "files": [(i["path"], i.get("bytes")) for i in (stages[0].inputs or [])] if stages else [],
            "calibration": resolved.get("calibration"),
        }
    )
    keys = []
    for stage in stages:
        yaml_steps = {}
        for name in stage.step_names:
            if _STEP_ID.match(name) and name in steps:
                yaml_steps[config_key(name)] = steps[name].params.model_dump(mode="json")
        per_language = any(getattr(s, "per_language", False) for s in stage.pipeline)
        prev = _hash(
            {
                "before": prev,
                "label": stage.label,
                "tasks": stage.tasks,
                "steps": stage.step_names,
                "params": yaml_steps,
                "output": resolved["output"],
                "per_language": per_language,
            }
        )
        keys.append(prev)
    return keys


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def stage_complete(folder: Path, tasks: int) -> bool:
    comp = folder / "completions"
    return comp.is_dir() and len(layout.completed_ranks(os.listdir(comp), tasks)) >= tasks


class StageRegistry:
    """`<out>/stages.json`: key → {"variant", "label", "folder", "shared_with": [...]}."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out / "stages.json"
        self.entries: dict[str, dict] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(self.entries, indent=2, sort_keys=True))

    def share(self, variant: str, run_dir: Path, stages: list[Stage], keys: list[str]) -> list[str]:
        """Before `variant` runs: link every stage another variant already finished under the
        same key into its run directory; register the others as this variant's. Returns the
        labels linked."""
        linked = []
        for stage, key in zip(stages, keys):
            entry = self.entries.get(key)
            if entry is None:
                self.entries[key] = {"variant": variant, "label": stage.label, "folder": self._rel(stage.folder)}
                continue
            if entry["variant"] == variant:
                continue
            shared = entry.setdefault("shared_with", [])
            if variant not in shared:
                shared.append(variant)
            source = self.out / entry["folder"]
            if stage_complete(stage.folder, stage.tasks):
                continue
            if not stage_complete(source, stage.tasks):  # the owner did not finish it: compute it here
                entry.update(variant=variant, folder=self._rel(stage.folder))
                shared.remove(variant)
                continue
            if stage.folder.exists():
                shutil.rmtree(stage.folder)
            _link_tree(source, stage.folder)
            linked.append(stage.label)
        if linked and not (run_dir / layout.MARKER).exists():
            # a run directory from the start: the runner resumes into it instead of refusing a
            # folder that holds files it did not write
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / layout.MARKER).write_text(layout.MARKER_TEXT)
        self.save()
        return linked

    def _rel(self, folder: Path) -> str:
        """Folders relative to <out>: the output folder may be moved (to a GPU machine) whole."""
        return os.path.relpath(folder, self.out)


def _link_tree(src: Path, dst: Path) -> None:
    """`dst` as a copy of `src` made of hard links (a copy where the filesystem cannot link)."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, tmp, copy_function=link, symlinks=True)
    os.replace(tmp, dst)
