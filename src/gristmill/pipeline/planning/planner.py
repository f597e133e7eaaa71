"""Turns the YAML's step list into executor stages.

Streamable steps (reader, filters, writer) fuse into one pass over the documents. A global
step (dedup, tokenization: `streamable = False`) lays out its own stages with `stages(ctx)`;
the first reads the documents on disk, the last writes those that follow. Documents are thus
read and written once per stage, never once per step.

`plan()` is one loop over the built steps: it knows no step by name or class. `PlanContext`
implements the `StageContext` the steps plan against (`gristmill.core.step`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import pyarrow as pa
from loguru import logger

from gristmill.config import ConfigError, RunConfig
from gristmill.core import storage
from gristmill.core.filter import Filter
from gristmill.core.parquet_io import ParquetReader, ParquetWriter
from gristmill.core.run_folder import RunFolder
from gristmill.core.sinks import DroppedSampler
from gristmill.core.step import BASE_TASK_BYTES, Stage, Step, Workload, registered_steps
from gristmill.input.commoncrawl import Fetcher
from gristmill.input.sources import REMOTE, InputFiles, Opener, fetcher_for, resolve
from gristmill.input.warc import WarcReader
from gristmill.input.wet import WetReader
from gristmill.pipeline.execution.staging import plan_root

__all__ = [
    "MemoryEstimate",
    "PlanContext",
    "Stage",
    "build_steps",
    "estimate_memory",
    "stage_memory",
    "input_traffic",
    "plan",
]

#: What a gigabyte of compressed WET holds, for estimates made before anything is read (upper
#: figures, so memory estimates err high): Common Crawl's ~3e9 documents in ~90,000 files of
#: ~150 MB are ~220k documents per GB; the generated corpora 300k (docs/scale.md); text is 1.7x
#: (generated) to 2.2x (the shared sample) the compressed bytes.
DOCUMENTS_PER_GB = 300_000
TEXT_PER_COMPRESSED_BYTE = 2.2


@dataclass
class InputTraffic:
    """What reading the run's input costs besides CPU: bytes over the network, disk for a cache."""

    #: compressed bytes downloaded by the stage that reads the input files
    ingress: float
    #: bytes the download cache holds at the end (`input.commoncrawl.cache: keep`), else 0
    cache: float
    #: where they come from and where they go, in words (`pipeline plan`'s footer)
    note: str


def input_traffic(cfg: RunConfig, size: float, sources: list[str] | None = None) -> InputTraffic:
    """Network ingress and cache disk of reading `size` compressed bytes of input. Common Crawl
    from a server or bucket is all downloaded (streamed, or kept with `cache: keep`); a local
    mirror and local files are read in place; `input.paths` URLs are downloaded (in proportion,
    once their names are known)."""
    cc = cfg.input.commoncrawl
    if cc is not None:
        if not str(cc.base_url).startswith(REMOTE):
            return InputTraffic(0.0, 0.0, f"input read in place from {cc.base_url}")
        if cc.cache == "keep":
            return InputTraffic(size, size, f"input downloaded from {cc.base_url} into {cc.cache_dir} (cache: keep)")
        return InputTraffic(size, 0.0, f"input streamed from {cc.base_url}, nothing kept on disk (cache: none)")
    remote = [s for s in sources or [] if s.startswith(REMOTE)]
    if not remote:
        return InputTraffic(0.0, 0.0, "input read in place from local files")
    share = len(remote) / len(sources)
    return InputTraffic(size * share, size * share, f"{len(remote)} input URLs downloaded into the download cache")


