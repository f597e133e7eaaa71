"""`pipeline calibrate`: per-language thresholds that remove the same share of a language's
reference text (UDHR) as the English defaults remove of English reference text."""

from __future__ import annotations

import math
import random
import string
import zipfile
from pathlib import Path

import pytest
import yaml
from datatrove.data import Document

from gristmill.cli import main
from gristmill.config import from_dict
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition
from gristmill.pipeline.calibration.calibrate import (
    _values,
    calibrate,
    calibration_table,
    chunks,
    read_udhr,
    removed_share,
)
from tests.filters.test_filter_statistics import RULES_OFF as _OFF

REPO = Path(__file__).resolve().parents[2]
LANGS = ["zh", "ja", "ar", "fa", "ru", "hi", "de"]


@pytest.fixture(scope="module")
def udhr_zip(shared_data) -> Path:
    return shared_data / "corpus" / "multi" / "udhr2.zip"


@pytest.fixture(scope="module")
def references(udhr_zip) -> dict[str, list[str]]:
    return {lang: chunks(text) for lang, text in read_udhr(udhr_zip, LANGS, 64 << 20).items()}


@pytest.fixture(scope="module")
def results(references):
    return calibrate({k: v for k, v in references.items() if k != "en"}, references["en"])


def test_udhr_is_cut_into_its_preamble_and_articles(references):
    en = references["en"]
    assert len(en) == 31  # the preamble and 30 articles: one document per language would be no distribution
    assert en[0].startswith("Universal Declaration of Human Rights\nPreamble")
    assert [c.split("\n")[0] for c in en[1:]] == [f"Article {i}" for i in range(1, 31)]
    assert "Everyone charged with a penal offence" in en[11] and "No one shall be held guilty" in en[11]
    for lang in LANGS:
        assert 29 <= len(references[lang]) <= 34, lang


# the filter with only the calibrated rule on, to check that the statistic is the filter's own
_STEPS = {"gopher_quality": GopherQuality, "gopher_repetition": GopherRepetition}


def only(rule, threshold):
    params = dict(_OFF[rule.step])
    params[rule.param] = [(rule.n, threshold)] if rule.n is not None else threshold
    return _STEPS[rule.step](**params)


def test_each_threshold_removes_from_the_filter_what_the_calibration_says(results, references):
    checked = 0
    for r in results:
        if r.rule.step not in _STEPS:
            continue
        flt = only(r.rule, r.threshold)
        docs = [
            Document(text=t, id=str(i), metadata={"language": r.language}) for i, t in enumerate(references[r.language])
        ]
        dropped = sum(result is not True for result in flt.filter_batch(docs))
        values = _values(r.rule, references[r.language], r.language)
        assert dropped / len(docs) == pytest.approx(removed_share(r.rule, values, r.threshold)), (
            r.rule.name,
            r.language,
        )
        assert r.share == pytest.approx(dropped / len(docs))
        if not r.rule.length:
            # the same share as English loses, to within one document
            assert abs(r.share - r.english_share) <= 1 / len(docs) + 1e-9, (r.rule.name, r.language)
        checked += 1
    assert checked >= 17 * (len(LANGS) - 1)


def test_english_defaults_remove_what_the_calibration_reports(results, references):
    for r in results:
        if r.rule.step in _STEPS and not r.rule.length:
            flt = only(r.rule, r.default)
            en = [Document(text=t, id=str(i), metadata={"language": "en"}) for i, t in enumerate(references["en"])]
            dropped = sum(result is not True for result in flt.filter_batch(en))
            assert dropped / len(en) == pytest.approx(r.english_share), r.rule.name


def test_chinese_and_japanese_words_get_their_own_length_bounds(results):
    got = {(r.rule.name, r.language): r.threshold for r in results}
    for lang in ("zh", "ja"):
        assert got[("gopher_quality.min_avg_word_length", lang)] < 2  # ICU words: mostly 1-2 characters
        assert got[("gopher_quality.max_avg_word_length", lang)] < 5
    # German words are longer than English ones: the bound scales up (and still removes no article)
    assert got[("gopher_quality.min_avg_word_length", "de")] > 3


def test_the_table_holds_what_differs_and_loads_as_calibration(results, tmp_path):
    table = calibration_table(results)
    assert set(table) <= {"gopher_quality", "gopher_repetition", "c4_lines"}
    for step in table.values():
        assert "en" not in step["per_language"]  # English decisions stay the defaults'
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(table))
    cfg = from_dict(
        {
            "input": {"paths": ["x"]},
            "calibration": str(path),
            "steps": ["gopher_quality", "gopher_repetition", "c4_lines"],
        }
    )
    zh = GopherQuality(cfg.specs[0].params).config_for("zh")
    assert zh.min_avg_word_length == table["gopher_quality"]["per_language"]["zh"]["min_avg_word_length"]
    en = GopherQuality(cfg.specs[0].params).config_for("en")
    assert en.model_dump(exclude={"per_language"}) == GopherQuality.Config().model_dump(exclude={"per_language"})


