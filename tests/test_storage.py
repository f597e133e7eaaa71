"""Paths and URLs without a server: what the config accepts and refuses for storage, how the
steps of a plan share one run folder that a task binds to its working copy, and that a local
run never goes through a working copy (docs/storage.md). The S3 server tests:
tests/pipeline/test_store_run.py."""

from __future__ import annotations

import os
import pickle
import re
import socket
from pathlib import Path

import pytest
import yaml

from gristmill.config import ConfigError, config_differences, from_dict
from gristmill.core import messages, storage
from gristmill.core.run_folder import AS_GIVEN, RunFolder
from gristmill.pipeline.planning.planner import plan
from tests.cli_process import pipeline


def _cfg(tmp_path, **over) -> dict:
    data = {
        "run_dir": str(tmp_path / "run"),
        "input": {"paths": [str(tmp_path / "x.warc.wet.gz")]},
        "steps": [{"gopher_quality": {}}],
    }
    data.update(over)
    return data


def test_protocols_and_local_paths():
    assert storage.protocol("s3://b/k") == "s3" and storage.protocol("HF://datasets/x") == "hf"
    assert storage.protocol("/data/x") is None and storage.protocol("file:///data/x") is None
    assert storage.local_or_url("file:///data/x.gz") == Path("/data/x.gz")
    assert storage.local_or_url("~/x") == Path.home() / "x"
    assert storage.local_or_url("gs://b/x") == "gs://b/x"
    assert storage.join("s3://b/run/", "01_curate", "/logs/") == "s3://b/run/01_curate/logs"


def test_a_run_dir_url_is_kept_and_a_file_url_is_a_path(tmp_path):
    assert from_dict(_cfg(tmp_path, run_dir="s3://bucket/runs/crawl/")).run_dir == "s3://bucket/runs/crawl"
    assert from_dict(_cfg(tmp_path, run_dir=f"file://{tmp_path}/r")).run_dir == f"{tmp_path}/r"


@pytest.mark.parametrize(
    "run_dir, says",
    [
        ("gs://bucket/run", "a run directory on gs:// is not supported: one run per directory needs a conditional"),
        ("hf://buckets/me/run", "a run directory on hf:// is not supported"),
        ("https://example.org/run", "https:// is read-only; a run directory is written"),
    ],
)
def test_run_dirs_a_store_cannot_lock_are_refused(tmp_path, run_dir, says):
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, run_dir=run_dir))
    assert f"run_dir: {run_dir}: " in str(e.value) and says in str(e.value)


def test_credentials_are_refused_in_the_config(tmp_path):
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, storage={"s3": {"secret_access_key": "s3cr3t-value"}}))
    assert "storage.s3: secret_access_key: credentials are not read from the run config" in str(e.value)
    assert "s3cr3t-value" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, storage={"s3": {"endpoint_url": "http://user:pass@127.0.0.1:9000"}}))
    assert str(e.value).splitlines()[1:] == [
        "  storage.s3.endpoint_url: http://***@127.0.0.1:9000: a URL with user:password@ (credentials are not read"
        " from the config, which is saved with the run; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile"
        " (storage.s3.profile) or an instance role)"
    ]


SECRET = "wJalrXUtnFEMI-K7MDENG"


@pytest.mark.parametrize(
    "key, over",
    [
        ("input.paths[1]", {"input": {"paths": ["/data/a.warc.wet.gz", f"s3://AKIAEXAMPLE:{SECRET}@bucket/w.wet.gz"]}}),
        ("run_dir", {"run_dir": f"s3://AKIAEXAMPLE:{SECRET}@bucket/run"}),
        (
            "input.commoncrawl.base_url",
            # was "name resolution failed (offline?)" at the first download
            {
                "input": {
                    "commoncrawl": {"crawl": "CC-MAIN-2024-22", "files": 1, "base_url": f"https://u:{SECRET}@x.org"}
                }
            },
        ),
        ("steps[0].langid.model", {"steps": [{"langid": {"model": f"https://u:{SECRET}@models.example/lid.176.ftz"}}]}),
    ],
)
def test_userinfo_in_a_url_is_refused_naming_the_key_never_the_secret(tmp_path, key, over):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_cfg(tmp_path, **over)))
    res = pipeline("validate", str(path))
    assert res.returncode == 2 and SECRET not in res.stdout + res.stderr and "AKIAEXAMPLE" not in res.stderr
    (line,) = [line for line in res.stderr.splitlines() if line.startswith(f"  {key}: ")]
    said = r": [a-z0-9]+://\*\*\*@\S+: a URL with user:password@ \(credentials .*\)"
    assert re.fullmatch(rf"  {re.escape(key)}{said}", line), line
    assert "name resolution" not in res.stderr


def test_a_url_with_userinfo_on_the_command_line_is_one_line_without_the_secret(tmp_path):
    res = pipeline("tokens", "inspect", f"s3://AK:{SECRET}@bucket/meg")
    assert SECRET not in res.stderr and res.returncode != 0
    assert res.stderr.splitlines() == [
        "error: s3://***@bucket/meg/manifest.json: a URL with user:password@; credentials are not taken from URLs (set"
        " AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
    ]


