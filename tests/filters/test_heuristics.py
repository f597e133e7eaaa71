"""Heuristic filters (Gopher quality and repetition, C4 lines) against datatrove's, on real WET.

datatrove's filters are run with our tokenizer and sentence splitter patched in, so any
difference in a decision comes from the filter logic, which must then be identical.
"""

from __future__ import annotations

import gzip
import inspect
import math
import random
import re
from collections import Counter

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters import c4_filters, gopher_quality_filter, gopher_repetition_filter
from datatrove.pipeline.filters.gopher_repetition_filter import (
    find_all_duplicate,
    find_top_duplicate,
    get_n_grams,
)

from gristmill.filters.c4_lines import C4Lines
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition
from gristmill.text.words import Words, page_words, split_lines, split_paragraphs, split_sentences, split_words


def read_wet(path) -> list[str]:
    """The texts of a WET file's conversion records (headers, blank line, Content-Length bytes)."""
    data = gzip.decompress(path.read_bytes())
    texts, pos = [], 0
    while (start := data.find(b"WARC/1.0\r\n", pos)) >= 0:
        end = data.index(b"\r\n\r\n", start)
        headers = dict(line.split(b":", 1) for line in data[start:end].split(b"\r\n")[1:] if b":" in line)
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        length = int(headers[b"content-length"])
        if headers.get(b"warc-type") == b"conversion":
            texts.append(data[end + 4 : end + 4 + length].decode("utf-8", "replace"))
        pos = end + 4 + length
    return texts


@pytest.fixture(scope="module")
def texts(wet_files) -> list[str]:
    found = [text for path in wet_files for text in read_wet(path)]
    assert len(found) == 609  # 566 + 43 conversion records in the two samples
    return found


@pytest.fixture
def datatrove_with_our_splitters(monkeypatch):
    words = lambda text, language: split_words(text)  # noqa: E731
    monkeypatch.setattr(gopher_quality_filter, "split_into_words", words)
    monkeypatch.setattr(gopher_repetition_filter, "split_into_words", words)
    monkeypatch.setattr(c4_filters, "split_into_sentences", lambda text, language: split_sentences(text))


def decisions(filter_, texts):
    """(keep, reason, text after filtering) per document."""
    out = []
    for text in texts:
        doc = Document(text=text, id="x")
        result = filter_.filter_batch([doc])[0]
        keep, reason = (result, None) if isinstance(result, bool) else result
        out.append((keep, reason, doc.text))
    return out


def totals(filter_) -> dict[str, float]:
    """A filter's stats as label: total (to_dict writes a bare number for some)."""
    stats = filter_.stats.to_dict()["stats"]
    return {k: v["total"] if isinstance(v, dict) else v for k, v in stats.items()}


