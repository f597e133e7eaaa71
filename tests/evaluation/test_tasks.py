"""Task files: layouts told from keys on the real gauntlet files, each kind of bad record one
error naming file and line, prompts and few-shot draws as lm-evaluation-harness makes them."""

from __future__ import annotations

import json
import random

import pytest

from gristmill.evaluation.tasks import (
    TaskError,
    TaskSpec,
    build_items,
    load_tasks_file,
    read_records,
    resolve_tasks,
    sample_fewshot,
)

LAYOUTS = {
    "piqa": ("mc", 1838),
    "openbook_qa": ("mc", 500),
    "copa": ("mc", 100),
    "arc_easy": ("mc", 2376),
    "boolq": ("mc", 3270),
    "winogrande": ("schema", 1267),
    "lambada_openai": ("lm", 5153),
}


def test_every_shipped_task_reads_with_its_layout_and_count(shared_data, monkeypatch):
    monkeypatch.setenv("GRISTMILL_DATA", str(shared_data))
    tf = load_tasks_file()
    assert set(tf.tasks) == set(LAYOUTS)
    for name, (layout, count) in LAYOUTS.items():
        got, records = read_records(tf.tasks[name].path)
        assert (got, len(records)) == (layout, count), name
    # the gauntlet's few-shot counts and delimiters
    assert (tf.tasks["arc_easy"].fewshot, tf.tasks["arc_easy"].continuation_delimiter) == (3, "\nAnswer: ")
    assert tf.tasks["winogrande"].fewshot == 5 and tf.tasks["openbook_qa"].fewshot == 10
    assert {tf.tasks[t].example_delimiter for t in tf.tasks} == {"\n"}


def _write(tmp_path, records, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return p


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"query": "q", "choices": ["a", "b"]}, r"t\.jsonl:2: no 'gold'"),
        ({"query": "q", "choices": ["a", "b"], "gold": 2}, r"t\.jsonl:2: 'gold' 2 is out of range for 2 choices"),
        ({"query": "q", "choices": ["a", "b"], "gold": -1}, r"'gold' -1 is out of range"),
        ({"query": "q", "choices": ["a", "b"], "gold": "0"}, r"t\.jsonl:2: 'gold' is '0', expected the index"),
        (
            {"query": "q", "choices": ["a"], "gold": 0},
            r"t\.jsonl:2: 'choices' has 1 element\(s\): a choice needs at least 2",
        ),
        ({"query": "q", "choices": "ab", "gold": 0}, r"'choices' must be a list of strings"),
        ("{not json", r"t\.jsonl:2: not JSON"),
    ],
)
def test_a_bad_multiple_choice_record_is_one_error_naming_its_line(tmp_path, bad, message):
    path = _write(tmp_path, [{"query": "q", "choices": ["a", "b"], "gold": 0}, bad])
    with pytest.raises(TaskError, match=message):
        read_records(path)


def test_bad_schema_and_lm_records_and_unknown_layouts(tmp_path):
    schema = {"context_options": ["x", "y"], "continuation": "z", "gold": 1}
    with pytest.raises(TaskError, match=r"'gold' 5 is out of range for 2 context_options"):
        read_records(_write(tmp_path, [schema, {**schema, "gold": 5}]))
    with pytest.raises(TaskError, match=r"'continuation' is empty"):
        read_records(_write(tmp_path, [{"context": "a", "continuation": ""}]))
    with pytest.raises(TaskError, match=r"t\.jsonl:1: keys \['prompt', 'text'\] fit no task layout"):
        read_records(_write(tmp_path, [{"prompt": "a", "text": "b"}]))
    with pytest.raises(TaskError, match="no records"):
        read_records(_write(tmp_path, []))
    with pytest.raises(TaskError, match=r"task 'nope': neither a task of tasks.yaml \(copa\) nor a JSONL file"):
        resolve_tasks(["nope"], type("F", (), {"tasks": {"copa": None}})(), "tasks.yaml")


def test_a_jsonl_path_is_a_task_with_the_default_prompting(tmp_path):
    path = _write(tmp_path, [{"context_options": ["A b", "A c"], "continuation": "d.", "gold": 0}] * 2, "mine.jsonl")
    (spec,) = resolve_tasks([str(path)], load_tasks_file(), "tasks.yaml", fewshot=1)
    assert (spec.name, spec.fewshot, spec.continuation_delimiter) == ("mine", 1, " ")


def test_prompts_as_lm_eval_builds_them(shared_data):
    spec = TaskSpec(path=str(shared_data / "eval" / "arc_easy.jsonl"), fewshot=2, continuation_delimiter="\nAnswer: ")
    layout, records = read_records(spec.path)
    (item,) = build_items(spec, layout, records, limit=1)
    rng = random.Random(1234)
    shots = [x for x in rng.sample(records, 3) if x != records[0]][:2]
    prefix = "".join(f"{s['query']}\nAnswer: {s['choices'][s['gold']]}\n" for s in shots)
    assert item.requests == [(prefix + records[0]["query"] + "\nAnswer: ", c) for c in records[0]["choices"]]
    assert item.gold == records[0]["gold"]


def test_fewshot_draws_equal_lm_eval_samplers(shared_data):
    """Item by item, the same draws as lm-evaluation-harness's ContextSampler from one seeded
    generator, the evaluated item excluded."""
    samplers = pytest.importorskip("lm_eval.api.samplers")
    _, records = read_records(shared_data / "eval" / "copa.jsonl")
    theirs = samplers.ContextSampler(records, rnd=1234)
    ours = random.Random(1234)
    for rec in records[:30]:
        assert sample_fewshot(ours, records, rec, 5) == theirs.sample(5, eval_doc=rec)
