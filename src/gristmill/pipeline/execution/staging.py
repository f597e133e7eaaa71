"""Tasks of a run whose directory is on object storage: each works in a local copy, then commits.

An object store has no rename, no `flock`, no memory-mapping and no writing in place, and much
of a run relies on them. So the steps never see the store. The planner hands every step the
plan's `RunFolder` (`gristmill.core.run_folder`), rooted for a remote run at a local folder that
is never written (`plan_root`); the steps keep names relative to it. Each task, in its own
process:

1. makes a fresh folder of its own on scratch disk (`<scratch>/tasks/<run>/<stage>/task_NNNNN`),
   a `WorkingCopy` of the run directory, and binds to it the run folders its steps declare
   (`Step.run_folders`) for as long as they run, so the steps write there as into any local run
   directory;
2. reads earlier stages through the run folder (`staged`, `listed`): only the files it opens
   are fetched from the store, with the run's storage settings (`executor.storage_config`), so
   its scratch use is its share of the inputs and its outputs;
3. once datatrove has marked it complete in that folder, uploads every file it wrote there
   (stats, logs and usage included; a file fetched from the store and hard-linked to a new name,
   as the manifest does with token shards, is copied on the store instead), and only then writes
   its completion marker on the store (`<stage>/completions/NNNNN`). Each object is one PUT,
   whole or not at all; the marker is the commit: resume, the stages after it and
   `pipeline run`'s checks trust a task's outputs only once its marker exists. A task killed
   before the marker has committed nothing that counts, and its re-run rewrites the same names
   with the same bytes.

The task's log is uploaded also when it fails, so the failure line's log can be read; a task
killed outright leaves its log in its scratch folder, which the failure line names.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from gristmill.core import storage
from gristmill.core.run_folder import WorkingCopy
from gristmill.core.step import Step

__all__ = ["RemoteStage", "plan_root", "run_in_working_copy", "run_key", "task_root"]


def run_key(url: str) -> str:
    """A short stable name of a run directory URL, for local folders about it."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def plan_root(url: str, config: storage.StorageConfig) -> Path:
    """The local root a run on object storage is planned against (its steps' `RunFolder`). Never
    created: each task binds the folder to a working copy of its own, and a task that writes
    under the root (a path not taken from its run folder) fails."""
    return Path(os.path.abspath(storage.scratch_root(config))) / "plan-root-never-written" / run_key(url)


@dataclass(frozen=True)
class RemoteStage:
    """What a task of a stage needs to know about the run directory on the store."""

    url: str  # the run directory, s3://bucket/prefix
    plan_root: str  # the local root the stage's steps were planned against
    stage: str  # the stage's folder name, NN_name

    def stage_url(self, *parts: str) -> str:
        return storage.join(self.url, self.stage, *parts)


def task_root(remote: RemoteStage, rank: int, config: storage.StorageConfig) -> Path:
    return storage.scratch_root(config) / "tasks" / run_key(remote.url) / remote.stage / f"task_{rank:05d}"


def task_log(remote: RemoteStage, rank: int, config: storage.StorageConfig) -> str:
    """Where a task's log is: in its scratch folder if it is still there (a task killed outright),
    else on the store (a task that failed uploads its log)."""
    local = task_root(remote, rank, config) / remote.stage / "logs" / f"task_{rank:05d}.log"
    return str(local) if local.is_file() else remote.stage_url("logs", f"task_{rank:05d}.log")


# --- a task in a working copy ---------------------------------------------------------------------------


