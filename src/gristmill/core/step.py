"""The step contract: every step of a run is a `Step`, and every YAML step registers itself.

A step is a datatrove `PipelineStep` (so datatrove's executors, local and Slurm, can run any
of them) that owns its parameters as a nested pydantic `Config`: defaults live there and
nowhere else. Setting `yaml_name` on a class registers it under that name when its module is
imported; the run config, `pipeline validate` and the step reference (docs/steps.md) read the
registry (`registered_steps()`).

Two kinds:
- a streaming step (`Step`, `Filter`) maps or filters documents one pass at a time; the
  planner fuses consecutive streaming steps into one stage;
- a global step (`GlobalStep`) needs every document first (dedup, tokenization): it declares
  its own stages with `stages(ctx)`, against the `StageContext` below.

Steps that only exist inside a stage (the readers, dedup's phases) set `step_name` instead of
`yaml_name`: they are named in stats but cannot be written in YAML.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

import pyarrow as pa
from datatrove.pipeline.base import PipelineStep

from gristmill.core.configlib import Strict
from gristmill.core.run_folder import AS_GIVEN, RunFolder
from gristmill.core.storage import StorageConfig

if TYPE_CHECKING:
    from gristmill.core.parquet_io import ParquetWriter

#: The modules that define gristmill's own YAML steps, imported on first use of the registry.
#: Other packages add steps through the `gristmill.steps` entry point group (value: a module).
STEP_MODULES = (
    "gristmill.filters.url_filter",
    "gristmill.filters.langid",
    "gristmill.filters.gopher_quality",
    "gristmill.filters.gopher_repetition",
    "gristmill.filters.c4_lines",
    "gristmill.filters.fineweb_quality",
    "gristmill.filters.pii",
    "gristmill.filters.kenlm",
    "gristmill.filters.quality",
    "gristmill.filters.classifier",
    "gristmill.filters.quality_buckets",
    "gristmill.dedup.exact",
    "gristmill.dedup.near",
    "gristmill.dedup.decontaminate",
    "gristmill.tokenize.stages",
)
_REGISTRY: dict[str, type[Step]] = {}


#: resident memory of a task process before its steps hold anything: Python, datatrove, numpy,
#: pyarrow imported (measured: 114-147 MB of peak RSS for tasks that read nothing)
BASE_TASK_BYTES = 150 << 20
#: a document's text as Python holds it, per byte of its UTF-8: up to 4 bytes per character (one
#: character beyond U+FFFF makes the whole string 4 bytes a character), plus the UTF-8 copy
#: CPython keeps inside a non-ASCII string once a library asks for it (Arrow, tiktoken)
DOCUMENT_BYTES_PER_BYTE = 5


@dataclass(frozen=True)
class Workload:
    """What a stage's tasks are given, as the planner estimates it before anything runs: the
    input of a memory model (`Step.memory_bytes`)."""

    #: documents entering the stage, whole run (an upper bound: as if every earlier filter kept all)
    documents: float
    #: their text, bytes
    text_bytes: float
    #: tasks of the stage
    tasks: int
    #: the largest document a task may meet, bytes of UTF-8 (`input.max_record_bytes`: no step
    #: makes a document longer than the record it came from)
    max_document_bytes: float = 0.0

    @property
    def documents_per_task(self) -> float:
        return self.documents / max(self.tasks, 1)


class Step(PipelineStep):
    #: key of the step in the YAML `steps:` list (registers the class); also its stats name
    yaml_name: ClassVar[str] = ""
    #: stats name of a step that is not written in YAML (a reader, a phase of dedup)
    step_name: ClassVar[str] = ""
    #: False for steps that need every document of the run before emitting any (`GlobalStep`)
    streamable: ClassVar[bool] = True
    #: metadata this step adds to documents, as Parquet columns of the stage output
    output_fields: ClassVar[dict[str, pa.DataType]] = {}
    #: the reasons it drops documents under (stats `dropped_<reason>`), for the step reference
    drop_reasons: ClassVar[tuple[str, ...]] = ()
    #: why this step must end `steps:`, if it must (the run config refuses it elsewhere)
    last_step: ClassVar[str] = ""

    class Config(Strict):
        """This step takes no parameters."""

    #: the run directory the step reads and writes, and its stage's folder in it (`NN_name`);
    #: set by `StageContext.stage`. A step run alone has no run folder: its paths are as given.
    run_folder: RunFolder = AS_GIVEN
    stage_folder: Path | None = None

    def stage_path(self, *parts: str) -> Path:
        """Where `parts` are in the step's stage folder (in the task's working copy when bound)."""
        return self.run_folder.path(self.stage_folder, *parts)

    def run_folders(self) -> tuple[RunFolder, ...]:
        """The run folders the step reads and writes through: what a task binds to its working
        copy of a run on object storage."""
        return () if self.run_folder.root is None else (self.run_folder,)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("yaml_name")
        if not name:
            return
        other = _REGISTRY.get(name)
        if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(
                f"step {name!r} of {cls.__module__}.{cls.__qualname__} is already defined by "
                f"{other.__module__}.{other.__qualname__}"
            )
        _REGISTRY[name] = cls

    @classmethod
    def build(cls, config: Strict, ctx: BuildContext, step_id: str | None = None) -> Step:
        """The step of one YAML entry, built in the planning process. Override to resolve
        resources first (a model given as a URL is fetched through `ctx.local_path`)."""
        return cls(config, step_id=step_id)

    def __init__(self, config: Strict | None = None, /, *, step_id: str | None = None, **params):
        """`Step(config)` with a validated `Config`, or `Step(**params)` validated here."""
        if config is not None and params:
            raise TypeError(f"{type(self).__name__}: give a Config or keyword parameters, not both")
        self.config = config if config is not None else self.Config(**params)
        # datatrove keys stats by str(self) == f"{type}: {name}", so set the name first.
        self.name = step_id or self.yaml_name or self.step_name
        super().__init__()

    def __repr__(self) -> str:
        return f"{self.type}: {self.name}"

    #: the setting that bounds this step's memory per task (named when an estimate is too large)
    memory_setting: ClassVar[str] = "executor.tasks"

    def memory_bytes(self, work: Workload) -> int:
        """Bytes one task of this step's stage holds for it throughout, beyond `BASE_TASK_BYTES`:
        models, buffers, batches. A streaming step holds one document at a time: 0 (the
        document is counted by the reader; what the step needs while it works on one is
        `document_bytes`)."""
        return 0

    #: peak bytes the step needs while it works on one document, per byte of that document
    #: (UTF-8), beyond the document itself, and a fixed part (what working on a long page's
    #: pieces costs whatever the page's length, allocator pools included): fitted to the peaks
    #: measured on documents of 2, 8 and 30 MB (`benchmarks/large_record_steps.py`,
    #: docs/scale.md "Large records")
    document_factor: ClassVar[float] = 0.0
    document_fixed: ClassVar[int] = 0

    def document_bytes(self, work: Workload) -> int:
        """Peak bytes the step needs while it works on one document, at the largest one a task
        may meet (`work.max_document_bytes`), beyond the document itself. Steps of a stage work
        on one document at a time, so the planner adds the largest of its steps' figures, not
        their sum, to what they hold (`pipeline.planner.estimate_memory`)."""
        if not work.max_document_bytes:
            return 0
        return int(self.document_fixed + self.document_factor * work.max_document_bytes)

    #: True for a step that reads at most a configured amount however large the input (the
    #: tokenizer: `sample_bytes`): `pipeline plan` caps its cost at the largest measured, not a
    #: line through the calibration extended to the input
    bounded_work: ClassVar[bool] = False

    #: GPUs one task of this step's stage needs (a step that runs a model on a GPU): the
    #: executor gives each such task its own (`pipeline.execution.gpus`)
    gpus_per_task: int = 0

    def gpu_seconds(self, work: Workload) -> float | None:
        """GPU-seconds the step is projected to use on `work`, from its measured throughput
        (`pipeline plan`); None for a step that uses no GPU or was never measured."""
        return None


class GlobalStep(Step):
    """A step that needs all documents first: it plans stages instead of running in one."""

    streamable = False

    def stages(self, ctx: StageContext) -> None:
        """Add this step's stages with `ctx.stage(...)`; the first reads `ctx.documents`, and
        the last writes the documents that follow with `ctx.writer()` (if any follow)."""
        raise NotImplementedError

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        raise TypeError(f"{self.name} is planned into stages (`stages(ctx)`), not run as a step")


def step_id(index: int, name: str) -> str:
    """The id of the `index`-th entry of `steps:` (its stage folders, stats and scores key):
    `NN_name`. `config_key` is its inverse, the key path errors name."""
    return f"{index:02d}_{name}"


def config_key(step_id_: str) -> str:
    """`steps[N].name`, the YAML key of the step whose id is `NN_name` (itself, for another name)."""
    index, _, name = step_id_.partition("_")
    return f"steps[{int(index)}].{name}" if index.isdigit() and name else step_id_


@dataclass
class Stage:
    """One executor stage: its steps, task count and folder (`<run_dir>/NN_<name>/`)."""

    index: int
    name: str
    folder: Path
    pipeline: list[Step]
    tasks: int
    workers: int
    step_names: list[str] = field(default_factory=list)
    #: what its tasks are given, estimated at planning (the memory models' input)
    work: Workload | None = None
    #: the input files it reads, `{"path", "bytes"}` each in reading order (the stage that reads
    #: the input): a resume must read the same (`RunDir.check_inputs`)
    inputs: list[dict] | None = None
    #: the run's `storage:` settings, with which its tasks reach URLs (inputs, models, a run
    #: directory on object storage): they travel with the stage's executor to every task
    storage: StorageConfig = field(default_factory=StorageConfig)

    @property
    def label(self) -> str:
        return f"{self.index:02d}_{self.name}"

    @property
    def gpus_per_task(self) -> int:
        """GPUs each task of the stage needs: the most any of its steps asks for."""
        return max((getattr(s, "gpus_per_task", 0) for s in self.pipeline), default=0)

    @property
    def output(self) -> Path:
        return self.folder / "output"


class BuildContext(Protocol):
    """What a step may ask of the planner while it is built."""

    #: where the tasks run: "local" (this machine), "slurm" or "ray" (other machines)
    executor: str

    def local_path(self, path_or_url: str) -> Path:
        """A local file for a path or an http(s) URL (downloaded, verified, cached)."""


class StageContext(BuildContext, Protocol):
    """What a global step plans against (implemented by the planner)."""

    #: folder of the documents on disk at this point of the plan, in the run directory (Parquet,
    #: read with ParquetReader)
    documents: Path
    #: metadata columns those documents carry (beyond the base fields)
    fields: dict[str, pa.DataType]
    #: tasks per stage (`executor.tasks`)
    tasks: int

    def stage(self, name: str, pipeline: list[Step], tasks: int | None = None) -> Stage:
        """Append a stage: numbered, foldered, every step given the run folder and its
        `stage_folder` (`Stage.label`), drop samplers attached to its filters, its writer (if
        any) bound to `output/`."""

    def writer(self) -> ParquetWriter:
        """A writer of the documents that leave this stage, bound when the stage is added."""

    def workload(self, tasks: int) -> Workload:
        """What a stage of `tasks` tasks added now would be given (an upper bound)."""

    def task_memory_bytes(self, stage_name: str, tasks: int) -> int:
        """The memory one task of such a stage may use (config or Slurm settings)."""


@functools.cache
def _plugin_modules() -> tuple[str, ...]:
    """The modules named by installed `gristmill.steps` entry points, found once per process:
    finding them reads the metadata of every installed distribution (~5 ms in a full
    environment), and checking a config or a calibration table asks for the steps thousands of
    times."""
    return tuple(ep.value for ep in entry_points(group="gristmill.steps"))


def registered_steps() -> dict[str, type[Step]]:
    """YAML step name → step class: gristmill's own modules, entry points, and any module
    already imported that defines a step (a test's, a notebook's)."""
    for module in (*STEP_MODULES, *_plugin_modules()):
        importlib.import_module(module)
    return dict(sorted(_REGISTRY.items()))
