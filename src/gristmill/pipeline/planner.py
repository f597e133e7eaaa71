"""Turns the YAML's step list into executor stages.

Streamable steps (reader, filters, writer) fuse into one pass over the documents. A step that
needs every document first (`streamable = False`: dedup's clustering, a global shuffle) ends
its stage; the next stage reads that stage's Parquet output. Documents are thus read and
written once per stage, never once per step.
"""

from __future__ import annotations

import glob
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from loguru import logger

from gristmill.config import ConfigError, RunConfig, StepSpec, step_registry
from gristmill.core.filter import Filter
from gristmill.pipeline.commoncrawl import Fetcher, list_wet_paths
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.step import Step
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
    seen: dict[str, str] = {}  # real path -> how it was first named
    for i, pattern in enumerate(cfg.input.paths):
        if pattern.startswith(("http://", "https://")):
            if pattern in seen:
                logger.warning(f"input.paths[{i}]: {pattern} is listed twice; it is read once")
                continue
            seen[pattern] = pattern
            sources.append(pattern)
            continue
        matches = sorted(glob.glob(str(Path(pattern).expanduser())))
        if not matches:
            raise ConfigError(f"input.paths[{i}]: no file matches {pattern!r}")
        folders = [m for m in matches if Path(m).is_dir()]
        if folders:
            raise ConfigError(f"input.paths[{i}]: {folders[0]} is a directory, not a WET file;"
                              f" give the files, e.g. {str(Path(folders[0]) / '*.warc.wet.gz')!r}")
        for m in matches:
            real = os.path.realpath(m)
            if real in seen:
                # read twice, its documents would be duplicated (and dedup would count them as such)
                logger.warning(f"input.paths[{i}]: {m} is also matched as {seen[real]}; it is read once")
                continue
            seen[real] = m
            sources.append(m)
    return sources


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


@dataclass
class PlanContext:
    """What a step that spans stages (`streamable = False`) needs to lay out its own stages.

    Such a step class implements the classmethod
        `build_stages(cls, spec, ctx, input_folder) -> None`
    which adds its stages with `ctx.new_stage(...)`, the first reading Parquet documents from
    `input_folder`; its last stage writes Parquet documents with the columns `ctx.fields` (plus
    the class's `output_fields`) to that stage's `output`, which the planner hands to whatever
    follows.
    """

    cfg: RunConfig
    fetcher: Fetcher
    compression: str | None
    fields: dict[str, pa.DataType]
    stages: list[Stage]

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    def stage_folder(self, name: str) -> Path:
        """The folder the next stage added will have."""
        return self.run_dir / f"{len(self.stages) + 1:02d}_{name}"

    def new_stage(self, name: str, pipeline: list[Step], tasks: int | None = None) -> Stage:
        """Append a stage, numbered after those planned so far, and return it."""
        index = len(self.stages) + 1
        stage = Stage(index, name, self.stage_folder(name), pipeline, tasks or self.cfg.executor.tasks,
                      self.cfg.executor.workers, [s.name for s in pipeline])
        for step in pipeline:  # every filter of every stage (dedup's too) records its scores
            if isinstance(step, Filter) and step.scores_folder is None:
                step.scores_folder = str(stage.folder / "scores" / step.name)
        self.stages.append(stage)
        return stage


def _stream_stage(ctx: PlanContext, specs: list[StepSpec]) -> Stage:
    """Reader, the streamable steps fused in one pass, Parquet writer."""
    registry = step_registry()
    cfg = ctx.cfg
    name = "curate" if not ctx.stages else "filter"
    folder = ctx.stage_folder(name)
    if not ctx.stages:
        reader: Step = WetReader(resolve_sources(cfg, ctx.fetcher), resolve=ctx.fetcher.local_path,
                                 limit=cfg.input.limit)
    else:
        reader = ParquetReader(ctx.stages[-1].output)
    steps: list[Step] = [reader]
    for spec in specs:
        cls = registry[spec.name][1]
        steps.append(_instantiate(spec, cls, folder, ctx.fields, cfg, ctx.fetcher))
        ctx.fields.update(cls.output_fields)
    steps.append(ParquetWriter(folder / "output", dict(ctx.fields), ctx.compression))
    return ctx.new_stage(name, steps)


def _split_final_output_by_language(stage: Stage) -> None:
    """`output.per_language`: folders per language in the run's final documents only, whichever
    step (a filter stage, dedup's last stage) writes them; earlier stages stay flat."""
    writers = [s for s in stage.pipeline if isinstance(s, ParquetWriter) and s.folder == stage.output]
    if not writers:
        raise ConfigError(f"output.per_language: stage {stage.label} writes no documents to split by language")
    writers[-1].per_language = True


def plan(cfg: RunConfig) -> list[Stage]:
    registry = step_registry()
    compression = None if cfg.output.compression == "none" else cfg.output.compression
    ctx = PlanContext(cfg, make_fetcher(cfg), compression, {}, [])
    pending: list[StepSpec] = []  # streamable steps not yet placed in a stage
    for spec in cfg.specs:
        cls = registry[spec.name][1]
        if cls.streamable:
            pending.append(spec)
            continue
        if pending or not ctx.stages:  # documents must be on disk before a global step
            _stream_stage(ctx, pending)
            pending = []
        cls.build_stages(spec, ctx, ctx.stages[-1].output)
        ctx.fields.update(cls.output_fields)
    if pending or not ctx.stages:
        _stream_stage(ctx, pending)
    if cfg.output.per_language:
        _split_final_output_by_language(ctx.stages[-1])
    if cfg.tokenize is not None:  # token shards of the final documents: the run's last data stages
        from gristmill.tokenize.stages import build_stages as build_token_stages

        build_token_stages(ctx, ctx.stages[-1].output)
    return ctx.stages
