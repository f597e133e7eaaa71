"""The `kenlm` step and `pipeline kenlm train`, on the model `make models` trains from WikiText-2."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.filters.ccnet_normalize import normalize
from gristmill.filters.kenlm import KenLM, stats_path
from gristmill.filters.kenlm_train import ToolMissing, find_tool
from gristmill.filters.langid import LangId, ModelError
from gristmill.filters.train_corpus import is_heldout, iter_documents
from gristmill.input.wet import WetRecord, iter_wet_records
from gristmill.pipeline.report.journey import funnel
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline


def _docs(texts, language="en"):
    return [
        Document(text=t, id=str(i), metadata={"language": language} if language else {}) for i, t in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def crawl_en(wet_files, lid_model) -> list[str]:
    """The crawl sample's English documents, as langid (lid.176, score >= 0.65) finds them."""
    docs = [
        Document(text=r.text, id=r.record_id)
        for f in wet_files
        for r in iter_wet_records(f)
        if isinstance(r, WetRecord)
    ]
    kept = list(LangId(model=str(lid_model), languages=["en"], min_score=0.65).run(iter(docs)))
    assert len(kept) > 300
    return [d.text for d in kept]


@pytest.fixture(scope="module")
def heldout_wiki(kenlm_model, shared_data) -> list[str]:
    """WikiText paragraphs the model never saw: the training split is a pure function of the text."""
    stats = json.loads(stats_path(kenlm_model).read_text())
    assert stats["detokenize"] == "wikitext"
    files = [shared_data / "corpus" / "en" / f"wikitext-2.{s}.txt" for s in ("valid", "test")]
    held = [t for t in iter_documents(files, "wikitext") if is_heldout(t, stats["heldout_fraction"], stats["seed"])]
    assert len(held) == stats["heldout"]["documents"]
    return held


def _perplexities(model_path, texts) -> np.ndarray:
    step = KenLM(models={"en": str(model_path)})
    out = [d.metadata["perplexity"] for d in step.run(iter(_docs(texts)))]
    return np.array(out)


def test_wikitext_is_far_less_perplexing_than_the_crawl(kenlm_model, heldout_wiki, crawl_en):
    wiki = np.median(_perplexities(kenlm_model, heldout_wiki))
    crawl = np.median(_perplexities(kenlm_model, crawl_en))
    ratio = crawl / wiki
    print(
        f"\nmedian perplexity: held-out WikiText {wiki:.0f} ({len(heldout_wiki)} paragraphs), "
        f"crawl English {crawl:.0f} ({len(crawl_en)} documents), ratio {ratio:.1f}"
    )
    assert ratio > 3
    # the sidecar's held-out median is the same measurement, made by training
    stats = json.loads(stats_path(kenlm_model).read_text())
    assert stats["heldout"]["percentiles"]["50"] == pytest.approx(wiki, rel=1e-9)


def test_document_perplexity_equals_kenlm_on_normalised_text(kenlm_model, crawl_en):
    import kenlm

    model = kenlm.Model(str(kenlm_model))
    texts = crawl_en[:150] + ["A single line, with Ünïcode “quotes” and 2024 digits."]
    docs = list(KenLM(models={"en": str(kenlm_model)}).run(iter(_docs(texts))))
    assert len(docs) == len(texts)
    for text, doc in zip(texts, docs):
        log10, tokens = 0.0, 0
        for raw in text.split("\n"):
            line = normalize(raw)
            if line:
                log10 += model.score(line, bos=True, eos=True)
                tokens += len(line.split()) + 1
        assert doc.metadata["perplexity"] == 10 ** (-log10 / tokens)
    # a one-line document: kenlm's own sentence perplexity
    one = normalize(texts[-1])
    assert one == 'a single line, with unicode "quotes" and 0000 digits.'
    assert docs[-1].metadata["perplexity"] == pytest.approx(model.perplexity(one), rel=1e-12)


def test_max_perplexity_and_buckets_drop_and_count(kenlm_model, crawl_en):
    texts = crawl_en[:200]
    pps = _perplexities(kenlm_model, texts)
    limit = float(np.median(pps))
    step = KenLM(models={"en": str(kenlm_model)}, max_perplexity=limit)
    kept = list(step.run(iter(_docs(texts))))
    assert [d.metadata["perplexity"] for d in kept] == [p for p in pps if p <= limit]
    assert step.stats["dropped_perplexity_above_max"].total == int((pps > limit).sum()) > 50
    assert step.stats["forwarded"].total == len(kept)

    head, middle = float(np.percentile(pps, 30)), float(np.percentile(pps, 60))
    step = KenLM(models={"en": str(kenlm_model)}, keep_buckets=["head", "middle"], cutoffs={"en": [head, middle]})
    kept = list(step.run(iter(_docs(texts))))
    expect_tail = int((pps >= middle).sum())
    assert step.stats["dropped_perplexity_bucket_tail"].total == expect_tail == step.stats["bucket_tail"].total
    assert step.stats["bucket_head"].total == int((pps < head).sum())
    assert {d.metadata["perplexity_bucket"] for d in kept} == {"head", "middle"}
    assert len(kept) == len(texts) - expect_tail


def test_sidecar_cutoffs_and_buckets(kenlm_model, heldout_wiki):
    stats = json.loads(stats_path(kenlm_model).read_text())
    c = stats["cutoffs"]
    assert c["sample"] == "heldout" and c["head"] < c["middle"]
    assert c["head"] == pytest.approx(stats["heldout"]["percentiles"]["30"])
    step = KenLM(models={"en": str(kenlm_model)}, keep_buckets=["head"])
    assert step.cutoffs["en"] == (c["head"], c["middle"])
    kept = list(step.run(iter(_docs(heldout_wiki))))
    assert abs(len(kept) / len(heldout_wiki) - 0.30) < 0.02  # the head is 30% of the held-out part


