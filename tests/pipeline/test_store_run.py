"""A run directory, inputs, models and token exports on an S3-protocol server (moto's
ThreadedMotoServer on 127.0.0.1, with request signing checked: `tests/s3_server.py`).

The demo config (`configs/crawl.yaml`) runs with everything on the server and gives the same
documents and token shards as on local disk; a task killed mid-run is redone alone on the next
run; one run at a time holds the run directory (a lease created with If-None-Match: *, taken
over when it expires or by --force-lock naming its holder); a store that ignores conditional
writes is refused; bad credentials, a missing bucket and an unreachable endpoint are one line
each; the secret key is in nothing the runs write or print.

Only s3:// can be tested against a server here (gs:// and hf:// have none on 127.0.0.1).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from gristmill.core import storage
from gristmill.filters.model_check import check_fasttext, unchanged
from gristmill.pipeline.rundir import lease
from tests.cli_process import pipeline

from ..conftest import REPO, WET_2014, WET_2017, _missing
from ..s3_server import BUCKET, PlainS3Server, S3Server, StrippingProxy

pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.xdist_group("s3")]
PYTHON_ENV = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


@pytest.fixture(scope="module")
def s3():
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        _missing(f"moto[server] and s3fs ({e}; pip install -e '.[test]')")
    server = S3Server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def uploaded(s3, shared_data, lid_model, kenlm_model, quality_model) -> dict[str, str]:
    """The WET samples and the demo's models, as URLs on the server."""
    client = s3.client()
    files = {
        "wet14": (shared_data / WET_2014, f"wet/{Path(WET_2014).name}"),
        "wet17": (shared_data / WET_2017, f"wet/{Path(WET_2017).name}"),
        "lid": (lid_model, "models/lid.176.ftz"),
        "kenlm": (kenlm_model, "models/kenlm/en.arpa.bin"),
        "kenlm_stats": (Path(f"{kenlm_model}.stats.json"), "models/kenlm/en.arpa.bin.stats.json"),
        "quality": (quality_model, "models/quality/en.bin"),
    }
    for path, key in files.values():
        client.upload_file(str(path), BUCKET, key)
    return {name: f"s3://{BUCKET}/{key}" for name, (_, key) in files.items()}


def _env(s3: S3Server | PlainS3Server, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, **PYTHON_ENV, **s3.env(), **extra}


