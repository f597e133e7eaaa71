"""Many WET records just under `input.max_record_bytes`: every task of every stage stays within
its stage's memory model (which counts the largest record) and within what `pipeline plan`
shows; each step holds no more for one such record than it declares (a step holding a whole
record's derived data at once, as datatrove's Gopher filter did, exceeds it); the planner
refuses a record limit a task cannot hold; the pieces that bound memory (row groups, batches)
are bounded by bytes. The same holds for what the curate stage reads besides WET records: HTML
pages of a WARC file near the limit, extracted by either extractor, and a file streamed from an
S3 server with a large read buffer.

The records are real text from the shared sample, repeated and mutated up to 2 MB each, one gzip
member per record as Common Crawl writes them (`benchmarks/make_large_records.py`); the limit is
2 MiB so that the test stays small, and 2 MB pages are long enough to take every step's path for
long pages (1M characters and more). The filters' thresholds are opened so that every record
reaches every step, both dedups and tokenization included."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.core import parquet_io
from gristmill.core.filter import batched_documents
from gristmill.core.parquet_io import ParquetReader, ParquetWriter
from gristmill.input.stream import stream_memory_bytes
from gristmill.input.warc import EXTRACTION_BYTES_PER_BYTE, EXTRACTORS, WarcReader
from gristmill.input.wet import WetReader
from gristmill.pipeline.execution.usage import stage_usage
from gristmill.pipeline.planning.planner import estimate_memory, plan
from tests.conftest import REPO
from tests.s3_server import PlainS3Server

sys.path.insert(0, str(REPO / "benchmarks"))
from large_record_steps import STEPS  # noqa: E402
from large_records_run import OPEN_STEPS  # noqa: E402
from make_large_records import CRAWL, write, write_warc  # noqa: E402

from tests.cli_process import pipeline

LIMIT = 2 << 20
RECORDS = 6
PAGES = 3  # HTML pages of the WARC file
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


@pytest.fixture(scope="module")
def large_wet(shared_data, tmp_path_factory):
    path = tmp_path_factory.mktemp("large") / "large.warc.wet.gz"
    sizes = write(path, RECORDS, 2_000_000, mutate=0.2, seed=3)
    assert all(LIMIT - 100_000 < s <= LIMIT for s in sizes)
    return path


@pytest.fixture(scope="module")
def large_warc(shared_data, tmp_path_factory):
    path = tmp_path_factory.mktemp("large_warc") / "large.warc.gz"
    sizes = write_warc(path, PAGES, 2_000_000, mutate=0.2, seed=5)
    assert all(LIMIT - 100_000 < s <= LIMIT for s in sizes)
    return path


def _env(shared_data) -> dict:
    return {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "GRISTMILL_DATA": str(shared_data)}


def _open_config(tmp_path, wet, lid_model, kenlm_model, quality_model) -> dict:
    cfg = yaml.safe_load((REPO / "configs" / "crawl.yaml").read_text())
    models = {"langid": {"model": str(lid_model)}, "kenlm": {"models": {"en": str(kenlm_model)}}}
    models["quality"] = {"model": str(quality_model)}
    for entry in cfg["steps"]:
        ((step, params),) = entry.items()
        params.update(OPEN_STEPS.get(step, {}), **models.get(step, {}))
        if step == "tokenize":  # a smaller vocabulary and sample: the same code, a shorter training
            params["tokenizer"].update(train={"vocab_size": 512}, sample_bytes=5_000_000)
    cfg.update(
        run_dir=str(tmp_path / "run"),
        executor={"type": "local", "tasks": 1, "workers": 1},
        input={"paths": [str(wet)], "max_record_bytes": LIMIT},
        train=None,
    )
    return cfg


def test_every_task_stays_within_its_stage_model_and_the_plan(
    tmp_path, large_wet, shared_data, lid_model, kenlm_model, quality_model
):
    cfg = _open_config(tmp_path, large_wet, lid_model, kenlm_model, quality_model)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = pipeline("run", path, cwd=REPO, env=_env(shared_data))
    assert r.returncode == 0, r.stderr[-3000:]
    stages = plan(from_dict(cfg), check_memory=False)
    estimates = {e.stage.label: e for e in estimate_memory(from_dict(cfg), stages)}
    run_dir = tmp_path / "run"
    measured = {s.label: stage_usage(run_dir / s.label) for s in stages}
    assert all(measured.values()) and len(measured) == 27  # every stage ran, dedups and tokenize too
    over = {
        k: (u.max_rss_mb, estimates[k].bytes / 1e6)
        for k, u in measured.items()
        if u.max_rss_mb * 1e6 > estimates[k].bytes
    }
    assert not over, over  # (measured MB, model MB)
    # `pipeline plan` shows those models: its figure per task is at least each stage's peak
    r = pipeline("plan", path, "--json", cwd=REPO, env=_env(shared_data))
    assert r.returncode == 0, r.stderr[-3000:]
    shown = {row["stage"]: row["mem/task"].split() for row in json.loads(r.stdout)["stages"]}
    assert set(shown) == set(measured)
    planned = {k: float(v) * UNITS[unit] for k, (v, unit) in shown.items()}
    assert all(planned[k] >= u.max_rss_mb * 1e6 for k, u in measured.items()), (planned, measured)
    # the large documents reached every stage: all kept to the end, and tokenized
    (filtered,) = [s for s in stages if s.name == "near_dedup_filter"]
    final = pq.read_table(run_dir / filtered.label / "output", columns=["text"]).column("text").to_pylist()
    assert len(final) == RECORDS and min(len(t.encode()) for t in final) > 1_000_000
    manifest = json.loads((run_dir / "tokens" / "manifest.json").read_text())
    assert manifest["totals"]["documents"] == RECORDS
    # the record term is part of every model that reads documents
    readers = [s for s in stages if any(isinstance(x, (WetReader, ParquetReader)) for x in s.pipeline)]
    assert [s.name for s in readers] == [
        "curate",
        "exact_dedup_hash",
        "exact_dedup_filter",
        "near_dedup_signature",
        "near_dedup_shingles",
        "near_dedup_filter",
        "tokenizer_sample",
        "tokenize",
    ]
    assert all(estimates[s.label].record_bytes > 5 * LIMIT for s in readers)


def _curate(cfg: dict) -> dict:
    """`cfg` with its steps up to the first that ends a stage: one curate stage."""
    ends = ("exact_dedup", "near_dedup", "tokenize")
    steps = cfg["steps"][: next(i for i, e in enumerate(cfg["steps"]) if next(iter(e)) in ends)]
    return {**cfg, "steps": steps}


def _run_curate(tmp_path, cfg: dict, env: dict):
    """Run `cfg` (one stage) through the CLI: (its estimate, its task's usage, its output texts)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = pipeline("run", str(path), cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    stages = plan(from_dict(cfg), check_memory=False)
    assert [s.name for s in stages] == ["curate"]
    folder = tmp_path / "run" / stages[0].label
    texts = pq.read_table(folder / "output", columns=["text"]).column("text").to_pylist()
    return estimate_memory(from_dict(cfg), stages)[0], stage_usage(folder), texts


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_warc_pages_near_the_limit_stay_within_the_curate_model(
    tmp_path, large_warc, shared_data, lid_model, kenlm_model, quality_model, extractor
):
    """HTML pages of 2 MB (a WARC file, each response just under the 2 MiB limit) through the
    curate stage with every threshold opened: the task's peak stays within the stage's model,
    whose largest per-document need is the page's extraction by the configured extractor."""
    cfg = _curate(_open_config(tmp_path, large_warc, lid_model, kenlm_model, quality_model))
    cfg["input"].update(format="warc", extractor=extractor)
    est, usage, texts = _run_curate(tmp_path, cfg, _env(shared_data))
    assert len(texts) == PAGES and min(len(t.encode()) for t in texts) > 1_500_000  # every page read, kept
    assert usage.max_rss_mb * 1e6 <= est.bytes, (usage.max_rss_mb, est.bytes / 1e6)
    reader = est.stage.pipeline[0]
    assert isinstance(reader, WarcReader) and reader.extractor == extractor
    work = est.stage.work
    assert max(s.document_bytes(work) for s in est.stage.pipeline) == reader.document_bytes(work)
    assert est.record_bytes > EXTRACTION_BYTES_PER_BYTE[extractor] * LIMIT


def test_a_streamed_input_stays_within_its_model(tmp_path, large_wet, shared_data):
    """The large records streamed from an S3 server (moto, its own process) with a 16 MiB read
    buffer, the reader alone: the stage's model counts the stream (a read and botocore's
    client), and what the task holds beyond reading the same file from disk stays within that."""
    rel = f"crawl-data/{CRAWL}/segments/1/wet/large.warc.wet.gz"
    server = PlainS3Server(bucket="commoncrawl")
    try:
        server.client.put_object(Bucket="commoncrawl", Key=rel, Body=large_wet.read_bytes())
        listing = gzip.compress(f"{rel}\n".encode())
        server.client.put_object(Bucket="commoncrawl", Key=f"crawl-data/{CRAWL}/wet.paths.gz", Body=listing)
        env = {**_env(shared_data), "HOME": str(tmp_path), **server.env()}
        base = {"executor": {"type": "local", "tasks": 1, "workers": 1}, "steps": [], "output": {"dropped_sample": 0}}
        read = 16 << 20
        cc = {"crawl": CRAWL, "files": 1, "source": "s3", "read_buffer_bytes": read, "cache_dir": str(tmp_path / "c")}
        streamed = {
            **base,
            "run_dir": str(tmp_path / "s" / "run"),
            "input": {"commoncrawl": cc, "max_record_bytes": LIMIT},
        }
        local = {
            **base,
            "run_dir": str(tmp_path / "l" / "run"),
            "input": {"paths": [str(large_wet)], "max_record_bytes": LIMIT},
        }
        for side in ("s", "l"):
            (tmp_path / side).mkdir()
        with pytest.MonkeyPatch.context() as mp:  # the planner in this process lists the bucket too
            for k, v in server.env().items():
                mp.setenv(k, v)
            s_est, s_use, s_texts = _run_curate(tmp_path / "s", streamed, env)
        l_est, l_use, l_texts = _run_curate(tmp_path / "l", local, env)
    finally:
        server.stop()
    assert s_texts == l_texts and len(s_texts) == RECORDS
    assert not (tmp_path / "c").exists()  # streamed: nothing written to disk
    url = f"s3://commoncrawl/{rel}"
    assert s_est.stage.pipeline[0].stream_bytes == stream_memory_bytes(url, read) == read + (32 << 20)
    assert l_est.stage.pipeline[0].stream_bytes == 0
    assert s_use.max_rss_mb * 1e6 <= s_est.bytes, (s_use.max_rss_mb, s_est.bytes / 1e6)
    # measured: streaming costs the task botocore's client (~20 MB), not the file nor the buffer
    assert (s_use.max_rss_mb - l_use.max_rss_mb) * 1e6 <= stream_memory_bytes(url, read)


def test_each_step_holds_at_most_what_it_declares_for_a_record(
    tmp_path, shared_data, lid_model, kenlm_model, quality_model
):
    """Every step on one 2 MB page, its peak RSS over the page against its declaration for a page
    that long (`benchmarks/large_record_steps.py`: `document_bytes`, the readers' record share,
    langid's and quality's windows). Gopher's filters as they were before they read long pages a
    piece at a time peaked at 180 MB over such a page, against 99 MB declared."""
    out = tmp_path / "steps.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "large_record_steps.py"), "--mb", "2", "--one-process"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**_env(shared_data), "TMPDIR": str(tmp_path), "HOME": os.environ.get("HOME", "/root")},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [row["step"] for row in rows] == list(STEPS)
    assert all(1_900_000 < row["bytes"] <= 2_000_000 for row in rows)
    over = {
        row["step"]: (row["rss_over"] / 1e6, row["declared"] / 1e6) for row in rows if row["rss_over"] > row["declared"]
    }
    assert not over, over  # (measured MB, declared MB)


def test_a_record_limit_a_task_cannot_hold_is_refused_naming_it(tmp_path, wet_files, lid_model):
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 2, "workers": 1, "memory_gb_per_task": 1},
        "input": {"paths": [str(p) for p in wet_files], "max_record_bytes": 256 << 20},
        "steps": [{"langid": {"model": str(lid_model)}}, {"gopher_repetition": {}}],
    }
    with pytest.raises(ValueError) as e:
        plan(from_dict(cfg))
    msg = str(e.value)
    assert "stage 01_curate" in msg and "1.00 GB of executor.memory_gb_per_task" in msg
    assert "lower input.max_record_bytes" in msg and "(256 MiB)" in msg
    est = next(iter(estimate_memory(from_dict(cfg), plan(from_dict(cfg), check_memory=False))))
    assert est.bytes - est.record_bytes < 1 << 30 < est.bytes  # the record is what does not fit
    cfg["input"]["max_record_bytes"] = 8 << 20
    assert plan(from_dict(cfg))  # lowered: it fits


