"""YAML → typed, validated run configuration (`pipeline run CONFIG`).

The sections that say how and where a run goes (executor, input, output, train) are defined
here; each step's parameters are its own nested `Config` (`gristmill.core.step`), found by its
YAML name in the step registry: `RunConfig.model_validate` validates `steps:` into `StepSpec`s.
Errors name the key path the user wrote; the config library (`gristmill.core.configlib`) does
the parsing, `${VAR}` interpolation, `--set` overrides and the collection of errors.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_serializer, field_validator, model_validator

from gristmill.core import storage
from gristmill.core.configlib import (
    ConfigError,
    Fraction,
    Strict,
    apply_override,
    key_path_error,
    messages,
    omitted_defaults,
    validate_config,
)
from gristmill.core.run_dir_kinds import run_dir_kind
from gristmill.core.step import registered_steps, step_id
from gristmill.core.storage import StorageConfig
from gristmill.input.deadlines import MAX_OBJECT_BYTES, MIN_RATE_BYTES_S, RATE_WINDOW_S
from gristmill.input.warc import DEFAULT_EXTRACTOR, MAX_ATTRIBUTES, MAX_HTML_TAGS, Extractor
from gristmill.input.wet import MAX_RECORD_BYTES

__all__ = ["ConfigError", "RunConfig", "StepSpec", "apply_override", "current_layout", "from_dict", "load"]


# --- sections ---------------------------------------------------------------------------


class SlurmStageOverrides(Strict):
    """Per-stage resources: stages differ (a MinHash bucket stage needs more memory than a filter)."""

    cpus_per_task: int | None = Field(None, ge=1)
    mem_per_cpu_gb: float | None = Field(None, gt=0)
    time: str | None = None


class SlurmConfig(Strict):
    partition: str = Field("debug", description="partition to submit to")
    time: str = Field("04:00:00", description="time limit per array task")
    cpus_per_task: int = Field(1, ge=1)
    mem_per_cpu_gb: float = Field(2, gt=0, description="memory per CPU, GB")
    qos: str | None = None
    account: str | None = None
    job_name_prefix: str = Field("gristmill", description="jobs are named <prefix>-<stage>")
    max_array_size: int = Field(
        1001,
        ge=1,
        description="most tasks per job array (the cluster's MaxArraySize, "
        "read with scontrol, caps it); a wider stage is several arrays",
    )
    requeue: bool = Field(True, description="requeue tasks that are preempted (signal SIGUSR1)")
    venv_path: str | None = Field(None, description="activate script for the jobs (default: this venv's)")
    env_command: str | None = Field(None, description="shell line run before each task instead of venv_path")
    sbatch_args: dict[str, str] = Field(default_factory=dict, description="extra `#SBATCH --key=value` lines")
    stages: dict[str, SlurmStageOverrides] = Field(default_factory=dict, description="overrides by stage name")


class RayStageOverrides(Strict):
    """Per-stage resources on Ray, by stage name (the folder after NN_)."""

    num_cpus: float | None = Field(None, gt=0)
    memory_gb: float | None = Field(None, gt=0)


class RayConfig(Strict):
    """`executor.type: ray`: stages run as Ray tasks on an existing cluster (docs/ray.md)."""

    address: str = Field(
        "auto",
        min_length=1,
        description="the cluster's head, host:port (its GCS port), ray://host:port (Ray Client), or auto "
        "(RAY_ADDRESS, else the cluster started on this machine)",
    )
    num_cpus: float = Field(1, gt=0, description="CPUs Ray reserves for each task")
    memory_gb: float | None = Field(
        None, gt=0, description="memory Ray reserves for each task (default: the planner's estimate per stage)"
    )
    max_retries: int = Field(
        2, ge=0, description="a task whose process or Ray worker dies (a signal, the OOM killer) runs again this often"
    )
    connect_timeout_s: float = Field(10, gt=0, description="give up connecting to the cluster after this long")
    autoscaling: bool = Field(
        False,
        description="the cluster adds nodes for pending tasks: do not refuse a stage whose tasks fit no node now",
    )
    runtime_env: dict[str, Any] | None = Field(
        None, description="Ray runtime_env for the run's tasks (env_vars, py_modules, working_dir, ...)"
    )
    stages: dict[str, RayStageOverrides] = Field(default_factory=dict, description="overrides by stage name")


#: the most tasks a stage may have: stages that shuffle (near_dedup's edges, tokenize's
#: buckets) write tasks x tasks files, 100 million at this bound; a whole snapshot runs on
#: 4,000 (docs/scale.md)
MAX_TASKS = 10_000


class ExecutorConfig(Strict):
    type: Literal["local", "slurm", "ray"] = "local"
    tasks: int = Field(
        4,
        ge=1,
        description="parallel tasks per stage (input files are split among them; "
        "the curate stage runs at most one per input file)",
    )
    workers: int = Field(2, ge=1, description="tasks run at once on this machine (local; Ray runs as many as fit)")
    memory_gb_per_task: float | None = Field(
        None,
        gt=0,
        description="local: memory one task may use; the planner refuses stages estimated above it "
        "(default: this machine's memory / workers). Slurm: mem_per_cpu_gb x cpus_per_task per stage; "
        "Ray: executor.ray.memory_gb or the stage's, when set",
    )
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("tasks")
    @classmethod
    def _sane_tasks(cls, tasks: int) -> int:
        if tasks > MAX_TASKS:
            raise ValueError(
                f"at most {MAX_TASKS:,}, got {tasks:,}: stages that shuffle (near_dedup, tokenize) write "
                f"tasks x tasks files ({tasks * tasks:,}); a whole Common Crawl snapshot runs on 4,000"
            )
        return tasks


CRAWL_NAME = r"^CC-MAIN-\d{4}-\d{2}$"


#: where `source:` reads Common Crawl when no `base_url` is given
CC_BASE_URLS = {"https": "https://data.commoncrawl.org", "s3": "s3://commoncrawl"}


class CommonCrawlInput(Strict):
    crawl: str = Field(pattern=CRAWL_NAME, description="crawl name, e.g. CC-MAIN-2024-22")
    files: int | None = Field(
        None, ge=1, description="take the first N files of the crawl's listing (WET, or WARC with format warc)"
    )
    paths: list[str] | None = Field(
        None, description="or: these paths from wet.paths.gz (warc.paths.gz with format warc)"
    )
    source: Literal["https", "s3"] = Field(
        "https", description="https: data.commoncrawl.org; s3: the s3://commoncrawl bucket (AWS_ENDPOINT_URL...)"
    )
    base_url: str | None = Field(None, description="server, bucket or local mirror directory (default: the source's)")
    cache: Literal["none", "keep"] = Field(
        "none", description="none: each task streams its files, nothing on disk; keep: download into cache_dir"
    )
    cache_dir: str = Field("~/.cache/gristmill/commoncrawl", description="downloaded files are kept here (cache: keep)")
    read_buffer_bytes: int = Field(
        1 << 20, ge=4096, le=1 << 30, description="the most a stream reads from the network at a time"
    )
    retries: int = Field(8, ge=0, description="retries per file on 429/5xx/SlowDown/connection errors")
    backoff_s: float = Field(1.0, gt=0, description="first retry wait; doubles per retry (capped at 60 s)")
    timeout_s: float = Field(60.0, gt=0, description="seconds to connect, and without a byte on a connection")
    min_rate_bytes_s: float = Field(
        MIN_RATE_BYTES_S,
        ge=0,
        description="a connection delivering fewer bytes per second of waiting than this over rate_window_s is cut "
        "and retried (resumed), so a server that drips never hangs a task; 0: no minimum",
    )
    rate_window_s: float = Field(
        RATE_WINDOW_S, gt=0, le=3600, description="seconds of waiting over which min_rate_bytes_s is judged"
    )
    max_object_bytes: int = Field(
        MAX_OBJECT_BYTES,
        ge=1 << 20,
        description="the most bytes read of one file (WET/WARC, compressed): a longer or endless answer fails "
        "in one line, never read on",
    )

    @model_validator(mode="after")
    def _one_selection(self):
        if (self.files is None) == (self.paths is None):
            raise ValueError("give exactly one of `files` (first N) or `paths` (a list)")
        if self.base_url is None:
            self.base_url = CC_BASE_URLS[self.source]
        elif self.base_url.startswith("s3://") != (self.source == "s3"):
            raise ValueError(
                f"base_url {self.base_url} with source: {self.source}: an s3:// base_url needs source: s3, "
                "and source: s3 an s3:// base_url"
            )
        return self


class InputConfig(Strict):
    paths: list[str] = Field(
        default_factory=list, description="WET files or globs: local paths or URLs (s3://bucket/wet/*.warc.wet.gz)"
    )
    commoncrawl: CommonCrawlInput | None = None
    format: Literal["wet", "warc"] = Field(
        "wet", description="wet: the crawl's extracted text; warc: HTML responses, text extracted by `extractor`"
    )
    extractor: Extractor = Field(
        DEFAULT_EXTRACTOR, description="format warc: HTML to text with resiliparse or trafilatura (docs/warc.md)"
    )
    limit: int = Field(-1, description="at most this many documents per task (-1: all)")
    # 8 MiB: a WET page is text extracted from a payload Common Crawl cuts at 1 MiB (5 MiB
    # announced); its UTF-8 is at most 3x the payload (a byte of a single-byte charset) and
    # markup makes it far shorter. The shared sample's 609 records (CC-MAIN-2014-10, 2017-30):
    # largest 177 KB, 99th percentile 70 KB. A WARC response is the page itself, cut at the same
    # 1 MiB. A longer record is counted, not lost silently, and every stage's memory per task
    # grows with the limit (docs/scale.md "Large records").
    max_record_bytes: int = Field(
        MAX_RECORD_BYTES,
        ge=1,
        description="a WET or WARC record (or a WARC response's decoded body) longer than this is skipped, "
        "counted as record_too_large, and never held in memory; every stage's memory per task grows with it",
    )
    max_html_tags: int = Field(
        MAX_HTML_TAGS,
        ge=1,
        description="format warc: a page with more start tags than this is skipped and counted as too_many_tags "
        "(an extractor's memory and time grow with the elements, not the bytes)",
    )
    max_html_attributes: int = Field(
        MAX_ATTRIBUTES,
        ge=1,
        description="format warc: a page with an element of more attributes than this is skipped and counted as "
        "too_many_attributes (both extractors take time quadratic in one element's distinct attributes)",
    )

    @model_validator(mode="after")
    def _one_source(self):
        if bool(self.paths) == (self.commoncrawl is not None):
            raise ValueError("give exactly one of `paths` or `commoncrawl`")
        # not "set at all": a run directory's config.yaml names every default, the extractor too
        if self.format != "warc" and self.extractor != DEFAULT_EXTRACTOR:
            raise ValueError(f"`extractor: {self.extractor}` extracts HTML: it needs `format: warc`")
        if self.format != "warc" and self.max_html_tags != MAX_HTML_TAGS:
            raise ValueError(f"`max_html_tags: {self.max_html_tags}` limits HTML pages: it needs `format: warc`")
        if self.format != "warc" and self.max_html_attributes != MAX_ATTRIBUTES:
            raise ValueError(
                f"`max_html_attributes: {self.max_html_attributes}` limits HTML pages: it needs `format: warc`"
            )
        return self


class OutputConfig(Strict):
    format: Literal["parquet"] = "parquet"
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    per_language: bool = Field(False, description="write output/<language>/ folders (needs langid)")
    dropped_sample: Fraction = Field(0.1, description="fraction of dropped documents written per filter")


class StepSpec(BaseModel):
    """One validated entry of `steps:`: its YAML name, position and parameters."""

    name: str
    index: int
    params: BaseModel

    @property
    def step_id(self) -> str:
        return step_id(self.index, self.name)


class TrainSection(Strict):
    """Train a model on the run's token shards after the pipeline (`<run_dir>/train/`)."""

    preset: str = Field("tiny", description="a train YAML in configs/train/ (tiny, 125m, 350m, 1b) or a path")
    steps: int | None = Field(None, ge=1, description="optimizer steps (default: the preset's)")
    nproc: int | None = Field(None, ge=1, description="processes (default: visible GPUs, or 1 on CPU)")
    set: list[str] = Field(default_factory=list, description="train-config overrides, e.g. [optim.lr=1e-3]")
    # Slurm only (executor.type: slurm): the training job's shape and preemption grace period.
    nodes: int = Field(1, ge=1, description="slurm: nodes; torchrun per node, c10d rendezvous when > 1")
    gpus_per_node: int = Field(0, ge=0, description="slurm: GPUs per node (0: CPU training)")
    preempt_grace_s: int = Field(120, ge=10, description="slurm: SIGUSR1 this long before the time limit")


