"""Task files and prompts: a JSONL file's layout told from its keys, its records checked, and
each item turned into the (context, continuation) pairs whose log-likelihoods score it.

Layouts (the evaluation gauntlet's local files, which DCLM reads too):

- multiple choice, `query`, `choices`, `gold`: one pair per choice, context the prompt;
- schema, `context_options`, `continuation`, `gold`: one pair per context option, the
  continuation the same (WinoGrande's partial scoring);
- language modelling, `context`, `continuation`: one pair, scored by greedy exact match.

Prompts as lm-evaluation-harness builds them, with the gauntlet's delimiters: each few-shot
example is `question + continuation_delimiter + answer + example_delimiter`, then the item's
`question + continuation_delimiter`; the continuation is the answer. The few-shot examples are
drawn as lm-evaluation-harness's default sampler draws them: one `random.Random(seed)` per task,
for each evaluated item in file order `sample(all items, k + 1)`, the item itself removed, the
first k kept (so `--limit` does not change the prompts of the items it keeps).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from gristmill.core.configlib import ConfigError, Strict, validate_config

Layout = Literal["mc", "schema", "lm"]
LAYOUT_KEYS: dict[str, tuple[str, ...]] = {
    "mc": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "lm": ("context", "continuation"),
}
LAYOUT_NAMES = {"mc": "multiple choice", "schema": "schema", "lm": "language modelling"}
DEFAULT_TASKS_FILE = Path("configs/eval/tasks.yaml")


class TaskError(ValueError):
    """A task file or task name that cannot be used; the message names the file and line."""


class TaskSpec(Strict):
    """One task: its file and how it is prompted (defaults: the gauntlet's)."""

    path: str = Field(description="JSONL file of one layout (told from its keys)")
    fewshot: int = Field(0, ge=0, description="few-shot examples before each item")
    continuation_delimiter: str = Field(" ", description="between a question and its answer")
    example_delimiter: str = Field("\n", description="after each few-shot example")
    seed: int = Field(1234, description="few-shot sampling seed (lm-evaluation-harness's default)")
    name: str = Field("", description="filled from the key in the tasks file, or the file's stem")


class Corpus(Strict):
    path: str = Field(description="a UTF-8 text file (bits per byte over all of it)")


class TasksFile(Strict):
    tasks: dict[str, TaskSpec] = Field(default_factory=dict)
    corpora: dict[str, Corpus] = Field(default_factory=dict)


def load_tasks_file(path: str | Path = DEFAULT_TASKS_FILE) -> TasksFile:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the tasks file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML ({e})") from None
    cfg = validate_config(TasksFile, data, source=str(path))
    for name, spec in cfg.tasks.items():
        spec.name = name
    return cfg


def resolve_tasks(names: list[str], tasks_file: TasksFile, source: str, fewshot: int | None = None) -> list[TaskSpec]:
    """Names from the tasks file, or paths of JSONL files (default prompting); `fewshot`
    overrides every task's count."""
    out = []
    for name in names:
        if name in tasks_file.tasks:
            spec = tasks_file.tasks[name].model_copy()
        elif name.endswith(".jsonl") or Path(name).is_file():
            spec = TaskSpec(path=name, name=Path(name).stem)
        else:
            known = ", ".join(sorted(tasks_file.tasks)) or "none"
            raise TaskError(f"task {name!r}: neither a task of {source} ({known}) nor a JSONL file")
        if fewshot is not None:
            spec.fewshot = fewshot
        out.append(spec)
    return out


def resolve_corpora(names: list[str], tasks_file: TasksFile) -> list[tuple[str, Path]]:
    out = []
    for name in names:
        path = Path(tasks_file.corpora[name].path) if name in tasks_file.corpora else Path(name)
        if not path.is_file():
            raise TaskError(f"corpus {name!r}: {path} is not a file (and no corpus of that name in the tasks file)")
        out.append((name if name in tasks_file.corpora else path.stem, path))
    return out


# --- records ---------------------------------------------------------------------------------
def detect_layout(keys: set[str], where: str) -> Layout:
    for layout, need in LAYOUT_KEYS.items():
        if set(need) <= keys:
            return layout  # type: ignore[return-value]
    wanted = "; ".join(f"{LAYOUT_NAMES[k]}: {', '.join(v)}" for k, v in LAYOUT_KEYS.items())
    raise TaskError(f"{where}: keys {sorted(keys)} fit no task layout ({wanted})")


def _check(rec: dict, layout: Layout, where: str) -> None:
    def is_str_list(v) -> bool:
        return isinstance(v, list) and all(isinstance(s, str) for s in v)

    missing = [k for k in LAYOUT_KEYS[layout] if k not in rec]
    if missing:
        raise TaskError(f"{where}: no {', '.join(map(repr, missing))} (a {LAYOUT_NAMES[layout]} record needs them)")
    if layout == "lm":
        for k in ("context", "continuation"):
            if not isinstance(rec[k], str):
                raise TaskError(f"{where}: {k!r} is {type(rec[k]).__name__}, expected a string")
        if not rec["continuation"]:
            raise TaskError(f"{where}: 'continuation' is empty: nothing to score")
        return
    options_key = "choices" if layout == "mc" else "context_options"
    options = rec[options_key]
    if not is_str_list(options):
        raise TaskError(f"{where}: {options_key!r} must be a list of strings")
    if len(options) < 2:
        raise TaskError(f"{where}: {options_key!r} has {len(options)} element(s): a choice needs at least 2")
    gold = rec["gold"]
    if not isinstance(gold, int) or isinstance(gold, bool):
        raise TaskError(f"{where}: 'gold' is {gold!r}, expected the index of the right {options_key[:-1]}")
    if not 0 <= gold < len(options):
        raise TaskError(f"{where}: 'gold' {gold} is out of range for {len(options)} {options_key}")
    if layout == "schema" and not isinstance(rec["continuation"], str):
        raise TaskError(f"{where}: 'continuation' must be a string")
    if layout == "mc" and not isinstance(rec["query"], str):
        raise TaskError(f"{where}: 'query' must be a string")


def read_records(path: str | Path) -> tuple[Layout, list[dict]]:
    """All records of a task file, checked; the layout from the first record's keys, every
    record held to it. Blank lines are allowed; anything else unreadable is an error."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise TaskError(f"{path}: cannot read the task file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 ({e})") from None
    records, layout = [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise TaskError(f"{where}: a record must be a JSON object")
        if layout is None:
            layout = detect_layout(set(rec), where)
        _check(rec, layout, where)
        records.append(rec)
    if layout is None:
        raise TaskError(f"{path}: no records")
    return layout, records


# --- prompts ---------------------------------------------------------------------------------
@dataclass
class Item:
    """One scored item: its requests (context, continuation) in choice order."""

    index: int
    layout: Layout
    requests: list[tuple[str, str]]
    gold: int | None
    choices: list[str] = field(default_factory=list)  # the answers' texts (acc_norm's lengths)


def _question(rec: dict, layout: Layout) -> str:
    return rec["query"] if layout == "mc" else rec["context"]


def _example(rec: dict, layout: Layout, spec: TaskSpec) -> str:
    d = spec.continuation_delimiter
    if layout == "mc":
        text = rec["query"] + d + rec["choices"][rec["gold"]]
    elif layout == "schema":
        text = rec["context_options"][rec["gold"]] + d + rec["continuation"]
    else:
        text = rec["context"] + d + rec["continuation"]
    return text + spec.example_delimiter


def sample_fewshot(rng: random.Random, records: list[dict], rec: dict, k: int) -> list[dict]:
    """lm-evaluation-harness's `ContextSampler.sample` with the evaluated item excluded."""
    if k == 0:
        return []
    if k >= len(records):
        raise TaskError(f"{k}-shot needs more than {k} items; the file has {len(records)}")
    shots = [x for x in rng.sample(records, k + 1) if x != rec][:k]
    if len(shots) < k:  # the item was drawn twice over (duplicates): draw again without it
        shots = rng.sample([x for x in records if x != rec], k)
    return shots


def build_items(spec: TaskSpec, layout: Layout, records: list[dict], limit: int | None = None) -> list[Item]:
    rng = random.Random(spec.seed)
    d = spec.continuation_delimiter
    items = []
    for i, rec in enumerate(records[:limit] if limit else records):
        prefix = "".join(_example(x, layout, spec) for x in sample_fewshot(rng, records, rec, spec.fewshot))
        if layout == "mc":
            ctx = prefix + rec["query"] + d
            items.append(Item(i, layout, [(ctx, c) for c in rec["choices"]], rec["gold"], list(rec["choices"])))
        elif layout == "schema":
            reqs = [(prefix + option + d, rec["continuation"]) for option in rec["context_options"]]
            items.append(Item(i, layout, reqs, rec["gold"], list(rec["context_options"])))
        else:
            items.append(Item(i, layout, [(prefix + rec["context"] + d, rec["continuation"])], None))
    return items
