"""Dedup counts words as the filters do: ICU's words on pages labelled zh/ja/th/lo/km/my (near
dedup's shingles, exact dedup's min_doc_words); every other page, English included, as before."""

from __future__ import annotations

import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.core.documents import schema_for
from gristmill.dedup.text import normalize, shingles, words
from gristmill.pipeline.planning.on_parquet import run_on_parquet
from gristmill.text.words import split_words


@pytest.fixture(scope="module")
def udhr(shared_data) -> dict[str, str]:
    with zipfile.ZipFile(shared_data / "corpus" / "multi" / "udhr2.zip") as z:
        return {
            lang: z.read(f"udhr2/{code}.txt").decode("utf-8")
            for lang, code in {"zh": "cmn_hans", "ja": "jpn", "th": "tha", "en": "eng", "fa": "pes_1"}.items()
        }


def test_words_of_an_unspaced_language_are_icu_words_of_the_normalised_text(udhr):
    for lang in ("zh", "ja", "th"):
        text = udhr[lang]
        got = words(text, lang)
        assert got == split_words(normalize(text), lang)
        assert len(got) < 0.8 * len(words(text))  # per character before: many more, shorter "words"
        icu, per_char = set(shingles(text, 5, lang)), set(shingles(text, 5))
        assert len(icu & per_char) < 0.1 * len(icu)  # only runs of five one-character words agree


def test_words_of_other_languages_do_not_change(udhr, dedup_corpus):
    texts = pq.read_table(dedup_corpus / "docs", columns=["text"]).column("text").to_pylist()[:500]
    for t in [*texts, udhr["en"], udhr["fa"]]:
        for lang in ("en", "fa", None):
            assert words(t, lang) == words(t) == split_words(normalize(t))


def _write(folder, rows):
    folder.mkdir(parents=True)
    schema = schema_for({"language": pa.string()})
    cols = {f.name: [None] * len(rows) for f in schema}
    cols.update(
        id=[r[0] for r in rows],
        text=[r[1] for r in rows],
        language=[r[2] for r in rows],
        source=["s"] * len(rows),
        offset=list(range(len(rows))),
    )
    pq.write_table(pa.table(cols, schema=schema), folder / "00000.parquet")


def test_exact_dedup_min_doc_words_counts_chinese_words(udhr, tmp_path):
    # a Chinese line of about 60 characters is about 35 ICU words: under 50 words, it goes
    line, other = [x.strip() for x in udhr["zh"].splitlines() if 55 <= len(x.strip()) <= 70][:2]
    for text in (line, other):
        assert len(split_words(text, "zh")) < 50 <= len(split_words(text))
    shared = "这是一个在很多页面上重复出现的共享样板文字行"
    rows = [("a", f"{shared}\n第一页", "zh"), ("b", f"{shared}\n{line}", "zh"), ("c", f"{shared}\n{other}", None)]
    _write(tmp_path / "in", rows)
    st = run_on_parquet(
        "exact_dedup",
        {"granularity": "paragraph", "capacity": 1000, "min_doc_words": 50},
        tmp_path / "in",
        tmp_path / "r",
        tasks=1,
    )
    kept = dict(zip(*pq.read_table(st[-1].output, columns=["id", "text"]).to_pydict().values()))
    # b: its line is < 50 words once the shared line goes; c (no label) is counted per character
    assert kept == {"a": rows[0][1], "c": other}