#: Top-level sections that are steps now, read as the last entry of `steps:`: a config written
#: before tokenization was a step (`tokenize: {...}` beside `steps:`) keeps working, and a run
#: directory made then resumes (`current_layout`).
SECTIONS_AS_STEPS = ("tokenize",)


class _SectionStep(dict):
    """A `steps:` entry that was written as a top-level section: its errors name the section."""


def current_layout(data: dict, entry: type[dict] = dict) -> dict:
    """`data` (left unchanged) with each section of SECTIONS_AS_STEPS moved to the end of
    `steps:` as `{name: params}`; a section given as null is dropped (the config.yaml of a run
    directory made before says `tokenize: null` when the run had none)."""
    moved = [key for key in SECTIONS_AS_STEPS if key in data]
    if not moved:
        return data
    data = dict(data)
    steps = data.get("steps", [])
    steps = list(steps) if isinstance(steps, list) else steps
    for key in moved:
        params = data.pop(key)
        if params is not None and isinstance(steps, list):  # a `steps:` that is no list is reported as such
            steps.append(entry({key: params}))
    data["steps"] = steps
    return data


def _entry_name(entry: Any) -> Any:
    if isinstance(entry, dict) and len(entry) == 1:
        return next(iter(entry))
    return entry if isinstance(entry, str) else None


