"""The run directory under a hostile or unlucky user: `--force` in the wrong place, two commands
on one directory, a moved directory, a full disk, odd paths and inputs, and crawl text that
tries to talk to the terminal."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gristmill.cli import safe
from gristmill.config import ConfigError, from_dict
from gristmill.dirlock import LockHeld
from gristmill.input.wet import WetRecord, iter_wet_records
from gristmill.pipeline.report.journey import funnel
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

from .test_run import config, files_bytes


def _cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return pipeline(*args, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def _yaml(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _small(run_dir, wet_files, lid_model, **extra) -> dict:
    """The crawl steps on the 43-record 2017 sample, one task: a run takes a second or two."""
    cfg = config(run_dir, wet_files[1:], lid_model, **extra)
    cfg["executor"] = {"type": "local", "tasks": 1, "workers": 1}
    return cfg


def test_force_never_deletes_a_directory_gristmill_did_not_write(tmp_path, wet_files, lid_model):
    victim = tmp_path / "thesis"
    (victim / "chapters").mkdir(parents=True)
    (victim / "chapters" / "one.tex").write_text("years of work")
    (victim / "notes.txt").write_text("more work")
    res = _cli("run", _yaml(tmp_path, _small(victim, wet_files, lid_model)), "--force")
    assert res.returncode == 2, res.stderr
    assert "is not a gristmill run directory" in res.stderr
    assert "--force" not in res.stderr  # the refusal must not suggest the flag that deletes
    assert "Traceback" not in res.stderr
    assert (victim / "chapters" / "one.tex").read_text() == "years of work"
    assert sorted(p.name for p in victim.iterdir()) == ["chapters", "notes.txt"]  # not even a lock file


@pytest.mark.parametrize("where", ["root", "home", "above_home"])
def test_root_and_home_are_refused(tmp_path, wet_files, lid_model, where):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    (home / "keep.txt").write_text("x")
    target = {"root": Path("/"), "home": home, "above_home": home.parent}[where]
    res = _cli("run", _yaml(tmp_path, _small(target, wet_files, lid_model)), "--force", env={"HOME": str(home)})
    assert res.returncode == 2
    assert "refusing to use" in res.stderr
    assert (home / "keep.txt").exists() and not (home / "config.yaml").exists()


def test_force_clears_only_what_gristmill_wrote(tmp_path, wet_files, lid_model):
    run_dir = tmp_path / "r"
    run(from_dict(_small(run_dir, wet_files, lid_model)))
    (run_dir / "my-notes.md").write_text("what I saw in this run")
    (run_dir / "01_curate" / "output" / "stale.parquet").write_bytes(b"left from before")
    changed = _small(run_dir, wet_files, lid_model)
    changed["steps"] = changed["steps"][:1]
    run(from_dict(changed), force=True)
    assert (run_dir / "my-notes.md").read_text() == "what I saw in this run"
    assert not (run_dir / "01_curate" / "output" / "stale.parquet").exists()
    assert json.loads((run_dir / "plan.json").read_text())["stages"][0]["steps"][-2] == "00_langid"


def test_second_run_on_a_locked_directory_is_refused(tmp_path, wet_files, lid_model):
    run_dir = tmp_path / "r"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time\nfrom gristmill.dirlock import hold\n"
            "with hold(sys.argv[1]):\n print('held', flush=True); time.sleep(120)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        res = _cli("run", _yaml(tmp_path, _small(run_dir, wet_files, lid_model)))
        assert res.returncode == 2
        assert f"is in use by pid {holder.pid}" in res.stderr
        assert not (run_dir / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (killed, as the OOM killer would): its lock is no obstacle
    run(from_dict(_small(run_dir, wet_files, lid_model)))
    assert (run_dir / "stats.json").is_file()


def test_lock_is_held_for_the_whole_run(tmp_path, wet_files, lid_model, monkeypatch):
    import gristmill.pipeline.runner as runner

    run_dir = tmp_path / "r"
    seen = []
    original = runner._run_stage

    def probe(stage, console, *args, **kwargs):  # while a stage runs, a second holder must be refused
        with pytest.raises(LockHeld):
            from gristmill.dirlock import hold

            with hold(run_dir):
                pass
        seen.append(stage.label)
        return original(stage, console, *args, **kwargs)

    monkeypatch.setattr(runner, "_run_stage", probe)
    run(from_dict(_small(run_dir, wet_files, lid_model)))
    assert seen == ["01_curate"]


def test_moved_run_directory_resumes(tmp_path, wet_files, lid_model):
    first = tmp_path / "a" / "run"
    run(from_dict(_small(first, wet_files, lid_model)))
    out = {p.name: p.read_bytes() for p in (first / "01_curate" / "output").glob("*.parquet")}
    moved = tmp_path / "b" / "run"
    moved.parent.mkdir()
    shutil.move(first, moved)
    res = _cli("run", _yaml(tmp_path, _small(first, wet_files, lid_model)), "--run-dir", moved)
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr and "already complete" in res.stderr
    assert {p.name: p.read_bytes() for p in (moved / "01_curate" / "output").glob("*.parquet")} == out


def test_tilde_run_dir_means_home(tmp_path, wet_files, lid_model):
    home = tmp_path / "home"
    home.mkdir()
    res = _cli(
        "run",
        _yaml(tmp_path, _small("x", wet_files, lid_model)),
        "--run-dir",
        "~/x",
        env={"HOME": str(home)},
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert (home / "x" / "config.yaml").is_file() and (home / "x" / "01_curate" / "logs").is_dir()
    assert not (tmp_path / "~").exists()


def test_run_dir_that_is_a_file_or_holds_a_broken_config(tmp_path, wet_files, lid_model):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    res = _cli("run", _yaml(tmp_path, _small(a_file, wet_files, lid_model)))
    assert res.returncode == 2 and "exists and is not a directory" in res.stderr
    res = _cli("run", _yaml(tmp_path, _small(a_file / "sub", wet_files, lid_model)))
    assert res.returncode == 2 and "is a file, not a directory" in res.stderr

    run_dir = tmp_path / "r"
    run(from_dict(_small(run_dir, wet_files, lid_model)))
    (run_dir / "config.yaml").write_text("executor: {tasks: [unclosed\n")
    res = _cli("run", _yaml(tmp_path, _small(run_dir, wet_files, lid_model)))
    assert res.returncode == 2, res.stderr
    assert "config.yaml: unreadable" in res.stderr and "Traceback" not in res.stderr
    assert _cli("run", _yaml(tmp_path, _small(run_dir, wet_files, lid_model)), "--force").returncode == 0


def test_boolean_for_a_number_is_refused():
    with pytest.raises(ConfigError, match="executor.tasks: expected a number, got true"):
        from_dict({"input": {"paths": ["x"]}}, ["executor.tasks=true"])
    with pytest.raises(ConfigError, match=r"steps\[0\].gopher_quality.min_doc_words: expected a number"):
        from_dict({"input": {"paths": ["x"]}, "steps": [{"gopher_quality": {"min_doc_words": True}}]})


def test_input_listed_twice_is_read_once(tmp_path, wet_files, lid_model):
    once = run(from_dict(_small(tmp_path / "once", wet_files, lid_model)))
    f = wet_files[1]
    twice = _small(tmp_path / "twice", wet_files, lid_model)
    twice["input"]["paths"] = [str(f), str(f.parent / "*00000*.wet.gz"), str(f)]
    merged = run(from_dict(twice))
    assert funnel(merged)[0].docs_out == funnel(once)[0].docs_out == 43


def test_input_directory_is_an_error(tmp_path, wet_files, lid_model):
    cfg = _small(tmp_path / "d", wet_files, lid_model)
    cfg["input"]["paths"] = [str(wet_files[1].parent)]
    with pytest.raises(ConfigError, match=r"input.paths\[0\]: .* is a directory"):
        run(from_dict(cfg))


def test_per_language_applies_to_the_final_output_after_dedup(tmp_path, wet_files, lid_model):
    cfg = config(tmp_path / "pl", wet_files, lid_model, output={"per_language": True, "dropped_sample": 0.0})
    # a Bloom filter sized for the sample's pages: the default (100M items) is a 274 MB file
    cfg["steps"] = [{"langid": {"model": str(lid_model), "languages": None}}, {"exact_dedup": {"capacity": 100_000}}]
    stages = run(from_dict(cfg))["stages"]
    final = tmp_path / "pl" / stages[-1]["label"] / "output"
    folders = {p.name for p in final.iterdir() if p.is_dir()}
    assert {"en", "zh", "ru"} <= folders
    assert set(pq.read_table(final / "zh").column("language").to_pylist()) == {"zh"}
    first = tmp_path / "pl" / stages[0]["label"] / "output"
    assert not [p for p in first.iterdir() if p.is_dir()]  # intermediate output stays flat


def _wet_with_hostile_url(src: Path, dest: Path) -> None:
    """The real 2017 sample rewritten record by record, one URL carrying terminal escapes."""
    # ESC c resets the terminal, 0x9b is the one-byte CSI, BEL rings (URL parsing refuses `[`)
    hostile = "http://evil\x1bc\x9b2J\x07.example.com/"
    with open(dest, "wb") as out:
        out.write(
            gzip.compress(
                b"WARC/1.0\r\nWARC-Type: warcinfo\r\nWARC-Record-ID: <urn:uuid:0>\r\nContent-Length: 0\r\n\r\n\r\n\r\n"
            )
        )
        for i, rec in enumerate(r for r in iter_wet_records(src) if isinstance(r, WetRecord)):
            body = rec.text.encode()
            url = hostile if i % 2 == 0 else rec.url
            head = (
                f"WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Target-URI: {url}\r\n"
                f"WARC-Record-ID: {rec.record_id}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            out.write(gzip.compress(head + body + b"\r\n\r\n"))


def test_stats_never_prints_terminal_escapes_from_the_crawl(tmp_path, wet_files, lid_model):
    wet = tmp_path / "hostile.warc.wet.gz"
    _wet_with_hostile_url(wet_files[1], wet)
    cfg = _small(tmp_path / "r", wet_files, lid_model)
    cfg["input"]["paths"] = [str(wet)]
    run(from_dict(cfg))
    res = _cli("stats", tmp_path / "r", env={"COLUMNS": "250"})
    assert res.returncode == 0, res.stderr
    assert "evil" in res.stdout  # the domain is listed ...
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout  # ... but inert
    assert "\x9b" not in res.stdout and "evil\\x1bc\\x9b2j\\x07.example.com" in res.stdout
    assert safe("a\x1b[2Jb\u202e").plain == "a\\x1b[2Jb\\u202e"
    assert safe("[bold red]x[/]").plain == "[bold red]x[/]"  # shown as text, never read as markup


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs: room for the run's config and logs, not for its documents."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_one_line_naming_the_path(tmp_path, wet_files, lid_model, tiny_disk):
    cfg = _small(tiny_disk / "run", wet_files, lid_model)
    cfg["input"]["paths"] = [str(p) for p in wet_files]  # ~3 MB of text: more than the disk holds
    cfg["output"] = {"dropped_sample": 1.0, "compression": "none"}
    res = _cli("run", _yaml(tmp_path, cfg))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "No space left on device" in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "No space left on device" in ln]
    assert any(str(tiny_disk) in ln for ln in lines), lines


# --- a resume reads exactly the first plan's input, and trusts only named completions ----------------


def _glob_run(tmp_path: Path, wet_files, lid_model) -> tuple[Path, dict]:
    """Two tasks over a glob of a folder holding both sample files (names sorting as b, c)."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copyfile(wet_files[0], inputs / "b.warc.wet.gz")
    shutil.copyfile(wet_files[1], inputs / "c.warc.wet.gz")
    cfg = config(tmp_path / "run", [], lid_model)
    cfg["input"] = {"paths": [str(inputs / "*.warc.wet.gz")]}
    cfg["executor"] = {"type": "local", "tasks": 2, "workers": 1}
    return inputs, cfg


