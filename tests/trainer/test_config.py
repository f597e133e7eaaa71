"""The train config: presets merged in one place, the crawl config's overrides, `${VAR}` and error
collection, and the model's parameters declared once (`ModelShape`)."""

from __future__ import annotations

import pytest
import yaml

from gristmill.core.configlib import ConfigError
from gristmill.trainer.config import PRESET_DIRS, ModelSection, ModelShape, from_dict, load
from gristmill.trainer.model import ModelArgs
from gristmill.trainer.train import model_args


def test_a_preset_reads_the_same_from_a_file_or_a_mapping(tmp_path):
    """`preset:` in a file and in a mapping (the crawl YAML's `train:` section) merge alike,
    through the preset's own preset too."""
    mid = tmp_path / "mid.yaml"
    mid.write_text(yaml.safe_dump({"preset": "tiny", "steps": 7, "optim": {"lr": 1e-3}}))
    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"preset": str(mid), "optim": {"weight_decay": 0.0}}))
    tiny = load(PRESET_DIRS[1] / "tiny.yaml")
    for cfg in (load(top), from_dict({"preset": str(mid), "optim": {"weight_decay": 0.0}})):
        assert cfg.steps == 7 and cfg.optim.lr == 1e-3 and cfg.optim.weight_decay == 0.0
        assert cfg.model == tiny.model and cfg.data == tiny.data and cfg.preset is None
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(yaml.safe_dump({"preset": str(tmp_path / "back.yaml")}))
    (tmp_path / "back.yaml").write_text(yaml.safe_dump({"preset": str(cycle)}))
    with pytest.raises(ConfigError, match=r"back.yaml: preset cycle through .*cycle.yaml"):
        load(cycle)


def test_overrides_interpolation_and_errors_as_the_crawl_config(monkeypatch):
    monkeypatch.setenv("GM_TOKENS", "/data/tokens")
    monkeypatch.delenv("GM_UNSET", raising=False)
    cfg = from_dict({"preset": "tiny", "data": {"tokens": "${GM_TOKENS}"}}, ["model.dim=128", "out_dir=${GM_TOKENS}/x"])
    assert cfg.data.tokens == "/data/tokens" and cfg.model.dim == 128 and cfg.out_dir == "/data/tokens/x"
    with pytest.raises(ConfigError) as e:
        from_dict({"preset": "tiny", "data": {"tokens": "${GM_UNSET}"}}, ["optim.lr=0", "model.dims=3"], source="t")
    assert str(e.value).startswith("t: 3 error(s)\n  data.tokens: environment variable GM_UNSET is not set")
    assert "\n  model.dims: unknown key\n" in str(e.value)
    assert "\n  optim.lr: input should be greater than 0, got 0" in str(e.value)


def test_model_parameters_are_declared_once():
    """ModelArgs is the `model:` section's shape with the vocabulary and sequence length given:
    the same parameters, defaults, bounds and descriptions; the section adds doc_mask alone."""
    shape, args, section = ModelShape.model_fields, ModelArgs.model_fields, ModelSection.model_fields
    assert set(section) - set(shape) == {"doc_mask"}
    assert set(args) - set(shape) == {"max_seq_len"}
    for name, f in shape.items():
        if name != "vocab_size":
            assert (args[name].default, args[name].description, args[name].metadata) == (
                f.default,
                f.description,
                f.metadata,
            )
    assert args["vocab_size"].is_required() and not shape["vocab_size"].is_required()
    a = model_args(load("tiny", ["data.tokens=x", "model.vocab_size=null"]), 1000)
    assert (a.vocab_size, a.max_seq_len, a.dim, a.n_kv_heads, a.ffn_dim) == (1000, 128, 64, 2, 192)
    assert ModelArgs(**a.to_dict()) == a  # what a checkpoint's meta.json records rebuilds it
    d = ModelArgs(vocab_size=300, dim=64, n_heads=4).to_dict()
    assert d["n_kv_heads"] == 4 and d["ffn_dim"] == 256  # derived sizes filled in
    with pytest.raises(ValueError, match="do not divide"):
        ModelArgs(vocab_size=300, dim=64, n_heads=5)
    with pytest.raises(ValueError, match="greater than or equal to 8"):
        ModelArgs(vocab_size=300, dim=4, n_heads=1)