def test_plan_shows_the_largest_record_term(shared_data):
    r = pipeline(
        "plan",
        "configs/slurm-crawl.yaml",
        "--files",
        "90000",
        "--json",
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "GRISTMILL_DATA": str(shared_data)},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    curate = out["stages"][0]
    assert curate["largest record"].endswith("MB") and float(curate["largest record"].split()[0]) > 50
    assert any("input.max_record_bytes" in n for n in out["notes"])


def test_row_groups_are_bounded_by_bytes_and_read_back_in_slices(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_io, "ROW_GROUP_BYTES", 10_000)
    monkeypatch.setattr(parquet_io, "READ_SLICE_BYTES", 3_000)
    sizes = [100, 4000, 30_000, 200, 9000, 9000, 50, 12_000, 700]
    docs = [
        Document(text="é" * (n // 2), id=f"d{i}", metadata={"source": "s", "offset": i}) for i, n in enumerate(sizes)
    ]
    w = ParquetWriter()
    w.bind(tmp_path / "out", {}, "zstd")
    list(w.run(iter(docs), rank=0))
    pf = pq.ParquetFile(tmp_path / "out" / "00000.parquet")
    groups = [pf.read_row_group(g).column("id").to_pylist() for g in range(pf.num_row_groups)]
    # a group closes before a document would take it past 10,000 bytes; a longer one is alone
    assert groups == [["d0", "d1"], ["d2"], ["d3", "d4"], ["d5", "d6"], ["d7"], ["d8"]]
    reader = ParquetReader(tmp_path / "out")
    read = list(reader.run())
    assert [(d.id, d.text) for d in read] == [(d.id, d.text) for d in docs]
    assert reader.stats["bytes"].total == sum(len(d.text.encode()) for d in docs)


def test_filter_batches_are_bounded_by_characters():
    docs = [Document(text="x" * n, id=str(i)) for i, n in enumerate([10, 10, 500, 10, 10, 10, 10])]
    batches = [[d.id for d in b] for b in batched_documents(docs, 4, max_chars=100)]
    assert batches == [["0", "1", "2"], ["3", "4", "5", "6"]]
