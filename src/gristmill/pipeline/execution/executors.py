"""datatrove's executors, as gristmill runs them.

Local: every task runs in its own child process that this process supervises, whatever
`workers` is. datatrove's `LocalPipelineExecutor.run` runs tasks in a `multiprocess` pool whose
`imap_unordered` never returns a task whose worker died (SIGKILL, the OOM killer, a segfault in
native code): the run waited forever; with workers=1 it ran tasks in-process, so a segfault
killed the command without a word. Here a task that dies or fails stops its stage within a
poll interval, naming the task, the signal and its log; the other running tasks are stopped,
completed tasks stay complete, and no child outlives the run (Ctrl-C, SIGTERM, failure: each
task is its own process group, killed with its descendants; a task also dies with this
process via PR_SET_PDEATHSIG). A task process is forked from a pre-imported zygote
(`task_zygote`: no interpreter start-up and imports per task); `GRISTMILL_TASK_START=exec` starts
each as a fresh interpreter instead. The task itself is datatrove's `_run_for_rank`, so skipping
completed tasks, stats files and completions are datatrove's. Task logs: datatrove prints
every task's INFO log to the terminal, which buries the progress bar; we keep INFO and below
in each task's log file (`<stage>/logs/task_NNNNN.log`) and show warnings and errors live.

Slurm: `SlurmPipelineExecutor` per stage, each one or more job arrays (at most the cluster's
`MaxArraySize` tasks each) depending (afterok) on every array of the stage before, so a failed
task cancels everything downstream. datatrove's extra merge-stats job per
stage is not submitted: `pipeline status`/`stats` merge the per-task files themselves.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dill
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.executor.slurm import SlurmPipelineExecutor

from gristmill.config import SlurmConfig
from gristmill.core import storage
from gristmill.pipeline.execution import gpus as task_gpus
from gristmill.pipeline.execution import zygote as task_zygote
from gristmill.pipeline.execution.staging import RemoteStage, task_log
from gristmill.pipeline.execution.task import (
    POLL_S,
    STOP_GRACE_S,
    TASK_CMD,
    TASK_TARGET,
    Interrupted,
    Signals,
    TaskFailed,
    describe_exit,
    run_task,
)
from gristmill.pipeline.execution.zygote import ZygoteUnavailable
from gristmill.pipeline.planning.planner import Stage

__all__ = ["Interrupted", "LocalExecutor", "SlurmExecutor", "TaskFailed", "make_executor", "make_slurm_executor"]


@dataclass
class _Task:
    rank: int
    slot: int
    proc: subprocess.Popen | task_zygote.ForkedProcess
    status_fd: int  # read end of a pipe only the task writes to (one line: why it failed)
    error: bytes = b""

    def drain(self) -> None:
        try:
            while chunk := os.read(self.status_fd, 65536):
                self.error += chunk
        except BlockingIOError:
            pass


def _stop(tasks) -> None:
    """SIGTERM each task's process group, then SIGKILL what is left after a grace period; reap."""
    tasks = list(tasks)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for t in tasks:
            try:
                os.killpg(t.proc.pid, sig)
                if sig == signal.SIGTERM:
                    os.killpg(t.proc.pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only when continued
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (STOP_GRACE_S if sig == signal.SIGTERM else 30)
        while time.monotonic() < deadline and any(t.proc.poll() is None for t in tasks):
            time.sleep(0.05)
        if all(t.proc.poll() is not None for t in tasks):
            break
    for t in tasks:
        # The group may still hold a task's own children (the task leader is gone).
        try:
            os.killpg(t.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        os.close(t.status_fd)


class LocalExecutor(LocalPipelineExecutor):
    """A stage's tasks, each in a child process of this one (see the module doc)."""

    def __init__(
        self,
        *args,
        storage_config: storage.StorageConfig,
        remote: RemoteStage | None = None,
        gpus_per_task: int = 0,
        label: str = "",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        # travel with the pickled executor to each task (`gristmill.pipeline.execution.task.run_task`)
        self.storage_config, self.remote = storage_config, remote
        self.gpus_per_task, self.label = gpus_per_task, label

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        return run_task(self, rank, local_rank, node_rank)

    def task_log(self, rank: int) -> str:
        if self.remote is not None:
            return task_log(self.remote, rank, self.storage_config)
        return self.logging_dir.resolve_paths(f"logs/task_{rank:05d}.log")

    def run(self, on_poll: Callable[[], None] | None = None) -> None:
        """Run every incomplete task, `workers` at a time, each in its own child process.

        Raises TaskFailed for the first task that dies or fails (after stopping the others) and
        Interrupted on SIGTERM/SIGHUP; KeyboardInterrupt passes through, tasks stopped.
        """
        ranks = deque(
            self.get_incomplete_ranks(range(self.local_rank_offset, self.local_rank_offset + self.local_tasks))
        )
        if not ranks:
            return
        gpus = task_gpus.visible() if self.gpus_per_task else []
        width = task_gpus.concurrent_tasks(self.label, self.workers, gpus, self.gpus_per_task)
        self.save_executor_as_json()
        fd, executor_file = tempfile.mkstemp(prefix="gristmill-executor-", suffix=".pik")
        with os.fdopen(fd, "wb") as f:
            dill.dump(self, f)
        # a task of a GPU stage sees only its slot's GPUs
        self._task_env = (
            {s: dict(os.environ, CUDA_VISIBLE_DEVICES=task_gpus.slot_devices(gpus, self.gpus_per_task, s))
             for s in range(width)}
            if self.gpus_per_task
            else {}
        )  # fmt: skip
        running: list[_Task] = []
        slots = list(range(min(width, len(ranks))))
        failure: TaskFailed | None = None
        try:
            with Signals():
                while (ranks and failure is None) or running:
                    while ranks and slots and failure is None:
                        running.append(self._start(ranks.popleft(), slots.pop(0), executor_file))
                    # Wakes early when a task writes its error or exits (EOF), else polls.
                    select.select([t.status_fd for t in running], [], [], POLL_S)
                    for task in [t for t in running if t.proc.poll() is not None]:
                        running.remove(task)
                        task.drain()
                        os.close(task.status_fd)
                        slots.append(task.slot)
                        if getattr(task.proc, "lost", False) and not self.is_rank_completed(task.rank):
                            ranks.appendleft(task.rank)  # died with the zygote, not of itself: again, with exec
                            continue
                        if not self.is_rank_completed(task.rank) and failure is None:
                            error = task.error.decode("utf-8", "replace").strip()
                            failure = TaskFailed(
                                task.rank, describe_exit(task.proc.returncode, error), self.task_log(task.rank)
                            )
                    for task in running:
                        task.drain()
                    if on_poll:
                        on_poll()
                    if failure is not None:
                        break
        finally:
            _stop(running)
            os.unlink(executor_file)
        if failure is not None:
            raise failure

    def _start(self, rank: int, slot: int, executor_file: str) -> _Task:
        status_r, status_w = os.pipe()
        env = self._task_env.get(slot)  # None: this process's environment
        try:
            proc = self._fork(rank, slot, executor_file, status_w, env) or subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    TASK_CMD,
                    json.dumps(sys.path),
                    executor_file,
                    str(rank),
                    str(slot),
                    str(os.getpid()),
                    str(status_w),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(status_w,),
                process_group=0,
                env=env,
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        os.set_blocking(status_r, False)
        return _Task(rank, slot, proc, status_r)

    @staticmethod
    def _fork(
        rank: int, slot: int, executor_file: str, status_w: int, env: dict | None
    ) -> task_zygote.ForkedProcess | None:
        """The task forked from this process's zygote; None where tasks start with exec."""
        zygote = task_zygote.shared()
        if zygote is None:
            return None
        try:
            return zygote.spawn(
                TASK_TARGET, [executor_file, str(rank), str(slot), str(zygote.pid)], (status_w,), env=env
            )
        except ZygoteUnavailable as e:
            task_zygote.give_up(str(e))
            return None


def make_executor(stage: Stage, remote: RemoteStage | None = None) -> LocalPipelineExecutor:
    """The local executor of a stage; with `remote`, the stage's folder is on object storage and
    each task runs in a working copy (`gristmill.pipeline.execution.staging`)."""
    return LocalExecutor(
        pipeline=stage.pipeline,
        tasks=stage.tasks,
        workers=stage.workers,
        logging_dir=str(stage.folder) if remote is None else _store_folder(remote.stage_url(), stage.storage),
        skip_completed=True,
        storage_config=stage.storage,  # the tasks reach URLs (inputs, models) with the run's settings
        remote=remote,
        gpus_per_task=stage.gpus_per_task,
        label=stage.label,
    )


def _store_folder(url: str, config: storage.StorageConfig):
    fs, path = storage.filesystem(url, config)
    return (path, fs)


class SlurmSubmitFailed(ValueError):
    """sbatch refused a stage's array; one line with Slurm's reason. The stage's arrays already
    submitted are cancelled."""


class SlurmExecutor(SlurmPipelineExecutor):
    """A stage as one or more job arrays of at most `max_array_size` tasks.

    datatrove submits the arrays of a wide stage one after the other (each `afterany` on the
    one before) and keeps only the last job id, so the next stage waited `afterok` on the last
    array alone: a failed task in an earlier array did not stop the chain, and the arrays ran in
    series. Here the arrays go in side by side, each exactly as large as its share of the ranks,
    each depending on every array of the stage before; `job_id` is their ids joined by `:`, the
    form Slurm's `--dependency=afterok:ID:ID...` takes, so the next stage (and the training job)
    waits for all of them. The tasks run datatrove's own `run()`: array task i of array k
    (`RUN_OFFSET=k`) runs entry k·max_array_size + i of `ranks_to_run.json`.
    """

    def __init__(self, *args, storage_config: storage.StorageConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage_config, self.remote = storage_config, None  # a Slurm run directory is a shared folder

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        return run_task(self, rank, local_rank, node_rank)

    def launch_merge_stats(self):
        pass  # merged from the per-task stats files by gristmill instead

    def launch_job(self):
        from copy import deepcopy

        if self.depends:  # submit the stages before first, in order (as datatrove does)
            if not self.depends.job_id:
                self.depends.launch_job()
            if self.depends.job_id != -1:
                self.depends_job_id = self.depends.job_id
            self.depends = None  # not pickled into this stage's executor
        ranks = self.get_incomplete_ranks()
        if not ranks:
            self.job_id = -1
            return
        with self.logging_dir.open("executor.pik", "wb") as f:
            dill.dump(deepcopy(self), f, fmode=dill.CONTENTS_FMODE)
        self.save_executor_as_json()
        with self.logging_dir.open("ranks_to_run.json", "w") as f:
            json.dump(ranks, f)  # read by every task: written once, before any is submitted
        jobs = -(-len(ranks) // self.tasks_per_job)  # array tasks, each running tasks_per_job ranks
        pickled = self.logging_dir.resolve_paths("executor.pik")
        srun = " ".join(f"--{k}={v}" for k, v in (self.srun_args or {}).items())
        command = (
            f"srun {srun} -l -n {self.nodes_per_task} launch_pickled_pipeline {pickled}"
            if self.with_srun
            else f"launch_pickled_pipeline {pickled}"
        )
        script = self.get_launch_file_contents(self.get_sbatch_args(min(jobs, self.max_array_size)), command)
        with self.logging_dir.open("launch_script.slurm", "w") as f:
            f.write(script)
        throttle = f"%{self.workers}" if self.workers != -1 else ""
        dependency = (
            f"{'afterany' if self.run_on_dependency_fail else 'afterok'}:{self.depends_job_id}"
            if self.depends_job_id
            else None
        )
        submitted: list[str] = []
        arrays = array_submissions(jobs, self.max_array_size, dependency, throttle)
        for k, args in enumerate(arrays):
            res = subprocess.run(["sbatch", "--parsable", *args], input=script, capture_output=True, text=True)
            if res.returncode != 0:
                if submitted:
                    subprocess.run(["scancel", *submitted], capture_output=True)
                reason = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
                undone = f"; cancelled its {len(submitted)} array(s) already submitted" if submitted else ""
                raise SlurmSubmitFailed(
                    f"stage {self.job_name}: sbatch refused array {k + 1} of {len(arrays)} ({args[0]}):"
                    f" {reason}{undone}"
                )
            submitted.append(res.stdout.strip().split(";")[0])
        self.job_id = ":".join(submitted)


def array_submissions(jobs: int, max_array_size: int, dependency: str | None, throttle: str = "") -> list[list[str]]:
    """sbatch's arguments for each array of a stage of `jobs` array tasks: `--array` sized to
    the array's share, the offset datatrove's `run()` maps task ids with, the dependency."""
    out = []
    for k, start in enumerate(range(0, jobs, max_array_size)):
        size = min(max_array_size, jobs - start)
        args = [f"--array=0-{size - 1}{throttle}", f"--export=ALL,RUN_OFFSET={k}"]
        if dependency:
            args.append(f"--dependency={dependency}")
        out.append(args)
    return out


def cluster_array_limit() -> int | None:
    """The largest job array the cluster takes, from `scontrol show config`: `MaxArraySize`
    (indices 0..MaxArraySize-1), or `SchedulerParameters=max_array_tasks=N` if smaller; None
    where scontrol cannot say (no Slurm client here: sbatch will say why)."""
    import re

    try:
        res = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    conf = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", res.stdout, re.M))
    limits = []
    if conf.get("MaxArraySize", "").isdigit():
        limits.append(int(conf["MaxArraySize"]))
    tasks = re.search(r"max_array_tasks=(\d+)", conf.get("SchedulerParameters", ""))
    if tasks:
        limits.append(int(tasks.group(1)))
    return min(limits) if limits else None


def array_size(configured: int, cluster: int | None) -> int:
    """Tasks per array: `executor.slurm.max_array_size`, or the cluster's limit if that is
    smaller (a config written for another cluster still runs; nobody has to look it up)."""
    from loguru import logger

    from gristmill.core.configlib import ConfigError

    if cluster is None:
        return configured
    if cluster < 1:
        raise ConfigError(
            f"executor.type: slurm: this cluster takes no job arrays (scontrol show config: MaxArraySize={cluster})"
        )
    if cluster < configured:
        logger.info(f"executor.slurm.max_array_size {configured}: the cluster takes arrays of {cluster} at most")
    return min(configured, cluster)


def default_venv_activate() -> str | None:
    activate = Path(sys.prefix) / "bin" / "activate"
    return str(activate) if activate.is_file() else None


def make_slurm_executor(stage: Stage, slurm: SlurmConfig, depends: SlurmExecutor | None) -> SlurmExecutor:
    over = slurm.stages.get(stage.name)
    cpus = (over and over.cpus_per_task) or slurm.cpus_per_task
    mem_gb = (over and over.mem_per_cpu_gb) or slurm.mem_per_cpu_gb
    sbatch = dict(slurm.sbatch_args)
    # datatrove writes `--mem-per-cpu={gb}G`, which takes only whole gigabytes; MB is exact.
    sbatch.setdefault("mem-per-cpu", f"{int(mem_gb * 1024)}M")
    if slurm.account:
        sbatch.setdefault("account", slurm.account)
    if stage.gpus_per_task:  # each array task its own GPUs; Slurm sets CUDA_VISIBLE_DEVICES
        sbatch.setdefault("gres", f"gpu:{stage.gpus_per_task}")
    return SlurmExecutor(
        pipeline=stage.pipeline,
        tasks=stage.tasks,
        time=(over and over.time) or slurm.time,
        partition=slurm.partition,
        cpus_per_task=cpus,
        job_name=f"{slurm.job_name_prefix}-{stage.name}",
        qos=slurm.qos or "",
        env_command=slurm.env_command,
        venv_path=None if slurm.env_command else (slurm.venv_path or default_venv_activate()),
        sbatch_args=sbatch,
        max_array_size=array_size(slurm.max_array_size, cluster_array_limit()),
        depends=depends,
        logging_dir=str(stage.folder),
        slurm_logs_folder=str(stage.folder / "slurm_logs"),
        skip_completed=True,
        requeue=slurm.requeue,
        mail_type="NONE",
        # inputs and models may be URLs (the run directory is local: a store's is refused with Slurm)
        storage_config=stage.storage,
    )