def _cli(env: dict, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return pipeline(*args, env=env, timeout=timeout)


def _write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _crawl(run_dir: str, wet: str, models: dict[str, str], scratch: Path) -> dict:
    """configs/crawl.yaml on the WET files `wet` matches, its models as given, without training
    (pipeline conftest `demo_config`, whose run on local disk it is compared with)."""
    data = yaml.safe_load((REPO / "configs" / "crawl.yaml").read_text())
    data.pop("train")
    data["run_dir"] = run_dir
    data["input"] = {"paths": [wet]}
    data["storage"] = {"scratch_dir": str(scratch)}
    for entry in data["steps"]:
        ((name, params),) = entry.items()
        if name == "langid":
            params["model"] = models["lid"]
        elif name == "kenlm":
            params["models"] = {"en": models["kenlm"]}
        elif name == "quality":
            params["model"] = models["quality"]
    return data


def _objects(s3: S3Server, prefix: str) -> dict[str, bytes]:
    """{key relative to prefix: bytes} of every object under `prefix`."""
    client, out = s3.client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


def _heads(s3: S3Server, prefix: str) -> dict[str, tuple[str, object]]:
    """{key relative to prefix: (ETag, LastModified)}: what shows an object was rewritten."""
    client, out = s3.client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = (obj["ETag"], obj["LastModified"])
    return out


def _local_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# --- the demo, everything on the server ------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(s3, uploaded, demo_run_dir, tmp_path_factory):
    """configs/crawl.yaml twice: on local disk (local input and models: the session's demo run,
    pipeline conftest `demo_run_dir`, read only), and with its input (both WET files), models,
    run directory and token shards on the server."""
    tmp = tmp_path_factory.mktemp("s3demo")
    env = _env(s3)
    scratch = tmp / "scratch"
    wet = f"s3://{BUCKET}/wet/*.warc.wet.gz"  # the two samples, as the demo's local glob finds them
    remote_cfg = _write(tmp / "s3.yaml", _crawl(f"s3://{BUCKET}/demo", wet, uploaded, scratch))
    remote = _cli(env, "run", remote_cfg)
    assert remote.returncode == 0, remote.stderr
    return {"local": demo_run_dir, "remote": remote, "config": remote_cfg, "env": env, "scratch": scratch}


def test_demo_on_s3_writes_the_same_documents_and_token_shards(s3, demo, shared_data):
    local = _local_files(demo["local"])
    remote = _objects(s3, "demo")
    # the same files (the lock is a local run's flock file; the lease object is gone once released)
    assert set(remote) == set(local) - {".gristmill.lock"}
    tokens = sorted(k for k in remote if k.startswith("tokens/"))
    assert any(k.endswith(".arrow") for k in tokens) and "tokens/manifest.json" in tokens
    for key in tokens:
        assert remote[key] == local[key], key  # token shards, manifest and tokenizer: byte for byte
    documents = sorted(k for k in remote if k.endswith(".parquet") and "/output/" in k)
    assert any(k.startswith("20_near_dedup_filter/output/") for k in documents)
    sourced = 0
    for key in documents:  # every stage's documents: equal, but for the name of the file they came from
        a, b = pq.read_table(io.BytesIO(local[key])), pq.read_table(io.BytesIO(remote[key]))
        assert a.num_rows == b.num_rows and a.column_names == b.column_names, key
        if "source" not in b.column_names:  # the tokenizer's sample: id and text only
            assert remote[key] == local[key], key
            continue
        sourced += 1
        assert set(b.column("source").to_pylist()) <= demo_sources(), key
        assert a.drop(["source"]).equals(b.drop(["source"])), key
    assert sourced >= 4
    # the merged stats say the same, stage by stage and step by step (but for what reading over the
    # network adds: the bytes downloaded, the requests made)
    ours, theirs = json.loads(remote["stats.json"]), json.loads(local["stats.json"])

    def counters(merged: dict) -> list:
        net = ("download_", "http_")
        return [
            [{k: v for k, v in s["counters"].items() if not k.startswith(net)} for s in st["steps"]]
            for st in merged["stages"]
        ]

    assert counters(ours) == counters(theirs)
    downloaded = sum((shared_data / wet).stat().st_size for wet in (WET_2014, WET_2017))
    assert ours["stages"][0]["steps"][0]["counters"]["download_bytes"] == downloaded
    assert ours["run_dir"] == f"s3://{BUCKET}/demo"


def demo_sources() -> set[str]:
    return {f"s3://{BUCKET}/wet/{Path(wet).name}" for wet in (WET_2014, WET_2017)}


def test_the_secret_key_is_in_nothing_the_run_writes_or_prints(s3, demo):
    secret, key_id = s3.secret.encode(), s3.key_id.encode()
    written = {**{f"s3://{k}": v for k, v in _objects(s3, "demo").items()}, **_local_files(demo["scratch"])}
    assert len(written) > 100
    leaks = [name for name, data in written.items() if secret in data or key_id in data]
    assert leaks == []
    output = demo["remote"].stdout + demo["remote"].stderr
    assert output and s3.secret not in output and s3.key_id not in output


def test_a_task_stages_only_in_its_own_scratch_folder_and_leaves_none_behind(demo):
    scratch = demo["scratch"]
    assert not (scratch / "plan-root-never-written").exists()  # every task wrote through its run folder
    assert [p for p in (scratch / "tasks").rglob("*") if p.is_file()] == []  # committed, then removed
    # the models given as URLs were downloaded once into the content-addressed cache
    cached = sorted(p.name for p in (scratch / "cache").rglob("*") if p.is_file())
    assert cached == ["en.arpa.bin", "en.bin", "lid.176.ftz"]


def test_resuming_a_complete_run_on_s3_redoes_nothing(s3, demo):
    before = _heads(s3, "demo")
    again = _cli(demo["env"], "run", demo["config"])
    assert again.returncode == 0, again.stderr
    assert "resuming s3://" in again.stderr and "all 1 tasks already complete" in again.stderr
    after = _heads(s3, "demo")
    # a run rewrites its config, plan and merged stats; no task's file is written again
    kept = [k for k in before if "/" in k and not k.endswith(("/stats.json", "/scores.json"))]
    assert len(kept) > 100
    assert [k for k in kept if after.get(k) != before[k]] == []


def test_stats_status_and_report_read_a_run_directory_on_s3(demo, tmp_path):
    ours = _cli(demo["env"], "stats", f"s3://{BUCKET}/demo", "--json")
    theirs = _cli(demo["env"], "stats", str(demo["local"]), "--json")
    assert ours.returncode == theirs.returncode == 0, ours.stderr
    journey = lambda res: [(r["step"], r["docs_in"], r["docs_out"]) for r in json.loads(res.stdout)["journey"]]  # noqa: E731
    assert journey(ours) == journey(theirs) and len(journey(ours)) > 5
    status = _cli(demo["env"], "status", f"s3://{BUCKET}/demo")
    assert status.returncode == 0, status.stderr
    assert "27_manifest" in status.stdout and "complete" in status.stdout
    report = _cli(demo["env"], "report", f"s3://{BUCKET}/demo", "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert "near_dedup" in (tmp_path / "r.html").read_text()


def test_plan_shows_the_scratch_a_task_needs(demo):
    res = _cli(demo["env"], "plan", demo["config"], "--json")
    assert res.returncode in (0, 1), res.stderr
    stages = json.loads(res.stdout)["stages"]
    assert all(s["scratch/task"] not in ("", "0 B") for s in stages)
    assert any("scratch/task" in line and "object storage" in line for line in json.loads(res.stdout)["notes"])


def test_megatron_export_writes_to_s3_from_tokens_on_s3(s3, demo, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import megatron.core.datasets.indexed_dataset as megatron
        except ImportError as e:
            _missing(f"megatron-core ({e})")
    out = f"s3://{BUCKET}/megatron/demo"
    res = _cli(demo["env"], "tokens", "export", f"s3://{BUCKET}/demo", "--format", "megatron", "-o", out)
    assert res.returncode == 0, res.stderr
    # every split of the demo's shards (both WET files give it a validation split), one prefix
    # each, in the export's own folder that export.json names (tests/tokenize/test_megatron_store.py)
    objects = _objects(s3, "megatron/demo")
    folder = json.loads(objects.pop("export.json"))["export"]
    assert f"--train-data-path {out}/{folder}/train --valid-data-path {out}/{folder}/val" in res.stderr
    assert sorted(objects) == [f"{folder}/{n}" for n in (".started", "train.bin", "train.idx", "val.bin", "val.idx")]
    local = tmp_path / "meg"
    res = _cli(demo["env"], "tokens", "export", str(demo["local"]), "--format", "megatron", "-o", str(local))
    assert res.returncode == 0, res.stderr
    for key, data in objects.items():
        name = key.split("/", 1)[1]
        if name != ".started":
            assert data == (local / name).read_bytes(), name
            (tmp_path / name).write_bytes(data)
    from gristmill.tokenize import open_tokens

    for split in ("train", "val"):
        ours = list(open_tokens(demo["local"]).documents(split))
        ds = megatron.IndexedDataset(str(tmp_path / split))
        assert len(ds) == len(ours) > 0, split
        for i, doc in enumerate(ours):
            assert ds[i].tolist() == doc.tolist()


# --- resume after a killed task -------------------------------------------------------------------------


def _small(run_dir: str, wets: list[str], lid: str, scratch: Path, **input_extra) -> dict:
    return {
        "run_dir": run_dir,
        "executor": {"type": "local", "tasks": 2, "workers": 1},  # one at a time: task 0, then task 1
        "input": {"paths": wets, **input_extra},
        # a Bloom filter sized for the samples' pages: the default (100M items) is a 274 MB object
        "steps": [
            {"langid": {"model": lid, "languages": ["en"]}},
            {"exact_dedup": {"granularity": "document", "capacity": 100_000}},
        ],
        "storage": {"scratch_dir": str(scratch)},
    }


def test_a_killed_task_commits_nothing_and_the_rerun_redoes_it_alone(s3, uploaded, lid_model, tmp_path):
    env = _env(s3)
    wets = [f"s3://{BUCKET}/wet/*.warc.wet.gz"]  # two files: the curate stage runs a task per file
    reference = _cli(
        env, "run", _write(tmp_path / "ref.yaml", _small(str(tmp_path / "ref"), wets, str(lid_model), tmp_path / "s"))
    )
    assert reference.returncode == 0, reference.stderr
    cfg = _write(tmp_path / "s3.yaml", _small(f"s3://{BUCKET}/killed", wets, str(lid_model), tmp_path / "s"))
    # task 0 of the first stage reads the 2014 file (566 pages) and completes; task 1 reads the
    # 2017 file (43 pages) and is killed (SIGKILL, as the OOM killer does) after 20 of them
    killed = _cli({**env, "GRISTMILL_KILL_TASK": "1:SIGKILL:20"}, "run", cfg)
    assert killed.returncode == 1
    line = [x for x in killed.stderr.splitlines() if x.startswith("failed ")]
    assert len(line) == 1 and "stage 01_curate: task 1 was killed by SIGKILL" in line[0], killed.stderr
    assert f"log: {tmp_path / 's' / 'tasks'}" in line[0]  # its log is where it was killed: in its scratch folder
    first = _heads(s3, "killed")
    done = sorted(k for k in first if k.startswith("01_curate/completions/"))
    assert done == ["01_curate/completions/00000"]
    assert "01_curate/output/00000.parquet" in first
    assert not any(k.startswith("01_curate/") and "00001" in k for k in first), sorted(first)  # nothing of task 1

    # a new object under the input prefix that sorts first would shift every task's share: refused
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="wet/000-new.warc.wet.gz", Body=(REPO / "README.md").read_bytes()[:64])
    client.put_object(Bucket=BUCKET, Key="killed/01_curate/completions/00001.bak", Body=b"")  # no marker
    try:
        changed = _cli(env, "run", cfg)
    finally:
        client.delete_object(Bucket=BUCKET, Key="wet/000-new.warc.wet.gz")
    assert changed.returncode == 2, changed.stderr
    assert "the input files changed since this run began: 1 added (first: s3://" in changed.stderr
    assert "000-new.warc.wet.gz" in changed.stderr and "Traceback" not in changed.stderr
    first["01_curate/completions/00001.bak"] = _heads(s3, "killed")["01_curate/completions/00001.bak"]
    assert {k: v for k, v in _heads(s3, "killed").items() if k in first} == first  # nothing rewritten

    resumed = _cli(env, "run", cfg)
    assert resumed.returncode == 0, resumed.stderr
    after = _heads(s3, "killed")
    task0 = [k for k in first if k.startswith("01_curate/") and "00000" in k]
    assert len(task0) >= 5  # its output, stats, usage, log, scores, dropped sample, completion
    assert {k: after[k] for k in task0} == {k: first[k] for k in task0}  # not redone: not one object rewritten
    assert "01_curate/completions/00001" in after  # the stray 00001.bak made no completion: task 1 ran
    # the result is the uninterrupted run's, byte for byte
    ref = _local_files(tmp_path / "ref")
    ours = _objects(s3, "killed")
    for key in sorted(k for k in ref if k.endswith(".parquet")):
        assert ours[key] == ref[key], key


# --- one run at a time -----------------------------------------------------------------------------------


def _tiny(run_dir: str, uploaded: dict, lid: str, scratch: Path) -> dict:
    return {
        "run_dir": run_dir,
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {"paths": [uploaded["wet17"]], "limit": 5},
        "steps": [{"langid": {"model": lid, "languages": ["en"]}}],
        "storage": {"scratch_dir": str(scratch), "lease_s": 30},
    }


def _put_lease(s3: S3Server, prefix: str, holder: str, expires_in: float) -> None:
    info = {
        "holder": holder,
        "host": "elsewhere",
        "pid": 4242,
        "command": ["pipeline", "run", "x.yaml"],
        "since": time.time() - 60,
        "expires": time.time() + expires_in,
    }
    s3.client().put_object(Bucket=BUCKET, Key=f"{prefix}/.gristmill.lock", Body=json.dumps(info).encode())


def test_a_second_run_is_refused_while_the_first_holds_the_lease(s3, uploaded, lid_model, tmp_path):
    env = _env(s3)
    cfg = _write(tmp_path / "c.yaml", _tiny(f"s3://{BUCKET}/busy", uploaded, str(lid_model), tmp_path / "s"))
    # the first run's task stops itself (SIGSTOP) after its first page: the run holds the lease
    first = subprocess.Popen(
        [sys.executable, "-m", "gristmill.cli", "run", cfg],
        env={**env, "GRISTMILL_KILL_TASK": "0:SIGSTOP:1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not _objects_exist(s3, "busy", "01_curate/executor.json"):
            assert first.poll() is None, first.communicate()
            time.sleep(0.5)
        second = _cli(env, "run", cfg)
        assert second.returncode == 2
        line = _one_line(second.stderr)
        assert line.startswith(f"error: run directory s3://{BUCKET}/busy is in use by ")
        assert f":{first.pid}:" in line and f"pid {first.pid} on " in line and "--force-lock " in line
    finally:
        first.send_signal(signal.SIGTERM)  # its tasks are stopped, its lease released
        first.communicate(timeout=120)
    assert not _objects_exist(s3, "busy", ".gristmill.lock")


def _objects_exist(s3: S3Server, prefix: str, key: str) -> bool:
    return key in _heads(s3, prefix)


def test_an_expired_lease_is_taken_over(s3, uploaded, lid_model, tmp_path):
    env = _env(s3)
    _put_lease(s3, "expired", "elsewhere:4242:dead00", expires_in=-5)
    res = _cli(
        env, "run", _write(tmp_path / "c.yaml", _tiny(f"s3://{BUCKET}/expired", uploaded, str(lid_model), tmp_path))
    )
    assert res.returncode == 0, res.stderr
    assert "took over the lock of elsewhere:4242:dead00" in res.stderr and "its lease expired" in res.stderr
    assert not _objects_exist(s3, "expired", ".gristmill.lock")  # released at the end


def test_force_lock_takes_over_only_the_holder_it_names(s3, uploaded, lid_model, tmp_path):
    env = _env(s3)
    _put_lease(s3, "forced", "elsewhere:4242:abc123", expires_in=600)  # a run that died a minute ago
    cfg = _write(tmp_path / "c.yaml", _tiny(f"s3://{BUCKET}/forced", uploaded, str(lid_model), tmp_path))
    held = _cli(env, "run", cfg)
    assert held.returncode == 2
    assert "is in use by elsewhere:4242:abc123 (pid 4242 on elsewhere" in _one_line(held.stderr)
    assert "--force-lock elsewhere:4242:abc123" in held.stderr
    wrong = _cli(env, "run", cfg, "--force-lock", "elsewhere:1:000000")
    assert wrong.returncode == 2
    assert "--force-lock elsewhere:1:000000: it is held by elsewhere:4242:abc123" in _one_line(wrong.stderr)
    assert not _objects_exist(s3, "forced", "config.yaml")  # nothing was written while refused
    right = _cli(env, "run", cfg, "--force-lock", "elsewhere:4242:abc123")
    assert right.returncode == 0, right.stderr
    assert "took over the lock of elsewhere:4242:abc123" in right.stderr and "--force-lock names it" in right.stderr


def test_a_holder_whose_lease_is_taken_over_stops(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    storage.configure(storage.StorageConfig(s3={"endpoint_url": s3.endpoint}))
    url = f"s3://{BUCKET}/renewed"
    lost = []
    try:
        with lease.hold(url, ttl=3, command=["first"], on_lost=lost.append) as first:
            second = lease.acquire(url, ttl=60, force_lock=first.holder, command=["second"])
            deadline = time.time() + 30
            while not lost and time.time() < deadline:
                time.sleep(0.2)
            assert lost and "this run's lock was taken over by " + second.holder in lost[0]
        held = lease.read(storage.join(url, ".gristmill.lock"))
        assert held is not None and held.holder == second.holder  # the first holder did not remove it
    finally:
        storage.configure(None)


def test_a_store_that_ignores_conditional_writes_is_refused(uploaded, lid_model, tmp_path, shared_data):
    plain = PlainS3Server()
    proxy = StrippingProxy(plain)
    try:
        env = _env(plain, AWS_ENDPOINT_URL_S3=proxy.endpoint)
        data = _tiny(f"s3://{BUCKET}/unsafe", {"wet17": str(shared_data / WET_2017)}, str(lid_model), tmp_path)
        res = _cli(env, "run", _write(tmp_path / "c.yaml", data))
        assert res.returncode == 2
        line = _one_line(res.stderr)
        assert f"s3://{BUCKET}/unsafe: this store accepted a second create of one object with If-None-Match" in line
        assert "config.yaml" not in str(plain.client.list_objects_v2(Bucket=BUCKET).get("Contents", []))
    finally:
        proxy.stop()
        plain.stop()


def test_the_run_directory_checks_hold_on_s3(s3, uploaded, lid_model, tmp_path):
    env = _env(s3)
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="foreign/data.csv", Body=b"a,b\n")
    cfg = _tiny(f"s3://{BUCKET}/foreign", uploaded, str(lid_model), tmp_path)
    res = _cli(env, "run", _write(tmp_path / "f.yaml", cfg))
    assert res.returncode == 2
    assert "is not empty and is not a gristmill run directory (it holds data.csv)" in _one_line(res.stderr)

    cfg["run_dir"] = f"s3://{BUCKET}/checked"
    assert _cli(env, "run", _write(tmp_path / "c.yaml", cfg)).returncode == 0
    client.put_object(Bucket=BUCKET, Key="checked/notes.md", Body=b"mine")
    client.put_object(Bucket=BUCKET, Key="checked/01_curate/mine.txt", Body=b"mine too")
    cfg["steps"][0]["langid"]["min_score"] = 0.5
    changed = _cli(env, "run", _write(tmp_path / "c.yaml", cfg))
    assert changed.returncode == 2
    assert "holds a run made with another configuration" in changed.stderr and "min_score" in changed.stderr
    forced = _cli(env, "run", _write(tmp_path / "c.yaml", cfg), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "--force kept what gristmill did not write: 01_curate/mine.txt, notes.md" in forced.stderr
    objects = _heads(s3, "checked")
    assert "notes.md" in objects and "01_curate/mine.txt" in objects and "01_curate/completions/00000" in objects
    assert yaml.safe_load(_objects(s3, "checked")["config.yaml"])["steps"][0]["langid"]["min_score"] == 0.5

    cfg["storage"]["scratch_gb"] = 1e-6  # a kilobyte: the curate task stages more
    res = _cli(env, "run", _write(tmp_path / "c.yaml", cfg))
    assert res.returncode == 2
    line = _one_line(res.stderr)
    assert "stage 01_curate: a task is estimated to stage" in line and "storage.scratch_gb" in line


# --- failures of the store: one line each ---------------------------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "case, expect",
    [
        ("bad_secret", "access denied (The request signature we calculated does not match"),
        ("unknown_key", "access denied (The AWS Access Key Id you provided does not exist"),
        ("no_bucket", "no such bucket s3://no-such-bucket"),
        ("unreachable", "cannot connect (Could not connect to the endpoint URL"),
    ],
)
def test_store_failures_are_one_line_naming_the_url(s3, uploaded, lid_model, tmp_path, case, expect):
    env = _env(s3)
    run_dir = f"s3://{BUCKET}/failing"
    if case == "bad_secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-" + s3.secret[:4]
    elif case == "unknown_key":
        env["AWS_ACCESS_KEY_ID"] = "AKIAUNKNOWNKEY000000"
    elif case == "no_bucket":
        run_dir = "s3://no-such-bucket/failing"
    else:
        env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{_closed_port()}"
        # botocore's own retries (5 attempts, backed off: some 14 s) end in the same line as one
        env["AWS_MAX_ATTEMPTS"] = "1"
    res = _cli(env, "run", _write(tmp_path / "c.yaml", _tiny(run_dir, uploaded, str(lid_model), tmp_path)))
    assert res.returncode == 1
    line = _one_line(res.stderr)
    assert line.startswith(f"error: {run_dir}: ") and expect in line, line
    assert s3.secret not in res.stderr + res.stdout


def test_an_input_the_credentials_cannot_read_is_one_line(s3, uploaded, lid_model, tmp_path):
    env = {**_env(s3), "AWS_SECRET_ACCESS_KEY": "wrong-secret-key-value"}
    data = _tiny(str(tmp_path / "run"), uploaded, str(lid_model), tmp_path)
    data["input"]["paths"] = [f"s3://{BUCKET}/wet/*.warc.wet.gz"]
    res = _cli(env, "run", _write(tmp_path / "c.yaml", data))
    assert res.returncode == 1
    line = _one_line(res.stderr)
    assert line.startswith(f"error: s3://{BUCKET}/wet/*.warc.wet.gz: listing: access denied"), line


# --- model files given as URLs ---------------------------------------------------------------------------


def test_a_model_url_is_fetched_again_where_a_task_has_no_copy(s3, uploaded, tmp_path, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    storage.configure(storage.StorageConfig(s3={"endpoint_url": s3.endpoint}, scratch_dir=str(tmp_path / "a")))
    try:
        checked = check_fasttext(uploaded["lid"])
        assert checked.source == uploaded["lid"] and Path(checked.path).is_file()
        assert checked.path.startswith(str(tmp_path / "a")) and "__label__en" in checked.info["labels"]
        model = Path(checked.path).read_bytes()
        # another machine: its own scratch, no copy there; the task downloads the same object
        Path(checked.path).unlink()
        storage.configure(storage.StorageConfig(s3={"endpoint_url": s3.endpoint}, scratch_dir=str(tmp_path / "b")))
        path = unchanged(checked)
        assert path.startswith(str(tmp_path / "b")) and Path(path).read_bytes() == model
    finally:
        storage.configure(None)


def test_a_concurrent_second_holder_cannot_take_a_live_lease(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    storage.configure(storage.StorageConfig(s3={"endpoint_url": s3.endpoint}))
    url = f"s3://{BUCKET}/race"
    results, errors = [], []

    def contend():
        try:
            results.append(lease.acquire(url, ttl=60, command=["contender"]))
        except lease.LeaseHeld as e:
            errors.append(str(e))

    try:
        threads = [threading.Thread(target=contend) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 1 and len(errors) == 3  # the store's If-None-Match lets one in
        assert all(f"is in use by {results[0].holder}" in e for e in errors)
    finally:
        s3.client().delete_object(Bucket=BUCKET, Key="race/.gristmill.lock")
        storage.configure(None)
