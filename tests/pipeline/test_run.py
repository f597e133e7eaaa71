"""`pipeline run` end to end on the real WET sample: funnel, outputs, resumption, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gristmill.config import ConfigError, from_dict
from gristmill.filters.langid import ModelError
from gristmill.pipeline.report.journey import as_json, funnel, merge_run
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline
from tests.faults import FAULT_ENV

from .conftest import C14, REL14A

REPO = Path(__file__).resolve().parents[2]
STEPS = [
    {"langid": {"languages": ["en"], "min_score": 0.65}},
    {"gopher_quality": {}},
    {"gopher_repetition": {}},
    {"c4_lines": {}},
]


def config(run_dir: Path, wet_files, lid_model, **extra) -> dict:
    cfg = {
        "run_dir": str(run_dir),
        "executor": {"type": "local", "tasks": 2, "workers": 1},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [{"langid": {**STEPS[0]["langid"], "model": str(lid_model)}}, *STEPS[1:]],
        "output": {"dropped_sample": 1.0},
    }
    cfg.update(extra)
    return cfg


def files_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory, wet_files, lid_model):
    """One uninterrupted run of the crawl config on the real sample, shared by several tests."""
    run_dir = tmp_path_factory.mktemp("run") / "crawl"
    merged = run(from_dict(config(run_dir, wet_files, lid_model)))
    return run_dir, merged


def test_funnel_adds_up_and_matches_output(sample_run):
    run_dir, merged = sample_run
    rows = funnel(merged)
    assert [r.step for r in rows] == [
        "read_wet",
        "00_langid",
        "01_gopher_quality",
        "02_gopher_repetition",
        "03_c4_lines",
        "write_parquet",
    ]
    assert rows[0].docs_out == 566 + 43  # every conversion record of both files
    for prev, row in zip(rows, rows[1:]):
        assert row.docs_in == prev.docs_out, row.step
        assert row.docs_in - row.docs_out == sum(row.drops.values()), row.step
    table = pq.read_table(run_dir / "01_curate" / "output")
    assert table.num_rows == rows[-1].docs_out > 0
    assert set(table.column("language").to_pylist()) == {"en"}
    assert min(table.column("language_score").to_pylist()) >= 0.65
    assert sum(len(t.encode()) for t in table.column("text").to_pylist()) == rows[-1].bytes_out
    assert set(table.column("crawl").to_pylist()) <= {"CC-MAIN-2014-10", "CC-MAIN-2017-30"}
    assert table.column("id").null_count == 0 and len(set(table.column("id").to_pylist())) == table.num_rows


def test_dropped_documents_are_kept_for_inspection(sample_run):
    run_dir, merged = sample_run
    rows = {r.step: r for r in funnel(merged)}
    for step in ("00_langid", "01_gopher_quality", "02_gopher_repetition", "03_c4_lines"):
        dropped = pq.read_table(run_dir / "01_curate" / "dropped" / step)
        reasons = dropped.column("drop_reason").to_pylist()
        # dropped_sample: 1.0 keeps every dropped document, so counts match the stats exactly
        assert {r: reasons.count(r) for r in set(reasons)} == rows[step].drops, step


def test_stats_cli_json_and_table(sample_run):
    run_dir, merged = sample_run
    out = pipeline("stats", str(run_dir), "--json", check=True)
    data = json.loads(out.stdout)
    assert data == json.loads(json.dumps(as_json(merged)))
    assert data["languages"]["en"] > 400
    # the journey: the reader and the four filters, no stage's writer; the same figures as the funnel
    stage_rows = funnel(merged)
    assert [r["step"] for r in data["journey"]] == [r.step for r in stage_rows[:-1]]
    assert [(r["docs_in"], r["docs_out"], r["drops"]) for r in data["journey"][1:]] == [
        (r.docs_in, r.docs_out, r.drops) for r in stage_rows[1:-1]
    ]
    table = pipeline("stats", str(run_dir), check=True).stdout
    assert "low_language_score" in table and "gopher_short_doc" in table and "read_wet" in table
    assert "write_parquet" not in table
    stages = pipeline("stats", str(run_dir), "--stages", check=True).stdout
    assert "write_parquet" in stages and "low_language_score" in stages


def test_rerun_redoes_nothing(sample_run, wet_files, lid_model):
    run_dir, merged = sample_run
    out = run_dir / "01_curate" / "output"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    again = run(from_dict(config(run_dir, wet_files, lid_model, executor={"type": "local", "tasks": 2, "workers": 2})))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == before
    assert funnel(again) == funnel(merged)


def test_changed_config_is_refused_then_forced(tmp_path, wet_files, lid_model):
    run_dir = tmp_path / "r"
    run(from_dict(config(run_dir, wet_files[1:], lid_model)))
    changed = config(run_dir, wet_files[1:], lid_model)
    changed["steps"][1] = {"gopher_quality": {"min_doc_words": 10}}
    with pytest.raises(ConfigError, match=r"steps\[1\].gopher_quality.min_doc_words: 50 -> 10"):
        run(from_dict(changed))
    merged = run(from_dict(changed), force=True)
    assert json.loads((run_dir / "plan.json").read_text())["stages"][0]["tasks"] == 1  # one WET file, one task
    assert funnel(merged)[2].drops.get("gopher_short_doc", 0) < 81


def test_killed_run_resumes_to_identical_output(tmp_path, wet_files, lid_model, sample_run):
    """A process killed mid-task (half-written .tmp file, no completion) then re-run equals a clean run."""
    clean_dir, clean = sample_run
    cfg_path = tmp_path / "crawl.yaml"
    run_dir = tmp_path / "killed"
    cfg_path.write_text(json.dumps(config(run_dir, wet_files, lid_model)))
    cmd = [sys.executable, "-m", "gristmill.cli", "run", str(cfg_path)]
    # Each task runs in its own child process, also with workers=1: the injected fault kills
    # the task, and the command reports it and fails the stage.
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env={**os.environ, FAULT_ENV: "20"}, stdout=log, stderr=log, start_new_session=True
        )
        returncode = proc.wait(timeout=300)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    message = " ".join((tmp_path / "killed.log").read_text().split())
    assert returncode == 1, message
    assert "task 0 exited with code 137" in message, message
    leftovers = list((run_dir / "01_curate").rglob("*.tmp"))
    assert leftovers, "the killed task should have left a partial file"
    assert not (run_dir / "01_curate" / "completions" / "00000").exists()
    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert files_bytes(run_dir / "01_curate" / "output") == files_bytes(clean_dir / "01_curate" / "output")
    assert files_bytes(run_dir / "01_curate" / "dropped") == files_bytes(clean_dir / "01_curate" / "dropped")

    def counts(rows):
        return [(r.step, r.docs_in, r.docs_out, r.bytes_in, r.bytes_out, r.drops) for r in rows]

    assert counts(funnel(merge_run(run_dir))) == counts(funnel(clean))


def test_output_is_the_same_for_any_worker_count_and_per_language(tmp_path, wet_files, lid_model):
    cfg = config(tmp_path / "pl", wet_files, lid_model, output={"per_language": True, "dropped_sample": 0.0})
    cfg["steps"][0]["langid"]["languages"] = None  # keep every language
    cfg["steps"] = cfg["steps"][:1]
    merged = run(from_dict(cfg))
    out = tmp_path / "pl" / "01_curate" / "output"
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    # the 2014 sample is mostly English with Persian, Arabic, Spanish; the 2017 one has Chinese,
    # Russian, Japanese
    assert {"en", "fa", "ar", "es", "zh", "ru", "ja"} <= folders
    for lang in ("zh", "fa"):
        t = pq.read_table(out / lang)
        assert set(t.column("language").to_pylist()) == {lang}
    assert not (tmp_path / "pl" / "01_curate" / "dropped").exists()
    assert funnel(merged)[-1].docs_out == sum(pq.read_metadata(p).num_rows for p in out.rglob("*.parquet"))


def test_missing_or_corrupt_model_fails_before_reading(tmp_path, wet_files):
    bad = tmp_path / "lid.bin"
    bad.write_bytes(b"not a model at all")
    for model, msg in ((tmp_path / "none.ftz", "not found"), (bad, "not a fastText model")):
        cfg = config(tmp_path / "m", wet_files, model)
        with pytest.raises(ModelError, match=msg):
            run(from_dict(cfg))
        assert not (tmp_path / "m").exists()


def test_unmatched_glob_is_a_config_error(tmp_path, lid_model):
    cfg = config(tmp_path / "g", [tmp_path / "nothing-*.wet.gz"], lid_model)
    with pytest.raises(ConfigError, match=r"input.paths\[0\]: no file matches"):
        run(from_dict(cfg))


def test_cli_reports_config_errors_with_key_path(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "input: {paths: [x]}\nsteps:\n  - gopher_quality: {}\n  - c4_lines: {}\n  - langid: {min_score: high}\n"
    )
    res = pipeline("validate", str(cfg))
    assert res.returncode == 2
    assert "steps[2].langid.min_score: expected a number between 0 and 1, got 'high'" in res.stderr


def test_commoncrawl_over_http_with_injected_503(tmp_path, server, lid_model):
    """The download path for real: wet.paths.gz, a WET file and the langid model over loopback
    HTTP, with one 503 SlowDown."""
    server.faults["/" + REL14A] = ["slowdown"]
    (server.root / "models").mkdir()
    (server.root / "models" / "lid.176.ftz").write_bytes(lid_model.read_bytes())
    cfg = config(tmp_path / "cc", [], f"{server.base}/models/lid.176.ftz")
    cfg["input"] = {
        "commoncrawl": {
            "crawl": C14,
            "files": 1,
            "base_url": server.base,
            "cache": "keep",  # the download cache's path (streaming: tests/pipeline/test_input_stream.py)
            "cache_dir": str(tmp_path / "cache"),
            "backoff_s": 0.01,
        }
    }
    merged = run(from_dict(cfg))
    assert funnel(merged)[0].docs_out == 566
    gets = [r for r in server.requests if r[0] == "/" + REL14A]
    assert len(gets) == 2  # the 503, then the download
    assert (tmp_path / "cache" / REL14A).is_file()
    assert (tmp_path / "cache" / "models" / "lid.176.ftz").read_bytes() == lid_model.read_bytes()
    table = pq.read_table(tmp_path / "cc" / "01_curate" / "output")
    assert set(table.column("source").to_pylist()) == {f"{server.base}/{REL14A}"}