@dataclass
class MemoryEstimate:
    stage: Stage
    #: bytes one task of the stage is estimated to reach (peak RSS)
    bytes: int
    #: bytes a task may use, and the setting that says so
    limit: int
    limit_setting: str
    #: the step that holds the most, and the setting that bounds it
    largest: Step | None
    #: the part of `bytes` that comes from the largest document a task may meet
    #: (`input.max_record_bytes`): the estimate minus the same estimate for empty documents
    record_bytes: int = 0
    #: `input.max_record_bytes`, for the message
    max_record_bytes: int = 0

    @property
    def fits(self) -> bool:
        return self.bytes <= self.limit

    def message(self) -> str:
        gb = 1 << 30
        if self.record_bytes and self.bytes - self.record_bytes <= self.limit:
            # the documents' size is what does not fit: the setting to lower is the record limit
            hint = (
                f"; {self.record_bytes / gb:.2f} GB of it for documents up to input.max_record_bytes "
                f"({self.max_record_bytes / (1 << 20):g} MiB): lower input.max_record_bytes"
            )
        elif self.largest is not None:
            hint = f"; {self.largest.name} holds the most: raise {self.largest.memory_setting}"
        else:
            hint = ""
        return (
            f"stage {self.stage.label}: a task is estimated to need {self.bytes / gb:.2f} GB "
            f"({self.stage.work.documents:.3g} documents over {self.stage.tasks} tasks), more than the "
            f"{self.limit / gb:.2f} GB of {self.limit_setting}{hint}"
        )


def _task_memory_limit(cfg: RunConfig, stage: Stage) -> tuple[int, str]:
    ex = cfg.executor
    if ex.type == "slurm":
        over = ex.slurm.stages.get(stage.name)
        mem = (over and over.mem_per_cpu_gb) or ex.slurm.mem_per_cpu_gb
        cpus = (over and over.cpus_per_task) or ex.slurm.cpus_per_task
        where = (
            f"executor.slurm.stages.{stage.name}.mem_per_cpu_gb"
            if over and over.mem_per_cpu_gb
            else "executor.slurm.mem_per_cpu_gb"
        )
        return int(mem * cpus * (1 << 30)), f"{where} x cpus_per_task"
    if ex.type == "ray":  # what each task asks Ray for, when configured (else the estimate itself)
        over = ex.ray.stages.get(stage.name)
        if over and over.memory_gb:
            return int(over.memory_gb * (1 << 30)), f"executor.ray.stages.{stage.name}.memory_gb"
        if ex.ray.memory_gb:
            return int(ex.ray.memory_gb * (1 << 30)), "executor.ray.memory_gb"
    if ex.memory_gb_per_task is not None:
        return int(ex.memory_gb_per_task * (1 << 30)), "executor.memory_gb_per_task"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // max(
        min(ex.workers, stage.tasks), 1
    ), f"this machine's memory / {min(ex.workers, stage.tasks)} workers"


def stage_memory(stage: Stage, work: Workload) -> tuple[int, Step | None]:
    """(peak bytes of one task, the step holding the most) for `work`: what every step holds
    throughout (`Step.memory_bytes`), plus the largest of what one needs while it works on a
    document (`Step.document_bytes`: a stage's steps work on one document at a time)."""
    steps = [s for s in stage.pipeline if isinstance(s, Step)]
    held = [(s.memory_bytes(work), s) for s in steps]
    largest = max(held, key=lambda x: x[0])[1] if held else None
    per_document = max((s.document_bytes(work) for s in steps), default=0)
    return BASE_TASK_BYTES + sum(b for b, _ in held) + per_document, largest


def estimate_memory(cfg: RunConfig, stages: list[Stage]) -> list[MemoryEstimate]:
    """Each stage's per-task memory from its steps' models and what it is given (`Stage.work`,
    with the largest document `input.max_record_bytes`), against the memory a task has."""
    out = []
    for stage in stages:
        total, largest = stage_memory(stage, stage.work)
        without, _ = stage_memory(stage, replace(stage.work, max_document_bytes=0.0))
        limit, where = _task_memory_limit(cfg, stage)
        out.append(MemoryEstimate(stage, total, limit, where, largest, total - without, cfg.input.max_record_bytes))
    return out


