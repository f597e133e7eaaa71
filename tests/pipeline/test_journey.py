"""The documents' journey (`pipeline stats`, the report's funnel, `gristmill.stats`): one row per
step that decides, on the demo run (`configs/crawl.yaml`: seven filters, paragraph exact dedup,
near dedup, token shards) over the real WET sample; the per-stage funnel behind `--stages`."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from gristmill.config import from_dict
from gristmill.pipeline.report.journey import (
    as_json,
    funnel,
    journey,
    journey_json,
    language_journey,
    merge_run,
)
from gristmill.pipeline.report.page import JOURNEY_CHART, write
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

from .conftest import demo_config
from .test_report import _chromium

#: steps of a stage that move documents between steps, never decide about them
PLUMBING = ("read_parquet", "write_parquet")


@pytest.fixture(scope="module")
def demo_run(demo_run_dir, shared_data):
    """`configs/crawl.yaml` as `make demo` runs it, without training: the config, the run
    directory (the session's demo run, conftest `demo_run_dir`: read, never written) and its
    merged stats."""
    cfg = from_dict(demo_config(shared_data, demo_run_dir))
    return cfg, demo_run_dir, json.loads((demo_run_dir / "stats.json").read_text())


def _expected_steps(cfg) -> list[str]:
    """The reader, each YAML step by its id, then tokenization: its `tokenize:` section or, once
    it is a YAML step, its id."""
    ids = [s.step_id for s in cfg.specs]
    section = getattr(cfg, "tokenize", None) is not None and not any(s.name == "tokenize" for s in cfg.specs)
    return ["read_wet", *ids, *(["tokenize"] if section else [])]


def _output(run_dir: Path, stage: str):
    return pq.read_table(run_dir / stage / "output", columns=["id", "text"])


def _text_bytes(table) -> int:
    return sum(len(t.encode("utf-8")) for t in table.column("text").to_pylist())


def test_one_row_per_yaml_step_plus_read_and_tokens_in_order(demo_run):
    cfg, run_dir, merged = demo_run
    rows = journey(merged)
    assert [r.step for r in rows] == _expected_steps(cfg)
    assert len(rows) == len(cfg.specs) + 2 - any(s.name == "tokenize" for s in cfg.specs)
    assert rows[0].kind == "read" and rows[-1].kind == "tokens"
    kinds = {"exact_dedup": "dedup", "near_dedup": "dedup", "tokenize": "tokens"}
    assert [r.kind for r in rows[1 : len(cfg.specs) + 1]] == [kinds.get(s.name, "filter") for s in cfg.specs]
    assert {r.kind for r in rows if r.step.endswith(("_exact_dedup", "_near_dedup"))} == {"dedup"}
    # a dedup step is one row over all its stages (the funnel has one per phase and plumbing)
    stage_rows = funnel(merged)
    assert len(stage_rows) > 2 * len(rows)
    for r in rows:
        assert not r.step.startswith(PLUMBING)
        phases = [s for s in stage_rows if s.step == r.step]
        assert r.stages == list(dict.fromkeys(s.stage for s in phases)) or r.kind in ("read", "tokens"), r.step
    near = next(r for r in rows if r.step.endswith("_near_dedup"))
    assert len(near.stages) >= 3


def test_documents_chain_from_read_to_tokens_and_match_the_files(demo_run):
    cfg, run_dir, merged = demo_run
    rows = journey(merged)
    for prev, row in zip(rows, rows[1:]):
        assert row.docs_in == prev.docs_out, (prev.step, row.step)
        assert row.bytes_in == prev.bytes_out, (prev.step, row.step)
    for row in rows[1:]:
        assert row.docs_in - row.docs_out == row.dropped, row.step
    assert rows[0].docs_out == 566 + 43  # every conversion record of the two files
    assert rows[0].counters["files"] == 2
    # the documents out of the last step of each stage are the Parquet that stage wrote
    last = {r.stages[-1]: r for r in rows[:-1]}
    assert len(last) == 3  # curate (the seven filters), exact dedup's filter stage, near dedup's
    for stage, row in last.items():
        out = _output(run_dir, stage)
        assert (out.num_rows, _text_bytes(out)) == (row.docs_out, row.bytes_out), row.step
    # tokens: every document kept, with the manifest's token count
    manifest = json.loads((run_dir / "tokens" / "manifest.json").read_text())
    tokens = rows[-1]
    assert tokens.docs_out == manifest["totals"]["documents"] == rows[-2].docs_out > 0
    assert tokens.counters["tokens"] == manifest["totals"]["tokens"] > tokens.docs_out
    assert tokens.counters["shards"] == len(manifest["shards"])


def test_exact_dedup_removes_paragraphs_and_near_dedup_documents(demo_run):
    cfg, run_dir, merged = demo_run
    rows = {r.step: r for r in journey(merged)}
    exact = next(r for s, r in rows.items() if s.endswith("_exact_dedup"))
    near = next(r for s, r in rows.items() if s.endswith("_near_dedup"))
    # paragraph granularity: paragraphs go, documents stay unless too little is left
    assert exact.counters["paragraphs_removed"] > 0 and exact.bytes_out < exact.bytes_in
    assert exact.docs_in - exact.docs_out == exact.dropped
    assert set(exact.drops) <= {"exact_duplicate_paragraphs"}
    assert f"{exact.counters['paragraphs_removed']:,} paragraphs removed" in journey_json(exact)["notes"]
    # near dedup: what it drops is what its cluster phase removed
    assert near.docs_in - near.docs_out == near.drops.get("near_duplicate", 0) == near.counters["removed"]
    assert "candidate_pairs" in near.counters
    # the same figures as the funnel's filter phases
    for r in (exact, near):
        phase = next(s for s in funnel(merged) if s.step == r.step and s.kind == "filter")
        assert (phase.docs_in, phase.docs_out, phase.bytes_in, phase.bytes_out) == (
            r.docs_in,
            r.docs_out,
            r.bytes_in,
            r.bytes_out,
        )


def test_languages_add_up_to_every_row_of_the_journey(demo_run):
    cfg, run_dir, merged = demo_run
    rows = journey(merged)
    by_lang = language_journey(merged)
    assert {"en", "zh", "ja"} <= set(by_lang) and list(by_lang)[0] == "en"
    for i, row in enumerate(rows):
        cells = [lrows[i] for lrows in by_lang.values()]
        assert all(c.step == row.step for c in cells)
        for key in ("docs_in", "docs_out", "bytes_in", "bytes_out"):
            assert sum(getattr(c, key) for c in cells) == getattr(row, key), (row.step, key)
        drops: dict[str, int] = {}
        for c in cells:
            for k, v in c.drops.items():
                drops[k] = drops.get(k, 0) + v
        assert drops == {k: v for k, v in row.drops.items() if v}, row.step
    # langid keeps English only: every other language ends at langid
    langid = next(i for i, row in enumerate(rows) if row.step.endswith("_langid"))
    assert by_lang["zh"][langid].docs_in > 0
    assert by_lang["zh"][langid].docs_out == 0 and by_lang["zh"][-1].docs_in == 0


def _cli(*args: str) -> str:
    return pipeline("stats", *args, check=True, env={**os.environ, "COLUMNS": "250"}).stdout  # no row wraps


def _table(text: str, title: str) -> list[str]:
    """The body lines of the rich table under `title`."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if title in ln)
    body = []
    for ln in lines[start + 4 :]:  # title, top border, header, rule
        if not ln.startswith("│"):
            break
        body.append(ln)
    return body


def test_stats_cli_leads_with_the_journey_and_stages_prints_every_stage_row(demo_run):
    cfg, run_dir, merged = demo_run
    rows = journey(merged)
    out = _cli(str(run_dir))
    body = _table(out, "the documents' journey")
    assert [ln.split("│")[1].strip() for ln in body] == [r.step for r in rows]
    for ln, r in zip(body, rows):
        assert f" {r.docs_in:,} " in ln and f" {r.docs_out:,} " in ln, ln
    assert not any(p in out for p in PLUMBING) and "--stages" in out
    assert f"{rows[-1].counters['tokens']:,} tokens" in out
    assert "paragraphs removed" in out and "low_language_score" in out

    stages = _cli(str(run_dir), "--stages")
    body = _table(stages, "funnel per stage")
    stage_rows = funnel(merged)
    assert len(body) == len(stage_rows) > len(rows)
    for ln, r in zip(body, stage_rows):
        cells = [c.strip() for c in ln.split("│")[1:-1]]
        assert cells[:4] == [r.stage, r.step, f"{r.docs_in:,}", f"{r.docs_out:,}"], ln
    assert sum(ln.split("│")[2].strip() == "read_parquet" for ln in body) >= 4

    data = json.loads(_cli(str(run_dir), "--json"))
    assert data == json.loads(json.dumps(as_json(merged)))
    assert [r["step"] for r in data["journey"]] == [r.step for r in rows]
    assert len(data["funnel"]) == len(stage_rows)
    assert data["by_language"]["en"]["journey"][0]["docs_in"] == language_journey(merged)["en"][0].docs_in

    en = _cli(str(run_dir), "--language", "en")
    body = _table(en, "funnel of language en")
    assert [ln.split("│")[1].strip() for ln in body] == [r.step for r in rows]
    en_stages = _table(_cli(str(run_dir), "--language", "en", "--stages"), "funnel of language en per stage")
    assert any("read_parquet" in ln for ln in en_stages)


def test_report_chart_shows_the_journey_and_folds_the_stages_in_chromium(demo_run, tmp_path):
    cfg, run_dir, merged = demo_run
    rows = journey(merged)
    report = write(run_dir, tmp_path / "report.html")
    res = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert 'data-ok="1"' in dom
    section = dom[dom.index('<section id="funnel">') :]
    section = section[: section.index("</section>")]
    chart = section[section.index(JOURNEY_CHART) :]
    chart = chart[: chart.index("</svg>")]
    labels = re.findall(r'text-anchor="end"[^>]*>([^<]*)</text>', chart)
    assert labels == [r.step for r in rows]
    assert not any(p in chart for p in (*PLUMBING, "encode", "manifest", "shard_plan"))
    # the journey's table before the fold, every stage's row inside it (closed)
    fold = section.index('<details id="stages">')
    assert all(f'<td class="l">{r.step}</td>' in section[:fold] for r in rows)
    assert "read_parquet" not in section[:fold]
    stages = section[fold : section.index("</details>", fold)]
    assert stages.count("<tr>") == len(funnel(merged)) + 1
    assert " open" not in stages[: stages.index(">")]


def test_notebook_api_journey(demo_run, tmp_path):
    from gristmill import stats

    cfg, run_dir, merged = demo_run
    s = stats.load(run_dir)
    rows = journey(merged)
    assert list(s.journey["step"]) == [r.step for r in rows]
    assert list(s.journey["docs_out"]) == [r.docs_out for r in rows]
    assert list(s.journey["dropped"]) == [r.dropped for r in rows]
    assert s.journey.iloc[-1]["counters"]["tokens"] == rows[-1].counters["tokens"]
    assert len(s.funnel) == len(funnel(merged))  # the per-stage table is still there
    en = s.journey_for("en")
    assert list(en["step"]) == [r.step for r in rows]
    sums = s.journey_by_language.groupby("step", sort=False)[["docs_in", "docs_out", "bytes_out"]].sum()
    assert [tuple(sums.loc[r.step]) for r in rows] == [(r.docs_in, r.docs_out, r.bytes_out) for r in rows]
    svg = s.plot_funnel()._repr_svg_()
    assert svg.startswith("<svg") and "read_parquet" not in svg and rows[-1].step in svg
    with pytest.raises(KeyError, match="xx"):
        s.journey_for("xx")
    copy = tmp_path / "crawl"  # merge_run writes the merged files: on a copy of the shared run
    shutil.copytree(run_dir, copy)
    assert merge_run(copy)["run_dir"] == str(copy)
    assert json.loads((copy / "stats.json").read_text())["stages"] == merged["stages"]


def test_tokenization_as_a_yaml_step_is_its_row_by_step_id(demo_run, tmp_path):
    """Once tokenization is a YAML step (`- tokenize: {...}` last in `steps:`), its phases carry
    its step id, or, if they do not, the config names it: either way one row, the same figures."""
    cfg, run_dir, merged = demo_run
    before = journey(merged)
    step_id = f"{len(cfg.specs):02d}_tokenize"
    if any(s.name == "tokenize" for s in cfg.specs):
        pytest.skip("the demo config tokenizes as a YAML step already: the other tests cover it")
    renamed = json.loads(json.dumps(merged))
    for stage in renamed["stages"]:
        for step in stage["steps"]:
            kind, _, name = step["name"].partition(": ")
            if "TOKENIZER" in kind:
                step["name"] = f"{kind}: {step_id}"
    rows = journey(renamed)
    assert [r.step for r in rows] == [*(r.step for r in before[:-1]), step_id]
    assert rows[-1] == type(rows[-1])(**{**before[-1].__dict__, "step": step_id})
    # phases named as today, the step listed in the run's config
    copy = tmp_path / "crawl"
    copy.mkdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["steps"].append({"tokenize": config.pop("tokenize")})
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    rows = journey({**merged, "run_dir": str(copy)})
    assert rows[-1].step == step_id and rows[-1].counters == before[-1].counters


def test_a_global_step_that_is_no_filter_is_read_off_its_stages(tmp_path, wet_files, lid_model):
    """A global step without a filter phase (`keep_longest`, defined by the planner's tests): its
    documents in are what its stage read, out what it wrote; the journey still chains."""
    from .test_planner import _cfg  # registers keep_longest and mentions_word

    steps = [
        {"langid": {"model": str(lid_model), "languages": None}},
        {"keep_longest": {"share": 0.5}},
        {"mentions_word": {"word": "the"}},
    ]
    merged = run(_cfg(tmp_path, wet_files, lid_model, steps))
    rows = journey(merged)
    assert [(r.step, r.kind, r.stages) for r in rows] == [
        ("read_wet", "read", ["01_curate"]),
        ("00_langid", "filter", ["01_curate"]),
        ("01_keep_longest", "step", ["02_keep_longest"]),
        ("02_mentions_word", "filter", ["03_filter"]),
    ]
    for prev, row in zip(rows, rows[1:]):
        assert (row.docs_in, row.bytes_in) == (prev.docs_out, prev.bytes_out), row.step
    longest = rows[2]
    kept = _output(tmp_path / "run", "02_keep_longest")
    assert (longest.docs_out, longest.bytes_out) == (kept.num_rows, _text_bytes(kept))
    assert longest.docs_out == longest.docs_in // 2 > 0 and not longest.drops
    assert rows[-1].docs_out == _output(tmp_path / "run", "03_filter").num_rows
