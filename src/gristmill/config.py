"""YAML → typed, validated run configuration.

Errors name the key path the user wrote (`steps[2].langid.min_score: expected a number between
0 and 1, got 'high'`), so a typo in a 40-line config is found in one look. Strings may use
`${VAR}` / `${VAR:-default}`; `--set dotted.key=value` overrides are applied before validation.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, field_validator,
                      model_validator)


class ConfigError(ValueError):
    """A configuration problem; the message names every offending key path."""


def _fraction(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number between 0 and 1, got {value!r}")
    return float(value)


Fraction = Annotated[float, BeforeValidator(_fraction)]


def _numeric_types(annotation: Any) -> set[type]:
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is not Annotated:
        return set().union(*(_numeric_types(a) for a in args))
    base = args[0] if args else annotation
    return {base} & {int, float, bool}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info) -> Any:
        # pydantic turns `true` into 1 for an int field; `--set executor.tasks=true` is a mistake
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            kinds = _numeric_types(cls.model_fields[info.field_name].annotation)
            if kinds and bool not in kinds:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


# --- sections ---------------------------------------------------------------------------


class SlurmStageOverrides(_Strict):
    """Per-stage resources: stages differ (a MinHash bucket stage needs more memory than a filter)."""

    cpus_per_task: int | None = Field(None, ge=1)
    mem_per_cpu_gb: float | None = Field(None, gt=0)
    time: str | None = None


class SlurmConfig(_Strict):
    partition: str = Field("debug", description="partition to submit to")
    time: str = Field("04:00:00", description="time limit per array task")
    cpus_per_task: int = Field(1, ge=1)
    mem_per_cpu_gb: float = Field(2, gt=0, description="memory per CPU, GB")
    qos: str | None = None
    account: str | None = None
    job_name_prefix: str = Field("gristmill", description="jobs are named <prefix>-<stage>")
    max_array_size: int = Field(1001, ge=1, description="the cluster's MaxArraySize; larger stages split")
    requeue: bool = Field(True, description="requeue tasks that are preempted (signal SIGUSR1)")
    venv_path: str | None = Field(None, description="activate script for the jobs (default: this venv's)")
    env_command: str | None = Field(None, description="shell line run before each task instead of venv_path")
    sbatch_args: dict[str, str] = Field(default_factory=dict, description="extra `#SBATCH --key=value` lines")
    stages: dict[str, SlurmStageOverrides] = Field(default_factory=dict, description="overrides by stage name")


class ExecutorConfig(_Strict):
    type: Literal["local", "slurm"] = "local"
    tasks: int = Field(4, ge=1, description="parallel tasks per stage (input files are split among them)")
    workers: int = Field(2, ge=1, description="tasks run at once on this machine (local)")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)


CRAWL_NAME = r"^CC-MAIN-\d{4}-\d{2}$"


class CommonCrawlInput(_Strict):
    crawl: str = Field(pattern=CRAWL_NAME, description="crawl name, e.g. CC-MAIN-2024-22")
    files: int | None = Field(None, ge=1, description="take the first N WET files of the crawl")
    paths: list[str] | None = Field(None, description="or: these WET paths from wet.paths.gz")
    base_url: str = Field("https://data.commoncrawl.org", description="server or local mirror directory")
    cache_dir: str = Field("~/.cache/gristmill/commoncrawl", description="downloaded files are kept here")
    retries: int = Field(8, ge=0, description="retries per file on 429/5xx/SlowDown/connection errors")
    backoff_s: float = Field(1.0, gt=0, description="first retry wait; doubles per retry (capped at 60 s)")

    @model_validator(mode="after")
    def _one_selection(self):
        if (self.files is None) == (self.paths is None):
            raise ValueError("give exactly one of `files` (first N) or `paths` (a list)")
        return self


class InputConfig(_Strict):
    paths: list[str] = Field(default_factory=list, description="local WET files or globs")
    commoncrawl: CommonCrawlInput | None = None
    limit: int = Field(-1, description="at most this many documents per task (-1: all)")
    max_record_bytes: int = Field(32 << 20, ge=1, description="a WET record longer than this is skipped, "
                                  "counted as record_too_large, and never held in memory")

    @model_validator(mode="after")
    def _one_source(self):
        if bool(self.paths) == (self.commoncrawl is not None):
            raise ValueError("give exactly one of `paths` or `commoncrawl`")
        return self


class OutputConfig(_Strict):
    format: Literal["parquet"] = "parquet"
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    per_language: bool = Field(False, description="write output/<language>/ folders (needs langid)")
    dropped_sample: Fraction = Field(0.1, description="fraction of dropped documents written per filter")


class TrainTokenizerConfig(_Strict):
    vocab_size: int = Field(ge=259, description="vocabulary size, including 256 bytes and 3 special tokens")
    min_frequency: int = Field(2, ge=1, description="a pair merges only if seen at least this often")


class TokenizerSourceConfig(_Strict):
    path: str | None = Field(None, description="tokenizer.json, a folder with GPT-2's encoder.json + vocab.bpe, or a .tiktoken file")
    train: TrainTokenizerConfig | None = Field(None, description="or: train a byte-level BPE on the run's documents")
    sample_bytes: int = Field(100_000_000, ge=1, description="documents (by id hash) to train on and to check tiktoken against HF")
    check_docs: int = Field(1000, ge=1, description="sampled documents on which tiktoken must give HF's ids to be used")
    engine: Literal["auto", "tiktoken", "hf"] = Field("auto", description="auto: tiktoken when it gives HF's ids")
    pattern: str | None = Field(None, description="pre-tokenizer regex of a .tiktoken file not known by name")
    eos_token: str = "<|endoftext|>"
    bos_token: str | None = "<|bos|>"
    pad_token: str | None = "<|pad|>"

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.train is None):
            raise ValueError("give exactly one of `path` (load a tokenizer) or `train` (train one)")
        return self


class TokenizeConfig(_Strict):
    tokenizer: TokenizerSourceConfig
    shard_tokens: int = Field(100_000_000, ge=1, description="a shard is closed once it holds this many tokens")
    val_fraction: Fraction = Field(0.01, description="share of documents (by id hash) in the val split")
    seed: int = Field(0, ge=0, description="seed of the global document shuffle")
    threads: int = Field(1, ge=1, description="encoding threads per task (tiktoken)")
    batch_docs: int = Field(1000, ge=1, description="documents encoded per batch")
    tasks: int | None = Field(None, ge=1, description="encode tasks (default: executor.tasks)")


class LangIdConfig(_Strict):
    model: str = Field("models/lid.176.ftz", description="fastText LID model: path or http(s) URL")
    languages: list[str] | None = Field(["en"], description="languages to keep; null keeps all")
    min_score: Fraction = Field(0.65, description="minimum probability of the top language")


class KenLMConfig(_Strict):
    models: dict[str, str] = Field({"en": "models/kenlm/en.arpa.bin"}, description="language -> KenLM .arpa or binary")
    default_language: str | None = Field(None, description="language of documents without langid's `language`")
    max_perplexity: float | None = Field(None, gt=0, description="drop documents with a higher perplexity")
    keep_buckets: list[Literal["head", "middle", "tail"]] | None = Field(None, description="CCNet buckets to keep")
    cutoffs: dict[str, tuple[float, float]] | None = Field(None, description="[head, middle] cut-offs per language "
                                                           "(default: the model's .stats.json)")


class QualityConfig(_Strict):
    model: str = Field("models/quality/en.bin", description="fastText classifier")
    label: str = Field("__label__hq", description="label whose probability is the quality score")
    min_score: Fraction = Field(0.5, description="minimum probability of `label`")


def _config_from_signature(cls: type, name: str) -> type[BaseModel]:
    """A strict config model whose fields are the step constructor's keyword parameters.

    The heuristic filters mirror datatrove's many thresholds; deriving the schema from the
    constructor keeps YAML, validation and code from drifting apart.
    """
    hints = typing.get_type_hints(cls.__init__)
    fields = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in ("self", "step_id", "dropped") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        fields[p.name] = (hints.get(p.name, Any), p.default)
    return create_model(name, __base__=_Strict, **fields)


def step_registry() -> dict[str, tuple[type[BaseModel], type]]:
    """YAML step name → (config model, step class). The module of each step is its YAML name."""
    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId

    reg: dict[str, tuple[type[BaseModel], type]] = {"langid": (LangIdConfig, LangId)}
    for cls in (GopherQuality, GopherRepetition, C4Lines):
        reg[cls.yaml_name] = (_config_from_signature(cls, f"{cls.__name__}Config"), cls)
    # dedup: global steps (streamable = False); their config models live beside them
    from gristmill.dedup.exact import ExactDedup, ExactDedupConfig
    from gristmill.dedup.near import NearDedup, NearDedupConfig

    reg["exact_dedup"] = (ExactDedupConfig, ExactDedup)
    reg["near_dedup"] = (NearDedupConfig, NearDedup)
    from gristmill.filters.kenlm import KenLM
    from gristmill.filters.quality import Quality

    reg["kenlm"] = (KenLMConfig, KenLM)
    reg["quality"] = (QualityConfig, Quality)
    return reg


class StepSpec(BaseModel):
    """One validated entry of `steps:`: its YAML name, position and parameters."""

    name: str
    index: int
    params: BaseModel

    @property
    def step_id(self) -> str:
        return f"{self.index:02d}_{self.name}"


class TrainSection(_Strict):
    """Train a model on the run's token shards after the pipeline (`<run_dir>/train/`)."""

    preset: str = Field("tiny", description="a train YAML in configs/train/ (tiny, 125m, 350m, 1b) or a path")
    steps: int | None = Field(None, ge=1, description="optimizer steps (default: the preset's)")
    nproc: int | None = Field(None, ge=1, description="processes (default: visible GPUs, or 1 on CPU)")
    set: list[str] = Field(default_factory=list, description="train-config overrides, e.g. [optim.lr=1e-3]")
    # Slurm only (executor.type: slurm): the training job's shape and preemption grace period.
    nodes: int = Field(1, ge=1, description="slurm: nodes; torchrun per node, c10d rendezvous when > 1")
    gpus_per_node: int = Field(0, ge=0, description="slurm: GPUs per node (0: CPU training)")
    preempt_grace_s: int = Field(120, ge=10, description="slurm: SIGUSR1 this long before the time limit")


