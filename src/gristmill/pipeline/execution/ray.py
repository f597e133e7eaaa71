"""`executor.type: ray`: each stage's tasks as Ray tasks on an existing cluster.

One `ray.remote` task per rank; Ray places them by the CPUs and memory each asks for (the
planner's per-stage memory estimate unless configured) and runs as many at once as the
cluster holds. gristmill sequences the stages, as it does locally: a stage starts when every
task of the one before has its completion marker.

A Ray task runs its rank the way the local executor does (`task.task_process`): in a child
process of the Ray worker, forked from the worker's task zygote (`task_zygote`: the imports
paid once per worker, not ~1 CPU s per task; exec where tasks start so), so that
- `getrusage` in that process measures the task alone (`<stage>/usage/task_NNNNN.json`), the
  same figures as a local run, whatever the Ray worker ran before;
- a task killed by a signal (the OOM killer's SIGKILL, a segfault in native code) is named by
  its signal and run again in the same Ray task, up to `max_retries` times, with one warning
  line each time (Ray's own retry would print a traceback per retry); a Ray worker that dies
  (node lost, Ray's memory monitor, a SIGKILL) takes its task process along
  (PR_SET_PDEATHSIG) and Ray retries the task, up to `max_retries` times too;
- its log is `<stage>/logs/task_NNNNN.log`, warnings show on the terminal (through Ray's
  log_to_driver), stats, completions and outputs are datatrove's, as locally.
A task that raises is not retried (it would raise again). A task that fails for good lets the
stage's other tasks run to their end (locally the others are stopped; a cluster runs many, and
a re-run then redoes only the failed ones), then fails the stage with one line. On Ctrl-C or
SIGTERM the stage's tasks are cancelled (`ray.cancel(force=True)` kills their workers; a task's
process dies with its worker through PR_SET_PDEATHSIG); completed tasks stay complete, and
re-running the command runs the rest.

The run directory (and the inputs and models, by the paths the configuration gives, relative
to the command's working directory) must be on a filesystem every Ray node mounts at the same
path: a task that completes on a node whose files the driver cannot see fails the stage with
that explanation.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

import dill
from datatrove.executor.base import DistributedEnvVars, PipelineExecutor

from gristmill.compat import ray as compat_ray
from gristmill.config import ConfigError, RunConfig
from gristmill.pipeline.execution import zygote as task_zygote
from gristmill.pipeline.execution.task import (
    POLL_S,
    STOP_GRACE_S,
    TASK_CMD,
    Interrupted,
    Signals,
    TaskFailed,
    describe_exit,
    run_task,
    task_process,
)
from gristmill.pipeline.execution.zygote import ZygoteUnavailable
from gristmill.pipeline.planning.planner import Stage, estimate_memory

GB = 1 << 30
#: environment variables of the command that its tasks see on Ray too (the local executor's
#: tasks inherit the whole environment; a Ray worker has its node's)
FORWARDED_ENV_PREFIX = "GRISTMILL_"


def _run_forked(status_fd: int, executor_fd: int, rank: str, local_rank: str, parent: str) -> None:
    """In the task's process forked by the Ray worker's zygote: the local executor's task body,
    the pickled executor read from the fd it was handed."""
    task_process(status_fd, f"/dev/fd/{executor_fd}", rank, local_rank, parent)


_FORKED_TARGET = "gristmill.pipeline.execution.ray:_run_forked"


def _start_child(executor_fd: int, rank: int, cwd: str, env: dict[str, str], status_w: int):
    """The task's process, forked from this Ray worker's task zygote (the worker runs task after
    task, so its zygote's imports are paid once, not ~1 CPU s per task), or started with exec
    where tasks start so (`GRISTMILL_TASK_START=exec`, or the zygote gave up)."""
    zygote = task_zygote.shared()
    if zygote is not None:
        try:
            return zygote.spawn(
                _FORKED_TARGET, [str(rank), "0", str(zygote.pid)], (status_w, executor_fd), cwd, {**os.environ, **env}
            )
        except ZygoteUnavailable as e:
            task_zygote.give_up(str(e))
    return subprocess.Popen(
        [sys.executable, "-c", TASK_CMD, json.dumps(sys.path), f"/dev/fd/{executor_fd}", str(rank), "0"]
        + [str(os.getpid()), str(status_w)],
        cwd=cwd,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        pass_fds=(status_w, executor_fd),
        process_group=0,
    )


def _run_child(executor_fd: int, rank: int, cwd: str, env: dict[str, str]) -> tuple[int, str]:
    """Run `rank` in a child process, as the local executor does; (returncode, its error line).

    The child reads the pickled executor from `executor_fd` (an unlinked file: nothing is left
    behind when the Ray worker is killed) and writes its one error line to a pipe, read while it
    runs (a long line must not block it) and not up to EOF once it has exited (a process the
    task forked could hold the pipe open)."""
    status_r, status_w = os.pipe()
    proc = None
    try:
        proc = _start_child(executor_fd, rank, cwd, env, status_w)
        os.close(status_w)
        status_w = -1
        os.set_blocking(status_r, False)
        error, eof = b"", False
        while True:
            exited = proc.poll() is not None
            try:
                while chunk := os.read(status_r, 65536):
                    error += chunk
                eof = True
            except BlockingIOError:
                pass
            if exited:
                break
            if eof:  # nothing more to read: only the exit is left to wait for
                proc.wait()
            else:
                select.select([status_r], [], [], POLL_S)
        return proc.returncode, error.decode("utf-8", "replace").strip()
    finally:
        if status_w >= 0:
            os.close(status_w)
        os.close(status_r)
        if proc is not None and proc.poll() is None:  # interrupted here: take the task process along
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _run_task(payload: bytes, rank: int, cwd: str, env: dict[str, str], retries: int) -> dict:
    """The body of a Ray task: run `rank` of the pickled executor in a child process, again
    (up to `retries` times) while that process dies by a signal.

    Returns {"node", "returncode", "error", "attempts"}. A task that fails with an error is not
    run again: it would fail the same way. (A Ray worker that dies is retried by Ray.)
    """
    node = socket.gethostname()
    if not os.path.isdir(cwd):
        return {
            "node": node,
            "returncode": 1,
            "error": f"the command's working directory {cwd} does not exist on node {node}; "
            "Ray nodes need the run directory, inputs and models at the same paths",
            "attempts": 1,
        }
    with tempfile.TemporaryFile(prefix="gristmill-executor-") as f:  # unlinked from the start
        f.write(payload)
        f.flush()
        for attempt in range(1, retries + 2):
            returncode, error = _run_child(f.fileno(), rank, cwd, env)
            if returncode >= 0 or attempt > retries:
                break
            # one line on the terminal (Ray's log_to_driver), where the local executor would fail
            print(
                f"WARNING  | task {rank} {describe_exit(returncode, '')} on node {node};"
                f" running it again (retry {attempt} of {retries})",
                file=sys.stderr,
                flush=True,
            )
    return {"node": node, "returncode": returncode, "error": error, "attempts": attempt}


#: how often a stage's driver looks whether its node's raylet still answers (a connect to its
#: socket; Ray itself notices its death after about a minute)
RAYLET_CHECK_S = 2.0


class RayExecutor(PipelineExecutor):
    """One stage on Ray; `run` submits its incomplete tasks and follows them to the end."""

    def __init__(self, pipeline, tasks: int, logging_dir: str, options: dict, max_retries: int, storage_config) -> None:
        super().__init__(pipeline, logging_dir, skip_completed=True)
        self.tasks = tasks
        self.options = options  # ray.remote options: num_cpus, memory
        self.max_retries = max_retries
        # travel with the pickled executor to each task; a Ray run directory is a shared folder
        self.storage_config, self.remote = storage_config, None

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        return run_task(self, rank, local_rank, node_rank)

    @property
    def world_size(self) -> int:
        return self.tasks

    def get_distributed_env(self, node_rank: int = -1) -> DistributedEnvVars:
        return DistributedEnvVars(
            datatrove_node_ips="localhost",
            datatrove_cpus_per_task=str(self.options.get("num_cpus", 1)),
            datatrove_mem_per_cpu="-1",
            datatrove_gpus_on_node="-1",
            datatrove_executor="RAY",
        )

    def task_log(self, rank: int) -> str:
        return self.logging_dir.resolve_paths(f"logs/task_{rank:05d}.log")

    def run(self, on_poll: Callable[[], None] | None = None) -> None:
        """Run every incomplete task on the cluster.

        A task that fails for good does not stop the others (on a cluster they are many, and a
        re-run then has only the failed ones to do): when all have ended, TaskFailed names the
        first that failed. Raises Interrupted on SIGTERM/SIGHUP and passes KeyboardInterrupt
        through, the stage's tasks cancelled.
        """
        import ray

        ranks = self.get_incomplete_ranks(range(self.tasks))
        if not ranks:
            return
        self.save_executor_as_json()
        payload = ray.put(dill.dumps(self))
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}
        task = ray.remote(_run_task)
        options = dict(max_retries=self.max_retries, retry_exceptions=False, **self.options)
        label = os.path.basename(self.logging_dir.path.rstrip("/"))
        running = {
            task.options(name=f"{label}:task_{rank:05d}", **options).remote(
                payload, rank, os.getcwd(), env, self.max_retries
            ): rank
            for rank in ranks
        }
        failed: list[tuple[int, str]] = []
        lost = None  # the socket of this node's raylet, once it is gone
        look_at = time.monotonic() + RAYLET_CHECK_S
        try:
            with _SignalsThroughRay() as signals, signals.named():
                while running:
                    done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_S)
                    for ref in done:
                        rank = running.pop(ref)
                        cause = self._why_incomplete(ref, rank)
                        if cause:
                            failed.append((rank, cause))
                    if on_poll:
                        on_poll()
                    if running and time.monotonic() > look_at:
                        look_at = time.monotonic() + RAYLET_CHECK_S
                        lost = compat_ray.raylet_gone()
                    if lost is not None:
                        # Ray would end this process in about a minute with its own lines only
                        rank = min(running.values())
                        raise TaskFailed(
                            rank,
                            f"could not be followed: the raylet of the Ray node this command runs on is gone"
                            f" (nothing answers on {lost}); start Ray on this node again and re-run: completed"
                            f" tasks are kept",
                            self.task_log(rank),
                        )
        finally:
            if lost is None:
                _cancel(list(running))  # interrupted: the tasks still queued or running
            del payload
        if failed:
            rank, cause = failed[0]
            others = sorted(r for r, _ in failed[1:])
            if others:
                listed = ", ".join(map(str, others[:5])) + (" ..." if len(others) > 5 else "")
                cause += f" (task{'s' if len(others) > 1 else ''} {listed} failed too)"
            raise TaskFailed(rank, cause, self.task_log(rank))

    def _why_incomplete(self, ref, rank: int) -> str | None:
        """None when the task completed, else why not, in words."""
        import ray
        from ray import exceptions as rx

        try:
            result = ray.get(ref)
        except rx.RayTaskError as e:  # gristmill's own code failed in the Ray task
            return f"failed in its Ray task: {type(e.cause).__name__}: {_first_line(str(e.cause))}"
        except rx.OutOfMemoryError as e:
            return (
                f"was killed by Ray's memory monitor (out of memory){_retried(self.max_retries)}: {_first_line(str(e))}"
            )
        except (rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError) as e:
            return f"lost its Ray worker ({type(e).__name__}){_retried(self.max_retries)}: {_first_line(str(e))}"
        except rx.TaskCancelledError:
            return "was cancelled in Ray"
        except rx.RayError as e:
            return f"could not run on Ray: {type(e).__name__}: {_first_line(str(e))}"
        if result["returncode"] or result["error"]:
            cause = describe_exit(result["returncode"], result["error"])
            return f"{cause} on node {result['node']}{_retried(result['attempts'] - 1)}"
        if not self.is_rank_completed(rank):
            where = self.logging_dir.resolve_paths(f"completions/{rank:05d}")
            return (
                f"ended on node {result['node']} but {where} is not there: the run directory must be on a"
                " filesystem every Ray node mounts at the same path"
            )
        return None


class _SignalsThroughRay(Signals):
    """SIGTERM/SIGHUP raise Interrupted, as locally; but a handler's exception raised while Ray
    waits comes out of `ray.wait` as a plain KeyboardInterrupt, so the signal is noted here and
    `named()` gives it back its name (the runner reports it and exits 128 + signal)."""

    received: int | None = None

    def _raise(self, signum, frame):
        self.received = signum
        raise Interrupted(signum)

    @contextmanager
    def named(self):
        try:
            yield
        except KeyboardInterrupt as e:
            if self.received is not None and not isinstance(e, Interrupted):
                raise Interrupted(self.received) from None
            raise


def _retried(times: int) -> str:
    return f", also on its {times} retr{'y' if times == 1 else 'ies'}" if times else ""


def _first_line(text: str) -> str:
    """The first line of a message, without its full stop (the stage's line goes on after it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else ""


def _cancel(refs: list) -> None:
    """Cancel the tasks (their workers killed) and wait a little for Ray to confirm."""
    if not refs:
        return
    import ray

    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - finished meanwhile, or Ray already gone: nothing to stop
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_S)
    except Exception:  # noqa: BLE001
        pass


def _fits(node: dict, want: dict) -> bool:
    have = node.get("Resources", {})
    return (
        node.get("Alive", False)
        and have.get("CPU", 0) >= want["num_cpus"]
        and have.get("memory", 0) >= want["memory"]
        and have.get("GPU", 0) >= want.get("num_gpus", 0)
    )


class RayCluster:
    """The run's connection to its Ray cluster: connect, one executor per stage, close."""

    def __init__(self, cfg: RunConfig, stages: list[Stage]):
        self.cfg = cfg
        self.ray_cfg = cfg.executor.ray
        self.estimates = {e.stage.label: e.bytes for e in estimate_memory(cfg, stages)}
        self.stages = stages
        self.address: str | None = None

    def resources(self, stage: Stage) -> dict:
        """num_cpus, memory (bytes) and, for a stage holding a GPU step, num_gpus (Ray then sets
        each task's CUDA_VISIBLE_DEVICES) that each task of `stage` asks Ray for."""
        over = self.ray_cfg.stages.get(stage.name)
        cpus = (over and over.num_cpus) or self.ray_cfg.num_cpus
        gb = (over and over.memory_gb) or self.ray_cfg.memory_gb
        want = {"num_cpus": cpus, "memory": int(gb * GB) if gb else self.estimates[stage.label]}
        if stage.gpus_per_task:
            want["num_gpus"] = stage.gpus_per_task
        return want

    def _setting(self, stage: Stage) -> str:
        over = self.ray_cfg.stages.get(stage.name)
        if over and over.memory_gb:
            return f"executor.ray.stages.{stage.name}.memory_gb"
        if self.ray_cfg.memory_gb:
            return "executor.ray.memory_gb"
        return f"the planner's estimate; executor.ray.stages.{stage.name}.memory_gb sets it"

    def connect(self) -> None:
        """Connect, and refuse (ConfigError, one line) a cluster that is unreachable or where no
        node could ever run a task of some stage; before anything is written."""
        import signal

        # ray.init installs its own SIGTERM handler (sys.exit): keep ours, the runner's
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.address = compat_ray.connect(
                self.ray_cfg.address, self.ray_cfg.connect_timeout_s, self.ray_cfg.runtime_env
            )
        except compat_ray.Unreachable as e:
            raise ConfigError(f"executor.ray.address: {e}") from None
        finally:
            for s, handler in previous.items():
                if handler is not None:
                    signal.signal(s, handler)
        if not self.ray_cfg.autoscaling:
            try:
                self._check_room()
            except BaseException:
                self.close()
                raise

    def _check_room(self) -> None:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        for stage in self.stages:
            want = self.resources(stage)
            if any(_fits(n, want) for n in nodes):
                continue
            largest = max(nodes, key=lambda n: n["Resources"].get("memory", 0), default=None)
            gpus = want.get("num_gpus", 0)
            has = (
                f"{largest['Resources'].get('CPU', 0):g} CPUs and {largest['Resources'].get('memory', 0) / GB:.2f} GB"
                + (f" and {largest['Resources'].get('GPU', 0):g} GPUs" if gpus else "")
                if largest
                else "no node"
            )
            raise ConfigError(
                f"stage {stage.label}: a task asks Ray for {want['num_cpus']:g} CPUs"
                + (f", {gpus:g} GPUs" if gpus else "")
                + f" and {want['memory'] / GB:.2f} GB"
                f" of memory ({self._setting(stage)}); no node of the Ray cluster at {self.address} has that"
                f" (the largest: {has}); set executor.ray.autoscaling if the cluster adds nodes on demand"
            )

    def executor(self, stage: Stage) -> RayExecutor:
        return RayExecutor(
            pipeline=stage.pipeline,
            tasks=stage.tasks,
            logging_dir=str(stage.folder.absolute()),
            options=self.resources(stage),
            max_retries=self.ray_cfg.max_retries,
            # the tasks reach URLs (inputs, models) with the run's storage settings, on every node
            storage_config=stage.storage,
        )

    def close(self) -> None:
        import ray

        # without its raylet, ray.shutdown waits on it: the process ends, which Ray survives
        if ray.is_initialized() and compat_ray.raylet_gone() is None:
            ray.shutdown()

    def __enter__(self) -> RayCluster:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
