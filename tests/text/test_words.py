"""split_words by script: ICU words on pages labelled zh/ja/th/lo/km/my, the regex elsewhere.

The pages are the crawl sample's, labelled by langid (lid.176, score >= 0.65) as the pipeline
labels them before the filters run.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from unicodedata import category

import pytest
from datatrove.data import Document

from gristmill.core.documents import text_bytes
from gristmill.filters.c4_lines import C4Lines
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition
from gristmill.filters.langid import LangId
from gristmill.input.wet import WetRecord, iter_wet_records
from gristmill.text import words as words_mod
from gristmill.text.words import (
    PUNCTUATION_CHARS,
    UNSPACED_LANGUAGES,
    WORD_TOKEN,
    Words,
    line_counts,
    line_duplicates,
    page_words,
    paragraph_duplicates,
    spaced_word_counts,
    split_lines,
    split_paragraphs,
    split_words,
)
from gristmill.text.words import _tokenize as tokenize

UNSPACED = words_mod._UNSPACED_CHAR


@pytest.fixture(scope="module")
def labelled(wet_files, lid_model) -> list[Document]:
    docs = [
        Document(text=r.text, id=r.record_id)
        for f in wet_files
        for r in iter_wet_records(f)
        if isinstance(r, WetRecord)
    ]
    kept = list(LangId(model=str(lid_model), languages=None, min_score=0.65).run(iter(docs)))
    langs = Counter(d.metadata["language"] for d in kept)
    # what the sample holds (docs/segmenters.md): Chinese, Japanese and one Thai page
    assert langs["zh"] >= 5 and langs["ja"] >= 5 and langs["th"] >= 1 and langs["en"] > 300, langs
    return kept


def pages(labelled, *languages) -> list[Document]:
    return [d for d in labelled if d.metadata["language"] in languages]


def script_words(words: list[str]) -> list[str]:
    return [w for w in words if UNSPACED.search(w)]


def test_known_segmentations():
    # ICU 78.3's dictionaries, as pinned (icu4py==1.2.0)
    assert split_words("我们是中国人。", "zh") == ["我们", "是", "中国人", "。"]
    assert split_words("東京都に行きました…", "ja") == ["東京", "都", "に", "行き", "ま", "した", "…"]
    assert split_words("ภาษาไทย ภาษา", "th") == ["ภาษา", "ไทย", "ภาษา"]
    # Latin, digits and punctuation between them follow the regex, as on English pages
    assert split_words("「Don't」3.14ก็ได้ 2004การ ฝนAnna", "th") == [
        "「", "Don't", "」", "3.14", "ก็ได้", "2004", "การ", "ฝน", "Anna",
    ]  # fmt: skip
    # any other label, or none, keeps one token per character
    assert split_words("我们是中国人。", "en") == split_words("我们是中国人。") == list("我们是中国人。")


def test_real_unspaced_pages_get_multi_character_words(labelled):
    for lang in ("zh", "ja", "th"):
        for d in pages(labelled, lang):
            regex_words = script_words(WORD_TOKEN.findall(d.text))
            icu_words = script_words(split_words(d.text, lang))
            # the regex: one character a token (Thai: a letter with its marks)
            assert all(
                len(w) == 1 or lang == "th" and all(category(c)[0] == "M" for c in w[1:]) for w in regex_words
            ), d.id
            multi = sum(len(w) > 1 for w in icu_words) / len(icu_words)
            assert multi > 0.4, (d.id, multi)  # measured 0.47..0.97
            assert len(icu_words) < 0.85 * len(regex_words), d.id


def test_tokens_spell_the_page_and_hold_no_whitespace(labelled):
    for d in pages(labelled, *UNSPACED_LANGUAGES):
        words = split_words(d.text, d.metadata["language"])
        assert "".join(words) == "".join(d.text.split()), d.id
        assert not any(ch.isspace() for w in words for ch in w), d.id


def test_latin_digits_and_punctuation_keep_the_regex_tokens(labelled):
    for d in pages(labelled, "zh", "th"):
        words = split_words(d.text, d.metadata["language"])
        rest = [w for w in words if not UNSPACED.search(w)]
        assert rest == WORD_TOKEN.findall(UNSPACED.sub(" ", d.text)), d.id
    for d in pages(labelled, "ja"):
        # kana words keep their Common-script length marks ("ページ"), never Latin letters or digits
        for w in script_words(split_words(d.text, "ja")):
            assert not words_mod._HAS_OTHER_CHAR.search(w), (d.id, w)


def test_other_languages_split_exactly_as_the_regex(labelled):
    others = [d for d in labelled if d.metadata["language"] not in UNSPACED_LANGUAGES]
    assert len(others) > 400
    for d in others:
        assert split_words(d.text, d.metadata["language"]) == WORD_TOKEN.findall(d.text), d.id
    # English text holds nothing for ICU to segment: the unspaced path returns the same tokens
    latin = [d.text for d in pages(labelled, "en") if not UNSPACED.search(d.text)]
    assert len(latin) > 300
    for text in latin:
        assert split_words(text, "zh") == WORD_TOKEN.findall(text)


def test_unspaced_words_count_as_alphabetic(labelled):
    # Gopher's alphabetic share: a word counts when any character isalpha(); Han and kana are
    # Lo, the length mark Lm, Thai consonants Lo (its vowel and tone marks Mn are not letters)
    for d in pages(labelled, *UNSPACED_LANGUAGES):
        non_alpha = [
            w for w in script_words(split_words(d.text, d.metadata["language"])) if not any(map(str.isalpha, w))
        ]
        assert all(len(w) == 1 for w in non_alpha), non_alpha  # symbols such as "㌔", as before
        assert len(non_alpha) <= 2


def test_cache_is_per_language():
    text = "".join(["我们是", "中国人"])
    regex_words = page_words(text)
    assert page_words(text, "en") is regex_words  # any non-unspaced label shares the regex split
    zh = page_words(text, "zh")
    assert zh.words() == ["我们", "是", "中国人"] == split_words(text, "zh") and zh is not regex_words
    assert page_words(text, "zh") is zh
    assert regex_words.words() == list(text) == split_words(text)


def content_words(words):
    return sum(1 for w in words if w.strip(PUNCTUATION_CHARS))


def test_gopher_counts_chinese_words_not_characters(labelled):
    zh = pages(labelled, "zh")
    for d in zh:
        chars, words = content_words(WORD_TOKEN.findall(d.text)), content_words(split_words(d.text, "zh"))
        assert words < chars
        # a minimum between the two counts: met by the characters, not by the words
        f = GopherQuality(min_doc_words=words + 1, min_avg_word_length=None)
        unlabelled = Document(text=d.text, id=d.id)
        assert f.filter_batch([unlabelled])[0] != (False, "gopher_short_doc"), d.id
        labelled_zh = Document(text=d.text, id=d.id, metadata={"language": "zh"})
        assert f.filter_batch([labelled_zh]) == [(False, "gopher_short_doc")]


def test_gopher_mean_word_length_of_words(labelled):
    # Chinese words are longer than the single characters the regex makes, and still shorter
    # than Gopher's English minimum of 3
    zh = pages(labelled, "zh")
    assert len(zh) >= 5
    for d in zh:

        def mean(tokens):
            tokens = [w for w in tokens if w.strip(PUNCTUATION_CHARS)]
            return sum(map(len, tokens)) / len(tokens)

        by_words, by_chars = mean(split_words(d.text, "zh")), mean(WORD_TOKEN.findall(d.text))
        assert by_words > by_chars + 0.3, (d.id, by_words, by_chars)
        assert by_words < 3, (d.id, by_words)


def test_repetition_sees_repeated_words_not_common_characters(labelled):
    # five characters in a row recur in any Chinese or Japanese page; five words rarely do
    f = GopherRepetition()
    changed = 0
    for d in pages(labelled, "zh", "ja"):
        before = f.filter_batch([Document(text=d.text, id=d.id)])[0]
        after = f.filter_batch([Document(text=d.text, id=d.id, metadata=dict(d.metadata))])[0]
        changed += before != after
        if after is not True:
            assert after[1].startswith(("top_", "duplicated_")) and before is not True, (d.id, before, after)
    assert changed >= 3


def c4_kept_lines(text, language, **params) -> int:
    f = C4Lines(**params)
    f.filter_batch([Document(text=text, id="x", metadata={"language": language} if language else {})])
    kept = f.stats.to_dict()["stats"].get("line-kept", 0)
    return kept["total"] if isinstance(kept, dict) else kept


def test_c4_counts_icu_words_per_line(labelled):
    # with only the word-count rule on, an unlabelled Chinese line is one "word" (no spaces)
    params = dict(
        filter_no_terminal_punct=False,
        min_num_sentences=-1,
        filter_policy=False,
        filter_javascript=False,
        filter_curly_bracket=False,
        filter_lorem_ipsum=False,
    )
    more = 0
    for d in pages(labelled, "zh", "ja"):
        before = c4_kept_lines(d.text, None, **params)
        after = c4_kept_lines(d.text, d.metadata["language"], **params)
        assert after >= before, d.id
        more += after > before
    assert more >= 10  # of 15; the others are one line, or short menu items either way
    # an English page decides as before when labelled
    en = next(d for d in pages(labelled, "en") if C4Lines().filter_batch([Document(text=d.text, id="x")])[0] is True)
    assert c4_kept_lines(en.text, "en") == c4_kept_lines(en.text, None) > 0


def test_missing_icu_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(words_mod, "_WordBreaker", None)
    monkeypatch.setitem(sys.modules, "icu4py.breakers", None)
    with pytest.raises(ImportError, match=r"icu4py==1\.2\.0") as e:
        split_words("".join(["我们", "是"]), "ja")
    assert "\n" not in str(e.value)


# --- long texts, a piece at a time ---


@pytest.mark.parametrize("size", [1, 50, 997])
def test_pieces_split_into_the_words_and_lines_of_the_whole_text(labelled, size):
    """Every labelled sample page (English, Chinese, Japanese, Thai, ...), cut every ~`size`
    characters where `text_chunks` / `line_chunks` may cut: the pieces' words, with the page's
    own segmentation (ICU for unspaced languages), are the page's words; their lines its lines."""
    cut = 0
    for doc in labelled:
        text, lang = doc.text, doc.metadata["language"]
        pieces = list(words_mod.text_chunks(text, size))
        assert "".join(pieces) == text
        cut += len(pieces) > 1
        chunked = [w for ws in words_mod.word_chunks(text, lang, size) for w in ws]
        assert chunked == split_words(text, lang), (doc.id, lang)
        lines = list(words_mod.line_chunks(text, size))
        assert "".join(lines) == text and all(p.endswith("\n") for p in lines[:-1])
        assert [line for p in lines for line in p.splitlines()] == text.splitlines()
    assert cut > len(labelled) // 2  # the pages were cut, most of them many times


