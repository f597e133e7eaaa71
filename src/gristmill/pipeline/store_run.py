"""`pipeline run` with the run directory on object storage (`run_dir: s3://bucket/prefix`).

The run directory keeps the layout and the promises of a local one (docs/run-directory.md):

- resume redoes nothing completed: a task counts as complete once its marker
  `<stage>/completions/NNNNN` exists on the store, and its marker is written only after every
  file it wrote is (`gristmill.pipeline.staging`);
- outputs appear whole or not at all: each object is one PUT; a task's objects count only with
  its marker, and its re-run rewrites the same names with the same bytes;
- one run per directory at a time: a lease object created with `If-None-Match: *`
  (`gristmill.pipeline.lease`), probed first on the store;
- the same checks as a local run directory before anything is written: a changed configuration
  is refused unless `--force`, a prefix holding objects gristmill did not write is refused, and
  `--force` removes only what gristmill wrote;
- what is not supported on a store is refused before anything runs (`gristmill.config._checks`:
  training, Slurm).

The run's stats are merged in a local mirror of the small files they come from (each task's
`stats/`, `scores/` and the completions), with the same code as a local run, and the merged
files are written back.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from loguru import logger
from rich.console import Console

from gristmill.config import ConfigError, RunConfig, current_layout
from gristmill.core import storage
from gristmill.dirlock import LOCK_NAME
from gristmill.pipeline import run_dir as rd
from gristmill.pipeline import stats as st
from gristmill.pipeline.executors import make_executor
from gristmill.pipeline.lease import hold
from gristmill.pipeline.planner import Stage, plan
from gristmill.pipeline.staging import RemoteStage, plan_root, run_key, scratch_bytes

__all__ = ["StoreRunDir", "local_view", "run_on_store"]

#: how often the progress bar of a stage lists its completion markers on the store
PROGRESS_S = 3.0


class StoreRunDir:
    """A run directory at a URL (s3://bucket/prefix): what the runner reads and writes there."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.path = storage.filesystem(self.url)
        self.path = self.path.rstrip("/")
        self.mirror = storage.scratch_root() / "runs" / run_key(self.url) / "mirror"
        self._mirrored: dict[str, str] = {}  # key -> ETag of the mirror's copy
        self._progress: dict[str, tuple[float, int]] = {}  # stage -> (when listed, tasks complete)

    def __str__(self) -> str:
        return self.url

    def url_of(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    def _key(self, *parts: str) -> str:
        return "/".join([self.path, *(p.strip("/") for p in parts if p)])

    # --- reading and writing small files ------------------------------------------------------

    def read_text(self, *parts: str) -> str | None:
        url = self.url_of(*parts)
        with storage.errors(url, "reading"):
            try:
                return self.fs.cat_file(self._key(*parts)).decode("utf-8")
            except FileNotFoundError:
                return None

    def write_text(self, rel: str, text: str) -> None:
        with storage.errors(self.url_of(rel), "writing"):
            self.fs.pipe_file(self._key(rel), text.encode("utf-8"))

    def entries(self, *parts: str) -> dict[str, bool]:
        """{name: is a folder} of the entries directly in the run directory (or a folder of it)."""
        where = self._key(*parts)
        with storage.errors(self.url_of(*parts), "listing"):
            try:
                found = self.fs.ls(where, detail=True)
            except FileNotFoundError:
                return {}
        return {i["name"].rstrip("/").rsplit("/", 1)[-1]: i.get("type") == "directory" for i in found}

    # --- the run directory's checks and set-up -------------------------------------------------------

    def check_reachable(self) -> None:
        """The bucket exists and the credentials are accepted: one line otherwise. A listing (not a
        HEAD, which has no body) so that the server's reason comes back."""
        bucket, _, prefix = self.path.partition("/")
        with storage.errors(self.url, "opening the run directory"):
            try:
                self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix + "/", MaxKeys=1)
            except FileNotFoundError as e:
                said = " ".join(str(e).split())
                raise storage.StorageError(
                    f"{self.url}: no such bucket s3://{bucket} (the store said: {said}); a run directory's bucket "
                    "must exist"
                ) from None

    def is_run_dir(self, names: dict[str, bool]) -> bool:
        return rd.MARKER in names or ("config.yaml" in names and "plan.json" in names)

    def check_location(self) -> None:
        """As a local run directory: a prefix holding objects gristmill never wrote is refused."""
        names = self.entries()
        foreign = sorted(n for n in names if n != LOCK_NAME)
        if foreign and not self.is_run_dir(names):
            raise ConfigError(
                f"{self.url} exists, is not empty and is not a gristmill run directory"
                f" (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''});"
                " choose a new or empty --run-dir"
            )

    def prepare(self, resolved: dict, force: bool) -> bool:
        """As `run_dir.prepare` (the caller holds the lease); True when it resumes a run."""
        names = self.entries()
        resumed = False
        if self.is_run_dir(names):
            if force:
                kept = self.clear(names)
                if kept:
                    logger.warning(f"{self.url}: --force kept what gristmill did not write: {', '.join(kept)}")
            elif "config.yaml" in names:
                text = self.read_text("config.yaml") or ""
                try:
                    old = yaml.safe_load(text)
                    if not isinstance(old, dict):
                        raise ValueError(f"expected a mapping, got {type(old).__name__}")
                except (yaml.YAMLError, ValueError) as e:
                    raise ConfigError(
                        f"{self.url_of('config.yaml')}: unreadable ({str(e).splitlines()[0]}); the earlier run"
                        " cannot be checked against this configuration. Use --force to start"
                        " this run directory over, or another --run-dir"
                    ) from None
                diffs = rd.config_differences(current_layout(old), resolved)
                if diffs:
                    raise ConfigError(
                        f"{self.url} holds a run made with another configuration:\n  "
                        + "\n  ".join(diffs)
                        + "\nUse --force to start it over, or --run-dir for a new one."
                    )
                resumed = True
        self.write_text(rd.MARKER, "gristmill run directory: `pipeline run --force` clears what gristmill wrote here\n")
        self.write_text("config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        return resumed

    def clear(self, names: dict[str, bool]) -> list[str]:
        """`run_dir.clear` on the store: remove what gristmill wrote, keep and name the rest."""
        kept, doomed = [], []
        for name, is_dir in sorted(names.items()):
            if name == LOCK_NAME:
                continue
            if not rd.ours_at_top(name, is_dir):
                kept.append(name)
            elif is_dir and rd.is_stage_folder(name):
                for child, child_dir in sorted(self.entries(name).items()):
                    if rd.ours_in_stage(child, child_dir):
                        doomed.append(self._key(name, child))
                    else:
                        kept.append(f"{name}/{child}")
            else:
                doomed.append(self._key(name))
        with storage.errors(self.url, "removing what gristmill wrote (--force)"):
            for key in doomed:
                self.fs.rm(key, recursive=True)
        return kept

    def write_plan(self, stages: list[Stage]) -> None:
        plan_ = {
            "stages": [{"label": s.label, "name": s.name, "tasks": s.tasks, "steps": s.step_names} for s in stages]
        }
        self.write_text("plan.json", json.dumps(plan_, indent=2))

    # --- stages ------------------------------------------------------------------------------------

    def completed_tasks(self, stage: Stage) -> int:
        done = sum(1 for name, is_dir in self.entries(stage.label, "completions").items() if not is_dir)
        self._progress[stage.label] = (time.monotonic(), done)
        return done

    def progress(self, stage: Stage) -> int:
        """`completed_tasks` for the progress bar, listed at most every PROGRESS_S: a listing of
        thousands of markers four times a second would cost more than the bar is worth."""
        at, done = self._progress.get(stage.label, (float("-inf"), 0))
        return done if time.monotonic() - at < PROGRESS_S else self.completed_tasks(stage)

    def logs(self, stage: Stage) -> str:
        return self.url_of(stage.label, "logs")

    def _mirror(self, *folders: str) -> None:
        """Copy the run directory's files under `folders` (relative) into the local mirror,
        those not there yet or changed (by ETag)."""
        wanted = []
        for rel in folders:
            with storage.errors(self.url_of(rel), "reading the run's stats"):
                found = self.fs.find(self._key(rel), detail=True)
            for key, info in found.items():
                if info.get("type") == "directory" or key.endswith(".tmp"):
                    continue
                tag = str(info.get("ETag") or info.get("size"))
                if self._mirrored.get(key) != tag:
                    wanted.append((key, self.mirror / key[len(self.path) + 1 :], tag))
        for _, local, _ in wanted:
            local.parent.mkdir(parents=True, exist_ok=True)
        if wanted:
            with storage.errors(self.url, "reading the run's stats"):
                self.fs.get([k for k, _, _ in wanted], [str(p) for _, p, _ in wanted])
        for key, _, tag in wanted:
            self._mirrored[key] = tag

    def merge_stage(self, stage: Stage) -> None:
        """`stats.merge_stage` and its scores, on the mirror; the merged files written back."""
        self._mirror(f"{stage.label}/stats", f"{stage.label}/scores")
        local = self.mirror / stage.label
        st.merge_stage(local)
        st.merge_scores(local)
        self._upload(stage.label, "stats.json", "scores.json")

    def _upload(self, folder: str, *names: str) -> None:
        for name in names:
            path = self.mirror / folder / name
            if path.is_file():
                self.write_text(f"{folder}/{name}" if folder else name, path.read_text())

    def merge_run(self, stages: list[Stage]) -> dict:
        """`stats.merge_run` on the mirror, written back: the run's and every stage's stats."""
        (self.mirror / "plan.json").parent.mkdir(parents=True, exist_ok=True)
        for name in ("plan.json", "config.yaml"):
            text = self.read_text(name)
            if text is not None:
                (self.mirror / name).write_text(text)
        for stage in stages:
            self._mirror(f"{stage.label}/stats", f"{stage.label}/scores")
            done = self.mirror / stage.label / "completions"
            done.mkdir(parents=True, exist_ok=True)
            for name in self.entries(stage.label, "completions"):
                (done / name).touch()
        merged = st.merge_run(self.mirror)
        for stage in stages:
            self._upload(stage.label, "stats.json", "scores.json")
        merged_here = {**merged, "run_dir": self.url}
        self.write_text("stats.json", json.dumps(merged_here, indent=2))
        return merged


def run_on_store(
    cfg: RunConfig,
    force: bool,
    console: Console,
    command: list[str] | None,
    force_lock: str | None,
    run_stage: Callable,
    summary: Callable,
) -> dict:
    """`runner.run` for a run directory on object storage (local executor): `run_stage` and
    `summary` are the runner's, so a stage runs and a run ends as in a local run directory."""
    store = StoreRunDir(cfg.run_dir)
    store.check_reachable()  # a missing bucket, bad credentials, an unreachable endpoint: one line, now
    store.check_location()
    stages = plan(cfg)
    _check_scratch(cfg, stages)
    with hold(store.url, cfg.storage.lease_s, force_lock, command):
        shutil.rmtree(store.mirror, ignore_errors=True)  # stats of an earlier command here may be stale
        resumed = store.prepare(cfg.resolved(), force)
        store.write_plan(stages)
        if command:
            store.write_text("command.json", json.dumps(command))
        if resumed:
            console.print(f"resuming {store.url}: completed tasks are kept")
        started = time.perf_counter()
        root = str(plan_root(store.url))
        try:
            for stage in stages:
                if store.completed_tasks(stage) >= stage.tasks:
                    console.print(f"{stage.label}: all {stage.tasks} tasks already complete")
                else:
                    remote = RemoteStage(store.url, root, stage.label)
                    run_stage(stage, console, make_executor(stage, cfg.storage, remote), where=store)
                store.merge_stage(stage)
        except BaseException:
            _merge_quietly(store, stages)  # the stats of what completed, as a local run keeps them
            raise
        merged = store.merge_run(stages)
        summary(merged, store.url, started, console)
        return merged


def _merge_quietly(store: StoreRunDir, stages: list[Stage]) -> None:
    """Keep the stats of what completed; never let a second failure replace the first."""
    try:
        store.merge_run(stages)
    except Exception as e:  # noqa: BLE001
        logger.warning(f"stats of {store.url} not merged: {e}")


def _check_scratch(cfg: RunConfig, stages: list[Stage]) -> None:
    """Refuse a stage whose tasks are estimated to stage more than `storage.scratch_gb`."""
    limit = cfg.storage.scratch_gb
    if limit is None:
        return
    for stage in stages:
        need = scratch_bytes(stage)
        if need > limit * 1e9:
            raise ConfigError(
                f"stage {stage.label}: a task is estimated to stage {need / 1e9:.2f} GB on scratch disk, more than "
                f"storage.scratch_gb ({limit:g} GB); raise it or run more tasks (`pipeline plan CONFIG` shows every "
                "stage's estimate)"
            )


def local_view(url: str) -> Path:
    """What `pipeline stats`, `report` and `status` read of a run directory on object storage,
    copied to a local folder (the plan, config and stats, every stage's merged and per-task stats
    and scores, its completion markers, and the logs of stages not complete): those commands
    then read it as a local run directory. Nothing is written to the store."""
    store = StoreRunDir(url)
    store.check_reachable()
    top = store.entries()
    if "plan.json" not in top:
        raise ConfigError(f"{store.url}: not a run directory (no plan.json); run `pipeline run` first")
    view = store.mirror.with_name("view")
    shutil.rmtree(view, ignore_errors=True)
    store.mirror = view
    view.mkdir(parents=True)
    for name in ("plan.json", "config.yaml", "command.json", "stats.json", "slurm_jobs.json", rd.MARKER):
        if name in top:
            (view / name).write_text(store.read_text(name) or "")
    for stage in json.loads((view / "plan.json").read_text())["stages"]:
        label = stage["label"]
        if label not in top:
            continue
        entries = store.entries(label)
        done = store.entries(label, "completions") if "completions" in entries else {}
        folders = [f"{label}/{name}" for name in ("stats", "scores") if name in entries]
        if len(done) < stage["tasks"] and "logs" in entries:
            folders.append(f"{label}/logs")
        store._mirror(*folders)
        for name in ("stats.json", "scores.json"):
            if name in entries:
                (view / label).mkdir(parents=True, exist_ok=True)
                (view / label / name).write_text(store.read_text(label, name) or "")
        (view / label / "completions").mkdir(parents=True, exist_ok=True)
        for name in done:
            (view / label / "completions" / name).touch()
    return view
