"""Turns the YAML's step list into executor stages.

Streamable steps (reader, filters, writer) fuse into one pass over the documents. A step that
needs every document first (`streamable = False`: dedup's clustering, a global shuffle) ends
its stage; the next stage reads that stage's Parquet output. Documents are thus read and
written once per stage, never once per step.
"""

from __future__ import annotations

import glob
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from gristmill.config import ConfigError, RunConfig, StepSpec, step_registry
from gristmill.filters.base import Filter
from gristmill.pipeline.commoncrawl import Fetcher, list_wet_paths
from gristmill.pipeline.parquet_reader import ParquetReader
from gristmill.pipeline.step import Step
from gristmill.pipeline.wet_reader import WetReader
from gristmill.pipeline.writers import DroppedSampler, ParquetWriter


@dataclass
class Stage:
    index: int
    name: str
    folder: Path
    pipeline: list[Step]
    tasks: int
    workers: int
    step_names: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.index:02d}_{self.name}"

    @property
    def output(self) -> Path:
        return self.folder / "output"


def make_fetcher(cfg: RunConfig) -> Fetcher:
    cc = cfg.input.commoncrawl
    if cc is None:  # still needed for a langid model given as a URL
        return Fetcher(Path("~/.cache/gristmill/downloads").expanduser())
    return Fetcher(Path(cc.cache_dir).expanduser(), retries=cc.retries, backoff=cc.backoff_s)


def resolve_sources(cfg: RunConfig, fetcher: Fetcher) -> list[str]:
    """The WET files of the run, in a defined order (later dedup keeps first occurrences by it)."""
    if cfg.input.commoncrawl is not None:
        cc = cfg.input.commoncrawl
        return list_wet_paths(cc.base_url, cc.crawl, files=cc.files, paths=cc.paths, fetcher=fetcher)
    sources: list[str] = []
    for i, pattern in enumerate(cfg.input.paths):
        if pattern.startswith(("http://", "https://")):
            sources.append(pattern)
            continue
        matches = sorted(glob.glob(str(Path(pattern).expanduser())))
        if not matches:
            raise ConfigError(f"input.paths[{i}]: no file matches {pattern!r}")
        sources.extend(matches)
    return sources


def split_into_groups(specs: list[StepSpec]) -> list[list[StepSpec]]:
    registry = step_registry()
    groups: list[list[StepSpec]] = [[]]
    for spec in specs:
        groups[-1].append(spec)
        if not registry[spec.name][1].streamable:
            groups.append([])
    if len(groups) > 1 and not groups[-1]:
        groups.pop()
    return groups


def _instantiate(spec: StepSpec, cls: type, stage_folder: Path, fields: dict, cfg: RunConfig, fetcher: Fetcher):
    kwargs = spec.params.model_dump()
    accepted = inspect.signature(cls.__init__).parameters
    if "resolve" in accepted:
        kwargs["resolve"] = fetcher.local_path
    if issubclass(cls, Filter) and cfg.output.dropped_sample > 0:
        kwargs["dropped"] = DroppedSampler(
            stage_folder / "dropped" / spec.step_id, cfg.output.dropped_sample, {**fields, **cls.output_fields}
        )
    return cls(step_id=spec.step_id, **kwargs)


def plan(cfg: RunConfig) -> list[Stage]:
    run_dir = Path(cfg.run_dir)
    registry = step_registry()
    fetcher = make_fetcher(cfg)
    compression = None if cfg.output.compression == "none" else cfg.output.compression
    stages: list[Stage] = []
    fields: dict[str, pa.DataType] = {}  # metadata columns accumulated along the steps
    groups = split_into_groups(cfg.specs)
    for gi, group in enumerate(groups):
        last = group[-1] if group else None
        name = last.name if last is not None and not registry[last.name][1].streamable else "curate"
        index = gi + 1
        folder = run_dir / f"{index:02d}_{name}"
        if gi == 0:
            reader: Step = WetReader(resolve_sources(cfg, fetcher), resolve=fetcher.local_path, limit=cfg.input.limit)
        else:
            reader = ParquetReader(stages[-1].output)
        steps: list[Step] = [reader]
        for spec in group:
            cls = registry[spec.name][1]
            steps.append(_instantiate(spec, cls, folder, fields, cfg, fetcher))
            fields.update(cls.output_fields)
        per_language = cfg.output.per_language and gi == len(groups) - 1  # only the final output
        steps.append(ParquetWriter(folder / "output", dict(fields), compression, per_language))
        stages.append(
            Stage(index, name, folder, steps, cfg.executor.tasks, cfg.executor.workers, [s.name for s in steps])
        )
    return stages
