"""Common Crawl streamed from an S3 server against the same files read from local disk.

    python benchmarks/stream_vs_local.py [--gb 0.25] [--file-mb 150] [--repeat 1] [--work DIR] [--smoke]

A generated corpus (`make_wet_corpus.py --gb GB --file-mb MB --seed 1`, kept in
WORK/wet-GB-MBmb; files of Common Crawl's size by default, one curate task each) is laid out
as a Common Crawl crawl (`crawl-data/<crawl>/wet.paths.gz` plus the files) twice: as a local
mirror directory, and in a `commoncrawl` bucket of moto's S3 server, which runs in its own process
(started here on 127.0.0.1, stopped at the end) so that its CPU is not the pipeline's. The same
config then runs on both, `pipeline run` with `input.commoncrawl.base_url: <mirror>` (files read
in place) and with `source: s3` (`cache: none`: each task streams its files through botocore,
signed requests, nothing written to disk), and their curate stages are compared from the tasks'
own usage records: CPU seconds per GB of compressed WET (summed over tasks) and each task's
peak RSS. Two configs: `curate` (the reader, langid, Gopher quality and repetition, C4 lines:
configs/commoncrawl.yaml's steps) and `reader` (the WET reader alone: where streaming's own cost
is the largest share). The documents of both sides are checked identical (id and text, in order).
Sides alternate, `--repeat` times; the lowest CPU of each side is kept (this machine is shared).

Prints per config: CPU s per GB of each side, the ratio (stream / local), the largest task
peak RSS of each side, and the S3 server's CPU (its own process; not in the ratio).

`--smoke`: a 2 MB corpus in 1 MB files, the reader config, one round (seconds).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gristmill.pipeline.execution.usage import stage_usage  # noqa: E402

CRAWL = "CC-MAIN-2024-10"
SEGMENT = "1707947473347.0"
BUCKET = "commoncrawl"
LID = ROOT / "models" / "lid.176.ftz"
STEPS = {
    "curate": [
        {"langid": {"model": str(LID), "languages": ["en"], "min_score": 0.65}},
        {"gopher_quality": {}},
        {"gopher_repetition": {}},
        {"c4_lines": {}},
    ],
    "reader": [],
}
# moto's S3 server in a process of its own: prints its port, serves until its stdin closes
SERVE = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


def corpus(work: Path, gb: float, file_mb: float, smoke: bool) -> Path:
    out = work / f"wet-{gb:g}-{file_mb:g}mb"
    if not (out / "truth.jsonl").is_file():
        cmd = [sys.executable, str(ROOT / "benchmarks" / "make_wet_corpus.py"), "--seed", "1", str(out)]
        cmd += (["--smoke"] if smoke else ["--gb", str(gb)]) + ["--file-mb", str(file_mb)]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return out


def layout(wet: Path) -> dict[str, Path]:
    """Listing-relative key -> file, as Common Crawl lays out a crawl."""
    files = sorted(wet.glob("*.warc.wet.gz"))
    return {f"crawl-data/{CRAWL}/segments/{SEGMENT}/wet/{f.name}": f for f in files}


def make_mirror(work: Path, keys: dict[str, Path]) -> Path:
    mirror = work / "mirror"
    listing = mirror / "crawl-data" / CRAWL / "wet.paths.gz"
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_bytes(gzip.compress(("\n".join(keys) + "\n").encode(), mtime=0))
    for key, f in keys.items():
        dest = mirror / key
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            dest.symlink_to(f.resolve())
    return mirror


def aws_env(endpoint: str) -> dict[str, str]:
    """botocore pointed at the loopback server with test credentials; nothing of this machine's
    AWS set-up, never the instance metadata service."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }
    )
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(var, None)
    return env


class S3Server:
    """moto's S3 server in its own process on 127.0.0.1."""

    def __enter__(self) -> S3Server:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        port = self.proc.stdout.readline().strip()
        if not port.isdigit():
            self.proc.kill()
            raise RuntimeError("moto's S3 server did not start (is the test extra installed?)")
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def upload(self, mirror: Path, keys: dict[str, Path]) -> None:
        import botocore.session

        env = aws_env(self.endpoint)
        client = botocore.session.get_session().create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=BUCKET)
        for key in [f"crawl-data/{CRAWL}/wet.paths.gz", *keys]:
            with open(mirror / key, "rb") as body:
                client.put_object(Bucket=BUCKET, Key=key, Body=body)

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()  # the server stops when its stdin closes
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_side(work: Path, name: str, steps: list, cc: dict, files: int, env: dict) -> Path:
    run_dir = work / "runs" / name
    cfg = {
        "run_dir": str(run_dir),
        "executor": {"type": "local", "tasks": files, "workers": 2},
        "input": {"commoncrawl": {"crawl": CRAWL, "files": files, **cc}},
        "steps": steps,
        "output": {"dropped_sample": 0},
    }
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "gristmill.cli", "run", str(path), "--force"]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL)
    return run_dir


