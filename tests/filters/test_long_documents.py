"""Pages of megabytes through the model filters: KenLM scores them a line at a time with the
scores of the whole text; langid and quality predict on a sample of windows of those longer than
`max_chars`, counted in stats, and on the whole text below it."""

from __future__ import annotations

import pytest
from datatrove.data import Document

from gristmill.filters import ccnet_normalize
from gristmill.filters.kenlm import KenLM, score_lines
from gristmill.filters.langid import LangId, sample_text
from gristmill.filters.quality import Quality
from gristmill.input.wet import WetRecord, iter_wet_records


@pytest.fixture(scope="module")
def pages(wet_files) -> list[str]:
    return [r.text for f in wet_files for r in iter_wet_records(f) if isinstance(r, WetRecord)]


def test_kenlm_scores_a_long_page_line_by_line_as_a_whole(kenlm_model, pages, monkeypatch):
    model = KenLM(models={"en": str(kenlm_model)}).models["en"]
    text = "\n".join(pages[:200])
    whole = score_lines(model, text)
    monkeypatch.setattr(ccnet_normalize, "CHUNK_CHARS", 1000)
    assert score_lines(model, text) == whole and len(whole) > 1000


def test_sample_text_keeps_short_texts_and_spreads_windows_over_long_ones():
    assert sample_text("short text", 1000) == "short text"
    text = " ".join(f"w{i:07d}" for i in range(100_000))  # 900,000 characters
    sample = sample_text(text, 8000)
    assert len(sample) <= 8000
    words = sample.split()
    assert all(len(w) == 8 and w[0] == "w" for w in words)  # no word cut at a window's edge
    assert words[0] == "w0000000" and words[-1] == "w0099999"  # from the start to the end
    assert 700 < len(words) < 890  # eight windows of ~1,000 characters


def test_langid_predicts_on_windows_of_a_long_page(lid_model, pages):
    english = "\n".join(p for p in pages if p.isascii())[:300_000]
    long = Document(text=english * 4, id="long")
    step = LangId(model=str(lid_model), languages=["en"], min_score=0.5, max_chars=100_000)
    assert step.filter_batch([long]) == [True] and long.metadata["language"] == "en"
    # what it predicted on: the sample, not the 1.2M characters
    labels, scores = step.model.predict_top([sample_text(long.text, 100_000)])
    assert labels[0] == "__label__en" and scores[0] == long.metadata["language_score"]
    assert step.stats["long_text_sampled"].total == 1
    # below max_chars: the whole text, as before
    short = Document(text=english[:50_000], id="short")
    step.filter_batch([short])
    whole = LangId(model=str(lid_model), languages=["en"], min_score=0.5)
    whole.filter_batch([d := Document(text=short.text, id="s2")])
    assert short.metadata == d.metadata and step.stats["long_text_sampled"].total == 1


def test_quality_scores_windows_of_a_long_page(quality_model, pages):
    text = "\n".join(pages)
    step = Quality(model=str(quality_model), min_score=0.0, max_chars=50_000)
    docs = [Document(text=text, id="long"), Document(text=pages[0], id="short")]
    assert step.filter_batch(docs) == [True, True]
    assert 0.0 <= docs[0].metadata["quality_score"] <= 1.0
    assert step.stats["long_text_sampled"].total == 1
