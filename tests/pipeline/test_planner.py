"""The planner fuses streamable steps and ends a stage at a step that needs all documents."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import Field

import gristmill.pipeline.planning.planner as planner_mod
from gristmill.config import ConfigError, from_dict
from gristmill.core.configlib import FilterConfig, Strict
from gristmill.core.filter import Filter
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.step import GlobalStep, Step, registered_steps
from gristmill.pipeline.report.journey import funnel
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

# Two steps defined in this test module alone: nothing else in gristmill is edited to add them.


class KeepLongest(GlobalStep):
    """A global step for the test: needs every document, keeps the longer part by text length."""

    type = "🌐 GLOBAL"
    yaml_name = "keep_longest"
    output_fields = {"rank_by_length": pa.int64()}

    class Config(Strict):
        share: float = Field(0.5, gt=0, le=1, description="share of documents kept, longest first")

    def stages(self, ctx):
        ctx.stage(
            self.yaml_name,
            [ParquetReader(ctx.documents), _Longest(self.config.share, step_id=self.name), ctx.writer()],
            tasks=1,
        )


class _Longest(Step):
    type = "🌐 GLOBAL"
    step_name = "longest"
    output_fields = KeepLongest.output_fields

    def __init__(self, share: float, *, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.share = share

    def run(self, data, rank=0, world_size=1):
        docs = sorted(data, key=lambda d: (-len(d.text), d.id))
        for i, doc in enumerate(docs[: int(len(docs) * self.share)]):
            doc.metadata["rank_by_length"] = i
            self.stat_update("documents")
            yield doc


class MentionsWord(Filter):
    """A streaming filter for the test: keeps documents that contain `word`."""

    yaml_name = "mentions_word"

    class Config(FilterConfig):
        word: str = Field(description="the word a kept document must contain")

    def filter(self, doc, config):
        return True if config.word in doc.text.split() else (False, "word_missing")


def _cfg(tmp_path, wet_files, lid_model, steps):
    return from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "executor": {"tasks": 2, "workers": 1},
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": steps,
            "output": {"dropped_sample": 0},
        }
    )


def _where(step) -> Path:
    """The folder a reader reads or a writer writes: a name in the run folder."""
    return step.run_folder.path(step.folder)


def test_streamable_steps_fuse_into_one_stage(tmp_path, wet_files, lid_model):
    cfg = _cfg(tmp_path, wet_files, lid_model, [{"langid": {"model": str(lid_model)}}, "gopher_quality", "c4_lines"])
    stages = planner_mod.plan(cfg)
    assert [s.label for s in stages] == ["01_curate"]
    assert stages[0].step_names == ["read_wet", "00_langid", "01_gopher_quality", "02_c4_lines", "write_parquet"]


def test_global_step_ends_a_stage_and_the_next_reads_its_output(tmp_path, wet_files, lid_model):
    steps = [{"langid": {"model": str(lid_model), "languages": None}}, "keep_longest", "c4_lines"]
    cfg = _cfg(tmp_path, wet_files, lid_model, steps)
    stages = planner_mod.plan(cfg)
    assert [s.label for s in stages] == ["01_curate", "02_keep_longest", "03_filter"]
    assert stages[1].tasks == 1
    assert _where(stages[1].pipeline[0]) == stages[0].output
    assert _where(stages[2].pipeline[0]) == stages[1].output
    assert _where(stages[1].pipeline[-1]) == stages[1].output  # the context bound the step's writer

    merged = run(cfg)
    rows = {r.step: r for r in funnel(merged)}
    assert rows["01_keep_longest"].docs_out == rows["00_langid"].docs_out // 2 > 100
    out = pq.read_table(tmp_path / "run" / "03_filter" / "output")
    # columns added before the global step, by it, and after it all arrive in the final output
    assert {"language", "rank_by_length"} <= set(out.column_names)
    assert out.num_rows == rows["02_c4_lines"].docs_out
    assert sorted(out.column("rank_by_length").to_pylist()) == sorted(set(out.column("rank_by_length").to_pylist()))


def test_global_step_first_still_reads_wet_in_its_own_stage(tmp_path, wet_files, lid_model):
    stages = planner_mod.plan(_cfg(tmp_path, wet_files, lid_model, ["keep_longest"]))
    assert [s.label for s in stages] == ["01_curate", "02_keep_longest"]
    assert stages[0].step_names == ["read_wet", "write_parquet"]


def test_a_step_defined_in_a_test_module_runs_from_yaml(tmp_path, wet_files, lid_model):
    assert {"keep_longest", "mentions_word"} <= set(registered_steps())
    steps = [
        {"langid": {"model": str(lid_model), "languages": None}},
        {"mentions_word": {"word": "the"}},
        {"keep_longest": {"share": 0.25}},
    ]
    merged = run(_cfg(tmp_path, wet_files, lid_model, steps))
    rows = {r.step: r for r in funnel(merged)}
    assert 0 < rows["01_mentions_word"].docs_out < rows["00_langid"].docs_out
    assert rows["01_mentions_word"].drops == {
        "word_missing": rows["00_langid"].docs_out - rows["01_mentions_word"].docs_out
    }
    assert rows["02_keep_longest"].docs_out == int(rows["01_mentions_word"].docs_out * 0.25)
    # the filter of a new step gets scores recorded like every other filter
    assert (tmp_path / "run" / "01_curate" / "scores" / "01_mentions_word").is_dir()


def test_a_new_steps_config_errors_name_the_key_path(tmp_path, wet_files, lid_model):
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, wet_files, lid_model, [{"mentions_word": {}}, {"keep_longest": {"share": 2, "x": 1}}])
    text = str(err.value)
    assert "steps[0].mentions_word.word: required key is missing" in text
    assert "steps[1].keep_longest.share" in text and "steps[1].keep_longest.x: unknown key" in text


def test_planning_imports_no_torch(tmp_path, wet_files, lid_model):
    """Planning a run that trains afterwards must not import the trainer's torch."""
    code = (
        "import sys, json\n"
        "from gristmill.config import from_dict\n"
        "from gristmill.pipeline.planning.planner import plan\n"
        f"cfg = from_dict({{'run_dir': {str(tmp_path / 'r')!r}, 'input': {{'paths': [{str(wet_files[1])!r}]}},"
        f" 'steps': [{{'langid': {{'model': {str(lid_model)!r}}}}}], 'train': {{'preset': 'tiny'}}}})\n"
        "plan(cfg)\n"
        "import gristmill.pipeline.runner, gristmill.cli\n"
        "from gristmill.trainer.launch import default_nproc, pipeline_train_config\n"
        "default_nproc(pipeline_train_config(cfg.train, __import__('pathlib').Path(cfg.run_dir)))\n"
        "print(json.dumps('torch' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "false", out.stderr


def test_gpus_are_counted_as_cuda_would_see_them(monkeypatch):
    from gristmill.trainer.launch import visible_gpus

    for value, n in (("0,1", 2), ("", 0), ("-1", 0), ("2,-1,3", 1), (" 0 , 1 , 2", 3)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_gpus() == n, value


def test_tokenize_is_placed_by_the_loop_like_any_global_step(tmp_path, wet_files, lid_model):
    """`tokenize` (a registered step, the last) plans its stages on the documents before it,
    whatever came first; the top-level section gives the same plan."""
    tokenize = {"tokenizer": {"train": {"vocab_size": 512}}}
    steps = [{"langid": {"model": str(lid_model), "languages": None}}, "keep_longest", "c4_lines"]
    stages = planner_mod.plan(_cfg(tmp_path, wet_files, lid_model, [*steps, {"tokenize": tokenize}]))
    labels = ["01_curate", "02_keep_longest", "03_filter", "04_tokenizer_sample", "05_tokenizer", "06_tokenize"]
    assert [s.label for s in stages] == [*labels, "07_shard_lengths", "08_shard_plan", "09_shards", "10_manifest"]
    assert _where(stages[3].pipeline[0]) == _where(stages[5].pipeline[0]) == stages[2].output
    section = _cfg(tmp_path, wet_files, lid_model, steps).resolved() | {"tokenize": tokenize}
    assert [s.label for s in planner_mod.plan(from_dict(section))] == [s.label for s in stages]


# --- how many tasks ----------------------------------------------------------------------------


def test_tasks_above_the_bound_are_refused_with_the_reason(tmp_path, wet_files):
    cfg = tmp_path / "crawl.yaml"
    cfg.write_text(
        f"run_dir: {tmp_path / 'run'}\nexecutor: {{tasks: 100000}}\n"
        f"input: {{paths: {[str(p) for p in wet_files]}}}\nsteps: [gopher_quality]\n"
    )
    for command in ("validate", "run"):
        res = pipeline(command, str(cfg), timeout=120)
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines() == [
            f"error: {cfg}: 1 error(s)",
            "  executor.tasks: at most 10,000, got 100,000: stages that shuffle (near_dedup, tokenize) write "
            "tasks x tasks files (10,000,000,000); a whole Common Crawl snapshot runs on 4,000",
        ]
    assert not (tmp_path / "run").exists()
    assert from_dict({"input": {"paths": ["x"]}, "executor": {"tasks": 10_000}}).executor.tasks == 10_000


def test_curate_runs_one_task_per_input_file_at_most_and_says_so(tmp_path, wet_files, lid_model):
    from loguru import logger

    steps = ["gopher_quality", {"exact_dedup": {"capacity": 100_000}}]
    data = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"tasks": 50},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": steps,
    }
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        stages = planner_mod.plan(from_dict(data))
        default = planner_mod.plan(from_dict({**data, "executor": {}}))  # 4 tasks, not asked for: no word
    finally:
        logger.remove(sink)
    assert [(s.name, s.tasks) for s in stages][:2] == [("curate", 2), ("exact_dedup_hash", 50)]
    assert stages[0].work.documents_per_task == stages[1].work.documents_per_task * 25  # estimated per real task
    warned = [line for line in lines if "executor.tasks" in line]
    assert len(warned) == 1 and warned[0].rstrip().endswith(
        "executor.tasks: 50 tasks for 2 input files; the curate stage runs 2 (a task reads whole files), "
        "the stages after it 50"
    )
    assert default[0].tasks == 2 and default[1].tasks == 4
    # without files to count (`pipeline plan --gb`), the setting stands
    assert planner_mod.plan(from_dict(data), input_size=1e9, sources=[], check_memory=False)[0].tasks == 50


def test_a_run_with_more_tasks_than_files_starts_a_process_per_file(tmp_path, wet_files):
    """A real run: 8 tasks asked for, 2 WET files; two task processes, the same documents as 2 tasks."""
    outputs = {}
    for tasks in (8, 2):
        run_dir = tmp_path / f"t{tasks}"
        cfg = tmp_path / f"t{tasks}.yaml"
        cfg.write_text(
            f"run_dir: {run_dir}\nexecutor: {{tasks: {tasks}, workers: 2}}\n"
            f"input: {{paths: {[str(p) for p in wet_files]}}}\nsteps: [gopher_quality]\n"
        )
        res = pipeline("run", str(cfg), timeout=600)
        assert res.returncode == 0, res.stderr
        warned = [line for line in res.stderr.splitlines() if "executor.tasks" in line]
        assert len(warned) == (1 if tasks == 8 else 0), res.stderr
        assert sorted(p.name for p in (run_dir / "01_curate" / "logs").glob("task_*.log")) == [
            "task_00000.log",
            "task_00001.log",
        ]
        outputs[tasks] = pq.read_table(run_dir / "01_curate" / "output").to_pylist()
    assert outputs[8] == outputs[2] and len(outputs[2]) > 100