def test_long_texts_are_not_kept_for_the_next_caller(monkeypatch):
    monkeypatch.setattr(words_mod, "CHUNK_CHARS", 20)
    text = "a page longer than the limit"
    assert page_words(text) is not page_words(text)  # read again: none of it outlives the call
    assert page_words(text).words() == split_words(text)  # in pieces, the same words
    short = "short page"
    assert page_words(short) is page_words(short)


# --- the C scanner is the regex -----------------------------------------------------------------


def test_the_scanner_is_the_regex_on_the_sample(labelled):
    for d in labelled:
        assert tokenize(d.text) == WORD_TOKEN.findall(d.text), d.id
        words = Words()
        words.add_text(d.text)
        assert words.words() == WORD_TOKEN.findall(d.text)


def test_the_scanner_is_the_regex_on_every_code_point():
    """Each code point alone, beside letters, digits, the number separators and the joiners, and
    after a Thai letter: every class boundary of the five alternatives, in one text per block.
    Every BMP code point (the classes are BMP tables); beyond it, where every character is a
    token of its own unless \\d or \\s takes it, every decimal digit and space and every 61st
    code point."""
    context = "{0} a{0} {0}a 1{0} {0}1 1.{0} {0}.1 1,{0}2 a'{0} {0}-a a{0}'b \u0e01{0} {0}{0} "
    astral = (chr(c) for c in range(0x10000, 0x110000))
    points = [chr(c) for c in range(0x10000) if not 0xD800 <= c < 0xE000]
    points += [p for p in astral if p.isdecimal() or p.isspace() or ord(p) % 61 == 0]
    for i in range(0, len(points), 8192):
        text = "".join(context.format(p) for p in points[i : i + 8192])
        got, want = tokenize(text), WORD_TOKEN.findall(text)
        assert got == want, next(((i, a, b) for a, b in zip(got, want) if a != b), (i, len(got), len(want)))