def test_languages_without_model_pass_and_are_counted(kenlm_model):
    docs = _docs(["Ein deutscher Text über nichts."], "de") + _docs(["An English text about nothing."], None)
    step = KenLM(models={"en": str(kenlm_model)}, max_perplexity=1.0)  # would drop every English document
    kept = list(step.run(iter(docs)))
    assert [d.text for d in kept] == [d.text for d in docs]  # neither is scored: no model, no language
    assert step.stats["no_model_de"].total == 1 and step.stats["no_model_unknown"].total == 1
    assert not any("perplexity" in d.metadata for d in kept)
    step = KenLM(models={"en": str(kenlm_model)}, default_language="en", max_perplexity=1.0)
    assert list(step.run(iter(docs[1:]))) == []  # default_language applies to documents without one
    assert step.stats["dropped_perplexity_above_max"].total == 1


def test_missing_or_corrupt_model_fails_at_construction(tmp_path, kenlm_model):
    bad = tmp_path / "en.bin"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(ModelError, match="not found"):
        KenLM(models={"en": str(tmp_path / "none.bin")})
    with pytest.raises(ModelError, match="not a KenLM model"):
        KenLM(models={"en": str(bad)})
    truncated = tmp_path / "trunc.bin"
    truncated.write_bytes(kenlm_model.read_bytes()[:5000])  # header intact, body cut
    with pytest.raises(ModelError, match=r"trunc.bin: truncated or corrupt KenLM binary"):
        KenLM(models={"en": str(truncated)}, default_language="en")
    copy = tmp_path / "nostats.bin"
    copy.write_bytes(kenlm_model.read_bytes())
    with pytest.raises(ModelError, match=r"keep_buckets needs bucket cut-offs for 'en'.*stats.json"):
        KenLM(models={"en": str(copy)}, keep_buckets=["head"])


def test_bad_model_in_a_run_fails_before_reading(tmp_path, wet_files):
    cfg = {
        "run_dir": str(tmp_path / "r"),
        "input": {"paths": [str(wet_files[1])]},
        "steps": [{"kenlm": {"models": {"en": str(tmp_path / "missing.bin")}}}],
    }
    with pytest.raises(ModelError, match="KenLM model not found"):
        run(from_dict(cfg))
    assert not (tmp_path / "r").exists()


def test_step_pickles_without_its_model(kenlm_model):
    step = KenLM(models={"en": str(kenlm_model)}, default_language="en")
    list(step.run(iter(_docs(["Some text."]))))
    assert step._model is not None
    clone = pickle.loads(pickle.dumps(step))
    assert clone._model is None
    assert next(clone.run(iter(_docs(["Some text."])))).metadata["perplexity"] > 1


def test_run_writes_perplexity_columns(tmp_path, wet_files, lid_model, kenlm_model):
    cfg = {
        "run_dir": str(tmp_path / "r"),
        "executor": {"tasks": 1, "workers": 1},
        "input": {"paths": [str(wet_files[1])]},
        "steps": [
            {"langid": {"model": str(lid_model), "languages": None}},
            {"kenlm": {"models": {"en": str(kenlm_model)}, "keep_buckets": ["head", "middle", "tail"]}},
        ],
    }
    merged = run(from_dict(cfg))
    table = pq.read_table(tmp_path / "r" / "01_curate" / "output").to_pylist()
    en = [r for r in table if r["language"] == "en"]
    assert en and all(r["perplexity"] > 1 and r["perplexity_bucket"] in ("head", "middle", "tail") for r in en)
    assert all(r["perplexity"] is None for r in table if r["language"] != "en")
    row = {r.step: r for r in funnel(merged)}["01_kenlm"]
    assert row.docs_in == row.docs_out == len(table)


def test_missing_training_tool_says_how_to_build_it():
    with pytest.raises(ToolMissing, match="make kenlm-bin"):
        find_tool("lmplz-not-installed")


def test_train_command_tiny_model(tmp_path, shared_data, kenlm_tools):
    src = (shared_data / "corpus" / "en" / "wikitext-2.valid.txt").read_text().splitlines()[:600]
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("\n".join(src) + "\n")
    out = tmp_path / "m" / "en.bin"
    res = pipeline(
        "kenlm",
        "train",
        str(corpus),
        "-o",
        str(out),
        "--order",
        "3",
        "--detokenize",
        "wikitext",
        "--heldout",
        "0.2",
        "-S",
        "100M",
    )
    assert res.returncode == 0, res.stderr
    stats = json.loads(stats_path(out).read_text())
    assert stats["order"] == 3 and stats["train"]["tokens"] > 10_000
    assert 0 < stats["cutoffs"]["head"] <= stats["cutoffs"]["middle"]
    assert out.read_bytes().startswith(b"mmap lm http://kheafield.com/code")
    assert "Held-out document perplexity" in Path(f"{out}.report.md").read_text()
    assert not [p for p in out.parent.iterdir() if p.name.startswith("kenlm-train-")]  # temp files removed
    # the model scores: held-out paragraphs of this tiny corpus get finite perplexities
    held = [t for t in iter_documents([corpus], "wikitext") if is_heldout(t, 0.2)]
    pps = _perplexities(out, held)
    assert np.isfinite(pps).all() and np.median(pps) == pytest.approx(stats["heldout"]["percentiles"]["50"])