@dataclass
class PlanContext:
    """The stage context of one run (see `gristmill.core.step.StageContext`)."""

    cfg: RunConfig
    fetcher: Fetcher
    #: folder of the documents on disk at this point of the plan, in the run directory (None
    #: before the first stage)
    documents: Path | None = None
    #: metadata columns those documents carry, beyond the base fields
    fields: dict[str, pa.DataType] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)
    #: the writer of the documents on disk now (the run's final documents, once planned)
    final_writer: ParquetWriter | None = None
    #: compressed input bytes the memory models are evaluated for (None: measured from the
    #: input files, or estimated from the Common Crawl file count, when first asked)
    input_size: float | None = None
    #: WET sources, when already resolved (`pipeline plan` estimates without listing a crawl)
    sources: list[str] | None = None

    def workload(self, tasks: int) -> Workload:
        """The documents a stage is given, estimated before anything runs: every document read,
        as if no filter dropped any (memory estimates are upper bounds), the largest as long as
        the longest record the reader keeps (`input.max_record_bytes`)."""
        if self.input_size is None:
            self.input_size = self._sources().compressed_bytes(self.cfg.input.commoncrawl is not None)
        gb = self.input_size / 1e9
        return Workload(
            gb * DOCUMENTS_PER_GB,
            self.input_size * TEXT_PER_COMPRESSED_BYTE,
            tasks,
            max_document_bytes=self.cfg.input.max_record_bytes,
        )

    def task_memory_bytes(self, stage_name: str, tasks: int) -> int:
        probe = Stage(0, stage_name, self.run_dir, [], tasks, self.cfg.executor.workers)
        return _task_memory_limit(self.cfg, probe)[0]

    def _sources(self) -> InputFiles:
        if self.sources is None:
            self.sources = resolve(self.cfg.input, self.fetcher)
        elif not isinstance(self.sources, InputFiles):  # a list given by `pipeline plan`
            self.sources = InputFiles(self.sources)
        return self.sources

    @property
    def run_dir(self) -> Path:
        """The run directory the stages are planned against: the local one, or for a run
        directory on object storage a root never written, which each task's working copy
        replaces (`gristmill.pipeline.execution.staging`)."""
        if storage.is_url(self.cfg.run_dir):
            return plan_root(self.cfg.run_dir, self.cfg.storage)
        return Path(self.cfg.run_dir)

    @cached_property
    def run_folder(self) -> RunFolder:
        """The run directory as every step of the plan sees it (one folder, shared)."""
        return RunFolder(self.run_dir)

    @property
    def tasks(self) -> int:
        return self.cfg.executor.tasks

    @property
    def executor(self) -> str:
        return self.cfg.executor.type

    @property
    def compression(self) -> str | None:
        return None if self.cfg.output.compression == "none" else self.cfg.output.compression

    def local_path(self, path_or_url: str) -> Path:
        if str(path_or_url).startswith(("http://", "https://")):
            return self.fetcher.local_path(path_or_url)
        if storage.is_url(path_or_url):  # s3://, gs://, hf://: downloaded once per machine (core.storage)
            return storage.cached_copy(str(path_or_url))
        return Path(storage.local_or_url(path_or_url))

    def writer(self) -> ParquetWriter:
        return ParquetWriter()

    def stage(self, name: str, pipeline: list[Step], tasks: int | None = None) -> Stage:
        index = len(self.stages) + 1
        folder = self.run_dir / f"{index:02d}_{name}"
        tasks, names = tasks or self.tasks, [s.name for s in pipeline]
        stage = Stage(index, name, folder, pipeline, tasks, self.cfg.executor.workers, names, storage=self.cfg.storage)
        stage.work = self.workload(stage.tasks)
        fields = dict(self.fields)
        here = Path(stage.label)  # what the steps keep: names in the run directory
        for step in pipeline:
            step.run_folder, step.stage_folder = self.run_folder, here
            fields.update(step.output_fields)
            if isinstance(step, Filter):  # every filter of every stage, dedup's too, the same way
                step.scores_folder = str(here / "scores" / step.name)
                if self.cfg.output.dropped_sample > 0:
                    step.dropped = DroppedSampler(here / "dropped" / step.name, self.cfg.output.dropped_sample, fields)
            if isinstance(step, ParquetWriter):  # the documents that leave this stage
                step.bind(here / "output", fields, self.compression)
                self.documents, self.fields, self.final_writer = here / "output", fields, step
        self.stages.append(stage)
        return stage

    def read_documents(self) -> Step:
        """The first step of a stage: the WET (or WARC) reader before any stage, then the last output."""
        if self.documents is None:
            inp = self.cfg.input
            opener = Opener(self.fetcher, listed=inp.commoncrawl is None)
            common = {
                "resolve": opener,
                "limit": inp.limit,
                "max_record_bytes": inp.max_record_bytes,
                "stream_bytes": opener.stream_bytes(self._sources()),
            }
            if inp.format == "warc":
                return WarcReader(
                    self._sources(),
                    **common,
                    extractor=inp.extractor,
                    max_html_tags=inp.max_html_tags,
                    max_html_attributes=inp.max_html_attributes,
                )
            return WetReader(self._sources(), **common)
        return ParquetReader(self.documents)


