"""Merged stats of a run and the funnel that `pipeline stats` prints.

Each task writes datatrove's per-step stats to `<stage>/stats/NNNNN.json`. We merge them from
those files (not from datatrove's in-memory sum, which covers only the tasks of the latest
invocation) into `<stage>/stats.json` and the run's `stats.json`, so a resumed run reports the
same totals as an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


def _total(value) -> float:
    return value["total"] if isinstance(value, dict) else value


def merge_stage(folder: Path) -> list[dict]:
    """Sum every task's per-step counters and times, keeping the pipeline's step order."""
    steps: list[dict] = []
    files = sorted((folder / "stats").glob("*.json"))
    for path in files:
        for i, step in enumerate(json.loads(path.read_text())):
            if i == len(steps):
                steps.append({"name": step["name"], "counters": {}, "time_s": 0.0})
            merged = steps[i]
            merged["time_s"] += _total(step.get("time_stats", 0.0))
            for key, value in step.get("stats", {}).items():
                merged["counters"][key] = merged["counters"].get(key, 0) + _total(value)
    for step in steps:
        step["counters"] = dict(sorted(step["counters"].items()))
    (folder / "stats.json").write_text(json.dumps(steps, indent=2))
    return steps


def merge_scores(folder: Path) -> dict[str, dict]:
    """Merge each filter's per-task score histograms and samples into `<stage>/scores.json`."""
    from gristmill.core.scores import merge

    merged = {}
    root = folder / "scores"
    for step_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        parts = [json.loads(p.read_text()) for p in sorted(step_dir.glob("*.json"))]
        if parts:
            merged[step_dir.name] = merge(parts)
    if merged:
        (folder / "scores.json").write_text(json.dumps(merged))
    return merged


def load_scores(run_dir: Path) -> dict[str, dict]:
    """Stage label → step → merged scores (histograms, samples), as `merge_run` wrote them."""
    out = {}
    for stage in json.loads((run_dir / "plan.json").read_text())["stages"]:
        path = run_dir / stage["label"] / "scores.json"
        if path.is_file():
            out[stage["label"]] = json.loads(path.read_text())
    return out


def domain(url: str | None) -> str | None:
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname if url else None
    except ValueError:
        return None
    return host.removeprefix("www.") if host else None


def top_domains(scores: dict[str, dict], n: int = 15) -> dict[str, list[tuple[str, int]]]:
    """Most frequent domains among the *sampled* kept documents (of the run's last filter) and
    dropped documents (all filters): an estimate from the bounded samples, not exact counts."""
    from collections import Counter

    kept, dropped = Counter(), Counter()
    records = [rec for steps in scores.values() for rec in steps.values()]
    for rec in records:
        for s in rec["samples"]:
            d = domain(s.get("url"))
            if d and not s["kept"]:
                dropped[d] += 1
            elif d and rec is records[-1]:  # kept by the run's last filter
                kept[d] += 1
    return {"kept": kept.most_common(n), "dropped": dropped.most_common(n)}


def merge_run(run_dir: Path) -> dict:
    plan = json.loads((run_dir / "plan.json").read_text())
    stages = []
    for stage in plan["stages"]:
        folder = run_dir / stage["label"]
        done = len(list((folder / "completions").glob("*"))) if (folder / "completions").is_dir() else 0
        steps = merge_stage(folder) if (folder / "stats").is_dir() else []
        merge_scores(folder)
        stages.append({**stage, "tasks_completed": done, "steps": steps})
    merged = {"run_dir": str(run_dir), "stages": stages}
    (run_dir / "stats.json").write_text(json.dumps(merged, indent=2))
    return merged


@dataclass
class FunnelRow:
    stage: str
    step: str
    kind: str
    docs_in: int
    docs_out: int
    bytes_in: int
    bytes_out: int
    time_s: float
    drops: dict[str, int] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float | None:
        return self.bytes_in / 1e6 / self.time_s if self.time_s > 0 else None


def _row(stage: str, step: dict) -> FunnelRow:
    kind, _, name = step["name"].partition(": ")
    c = {k: int(v) for k, v in step["counters"].items()}
    if "READER" in kind:
        bad = {k.removeprefix("bad_"): v for k, v in c.items() if k.startswith("bad_")}
        skipped = {k: v for k, v in c.items() if k.startswith("skipped_")}
        docs = c.get("documents", 0)
        return FunnelRow(stage, name, "reader", docs + sum(bad.values()), docs, c.get("bytes", 0),
                         c.get("bytes", 0), step["time_s"], {**bad, **skipped})
    if "FILTER" in kind:
        drops = {k.removeprefix("dropped_"): v for k, v in c.items() if k.startswith("dropped_")}
        return FunnelRow(stage, name, "filter", c.get("total", 0), c.get("forwarded", 0), c.get("bytes_in", 0),
                         c.get("bytes_out", 0), step["time_s"], drops)
    docs, size = c.get("documents", c.get("total", 0)), c.get("bytes", 0)
    return FunnelRow(stage, name, "writer" if "WRITER" in kind else "step", docs, docs, size, size, step["time_s"])


def funnel(merged: dict) -> list[FunnelRow]:
    return [_row(stage["label"], step) for stage in merged["stages"] for step in stage["steps"]]


def languages(merged: dict) -> dict[str, int]:
    """Documents per language as identified by langid (before its keep-list applies)."""
    counts: dict[str, int] = {}
    for stage in merged["stages"]:
        for step in stage["steps"]:
            for key, value in step["counters"].items():
                if key.startswith("lang_"):
                    counts[key[5:]] = counts.get(key[5:], 0) + int(value)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def as_json(merged: dict) -> dict:
    return {
        "run_dir": merged["run_dir"],
        "stages": [{k: s[k] for k in ("label", "tasks", "tasks_completed")} for s in merged["stages"]],
        "funnel": [{**asdict(r), "mb_per_s": r.mb_per_s} for r in funnel(merged)],
        "languages": languages(merged),
    }