def _step_specs(raw: Any) -> list[StepSpec]:
    """`steps:` as written → the validated steps; every problem in one error, each line naming
    `steps[i].name.key` (or the section's key, for a step written as a section)."""
    if not isinstance(raw, list):
        raise key_path_error([f"steps: expected a list of steps, got {raw!r}"], of_parent=True)
    registry = registered_steps()
    specs, problems = [], []
    last = sum(not isinstance(e, _SectionStep) for e in raw) - 1  # sections come after the steps written
    for i, entry in enumerate(raw):
        where = f"steps[{i}]"
        if isinstance(entry, str):
            entry = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            problems.append(f"{where}: expected one `name: {{params}}` mapping, got {entry!r}")
            continue
        ((name, params),) = entry.items()
        prefix = name if isinstance(entry, _SectionStep) else f"{where}.{name}"
        if name not in registry:
            problems.append(f"{where}: unknown step {name!r} (known: {', '.join(sorted(registry))})")
            continue
        if isinstance(entry, _SectionStep):
            also = [j for j, e in enumerate(raw[:i]) if _entry_name(e) == name]
            if also:
                problems.append(f"{name}: also given as steps[{also[0]}]; write it once, as the last step")
                continue
        elif registry[name].last_step and i != last:
            problems.append(f"{where}.{name}: must be the last step ({registry[name].last_step})")
        model = registry[name].Config
        if params is None:
            params = {}
        if not isinstance(params, dict):
            problems.append(f"{prefix}: expected a mapping of parameters, got {params!r}")
            continue
        try:
            specs.append(StepSpec(name=name, index=i, params=model.model_validate(params)))
        except ValidationError as e:
            problems.extend(messages(e, prefix, model))
    if problems:
        raise key_path_error(problems, of_parent=True)
    return specs