def test_signatures_in_urls_are_blanked_in_every_message():
    line = (
        'cannot connect (Could not connect to the endpoint URL: "http://127.0.0.1:9/b/k?sig=SiGnAtUrE&sv=2020")'
        " for https://x.blob.core.windows.net/c/f.gz?sv=1&se=2&sig=Zm9vYmFy%2B&sp=r and"
        " s3 presigned ?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc123&X-Amz-Expires=60, hf ?token=hf_xyz"
    )
    assert messages.redact(line) == (
        'cannot connect (Could not connect to the endpoint URL: "http://127.0.0.1:9/b/k?sig=***&sv=2020")'
        " for https://x.blob.core.windows.net/c/f.gz?sv=1&se=2&sig=***&sp=r and"
        " s3 presigned ?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60, hf ?token=***"
    )
    assert messages.redact("s3://K:S@b/x and http://u@h/") == "s3://***@b/x and http://***@h/"
    assert messages.redact("hf://datasets/org/name@main/x.parquet") == "hf://datasets/org/name@main/x.parquet"


def test_an_endpoint_url_with_a_signature_never_shows_it(tmp_path):
    """An endpoint nobody answers on, with a signature in its query: the failure of the first
    request (listing the input) is one line, the signature blanked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    cfg = _cfg(
        tmp_path,
        input={"paths": ["s3://bucket/wet/*.warc.wet.gz"]},
        storage={"s3": {"endpoint_url": f"http://127.0.0.1:{port}/?sig={SECRET}"}},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="AKIAEXAMPLE", AWS_SECRET_ACCESS_KEY="not-the-secret", AWS_MAX_ATTEMPTS="1")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = pipeline("plan", str(path), timeout=300, env=env)
    assert res.returncode != 0 and SECRET not in res.stdout + res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if "s3://bucket/wet/*.warc.wet.gz" in line]
    assert len(lines) == 1 and "sig=***" in lines[0], res.stderr


def test_what_a_run_directory_on_a_store_cannot_do_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, run_dir="s3://b/run", train={"preset": "tiny"}))
    assert "train: training on a run directory on object storage (s3://b/run) is not supported" in str(e.value)
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, run_dir="s3://b/run", executor={"type": "slurm"}))
    assert "executor.type: slurm with a run directory on object storage (s3://b/run) is not supported" in str(e.value)
    with pytest.raises(ConfigError) as e:
        from_dict(_cfg(tmp_path, steps=[{"exact_dedup": {"filter_from": "s3://b/old/03_exact_dedup_find/filter"}}]))
    assert "an earlier filter on object storage is not supported" in str(e.value)


def test_storage_settings_never_make_a_run_another_configuration(tmp_path):
    plain = from_dict(_cfg(tmp_path))
    assert "storage" not in plain.resolved()  # as a run directory made before the section existed
    tuned = from_dict(_cfg(tmp_path, storage={"s3": {"endpoint_url": "http://127.0.0.1:9000"}, "scratch_gb": 5}))
    assert tuned.resolved()["storage"]["s3"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert config_differences(plain.resolved(), tuned.resolved()) == []


def test_scrub_blanks_the_secrets_of_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-secret")
    assert storage.scrub("denied for wJalrXUtnFEMI-secret, try again") == "denied for ***, try again"


class _Copy:
    """A working copy's root, without a store."""

    def __init__(self, root: Path):
        self.root = root


def test_the_steps_of_a_plan_share_one_run_folder_and_keep_names_relative_to_it(tmp_path):
    cfg = from_dict(_cfg(tmp_path, steps=["gopher_quality", {"exact_dedup": {}}, {"near_dedup": {}}]))
    steps = [s for stage in plan(cfg, input_size=1e9, sources=[], check_memory=False) for s in stage.pipeline]
    (folder,) = {id(f): f for s in steps for f in s.run_folders()}.values()
    assert folder.root == Path(cfg.run_dir) and all(s.run_folder is folder for s in steps)
    assert all(not s.stage_folder.is_absolute() for s in steps)
    hashing = next(s for s in steps if s.name == "01_exact_dedup" and s.step_name == "exact_dedup_hash")
    assert hashing.stage_path("hashes") == Path(cfg.run_dir) / "02_exact_dedup_hash" / "hashes"
    with folder.bound(_Copy(tmp_path / "task")):
        assert hashing.stage_path("hashes") == tmp_path / "task" / "02_exact_dedup_hash" / "hashes"
        assert pickle.loads(pickle.dumps(folder)).copy is None  # a binding never travels
    assert folder.copy is None and hashing.stage_path() == Path(cfg.run_dir) / "02_exact_dedup_hash"


def test_a_local_run_reads_paths_as_given(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "1.parquet").write_bytes(b"x")
    (tmp_path / "a" / "b" / "2.parquet").write_bytes(b"y")
    run = RunFolder(tmp_path)
    assert run.staged("a") == AS_GIVEN.staged(tmp_path / "a") == tmp_path / "a"
    assert sorted(run.listed("a", "*.parquet", recursive=True)) == sorted((tmp_path / "a").rglob("*.parquet"))
    assert AS_GIVEN.listed(tmp_path / "a", "*.parquet") == [tmp_path / "a" / "1.parquet"]