def assert_same_decisions(theirs, ours, texts, min_reasons):
    expected, got = decisions(theirs, texts), decisions(ours, texts)
    mismatches = [(i, e[:2], g[:2]) for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not mismatches, mismatches[:5]
    reasons = Counter(reason for _, reason, _ in got)
    # the comparison means something only if the documents exercise several rules
    assert reasons[None] > 0 and len(reasons) >= min_reasons, reasons
    return reasons


# --- parity with datatrove on all real documents ---


# stricter settings, so that the rules real documents rarely break get to decide too
STRICT_QUALITY = [
    {"min_doc_words": 10, "max_symbol_word_ratio": 0.002, "max_bullet_lines_ratio": 0.05,
     "max_ellipsis_lines_ratio": 0.02, "min_avg_word_length": 2},
    {"min_doc_words": 10, "max_doc_words": 3000, "min_avg_word_length": None, "max_avg_word_length": None,
     "max_symbol_word_ratio": None, "max_bullet_lines_ratio": 0.02, "max_ellipsis_lines_ratio": 0.01},
]  # fmt: skip
STRICT_REPETITION = {
    "dup_line_frac": None,
    "top_n_grams": ((2, 0.5), (3, 0.3), (4, 0.3)),
    "dup_n_grams": ((5, 0.08), (6, 0.07), (7, 0.06), (8, 0.05), (9, 0.05), (10, 0.04)),
}


def test_gopher_quality_decides_as_datatrove(texts, datatrove_with_our_splitters):
    seen = Counter()
    for params in [{}, *STRICT_QUALITY]:
        theirs = gopher_quality_filter.GopherQualityFilter(**params)
        seen += assert_same_decisions(theirs, GopherQuality(**params), texts, 5)
    assert len(seen) == 11, seen  # kept, and each of the 10 drop reasons


@pytest.mark.parametrize("params", [{}, STRICT_REPETITION])
def test_gopher_repetition_decides_as_datatrove(texts, datatrove_with_our_splitters, params):
    theirs = gopher_repetition_filter.GopherRepetitionFilter(**params)
    reasons = assert_same_decisions(theirs, GopherRepetition(**params), texts, 6)
    assert sum(n for r, n in reasons.items() if r and r.startswith("duplicated_")) >= 5


def test_repeated_paragraphs_decide_as_datatrove(datatrove_with_our_splitters):
    # few WET pages have blank lines, so build some
    para = "A paragraph that the page repeats, as boilerplate does.\nWith a second line."
    texts = [
        "\n\n".join([para] * k + [f"Other text number {i}, long enough to count." for i in range(j)])
        for k in (1, 2, 3)
        for j in (1, 3, 8)
    ]
    theirs = gopher_repetition_filter.GopherRepetitionFilter()
    expected, got = decisions(theirs, texts), decisions(GopherRepetition(), texts)
    assert got == expected
    assert {r for _, r, _ in got} >= {"dup_para_frac", "dup_para_char_frac"}


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"split_paragraph": False},  # rules applied to sentences
        {"max_word_length": 15, "min_words_per_line": -1, "filter_curly_bracket": False},
    ],
)
def test_c4_lines_decides_and_rewrites_as_datatrove(texts, datatrove_with_our_splitters, params):
    theirs, ours = c4_filters.C4QualityFilter(**params), C4Lines(**params)
    reasons = assert_same_decisions(theirs, ours, texts, 2)
    assert reasons["too_few_sentences"] > 0
    # datatrove counts lines one update at a time, we once per document: same totals
    their_lines = {k: v for k, v in totals(theirs).items() if k.startswith("line-")}
    assert {"line-total", "line-kept", "line-filter-no_terminal_punc"} <= their_lines.keys()
    if "max_word_length" in params:
        assert their_lines["line-filter-too_long_word"] > 0
    assert {k: v for k, v in totals(ours).items() if k.startswith("line-")} == their_lines


@pytest.mark.parametrize(
    "theirs, ours",
    [
        (gopher_quality_filter.GopherQualityFilter, GopherQuality),
        (gopher_repetition_filter.GopherRepetitionFilter, GopherRepetition),
        (c4_filters.C4QualityFilter, C4Lines),
    ],
)
def test_parameters_and_defaults_mirror_datatrove(theirs, ours):
    # what gristmill adds for other languages (per-language values; its own options beside
    # datatrove's, whose defaults keep datatrove's decisions)
    GRISTMILL_ONLY = {"per_language", "alpha_words", "end_punctuation", "min_paragraph_words", "paragraph_words"}

    def defaults(cls, skip):
        params = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in params if p.name not in skip}

    expected = defaults(theirs, {"self", "exclusion_writer", "language"})
    ours_defaults = {name: f.default for name, f in ours.Config.model_fields.items() if name not in GRISTMILL_ONLY}
    assert ours_defaults == expected


# --- long documents: counted a piece at a time, decided as whole ones ---