class RunConfig(Strict):
    run_dir: str = Field("runs/crawl", min_length=1, description="where stages, stats and outputs are written")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    input: InputConfig
    steps: list[StepSpec] = Field(default_factory=list, description="steps in the order documents meet them")
    output: OutputConfig = Field(default_factory=OutputConfig)
    train: TrainSection | None = Field(None, description="train a model on the token shards afterwards")
    calibration: str | None = Field(
        None,
        description="YAML of per-language thresholds `{step: {per_language: "
        "{...}}}` (`pipeline calibrate`), under each step's own per_language",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description="how URLs (s3://, gs://, hf://) are reached, and the local scratch space (docs/storage.md)",
    )

    @model_validator(mode="before")
    @classmethod
    def _sections_as_steps(cls, data: Any) -> Any:
        return current_layout(data, _SectionStep) if isinstance(data, dict) else data

    @field_validator("steps", mode="plain")
    @classmethod
    def _validate_steps(cls, raw: Any) -> list[StepSpec]:
        return _step_specs(raw)

    @field_serializer("steps")
    def _dump_steps(self, specs: list[StepSpec], info) -> list[dict]:
        # as written in YAML, `- name: {params}`. Parameters added later, at their default, say
        # nothing about the run: left out, a run directory made before they existed resumes
        # (its config.yaml has none of them)
        return [{s.name: s.params.model_dump(mode=info.mode, exclude=set(omitted_defaults(s.params)))} for s in specs]

    @field_validator("run_dir")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        proto = storage.protocol(value)
        if proto is None:
            # `--run-dir '~/x'` (quoted, so no shell expanded it) means the home directory's x
            return os.path.expanduser(str(storage.local_or_url(value)))
        if proto in storage.READ_ONLY:
            raise ValueError(f"{value}: {proto}:// is read-only; a run directory is written")
        if proto not in storage.RUN_DIR_PROTOCOLS:
            raise ValueError(
                f"{value}: a run directory on {proto}:// is not supported: one run per directory needs a "
                "conditional create (If-None-Match), which gristmill issues through S3's API only; use s3:// "
                "(AWS S3, MinIO, R2, Ceph) or a local path (inputs, models and exports may still be on "
                f"{proto}://)"
            )
        return value.rstrip("/")

    @property
    def specs(self) -> list[StepSpec]:
        """The validated steps (`steps`)."""
        return self.steps

    def changes_from(self, old: dict) -> list[str]:
        """The settings that differ between the configuration a run directory holds (`old`, as
        it was written, any earlier layout) and this one, leaving out those that change how or
        where a run goes, never what it writes: `key: old -> new` each. A resume is refused
        while any is left."""
        return config_differences(current_layout(old), self.resolved())

    def resolved(self) -> dict:
        """The configuration as run, for the run directory (defaults filled in)."""
        data = self.model_dump(mode="json")
        if data.get("calibration") is None:
            data.pop("calibration", None)
        if self.storage == StorageConfig():
            data.pop("storage", None)  # as a run directory made before the section existed holds it
        return data


