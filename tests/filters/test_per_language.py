"""`per_language`: every filter's parameters by the page's language, validated by the step's own
Config, resolved once per language; `calibration:` merges a file of them under the config's."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml
from datatrove.data import Document

from gristmill.config import ConfigError, from_dict
from gristmill.filters.c4_lines import C4Lines
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition
from gristmill.filters.langid import LangId
from gristmill.input.wet import WetReader


@pytest.fixture(scope="module")
def labelled(wet_files, lid_model) -> list[tuple[str, str, dict]]:
    """Every sample page with langid's label and score (nothing dropped)."""
    lid = LangId(model=str(lid_model), languages=None, min_score=0.0)
    return [(d.text, d.id, dict(d.metadata)) for d in lid.run(WetReader([str(p) for p in wet_files]).run())]


def pages(labelled, language, min_score=0.65):
    return [
        Document(text=t, id=i, metadata=dict(m))
        for t, i, m in labelled
        if m["language"] == language and m["language_score"] >= min_score
    ]


def run_config(steps, **extra):
    return from_dict({"input": {"paths": ["x.warc.wet.gz"]}, "steps": steps, **extra})


def test_bad_per_language_entries_are_one_line_each_naming_step_language_and_key():
    with pytest.raises(ConfigError) as e:
        run_config(
            [
                {"langid": {"per_language": {"zh": {"model": "other.ftz", "min_score": 2}}}},
                {
                    "gopher_quality": {
                        "per_language": {
                            "zh": {"min_avg_word_lenght": 1, "max_doc_words": "lots"},
                            "chinese": {"min_doc_words": 10},
                            "fa": 3,
                            "ja": {"per_language": {}},
                        }
                    }
                },
            ]
        )
    lines = str(e.value).splitlines()[1:]
    assert sorted(line.strip() for line in lines) == sorted(
        [
            "steps[0].langid.per_language.zh.model: the same for every language in this step; set it at the top level",
            "steps[0].langid.per_language.zh.min_score: expected a number between 0 and 1, got 2",
            "steps[1].gopher_quality.per_language.zh.min_avg_word_lenght: unknown key (allowed: min_doc_words, "
            "max_doc_words, min_avg_word_length, max_avg_word_length, max_symbol_word_ratio, max_bullet_lines_ratio, "
            "max_ellipsis_lines_ratio, max_non_alpha_words_ratio, alpha_words, min_stop_words, stop_words)",
            "steps[1].gopher_quality.per_language.zh.max_doc_words: input should be a valid integer, unable to parse "
            "string as an integer, got 'lots'",
            "steps[1].gopher_quality.per_language.chinese: "
            "not a lid.176 language label (e.g. en, zh, fa) nor `default`",
            "steps[1].gopher_quality.per_language.fa: expected a mapping of parameters, got 3",
            "steps[1].gopher_quality.per_language.ja.per_language: cannot be nested",
        ]
    )


def test_a_language_gets_its_values_then_default_then_the_top_level():
    flt = GopherQuality(
        min_doc_words=40,
        per_language={"default": {"min_stop_words": 0, "min_doc_words": 30}, "zh": {"min_avg_word_length": 1}},
    )
    zh, fa, en = flt.config_for("zh"), flt.config_for("fa"), flt.config_for("en")
    assert (zh.min_avg_word_length, zh.min_stop_words, zh.min_doc_words) == (1, 0, 30)
    assert (fa.min_avg_word_length, fa.min_stop_words, fa.min_doc_words) == (3, 0, 30)
    assert en is fa and flt.config_for(None) is fa  # `default` is every language not listed
    assert flt.config.min_doc_words == 40  # the step's own Config is left as given
    plain = GopherQuality(min_doc_words=40, per_language={"zh": {"min_avg_word_length": 1}})
    assert plain.config_for("en") is plain.config and plain.config_for("en").min_doc_words == 40
    # resolved once, when the step is built; workers get the step by pickle
    again = pickle.loads(pickle.dumps(flt))
    assert again.config_for("zh") == zh and again.config_for("de") == fa


