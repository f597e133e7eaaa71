"""The base of every gristmill step: a datatrove `PipelineStep` that knows its YAML name.

Every step of a run is one of these, so datatrove's executors (local, Slurm) can run any of
them, and the planner can ask a step whether it streams or needs all documents first.
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from datatrove.pipeline.base import PipelineStep


class Step(PipelineStep):
    #: key of the step in the YAML `steps:` list; also the name its stats are kept under
    yaml_name: ClassVar[str] = ""
    #: False for steps that need every document of the run before emitting any (dedup, shuffle):
    #: the planner ends a stage after such a step.
    streamable: ClassVar[bool] = True
    #: metadata this step adds to documents, as Parquet columns of the stage output
    output_fields: ClassVar[dict[str, pa.DataType]] = {}

    def __init__(self, step_id: str | None = None):
        # datatrove keys stats by str(self) == f"{type}: {name}", so set the name first.
        self.name = step_id or self.yaml_name
        super().__init__()

    def __repr__(self) -> str:
        return f"{self.type}: {self.name}"
