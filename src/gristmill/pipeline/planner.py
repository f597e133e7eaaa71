"""Turns the YAML's step list into executor stages.

Streamable steps (reader, filters, writer) fuse into one pass over the documents. A global
step (dedup, tokenization: `streamable = False`) lays out its own stages with `stages(ctx)`;
the first reads the documents on disk, the last writes those that follow. Documents are thus
read and written once per stage, never once per step.

`plan()` is one loop over the built steps: it knows no step by name or class. `PlanContext`
implements the `StageContext` the steps plan against (`gristmill.core.step`).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from loguru import logger

from gristmill.config import ConfigError, RunConfig
from gristmill.core.filter import Filter
from gristmill.core.parquet_io import ParquetReader, ParquetWriter
from gristmill.core.sinks import DroppedSampler
from gristmill.core.step import Stage, Step, registered_steps
from gristmill.core.wet_reader import WetReader
from gristmill.pipeline.commoncrawl import Fetcher, list_wet_paths
from gristmill.tokenize.stages import Tokenize

__all__ = ["PlanContext", "Stage", "make_fetcher", "plan", "resolve_sources"]


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


@dataclass
class PlanContext:
    """The stage context of one run (see `gristmill.core.step.StageContext`)."""

    cfg: RunConfig
    fetcher: Fetcher
    #: folder of the documents on disk at this point of the plan (None before the first stage)
    documents: Path | None = None
    #: metadata columns those documents carry, beyond the base fields
    fields: dict[str, pa.DataType] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)
    #: the writer of the documents on disk now (the run's final documents, once planned)
    final_writer: ParquetWriter | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    @property
    def tasks(self) -> int:
        return self.cfg.executor.tasks

    @property
    def compression(self) -> str | None:
        return None if self.cfg.output.compression == "none" else self.cfg.output.compression

    def local_path(self, path_or_url: str) -> Path:
        if str(path_or_url).startswith(("http://", "https://")):
            return self.fetcher.local_path(path_or_url)
        return Path(path_or_url).expanduser()

    def writer(self) -> ParquetWriter:
        return ParquetWriter()

    def stage(self, name: str, pipeline: list[Step], tasks: int | None = None) -> Stage:
        index = len(self.stages) + 1
        folder = self.run_dir / f"{index:02d}_{name}"
        stage = Stage(index, name, folder, pipeline, tasks or self.tasks, self.cfg.executor.workers,
                      [s.name for s in pipeline])
        fields = dict(self.fields)
        for step in pipeline:
            step.stage_folder = folder
            fields.update(step.output_fields)
            if isinstance(step, Filter):  # every filter of every stage, dedup's too, the same way
                step.scores_folder = str(folder / "scores" / step.name)
                if self.cfg.output.dropped_sample > 0:
                    step.dropped = DroppedSampler(folder / "dropped" / step.name, self.cfg.output.dropped_sample,
                                                  fields)
            if isinstance(step, ParquetWriter):  # the documents that leave this stage
                step.bind(stage.output, fields, self.compression)
                self.documents, self.fields, self.final_writer = stage.output, fields, step
        self.stages.append(stage)
        return stage

    def read_documents(self) -> Step:
        """The first step of a stage: the WET reader before any stage, then the last output."""
        if self.documents is None:
            cfg = self.cfg
            return WetReader(resolve_sources(cfg, self.fetcher), resolve=self.fetcher.local_path,
                             limit=cfg.input.limit, max_record_bytes=cfg.input.max_record_bytes)
        return ParquetReader(self.documents)


def _build_steps(cfg: RunConfig, ctx: PlanContext) -> list[Step]:
    """The run's steps in order, each built in this process (models checked before any task)."""
    registry = registered_steps()
    steps = [registry[spec.name].build(spec.params, ctx, step_id=spec.step_id) for spec in cfg.specs]
    if cfg.tokenize is not None:  # token shards of the final documents: the run's last stages
        steps.append(Tokenize.build(cfg.tokenize, ctx))
    return steps


def _stream_stage(ctx: PlanContext, steps: list[Step]) -> None:
    """Reader, the streaming steps fused in one pass, writer."""
    ctx.stage("curate" if not ctx.stages else "filter", [ctx.read_documents(), *steps, ctx.writer()])


def plan(cfg: RunConfig) -> list[Stage]:
    ctx = PlanContext(cfg, make_fetcher(cfg))
    pending: list[Step] = []  # streaming steps not yet placed in a stage
    for step in _build_steps(cfg, ctx):
        if step.streamable:
            pending.append(step)
            continue
        if pending or ctx.documents is None:  # documents must be on disk before a global step
            _stream_stage(ctx, pending)
            pending = []
        step.stages(ctx)
    if pending or ctx.documents is None:
        _stream_stage(ctx, pending)
    if cfg.output.per_language:  # folders per language in the run's final documents only
        ctx.final_writer.per_language = True
    return ctx.stages
