"""A run directory on object storage (`run_dir: s3://bucket/prefix`).

It keeps the layout and the promises of a local one (docs/run-directory.md):

- resume redoes nothing completed: a task counts as complete once its marker
  `<stage>/completions/NNNNN` exists on the store, and its marker is written only after every
  file it wrote is (`gristmill.pipeline.execution.staging`);
- outputs appear whole or not at all: each object is one PUT; a task's objects count only with
  its marker, and its re-run rewrites the same names with the same bytes;
- one run per directory at a time: a lease object created with `If-None-Match: *`
  (`gristmill.pipeline.rundir.lease`), probed first on the store;
- the same checks as a local run directory before anything is written (`RunDir.prepare`);
- what it cannot do (training in place, Slurm, Ray) is refused when the config is validated
  (`StoreRunDirKind.refusals`, its kind's).

The run's stats are merged in a local mirror of the small files they come from (each task's
`stats/`, `scores/` and the completions), with the same code as a local run, and the merged
files are written back.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from gristmill.core import storage
from gristmill.core.messages import ConfigError
from gristmill.core.run_dir_kinds import StoreRunDirKind
from gristmill.pipeline.execution.staging import RemoteStage, plan_root, run_key, scratch_bytes
from gristmill.pipeline.report import journey as st
from gristmill.pipeline.rundir import layout, lease
from gristmill.pipeline.rundir.base import RunDir

if TYPE_CHECKING:
    from gristmill.config import RunConfig
    from gristmill.core.step import Stage

__all__ = ["StoreRunDir", "local_view"]

#: how often the progress bar of a stage lists its completion markers on the store
PROGRESS_S = 3.0


class StoreRunDir(RunDir):
    """A run directory at a URL (s3://bucket/prefix)."""

    kind = StoreRunDirKind  # what it cannot serve (training in place, Slurm, Ray): `refusals`

    def __init__(self, url: str, config: storage.StorageConfig | None = None):
        self.url, self.config = url.rstrip("/"), config or storage.settings()
        self.fs, self.path = storage.filesystem(self.url, self.config)
        self.path = self.path.rstrip("/")
        self.mirror = storage.scratch_root(self.config) / "runs" / run_key(self.url) / "mirror"
        self._mirrored: dict[str, str] = {}  # key -> ETag of the mirror's copy
        self._progress: dict[str, tuple[float, int]] = {}  # stage -> (when listed, tasks complete)

    def __str__(self) -> str:
        return self.url

    def url_of(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    def _key(self, *parts: str) -> str:
        return "/".join([self.path, *(p.strip("/") for p in parts if p)])

    # --- storage primitives ----------------------------------------------------------------------------

    def entries(self, *parts: str) -> dict[str, str]:
        where = self._key(*parts)
        with storage.errors(self.url_of(*parts), "listing"):
            try:
                found = self.fs.ls(where, detail=True)
            except FileNotFoundError:
                return {}
        return {
            i["name"].rstrip("/").rsplit("/", 1)[-1]: layout.DIR if i.get("type") == "directory" else layout.FILE
            for i in found
        }

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

    def remove(self, rel: str) -> None:
        with storage.errors(self.url, "removing what gristmill wrote (--force)"):
            self.fs.rm(self._key(rel), recursive=True)

    def lock(self, cfg: RunConfig, command: list[str] | None, force_lock: str | None) -> AbstractContextManager:
        return lease.hold(self.url, cfg.storage.lease_s, force_lock, command, config=self.config)

    # --- checks and set-up ----------------------------------------------------------------------------------

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

    def check_location(self) -> None:
        """The store answers, and the prefix holds no objects gristmill never wrote."""
        self.check_reachable()  # a missing bucket, bad credentials, an unreachable endpoint: one line, now
        names = self.entries()
        foreign = sorted(n for n in names if n != layout.LOCK_NAME)
        if foreign and not layout.is_run_dir(names):
            raise ConfigError(
                f"{self.url} exists, is not empty and is not a gristmill run directory"
                f" (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''});"
                " choose a new or empty --run-dir"
            )

    def check_plan(self, cfg: RunConfig, stages: list[Stage]) -> None:
        """Refuse a stage whose tasks are estimated to stage more than `storage.scratch_gb`."""
        limit = cfg.storage.scratch_gb
        if limit is None:
            return
        for stage in stages:
            need = scratch_bytes(stage)
            if need > limit * 1e9:
                raise ConfigError(
                    f"stage {stage.label}: a task is estimated to stage {need / 1e9:.2f} GB on scratch disk, more "
                    f"than storage.scratch_gb ({limit:g} GB); raise it or run more tasks (`pipeline plan CONFIG` "
                    "shows every stage's estimate)"
                )

    def prepare(self, cfg: RunConfig, force: bool, inputs: list[dict] | None = None) -> bool:
        shutil.rmtree(self.mirror, ignore_errors=True)  # stats of an earlier command here may be stale
        return super().prepare(cfg, force, inputs)

    def binding(self, stage: Stage) -> RemoteStage:
        return RemoteStage(self.url, str(plan_root(self.url, self.config)), stage.label)

    # --- stages ---------------------------------------------------------------------------------------------

    def completed_ranks(self, stage: Stage) -> set[int]:
        done = super().completed_ranks(stage)
        self._progress[stage.label] = (time.monotonic(), len(done))
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

    def _mirror_completions(self, label: str, names) -> None:
        done = self.mirror / label / "completions"
        done.mkdir(parents=True, exist_ok=True)
        for name in names:
            (done / name).touch()

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
            self._mirror_completions(stage.label, self.entries(stage.label, "completions"))
        merged = st.merge_run(self.mirror)
        for stage in stages:
            self._upload(stage.label, "stats.json", "scores.json")
        merged_here = {**merged, "run_dir": self.url}
        self.write_text("stats.json", json.dumps(merged_here, indent=2))
        return merged


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
    for name in ("plan.json", "config.yaml", "command.json", "stats.json", "slurm_jobs.json", layout.MARKER):
        if name in top:
            (view / name).write_text(store.read_text(name) or "")
    for stage in json.loads((view / "plan.json").read_text())["stages"]:
        label = stage["label"]
        if label not in top:
            continue
        entries = store.entries(label)
        done = store.entries(label, "completions") if "completions" in entries else {}
        folders = [f"{label}/{name}" for name in ("stats", "scores") if name in entries]
        if len(layout.completed_ranks(done, stage["tasks"])) < stage["tasks"] and "logs" in entries:
            folders.append(f"{label}/logs")
        store._mirror(*folders)
        for name in ("stats.json", "scores.json"):
            if name in entries:
                (view / label).mkdir(parents=True, exist_ok=True)
                (view / label / name).write_text(store.read_text(label, name) or "")
        store._mirror_completions(label, done)
    return view
