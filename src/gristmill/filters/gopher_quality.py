"""Gopher's quality rules (Rae et al. 2021, https://arxiv.org/abs/2112.11446), as datatrove's
GopherQualityFilter: same parameters, defaults, order of rules and drop reasons.

Faster in two ways: words come from our regex tokenizer instead of spaCy (see words.py), and
the per-word statistics are computed once per distinct word (a Counter, built in C) rather
than once per occurrence in several list comprehensions and a numpy mean.
"""

from __future__ import annotations

from collections import Counter
from operator import methodcaller

from datatrove.data import Document
from datatrove.pipeline.filters.gopher_quality_filter import STOP_WORDS

from gristmill.filters.base import Filter, FilterResult
from gristmill.filters.words import PUNCTUATION_CHARS, split_words
from gristmill.pipeline.writers import DroppedSampler

_starts_with_bullet = methodcaller("startswith", ("•", "-"))
_ends_with_ellipsis = methodcaller("endswith", ("...", "…"))


class GopherQuality(Filter):
    yaml_name = "gopher_quality"

    def __init__(
        self,
        step_id: str | None = None,
        dropped: DroppedSampler | None = None,
        *,
        min_doc_words: int | None = 50,
        max_doc_words: int | None = 100000,
        min_avg_word_length: int | None = 3,
        max_avg_word_length: int | None = 10,
        max_symbol_word_ratio: float | None = 0.1,
        max_bullet_lines_ratio: float | None = 0.9,
        max_ellipsis_lines_ratio: float | None = 0.3,
        max_non_alpha_words_ratio: float | None = 0.8,
        min_stop_words: int | None = 2,
        stop_words: list[str] | None = None,
    ):
        """Each threshold, when None or 0, disables its rule (as in datatrove).

        max_non_alpha_words_ratio is, despite its name, the minimum share of words holding a
        letter (datatrove's name, kept so configs carry over).
        """
        super().__init__(step_id, dropped)
        self.min_doc_words = min_doc_words
        self.max_doc_words = max_doc_words
        self.min_avg_word_length = min_avg_word_length
        self.max_avg_word_length = max_avg_word_length
        self.max_symbol_word_ratio = max_symbol_word_ratio
        self.max_bullet_lines_ratio = max_bullet_lines_ratio
        self.max_ellipsis_lines_ratio = max_ellipsis_lines_ratio
        self.max_non_alpha_words_ratio = max_non_alpha_words_ratio
        self.min_stop_words = min_stop_words
        self.stop_words = frozenset(STOP_WORDS if stop_words is None else stop_words)

    def filter(self, doc: Document) -> FilterResult:
        text = doc.text
        words = split_words(text)
        n_words = len(words)

        # One pass over distinct words: "symbol words" consist only of punctuation and count
        # towards neither the document length nor the mean word length.
        counts = Counter(words)
        n_content = content_chars = n_alpha = 0
        for word, count in counts.items():
            if word.strip(PUNCTUATION_CHARS):
                n_content += count
                content_chars += len(word) * count
            if word.isalpha() or any(map(str.isalpha, word)):  # all letters, or any letter
                n_alpha += count

        if self.min_doc_words and n_content < self.min_doc_words:
            return False, "gopher_short_doc"
        if self.max_doc_words and n_content > self.max_doc_words:
            return False, "gopher_long_doc"
        if not n_words:
            # Only reachable with min_doc_words disabled; datatrove divides by zero here.
            return False, "gopher_short_doc"

        # datatrove's np.mean of no words is NaN, which passes both bounds.
        avg_word_length = content_chars / n_content if n_content else float("nan")
        if self.min_avg_word_length and avg_word_length < self.min_avg_word_length:
            return False, "gopher_below_avg_threshold"
        if self.max_avg_word_length and avg_word_length > self.max_avg_word_length:
            return False, "gopher_above_avg_threshold"

        if self.max_symbol_word_ratio and text.count("#") / n_words > self.max_symbol_word_ratio:
            return False, "gopher_too_many_hashes"
        if (
            self.max_symbol_word_ratio
            and (text.count("...") + text.count("…")) / n_words > self.max_symbol_word_ratio
        ):
            return False, "gopher_too_many_ellipsis"

        # per line, at C speed: map/sum over str methods instead of a generator
        lines = text.splitlines()
        if self.max_bullet_lines_ratio:
            bullets = sum(map(_starts_with_bullet, map(str.lstrip, lines)))
            if bullets / len(lines) > self.max_bullet_lines_ratio:
                return False, "gopher_too_many_bullets"
        if self.max_ellipsis_lines_ratio:
            ellipses = sum(map(_ends_with_ellipsis, map(str.rstrip, lines)))
            if ellipses / len(lines) > self.max_ellipsis_lines_ratio:
                return False, "gopher_too_many_end_ellipsis"

        if self.max_non_alpha_words_ratio and n_alpha / n_words < self.max_non_alpha_words_ratio:
            return False, "gopher_below_alpha_threshold"

        if self.min_stop_words and sum(w in counts for w in self.stop_words) < self.min_stop_words:
            return False, "gopher_enough_stop_words"

        return True
