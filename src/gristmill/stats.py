"""Run stats for notebooks: `gristmill.stats.load(run_dir)`.

    from gristmill import stats
    s = stats.load("runs/crawl")
    s.funnel            # DataFrame: one row per step (docs/bytes in and out, time)
    s.reasons           # DataFrame: step, reason, documents, share
    s.histograms        # DataFrame: stage, step, kind (score|length), series, bin_lo, bin_hi, count
    s.samples           # DataFrame: sampled documents (score, id, url, kept, reason, text)
    s.plot_scores("00_langid")   # SVG figures, drawn inline by Jupyter
    s.plot_length("00_langid")
    s.plot_funnel()

The figures are the ones `pipeline report` puts in its HTML page. (`gristmill.pipeline.stats`
merges the per-task files; this module only reads and shapes them.)
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from gristmill.core.scores import bin_edges
from gristmill.pipeline import report
from gristmill.pipeline.stats import funnel, languages, load_scores, merge_run, top_domains


class RunStats:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.merged = merge_run(self.run_dir)
        self.scores = load_scores(self.run_dir)
        self.thresholds = report.thresholds(self.run_dir)
        rows = funnel(self.merged)
        self.funnel = pd.DataFrame([{k: v for k, v in asdict(r).items() if k != "drops"} | {"mb_per_s": r.mb_per_s}
                                    for r in rows])
        self.reasons = pd.DataFrame(
            [{"stage": r.stage, "step": r.step, "reason": k, "documents": v, "share": v / r.docs_in if r.docs_in else None}
             for r in rows for k, v in sorted(r.drops.items(), key=lambda kv: -kv[1])],
            columns=["stage", "step", "reason", "documents", "share"])
        hist = []
        for stage, steps in self.scores.items():
            for step, rec in steps.items():
                for kind, bins, series in (("score", rec["bins"], rec["hist"]), ("length", rec["length_bins"], rec["length"])):
                    edges = bin_edges(bins)
                    for name, counts in series.items():
                        hist += [{"stage": stage, "step": step, "kind": kind,
                                  "field": rec["score_field"] if kind == "score" else "length_chars", "series": name,
                                  "bin_lo": edges[i], "bin_hi": edges[i + 1], "count": c} for i, c in enumerate(counts)]
        self.histograms = pd.DataFrame(hist, columns=["stage", "step", "kind", "field", "series", "bin_lo", "bin_hi", "count"])
        self.samples = pd.DataFrame(
            [{"stage": stage, "step": step, **{k: v for k, v in s.items() if k != "hash"}}
             for stage, steps in self.scores.items() for step, rec in steps.items() for s in rec["samples"]],
            columns=["stage", "step", "score", "id", "url", "kept", "reason", "text"])
        self.languages = pd.Series(languages(self.merged), name="documents", dtype="int64")

    def _record(self, step: str) -> dict:
        for steps in self.scores.values():
            if step in steps:
                return steps[step]
        raise KeyError(f"no scores for step {step!r}; steps: {[s for st in self.scores.values() for s in st]}")

    def top_domains(self, n: int = 15) -> dict[str, list[tuple[str, int]]]:
        return top_domains(self.scores, n)

    def plot_scores(self, step: str) -> report.Figure:
        return report.score_figure(step, self._record(step), self.thresholds.get(step))

    def plot_length(self, step: str) -> report.Figure:
        return report.length_figure(step, self._record(step))

    def plot_funnel(self) -> report.Figure:
        return report.bar_chart(list(zip(self.funnel["step"], self.funnel["docs_out"])), "documents out of each step")

    def plot_reasons(self, step: str) -> report.Figure:
        r = self.reasons[self.reasons["step"] == step]
        return report.bar_chart(list(zip(r["reason"], r["documents"])), f"{step}: drops by reason", report.DROPPED)

    def plot_languages(self, n: int = 20) -> report.Figure:
        return report.bar_chart(list(self.languages.head(n).items()), "documents per language")


def load(run_dir: str | Path) -> RunStats:
    """Stats of a run directory as DataFrames and SVG plots (merges the per-task files first)."""
    return RunStats(run_dir)