def test_a_resume_over_a_glob_whose_files_changed_is_refused_naming_them(tmp_path, wet_files, lid_model):
    """A file that sorts first added after a task was lost would make the kept task's share and the
    re-run task's overlap (one file read twice, two never): the resume is refused, nothing rewritten."""
    inputs, cfg = _glob_run(tmp_path, wet_files, lid_model)
    path = _yaml(tmp_path, cfg)
    assert _cli("run", path).returncode == 0
    curate = tmp_path / "run" / "01_curate"
    (curate / "completions" / "00001").unlink()  # task 1 lost, as if killed
    (curate / "output" / "00001.parquet").unlink()
    before = {p: p.read_bytes() for p in sorted(curate.rglob("*.parquet"))}
    shutil.copyfile(wet_files[1], inputs / "a.warc.wet.gz")
    res = _cli("run", path)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "the input files changed since this run began: 1 added (first:" in line and "a.warc.wet.gz" in line
    assert "--force" in line and "Traceback" not in res.stderr
    assert {p: p.read_bytes() for p in sorted(curate.rglob("*.parquet"))} == before
    assert not (curate / "completions" / "00001").exists()
    # a file removed, or replaced by one of another size, is refused the same way
    (inputs / "a.warc.wet.gz").unlink()
    shutil.copyfile(wet_files[0], inputs / "c.warc.wet.gz")
    res = _cli("run", path)
    assert res.returncode == 2 and "1 changed in size (first:" in res.stderr and "c.warc.wet.gz" in res.stderr
    # restored, the resume reads exactly the first plan's files and ends as an uninterrupted run
    shutil.copyfile(wet_files[1], inputs / "c.warc.wet.gz")
    assert _cli("run", path).returncode == 0
    clean = _cli("run", _yaml(tmp_path, {**cfg, "run_dir": str(tmp_path / "clean")}))
    assert clean.returncode == 0
    assert files_bytes(curate) == files_bytes(tmp_path / "clean" / "01_curate")


def test_only_completion_markers_count_as_completed_tasks(tmp_path, wet_files, lid_model):
    """An editor's `00001.bak` (or a 0-byte object beside the markers) after a killed task is no
    completion: the task re-runs and the output is whole."""
    _, cfg = _glob_run(tmp_path, wet_files, lid_model)
    path = _yaml(tmp_path, cfg)
    assert _cli("run", path).returncode == 0
    curate = tmp_path / "run" / "01_curate"
    whole = files_bytes(curate)
    (curate / "completions" / "00001").unlink()
    (curate / "output" / "00001.parquet").unlink()
    for stray in ("00001.bak", "1", "000001", "00007", ".00001.swp"):  # 00007: no such rank in 2 tasks
        (curate / "completions" / stray).write_text("")
    res = _cli("run", path)
    assert res.returncode == 0, res.stderr
    assert "01_curate: all 2 tasks already complete" not in res.stderr
    assert files_bytes(curate) == whole
    assert json.loads((tmp_path / "run" / "stats.json").read_text())["stages"][0]["tasks_completed"] == 2