class RunConfig(_Strict):
    run_dir: str = Field("runs/crawl", min_length=1, description="where stages, stats and outputs are written")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    input: InputConfig
    steps: list[Any] = Field(default_factory=list, description="steps in the order documents meet them")
    output: OutputConfig = Field(default_factory=OutputConfig)
    tokenize: TokenizeConfig | None = Field(None, description="BPE token shards of the final documents")
    train: TrainSection | None = Field(None, description="train a model on the token shards afterwards")

    # filled by load(): the validated steps
    _specs: list[StepSpec] = []

    @field_validator("run_dir")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        # `--run-dir '~/x'` (quoted, so no shell expanded it) means the home directory's x
        return os.path.expanduser(value)

    @property
    def specs(self) -> list[StepSpec]:
        return self._specs

    def resolved(self) -> dict:
        """The configuration as run, for the run directory (defaults filled in)."""
        data = self.model_dump(mode="json")
        data["steps"] = [{s.name: s.params.model_dump(mode="json")} for s in self._specs]
        return data


# --- loading ----------------------------------------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(node: Any, path: str, errors: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", errors) for i, v in enumerate(node)]
    if isinstance(node, str):

        def sub(m: re.Match) -> str:
            value = os.environ.get(m.group(1))
            if value is None or (value == "" and m.group(2) is not None):
                if m.group(2) is None:
                    errors.append(f"{path}: environment variable {m.group(1)} is not set (use ${{{m.group(1)}:-default}})")
                    return m.group(0)
                return m.group(2)
            return value

        return _VAR.sub(sub, node)
    return node


