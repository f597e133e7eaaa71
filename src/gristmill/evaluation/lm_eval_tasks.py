"""Our tasks as lm-evaluation-harness task YAMLs (`dataset_path: json`, the same local file), so
that it scores the same items with the same prompts: what the agreement test and
`benchmarks/eval_throughput.py` compare against.

The mapping: our `question + continuation_delimiter` is its `doc_to_text` + `target_delimiter`
with the delimiter's trailing whitespace as `target_delimiter` (its tokenization moves a
context's trailing whitespace into the continuation anyway, so both split the same string at
the same place); `example_delimiter` is its `fewshot_delimiter`; few-shot examples come from the
test split itself (`fewshot_split: test`, so the evaluated item is excluded, as ours excludes it).
Language modelling is its `loglikelihood` output type, whose request carries no target delimiter:
the delimiter goes into `doc_to_target`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gristmill.evaluation.tasks import Layout, TaskSpec


def _jinja_literal(s: str) -> str:
    """`s` as literal template text (Jinja has no escapes for `{{`/`{%`)."""
    if "{" in s:
        return "{{ " + repr(s) + " }}"
    return s


def task_yaml(spec: TaskSpec, layout: Layout, name: str) -> dict:
    d = spec.continuation_delimiter
    body, ws = d.rstrip(), d[len(d.rstrip()) :]
    base = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(spec.path).resolve())}},
        "test_split": "test",
        "fewshot_split": "test",
        "num_fewshot": spec.fewshot,
        "fewshot_delimiter": spec.example_delimiter,
        "fewshot_config": {"sampler": "default"},
    }
    if layout == "mc":
        return {
            **base,
            "output_type": "multiple_choice",
            "doc_to_text": "{{query}}" + _jinja_literal(body),
            "doc_to_choice": "choices",
            "doc_to_target": "gold",
            "target_delimiter": ws,
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        }
    if layout == "schema":
        if body:
            raise ValueError(f"{spec.name}: a schema task's delimiter {d!r} beyond whitespace has no lm-eval form")
        return {
            **base,
            "output_type": "multiple_choice",
            "doc_to_text": "gold",  # an index: lm-eval's "multiple inputs" (one context per option)
            "doc_to_choice": "context_options",
            "doc_to_target": "continuation",
            "target_delimiter": ws,
            "metric_list": [{"metric": "acc"}],
        }
    return {
        **base,
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}" + _jinja_literal(body),
        "doc_to_target": _jinja_literal(ws) + "{{continuation}}",
        "target_delimiter": "",
        "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
    }


def write_task_dir(specs_layouts: list[tuple[TaskSpec, Layout]], folder: Path, prefix: str = "gm_") -> list[str]:
    """One `<prefix><name>.yaml` per task in `folder` (lm-eval's `include_path`); their names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for spec, layout in specs_layouts:
        name = prefix + spec.name
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(task_yaml(spec, layout, name), sort_keys=False))
        names.append(name)
    return names