def test_long_documents_decide_as_whole_ones(texts, monkeypatch):
    para = "A paragraph that the page repeats, as boilerplate does.\nWith a second line."
    texts = texts + [
        "\n\n".join([para] * k + [f"Other text {i}, long enough to count." for i in range(8)]) for k in (1, 3)
    ]
    texts += ["", " \n ", "\n\nTwo blank lines first\n\n\nand three between.\n\n", "no newline at all " * 30]
    made = [
        *(lambda p=p: GopherQuality(**p) for p in [{}, *STRICT_QUALITY, {"alpha_words": "whitespace"}]),
        *(lambda p=p: GopherRepetition(**p) for p in [{}, STRICT_REPETITION]),
        *(lambda p=p: C4Lines(**p) for p in [{}, {"max_word_length": 15, "filter_curly_bracket": False}]),
    ]
    whole = [decisions(make(), texts) for make in made]
    from gristmill.filters import c4_lines
    from gristmill.text import words

    for module in (words, c4_lines):  # the Gopher filters read long pages through `words`
        monkeypatch.setattr(module, "CHUNK_CHARS", 97)
    pieces = [decisions(make(), texts) for make in made]
    assert pieces == whole
    assert sum(len(t) >= 97 for t in texts) > 500  # the long paths decided most pages
    assert len({r for d in whole for _, r, _ in d}) >= 12  # across many rules


# --- the repetition filter's n-gram arithmetic ---


def check_ngrams(words, ns):
    """Our counts (`Words`, with the words given whole and a few at a time) against datatrove's;
    the early stop of a scan stops at or after the count that breaks the rule."""
    whole, pieces = Words(words), Words()
    for i in range(0, len(words), 7):
        pieces.add(words[i : i + 7])
    assert whole.count == pieces.count == len(words) and whole.distinct == len(set(words))
    chars = sum(map(len, words)) or 1
    for n in ns:
        grams = get_n_grams(words, n)
        top = find_top_duplicate(grams) if grams else None
        assert whole.top_chars(n) == pieces.top_chars(n) == top, n
        repeated = find_all_duplicate(words, n)
        assert whole.repeated_chars(n, chars, math.inf) == pieces.repeated_chars(n, chars, math.inf) == repeated, n
        for frac in (0.0, 0.05, 0.3):
            stopped = whole.repeated_chars(n, chars, frac)
            assert (stopped / chars > frac) == (repeated / chars > frac) and stopped <= repeated, (n, frac)


def test_ngram_scores_match_datatrove_on_real_words(texts):
    for text in texts:
        check_ngrams(split_words(text), (2, 5, 8))


def test_ngram_scores_match_datatrove_on_repetitive_words():
    # few short words, some prefixes of others: many repeats, overlaps and n-grams that join
    # equal without spaces (("a", "ab") and ("aa", "b"))
    rng = random.Random(7)
    for _ in range(300):
        words = rng.choices(["a", "b", "ab", "ba", "aa", "the"], k=rng.randint(0, 60))
        check_ngrams(words, range(1, 11))


def test_ngrams_joined_equal_from_distinct_words_are_compared_as_strings():
    # ("so", "mean") and ("some", "an") both join to "somean": one n-gram to datatrove's scan
    words = "so mean a man x some an am an x".split()
    check_ngrams(words, (2, 3))
    assert find_all_duplicate(words, 2) > 0
    # characters of every width in one page: str objects of kinds 1, 2 and 4 compared
    words = ["é", "a", "éa", "日本", "日", "本", "\U0001f600", "x\U0001f600", "x"] * 3
    words += ["aé", "日本", "x\U0001f600"]
    check_ngrams(words, range(1, 6))


def test_words_are_refused_unless_str():
    with pytest.raises(TypeError, match="expected str"):
        Words(["a", b"b"])
    with pytest.raises(ValueError, match="n must be >= 1"):
        Words(["a"]).top_chars(0)


# --- tokenizer and splitters ---


def test_english_words_and_punctuation():
    assert split_words("Don't stop—it's 3.14 or 1,000 state-of-the-art tests... really?! (#1)") == [
        "Don't", "stop", "—", "it's", "3.14", "or", "1,000", "state-of-the-art", "tests", "...",
        "really", "?!", "(#", "1", ")",
    ]  # fmt: skip


def test_scripts_without_spaces_split_per_character():
    assert split_words("我们是中国人。") == ["我", "们", "是", "中", "国", "人", "。"]
    assert split_words("カタカナとひらがな") == list("カタカナとひらがな")
    assert split_words("ภาษา ไทย") == ["ภ", "า", "ษ", "า", "ไ", "ท", "ย"]
    assert split_words("한국어 텍스트 naïve") == ["한국어", "텍스트", "naïve"]