_KEY = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def apply_override(data: dict, assignment: str) -> None:
    """Apply `a.b[0].c=value` (or `a.b.0.c=value`); the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected dotted.key=value")
    key, raw = assignment.split("=", 1)
    parts: list[str | int] = []
    for m in _KEY.finditer(key):
        token = m.group(1) if m.group(1) is not None else m.group(2)
        parts.append(int(token) if token.isdigit() else token)
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {key}: value is not valid YAML: {e}") from None
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = key if i == 0 else ".".join(map(str, parts[: i + 1]))
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError(f"--set {key}: no list item [{part}] at {where}")
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {where} is not a mapping")
            # a step entry `- langid: {}` may hold None for its parameters
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"--set {key}: no list item [{last}]")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"--set {key}: parent is not a mapping")


def _loc(prefix: str, loc: tuple) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's internal validator frames, not user keys
        else:
            out += f".{part}" if out else str(part)
    return out


def _messages(err: ValidationError, prefix: str, model: type[BaseModel] | None = None) -> list[str]:
    msgs = []
    for e in err.errors():
        where = _loc(prefix, e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = ""
            if model is not None and len(e["loc"]) == 1:
                allowed = f" (allowed: {', '.join(model.model_fields)})"
            msgs.append(f"{where}: unknown key{allowed}")
        elif e["type"] == "missing":
            msgs.append(f"{where}: required key is missing")
        elif e["type"] == "value_error":
            msgs.append(f"{where}: {str(e['ctx']['error'])}")
        else:
            msgs.append(f"{where}: {e['msg'].lower()}, got {e['input']!r}")
    return msgs


def _validate_steps(raw_steps: Any, errors: list[str]) -> list[StepSpec]:
    registry = step_registry()
    specs = []
    if not isinstance(raw_steps, list):
        errors.append(f"steps: expected a list of steps, got {raw_steps!r}")
        return specs
    for i, entry in enumerate(raw_steps):
        where = f"steps[{i}]"
        if isinstance(entry, str):
            entry = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            errors.append(f"{where}: expected one `name: {{params}}` mapping, got {entry!r}")
            continue
        (name, params), = entry.items()
        if name not in registry:
            errors.append(f"{where}: unknown step {name!r} (known: {', '.join(sorted(registry))})")
            continue
        model = registry[name][0]
        if params is None:
            params = {}
        if not isinstance(params, dict):
            errors.append(f"{where}.{name}: expected a mapping of parameters, got {params!r}")
            continue
        try:
            specs.append(StepSpec(name=name, index=i, params=model.model_validate(params)))
        except ValidationError as e:
            errors.extend(_messages(e, f"{where}.{name}", model))
    return specs


def load(path: str | Path, overrides: list[str] = (), run_dir: str | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return from_dict(data, overrides, run_dir, source=str(path))


def from_dict(data: Any, overrides: list[str] = (), run_dir: str | None = None, source: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for assignment in overrides:
        apply_override(data, assignment)
    if run_dir is not None:
        data["run_dir"] = run_dir
    errors: list[str] = []
    data = _interpolate(data, "", errors)
    specs = _validate_steps(data.get("steps", []), errors)
    cfg = None
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        errors.extend(_messages(e, "", RunConfig))
    if cfg is not None and cfg.output.per_language and not any(s.name == "langid" for s in specs):
        errors.append("output.per_language: needs a `langid` step to know each document's language")
    if errors:
        raise ConfigError(f"{source}: {len(errors)} error(s)\n  " + "\n  ".join(errors))
    cfg._specs = specs
    return cfg