def documents_digest(run_dir: Path) -> tuple[int, str]:
    """(documents, sha256 of their ids and texts in order) of the curate stage's output."""
    h, n = hashlib.sha256(), 0
    for f in sorted((run_dir / "01_curate" / "output").rglob("*.parquet")):
        t = pq.read_table(f, columns=["id", "text"])
        for i, text in zip(t.column("id").to_pylist(), t.column("text").to_pylist()):
            h.update(i.encode() + b"\0" + text.encode() + b"\0")
            n += 1
    return n, h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=0.25)
    ap.add_argument("--file-mb", type=float, default=150)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--configs", nargs="+", choices=sorted(STEPS), default=["curate", "reader"])
    ap.add_argument("--work", type=Path, help="corpus, mirror and runs (default: /tmp/gristmill-stream)")
    ap.add_argument("--smoke", action="store_true", help="a 2 MB corpus in 1 MB files, the reader config, one round")
    args = ap.parse_args()
    if args.smoke:
        args.gb, args.file_mb, args.repeat, args.configs = 0.002, 1, 1, ["reader"]
        args.work = args.work or Path(tempfile.mkdtemp(prefix="gristmill-stream-smoke-"))
    work = args.work or Path("/tmp/gristmill-stream")
    work.mkdir(parents=True, exist_ok=True)
    if "curate" in args.configs and not LID.is_file():
        sys.exit(f"{LID} is missing (make models)")

    wet = corpus(work, args.gb, args.file_mb, args.smoke)
    keys = layout(wet)
    mirror = make_mirror(work, keys)
    size = sum(f.stat().st_size for f in keys.values())
    gb = size / 1e9
    print(f"corpus: {len(keys)} WET files, {size / 1e6:,.1f} MB compressed ({wet})")

    with S3Server() as s3:
        t0 = time.monotonic()
        s3.upload(mirror, keys)
        print(f"S3 server {s3.endpoint} (pid {s3.proc.pid}): bucket {BUCKET} filled in {time.monotonic() - t0:.1f} s")
        sides = {
            "local": ({"base_url": str(mirror)}, {k: v for k, v in os.environ.items()}),
            "stream": ({"source": "s3", "cache": "none"}, aws_env(s3.endpoint)),
        }
        for config in args.configs:
            best: dict[str, dict] = {}
            digests = {}
            server_cpu = []
            for round_ in range(args.repeat):
                for side, (cc, env) in sides.items():
                    before = s3.cpu_s()
                    run_dir = run_side(work, f"{config}-{side}", STEPS[config], cc, len(keys), env)
                    if side == "stream":
                        server_cpu.append(s3.cpu_s() - before)
                    u = stage_usage(run_dir / "01_curate")
                    digests[side] = documents_digest(run_dir)
                    row = {"cpu_s": u.cpu_s, "rss_mb": u.max_rss_mb, "wall_s": u.wall_s, "tasks": u.tasks}
                    print(
                        f"  {config} {side} round {round_ + 1}: {u.cpu_s:.1f} CPU s, {u.wall_s:.1f} s wall, "
                        f"{u.tasks} tasks, largest task peak RSS {u.max_rss_mb:.0f} MB"
                    )
                    if side not in best or row["cpu_s"] < best[side]["cpu_s"]:
                        best[side] = row
            if digests["local"] != digests["stream"]:
                sys.exit(f"{config}: the streamed run's documents differ from the local run's: {digests}")
            local, stream = best["local"], best["stream"]
            print(f"{config}: documents identical on both sides: {digests['local'][0]:,}")
            print(f"{config}: local  CPU s per GB: {local['cpu_s'] / gb:.1f}")
            print(f"{config}: stream CPU s per GB: {stream['cpu_s'] / gb:.1f}")
            print(f"{config}: ratio stream/local CPU per GB: {stream['cpu_s'] / local['cpu_s']:.3f}")
            print(
                f"{config}: peak RSS of a task: local {local['rss_mb']:.0f} MB, stream {stream['rss_mb']:.0f} MB "
                f"(+{stream['rss_mb'] - local['rss_mb']:.0f} MB)"
            )
            print(f"{config}: S3 server CPU s per GB (its own process, not counted): {min(server_cpu) / gb:.1f}")


if __name__ == "__main__":
    main()