def run_in_working_copy(executor, body, rank: int):
    """Run `body()` (the task's steps) with its steps' run folders bound to a fresh working copy
    of its own and `executor`'s logging folder in it, then commit what it wrote (see the module
    doc). `executor.logging_dir` is the stage's folder on the store otherwise: datatrove's
    completion checks (`is_rank_completed`, `get_incomplete_ranks`) read the markers there."""
    from datatrove.io import get_datafolder

    remote: RemoteStage = executor.remote
    root = task_root(remote, rank, executor.storage_config)
    shutil.rmtree(root, ignore_errors=True)  # what an attempt killed outright left
    root.mkdir(parents=True)
    logging_dir = executor.logging_dir
    executor.logging_dir = get_datafolder(str(root / remote.stage))
    work = WorkingCopy(remote.url, root, executor.storage_config)
    folders = {id(f): f for step in executor.pipeline if isinstance(step, Step) for f in step.run_folders()}
    committed = False
    try:
        with ExitStack() as bound:
            for folder in folders.values():
                bound.enter_context(folder.bound(work))
            stats = body()
        if executor.logging_dir.isfile(f"completions/{rank:05d}"):  # datatrove marked it complete here
            _check_plan_root(Path(remote.plan_root), rank)
            _commit(work, remote, rank)
        committed = True
        return stats
    finally:
        executor.logging_dir = logging_dir
        if not committed:
            _upload_log(work, remote, rank)
        shutil.rmtree(root, ignore_errors=True)


def _check_plan_root(root: Path, rank: int) -> None:
    if root.exists():
        written = next((p for p in root.rglob("*") if p.is_file()), root)
        raise RuntimeError(
            f"task {rank} wrote {written} outside its working copy (a path not taken from its run folder); "
            "nothing of it was committed"
        )


def _commit(work: WorkingCopy, remote: RemoteStage, rank: int) -> None:
    """Upload what the task wrote, then write its completion marker: the commit."""
    root = work.root
    marker = root / remote.stage / "completions" / f"{rank:05d}"
    fetched = work.fetched_files()
    uploads, copies = [], []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if path == marker or path.name.endswith(".tmp"):
            continue
        st = path.stat()
        source = fetched.get((st.st_dev, st.st_ino))
        key = f"{work.remote}/{path.relative_to(root).as_posix()}"
        if source is None:
            uploads.append((str(path), key))
        elif source != key:  # a fetched file under a new name (hard-linked): copied on the store
            copies.append((source, key))
    url = remote.stage_url()
    log = root / remote.stage / "logs" / f"task_{rank:05d}.log"
    if log.is_file():  # the task's log is closed: what staging did, at its end
        with open(log, "a") as f:
            f.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} | INFO     | working copy: fetched {len(fetched)} files"
                f" ({work.fetched_bytes / 1e6:.1f} MB) in {work.fetch_s:.2f} s; committing {len(uploads)} files"
                f" and {len(copies)} copies on the store to {url}\n"
            )
    with storage.errors(url, f"committing task {rank}"):
        if uploads:
            work.fs.put([a for a, _ in uploads], [b for _, b in uploads])
        for src, dst in copies:
            work.fs.copy(src, dst)
        work.fs.pipe_file(f"{work.remote}/{remote.stage}/completions/{rank:05d}", b"")


def _upload_log(work: WorkingCopy, remote: RemoteStage, rank: int) -> None:
    """A failed task's log, to the store where the failure line points (best effort: the
    failure itself is the error to report)."""
    log = work.root / remote.stage / "logs" / f"task_{rank:05d}.log"
    if not log.is_file():
        return
    try:
        work.fs.put_file(str(log), f"{work.remote}/{remote.stage}/logs/{log.name}")
    except Exception as e:  # noqa: BLE001 - best effort, see above
        logger.warning(f"task {rank}: its log could not be saved to {remote.stage_url('logs')}: {storage.describe(e)}")


def scratch_bytes(stage) -> int:
    """Local scratch one task of `stage` is estimated to use when the run directory is on object
    storage: its share of the documents read and written (as text: Parquet holds less), and what
    its steps hold in memory, which bounds what they map or build in place (a Bloom filter slice,
    sorted parts). An upper figure, like the memory models it is made of."""
    work = stage.work
    if work is None:
        return 0
    held = sum(s.memory_bytes(work) for s in stage.pipeline if isinstance(s, Step))
    return int(2 * work.text_bytes / max(stage.tasks, 1) + held)