def _storage_of(data: dict) -> StorageConfig | None:
    """The config's own storage settings, to read a calibration URL with (None: invalid, which the
    validation of `storage` reports)."""
    try:
        return StorageConfig.model_validate(data.get("storage") or {})
    except ValidationError:
        return None


def _apply_calibration(data: dict, errors: list[str]) -> None:
    """Merge the calibration file's `per_language` of each step under the step's own: per
    language and key, what the run config says wins. Steps of the file that the run lacks are
    ignored (one file serves several configs); the merged values are validated with the step's
    (so they are in the run directory's config.yaml, and a changed file is a changed run)."""
    where = "calibration"
    path = data["calibration"]
    if not isinstance(path, str):
        errors.append(f"{where}: expected a path to a YAML file, got {path!r}")
        return
    file = storage.local_or_url(path)
    try:
        if isinstance(file, Path):
            text = file.read_text()
        else:  # a URL: read with the config's own storage settings
            text = storage.read_bytes(file, _storage_of(data)).decode("utf-8", "replace")
        table = yaml.safe_load(text)
    except OSError as e:
        errors.append(f"{where}: {file}: {e.strerror or e}" if isinstance(file, Path) else f"{where}: {e}")
        return
    except yaml.YAMLError as e:
        errors.append(f"{where}: {file}: not valid YAML: {e}")
        return
    registry = registered_steps()
    if not isinstance(table, dict):
        errors.append(f"{where}: {file}: expected a mapping `step: {{per_language: {{...}}}}`, got {table!r}")
        return
    for step, section in table.items():
        if step not in registry:
            errors.append(f"{where}: {file}: unknown step {step!r} (known: {', '.join(sorted(registry))})")
            continue
        if (
            not isinstance(section, dict)
            or set(section) != {"per_language"}
            or not isinstance(section["per_language"], dict)
        ):
            errors.append(f"{where}: {file}: {step}: expected `per_language: {{language: {{param: value}}}}`")
            continue
        # a computed file's likeliest fault (a mean of nothing): named here with the file, and
        # not merged, so that each value is reported once
        errors.extend(
            f"{where}: {file}: {key}: expected a finite number, got {value!r}"
            for key, value in _non_finite(section, step)
        )
    if any(e.startswith(f"{where}:") for e in errors):
        return
    steps = data.get("steps")
    if not isinstance(steps, list):
        return
    for i, entry in enumerate(steps):
        if isinstance(entry, str):
            entry = steps[i] = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            continue  # reported by the validation of `steps`
        ((name, params),) = entry.items()
        if name not in table:
            continue
        if params is None:
            params = entry[name] = {}
        if not isinstance(params, dict):
            continue
        own = params.get("per_language") or {}
        if not isinstance(own, dict):
            continue
        merged = {
            lang: dict(values) if isinstance(values, dict) else values
            for lang, values in table[name]["per_language"].items()
        }
        for lang, values in own.items():
            merged[lang] = {**merged.get(lang, {}), **values} if isinstance(values, dict) else values
        params["per_language"] = merged


