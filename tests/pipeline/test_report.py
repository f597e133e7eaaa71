"""Score histograms and samples kept during a run, `pipeline report` (in headless Chromium) and
the notebook API `gristmill.stats`, on the real WET sample."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gristmill.config import from_dict
from gristmill.core.scores import SAMPLE_SIZE
from gristmill.pipeline.report.journey import funnel, load_scores, merge_run
from gristmill.pipeline.report.page import CSS, build, write
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

from .test_run import config

CHROMIUM = Path("/usr/bin/chromium")
SECTIONS = ("funnel", "reasons", "histograms", "languages", "by-language", "domains", "samples")
PLANTED = '<script>window.pwned=1</script><img src=x onerror="window.pwned=1">'


@pytest.fixture(scope="module")
def report_run(tmp_path_factory, wet_files, lid_model):
    run_dir = tmp_path_factory.mktemp("report") / "crawl"
    merged = run(from_dict(config(run_dir, wet_files, lid_model)))
    return run_dir, merged


def _counters(merged) -> dict[str, dict]:
    return {s["name"].partition(": ")[2]: s["counters"] for st in merged["stages"] for s in st["steps"]}


def test_histograms_agree_with_counts_and_output(report_run):
    run_dir, merged = report_run
    scores = load_scores(run_dir)["01_curate"]
    counters = _counters(merged)
    assert list(scores) == ["00_langid", "01_gopher_quality", "02_gopher_repetition", "03_c4_lines"]
    for step, rec in scores.items():
        c = counters[step]
        assert sum(rec["hist"]["kept"]) + rec["missing"]["kept"] == c["forwarded"], step
        assert sum(rec["hist"]["dropped"]) + rec["missing"]["dropped"] == c["dropped"], step
        assert sum(rec["length"]["before"]) == c["total"] and sum(rec["length"]["after"]) == c["forwarded"]
        by_reason: dict[str, int] = {}
        for s in rec["samples"]:
            by_reason[s["reason"] or "kept"] = by_reason.get(s["reason"] or "kept", 0) + 1
            assert len(s["text"]) <= 300
        drops = {k.removeprefix("dropped_"): v for k, v in c.items() if k.startswith("dropped_")}
        assert by_reason == {
            **{r: min(n, SAMPLE_SIZE) for r, n in drops.items()},
            "kept": min(c["forwarded"], SAMPLE_SIZE),
        }
    # the last filter's kept documents are the rows written
    table = pq.read_table(run_dir / "01_curate" / "output")
    assert sum(scores["03_c4_lines"]["hist"]["kept"]) == table.num_rows == funnel(merged)[-1].docs_out
    # langid's score is the language_score column; nothing kept below min_score 0.65 (bin 13 holds 0.65..0.70)
    lid = scores["00_langid"]
    assert lid["score_field"] == "language_score" and sum(lid["hist"]["kept"][:13]) == 0
    kept_ids = set(table.column("id").to_pylist())
    assert {s["id"] for s in scores["03_c4_lines"]["samples"] if s["kept"]} <= kept_ids


def test_samples_and_histograms_do_not_depend_on_the_task_split(report_run, tmp_path, wet_files, lid_model):
    run_dir, _ = report_run
    run(from_dict(config(tmp_path / "one", wet_files, lid_model, executor={"type": "local", "tasks": 1, "workers": 1})))
    assert load_scores(tmp_path / "one") == load_scores(run_dir)
    assert len(list((run_dir / "01_curate" / "scores" / "00_langid").glob("*.json"))) == 2


def test_stats_cli_prints_top_domains(report_run):
    run_dir, _ = report_run
    out = pipeline("stats", str(run_dir), check=True).stdout
    assert "top domains" in out


def test_report_has_every_section_and_the_thresholds(report_run, tmp_path):
    run_dir, _ = report_run
    out = tmp_path / "report.html"
    res = pipeline("report", str(run_dir), "-o", str(out))
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    for section in SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert "min min_score 0.65" in page  # langid's threshold, from config.yaml
    # self-contained: no stylesheet, script, image or font loaded from elsewhere
    assert "<link" not in page and "<img" not in page and "@import" not in page and "url(" not in CSS
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert 'id="training"' not in page  # no train/ in this run dir
    (run_dir / "train").mkdir(exist_ok=True)
    try:
        steps = [{"step": i, "loss": 5 - i / 10} for i in range(1, 20)]
        # the trainer's scorings during training (trainer/scores.py), plotted against tokens seen
        scorings = [
            {"step": i, "tokens": 1024 * i, "eval/core": 0.01 * i, "eval/piqa/acc": 0.5, "eval/piqa/centred": 0.02 * i,
             "eval/lambada_openai/perplexity": 900.0 / i, "eval/wikitext2/bits_per_byte": 3.0 - 0.1 * i}
            for i in (5, 10, 15)
        ]  # fmt: skip
        (run_dir / "train" / "metrics.jsonl").write_text("\n".join(map(json.dumps, steps + scorings)) + "\n")
        page = build(run_dir)
        assert '<section id="training">' in page
        training = page.split('<section id="training">')[1].split("</section>")[0]
        for title in [
            "CORE (mean centred accuracy) by tokens seen",
            "piqa: centred accuracy by tokens seen",
            "lambada_openai: perplexity by tokens seen",
            "wikitext2: bits per byte by tokens seen",
        ]:
            assert title in training, title
        assert training.count("<polyline") == 5  # loss, and the four scorings
        (run_dir / "train" / "metrics.jsonl").write_text("\n".join(map(json.dumps, steps)) + "\n")
        training = build(run_dir).split('<section id="training">')[1].split("</section>")[0]
        assert training.count("<polyline") == 1 and "tokens seen" not in training  # no scoring: loss alone
    finally:
        shutil.rmtree(run_dir / "train")


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    if not CHROMIUM.exists():
        if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
            pytest.fail(f"{CHROMIUM} missing (make test installs the Debian chromium package)")
        pytest.skip(f"{CHROMIUM} missing: apt-get install chromium (make test does)")
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_report_opens_in_chromium_and_crawled_html_stays_text(report_run, tmp_path):
    src, _ = report_run
    run_dir = tmp_path / "crawl"
    shutil.copytree(src, run_dir)
    # plant markup in a sampled document of a task's score file (merged afresh by the report)
    part = run_dir / "01_curate" / "scores" / "00_langid" / "00000.json"
    rec = json.loads(part.read_text())
    rec["samples"][0]["text"] = "evil " + PLANTED
    rec["samples"][0]["url"] = 'http://x.test/"><script>window.pwned=2</script>'
    part.write_text(json.dumps(rec))
    report = write(run_dir, tmp_path / "report.html")
    assert PLANTED not in report.read_text()

    res = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    dom = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'data-ok="1"' in dom, "the page's own script did not run on load"
    assert "data-pwned" not in dom, "a crawled script or handler ran"
    assert "evil &lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=" in dom
    for section in SECTIONS:
        assert f'id="{section}"' in dom, section
    console = [ln for ln in res.stderr.splitlines() if "Uncaught" in ln or ":CONSOLE(" in ln]
    assert not console, console

    shot = tmp_path / "report.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", report.as_uri()], tmp_path)
    assert res.returncode == 0 and shot.stat().st_size > 10_000, res.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_notebook_api(report_run):
    pytest.importorskip("pandas")
    from gristmill import stats

    run_dir, merged = report_run
    s = stats.load(run_dir)
    assert list(s.funnel["docs_out"]) == [r.docs_out for r in funnel(merged)]
    assert s.reasons.groupby("step")["documents"].sum().to_dict() == {
        r.step: sum(r.drops.values()) for r in funnel(merged) if r.drops
    }
    kept = s.histograms.query("step == '03_c4_lines' and kind == 'score' and series == 'kept'")["count"].sum()
    assert kept == pq.read_table(run_dir / "01_curate" / "output").num_rows
    assert set(s.samples.columns) >= {"score", "id", "url", "kept", "reason", "text"}
    assert s.languages["en"] > 400
    for fig in (
        s.plot_scores("00_langid"),
        s.plot_length("03_c4_lines"),
        s.plot_funnel(),
        s.plot_reasons("00_langid"),
        s.plot_languages(),
    ):
        assert fig._repr_svg_().startswith("<svg")
    assert "0.65" in s.plot_scores("00_langid")._repr_svg_()
    assert merge_run(run_dir)["stages"][0]["tasks_completed"] == 2
