"""The run directory's one interface: what a run, `--force`, resume and the stats readers ask of it.

A run directory is a local folder (`LocalRunDir`) or a prefix on object storage (`StoreRunDir`);
the runner's one stage loop (`gristmill.pipeline.runner`) works against this class alone. The
rules that make a run resumable live here, once: what `--force` removes, which configuration
changes refuse a resume, what counts as a completed task, the plan's inputs a resume compares.
An implementation supplies the storage primitives (list, read, write, remove), its lock, the
checks of its location, and how its tasks reach it (`binding`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import yaml
from loguru import logger

from gristmill.core.messages import ConfigError
from gristmill.core.run_dir_kinds import LocalRunDirKind
from gristmill.pipeline.rundir import layout

if TYPE_CHECKING:
    from gristmill.config import RunConfig
    from gristmill.core.step import Stage
    from gristmill.pipeline.execution.staging import RemoteStage


class RunDir(ABC):
    """One run directory. `str(run_dir)` is its path or URL, as messages name it."""

    # --- what a run directory of this kind cannot do ---------------------------------------------

    #: what this kind of run directory can serve (`gristmill.core.run_dir_kinds`)
    kind = LocalRunDirKind

    @classmethod
    def refusals(cls, cfg: RunConfig) -> list[str]:
        """Lines naming each setting of `cfg` this kind of run directory cannot serve (its kind's,
        which the config's validation asks before anything runs)."""
        return cls.kind.refusals(cfg)

    # --- storage primitives --------------------------------------------------------------------------

    @abstractmethod
    def entries(self, *parts: str) -> dict[str, str]:
        """{name: layout.DIR | FILE | OTHER} of the entries directly in the run directory, or in
        one of its folders; {} where there is none."""

    @abstractmethod
    def read_text(self, *parts: str) -> str | None:
        """A small file's text; None where there is none."""

    @abstractmethod
    def write_text(self, rel: str, text: str) -> None:
        """A small file, whole or not at all."""

    @abstractmethod
    def remove(self, rel: str) -> None:
        """A file, or a folder with everything in it."""

    @abstractmethod
    def lock(self, cfg: RunConfig, command: list[str] | None, force_lock: str | None) -> AbstractContextManager:
        """Held for a whole run: a second command on this directory stops at once."""

    @abstractmethod
    def check_location(self) -> None:
        """Refuse (ConfigError) a place no run should write into; before anything is created."""

    def binding(self, stage: Stage) -> RemoteStage | None:
        """What a task of `stage` needs to reach this run directory, beyond the stage's own local
        paths: None where the tasks write into it directly."""
        return None

    def logs(self, stage: Stage) -> str:
        """Where a stage's task logs are, as a failure line names them."""
        return f"{self}/{stage.label}/logs"

    # --- stats, merged where the run directory can be read as local files -----------------------------

    @abstractmethod
    def merge_stage(self, stage: Stage) -> None:
        """Every task's stats and scores of `stage` merged into its stats.json and scores.json."""

    @abstractmethod
    def merge_run(self, stages: list[Stage]) -> dict:
        """The run's stats (every stage merged), written as the run's stats.json, and returned."""

    # --- the rules, shared by every kind ---------------------------------------------------------------

    def completed_ranks(self, stage: Stage) -> set[int]:
        """The ranks of `stage` whose completion markers exist (named as markers are, and of a
        rank the stage has: nothing else in `completions/` counts)."""
        return layout.completed_ranks(self.entries(stage.label, "completions"), stage.tasks)

    def completed_tasks(self, stage: Stage) -> int:
        return len(self.completed_ranks(stage))

    def progress(self, stage: Stage) -> int:
        """`completed_tasks` for a progress bar (polled four times a second)."""
        return self.completed_tasks(stage)

    def is_run_dir(self) -> bool:
        return layout.is_run_dir(self.entries())

    def prepare(self, cfg: RunConfig, force: bool, inputs: list[dict] | None = None) -> bool:
        """Make the run directory ready for `cfg` (the caller holds its lock); True when it
        resumes a run. A run made with another configuration or, where `inputs` (the plan's
        input files) are given, over other input files is refused unless `force`, which clears
        what gristmill wrote first; a refusal writes nothing."""
        self.check_location()
        resolved = cfg.resolved()
        resumed = False
        names = self.entries()
        if layout.is_run_dir(names):
            if force:
                kept = self.clear()
                if kept:
                    logger.warning(f"{self}: --force kept what gristmill did not write: {', '.join(kept)}")
            elif names.get("config.yaml") == layout.FILE:
                where = f"{self}/config.yaml"
                try:
                    old = yaml.safe_load(self.read_text("config.yaml") or "")
                    if not isinstance(old, dict):
                        raise ValueError(f"expected a mapping, got {type(old).__name__}")
                except (yaml.YAMLError, ValueError) as e:
                    raise ConfigError(
                        f"{where}: unreadable ({str(e).splitlines()[0]}); the earlier run"
                        " cannot be checked against this configuration. Use --force to start"
                        " this run directory over, or another --run-dir"
                    ) from None
                diffs = cfg.changes_from(old)
                if diffs:
                    raise ConfigError(
                        f"{self} holds a run made with another configuration:\n  "
                        + "\n  ".join(diffs)
                        + "\nUse --force to start it over, or --run-dir for a new one."
                    )
                self.check_inputs(inputs)
                resumed = True
        self.write_text(layout.MARKER, layout.MARKER_TEXT)
        self.write_text("config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        return resumed

    def check_inputs(self, inputs: list[dict] | None) -> None:
        """A resume reads exactly the files of the first plan, or is refused: a task's share of
        the input is every tasks-th file of the sorted list, so a file added, removed or changed
        since would make the kept tasks' documents and the new ones overlap or miss files."""
        text = self.read_text("plan.json")
        if inputs is None or text is None:
            return
        try:
            before = json.loads(text).get("inputs")
        except (ValueError, AttributeError):
            raise ConfigError(
                f"{self}/plan.json: unreadable; the earlier run's input files cannot be checked."
                " Use --force to start this run directory over, or another --run-dir"
            ) from None
        if before is None or before == inputs:  # a run planned before plan.json kept its inputs
            return
        old = {i["path"]: i.get("bytes") for i in before}
        new = {i["path"]: i.get("bytes") for i in inputs}
        added = [p for p in new if p not in old]
        gone = [p for p in old if p not in new]
        changed = [p for p in new if p in old and old[p] != new[p]]
        said = [
            f"{len(v)} {what} (first: {v[0]})"
            for what, v in (("added", added), ("removed", gone), ("changed in size", changed))
            if v
        ] or ["their order changed"]
        raise ConfigError(
            f"{self}: the input files changed since this run began: {'; '.join(said)}. Its completed"
            " tasks read the earlier files; restore them to resume, or use --force to start over"
        )

    def write_plan(self, stages: list[Stage]) -> None:
        inputs = stages[0].inputs if stages else None
        self.write_text("plan.json", json.dumps(layout.plan_document(stages, inputs), indent=2))

    def write_command(self, argv: list[str]) -> None:
        self.write_text("command.json", json.dumps(argv))

    def write_jobs(self, jobs: dict[str, str]) -> None:
        """Slurm job ids per stage label, for `pipeline status` (-1: nothing was left to run)."""
        self.write_text("slurm_jobs.json", json.dumps(jobs, indent=2))

    def read_jobs(self) -> dict[str, str]:
        text = self.read_text("slurm_jobs.json")
        return json.loads(text) if text is not None else {}

    def read_command(self) -> list[str] | None:
        text = self.read_text("command.json")
        return json.loads(text) if text is not None else None

    def training_complete(self) -> bool:
        """The `train:` stage reached its last step (`train/summary.json`, written by rank 0)."""
        text = self.read_text("train", "summary.json")
        if text is None:
            return False
        summary = json.loads(text)
        return summary.get("steps", 0) >= summary.get("target_steps", 0) > 0

    def check_plan(self, cfg: RunConfig, stages: list[Stage]) -> None:
        """Refuse (ConfigError) a plan this run directory cannot hold; before anything is written."""
        return None

    def clear(self) -> list[str]:
        """Remove what gristmill wrote (its files, stage folders, tokens/, train/); keep the rest,
        in the run directory and in its stage folders. Returns the entries left alone
        (`NN_stage/name` inside a stage), so the caller can say so."""
        kept = []
        for name, kind in sorted(self.entries().items()):
            if name == layout.LOCK_NAME:
                continue
            if not layout.ours_at_top(name, kind):
                kept.append(name)
            elif kind == layout.DIR and layout.is_stage_folder(name):
                inside = self.entries(name)
                mine = [child for child, k in sorted(inside.items()) if layout.ours_in_stage(child, k)]
                kept += [f"{name}/{child}" for child in sorted(inside) if child not in mine]
                if len(mine) == len(inside):
                    self.remove(name)
                else:
                    for child in mine:
                        self.remove(f"{name}/{child}")
            else:
                self.remove(name)
        return sorted(kept)
