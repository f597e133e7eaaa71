"""Is variant A better than variant B? Per-item scores of each variant's seeds, compared paired
by item, the seeds' spread counted (`stats.compare_variants`): better / worse / not
distinguishable at this budget.

A side is a list of evaluations, one per seed: `pipeline eval` output folders
(`items/<task>.jsonl`) or training output folders (their newest `eval/step-N/<task>.jsonl`, or
the one of `step`). Every evaluation of both sides must hold the same items (same task file,
same limit): the pairing is by item index.

`metric`: a per-item score of the files: `acc`, `acc_norm`, `acc_bytes`, or `loglikelihood`
(language modelling: the continuation's log-likelihood, a continuous score that separates small
models long before their exact-match accuracy leaves 0; comparable across tokenizers, being the
probability of the same string).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gristmill.evaluation.stats import VariantComparison, compare_variants


class CompareError(ValueError):
    """Evaluations that cannot be compared; the message names the folder."""


def item_file(folder: str | Path, task: str, step: int | None = None) -> Path:
    folder = Path(folder)
    if (folder / "items" / f"{task}.jsonl").is_file() and step is None:
        return folder / "items" / f"{task}.jsonl"
    steps = sorted((folder / "eval").glob("step-*")) if (folder / "eval").is_dir() else []
    if step is not None:
        steps = [p for p in steps if p.name == f"step-{step:08d}"]
    steps = [p for p in steps if (p / f"{task}.jsonl").is_file()]
    if not steps:
        raise CompareError(
            f"{folder}: no per-item scores of task {task!r} (items/{task}.jsonl or eval/step-N/{task}.jsonl)"
        )
    return steps[-1] / f"{task}.jsonl"


def item_scores(folder: str | Path, task: str, metric: str, step: int | None = None) -> tuple[list[int], np.ndarray]:
    path = item_file(folder, task, step)
    idx, vals = [], []
    for n, line in enumerate(open(path), 1):
        rec = json.loads(line)
        if metric not in rec.get("scores", {}):
            raise CompareError(f"{path}:{n}: no score {metric!r} (has {', '.join(sorted(rec.get('scores', {})))})")
        idx.append(rec["index"])
        vals.append(float(rec["scores"][metric]))
    return idx, np.asarray(vals)


def side(folders: list[str | Path], task: str, metric: str, step: int | None = None) -> tuple[list[int], np.ndarray]:
    """(item indices, scores of shape (seeds, items)) of one variant's evaluations."""
    if not folders:
        raise CompareError("a side of the comparison has no evaluation")
    first, rows = None, []
    for f in folders:
        idx, vals = item_scores(f, task, metric, step)
        if first is None:
            first = idx
        elif idx != first:
            raise CompareError(f"{f}: its {task} items are not those of {folders[0]} (another file or --limit?)")
        rows.append(vals)
    return first, np.stack(rows)


def compare(
    a: list[str | Path], b: list[str | Path], task: str, metric: str = "acc", *, step: int | None = None, seed: int = 0
) -> VariantComparison:
    ia, sa = side(a, task, metric, step)
    ib, sb = side(b, task, metric, step)
    if ia != ib:
        raise CompareError(f"{a[0]} and {b[0]}: not the same {task} items (another file or --limit?)")
    return compare_variants(sa, sb, seed=seed)
