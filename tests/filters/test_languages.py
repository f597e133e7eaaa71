"""The heuristic filters on pages of other languages: rules that hold for the page's script
(stop words of its language, its sentence-final punctuation), English decisions unchanged."""

from __future__ import annotations

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters.gopher_quality_filter import STOP_WORDS

from gristmill.filters.gopher_quality import GopherQuality, language_stop_words
from gristmill.filters.langid import LangId
from gristmill.input.wet import WetReader
from gristmill.text.words import split_words


@pytest.fixture(scope="module")
def labelled(wet_files, lid_model) -> list[tuple[str, str, dict]]:
    lid = LangId(model=str(lid_model), languages=None, min_score=0.0)
    return [(d.text, d.id, dict(d.metadata)) for d in lid.run(WetReader([str(p) for p in wet_files]).run())]


def pages(labelled, *languages, min_score=0.65):
    return [
        Document(text=t, id=i, metadata=dict(m))
        for t, i, m in labelled
        if m["language"] in languages and m["language_score"] >= min_score
    ]


def copies(docs):
    return [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs]


# --- stop words ---


def test_persian_pages_meet_the_stop_word_rule_with_persian_stop_words(labelled):
    fa = pages(labelled, "fa")
    english_list = GopherQuality(stop_words=sorted(STOP_WORDS))  # what every page got before
    before = english_list.filter_batch(copies(fa))
    after = GopherQuality().filter_batch(copies(fa))
    dropped_on_english = [i for i, r in enumerate(before) if r == (False, "gopher_enough_stop_words")]
    assert len(dropped_on_english) >= 3  # Persian has none of "the", "and", "to", "of", "that", ...
    assert all(after[i] != (False, "gopher_enough_stop_words") for i in dropped_on_english)
    fa_words = language_stop_words("fa")
    for i in dropped_on_english:
        present = fa_words & set(split_words(fa[i].text, "fa"))
        assert len(present) >= 2 and not present & set(STOP_WORDS), present


def test_english_keeps_datatroves_stop_words_and_decisions(labelled):
    assert language_stop_words("en") == language_stop_words(None) == frozenset(STOP_WORDS)
    en = pages(labelled, "en")
    given = GopherQuality(stop_words=sorted(STOP_WORDS))
    assert GopherQuality().filter_batch(copies(en)) == given.filter_batch(copies(en))


def test_a_language_without_a_list_skips_the_stop_word_rule(labelled):
    assert language_stop_words("sr") is None  # Serbian: no stopwords-iso list
    en = pages(labelled, "en")
    no_stop_words = [d for d in en if GopherQuality().filter_batch([d])[0] == (False, "gopher_enough_stop_words")]
    assert no_stop_words
    for d in no_stop_words:
        d.metadata["language"] = "sr"
        assert GopherQuality().filter_batch([d])[0] != (False, "gopher_enough_stop_words")
        # an explicit list applies to every language, as before
        assert GopherQuality(stop_words=sorted(STOP_WORDS)).filter_batch([d])[0] == (False, "gopher_enough_stop_words")


def test_stop_word_lists_hold_only_entries_that_can_match_a_word():
    zh = language_stop_words("zh")
    assert zh and "。" not in zh and "、" not in zh  # punctuation is in the package's Chinese list
    assert "我们" in zh
    for lang in ("zh", "ja", "th", "ar", "fa", "ru"):
        assert all(split_words(w, lang) == [w] for w in language_stop_words(lang))


def test_per_language_stop_words_override_the_package(labelled):
    fa = pages(labelled, "fa")
    flt = GopherQuality(per_language={"fa": {"stop_words": ["نامی_که_نیست", "واژه_ای_دیگر"]}})
    assert any(flt.filter_batch([d])[0] == (False, "gopher_enough_stop_words") for d in copies(fa))


# --- the letter-share rule: datatrove's tokens or the paper's whitespace words ---


def ratios(text, language):
    tokens = split_words(text, language)
    spaced = text.split()
    return (
        sum(any(map(str.isalpha, w)) for w in tokens) / len(tokens),
        sum(any(map(str.isalpha, w)) for w in spaced) / len(spaced),
    )


def test_alpha_words_whitespace_counts_whitespace_separated_words(labelled):
    docs = pages(labelled, "en", "ru", "fr")
    tokens, spaced = GopherQuality(), GopherQuality(alpha_words="whitespace")
    changed = 0
    for d in docs:
        a, b = tokens.filter_batch([d])[0], spaced.filter_batch([d])[0]
        by_tokens, by_space = ratios(d.text, d.metadata["language"])
        if a != b:
            changed += 1
            # only the letter-share rule can differ, and it follows the two ratios
            assert (a == (False, "gopher_below_alpha_threshold")) == (by_tokens < 0.8)
            assert (b == (False, "gopher_below_alpha_threshold")) == (by_space < 0.8)
        # a punctuation token is no word to the paper: whitespace words have letters more often
    assert changed > 50
    assert GopherQuality().config.alpha_words == "tokens"  # datatrove's definition stays the default


# --- C4: sentence-final punctuation of other scripts ---


def test_japanese_lines_ending_in_kuten_are_sentences_to_c4(labelled):
    from datatrove.pipeline.filters.c4_filters import END_PUNCTUATION

    from gristmill.filters.c4_lines import SCRIPT_END_PUNCTUATION, C4Lines

    ja = pages(labelled, "ja")
    ascii_only = C4Lines(end_punctuation=list(END_PUNCTUATION))  # datatrove's set: what every page got before
    before = ascii_only.filter_batch(copies(ja))
    after_docs = copies(ja)
    after = C4Lines().filter_batch(after_docs)
    newly_kept = [i for i, (a, b) in enumerate(zip(before, after)) if a == (False, "too_few_sentences") and b is True]
    assert len(newly_kept) >= 3
    for i in newly_kept:
        lines = after_docs[i].text.splitlines()
        assert any(not line.endswith(END_PUNCTUATION) for line in lines)  # kept for a Japanese mark
        assert all(line.endswith(END_PUNCTUATION + SCRIPT_END_PUNCTUATION) for line in lines)


def test_c4_english_decisions_and_text_are_datatroves(labelled):
    from datatrove.pipeline.filters.c4_filters import END_PUNCTUATION

    from gristmill.filters.c4_lines import C4Lines

    en = pages(labelled, "en", min_score=0.0)
    a, b = copies(en), copies(en)
    assert C4Lines().filter_batch(a) == C4Lines(end_punctuation=list(END_PUNCTUATION)).filter_batch(b)
    assert [d.text for d in a] == [d.text for d in b]
    # an ellipsis ends no sentence, in any script
    ellipsis = Document(text="これは文です…", id="x", metadata={"language": "ja"})
    assert C4Lines(min_num_sentences=1).filter_batch([ellipsis]) == [(False, "too_few_sentences")]
