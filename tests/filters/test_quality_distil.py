"""`pipeline quality distil`: the fastText `quality` classifier trained on the judged-en
classifier's decisions over the real sample's English pages, and its report recomputed from
the predictions it saves.

The teacher is scored once for the module (`distilled`), on the first 256 tokens of each page
(`--max-tokens`; the command's default is the teacher's 512): half the CPU time, the same code.
Later runs reuse its scores (`--teacher-scores`), in this process (torch imported once)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.filters import fasttext_native, quality_distil
from gristmill.filters.classifier_train import is_heldout
from gristmill.filters.quality import Quality
from gristmill.filters.train_corpus import iter_pages
from tests.cli_process import pipeline

REPO = Path(__file__).resolve().parents[2]
JUDGED = REPO / "configs" / "classifier" / "judged-en.jsonl"
TOKENS = 256
WARC = "cc/warc/CC-MAIN-20200808165417-20200808195417-00395.sample.warc.gz"


def distil(*args, teacher, lid_model, output) -> tuple:
    r = pipeline(
        "quality", "distil", "--teacher", str(teacher), "--lid-model", str(lid_model), "-o", str(output),
        "--max-tokens", TOKENS, *map(str, args),
    )  # fmt: skip
    return r, output


def last_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, judged_classifier, lid_model, wet_files, shared_data):
    """The command on both WET files and the WARC file: (model, report, predictions)."""
    out = tmp_path_factory.mktemp("distil") / "a" / "en.bin"
    r, _ = distil(
        "--documents", *wet_files, shared_data / WARC, "--judgments", JUDGED,
        teacher=judged_classifier, lid_model=lid_model, output=out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(Path(f"{out}.report.json").read_text())
    predictions = pq.read_table(f"{out}.predictions.parquet").to_pylist()
    print(Path(f"{out}.report.txt").read_text())
    return out, report, predictions


def test_the_quality_step_loads_the_student_and_scores_as_the_report_says(distilled, wet_files, shared_data):
    model, report, predictions = distilled
    assert sorted(fasttext_native.Predictor(model).labels) == ["__label__hq", "__label__lq"]
    pages = {p.id: p for p in iter_pages([*wet_files, shared_data / WARC])}
    held = [row for row in predictions if row["split"] == "heldout"]
    docs = [Document(text=pages[row["id"]].text, id=row["id"]) for row in held]
    step = Quality(model=str(model), min_score=report["threshold"])  # the step's defaults: label __label__hq
    kept = {d.id: d.metadata["quality_score"] for d in step.run(iter(docs))}
    expected = {row["id"]: row["student_score"] for row in held if row["student_keep"]}
    assert kept.keys() == expected.keys() and 0 < len(kept) < len(held)
    assert [kept[i] for i in expected] == pytest.approx([expected[i] for i in expected], abs=1e-6)


def _agreement(truth: list[bool], pred: list[bool]) -> dict:
    t, p = np.array(truth), np.array(pred)
    tp, fp, fn, tn = (int(x) for x in ((t & p).sum(), (~t & p).sum(), (t & ~p).sum(), (~t & ~p).sum()))
    n = len(t)
    observed = (tp + tn) / n
    chance = ((tp + fn) * (tp + fp) + (tn + fp) * (tn + fn)) / n**2
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return {
        "accuracy": observed,
        "kappa": (observed - chance) / (1 - chance),
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall),
        "confusion": [[tn, fp], [fn, tp]],
    }


def _check(reported: dict, truth: list[bool], pred: list[bool]) -> None:
    want = _agreement(truth, pred)
    assert reported["documents"] == len(truth)
    assert reported["confusion"] == want["confusion"]
    for k in ("accuracy", "kappa"):
        assert reported[k] == pytest.approx(want[k], abs=1e-12)
    for k in ("precision", "recall", "f1"):
        assert reported["keep"][k] == pytest.approx(want[k], abs=1e-12)


def test_agreement_figures_are_those_of_the_saved_predictions(distilled):
    _, report, predictions = distilled
    held = [r for r in predictions if r["split"] == "heldout"]
    assert len(held) == report["split"]["heldout"]["documents"] > 50
    assert all(r["teacher_keep"] == (r["teacher_score"] >= 0.5) for r in predictions)
    assert all(r["student_keep"] == (r["student_score"] >= 0.5) for r in predictions)
    labels = report["teacher_labels"]
    assert labels["keep"] == sum(r["teacher_keep"] for r in predictions) > 20
    assert labels["drop"] == sum(not r["teacher_keep"] for r in predictions) > 20
    _check(report["agreement"]["heldout"], [r["teacher_keep"] for r in held], [r["student_keep"] for r in held])
    a = report["agreement"]["heldout"]
    print(f"held out: accuracy {a['accuracy']:.3f}, kappa {a['kappa']:.3f}, keep F1 {a['keep']['f1']:.3f}")
    assert a["accuracy"] > 0.6  # far from chance: the student learnt the teacher's decisions

    judged = {}
    for line in JUDGED.read_text().splitlines():
        row = json.loads(line)
        judged[row["id"]] = row["label"] == "keep"
    covered = [r for r in held if r["id"] in judged]
    j = report["judgments"]
    assert j["heldout_judged"] == len(covered) > 50
    assert all(r["judgment"] == ("keep" if judged[r["id"]] else "drop") for r in covered)
    truth = [judged[r["id"]] for r in covered]
    _check(j["teacher"], truth, [r["teacher_keep"] for r in covered])
    _check(j["student"], truth, [r["student_keep"] for r in covered])


def test_heldout_hosts_are_not_training_hosts(distilled, judged_classifier):
    _, report, predictions = distilled
    hosts = {
        side: {urlsplit(r["url"]).hostname for r in predictions if r["split"] == side} for side in ("train", "heldout")
    }
    assert hosts["train"] and hosts["heldout"] and not hosts["train"] & hosts["heldout"]
    assert len(hosts["heldout"]) == report["split"]["heldout"]["hosts"]
    # the split train-classifier made of the judgments at the same fraction and seed: the
    # held-out pages are pages the teacher never trained on
    teacher = json.loads((judged_classifier / "report.json").read_text())
    assert (report["split"]["fraction"], report["split"]["seed"]) == (teacher["heldout_fraction"], 0)
    assert report["judgments"]["teacher_trained_on"] == 0
    assert all(is_heldout(h, 0.25, 0) for h in hosts["heldout"])


def test_the_pool_is_english_deduplicated_and_reads_the_warc(distilled, shared_data):
    _, report, predictions = distilled
    warc = list(iter_pages([shared_data / WARC]))
    assert len(warc) == 16 and all(p.id.startswith("<urn:uuid:") and p.url for p in warc)
    ids = [r["id"] for r in predictions]
    assert len(ids) == len(set(ids)) == report["pool"]["documents"]
    assert {p.id for p in warc} & set(ids)  # an English page of the WARC, its text extracted from HTML
    pool = report["pool"]
    assert pool["read"] == 609 + 16
    assert pool["other_language"] > 50 and pool["too_short"] > 0
    assert pool["documents"] == pool["read"] - pool["too_short"] - pool["other_language"] - pool["duplicates"]


def test_same_seed_same_model(distilled, judged_classifier, lid_model, tmp_path):
    model, report, _ = distilled
    common = dict(teacher_scores=f"{model}.predictions.parquet", lid_model=lid_model, max_tokens=TOKENS, log=print)
    rep = quality_distil.distil(judged_classifier, report["documents"], tmp_path / "b" / "en.bin", **common)
    again = tmp_path / "b" / "en.bin"
    assert again.read_bytes() == model.read_bytes()  # one fastText thread: the same bytes
    assert rep["throughput"]["teacher"]["documents"] == 0 and rep["teacher"]["scores_reused_from"]
    assert rep["agreement"] == report["agreement"] and rep["split"] == report["split"]
    other = quality_distil.distil(judged_classifier, report["documents"], tmp_path / "c.bin", seed=1, **common)
    assert (tmp_path / "c.bin").read_bytes() != model.read_bytes()
    assert other["split"] != report["split"]


def test_a_missing_or_corrupt_teacher_is_refused_before_any_document(tmp_path, judged_classifier, lid_model):
    nothing = tmp_path / "no-such.warc.wet.gz"  # were documents read first, this would be the error
    r, out = distil("--documents", nothing, teacher=tmp_path / "none", lid_model=lid_model, output=tmp_path / "o.bin")
    assert r.returncode == 2 and last_line(r).startswith("error: classifier model directory not found"), r.stderr
    broken = tmp_path / "broken"
    shutil.copytree(judged_classifier, broken, copy_function=lambda s, d: shutil.copy2(s, d))
    head = broken / "head.safetensors"
    head.write_bytes(head.read_bytes()[:-16])
    r, out = distil("--documents", nothing, teacher=broken, lid_model=lid_model, output=tmp_path / "o.bin")
    assert r.returncode == 2 and "truncated safetensors file" in last_line(r), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("o.bin*"))


def test_a_teacher_of_one_label_is_refused_naming_the_counts(distilled, judged_classifier, lid_model, tmp_path):
    model, report, _ = distilled
    out = tmp_path / "q" / "en.bin"
    n = report["pool"]["documents"]
    with pytest.raises(ValueError) as e:
        quality_distil.distil(
            judged_classifier, report["documents"], out, lid_model=lid_model, max_tokens=TOKENS,
            teacher_scores=f"{model}.predictions.parquet", teacher_threshold=1.01, log=lambda *a: None,
        )  # fmt: skip
    assert f"the teacher labels all {n} documents drop (keep 0, drop {n} at score >= 1.01)" in str(e.value)
    assert "\n" not in str(e.value) and not out.parent.exists()  # nothing half-written


def test_no_english_documents(tmp_path, judged_classifier, lid_model, shared_data):
    """A run's output Parquet whose `language` column says no page is English."""
    pages = [p for p in iter_pages([shared_data / WARC]) if len(p.text.split()) >= 20]
    labels, _ = fasttext_native.Predictor(lid_model).predict_top([p.text.replace("\n", " ") for p in pages])
    rows = [(p, label.removeprefix("__label__")) for p, label in zip(pages, labels) if label != "__label__en"]
    table = pa.table({k: [getattr(p, k) for p, _ in rows] for k in ("text", "id", "url")})
    pq.write_table(table.append_column("language", pa.array([lang for _, lang in rows])), tmp_path / "00000.parquet")
    out = tmp_path / "m.bin"
    with pytest.raises(ValueError) as e:
        quality_distil.distil(judged_classifier, [tmp_path], out, lid_model=lid_model, log=lambda *a: None)
    assert f"no documents in language 'en' of >= 20 words among {len(rows)} read" in str(e.value)
    assert "languages found: zh" in str(e.value) and "\n" not in str(e.value) and not out.exists()


