"""ablate.yaml → a validated `AblateConfig`, and each variant's run configuration.

A variant is the base run config with changes: another run config file (`config:`), a
replacement step list (`steps:`), and `--set`-style overrides (`set:`), in that order. Its
`tokenize` step and `train:` section are dropped: the ablation tokenizes every variant with one
tokenizer (`tokenizer:`) and trains the proxy model itself (`model:`), so that losses and
scores compare.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from gristmill.core.configlib import ConfigError, Fraction, Strict, validate_config

__all__ = ["AblateConfig", "load", "variant_config"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class VariantSpec(Strict):
    """One variant: the base run config, changed."""

    config: str | None = Field(None, description="another run config file instead of the base")
    steps: list[Any] | None = Field(None, description="a replacement `steps:` list ([] keeps every document)")
    drop: list[str] = Field(default_factory=list, description="steps left out, by YAML name (e.g. [near_dedup])")
    set: list[str] = Field(
        default_factory=list, description="overrides as `pipeline run --set` takes them (indices after `drop`)"
    )


class ModelSpec(Strict):
    preset: str = Field("125m", description="train YAML of configs/train/ by name, or a path")
    set: list[str] = Field(default_factory=list, description="train-config overrides, e.g. [optim.lr=1e-3]")
    nproc: int | None = Field(None, ge=1, description="processes per training (default: visible GPUs, or 1)")


class TrainTokenizer(Strict):
    vocab_size: int = Field(ge=259)
    min_frequency: int = Field(2, ge=1)


class TokenizerSpec(Strict):
    path: str | None = Field(None, description="a tokenizer file every variant is encoded with")
    train: TrainTokenizer | None = Field(None, description="or: a BPE trained on a sample of every variant's documents")
    sample_bytes: int = Field(100_000_000, ge=1, description="the training sample (documents by id hash)")
    vocab_size: int | None = Field(None, ge=2, description="with path: the vocabulary the file must have")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.train is None):
            raise ValueError("give exactly one of `path` (a tokenizer file) or `train` (train one on the variants)")
        return self


class TokenizeSpec(Strict):
    shard_tokens: int = Field(100_000_000, ge=1)
    val_fraction: Fraction = 0.01
    seed: int = Field(0, ge=0)
    tasks: int | None = Field(None, ge=1, description="encode tasks (default: the base config's executor.tasks)")


class EvalSpec(Strict):
    every_tokens: int | None = Field(None, ge=1, description="tokens between scorings (null: only at the end)")
    limit: int | None = Field(500, ge=1, description="items per task (null: all)")
    corpus_tokens: int | None = Field(100_000, ge=1)
    tasks_file: str = "configs/eval/tasks.yaml"
    batch_tokens: int = Field(8192, ge=1)
    metrics: dict[str, str] = Field(
        default_factory=dict,
        description="per task, the per-item score compared (default: acc_norm for multiple choice, acc for"
        " schema, loglikelihood for language modelling)",
    )


class AblateConfig(Strict):
    base: str = Field(description="the `pipeline run` config every variant starts from")
    variants: dict[str, VariantSpec] = Field(description="name → changes to the base ({} is the base itself)")
    baseline: str | None = Field(None, description="the variant the others are compared with (default: the first)")
    model: ModelSpec = Field(default_factory=ModelSpec)
    tokens: int = Field(ge=1, description="tokens each training sees (a small variant's data is repeated)")
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    tasks: list[str] = Field(default_factory=list, description="task names of eval.tasks_file, or JSONL files")
    corpora: list[str] = Field(default_factory=list, description="held-out text scored in bits per byte")
    eval: EvalSpec = Field(default_factory=EvalSpec)
    tokenizer: TokenizerSpec
    tokenize: TokenizeSpec = Field(default_factory=TokenizeSpec)
    out: str = Field("runs/ablate", min_length=1, description="output folder")

    @field_validator("variants")
    @classmethod
    def _names(cls, variants: dict) -> dict:
        if len(variants) < 2:
            raise ValueError(f"at least two variants to compare, got {len(variants)}")
        bad = [n for n in variants if not _NAME.match(str(n))]
        if bad:
            raise ValueError(f"variant name {bad[0]!r}: letters, digits, '_', '.', '-' only (it names folders)")
        return variants

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat: {seeds}")
        return seeds

    @model_validator(mode="after")
    def _baseline(self):
        if self.baseline is None:
            self.baseline = next(iter(self.variants))
        elif self.baseline not in self.variants:
            raise ValueError(f"baseline: {self.baseline!r} is no variant (variants: {', '.join(self.variants)})")
        return self

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def names(self) -> list[str]:
        """Variants, the baseline first."""
        return [self.baseline, *(n for n in self.variants if n != self.baseline)]


def load(path: str | Path, overrides: list[str] = ()) -> AblateConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: ablation config not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    cfg = validate_config(AblateConfig, data, source=str(path), overrides=overrides)
    if not Path(cfg.base).is_file():
        raise ConfigError(f"{path}: base: {cfg.base}: run config not found")
    for name, v in cfg.variants.items():
        if v.config is not None and not Path(v.config).is_file():
            raise ConfigError(f"{path}: variants.{name}.config: {v.config}: run config not found")
    return cfg


def _read_yaml(path: str) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def variant_config(cfg: AblateConfig, name: str):
    """The run config that curates variant `name` into `<out>/curate/<name>/`: `config:` or the
    base, `steps:`, `drop:`, then `set:`; no `tokenize` step, no `train:` section. Errors say
    which variant."""
    from gristmill.config import from_dict  # the steps' modules: only when a variant is read

    spec = cfg.variants[name]
    source = spec.config or cfg.base
    data = _read_yaml(source)
    if spec.steps is not None:
        data["steps"] = list(spec.steps)
    if spec.drop:
        steps = data.get("steps") or []
        names = [next(iter(e)) if isinstance(e, dict) and len(e) == 1 else e for e in steps]
        missing = [d for d in spec.drop if d not in names]
        if missing:
            raise ConfigError(
                f"variants.{name}.drop: no step {missing[0]!r} in {source} (its steps: {', '.join(map(str, names))})"
            )
        data["steps"] = [e for e, n in zip(steps, names) if n not in spec.drop]
    data.pop("train", None)
    data.pop("tokenize", None)
    try:
        run = from_dict(data, spec.set, str(cfg.out_dir / "curate" / name), source=f"variant {name} ({source})")
    except ConfigError as e:
        raise ConfigError(str(e)) from None
    steps = [s for s in run.steps if s.name != "tokenize"]
    return run.model_copy(update={"steps": steps, "train": None})


def train_steps(tokens: int, global_batch: int, seq_len: int) -> int:
    return max(1, math.ceil(tokens / (global_batch * seq_len)))


@dataclass
class TrainRun:
    variant: str
    seed: int
    out: Path
    steps: int


def task_names(cfg: AblateConfig) -> list[str]:
    """The names tasks are scored and written under (a JSONL path: its file name's stem)."""
    return [t if "/" not in t and not t.endswith(".jsonl") else Path(t).stem for t in cfg.tasks]