def _non_finite(node: Any, path: str) -> list[tuple[str, float]]:
    """(key path, value) of every NaN or infinite float in a YAML tree."""
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(path, node)]
    if isinstance(node, dict):
        return [found for k, v in node.items() for found in _non_finite(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [found for i, v in enumerate(node) for found in _non_finite(v, f"{path}[{i}]")]
    return []


def load(path: str | Path, overrides: list[str] = (), run_dir: str | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if isinstance(data, dict) and "variants" in data and "base" in data:
        # an ablation config (gristmill.ablation.config) given where a run config is expected
        raise ConfigError(
            f"{path}: an ablation config (it has `base:` and `variants:`): run it with `pipeline ablate {path}`"
        )
    return from_dict(data, overrides, run_dir, source=str(path))


def from_dict(data: Any, overrides: list[str] = (), run_dir: str | None = None, source: str = "config") -> RunConfig:
    """The run config of a YAML mapping: `--set` overrides, then `--run-dir`, then the calibration
    file's thresholds merged under the steps' own (`RunConfig.model_validate` does the rest)."""

    def prepare(data: dict, errors: list[str]) -> dict:
        if run_dir is not None:
            data["run_dir"] = run_dir
        if data.get("calibration") is not None:
            _apply_calibration(data, errors)
        return data

    return validate_config(RunConfig, data, source=source, overrides=overrides, prepare=prepare, checks=_checks)


# Settings that change how or where a run goes, never what it writes (key prefixes). `run_dir`
# itself is one: a run directory moved or copied elsewhere resumes where it stopped.
_OUTPUT_NEUTRAL = ("executor.workers", "executor.type", "executor.slurm", "executor.ray", "run_dir", "storage")
# How the input's bytes arrive (streamed or cached, read size, patience): the same bytes either way.
_OUTPUT_NEUTRAL += tuple(
    f"input.commoncrawl.{k}"
    for k in ("source", "cache", "read_buffer_bytes", "timeout_s", "retries", "backoff_s")
    + ("min_rate_bytes_s", "rate_window_s", "max_object_bytes")
)


def _flatten(node, prefix="") -> dict[str, object]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(node, list):
        out = {}
        for i, v in enumerate(node):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: node}


def config_differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every output-affecting setting that differs between two resolved configs."""
    a, b = _flatten(old), _flatten(new)
    keys = sorted(
        k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>") and not k.startswith(_OUTPUT_NEUTRAL)
    )
    return [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys]


def _checks(cfg: RunConfig) -> list[str]:
    """Rules across sections."""
    problems = []
    if cfg.output.per_language and not any(s.name == "langid" for s in cfg.steps):
        problems.append("output.per_language: needs a `langid` step to know each document's language")
    # what the run directory's kind cannot serve (training in place, an executor), said by that kind
    problems += run_dir_kind(cfg.run_dir).refusals(cfg)
    return problems
