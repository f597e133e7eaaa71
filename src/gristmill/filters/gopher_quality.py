"""Gopher's quality rules (Rae et al. 2021, https://arxiv.org/abs/2112.11446), as datatrove's
GopherQualityFilter: same parameters, defaults, order of rules and drop reasons.

Faster in two ways: words come from our tokenizer instead of spaCy (see words.py), and the
per-word statistics are counted in C once per distinct word (`page_words`, shared with
gopher_repetition) rather than once per occurrence in several list comprehensions and a numpy
mean.

Long pages (`CHUNK_CHARS` characters and more) are read a piece at a time (`page_words`,
`line_chunks`): the page's words are held as numbers (4 bytes a word) and its distinct words,
never as a list of str; the counts, and so the decisions, are those of the whole text.

Other languages: stop words are the page's language's (`stopwordsiso`, the stopwords-iso
lists, MIT), English keeping datatrove's list; a language with no list skips the stop-word
rule. Thresholds per language come from `per_language` (see `pipeline calibrate`).
"""

from __future__ import annotations

from typing import Literal

from datatrove.data import Document
from datatrove.pipeline.filters.gopher_quality_filter import STOP_WORDS
from pydantic import Field

from gristmill.core.configlib import OMIT_DEFAULT, FilterConfig
from gristmill.core.filter import Filter, FilterResult, Threshold
from gristmill.text.words import line_counts, page_words, spaced_word_counts, split_words

#: the languages whose default stop words are datatrove's English list (None: no langid label)
_DATATROVE_STOP_WORDS = frozenset({"en", None})


def language_stop_words(language: str | None) -> frozenset[str] | None:
    """The default stop words of a page labelled `language`: datatrove's list for English (so
    English decisions are datatrove's), the stopwords-iso list of the language otherwise, None
    when it has none (the rule does not apply).

    Of a stopwords-iso list only the entries that can match a word are kept: those holding a
    letter (its Chinese list holds "、" and "。", which every Chinese page has) that `split_words`
    leaves as one token on a page of that language (multi-word entries never match one).
    """
    if language in _DATATROVE_STOP_WORDS:
        return frozenset(STOP_WORDS)
    try:
        import stopwordsiso  # loaded by the first page of a language other than English
    except ImportError as e:
        raise ImportError(
            "gopher_quality: pages of languages other than English need their stop words: "
            f"pip install stopwordsiso==0.7.1 (pinned in pyproject.toml) ({e})"
        ) from None

    if not stopwordsiso.has_lang(language):
        return None
    return frozenset(
        w for w in stopwordsiso.stopwords(language) if any(map(str.isalpha, w)) and split_words(w, language) == [w]
    )