def _thresholds(table):
    for step in table.values():
        for params in step["per_language"].values():
            for name, value in params.items():
                yield from ((name, v) for _, v in value) if isinstance(value, list) else [(name, value)]


def test_shipped_calibration_loads_and_leaves_english_alone():
    path = REPO / "configs" / "calibration" / "udhr.yaml"
    table = yaml.safe_load(path.read_text())
    assert all("en" not in step["per_language"] for step in table.values())
    assert all(v > 0 for _, v in _thresholds(table))  # 0 would turn a rule off
    assert len(table["gopher_quality"]["per_language"]) >= 100
    cfg = from_dict(
        {
            "input": {"paths": ["x"]},
            "calibration": str(path),
            "steps": ["gopher_quality", "gopher_repetition", "c4_lines"],
        }
    )
    assert cfg.specs[0].params.per_language["zh"]["min_avg_word_length"] < 2


def test_cli_writes_the_file_and_refuses_bad_input(udhr_zip, tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "zh,ar", "-o", str(out)]) == 0
    table = yaml.safe_load(out.read_text())
    assert set(table["gopher_quality"]["per_language"]) == {"zh", "ar"}
    assert out.read_text().startswith("# Written by `pipeline calibrate`")
    assert main(["calibrate", "--udhr", str(tmp_path / "none.zip"), "-o", str(out)]) == 2
    assert "none.zip: not found" in capsys.readouterr().err
    assert main(["calibrate", "--udhr", str(udhr_zip), "--reference", "chinese=x.txt", "-o", str(out)]) == 2
    assert "--reference 'chinese=x.txt': expected LANG=FILE" in capsys.readouterr().err
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "xal", "-o", str(out)]) == 2
    assert "no reference text for xal" in capsys.readouterr().err


