"""One evaluation: tasks and corpora scored, `results.json` and per-item JSONL written.

`<out>/results.json`: per task its layout, items, skips and truncations, scores with a bootstrap
95% interval, chance and centred accuracy; the CORE-style mean; per corpus bits per byte.
`<out>/items/<task>.jsonl`: one line per item (log-likelihood and greedy flag of every choice,
predictions, scores): what a paired comparison between two models reads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from gristmill.evaluation import bpb as bpb_mod
from gristmill.evaluation.scoring import Counters, encode_items, loglikelihoods, perplexity, score_items
from gristmill.evaluation.stats import bootstrap_ci, centred, core_mean
from gristmill.evaluation.tasks import TaskError, TaskSpec, build_items, read_records

CORE_METRIC = {"mc": "acc", "schema": "acc", "lm": "acc"}


def evaluate_task(
    model, spec: TaskSpec, *, limit: int | None = None, batch_tokens: int = 16384
) -> tuple[dict, list[dict]]:
    layout, records = read_records(spec.path)
    items = build_items(spec, layout, records, limit)
    started = time.perf_counter()
    items, encoded, skipped = encode_items(items, model.tokenizer, model.prefix_id, model.max_len)
    if not items:
        raise TaskError(f"{spec.path}: no item can be scored ({', '.join(f'{v} {k}' for k, v in skipped.items())})")
    counters = Counters()
    results = loglikelihoods(model, encoded, batch_tokens=batch_tokens, counters=counters)
    scores = score_items(items, results, encoded)
    seconds = time.perf_counter() - started
    summary: dict = {
        "layout": layout,
        "path": str(spec.path),
        "fewshot": spec.fewshot,
        "items": len(scores),
        "items_in_file": len(records),
        "skipped": skipped,
        "requests": sum(len(e) for e in encoded),
        "truncated": counters.truncated,
        "truncated_tokens": counters.truncated_tokens,
        "seconds": round(seconds, 3),
        "items_per_s": round(len(scores) / seconds, 2) if seconds > 0 else None,
    }
    metrics = ["acc", "acc_norm", "acc_bytes"] if layout == "mc" else ["acc"]
    for m in metrics:
        vals = [s.scores[m] for s in scores]
        summary[m] = float(np.mean(vals))
        summary[f"{m}_ci95"] = bootstrap_ci(vals)
    if layout == "lm":
        summary["perplexity"] = perplexity(scores)
        summary["chance"] = 0.0
    else:
        summary["chance"] = float(np.mean([1 / s.n_choices for s in scores]))
    summary["centred"] = centred(summary[CORE_METRIC[layout]], summary["chance"])
    return summary, [s.record() for s in scores]


def evaluate(
    model,
    specs: list[TaskSpec],
    corpora: list[tuple[str, Path]] = (),
    *,
    out: Path | None = None,
    limit: int | None = None,
    batch_tokens: int = 16384,
    corpus_tokens: int | None = None,
    say=lambda line: None,
) -> dict:
    res: dict = {
        "model": model.source,
        "model_kind": model.kind,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "limit": limit,
        "tasks": {},
        "corpora": {},
    }
    if out is not None:
        (out / "items").mkdir(parents=True, exist_ok=True)
    for spec in specs:
        summary, rows = evaluate_task(model, spec, limit=limit, batch_tokens=batch_tokens)
        res["tasks"][spec.name] = summary
        if out is not None:
            with open(out / "items" / f"{spec.name}.jsonl", "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        trunc = f", {summary['truncated']} truncated" if summary["truncated"] else ""
        if skipped := sum(summary["skipped"].values()):
            trunc += f", {skipped} skipped ({', '.join(f'{v} {k}' for k, v in summary['skipped'].items())})"
        say(
            f"{spec.name}: acc {summary['acc']:.4f} ({summary['items']} items, {spec.fewshot}-shot{trunc},"
            f" centred {summary['centred']:.4f})"
        )
    for name, path in corpora:
        r = bpb_mod.bits_per_byte(model, bpb_mod.read_corpus(path), max_tokens=corpus_tokens)
        res["corpora"][name] = {"path": str(path), **r}
        say(f"{name}: {r['bits_per_byte']:.4f} bits per byte ({r['tokens']:,} tokens)")
    res["core"] = core_mean({k: v["centred"] for k, v in res["tasks"].items()}) if res["tasks"] else None
    if out is not None:
        (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    return res
