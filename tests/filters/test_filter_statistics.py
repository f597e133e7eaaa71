"""A filter's statistics are the ones it decides on: for every threshold a calibrated filter
declares, on every page of the real sample, the filter with only that rule on drops the page
exactly when the statistic `Filter.statistics` reports (which `pipeline calibrate` reads) is
past the bound. Bounds at the sample's quartiles, so both sides of each rule are exercised."""

from __future__ import annotations

import statistics

import pytest
from datatrove.data import Document

from gristmill.core.step import registered_steps
from gristmill.filters.c4_lines import C4Lines
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition
from gristmill.pipeline.calibration.calibrate import RULES, _statistics
from gristmill.pipeline.calibration.rules import STEP_DEFAULTS

from .test_heuristics import read_wet

#: every rule of the three filters off: each test turns one on (test_calibrate.py's too)
RULES_OFF = {
    "gopher_quality": dict(
        min_doc_words=None,
        max_doc_words=None,
        min_avg_word_length=None,
        max_avg_word_length=None,
        max_symbol_word_ratio=None,
        max_bullet_lines_ratio=None,
        max_ellipsis_lines_ratio=None,
        max_non_alpha_words_ratio=None,
        min_stop_words=None,
    ),
    "gopher_repetition": dict(
        dup_line_frac=None,
        dup_para_frac=None,
        dup_line_char_frac=None,
        dup_para_char_frac=None,
        top_n_grams=(),
        dup_n_grams=(),
    ),
    "c4_lines": dict(
        min_num_sentences=-1,
        min_words_per_line=-1,
        filter_lorem_ipsum=False,
        filter_curly_bracket=False,
        min_paragraph_words=-1,
    ),
}
STEPS = {"gopher_quality": GopherQuality, "gopher_repetition": GopherRepetition, "c4_lines": C4Lines}


@pytest.fixture(scope="module")
def pages(wet_files) -> list[tuple[str, str]]:
    texts = [t for path in wet_files for t in read_wet(path) if t][::3]  # 203 of the 609 pages, both files
    # WET text has no blank lines: pages whose paragraphs repeat, made of its own lines
    repeated = ["\n\n".join(t.splitlines()[: 2 + i % 5] * (1 + i % 3)) for i, t in enumerate(texts[:40])]
    return [(t, "en") for t in texts + repeated] + [(t, "zh") for t in texts[:30]]  # zh: ICU's words


def _one_rule(step: str, param: str, n: int | None, bound):
    params = dict(RULES_OFF[step])
    params[param] = ((n, bound),) if n is not None else bound
    return STEPS[step](**params)


@pytest.mark.parametrize("step", sorted(STEPS))
def test_every_declared_threshold_is_decided_on_the_statistic_the_filter_reports(pages, step):
    cls = registered_steps()[step]
    assert cls is STEPS[step] and cls.thresholds
    reporter = cls()
    for threshold in cls.thresholds:
        checked = 0
        values = [reporter.statistics(text, lang, cls.Config())[threshold.name] for text, lang in pages]
        flat = [v for vs in values if vs is not None for v in (vs if isinstance(vs, list) else [vs])]
        assert len(set(flat)) > 3, f"{threshold.name}: the sample gives no spread to test with"
        for q in [*statistics.quantiles(flat, n=4), max(flat) / 2]:
            bound = round(q) if threshold.integer else q
            if not bound or (threshold.integer and bound < 1):  # 0 switches a rule off
                continue
            f = _one_rule(step, threshold.param, threshold.n, bound)
            for text, lang in pages:
                value = f.statistics(text, lang, f.config)[threshold.name]  # with the filter's own settings
                doc = Document(text=text, id="x", metadata={"language": lang})
                if threshold.lines:  # a per-line rule drops lines: those its statistic puts below
                    walk = f._walk(text, lang, f.config)
                    below = sum(v < bound for v in value)
                    assert walk.line_drops["line-filter-too_few_words"] == below, (threshold.name, text[:80])
                    continue
                kept = f.filter(doc, f.config) is True
                if value is None:  # the rule does not apply: the filter keeps the page on it
                    continue
                past = value < bound if threshold.kind == "min" else value > bound
                assert kept == (not past), (threshold.name, bound, value, text[:80])
            checked += 1
        assert checked, f"{threshold.name}: no bound of the sample's spread was checked"


def test_calibration_reads_the_filters_own_statistics(pages):
    """`pipeline calibrate`'s rules are the filters' declared thresholds (none named twice,
    none of its own), and the statistic it reads is the filter's for its defaults."""
    declared = {f"{s}.{t.name}" for s in STEPS for t in registered_steps()[s].thresholds}
    assert {r.name for r in RULES} <= declared and len({r.name for r in RULES}) == len(RULES) >= 20
    for text, lang in pages[:100]:
        for rule in RULES:
            ours = STEPS[rule.step]().statistics(text, lang, STEP_DEFAULTS[rule.step])[rule.threshold.name]
            assert rule.stat(text, lang) == ours == _statistics(rule.step, text, lang)[rule.threshold.name]
