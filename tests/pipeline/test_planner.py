"""The planner fuses streamable steps and ends a stage at a step that needs all documents."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel, ConfigDict

import gristmill.config as config_mod
import gristmill.pipeline.planner as planner_mod
from gristmill.config import from_dict
from gristmill.core.parquet_io import ParquetReader
from gristmill.pipeline.runner import run
from gristmill.pipeline.stats import funnel
from gristmill.core.step import Step
from gristmill.pipeline.writers import ParquetWriter


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeepLongest(Step):
    """A global step for the test: needs every document, keeps the longer half by text length."""

    type = "🌐 GLOBAL"
    yaml_name = "keep_longest"
    streamable = False
    output_fields = {"rank_by_length": pa.int64()}

    @classmethod
    def build_stages(cls, spec, ctx, input_folder):
        step = cls(spec.step_id)
        fields = {**ctx.fields, **cls.output_fields}
        folder = ctx.stage_folder(spec.name)
        ctx.new_stage(spec.name, [ParquetReader(input_folder), step, ParquetWriter(folder / "output", fields)], tasks=1)

    def run(self, data, rank=0, world_size=1):
        docs = sorted(data, key=lambda d: (-len(d.text), d.id))
        for i, doc in enumerate(docs[: len(docs) // 2]):
            doc.metadata["rank_by_length"] = i
            self.stat_update("documents")
            yield doc


@pytest.fixture
def with_global_step(monkeypatch):
    original = config_mod.step_registry

    def registry():
        return {**original(), "keep_longest": (_NoParams, KeepLongest)}

    monkeypatch.setattr(config_mod, "step_registry", registry)
    monkeypatch.setattr(planner_mod, "step_registry", registry)


def _cfg(tmp_path, wet_files, lid_model, steps):
    return from_dict({
        "run_dir": str(tmp_path / "run"),
        "executor": {"tasks": 2, "workers": 1},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": steps,
        "output": {"dropped_sample": 0},
    })


def test_streamable_steps_fuse_into_one_stage(tmp_path, wet_files, lid_model):
    cfg = _cfg(tmp_path, wet_files, lid_model, [{"langid": {"model": str(lid_model)}}, "gopher_quality", "c4_lines"])
    stages = planner_mod.plan(cfg)
    assert [s.label for s in stages] == ["01_curate"]
    assert stages[0].step_names == ["read_wet", "00_langid", "01_gopher_quality", "02_c4_lines", "write_parquet"]


def test_global_step_ends_a_stage_and_the_next_reads_its_output(tmp_path, wet_files, lid_model, with_global_step):
    steps = [{"langid": {"model": str(lid_model), "languages": None}}, "keep_longest", "c4_lines"]
    cfg = _cfg(tmp_path, wet_files, lid_model, steps)
    stages = planner_mod.plan(cfg)
    assert [s.label for s in stages] == ["01_curate", "02_keep_longest", "03_filter"]
    assert stages[1].tasks == 1
    assert stages[1].pipeline[0].folder == stages[0].output
    assert stages[2].pipeline[0].folder == stages[1].output

    merged = run(cfg)
    rows = {r.step: r for r in funnel(merged)}
    assert rows["01_keep_longest"].docs_out == rows["00_langid"].docs_out // 2 > 100
    out = pq.read_table(tmp_path / "run" / "03_filter" / "output")
    # columns added before the global step, by it, and after it all arrive in the final output
    assert {"language", "rank_by_length"} <= set(out.column_names)
    assert out.num_rows == rows["02_c4_lines"].docs_out
    assert sorted(out.column("rank_by_length").to_pylist()) == sorted(set(out.column("rank_by_length").to_pylist()))


def test_global_step_first_still_reads_wet_in_its_own_stage(tmp_path, wet_files, lid_model, with_global_step):
    stages = planner_mod.plan(_cfg(tmp_path, wet_files, lid_model, ["keep_longest"]))
    assert [s.label for s in stages] == ["01_curate", "02_keep_longest"]
    assert stages[0].step_names == ["read_wet", "write_parquet"]
