"""The `quality` step and `pipeline quality train`, on the classifier `make models` trains
(WikiText-2 paragraphs vs the crawl sample)."""

from __future__ import annotations

import json
import pickle
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.filters.langid import ModelError
from gristmill.filters.quality import Quality
from gristmill.filters.quality_train import binary_metrics, roc_auc
from gristmill.filters.train_corpus import is_heldout, iter_documents
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline


def _docs(texts):
    return [Document(text=t, id=str(i)) for i, t in enumerate(texts)]


def _brute_auc(pos, neg) -> float:
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_roc_auc_against_pairwise_definition():
    rng = np.random.default_rng(0)
    for _ in range(20):
        pos = rng.integers(0, 8, rng.integers(1, 40)) / 8  # coarse scores: many ties
        neg = rng.integers(0, 8, rng.integers(1, 40)) / 8 - 0.1
        assert roc_auc(pos, neg) == pytest.approx(_brute_auc(pos, neg), abs=1e-12)
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert roc_auc([0.1], [0.9]) == 0.0
    assert roc_auc([0.5, 0.5], [0.5]) == 0.5
    m = binary_metrics(np.array([0.9, 0.6, 0.2]), np.array([0.7, 0.1]), 0.5)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 1, 1)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)


@pytest.fixture(scope="module")
def report(quality_model) -> dict:
    return json.loads(Path(f"{quality_model}.report.json").read_text())


def test_heldout_auc_wikitext_vs_crawl(quality_model, report, shared_data, wet_files):
    """Recomputed here on every document the classifier never trained on (the hash split's held-out part)."""
    m = report["metrics"]
    print(
        f"\nreport: held-out ROC AUC {m['roc_auc']:.4f}, P {m['precision']:.3f} R {m['recall']:.3f} "
        f"F1 {m['f1']:.3f} ({report['heldout']['positives']} hq, {report['heldout']['negatives']} lq)"
    )
    assert m["roc_auc"] > 0.9 and m["f1"] > 0.8
    frac, seed, min_words = report["heldout"]["fraction"], report["params"]["seed"], report["min_words"]
    wiki = [shared_data / "corpus" / "en" / f"wikitext-2.{s}.txt" for s in ("valid", "test")]
    pos = [t for t in iter_documents(wiki, "wikitext") if len(t.split()) >= min_words and is_heldout(t, frac, seed)]
    neg = [t for t in iter_documents(wet_files) if len(t.split()) >= min_words and is_heldout(t, frac, seed)]
    step = Quality(model=str(quality_model), min_score=0.0)

    def score(texts):
        return np.array([d.metadata["quality_score"] for d in step.run(iter(_docs(texts)))])

    auc = roc_auc(score(pos), score(neg))
    print(f"recomputed on all held-out texts: AUC {auc:.4f} ({len(pos)} WikiText paragraphs, {len(neg)} crawl docs)")
    assert auc > 0.9


def test_min_score_drops_and_counts(quality_model, wet_files):
    texts = [t for t in iter_documents(wet_files[:1])][:300]
    import fasttext  # the reference: fastText's own predictions, which the step's must equal

    model = fasttext.FastText._FastText(model_path=str(quality_model))
    labels, probs = model.predict([t.replace("\n", " ") for t in texts], k=-1)
    expected = np.array([dict(zip(l, p))["__label__hq"] for l, p in zip(labels, probs)], dtype=np.float32)
    limit = float(np.median(expected))
    step = Quality(model=str(quality_model), min_score=limit)
    kept = list(step.run(iter(_docs(texts))))
    assert [d.metadata["quality_score"] for d in kept] == [float(s) for s in expected if s >= limit]
    assert step.stats["dropped_low_quality_score"].total == int((expected < limit).sum()) > 50
    assert step.stats["forwarded"].total == len(kept)


def test_missing_or_corrupt_model_and_wrong_label(tmp_path, quality_model, wet_files):
    bad = tmp_path / "q.bin"
    bad.write_bytes(b"garbage" * 10)
    with pytest.raises(ModelError, match="not found"):
        Quality(model=str(tmp_path / "none.bin"))
    with pytest.raises(ModelError, match="not a fastText model"):
        Quality(model=str(bad))
    with pytest.raises(ModelError, match=r"no label '__label__positive'.*__label__hq"):
        Quality(model=str(quality_model), label="__label__positive")  # when planned, not in a task
    cfg = {
        "run_dir": str(tmp_path / "r"),
        "input": {"paths": [str(wet_files[1])]},
        "steps": [{"quality": {"model": str(bad)}}],
    }
    with pytest.raises(ModelError):
        run(from_dict(cfg))
    assert not (tmp_path / "r").exists()


def test_step_pickles_without_its_model(quality_model):
    step = Quality(model=str(quality_model), min_score=0.0)
    list(step.run(iter(_docs(["text"]))))
    clone = pickle.loads(pickle.dumps(step))
    assert clone._model is None and step._model is not None


def _train(tmp_path: Path, name: str, pos: Path, neg: Path, seed: int = 0) -> tuple[bytes, dict]:
    out = tmp_path / name / "q.bin"
    res = pipeline(
        "quality",
        "train",
        "--positives",
        str(pos),
        "--negatives",
        str(neg),
        "--detokenize",
        "wikitext",
        "-o",
        str(out),
        "--max-per-class",
        "150",
        "--epoch",
        "5",
        "--seed",
        str(seed),
    )
    assert res.returncode == 0, res.stderr
    return out.read_bytes(), json.loads(Path(f"{out}.report.json").read_text())


def test_training_is_deterministic(tmp_path, shared_data, wet_files):
    lines = (shared_data / "corpus" / "en" / "wikitext-2.test.txt").read_text().splitlines()[:1500]
    pos = tmp_path / "wiki.txt"
    pos.write_text("\n".join(lines) + "\n")
    a, rep_a = _train(tmp_path, "a", pos, wet_files[0])
    b, rep_b = _train(tmp_path, "b", pos, wet_files[0])
    assert a == b  # same seed, one thread: the same model, byte for byte
    assert rep_a["metrics"] == rep_b["metrics"] and rep_a["histogram"] == rep_b["histogram"]
    assert rep_a["per_class"] == 150 and rep_a["params"]["thread"] == 1
    c, _ = _train(tmp_path, "c", pos, wet_files[0], seed=1)
    assert c != a  # the seed matters (sample, split, order and fastText's init)
    txt = (tmp_path / "a" / "q.bin.report.txt").read_text()
    assert "ROC AUC" in txt and "0.9-1.0" in txt
