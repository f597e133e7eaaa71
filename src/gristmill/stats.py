"""Run stats for notebooks: `gristmill.stats.load(run_dir)`.

    from gristmill import stats
    s = stats.load("runs/crawl")
    s.journey           # DataFrame: the documents' journey, one row per step that decides (the reader,
                        #   each YAML step over all its stages, tokenization): docs/bytes in and out,
                        #   dropped, time, notes and counters (paragraphs removed, tokens, ...)
    s.funnel            # DataFrame: every step of every stage (readers, writers, each phase of dedup)
    s.reasons           # DataFrame: step, reason, documents, share
    s.histograms        # DataFrame: stage, step, kind (score|length), series, bin_lo, bin_hi, count
    s.samples           # DataFrame: sampled documents (score, id, url, kept, reason, text)
    s.by_language       # DataFrame: the funnel per language (language, stage, step, docs/bytes in and out)
    s.reasons_by_language   # DataFrame: language, stage, step, reason, documents, share
    s.language_summary  # DataFrame: per language, documents read, kept, bytes kept
    s.journey_by_language   # DataFrame: the journey per language (language, step, docs/bytes in and out)
    s.journey_for("zh") # the journey of one language (s.funnel_for("zh"): per stage)
    s.plot_scores("00_langid")   # SVG figures, drawn inline by Jupyter
    s.plot_length("00_langid")
    s.plot_funnel()     # documents out of each step of the journey

The figures are the ones `pipeline report` puts in its HTML page. (`gristmill.pipeline.report.journey`
merges the per-task files; this module only reads and shapes them.)
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from gristmill.core.scores import bin_edges
from gristmill.pipeline.report import charts
from gristmill.pipeline.report import page as report
from gristmill.pipeline.report.journey import (
    funnel,
    journey,
    journey_notes,
    language_funnel,
    language_journey,
    language_summary,
    languages,
    load_scores,
    read_run,
    top_domains,
)

JOURNEY_COLUMNS = ["step", "kind", "stages", "docs_in", "docs_out", "dropped", "bytes_in", "bytes_out"]


class RunStats:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.merged = read_run(self.run_dir)
        self.scores = load_scores(self.run_dir)
        self.thresholds = report.thresholds(self.run_dir)
        self.journey = pd.DataFrame(
            [
                {
                    "step": r.step,
                    "kind": r.kind,
                    "stages": ", ".join(r.stages),
                    "docs_in": r.docs_in,
                    "docs_out": r.docs_out,
                    "dropped": r.dropped,
                    "bytes_in": r.bytes_in,
                    "bytes_out": r.bytes_out,
                    "time_s": r.time_s,
                    "notes": journey_notes(r),
                    "counters": r.counters,
                }
                for r in journey(self.merged)
            ],
            columns=JOURNEY_COLUMNS + ["time_s", "notes", "counters"],
        )
        rows = funnel(self.merged)
        self.funnel = pd.DataFrame(
            [{k: v for k, v in asdict(r).items() if k != "drops"} | {"mb_per_s": r.mb_per_s} for r in rows]
        )
        self.reasons = pd.DataFrame(
            [
                {
                    "stage": r.stage,
                    "step": r.step,
                    "reason": k,
                    "documents": v,
                    "share": v / r.docs_in if r.docs_in else None,
                }
                for r in rows
                for k, v in sorted(r.drops.items(), key=lambda kv: -kv[1])
            ],
            columns=["stage", "step", "reason", "documents", "share"],
        )
        hist = []
        for stage, steps in self.scores.items():
            for step, rec in steps.items():
                for kind, bins, series in (
                    ("score", rec["bins"], rec["hist"]),
                    ("length", rec["length_bins"], rec["length"]),
                ):
                    edges = bin_edges(bins)
                    for name, counts in series.items():
                        hist += [
                            {
                                "stage": stage,
                                "step": step,
                                "kind": kind,
                                "field": rec["score_field"] if kind == "score" else "length_chars",
                                "series": name,
                                "bin_lo": edges[i],
                                "bin_hi": edges[i + 1],
                                "count": c,
                            }
                            for i, c in enumerate(counts)
                        ]
        self.histograms = pd.DataFrame(
            hist, columns=["stage", "step", "kind", "field", "series", "bin_lo", "bin_hi", "count"]
        )
        self.samples = pd.DataFrame(
            [
                {"stage": stage, "step": step, **{k: v for k, v in s.items() if k != "hash"}}
                for stage, steps in self.scores.items()
                for step, rec in steps.items()
                for s in rec["samples"]
            ],
            columns=["stage", "step", "score", "id", "url", "kept", "reason", "text"],
        )
        self.languages = pd.Series(languages(self.merged), name="documents", dtype="int64")
        by_lang = language_funnel(self.merged, self.scores)
        self.by_language = pd.DataFrame(
            [
                {"language": lang, **{k: v for k, v in asdict(r).items() if k != "drops"}}
                for lang, lrows in by_lang.items()
                for r in lrows
            ],
            columns=["language", "stage", "step", "kind", "docs_in", "docs_out", "bytes_in", "bytes_out"],
        )
        self.reasons_by_language = pd.DataFrame(
            [
                {
                    "language": lang,
                    "stage": r.stage,
                    "step": r.step,
                    "reason": k,
                    "documents": v,
                    "share": v / r.docs_in if r.docs_in else None,
                }
                for lang, lrows in by_lang.items()
                for r in lrows
                for k, v in sorted(r.drops.items(), key=lambda kv: -kv[1])
            ],
            columns=["language", "stage", "step", "reason", "documents", "share"],
        )
        self.journey_by_language = pd.DataFrame(
            [
                {"language": lang, "step": r.step, "kind": r.kind, "stages": r.stage}
                | {k: getattr(r, k) for k in ("docs_in", "docs_out")}
                | {"dropped": sum(r.drops.values()), "bytes_in": r.bytes_in, "bytes_out": r.bytes_out}
                for lang, lrows in language_journey(self.merged, self.scores).items()
                for r in lrows
            ],
            columns=["language", *JOURNEY_COLUMNS],
        )
        self.language_summary = pd.DataFrame(
            [{k: v for k, v in line.items() if k != "drops_by_step"} for line in language_summary(by_lang)],
            columns=["language", "read", "kept", "kept_share", "bytes_kept"],
        )

    def _record(self, step: str) -> dict:
        for steps in self.scores.values():
            if step in steps:
                return steps[step]
        raise KeyError(f"no scores for step {step!r}; steps: {[s for st in self.scores.values() for s in st]}")

    def funnel_for(self, language: str) -> pd.DataFrame:
        """The funnel of one language (rows aligned with `funnel`)."""
        if language not in set(self.by_language["language"]):
            raise KeyError(
                f"no language {language!r} in {self.run_dir}; languages: {list(self.language_summary['language'])}"
            )
        return self.by_language[self.by_language["language"] == language].reset_index(drop=True)

    def journey_for(self, language: str) -> pd.DataFrame:
        """The journey of one language (rows aligned with `journey`)."""
        if language not in set(self.journey_by_language["language"]):
            raise KeyError(
                f"no language {language!r} in {self.run_dir}; languages: {list(self.language_summary['language'])}"
            )
        j = self.journey_by_language
        return j[j["language"] == language].drop(columns="language").reset_index(drop=True)

    def plot_language_kept(self, n: int = 20) -> charts.Figure:
        top = self.language_summary.head(n)
        return charts.bar_chart(list(zip(top["language"], top["kept"])), "documents kept per language")

    def top_domains(self, n: int = 15) -> dict[str, list[tuple[str, int]]]:
        return top_domains(self.scores, n)

    def plot_scores(self, step: str) -> charts.Figure:
        return report.score_figure(step, self._record(step), self.thresholds.get(step))

    def plot_length(self, step: str) -> charts.Figure:
        return report.length_figure(step, self._record(step))

    def plot_funnel(self) -> charts.Figure:
        return charts.bar_chart(list(zip(self.journey["step"], self.journey["docs_out"])), report.JOURNEY_CHART)

    def plot_reasons(self, step: str) -> charts.Figure:
        r = self.reasons[self.reasons["step"] == step]
        return charts.bar_chart(list(zip(r["reason"], r["documents"])), f"{step}: drops by reason", charts.DROPPED)

    def plot_languages(self, n: int = 20) -> charts.Figure:
        return charts.bar_chart(list(self.languages.head(n).items()), "documents per language")


def load(run_dir: str | Path) -> RunStats:
    """Stats of a run directory as DataFrames and SVG plots (the per-task files merged in memory)."""
    return RunStats(run_dir)