def test_chinese_sample_pages_pass_the_word_length_rule_with_a_chinese_threshold(labelled):
    zh = pages(labelled, "zh")
    assert len(zh) >= 5
    before = GopherQuality().filter_batch(zh)
    # ICU's Chinese words average under 3 characters: every page fails English's threshold
    assert before == [(False, "gopher_below_avg_threshold")] * len(zh)
    flt = GopherQuality(per_language={"zh": {"min_avg_word_length": 1}})
    after = flt.filter_batch(zh)
    # past that rule, each page meets the later ones (alpha share, stop words)
    assert all(r != (False, "gopher_below_avg_threshold") for r in after)
    later = {
        "gopher_too_many_hashes",
        "gopher_too_many_ellipsis",
        "gopher_too_many_bullets",
        "gopher_too_many_end_ellipsis",
        "gopher_below_alpha_threshold",
        "gopher_enough_stop_words",
    }
    assert all(r is True or r[1] in later for r in after)


def test_english_decisions_and_text_do_not_change_with_other_languages_settings(labelled):
    en = pages(labelled, "en")
    others = {"zh": {"min_avg_word_length": 1}, "fa": {"min_stop_words": 0}, "de": {"max_doc_words": 10}}
    for cls, per in (
        (GopherQuality, others),
        (GopherRepetition, {"zh": {"dup_line_frac": 0.5}}),
        (C4Lines, {"ja": {"min_words_per_line": 1}}),
    ):
        a = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in en]
        b = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in en]
        plain, tuned = cls(), cls(per_language=per)
        assert plain.filter_batch(a) == tuned.filter_batch(b)
        assert [d.text for d in a] == [d.text for d in b]


def test_langid_min_score_per_language(labelled, lid_model):
    docs = [Document(text=t, id=i) for t, i, m in labelled if m["language"] in ("zh", "en")]
    lid = LangId(model=str(lid_model), languages=["zh", "en"], min_score=0.65, per_language={"zh": {"min_score": 0.99}})
    results = lid.filter_batch(docs)
    zh = [(r, d.metadata["language_score"]) for r, d in zip(results, docs) if d.metadata["language"] == "zh"]
    en = [(r, d.metadata["language_score"]) for r, d in zip(results, docs) if d.metadata["language"] == "en"]
    assert all((r is True) == (s >= 0.99) for r, s in zh)
    assert any(r is not True and s >= 0.65 for r, s in zh)  # kept at 0.65, dropped at 0.99
    assert all((r is True) == (s >= 0.65) for r, s in en)


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_calibration_file_is_merged_under_the_steps_own_per_language(tmp_path):
    cal = write(
        tmp_path / "cal.yaml",
        {
            "gopher_quality": {
                "per_language": {
                    "zh": {"min_avg_word_length": 1, "min_doc_words": 20},
                    "fa": {"max_non_alpha_words_ratio": 0.5},
                }
            },
            "c4_lines": {"per_language": {"zh": {"min_words_per_line": 2}}},  # not in this run: ignored
        },
    )
    cfg = run_config(
        [{"gopher_quality": {"per_language": {"zh": {"min_doc_words": 30}}}}, "gopher_repetition"], calibration=str(cal)
    )
    per = cfg.specs[0].params.per_language
    assert per == {"zh": {"min_avg_word_length": 1, "min_doc_words": 30}, "fa": {"max_non_alpha_words_ratio": 0.5}}
    resolved = cfg.resolved()
    assert resolved["calibration"] == str(cal)
    assert resolved["steps"][0]["gopher_quality"]["per_language"] == per  # the values run, in config.yaml
    assert "per_language" not in resolved["steps"][1]["gopher_repetition"]
    flt = GopherQuality(cfg.specs[0].params)
    assert flt.config_for("zh").min_doc_words == 30 and flt.config_for("zh").min_avg_word_length == 1


def test_a_config_without_the_new_parameters_resolves_as_before():
    """config.yaml of a run made before per_language, alpha_words and end_punctuation existed
    equals this version's when they keep their defaults, so such a run directory resumes."""
    resolved = run_config(["gopher_quality", {"langid": {}}, "c4_lines"]).resolved()
    assert "calibration" not in resolved
    new = {"per_language", "alpha_words", "end_punctuation"}
    assert all(not new & set(params) for entry in resolved["steps"] for params in entry.values())
    resolved = run_config(
        [{"gopher_quality": {"alpha_words": "whitespace"}}, {"c4_lines": {"end_punctuation": ["."]}}]
    ).resolved()
    assert resolved["steps"][0]["gopher_quality"]["alpha_words"] == "whitespace"
    assert resolved["steps"][1]["c4_lines"]["end_punctuation"] == ["."]


