"""The same run on the local executor and on Ray: wall and CPU, pair by pair.

    PYTHONPATH=src python benchmarks/ray_vs_local.py [--gb 0.25] [--tasks 8] [--workers 2]
        [--pairs 2] [--address HOST:PORT] [--work /tmp/gristmill-scale] [--smoke]

The run: `configs/crawl.yaml`'s steps up to near dedup (filters, both model filters, exact and
near dedup; no tokenization, no training) on a generated Common Crawl corpus of `--gb` GB
(`make_wet_corpus.py`, seed 1, kept in `--work` and reused: the scale run's corpus). Each pair
runs `pipeline run` (the real CLI) with `executor.type: local` (`--workers` tasks at once), then
with `executor.type: ray` on a Ray cluster: `--address`, or else a one-node cluster this script
starts with `--workers` CPUs (so both sides run as many tasks at once) and stops by its pid at
the end. The two runs of a pair run back to back, so that the load of a shared machine weighs on
both alike, local first in odd pairs and Ray first in even ones; the load average is printed with
each pair.

Per run: the command's wall time; CPU seconds of the tasks (their `<stage>/usage/` records, the
same on both sides); CPU of everything else: locally the command itself, on Ray the command plus
the cluster's processes (raylet, GCS, workers; read from /proc for a cluster this script started,
not counted for one given by `--address`). The outputs of the two runs of a pair are compared
byte for byte.

`--smoke`: the 2 MB corpus, 1 task per stage (a second Ray worker's start-up doubled the Ray
side), one pair, the steps up to exact dedup (4 stages), in a temporary directory unless
`--work` is given (the corpus is reused from there, as a full run reuses the scale run's; checks
that it runs; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale_run import corpus  # noqa: E402

from gristmill.pipeline.execution.usage import stage_usage  # noqa: E402

LAST_STEP = "near_dedup"
SMOKE_LAST_STEP = "exact_dedup"  # --smoke: curate and exact dedup's three stages, the same code path
#: this checkout's code first, in the commands, the cluster and its workers
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
TICK = os.sysconf("SC_CLK_TCK")


def config(wet: Path, run_dir: Path, executor: dict, last: str = LAST_STEP) -> dict:
    crawl = yaml.safe_load((ROOT / "configs" / "crawl.yaml").read_text())
    names = [next(iter(s)) if isinstance(s, dict) else s for s in crawl["steps"]]
    return {
        "run_dir": str(run_dir),
        "executor": executor,
        "input": {"paths": [str(wet / "*.warc.wet.gz")]},
        "steps": crawl["steps"][: names.index(last) + 1],
        "output": crawl["output"],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[3]) == sid:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return pids


class Cluster:
    """A one-node Ray cluster in its own session (`ray start --head --block`), stopped by pid."""

    def __init__(self, cpus: int):
        self.temp = Path(tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp"))  # AF_UNIX paths: short
        token = self.temp / "auth_token"
        token.write_text(secrets.token_hex(16))
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        port = _free_port()
        log = self.temp / "start.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--num-cpus", str(cpus)]
                + ["--port", str(port), "--temp-dir", str(self.temp), "--include-dashboard", "false"]
                + ["--object-store-memory", "200000000", "--disable-usage-stats"]
                + ["--ray-client-server-port", str(_free_port()), "--dashboard-port", str(_free_port())]
                + ["--dashboard-agent-listen-port", str(_free_port()), "--runtime-env-agent-port", str(_free_port())],
                env={**os.environ, **self.env, "RAY_memory_monitor_refresh_ms": "0", "PYTHONPATH": PYTHONPATH},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while "Ray runtime started" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.address = f"127.0.0.1:{port}"

    def _cpu_now(self) -> dict[tuple[int, str], tuple[float, float, tuple[int, str] | None]]:
        """Each live process of the cluster, by (pid, start time): its own CPU seconds, its reaped
        children's, and its parent's key (None outside the cluster)."""
        stats = {}
        for pid in _session_pids(self.proc.pid):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            stats[pid] = fields
        out = {}
        for pid, fields in stats.items():
            ppid = int(fields[1])
            parent = (ppid, stats[ppid][19]) if ppid in stats else None
            own = (int(fields[11]) + int(fields[12])) / TICK  # utime stime
            children = (int(fields[13]) + int(fields[14])) / TICK  # cutime cstime
            out[(pid, fields[19])] = (own, children, parent)
        return out

    @contextmanager
    def cpu_meter(self):
        """Yields a dict whose "cpu_s" is, afterwards, the CPU the cluster spent meanwhile.

        Sampled every 0.2 s. Each process counts its own CPU at its last sample (the raylet
        lets its dead workers go unaccounted: their CPU never reaches its cutime). A Ray worker
        reaps its task processes, so their CPU reaches its cutime when each ends: of that, what
        the samples of those processes already counted is not counted again; the rest (a task
        process too short-lived to be sampled, the last moments of one) is."""
        first, last, done, result = self._cpu_now(), {}, threading.Event(), {}

        def sample():
            while not done.wait(0.2):
                last.update(self._cpu_now())

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield result
        finally:
            done.set()
            thread.join()
            now = self._cpu_now()
            last.update(now)
            own = {k: v[0] - first.get(k, (0.0,))[0] for k, v in last.items()}
            reaped = {}  # parent -> own CPU, as sampled, of its children that have ended
            for k, (_, _, parent) in last.items():
                if k not in now and parent is not None:
                    reaped[parent] = reaped.get(parent, 0.0) + own[k]
            children = {k: max(0.0, v[1] - first.get(k, (0.0, 0.0))[1] - reaped.get(k, 0.0)) for k, v in last.items()}
            result["cpu_s"] = sum(own.values()) + sum(children.values())

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in _session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


def run(cfg: dict, work: Path, env: dict, cluster: Cluster | None = None) -> dict:
    run_dir = Path(cfg["run_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    path = work / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    before = os.times()
    with cluster.cpu_meter() if cluster else contextlib.nullcontext({}) as ray_cpu:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "gristmill.cli", "run", str(path)],
            cwd=ROOT,  # the config's model paths are relative to the repository
            env={**os.environ, **env, "PYTHONPATH": PYTHONPATH},
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - start
    after = os.times()
    if proc.returncode:
        sys.exit(f"{path}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    plan = json.loads((run_dir / "plan.json").read_text())["stages"]
    tasks_cpu = sum(u.cpu_s for st in plan if (u := stage_usage(run_dir / st["label"])))
    command_cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return {
        "wall_s": wall,
        "tasks_cpu_s": tasks_cpu,
        # locally the tasks are the command's children, on Ray the cluster's processes' children
        "other_cpu_s": command_cpu + ray_cpu.get("cpu_s", 0.0) - tasks_cpu,
        "stages": len(plan),
        "output": final_output(run_dir, plan),
    }


def final_output(run_dir: Path, plan: list[dict]) -> dict[str, bytes]:
    last = [st["label"] for st in plan if (run_dir / st["label"] / "output").is_dir()][-1]
    folder = run_dir / last / "output"
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=0.25)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="local workers; CPUs of the cluster started here")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--address", help="an existing Ray cluster (default: start a one-node cluster here)")
    ap.add_argument("--work", type=Path, help="corpus and runs (default: /tmp/gristmill-scale)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="2 MB corpus, 1 task, one pair: checks that it runs")
    args = ap.parse_args()
    if args.smoke:
        args.gb, args.tasks, args.pairs = 0.002, 1, 1
    work = args.work or (Path(tempfile.mkdtemp(prefix="ray-vs-local-")) if args.smoke else Path("/tmp/gristmill-scale"))
    work.mkdir(parents=True, exist_ok=True)
    wet = corpus(work, args.gb, args.seed)
    size = sum(p.stat().st_size for p in wet.glob("*.warc.wet.gz")) / 1e9
    last = SMOKE_LAST_STEP if args.smoke else LAST_STEP
    print(f"corpus: {wet} ({size:.3f} GB); steps of configs/crawl.yaml up to {last}; tasks {args.tasks}")
    local = config(wet, work / "run-local", {"type": "local", "tasks": args.tasks, "workers": args.workers}, last)
    if importlib.util.find_spec("ray") is None:
        r = run(local, work, {})
        print(f"local: {r['wall_s']:.1f} s wall, {r['tasks_cpu_s']:.1f} CPU s in tasks")
        print("ray side skipped: ray is not installed (pip install -e '.[ray]')")
        return
    cluster = None if args.address else Cluster(args.workers)
    try:
        address = args.address or cluster.address
        env = cluster.env if cluster else {}
        on_ray = config(
            wet,
            work / "run-ray",
            {"type": "ray", "tasks": args.tasks, "ray": {"address": address, "num_cpus": 1}},
            last,
        )
        print(f"ray cluster: {address}" + (f" ({args.workers} CPUs, started here)" if cluster else ""))
        rows = []
        for pair in range(1, args.pairs + 1):
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            # back to back, the first in turn (a cold page cache or a load spike favours the second)
            if pair % 2:
                a = run(local, work, {})
                b = run(on_ray, work, env, cluster)
            else:
                b = run(on_ray, work, env, cluster)
                a = run(local, work, {})
            same = a["output"] == b["output"] and bool(a["output"])
            rows.append((a, b))
            print(
                f"pair {pair} ({'local' if pair % 2 else 'ray'} first; load average before: {load};"
                f" {a['stages']} stages):\n"
                f"  local: {a['wall_s']:7.1f} s wall, {a['tasks_cpu_s']:7.1f} CPU s in tasks,"
                f" {a['other_cpu_s']:6.1f} CPU s besides\n"
                f"  ray:   {b['wall_s']:7.1f} s wall, {b['tasks_cpu_s']:7.1f} CPU s in tasks,"
                f" {b['other_cpu_s']:6.1f} CPU s besides" + ("" if cluster else " (cluster's own not counted)") + "\n"
                f"  outputs identical: {'yes' if same else 'NO'}\n"
                f"  ratio ray/local: wall {b['wall_s'] / a['wall_s']:.3f},"
                f" CPU in tasks {b['tasks_cpu_s'] / a['tasks_cpu_s']:.3f},"
                f" all CPU {(b['tasks_cpu_s'] + b['other_cpu_s']) / (a['tasks_cpu_s'] + a['other_cpu_s']):.3f}"
            )
            if not same:
                sys.exit("the Ray run's final documents differ from the local run's")
        walls = [b["wall_s"] / a["wall_s"] for a, b in rows]
        print(f"ratio ray/local (wall), per pair: {', '.join(f'{w:.3f}' for w in walls)}")
        # each side runs first in turn: a load that rises or falls through a pair favours the
        # first run, and the geometric mean over pairs cancels that
        print(f"ratio ray/local (wall), geometric mean over pairs: {math.prod(walls) ** (1 / len(walls)):.3f}")
    finally:
        if cluster:
            cluster.stop()
        if args.smoke and not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
