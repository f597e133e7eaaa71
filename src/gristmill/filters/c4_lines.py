"""C4's line rules (Raffel et al. 2020), as datatrove's C4QualityFilter: same parameters,
defaults, rules, drop reasons and line stats; kept documents get the kept lines as text.

Differences from datatrove, both for speed:

* sentences are counted with our regex splitter (words.split_sentences), not nltk punkt, so
  `too_few_sentences` decisions may differ for documents near the threshold (punkt knows
  abbreviations); with split_paragraph=False the same splitter cuts the document;
* line stats are added once per document (`stat_update(label, value=lines)`) instead of once
  per line: the totals are the same, but a stat's n/mean are per document, not per line.
"""

from __future__ import annotations

import re
from collections import Counter

from datatrove.data import Document
from datatrove.pipeline.filters.c4_filters import CITATION_REGEX, ELLIPSIS, END_PUNCTUATION, POLICY_SUBSTRINGS

from gristmill.filters.base import Filter, FilterResult
from gristmill.filters.words import split_sentences
from gristmill.pipeline.writers import DroppedSampler

_POLICY = re.compile("|".join(map(re.escape, POLICY_SUBSTRINGS)))


class C4Lines(Filter):
    yaml_name = "c4_lines"

    def __init__(
        self,
        step_id: str | None = None,
        dropped: DroppedSampler | None = None,
        *,
        split_paragraph: bool = True,
        remove_citations: bool = True,
        filter_no_terminal_punct: bool = True,
        min_num_sentences: int = 5,
        min_words_per_line: int = 3,
        max_word_length: int = 1000,
        filter_lorem_ipsum: bool = True,
        filter_javascript: bool = True,
        filter_curly_bracket: bool = True,
        filter_policy: bool = True,
    ):
        """As datatrove's C4QualityFilter; -1 disables the numeric rules.

        split_paragraph: True (C4) applies the line rules to lines; False to sentences, which
        are then joined with spaces.
        """
        super().__init__(step_id, dropped)
        self.split_paragraph = split_paragraph
        self.remove_citations = remove_citations
        self.filter_no_terminal_punct = filter_no_terminal_punct
        self.min_num_sentences = min_num_sentences
        self.min_words_per_line = min_words_per_line
        self.max_word_length = max_word_length
        self.filter_lorem_ipsum = filter_lorem_ipsum
        self.filter_javascript = filter_javascript
        self.filter_curly_bracket = filter_curly_bracket
        self.filter_policy = filter_policy

    def filter(self, doc: Document) -> FilterResult:
        lines = doc.text.splitlines() if self.split_paragraph else split_sentences(doc.text)
        max_len = self.max_word_length
        kept: list[str] = []
        line_drops = Counter()  # lines dropped, by rule, for the stats
        num_sentences = 0
        result: FilterResult = True
        n_lines = 0  # lines looked at: all, or up to the one that drops the document

        for n_lines, line in enumerate(lines, 1):
            line = uncited = line.strip()
            # a word longer than max_len needs a line longer than max_len: split only those
            if max_len != -1 and len(line) > max_len and any(len(w) > max_len for w in line.split()):
                line_drops["line-filter-too_long_word"] += 1
                continue
            if self.remove_citations and "[" in line:  # every citation starts with "["
                line = CITATION_REGEX.sub("", line)
            if self.filter_no_terminal_punct and (
                not line.endswith(END_PUNCTUATION) or line.endswith(ELLIPSIS)
            ):
                line_drops["line-filter-no_terminal_punc"] += 1
                continue
            if len(uncited.split()) < self.min_words_per_line:  # words counted before citations go
                line_drops["line-filter-too_few_words"] += 1
                continue
            line_l = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in line_l:
                result = False, "lorem_ipsum"
                break
            if self.filter_javascript and "javascript" in line_l:
                line_drops["line-filter-javascript"] += 1
                continue
            if self.filter_curly_bracket and "{" in line:
                result = False, "curly_bracket"
                break
            if self.filter_policy and _POLICY.search(line_l):
                line_drops["line-filter-policy"] += 1
                continue
            if self.min_num_sentences != -1:
                num_sentences += len(split_sentences(line)) if self.split_paragraph else 1
            kept.append(line)

        if n_lines:
            self.stat_update("line-total", value=n_lines)
        for label, value in line_drops.items():
            self.stat_update(label, value=value)
        if kept:
            self.stat_update("line-kept", value=len(kept))
        if result is not True:
            return result
        if num_sentences < self.min_num_sentences:
            return False, "too_few_sentences"
        doc.text = ("\n" if self.split_paragraph else " ").join(kept).strip()
        return True