def test_user_reference_text_is_used(udhr_zip, tmp_path, references):
    # the Chinese UDHR given as a user's file: the same thresholds as from the zip
    ref = tmp_path / "zh.txt"
    ref.write_text("\n\n".join(references["zh"]))
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "zh", "-o", str(tmp_path / "a.yaml")]) == 0
    assert main(["calibrate", "--english", str(tmp_path / "en.txt"), "--reference", f"zh={ref}", "-o", str(out)]) == 2
    (tmp_path / "en.txt").write_text("\n\n".join(references["en"]))
    assert main(["calibrate", "--english", str(tmp_path / "en.txt"), "--reference", f"zh={ref}", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == yaml.safe_load((tmp_path / "a.yaml").read_text())


def test_multilingual_config_keeps_pages_of_other_languages_for_their_scripts_reasons(
    wet_files, lid_model, monkeypatch
):
    """configs/multilingual.yaml's language ID and heuristic filters on the sample: pages of
    other languages are kept, English pages are decided exactly as by configs/crawl.yaml (which
    has no fineweb_quality: multilingual.yaml's is off for English)."""
    from collections import Counter

    from gristmill.config import load
    from gristmill.core.step import registered_steps
    from gristmill.input.wet import WetReader

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("GRISTMILL_DATA", str(wet_files[0].parents[2]))

    def kept(config, **sets):
        cfg = load(config, [f"{k}={v}" for k, v in sets.items()])
        steps = [
            registered_steps()[s.name](s.params)
            for s in cfg.specs
            if s.name in ("langid", "gopher_quality", "gopher_repetition", "c4_lines", "fineweb_quality")
        ]
        data = WetReader([str(p) for p in wet_files]).run()
        for step in steps:
            data = step.run(data)
        return {d.id: (d.metadata["language"], d.text) for d in data}

    multi = kept("configs/multilingual.yaml")
    english = kept("configs/crawl.yaml")
    before = kept("configs/crawl.yaml", **{"steps[1].langid.languages": "null"})  # after url_filter
    by_lang = Counter(lang for lang, _ in multi.values())
    assert {k: v for k, v in multi.items() if v[0] == "en"} == english  # same pages, same text
    assert by_lang["ja"] >= 2 and by_lang["zh"] >= 1  # Japanese/Chinese: ICU word lengths, 。 ends a sentence
    assert sum(n for lang, n in by_lang.items() if lang != "en") > sum(1 for lang, _ in before.values() if lang != "en")


def test_no_threshold_turns_a_rule_off_when_a_statistic_is_mostly_zero(udhr_zip, shared_data, tmp_path):
    """WikiText as English reference: its repeated-n-gram shares are 0 on most paragraphs, as
    are the languages'; a ratio of medians of 0 must not make a threshold of 0."""
    out = tmp_path / "cal.yaml"
    wiki = shared_data / "corpus" / "en" / "wikitext-2.test.txt"
    assert (
        main(
            [
                "calibrate",
                "--udhr",
                str(udhr_zip),
                "--english",
                str(wiki),
                "--no-udhr-english",
                "--languages",
                "ar,de",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    values = list(_thresholds(yaml.safe_load(out.read_text())))
    assert values and all(v > 0 for _, v in values)


# --- hostile and unlucky references ------------------------------------------------------------


def _garbage(path: Path, kind: str) -> Path:
    """30 documents, blank-line separated, that are no language's clean text."""
    rng = random.Random(0)
    if kind == "digits":
        docs = [" ".join(str(rng.randint(0, 99999)) for _ in range(80)) for _ in range(30)]
    elif kind == "letters":  # words of random letters: no stop word of any language
        docs = [
            " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(80))
            + "."
            for _ in range(30)
        ]
    else:  # one line, over and over
        docs = ["\n".join(["spam spam spam eggs."] * 20) for _ in range(30)]
    path.write_text("\n\n".join(docs))
    return path


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("digits", "gopher_quality.per_language.de.max_non_alpha_words_ratio = 0.0: 0 switches the rule off"),
        ("letters", "gopher_quality.per_language.de.min_stop_words = 1: removes 73% of the de reference (over 50%)"),
        ("repeat", "gopher_repetition.per_language.de.top_n_grams (n=2) = 2.6291: a share never exceeds 1"),
    ],
)
def test_a_garbage_reference_is_refused_naming_the_key(udhr_zip, tmp_path, capsys, kind, named):
    ref = _garbage(tmp_path / f"{kind}.txt", kind)
    out = tmp_path / "cal.yaml"
    assert (
        main(["calibrate", "--udhr", str(udhr_zip), "--languages", "de", "--reference", f"de={ref}", "-o", str(out)])
        == 2
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --reference de={ref}: ") and named in line, line
    assert line.endswith("Is it de text, documents separated by blank lines?")
    assert not out.exists()


def test_an_odd_udhr_value_is_left_out_and_named(udhr_zip, tmp_path, capsys):
    """Croatian UDHR's 3-grams gave 1.1, a bound no share reaches (the rule off): that value
    alone is refused, and Croatian keeps the English default for it."""
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "hr,de", "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "refused: gopher_repetition.per_language.hr.top_n_grams (n=3) = 1.1 from --udhr "
        f"{udhr_zip} (udhr2/hrv.txt): a share never exceeds 1: the rule would never fire; hr keeps the default 0.18"
    ) in err
    assert "1 thresholds refused (above)" in err
    table = yaml.safe_load(out.read_text())
    assert dict(map(tuple, table["gopher_repetition"]["per_language"]["hr"]["top_n_grams"]))[3] == 0.18
    for step in table.values():
        for lang, params in step["per_language"].items():
            for name, value in params.items():
                for v in [x for _, x in value] if isinstance(value, list) else [value]:
                    assert v > 0, (lang, name)
                    if step is table.get("gopher_repetition") or name.endswith("_ratio"):
                        assert v < 1, (lang, name)  # a share's bound of 1 or more never fires


def test_rules_the_english_reference_trips_mostly_are_not_calibrated(udhr_zip, shared_data, tmp_path, capsys):
    """WikiText's `@-@` and `@,@` tokens fail the letter share in 93% of its paragraphs: matched,
    every language would lose 93% of its clean text to that rule."""
    out = tmp_path / "cal.yaml"
    wiki = shared_data / "corpus" / "en" / "wikitext-2.test.txt"
    args = ["calibrate", "--udhr", str(udhr_zip), "--english", str(wiki), "--no-udhr-english", "--languages", "ar,de"]
    assert main([*args, "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "not calibrated: gopher_quality.max_non_alpha_words_ratio: the English default removes 93% of the English "
        "reference (over 50%)"
    ) in err
    table = yaml.safe_load(out.read_text())
    assert all("max_non_alpha_words_ratio" not in p for p in table["gopher_quality"]["per_language"].values())


def test_refusal_of_thresholds_that_switch_a_rule_off():
    from gristmill.pipeline.calibration.calibrate import RULES, Result, refusal

    rule = {r.name: r for r in RULES}
    alpha, dup = rule["gopher_quality.max_non_alpha_words_ratio"], rule["gopher_repetition.dup_line_frac"]
    words = rule["gopher_quality.max_avg_word_length"]

    def why(r, t, share=0.0):
        return refusal(Result(r, "de", r.default(), t, 0.0, share, 30))

    assert why(alpha, 0.7) is None and why(dup, 0.5) is None and why(words, 14.0) is None
    assert why(alpha, 0.0) == "0 switches the rule off"
    assert why(alpha, -0.2) == "-0.2 is no threshold" and why(dup, math.nan) == "nan is no threshold"
    assert why(dup, 1.0) == "a share never exceeds 1: the rule would never fire"
    assert why(words, 14.0, share=0.6) == "removes 60% of the de reference (over 50%)"


@pytest.mark.parametrize("flag", ["--english", "--reference", "--udhr"])
def test_a_device_is_never_read(tmp_path, capsys, flag):
    """`/dev/zero` was read to 10.7 GB; a device, a FIFO or a directory is refused before any read."""
    value = "de=/dev/zero" if flag == "--reference" else "/dev/zero"
    assert main(["calibrate", flag, value, "-o", str(tmp_path / "cal.yaml")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: {flag} {value}: not a regular file; give " + (
        "the UDHR zip" if flag == "--udhr" else "a text file"
    )


def test_reference_bytes_are_bounded(udhr_zip, tmp_path, capsys):
    # a 20 GB file (sparse: it costs no disk) is refused from its size, without reading it
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(20 << 30)
    assert main(["calibrate", "--udhr", str(udhr_zip), "--english", str(big), "-o", str(tmp_path / "c.yaml")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --english {big}: over --max-reference-mb (64 MB); give a sample of it "
        "(thousands of documents set a quantile as well as millions)"
    ]
    # the bound is the user's, and holds inside the zip too: 2 MB of zeros compress to a few KB
    bomb = tmp_path / "udhr.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("udhr2/eng.txt", "\0" * (2 << 20))
    assert bomb.stat().st_size < 20_000
    assert main(["calibrate", "--udhr", str(bomb), "--max-reference-mb", "1", "-o", str(tmp_path / "c.yaml")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: --udhr {bomb}: udhr2/eng.txt is over --max-reference-mb (1 MB uncompressed)"
    with pytest.raises(SystemExit):
        main(["calibrate", "--udhr", str(udhr_zip), "--max-reference-mb", "0", "-o", str(tmp_path / "c.yaml")])
    assert (
        capsys.readouterr().err.splitlines()[-1].endswith("argument --max-reference-mb: expected at least 1 MB, got 0")
    )


def test_a_reference_without_usable_text_is_named(udhr_zip, shared_data, tmp_path, capsys):
    wiki = shared_data / "corpus" / "en" / "wikitext-2.test.txt"
    out = tmp_path / "cal.yaml"
    # no language besides English (this was `mean requires at least one data point`)
    assert main(["calibrate", "--english", str(wiki), "-o", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: no reference text of a language other than English: give --udhr or --reference LANG=FILE"
    ]
    for text in ("", "\n\n   \n\n", "one block\n\ntwo blocks\n"):
        empty = tmp_path / "de.txt"
        empty.write_text(text)
        assert main(["calibrate", "--english", str(wiki), "--reference", f"de={empty}", "-o", str(out)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: --reference de={empty}: ") and "documents of de text" in line, line
        assert "at least 10 are needed" in line
    empty_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(empty_zip, "w") as z:
        z.writestr("readme.txt", "no UDHR here")
    assert main(["calibrate", "--udhr", str(empty_zip), "--english", str(wiki), "-o", str(out)]) == 2
    assert "no UDHR text in it" in capsys.readouterr().err
    assert not out.exists()


# --- what every calibration file keeps to ------------------------------------------------------


def _ngram_bounds(table, param):
    for lang, params in table.get("gopher_repetition", {}).get("per_language", {}).items():
        if param in params:
            yield lang, [v for _, v in sorted(params[param])]


def _assert_well_formed(table):
    """The rules calibration_rules.guard_table holds every written table to."""
    for param in ("top_n_grams", "dup_n_grams"):
        for lang, bounds in _ngram_bounds(table, param):
            assert bounds == sorted(bounds, reverse=True), (lang, param, bounds)  # falling with n
            if param == "top_n_grams":
                assert max(bounds) <= 0.5, (lang, bounds)
    for lang, params in table.get("gopher_quality", {}).get("per_language", {}).items():
        if "max_non_alpha_words_ratio" in params:
            assert params["max_non_alpha_words_ratio"] >= 0.5, lang


def test_calibrated_top_n_gram_bounds_fall_with_n_and_stay_at_most_half(udhr_zip, tmp_path, capsys):
    """UDHR gave German a 3-gram bound above its 2-gram one and Georgian a 2-gram bound of 0.68
    (half of a page in one repeated phrase passes); both are brought into line and named."""
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "de,ka,fa", "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    table = yaml.safe_load(out.read_text())
    _assert_well_formed(table)
    top = {lang: dict(map(tuple, p["top_n_grams"])) for lang, p in table["gopher_repetition"]["per_language"].items()}
    assert top["de"][3] == top["de"][2] < 0.18  # lowered to the 2-gram bound
    assert top["ka"][2] == 0.5
    assert "gopher_repetition.top_n_grams[3] changed, above the bound of a shorter n-gram (1): de 0.1987->0.1728" in err
    assert "gopher_repetition.top_n_grams[2] changed, above 0.5, the loosest bound (1): ka 0.6786->0.5" in err
    assert "# Changed or left out to keep to calibration_rules.guard_table's rules:" in out.read_text()


def test_calibrated_letter_share_bound_is_at_least_half(udhr_zip, tmp_path, capsys):
    """Maithili's UDHR gave 0.25: a page of three numbers or symbols to each word would pass."""
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "mai,de", "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    table = yaml.safe_load(out.read_text())
    assert table["gopher_quality"]["per_language"]["mai"]["max_non_alpha_words_ratio"] == 0.5
    assert "gopher_quality.max_non_alpha_words_ratio changed, below 0.5, the loosest bound (1): mai 0.25->0.5" in err
    _assert_well_formed(table)


def test_guard_table_rules():
    from gristmill.pipeline.calibration.rules import guard_table, prune_defaults

    table = {
        "gopher_quality": {
            "per_language": {
                "de": {"min_avg_word_length": 0, "max_avg_word_length": 15, "max_non_alpha_words_ratio": 0.3},
                "zh": {"min_avg_word_length": 1, "stop_words": ["的", "了"]},
            }
        },
        "gopher_repetition": {
            "per_language": {
                "ast": {"top_n_grams": [[3, 1.59], [2, 1.597], [4, 0.3]], "dup_line_frac": 1.2},
                "wa": {"dup_n_grams": [[5, 0.485], [6, 0.489], [7, 0.539], [8, 0.2], [9, 0.1], [10, 0.05]]},
            }
        },
    }
    guarded, changes = guard_table(table)
    de, zh = guarded["gopher_quality"]["per_language"]["de"], guarded["gopher_quality"]["per_language"]["zh"]
    assert de == {"max_avg_word_length": 15, "max_non_alpha_words_ratio": 0.5}  # 0 switches the rule off
    assert zh == {"stop_words": ["的", "了"]}  # no word is shorter than 1 character: the rule never fires
    ast = guarded["gopher_repetition"]["per_language"]["ast"]
    assert ast == {"top_n_grams": [[2, 0.5], [3, 0.5], [4, 0.3]]}  # capped, sorted by n; dup_line_frac 1.2 is off
    assert guarded["gopher_repetition"]["per_language"]["wa"]["dup_n_grams"][:3] == [[5, 0.485], [6, 0.485], [7, 0.485]]
    assert {(c.language, c.param, c.new) for c in changes if c.new is None} == {
        ("de", "min_avg_word_length", None),
        ("zh", "min_avg_word_length", None),
        ("ast", "dup_line_frac", None),
    }
    # asked for: the values that switch a rule off are kept, the others rules still hold
    kept, _ = guard_table(table, allow_off=True)
    assert kept["gopher_quality"]["per_language"]["de"]["min_avg_word_length"] == 0
    assert kept["gopher_quality"]["per_language"]["de"]["max_non_alpha_words_ratio"] == 0.5
    assert kept["gopher_repetition"]["per_language"]["ast"]["dup_line_frac"] == 1.2
    assert kept["gopher_repetition"]["per_language"]["ast"]["top_n_grams"][0] == [2, 0.5]
    # NaN or a negative value is never written, asked or not
    bad, changes = guard_table({"gopher_quality": {"per_language": {"de": {"max_avg_word_length": -1}}}}, True)
    assert bad["gopher_quality"]["per_language"]["de"] == {} and changes[0].why == "-1 is no threshold"
    assert prune_defaults(bad) == {}
    at_default = {"gopher_quality": {"per_language": {"de": {"min_stop_words": 2, "max_avg_word_length": 15}}}}
    assert prune_defaults(at_default) == {"gopher_quality": {"per_language": {"de": {"max_avg_word_length": 15}}}}


def test_every_calibrated_rule_has_its_bound_kind():
    from gristmill.pipeline.calibration.calibrate import RULES
    from gristmill.pipeline.calibration.rules import BOUNDS

    for rule in RULES:
        kind, share = BOUNDS[(rule.step, rule.param)]
        assert kind == rule.kind, rule.name
        assert share == (rule.step == "gopher_repetition" or rule.param.endswith("_ratio")), rule.name


def test_a_value_that_switches_a_rule_off_is_written_only_when_asked(udhr_zip, tmp_path, capsys):
    """Croatian's UDHR 3-gram bound of 1.1 is refused by default; with --allow-off it passes the
    refusal, yet a top-n-gram bound still ends at most 0.5 and at most its 2-gram one."""
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--udhr", str(udhr_zip), "--languages", "hr", "--allow-off", "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "refused:" not in err
    top = dict(map(tuple, yaml.safe_load(out.read_text())["gopher_repetition"]["per_language"]["hr"]["top_n_grams"]))
    assert top[3] <= top[2] <= 0.5 and top[3] != 0.18
    assert "--allow-off: values that switch a rule off are kept." in out.read_text()


def test_refusal_lets_off_switches_through_only_when_asked():
    from gristmill.pipeline.calibration.calibrate import RULES, Result, refusal

    rule = {r.name: r for r in RULES}
    alpha, dup = rule["gopher_quality.max_non_alpha_words_ratio"], rule["gopher_repetition.dup_line_frac"]
    assert refusal(Result(alpha, "de", 0.8, 0.0, 0.0, 0.0, 30), allow_off=True) is None
    assert refusal(Result(dup, "de", 0.3, 1.0, 0.0, 0.0, 30), allow_off=True) is None
    assert refusal(Result(dup, "de", 0.3, math.nan, 0.0, 0.0, 30), allow_off=True) == "nan is no threshold"


# --- FineWeb-2's thresholds (`--from-fineweb2`) ------------------------------------------------


@pytest.fixture(scope="module")
def fineweb2_configs(shared_data) -> Path:
    path = shared_data / "reference" / "fineweb-2" / "configs"
    if not (path / "deu_Latn.yml").is_file():
        from tests.conftest import _missing

        _missing(f"{path} (FineWeb-2's configs)")
    return path


def test_every_lid176_label_has_its_fineweb2_codes_and_the_rule_picks_the_largest(fineweb2_configs):
    from gristmill.core.configlib import LID176_LABELS
    from gristmill.pipeline.calibration.fineweb2 import LID176_ISO639_3, read_fineweb2

    assert set(LID176_ISO639_3) == set(LID176_LABELS)
    fw = read_fineweb2(fineweb2_configs)
    m = fw.mapping
    assert "en" not in m and fw.unmapped_labels == ["eml"] and len(m) == 174
    # scripts and members by the text FineWeb-2 holds of each
    assert (m["sr"], m["zh"], m["no"], m["nn"], m["ms"], m["fa"], m["et"], m["ar"]) == (
        "srp_Cyrl",
        "cmn_Hani",
        "nob_Latn",
        "nno_Latn",
        "zsm_Latn",
        "fas_Arab",
        "ekk_Latn",
        "arb_Arab",
    )
    assert m["sq"] == "als_Latn" and m["als"] == "gsw_Latn"  # ISO's als is Tosk Albanian; lid.176's Alemannic


def test_fineweb2_thresholds_are_written_under_gristmills_steps(fineweb2_configs, tmp_path, capsys):
    out = tmp_path / "fw2.yaml"
    args = ["calibrate", "--from-fineweb2", str(fineweb2_configs), "--languages", "de,ja,th,ast", "-o", str(out)]
    assert main(args) == 0
    err = " ".join(capsys.readouterr().err.split())
    text = out.read_text()
    table = yaml.safe_load(text)
    deu = yaml.safe_load((fineweb2_configs / "deu_Latn.yml").read_text())
    de = table["gopher_quality"]["per_language"]["de"]
    assert de["max_non_alpha_words_ratio"] == deu["max_non_alpha_words_ratio"] == 0.774
    assert de["max_avg_word_length"] == deu["max_avg_word_length"]
    assert de["stop_words"] == deu["stopwords"]
    assert "min_stop_words" not in de  # FineWeb-2's 2 is the default
    rep = table["gopher_repetition"]["per_language"]["de"]
    assert rep["top_n_grams"] == deu["top_n_grams"] and rep["dup_n_grams"] == deu["dup_n_grams"]
    assert rep["dup_line_frac"] == deu["dup_line_frac"]
    # German's min_avg_word_length of 0 switches the rule off: left out and named, unless asked
    assert "min_avg_word_length" not in de
    assert "gopher_quality.min_avg_word_length left out (the default applies), 0 switches the rule off (1): de 0" in err
    # Asturian's top 2-gram bound of 1.597 never fires: capped
    assert table["gopher_repetition"]["per_language"]["ast"]["top_n_grams"][0] == [2, 0.5]
    _assert_well_formed(table)
    # the header says where the numbers come from, under which licence, and what is not mapped
    assert "github huggingface/fineweb-2, Apache-2.0" in text and "language_score: a GlotLID confidence" in text
    assert "ast=ast_Latn de=deu_Latn ja=jpn_Jpan th=tha_Thai" in " ".join(text.replace("#", " ").split())
    # fineweb_quality: datatrove's names; a section only where the step exists (`calibration:` refuses unknown steps)
    from gristmill.core.step import registered_steps

    if "fineweb_quality" in registered_steps():
        assert table["fineweb_quality"]["per_language"]["de"]["new_line_ratio"] == deu["new_line_ratio"]
    else:
        assert "fineweb_quality" not in table
        assert f"#     de: {{char_duplicates_ratio: 0.1, new_line_ratio: {deu['new_line_ratio']}}}" in text
    steps = ["gopher_quality", "gopher_repetition"]
    cfg = from_dict({"input": {"paths": ["x"]}, "calibration": str(out), "steps": steps})
    assert GopherQuality(cfg.specs[0].params).config_for("de").stop_words == deu["stopwords"]

    assert main([*args[:-2], "--allow-off", "-o", str(out)]) == 0
    table = yaml.safe_load(out.read_text())
    assert table["gopher_quality"]["per_language"]["de"]["min_avg_word_length"] == 0
    assert table["gopher_quality"]["per_language"]["ja"]["min_avg_word_length"] == 1


def test_fineweb2_stop_words_decide_the_stop_word_rule(fineweb2_configs, tmp_path):
    """German pages need two of FineWeb-2's 15 German stop words, not of stopwords-iso's 600."""
    out = tmp_path / "fw2.yaml"
    assert main(["calibrate", "--from-fineweb2", str(fineweb2_configs), "--languages", "de", "-o", str(out)]) == 0
    cfg = from_dict({"input": {"paths": ["x"]}, "calibration": str(out), "steps": ["gopher_quality"]})
    params = {**_OFF["gopher_quality"], "min_stop_words": 2, "per_language": cfg.specs[0].params.per_language}
    flt = GopherQuality(**params)
    iso_only = Document(text="ich bin aber auch noch hier", id="1", metadata={"language": "de"})  # stopwords-iso's
    fineweb2 = Document(text="der Hund und die Katze", id="2", metadata={"language": "de"})
    assert flt.filter_batch([iso_only, fineweb2]) == [(False, "gopher_enough_stop_words"), True]


def _fineweb2_copy(fineweb2_configs: Path, tmp_path: Path, name: str, **edits) -> Path:
    """A FineWeb-2 configs folder holding one of its configs, edited."""
    import shutil

    configs = tmp_path / "fw" / "configs"
    configs.mkdir(parents=True)
    shutil.copyfile(fineweb2_configs.parent / "fineweb2-language-distribution.csv", configs.parent / "x.csv")
    (configs.parent / "x.csv").rename(configs.parent / "fineweb2-language-distribution.csv")
    cfg = yaml.safe_load((fineweb2_configs / f"{name}.yml").read_text())
    (configs / f"{name}.yml").write_text(yaml.safe_dump({**cfg, **edits}, allow_unicode=True))
    return configs


def test_no_calibrated_stop_word_rule_drops_every_page(fineweb2_configs, tmp_path, capsys):
    """FineWeb-2's Tibetan list keeps one entry gristmill's tokenizer leaves whole (`།`; 9 of its
    10 are split) while its `min_stop_words` is 2: every Tibetan page would be dropped. The
    calibration lowers the bound to the list's distinct words, says so, and a Tibetan page
    passes; an empty list is left out and named."""
    out = tmp_path / "bo.yaml"
    assert main(["calibrate", "--from-fineweb2", str(fineweb2_configs), "--languages", "bo", "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    bo = yaml.safe_load(out.read_text())["gopher_quality"]["per_language"]["bo"]
    assert bo["stop_words"] == ["\u0f0d"] and bo["min_stop_words"] == 1
    want = "gopher_quality.min_stop_words changed, more than the 1 distinct words of its stop_words: no page could"
    assert want + " pass (1): bo 2->1" in err
    assert "min_stop_words changed" in " ".join(out.read_text().replace("#", " ").split())  # and in the file
    cfg = from_dict({"input": {"paths": ["x"]}, "calibration": str(out), "steps": ["gopher_quality"]})
    params = {**_OFF["gopher_quality"], "min_stop_words": 2, "per_language": cfg.specs[0].params.per_language}
    page = " ".join(["\u0f56\u0f7c\u0f51"] * 10) + " \u0f0d"  # ten words and a shad
    doc = Document(text=page, id="1", metadata={"language": "bo"})
    assert GopherQuality(**params).filter_batch([doc]) == [True]
    # an empty list: no stop word could be found; left out, so the language's own list (none for bo) applies
    configs = _fineweb2_copy(fineweb2_configs, tmp_path, "bod_Tibt", stopwords=[])
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "gopher_quality.stop_words left out (the default applies), an empty list: no page could hold" in err
    bo = yaml.safe_load(out.read_text())["gopher_quality"]["per_language"]["bo"]
    assert "stop_words" not in bo and "min_stop_words" not in bo
    cfg = from_dict({"input": {"paths": ["x"]}, "calibration": str(out), "steps": ["gopher_quality"]})
    params = {**_OFF["gopher_quality"], "min_stop_words": 2, "per_language": cfg.specs[0].params.per_language}
    assert GopherQuality(**params).filter_batch([doc]) == [True]


def test_no_calibrated_word_length_bounds_exclude_each_other(fineweb2_configs, tmp_path, capsys):
    """A mean word length of at least 99 and at most 23 passes no page: both are left out and
    named. A negative other than FineWeb-2's -1 (its off-switch) is no threshold: refused, one
    line naming file and key, nothing written."""
    out = tmp_path / "cal.yaml"
    configs = _fineweb2_copy(fineweb2_configs, tmp_path, "deu_Latn", min_avg_word_length=99)
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    de = yaml.safe_load(out.read_text())["gopher_quality"]["per_language"]["de"]
    assert "min_avg_word_length" not in de and "max_avg_word_length" not in de
    assert "min_avg_word_length 99 above max_avg_word_length" in err
    (configs / "deu_Latn.yml").write_text(
        yaml.safe_dump({**yaml.safe_load((fineweb2_configs / "deu_Latn.yml").read_text()), "max_avg_word_length": -15})
    )
    out.unlink()
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    want = "deu_Latn.yml: max_avg_word_length: -15 is no threshold (FineWeb-2 writes -1 to switch a rule off)"
    assert line.endswith(want), line
    assert not out.exists()


def test_fineweb2_merged_onto_a_base_replaces_its_keys_and_keeps_the_rest(fineweb2_configs, tmp_path):
    base = REPO / "configs" / "calibration" / "udhr.yaml"
    out = tmp_path / "merged.yaml"
    args = ["calibrate", "--from-fineweb2", str(fineweb2_configs), "--base", str(base), "-o", str(out)]
    assert main(args) == 0
    merged, udhr = yaml.safe_load(out.read_text()), yaml.safe_load(base.read_text())
    assert merged["c4_lines"] == udhr["c4_lines"]  # FineWeb-2 runs no C4 rule
    assert merged["gopher_quality"]["per_language"]["eml"] == udhr["gopher_quality"]["per_language"]["eml"]
    zh, zh_udhr = merged["gopher_quality"]["per_language"]["zh"], udhr["gopher_quality"]["per_language"]["zh"]
    assert zh["max_non_alpha_words_ratio"] == 0.735 != zh_udhr["max_non_alpha_words_ratio"]
    assert zh_udhr["min_stop_words"] == 1 and "min_stop_words" not in zh  # FineWeb-2's 2, the default
    assert zh["min_doc_words"] == zh_udhr["min_doc_words"]  # not set by FineWeb-2: the base's
    # FineWeb-2's 1 for Chinese switches the word-length rule off: left out, so UDHR's value stays
    assert zh["min_avg_word_length"] == zh_udhr["min_avg_word_length"]
    _assert_well_formed(merged)


def test_fineweb2_input_faults_are_one_line(fineweb2_configs, tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-fineweb2", str(tmp_path / "none"), "-o", str(out)]) == 2
    assert "none: not a directory (FineWeb-2's configs/" in capsys.readouterr().err
    configs = tmp_path / "fw" / "configs"
    configs.mkdir(parents=True)
    (configs / "deu_Latn.yml").write_text("dup_line_frac: 0.2\n")
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 2
    assert "fineweb2-language-distribution.csv not found" in capsys.readouterr().err
    (configs.parent / "fineweb2-language-distribution.csv").write_text("subset,split,utf8_bytes\ndeu_Latn,train,100\n")
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --from-fineweb2: {configs / 'deu_Latn.yml'}: no dup_n_grams, line_punct_thr, ")
    full = yaml.safe_load((fineweb2_configs / "deu_Latn.yml").read_text())
    (configs / "deu_Latn.yml").write_text(yaml.safe_dump({**full, "max_non_alpha_words_ratio": "high"}))
    assert main(["calibrate", "--from-fineweb2", str(configs), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("deu_Latn.yml: max_non_alpha_words_ratio: expected a finite number, got 'high'")
    assert main(["calibrate", "--from-fineweb2", str(configs), "--udhr", "x.zip", "-o", str(out)]) == 2
    assert "give it without --udhr" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("name", ["udhr.yaml", "fineweb2.yaml", "fineweb2-udhr.yaml"])
def test_shipped_calibrations_are_well_formed(name):
    table = yaml.safe_load((REPO / "configs" / "calibration" / name).read_text())
    _assert_well_formed(table)
    assert all("en" not in step["per_language"] for step in table.values())


@pytest.mark.parametrize(
    ("name", "extra"),
    [("fineweb2.yaml", []), ("fineweb2-udhr.yaml", ["--base", str(REPO / "configs" / "calibration" / "udhr.yaml")])],
)
def test_shipped_fineweb2_calibrations_are_what_the_command_writes(fineweb2_configs, tmp_path, name, extra):
    out = tmp_path / name
    assert main(["calibrate", "--from-fineweb2", str(fineweb2_configs), *extra, "--allow-off", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == yaml.safe_load((REPO / "configs" / "calibration" / name).read_text())


def test_multilingual_calibration_agrees_with_fineweb2_on_the_letter_share(fineweb2_configs):
    """The letter-share bound is where most web text is removed: the shipped table follows
    FineWeb-2's (set with model ablations) across the languages both have (Pearson r >= 0.6)."""
    import statistics

    from gristmill.pipeline.calibration.fineweb2 import read_fineweb2

    named = yaml.safe_load((REPO / "configs" / "multilingual.yaml").read_text())["calibration"]
    table = yaml.safe_load((REPO / named).read_text())["gopher_quality"]["per_language"]
    fw = read_fineweb2(fineweb2_configs).values["gopher_quality"]
    langs = sorted(set(table) & set(fw))
    ours = [table[x].get("max_non_alpha_words_ratio", 0.8) for x in langs]
    theirs = [fw[x]["max_non_alpha_words_ratio"] for x in langs]
    assert len(langs) >= 170
    assert statistics.correlation(ours, theirs) >= 0.6