class GopherQuality(Filter):
    yaml_name = "gopher_quality"
    drop_reasons = (
        "gopher_short_doc",
        "gopher_long_doc",
        "gopher_below_avg_threshold",
        "gopher_above_avg_threshold",
        "gopher_too_many_hashes",
        "gopher_too_many_ellipsis",
        "gopher_too_many_bullets",
        "gopher_too_many_end_ellipsis",
        "gopher_below_alpha_threshold",
        "gopher_enough_stop_words",
    )

    class Config(FilterConfig):
        """Each threshold, when null or 0, disables its rule (as in datatrove).

        `max_non_alpha_words_ratio` is, despite its name, the minimum share of words holding a
        letter (datatrove's name, kept so configs carry over).
        """

        min_doc_words: int | None = Field(50, ge=0, description="fewest words (punctuation-only tokens not counted)")
        max_doc_words: int | None = Field(100000, ge=0, description="most words")
        min_avg_word_length: float | None = Field(3, ge=0, description="smallest mean word length, characters")
        max_avg_word_length: float | None = Field(10, ge=0, description="largest mean word length, characters")
        max_symbol_word_ratio: float | None = Field(0.1, ge=0, description="most `#` and most ellipses per word")
        max_bullet_lines_ratio: float | None = Field(
            0.9, ge=0, description="most share of lines starting with a bullet"
        )
        max_ellipsis_lines_ratio: float | None = Field(
            0.3, ge=0, description="most share of lines ending with an ellipsis"
        )
        max_non_alpha_words_ratio: float | None = Field(0.8, ge=0, description="least share of words holding a letter")
        alpha_words: Literal["tokens", "whitespace"] = Field(
            "tokens",
            description="words of the letter-share rule: `tokens` (datatrove: words and punctuation "
            "tokens), `whitespace` (the paper: whitespace-separated words)",
            json_schema_extra=OMIT_DEFAULT,
        )
        min_stop_words: int | None = Field(2, ge=0, description="fewest stop words present")
        stop_words: list[str] | None = Field(
            None,
            description="stop-word list for every language (default: the "
            "page's language's: datatrove's for English, stopwords-iso's for "
            "others; a language without a list skips the rule)",
        )

    thresholds = (
        Threshold("min_doc_words", "min", integer=True, length=True),
        Threshold("max_doc_words", "max", integer=True, length=True),
        Threshold("min_avg_word_length", "min"),
        Threshold("max_avg_word_length", "max"),
        Threshold("max_non_alpha_words_ratio", "min"),
        Threshold("min_stop_words", "min", integer=True),
        Threshold("max_bullet_lines_ratio", "max"),
        Threshold("max_ellipsis_lines_ratio", "max"),
    )

    #: a long page's distinct words and their counts, and a piece's words at a time (measured:
    #: 30, 44 and 53 MB over 2, 8 and 30 MB pages, docs/scale.md "Large records")
    document_factor = 1.0
    document_fixed = 40 << 20

    def __init__(self, config: Config | None = None, /, **kwargs):
        super().__init__(config, **kwargs)
        # stop words by language, filled on first use of each (the lists are per config: a
        # language's per_language may give its own)
        self._stop_words: dict[str | None, frozenset[str] | None] = {}

    def stop_words_for(self, language: str | None, c: Config) -> frozenset[str] | None:
        try:
            return self._stop_words[language]
        except KeyError:
            given = c.stop_words
            words = frozenset(given) if given is not None else language_stop_words(language)
            self._stop_words[language] = words
            return words

    def statistics(self, text: str, language: str | None, c: Config) -> dict[str, float | None]:
        """Each rule's statistic, from the counts `filter` decides on (the same C functions)."""
        words = page_words(text, language)
        n_words, n_content, content_chars, n_alpha = words.quality_counts()
        n_lines, bullets, ellipses = line_counts(text)
        if c.alpha_words == "whitespace":
            n_spaced, n_lettered = spaced_word_counts(text)
            alpha = n_lettered / n_spaced if n_spaced else 0.0
        else:
            alpha = n_alpha / n_words if n_words else None
        stop_words = self.stop_words_for(language, c)
        return {
            "min_doc_words": float(n_content),
            "max_doc_words": float(n_content),
            "min_avg_word_length": content_chars / n_content if n_content else None,
            "max_avg_word_length": content_chars / n_content if n_content else None,
            "max_non_alpha_words_ratio": alpha,
            "min_stop_words": float(words.present(stop_words)) if stop_words is not None else None,
            "max_bullet_lines_ratio": bullets / n_lines if n_lines else None,
            "max_ellipsis_lines_ratio": ellipses / n_lines if n_lines else None,
        }

    def filter(self, doc: Document, c: Config) -> FilterResult:
        language = doc.metadata.get("language")
        text = doc.text
        # the lid label picks ICU words for Chinese, Japanese, Thai, Lao, Khmer and Burmese pages;
        # the words are numbered and counted once for both Gopher filters (`page_words`, in C):
        # "symbol words" consist only of punctuation (PUNCTUATION_SET) and count towards neither
        # the document length nor the mean word length; n_alpha counts words holding a letter
        words = page_words(text, language)
        n_words, n_content, content_chars, n_alpha = words.quality_counts()

        if c.min_doc_words and n_content < c.min_doc_words:
            return False, "gopher_short_doc"
        if c.max_doc_words and n_content > c.max_doc_words:
            return False, "gopher_long_doc"
        if not n_words:
            # Only reachable with min_doc_words disabled; datatrove divides by zero here.
            return False, "gopher_short_doc"

        # datatrove's np.mean of no words is NaN, which passes both bounds.
        avg_word_length = content_chars / n_content if n_content else float("nan")
        if c.min_avg_word_length and avg_word_length < c.min_avg_word_length:
            return False, "gopher_below_avg_threshold"
        if c.max_avg_word_length and avg_word_length > c.max_avg_word_length:
            return False, "gopher_above_avg_threshold"

        if c.max_symbol_word_ratio and text.count("#") / n_words > c.max_symbol_word_ratio:
            return False, "gopher_too_many_hashes"
        if c.max_symbol_word_ratio and (text.count("...") + text.count("…")) / n_words > c.max_symbol_word_ratio:
            return False, "gopher_too_many_ellipsis"

        # of str.splitlines()'s lines, those starting with "•" or "-" once left-stripped, and those
        # ending with "..." or "…" once right-stripped (counted in C, no list of the lines)
        if c.max_bullet_lines_ratio or c.max_ellipsis_lines_ratio:
            n_lines, bullets, ellipses = line_counts(text)
            if c.max_bullet_lines_ratio and bullets / n_lines > c.max_bullet_lines_ratio:
                return False, "gopher_too_many_bullets"
            if c.max_ellipsis_lines_ratio and ellipses / n_lines > c.max_ellipsis_lines_ratio:
                return False, "gopher_too_many_end_ellipsis"

        if c.max_non_alpha_words_ratio:
            if c.alpha_words == "whitespace":  # str.split()'s words, and those holding a letter
                n_spaced, n_lettered = spaced_word_counts(text)
                ratio = n_lettered / n_spaced if n_spaced else 0.0
            else:
                ratio = n_alpha / n_words
            if ratio < c.max_non_alpha_words_ratio:
                return False, "gopher_below_alpha_threshold"

        if c.min_stop_words:
            stop_words = self.stop_words_for(language, c)
            if stop_words is not None and words.present(stop_words) < c.min_stop_words:
                return False, "gopher_enough_stop_words"

        return True