def test_an_output_folder_that_cannot_be_written(tmp_path, judged_classifier, lid_model):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the output's folder would be\n")
    nothing = tmp_path / "no-such.warc.wet.gz"
    r, _ = distil("--documents", nothing, teacher=judged_classifier, lid_model=lid_model, output=blocker / "en.bin")
    assert r.returncode == 2 and last_line(r).startswith(f"error: --output {blocker / 'en.bin'}: cannot write in")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_cohen_kappa():
    # 50 pages, two raters: 35 agree; chance agreement (25*30 + 25*20) / 50^2 = 0.5
    assert quality_distil.cohen_kappa([[20, 5], [10, 15]]) == pytest.approx(0.4)
    assert quality_distil.cohen_kappa([[30, 0], [0, 20]]) == 1.0
    assert quality_distil.cohen_kappa([[7, 0], [0, 0]]) is None  # one label on both sides: undefined
    assert quality_distil.agreement(np.array([], bool), np.array([], bool))["accuracy"] is None


def test_a_runs_parquet_output_gives_the_same_pool(distilled, tmp_path, wet_files, lid_model, shared_data):
    """The pool read from Parquet files laid out as a run's output (`output/<language>/`), whose
    `language` column is taken as it is, is the pool read from the WET files."""
    _, report, predictions = distilled
    in_pool = {r["id"] for r in predictions}
    pages = list(iter_pages(wet_files))
    for lang, part in (
        ("en", [p for p in pages if p.id in in_pool]),
        ("fr", [p for p in pages if p.id not in in_pool]),
    ):
        (tmp_path / "output" / lang).mkdir(parents=True)
        columns = {k: [getattr(p, k) for p in part] for k in ("text", "id", "url")}
        pq.write_table(
            pa.table({**columns, "language": [lang] * len(part)}), tmp_path / "output" / lang / "00000.parquet"
        )
    pool, counts = quality_distil.read_pool([tmp_path / "output"], "en", lid_model, 0.65, 20, None, log=print)
    warc = {p.id for p in iter_pages([shared_data / WARC])}
    wet_pool = [r["id"] for r in predictions if r["id"] not in warc]
    assert [p.id for p in pool] == wet_pool
    assert counts["language_from"] == {"metadata": len(wet_pool), "langid": 0}