def test_tokens_keep_every_non_space_character(texts):
    for text in texts:
        words = split_words(text)
        assert "".join(words) == "".join(text.split())
        assert not any(ch.isspace() for w in words for ch in w)


def test_word_counts_on_real_documents_are_sane(texts):
    english = [t for t in texts if len(t) > 2000 and sum(map(str.isascii, t)) > 0.99 * len(t)]
    assert len(english) > 50
    ratios = sorted(len(split_words(t)) / len(t.split()) for t in english)
    # every whitespace-separated piece is one word or more: "word," is two, as for spaCy
    assert ratios[0] >= 1
    # prose has a punctuation token every few words; the odd page is minified JavaScript
    median = ratios[len(ratios) // 2]
    assert median >= 1.05 and median <= 1.5
    assert ratios[int(len(ratios) * 0.9)] < 2
    chinese = next(t for t in texts if sum("\u4e00" <= ch <= "\u9fff" for ch in t) > 500)
    assert len(split_words(chinese)) > 3 * len(chinese.split())


def test_page_words_are_reused_only_for_the_same_text_object():
    text = "one two three"
    first = page_words(text)
    assert page_words(text) is first
    other = "".join(["one two ", "four"])
    assert page_words(other).words() == ["one", "two", "four"]
    equal = "".join(["one two ", "three"])  # equal, but another object: split anew
    assert page_words(equal) is not first and page_words(equal).words() == first.words()


def test_sentences():
    assert split_sentences("Hello there. This is Mr. Smith! Is it “ok?” Yes. lower. end") == [
        "Hello there.", "This is Mr.", "Smith!", "Is it “ok?”", "Yes. lower. end",
    ]  # fmt: skip
    assert split_sentences("  ") == []
    assert split_sentences(" no end ") == ["no end"]


def test_lines_and_paragraphs_split_as_datatrove(texts):
    rng = random.Random(3)
    samples = texts + ["".join(rng.choices("a\n\n b", k=rng.randint(0, 12))) for _ in range(3000)]
    for text in samples:
        assert split_lines(text) == re.split("\n+", text)
        assert split_paragraphs(text) == re.split(r"\n{2,}", text.strip())


# --- parameters ---


def doc(text):
    return Document(text=text, id="x")


def test_min_and_max_doc_words(texts):
    text = next(t for t in texts if GopherQuality().filter_batch([doc(t)])[0] is True)
    n = len(split_words(text))
    assert GopherQuality(min_doc_words=n + 1).filter_batch([doc(text)])[0] == (False, "gopher_short_doc")
    assert GopherQuality(max_doc_words=10).filter_batch([doc(text)])[0] == (False, "gopher_long_doc")
    assert GopherQuality(stop_words=["zzzz", "qqqq"]).filter_batch([doc(text)]) == [(False, "gopher_enough_stop_words")]


def test_disabled_rules_stop_dropping(texts):
    def reasons(filter_):
        return Counter(r for _, r, _ in decisions(filter_, texts))

    assert reasons(GopherQuality())["gopher_below_alpha_threshold"] > 0
    assert reasons(GopherQuality(max_non_alpha_words_ratio=None))["gopher_below_alpha_threshold"] == 0
    assert reasons(GopherRepetition())["dup_line_frac"] > 0
    assert reasons(GopherRepetition(dup_line_frac=None))["dup_line_frac"] == 0
    assert reasons(GopherRepetition(top_n_grams=[[2, 0.99]]))["top_3_gram"] == 0  # YAML lists
    assert reasons(C4Lines(min_num_sentences=-1))["too_few_sentences"] == 0
    assert reasons(C4Lines(filter_curly_bracket=False))["curly_bracket"] == 0


def test_c4_keeps_only_the_good_lines():
    text = "Short line.\nThis line has enough words.\nNo end punctuation here\nEnable JavaScript to see it.\n"
    d = doc(text * 3)
    assert C4Lines(min_num_sentences=3).filter_batch([d])[0] is True
    assert d.text == "\n".join(["This line has enough words."] * 3)
    assert C4Lines().filter_batch([doc("A fine line with lorem ipsum in it.")])[0] == (False, "lorem_ipsum")


def test_c4_paragraph_rule_drops_pages_of_one_line_items():
    # a headline list: every line a sentence, enough sentences and words for C4 itself
    items = "\n".join(f"Item number {i} of the list is a short headline sentence." for i in range(12))
    paragraph = " ".join(["A line of real prose runs on, sentence after sentence, as readers write it."] * 3)
    assert C4Lines().filter_batch([doc(items)])[0] is True  # off by default: C4's decisions
    rule = C4Lines(min_paragraph_words=30)
    assert rule.filter_batch([doc(items)])[0] == (False, "too_few_paragraph_words")
    assert len(paragraph.split()) == 42 and rule.filter_batch([doc(items + "\n" + paragraph)])[0] is True
    # the words of lines at least paragraph_words long count, in all: two lines of 42 reach 84
    assert C4Lines(min_paragraph_words=84).filter_batch([doc(f"{paragraph}\n{items}\n{paragraph}")])[0] is True
    assert C4Lines(min_paragraph_words=85).filter_batch([doc(f"{paragraph}\n{items}\n{paragraph}")])[0] == (
        False,
        "too_few_paragraph_words",
    )
    # a shorter paragraph line: 11-word items count once paragraph_words is 11
    assert C4Lines(min_paragraph_words=30, paragraph_words=11).filter_batch([doc(items)])[0] is True
    # a page written without spaces: its lines' words are ICU's, as C4's own word rule counts them
    ja = Document(text="。\n".join(["今日は天気がとても良いので公園まで歩いて行きました"] * 6) + "。", id="j")
    ja.metadata["language"] = "ja"
    assert C4Lines(min_paragraph_words=10, paragraph_words=5, min_num_sentences=1).filter_batch([ja])[0] is True


def test_c4_paragraph_rule_only_removes(texts):
    """On the real sample: a page C4 drops goes for the same reason, a page it keeps is kept with
    the same text or goes as too_few_paragraph_words; some do."""
    pairs = list(zip(decisions(C4Lines(), texts), decisions(C4Lines(min_paragraph_words=80), texts)))
    assert all(after == before for before, after in pairs if before[1] is not None)
    kept = [(before, after) for before, after in pairs if before[1] is None]
    assert all(after == before or after[1] == "too_few_paragraph_words" for before, after in kept)
    assert 0 < sum(after[1] == "too_few_paragraph_words" for _, after in kept) < len(kept)


def test_empty_documents():
    assert GopherRepetition().filter_batch([doc("")])[0] == (False, "empty")
    assert GopherQuality().filter_batch([doc("")])[0] == (False, "gopher_short_doc")
    assert GopherQuality(min_doc_words=None).filter_batch([doc(" \n ")])[0] == (False, "gopher_short_doc")
    assert C4Lines().filter_batch([doc("")])[0] == (False, "too_few_sentences")


# --- Filter.run bookkeeping ---


@pytest.mark.parametrize("make", [GopherQuality, GopherRepetition, C4Lines])
def test_run_counts_every_document(texts, make):
    expected = Counter(r for _, r, _ in decisions(make(), texts))
    f = make()
    docs = [doc(t) for t in texts]
    kept = list(f.run(iter(docs)))
    stats = totals(f)
    assert f.stats.name == f"🔻 FILTER: {make.yaml_name}"
    assert stats["total"] == len(texts)
    assert stats["forwarded"] == len(kept) == expected[None]
    assert stats["forwarded"] + stats["dropped"] == len(texts)
    by_reason = {k[len("dropped_") :]: v for k, v in stats.items() if k.startswith("dropped_")}
    assert by_reason == {r: n for r, n in expected.items() if r is not None}
    assert sum(by_reason.values()) == stats["dropped"]
    assert stats["bytes_in"] == sum(len(t.encode()) for t in texts)
    assert stats["bytes_out"] == sum(len(d.text.encode()) for d in kept)
    if make is C4Lines:  # rewrites the kept documents to their kept lines
        assert stats["bytes_out"] < sum(len(t.encode()) for t, d in zip(texts, docs) if d in kept)