def build_steps(cfg: RunConfig, ctx: PlanContext) -> list[Step]:
    """The run's steps in order, each built in this process (models checked before any task)."""
    registry = registered_steps()
    return [registry[spec.name].build(spec.params, ctx, step_id=spec.step_id) for spec in cfg.steps]


def _stream_stage(ctx: PlanContext, steps: list[Step]) -> None:
    """Reader, the streaming steps fused in one pass, writer."""
    tasks = _curate_tasks(ctx) if ctx.documents is None else None
    ctx.stage("curate" if not ctx.stages else "filter", [ctx.read_documents(), *steps, ctx.writer()], tasks=tasks)


def _curate_tasks(ctx: PlanContext) -> int:
    """Tasks of the stage that reads the WET files: at most one per file. A task reads whole
    files (`WetReader`: every tasks-th source from its rank), so the others would start, read
    nothing and end: a process each, locally, and an array task each on Slurm. Fewer tasks
    read the same files in the same order, so the output is the same."""
    tasks, files = ctx.tasks, len(ctx._sources())
    if not files or tasks <= files:  # `pipeline plan --gb` plans for files not yet listed
        return tasks
    if "tasks" in ctx.cfg.executor.model_fields_set:  # the default says nothing the user meant
        logger.warning(
            f"executor.tasks: {tasks} tasks for {files} input files; the curate stage runs {files} "
            f"(a task reads whole files), the stages after it {tasks}"
        )
    return files


def plan(
    cfg: RunConfig, *, input_size: float | None = None, sources: list[str] | None = None, check_memory: bool = True
) -> list[Stage]:
    """The run's stages. Refuses (ConfigError naming stage, estimate and setting) a stage whose
    tasks are estimated to need more memory than a task has."""
    storage.configure(cfg.storage)
    ctx = PlanContext(cfg, fetcher_for(cfg.input.commoncrawl), input_size=input_size, sources=sources)
    pending: list[Step] = []  # streaming steps not yet placed in a stage
    for step in build_steps(cfg, ctx):
        if step.streamable:
            pending.append(step)
            continue
        if pending or ctx.documents is None:  # documents must be on disk before a global step
            _stream_stage(ctx, pending)
            pending = []
        step.stages(ctx)
    if pending or ctx.documents is None:
        _stream_stage(ctx, pending)
    if ctx.sources is not None and ctx.stages:
        ctx.stages[0].inputs = ctx._sources().identity()
    if cfg.output.per_language:  # folders per language in the run's final documents only
        ctx.final_writer.per_language = True
    if check_memory:
        over = [e.message() for e in estimate_memory(cfg, ctx.stages) if not e.fits]
        if over:
            raise ConfigError("; ".join(over) + " (`pipeline plan CONFIG` shows every stage's estimate)")
    return ctx.stages