def test_bad_calibration_files_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"calibration: .*nope.yaml: No such file"):
        run_config(["gopher_quality"], calibration=str(tmp_path / "nope.yaml"))
    bad = write(tmp_path / "bad.yaml", {"gopher_qualty": {"per_language": {}}})
    with pytest.raises(ConfigError, match=r"calibration: .*bad.yaml: unknown step 'gopher_qualty'"):
        run_config(["gopher_quality"], calibration=str(bad))
    bad = write(tmp_path / "bad2.yaml", {"gopher_quality": {"zh": {"min_doc_words": 1}}})
    with pytest.raises(ConfigError, match=r"bad2.yaml: gopher_quality: expected `per_language:"):
        run_config(["gopher_quality"], calibration=str(bad))
    bad = write(tmp_path / "bad3.yaml", {"gopher_quality": {"per_language": {"zh": {"min_doc_word": 1}}}})
    with pytest.raises(ConfigError, match=r"steps\[0\].gopher_quality.per_language.zh.min_doc_word: unknown key"):
        run_config(["gopher_quality"], calibration=str(bad))


def test_a_plugin_filter_gets_its_documents_language_config():
    """A plugin's filter written as docs/architecture.md shows (a FilterConfig, `filter(doc,
    config)`) is handed the Config of each document's language; the step's own never changes."""
    from pydantic import Field

    from gristmill.core.configlib import FilterConfig
    from gristmill.core.filter import Filter

    seen = []

    class FewLines(Filter):
        step_name = "test_few_lines"

        class Config(FilterConfig):
            min_lines: int = Field(3, ge=1)

        def filter(self, doc, config):
            seen.append((config.min_lines, self.config.min_lines))
            n = sum(1 for line in doc.text.splitlines() if line.strip())
            return True if n >= config.min_lines else (False, "too_few_lines")

    flt = FewLines(per_language={"zh": {"min_lines": 1}, "default": {"min_lines": 2}})
    docs = [
        Document(text="一行", id="a", metadata={"language": "zh"}),
        Document(text="one\ntwo", id="b", metadata={"language": "en"}),
        Document(text="one", id="c", metadata={"language": "de"}),
        Document(text="one", id="d"),
    ]
    assert flt.filter_batch(docs) == [True, True, (False, "too_few_lines"), (False, "too_few_lines")]
    assert seen == [(1, 3), (2, 3), (2, 3), (2, 3)]  # the language's config given; self.config the step's
    assert flt.config.min_lines == 3 and flt.config.per_language
    with pytest.raises(ValueError, match=r"per_language.zh.min_lines"):
        FewLines(per_language={"zh": {"min_lines": 0}})
    assert list(FewLines(min_lines=1).run(iter(docs))) == docs


def test_a_filter_config_without_per_language_is_refused_when_the_class_is_made():
    from gristmill.core.configlib import Strict
    from gristmill.core.filter import Filter

    with pytest.raises(TypeError, match=r"OldStyle.Config: a filter's Config must subclass .*FilterConfig"):

        class OldStyle(Filter):
            step_name = "test_old_style"

            class Config(Strict):
                min_lines: int = 3

            def filter(self, doc, config):
                return True


def test_per_language_follows_the_parameters_it_overrides_in_config_yaml_and_errors():
    """FilterConfig declares per_language, so pydantic lists it first; what a user reads (the
    run's config.yaml, an unknown key's allowed list) names the filter's own parameters first."""
    cfg = run_config([{"c4_lines": {"per_language": {"th": {"filter_no_terminal_punct": False}}}}])
    keys = list(cfg.resolved()["steps"][0]["c4_lines"])
    assert keys[0] == "split_paragraph" and keys[-1] == "per_language"
    with pytest.raises(ConfigError) as e:
        run_config([{"quality": {"min_scor": 0.5}}])
    allowed = "model, label, min_score, max_chars, per_language"
    assert f"steps[0].quality.min_scor: unknown key (allowed: {allowed})" in str(e.value)
