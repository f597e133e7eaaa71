"""Config: errors name the key path, interpolation, overrides."""

from __future__ import annotations

import pytest

from gristmill.config import ConfigError, apply_override, from_dict, load

BASE = {
    "run_dir": "runs/x",
    "input": {"paths": ["a.wet.gz"]},
    "steps": [{"langid": {"languages": ["en"], "min_score": 0.5}}, {"gopher_quality": {}}, {"c4_lines": None}],
}


def _err(data, *overrides) -> str:
    with pytest.raises(ConfigError) as e:
        from_dict(data, list(overrides))
    return str(e.value)


def test_valid_config_resolves_defaults():
    cfg = from_dict(BASE)
    assert [s.step_id for s in cfg.specs] == ["00_langid", "01_gopher_quality", "02_c4_lines"]
    assert cfg.specs[1].params.min_doc_words == 50  # datatrove's Gopher default
    assert cfg.executor.tasks == 4
    resolved = cfg.resolved()
    assert resolved["steps"][0]["langid"]["min_score"] == 0.5
    assert resolved["output"]["compression"] == "zstd"


def test_wrong_type_names_the_key_path():
    data = {**BASE, "steps": [{"gopher_quality": {}}, {"c4_lines": {}}, {"langid": {"min_score": "high"}}]}
    msg = _err(data)
    assert "steps[2].langid.min_score: expected a number between 0 and 1, got 'high'" in msg


def test_unknown_keys_are_errors_with_path():
    assert "steps[0].langid.threshold: unknown key" in _err({**BASE, "steps": [{"langid": {"threshold": 0.3}}]})
    assert "executor.taks: unknown key" in _err({**BASE, "executor": {"taks": 3}})
    msg = _err({**BASE, "outptu": {}})
    assert "outptu: unknown key" in msg and "allowed:" in msg


def test_unknown_step_and_bad_shapes():
    assert "steps[1]: unknown step 'gopher'" in _err({**BASE, "steps": [{"langid": {}}, {"gopher": {}}]})
    assert "steps[0]: expected one" in _err({**BASE, "steps": [{"langid": {}, "c4_lines": {}}]})
    assert "steps[0].gopher_quality.min_doc_words" in _err(
        {**BASE, "steps": [{"gopher_quality": {"min_doc_words": "many"}}]}
    )


def test_all_errors_reported_at_once():
    msg = _err({**BASE, "executor": {"tasks": 0}, "steps": [{"langid": {"min_score": 2}}]})
    assert "executor.tasks" in msg and "steps[0].langid.min_score" in msg and "2 error(s)" in msg


def test_input_needs_exactly_one_source():
    assert "input" in _err({**BASE, "input": {}})
    msg = _err({**BASE, "input": {"commoncrawl": {"crawl": "CC-MAIN-2024-22"}}})
    assert "input.commoncrawl" in msg and "exactly one of `files`" in msg
    assert "input.commoncrawl.crawl" in _err({**BASE, "input": {"commoncrawl": {"crawl": "2024", "files": 1}}})


def test_per_language_output_needs_langid():
    assert "output.per_language" in _err({**BASE, "steps": [{"c4_lines": {}}], "output": {"per_language": True}})


def test_env_interpolation(monkeypatch):
    monkeypatch.setenv("GM_DATA", "/data/cc")
    monkeypatch.delenv("GM_UNSET", raising=False)
    cfg = from_dict({**BASE, "input": {"paths": ["${GM_DATA}/x.gz", "${GM_UNSET:-/fallback}/y.gz"]}})
    assert cfg.input.paths == ["/data/cc/x.gz", "/fallback/y.gz"]
    assert "input.paths[0]: environment variable GM_UNSET is not set" in _err(
        {**BASE, "input": {"paths": ["${GM_UNSET}/x"]}}
    )


def test_overrides_parse_yaml_values():
    cfg = from_dict(
        BASE, ["executor.tasks=8", "steps[0].langid.languages=[en, fr]", "steps.1.gopher_quality.min_doc_words=10"]
    )
    assert cfg.executor.tasks == 8
    assert cfg.specs[0].params.languages == ["en", "fr"]
    assert cfg.specs[1].params.min_doc_words == 10
    # an override on a step given as `c4_lines: null` creates its mapping
    cfg = from_dict(BASE, ["steps[2].c4_lines.min_num_sentences=2"])
    assert cfg.specs[2].params.min_num_sentences == 2
    with pytest.raises(ConfigError, match=r"no list item \[9\]"):
        apply_override({"steps": []}, "steps[9].x=1")
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        apply_override({}, "executor.tasks")
    assert "executor.tasks" in _err(BASE, "executor.tasks=zero")


def test_load_reports_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    good = tmp_path / "good.yaml"
    good.write_text("input: {paths: [a]}\nsteps: [langid, c4_lines]\n")
    assert [s.name for s in load(good, run_dir="elsewhere").specs] == ["langid", "c4_lines"]
    assert load(good, run_dir="elsewhere").run_dir == "elsewhere"


def test_shipped_configs_validate(monkeypatch):
    from pathlib import Path

    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        cfg = load(path)
        assert cfg.specs, path
