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
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, model_validator


class ConfigError(ValueError):
    """A configuration problem; the message names every offending key path."""


def _fraction(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number between 0 and 1, got {value!r}")
    return float(value)


Fraction = Annotated[float, BeforeValidator(_fraction)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- sections ---------------------------------------------------------------------------


class ExecutorConfig(_Strict):
    type: Literal["local"] = "local"
    tasks: int = Field(4, ge=1, description="parallel tasks per stage (input files are split among them)")
    workers: int = Field(2, ge=1, description="tasks run at once on this machine")


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


class LangIdConfig(_Strict):
    model: str = Field("models/lid.176.ftz", description="fastText LID model: path or http(s) URL")
    languages: list[str] | None = Field(["en"], description="languages to keep; null keeps all")
    min_score: Fraction = Field(0.65, description="minimum probability of the top language")


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
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


def step_registry() -> dict[str, tuple[type[BaseModel], type]]:
    """YAML step name → (config model, step class). The module of each step is its YAML name."""
    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId

    reg: dict[str, tuple[type[BaseModel], type]] = {"langid": (LangIdConfig, LangId)}
    for cls in (GopherQuality, GopherRepetition, C4Lines):
        reg[cls.yaml_name] = (_config_from_signature(cls, f"{cls.__name__}Config"), cls)
    return reg


class StepSpec(BaseModel):
    """One validated entry of `steps:`: its YAML name, position and parameters."""

    name: str
    index: int
    params: BaseModel

    @property
    def step_id(self) -> str:
        return f"{self.index:02d}_{self.name}"


class RunConfig(_Strict):
    run_dir: str = Field("runs/crawl", description="where stages, stats and outputs are written")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    input: InputConfig
    steps: list[Any] = Field(default_factory=list, description="steps in the order documents meet them")
    output: OutputConfig = Field(default_factory=OutputConfig)

    # filled by load(): the validated steps
    _specs: list[StepSpec] = []

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
