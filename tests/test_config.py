"""Config: errors name the key path, interpolation, overrides."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gristmill.config import ConfigError, RunConfig, apply_override, from_dict, load
from gristmill.core.configlib import messages
from tests.cli_process import pipeline

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
    """Every run config in configs/ validates; an ablation config validates as one, and given to a
    run is refused in one line that names the command it is for."""
    from gristmill.ablation.config import load as load_ablation

    monkeypatch.chdir(Path(__file__).parents[1])
    ablations = 0
    for path in sorted(Path("configs").glob("*.yaml")):
        if "variants" in yaml.safe_load(path.read_text()):
            ablations += 1
            assert len(load_ablation(path).names()) >= 2, path
            with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: an ablation config .* `pipeline ablate "):
                load(path)
            continue
        cfg = load(path)
        assert cfg.specs, path
    assert ablations >= 1


# --- steps validated by the model; tokenization is a step --------------------------------

SRC = Path(__file__).resolve().parents[1] / "src" / "gristmill"
TOKENIZE = {"tokenizer": {"train": {"vocab_size": 512}}, "shard_tokens": 1000}


def test_no_step_is_known_by_the_config_or_appended_by_the_planner():
    """The run config imports no step class and the planner places every step by one loop."""
    assert "gristmill.tokenize" not in (SRC / "config.py").read_text()
    assert "Tokenize" not in (SRC / "pipeline" / "planning" / "planner.py").read_text()


def test_model_validate_alone_gives_the_steps():
    cfg = RunConfig.model_validate(BASE)
    assert [s.step_id for s in cfg.steps] == ["00_langid", "01_gopher_quality", "02_c4_lines"]
    assert cfg.specs is cfg.steps and cfg.steps[0].params.min_score == 0.5
    # the dump is the YAML form, which validates to the same config
    assert RunConfig.model_validate(cfg.model_dump()).resolved() == cfg.resolved()
    with pytest.raises(ValidationError) as e:
        RunConfig.model_validate({**BASE, "steps": [{"langid": {"min_score": 2}}, "gopher"]})
    lines = messages(e.value, "", RunConfig)
    assert lines[0] == "steps[0].langid.min_score: expected a number between 0 and 1, got 2"
    assert lines[1].startswith("steps[1]: unknown step 'gopher' (known: ") and len(lines) == 2
    assert _err({**BASE, "steps": "langid"}).endswith("1 error(s)\n  steps: expected a list of steps, got 'langid'")


def test_tokenize_is_a_step_and_the_section_reads_as_it():
    step = from_dict({**BASE, "steps": [*BASE["steps"], {"tokenize": TOKENIZE}]})
    section = from_dict({**BASE, "tokenize": TOKENIZE})
    assert (
        [s.name for s in step.steps]
        == [s.name for s in section.steps]
        == [
            "langid",
            "gopher_quality",
            "c4_lines",
            "tokenize",
        ]
    )
    assert step.steps[3].step_id == "03_tokenize" and step.steps[3].params.shard_tokens == 1000
    assert step.resolved() == section.resolved() and "tokenize" not in step.resolved()
    assert step.resolved()["steps"][3]["tokenize"]["tokenizer"]["train"]["vocab_size"] == 512
    # `tokenize: null` (the config.yaml of a run without it) is no step; overrides reach either form
    assert [s.name for s in from_dict({**BASE, "tokenize": None}).steps] == ["langid", "gopher_quality", "c4_lines"]
    assert from_dict({**BASE, "tokenize": TOKENIZE}, ["tokenize.seed=3"]).steps[3].params.seed == 3
    assert (
        from_dict({**BASE, "steps": [{"tokenize": TOKENIZE}]}, ["steps[0].tokenize.seed=4"]).steps[0].params.seed == 4
    )


def test_tokenize_errors_name_the_key_as_written():
    bad = {"tokenizer": {"train": {"vocab_size": 100}}}
    msg = _err({**BASE, "executor": {"tasks": 0}, "tokenize": bad})
    assert "2 error(s)" in msg and "\n  tokenize.tokenizer.train.vocab_size: input should be greater" in msg
    msg = _err({**BASE, "steps": [{"tokenize": bad}]})
    assert "\n  steps[0].tokenize.tokenizer.train.vocab_size: input should be greater" in msg
    assert "tokenize: expected a mapping of parameters, got 5" in _err({**BASE, "tokenize": 5})
    msg = _err({**BASE, "steps": [{"tokenize": TOKENIZE}, "c4_lines"]})
    assert "steps[0].tokenize: must be the last step (it tokenizes the run's final documents)" in msg
    msg = _err({**BASE, "steps": ["c4_lines", {"tokenize": TOKENIZE}], "tokenize": TOKENIZE})
    assert msg.endswith("1 error(s)\n  tokenize: also given as steps[1]; write it once, as the last step")


def test_a_run_directory_of_the_section_layout_resumes(tmp_path):
    """config.yaml of a run made when `tokenize:` was a top-level section (written with
    `tokenize: null` when there was none) equals this version's resolved config."""
    from gristmill.config import config_differences
    from gristmill.pipeline.rundir import LocalRunDir, layout

    for tokenize in (TOKENIZE, None):
        cfg = from_dict({**BASE, "run_dir": str(tmp_path / "r"), **({"tokenize": tokenize} if tokenize else {})})
        old = cfg.resolved()
        old["tokenize"] = old["steps"].pop()["tokenize"] if tokenize else None
        assert config_differences(old, cfg.resolved())  # the layouts differ ...
        (tmp_path / "r").mkdir(exist_ok=True)
        (tmp_path / "r" / layout.MARKER).write_text("")
        (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
        assert LocalRunDir(tmp_path / "r").prepare(cfg, force=False)  # ... and it resumes
        changed = from_dict({**BASE, "run_dir": str(tmp_path / "r"), "tokenize": {**TOKENIZE, "seed": 1}})
        (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
        with pytest.raises(ConfigError, match=r"another configuration:\n  steps\[3\]"):
            LocalRunDir(tmp_path / "r").prepare(changed, force=False)


# --- every float is finite ------------------------------------------------------------------


def _with_nan(annotation):
    """A value of `annotation` holding NaN wherever a float goes (None: it holds no float)."""
    import math
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is float:
        return math.nan
    if origin is typing.Annotated:
        return _with_nan(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((v for v in map(_with_nan, args) if v is not None), None)
    if origin is tuple and args:
        if args[-1] is Ellipsis:
            inner = _with_nan(args[0])
            return None if inner is None else (inner,)
        parts = [_with_nan(a) for a in args]
        if all(p is None for p in parts):
            return None
        return tuple(p if p is not None else {int: 2, str: "en"}[a] for p, a in zip(parts, args))
    if origin is list and args:
        inner = _with_nan(args[0])
        return None if inner is None else [inner]
    if origin is dict and args:
        inner = _with_nan(args[1])
        return None if inner is None else {"en": inner}
    return None


def _float_fields(model, prefix=""):
    """(key path, model, field name, value holding NaN) of every float field of `model`, nested sections too."""
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        value = _with_nan(field.annotation)
        if value is not None:
            yield f"{prefix}{name}", model, name, value
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _float_fields(arg, f"{prefix}{name}.")


def test_no_float_parameter_of_any_step_or_section_accepts_nan_or_inf():
    """NaN compares false with every document's statistic, so a NaN threshold switches its rule
    off without a word; inf is no threshold either. Every float field, found by its type."""
    from gristmill.core.step import registered_steps

    models = [(f"{name}.", step.Config) for name, step in registered_steps().items()] + [("", RunConfig)]
    checked = []
    for prefix, model in models:
        for path, owner, name, value in _float_fields(model, prefix):
            for bad in (value, json.loads(json.dumps(value).replace("NaN", "Infinity"))):
                with pytest.raises(ValidationError) as e:
                    owner.model_validate({name: bad})
                lines = [line for line in messages(e.value, "", owner) if line.startswith(name)]
                assert lines, (path, messages(e.value, "", owner))
                assert all(
                    re.search(r": expected a (finite number|number between 0 and 1), got -?(nan|inf)$", line)
                    for line in lines
                ), (path, lines)
            checked.append(path)
    # the thresholds of the heuristic filters, nested pairs, and the run's own sections among them
    for path in (
        "gopher_quality.max_non_alpha_words_ratio",
        "gopher_repetition.top_n_grams",
        "kenlm.cutoffs",
        "langid.min_score",
        "near_dedup.threshold",
        "executor.memory_gb_per_task",
        "input.commoncrawl.backoff_s",
    ):
        assert path in checked, path
    assert len(checked) >= 25


def _write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


NAN_PLACES = {
    "top level": ("- gopher_quality: {max_non_alpha_words_ratio: .nan}", None),
    "per_language": ("- gopher_quality: {per_language: {de: {max_non_alpha_words_ratio: .nan}}}", None),
    "calibration file": (
        "- gopher_quality: {}",
        "gopher_quality:\n  per_language:\n    de: {max_non_alpha_words_ratio: .nan}\n",
    ),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("place", list(NAN_PLACES))
def test_a_nan_threshold_is_refused_by_validate_and_run(tmp_path, wet_files, command, place):
    step, calibration = NAN_PLACES[place]
    run_dir = tmp_path / "run"
    text = f"run_dir: {run_dir}\ninput: {{paths: [{wet_files[0]}]}}\nsteps:\n  {step}\n"
    if calibration is not None:
        cal = _write_yaml(tmp_path / "cal.yaml", calibration)
        text += f"calibration: {cal}\n"
    config = _write_yaml(tmp_path / "crawl.yaml", text)
    res = pipeline(command, str(config), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    expected = {
        "top level": "steps[0].gopher_quality.max_non_alpha_words_ratio: expected a finite number, got nan",
        "per_language": "steps[0].gopher_quality.per_language.de.max_non_alpha_words_ratio: "
        "expected a finite number, got nan",
        "calibration file": f"calibration: {tmp_path / 'cal.yaml'}: gopher_quality.per_language.de."
        "max_non_alpha_words_ratio: expected a finite number, got nan",
    }[place]
    assert res.stderr.splitlines() == [f"error: {config}: 1 error(s)", f"  {expected}"]
    assert not run_dir.exists()


def test_negative_thresholds_are_refused():
    msg = _err({**BASE, "steps": [{"gopher_quality": {"max_non_alpha_words_ratio": -0.5}}]})
    assert "steps[0].gopher_quality.max_non_alpha_words_ratio: input should be greater than or equal to 0" in msg
    msg = _err({**BASE, "steps": [{"gopher_repetition": {"top_n_grams": [[2, -0.2]]}}]})
    assert "steps[0].gopher_repetition.top_n_grams: n-gram rules need a fraction >= 0" in msg
    msg = _err({**BASE, "steps": [{"c4_lines": {"max_word_length": -5}}]})  # -1 disables; -5 dropped every line
    assert "steps[0].c4_lines.max_word_length: input should be greater than or equal to -1" in msg
    assert from_dict({**BASE, "steps": [{"c4_lines": {"max_word_length": -1}}]}).specs[0].params.max_word_length == -1