def test_the_scanner_is_the_regex_on_random_text():
    rng = random.Random(3)
    pool = (
        "0123456789.,'’-  \t\n\u00a0\u2003a é Ж ß ٣ ١٢ ๑๒ ๓ ก ั ้ ສ ក ႀ 中 の カ ー ﾞ 한 \u0301 \u200d "
        "$ % ( ) … — ・ 。 \U0001d7ce \U0001d7cf \U00020000 \U0001f600 \U000104a0 \ufe0f ‐ ‑"
    ).split(" ") + [" "]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        assert tokenize(text) == WORD_TOKEN.findall(text), text
        start, end = sorted(rng.randint(0, len(text)) for _ in range(2))
        assert tokenize(text, start, end) == WORD_TOKEN.findall(text, start, end), (text, start, end)


def test_spaced_word_counts_are_str_split_s():
    rng = random.Random(5)
    pool = ["a", "1", ".", " ", "\t", "\n", "\u3000", "\u00a0", "é", "中", "\U0001f600", "\x1c", "\x85", "-"]
    for _ in range(2000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
        spaced = text.split()
        assert spaced_word_counts(text) == (len(spaced), sum(any(map(str.isalpha, w)) for w in spaced)), text


def _find_duplicates(parts):
    seen, dups, chars = set(), 0, 0
    for p in parts:
        if p in seen:
            dups, chars = dups + 1, chars + len(p)
        seen.add(p)
    return len(parts), dups, chars


def test_line_and_paragraph_counts_are_the_python_ones(labelled):
    rng = random.Random(11)
    pool = ["a", "b", "ab", " ", "\t", "\n", "\n", "\n\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x85", "\u2028",
            "\u2029", "\u3000", "•", "-", "...", "…", ".", "é", "\U0001f600", "x y"]  # fmt: skip
    texts = [d.text for d in labelled] + ["", "\n", "\n\n", "a\n", "\na", "\n\na\n\n", "  \n  ", "a\n\n\nb\n\nb"]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 60))) for _ in range(3000)]
    for text in texts:
        lines = text.splitlines()
        bullets = sum(l.lstrip().startswith(("•", "-")) for l in lines)
        ellipses = sum(l.rstrip().endswith(("...", "…")) for l in lines)
        assert line_counts(text) == (len(lines), bullets, ellipses), text
        assert paragraph_duplicates(text) == _find_duplicates(split_paragraphs(text)), text
        assert line_duplicates(text) == _find_duplicates(split_lines(text)), text
        assert text_bytes(text) == len(text.encode("utf-8")), text
