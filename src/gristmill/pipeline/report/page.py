"""`pipeline report RUN_DIR -o report.html`: one self-contained HTML page about a run.

No network, no JavaScript library, no plotting dependency: the CSS is inline and every plot is
an SVG built here. Everything that comes from the web (text, URLs, language codes, reasons) is
escaped with `html.escape`, so a crawled `<script>` shows as text. The page's one inline script
(our own) marks `document.body.dataset.ok` on load, which the tests read from headless Chromium.

The same figures back `gristmill.stats` (they have `_repr_svg_`, so Jupyter draws them); the SVG
charts themselves are `pipeline/report/charts.py`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from gristmill.core.files import replacing
from gristmill.core.scores import bin_edges
from gristmill.core.step import registered_steps, step_id
from gristmill.pipeline.report.charts import AFTER, BEFORE, DROPPED, KEPT, Figure, bar_chart, esc, histogram, line_chart
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

# --- what the report reads ------------------------------------------------------------------


def thresholds(run_dir: Path) -> dict[str, tuple[float, str]]:
    """step id → (threshold, label) of each filter's bound on its score (the `Threshold` it
    declares with `score=True`), read from the run's config.yaml."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    cfg = yaml.safe_load(path.read_text()) or {}
    registry = registered_steps()
    out = {}
    for i, spec in enumerate(cfg.get("steps") or []):
        if not isinstance(spec, dict) or len(spec) != 1:
            continue
        ((name, params),) = spec.items()
        bound = next((t for t in getattr(registry.get(name), "thresholds", ()) if t.score), None)
        if bound is not None and isinstance(params, dict):
            value = params.get(bound.param)
            if isinstance(value, (int, float)):
                out[step_id(i, name)] = (float(value), f"{bound.kind} {bound.param}")
    return out


def score_figure(step: str, rec: dict, threshold: tuple[float, str] | None = None) -> Figure:
    field = rec["score_field"]
    return histogram(
        bin_edges(rec["bins"]),
        {"kept": rec["hist"]["kept"], "dropped": rec["hist"]["dropped"]},
        title=f"{step}: {field}" + (" (documents without a score not shown)" if any(rec["missing"].values()) else ""),
        log_x=rec["bins"]["scale"] == "log",
        threshold=threshold[0] if threshold else None,
        threshold_label=threshold[1] if threshold else "",
        colors={"kept": KEPT, "dropped": DROPPED},
    )


def length_figure(step: str, rec: dict) -> Figure:
    return histogram(
        bin_edges(rec["length_bins"]),
        {"before": rec["length"]["before"], "after (kept)": rec["length"]["after"]},
        title=f"{step}: document length (characters)",
        log_x=True,
        colors={"before": BEFORE, "after (kept)": AFTER},
    )


def token_stats(run_dir: Path) -> dict | None:
    if not (run_dir / "tokens" / "manifest.json").is_file():
        return None
    import numpy as np

    from gristmill.tokenize import open_tokens

    tok = open_tokens(run_dir / "tokens", verify=False)
    out = {"vocab_size": tok.vocab_size, "splits": {}}
    for split in tok.splits:
        lengths = tok.document_lengths(split)
        out["splits"][split] = {"documents": int(len(lengths)), "tokens": int(lengths.sum()), "lengths": lengths}
    all_lengths = np.concatenate([s["lengths"] for s in out["splits"].values()]) if out["splits"] else np.zeros(0)
    out["lengths"] = all_lengths
    return out


def training_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "train" / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def cluster_sizes(run_dir: Path) -> list[tuple[str, dict[str, int]]]:
    """Near-dedup cluster size distributions: the sum of each cluster partition's histogram
    (`<NN_near_dedup_cluster>/dups/sizes_QQQQQ.json`), or a run's from before the clustering
    was partitioned (`cluster_sizes.json`)."""
    from gristmill.dedup.cluster import cluster_sizes as partition_sizes

    out = []
    for folder in sorted(Path(run_dir).glob("*_near_dedup_cluster")):
        sizes = partition_sizes(folder)
        if sizes is None and (folder / "cluster_sizes.json").is_file():
            sizes = json.loads((folder / "cluster_sizes.json").read_text())["sizes"]
        if sizes is not None:
            out.append((folder.name, sizes))
    return out


def dedup_counters(merged: dict) -> list[tuple[str, dict]]:
    out = []
    for stage in merged["stages"]:
        for step in stage["steps"]:
            c = step["counters"]
            if "clusters" in c or "duplicates" in c:
                out.append((f"{stage['label']} / {step['name']}", c))
    return out


# --- the page -------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:14px;margin:16px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
td.l,th.l{text-align:left}th{background:#f3f5f7}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid svg{border:1px solid #eee;background:#fff}
.doc{border:1px solid #e3e3e3;border-left:4px solid #e0703a;margin:6px 0;padding:4px 8px;font-size:12px}
.doc.kept{border-left-color:#3b7dd8}.doc pre{white-space:pre-wrap;margin:4px 0;max-height:6.5em;overflow:hidden}
.muted{color:#666;font-size:13px}details{margin:4px 0}summary{cursor:pointer;font-size:13px}
"""

# Our own script; it reads window.pwned only to let the tests prove no crawled script ran.
SCRIPT = """<script>
window.addEventListener('load', function () {
  if (window.pwned !== undefined) { document.body.dataset.pwned = String(window.pwned); }
  document.body.dataset.ok = '1';
});
</script>"""


def _table(headers: list[str], rows: list[list], left: int = 1, text: tuple[int, ...] = ()) -> str:
    """Columns before `left`, and those in `text`, are aligned left (words); the others right."""
    cls = lambda i: "l" if i < left or i in text else ""  # noqa: E731
    head = "".join(f'<th class="{cls(i)}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="{cls(i)}">{esc(v)}</td>' for i, v in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _sample_html(s: dict) -> str:
    score = "-" if s.get("score") is None else f"{s['score']:.4g}"
    lines = "\n".join((s.get("text") or "").splitlines()[:5])
    cls = "doc kept" if s["kept"] else "doc"
    return (
        f'<div class="{cls}"><b>{esc("kept" if s["kept"] else s.get("reason"))}</b> · score {esc(score)} · '
        f'<span class="muted">{esc(s.get("url"))}</span><pre>{esc(lines)}</pre></div>'
    )


def by_language_html(by_lang: dict, rows: list, by_lang_journey: dict, detailed: int = 12) -> str:
    """The per-language section: one line per language (read, kept, dropped per filter), a bar
    chart of kept documents, and for the largest languages their journey and drops by reason.
    `by_lang`: the per-stage funnel per language; `rows`: the journey; `by_lang_journey`: the
    journey per language (aligned with `rows`)."""
    out = [
        '<section id="by-language"><h2>Per language: kept and dropped</h2>'
        '<p class="muted">Languages as langid labelled them; documents dropped before langid, or in a run '
        'without it, are under "unknown". Per step, the languages add up to the funnel above.</p>'
    ]
    summary = language_summary(by_lang)
    if not summary:
        out.append('<p class="muted">No filter recorded languages in this run directory.</p></section>')
        return "\n".join(out)
    filters = [r.step for r in rows if r.kind in ("filter", "dedup")]
    table = [
        [
            x["language"],
            f"{x['read']:,}",
            f"{x['kept']:,}",
            f"{x['kept_share']:.1%}" if x["kept_share"] is not None else "-",
            f"{x['bytes_kept']:,}",
            *(f"{x['drops_by_step'].get(f, 0):,}" for f in filters),
        ]
        for x in summary
    ]
    out.append(
        _table(["language", "read", "kept", "kept %", "bytes kept", *(f"dropped by {f}" for f in filters)], table)
    )
    top = [(x["language"], x["kept"]) for x in summary[:20]]
    read = [(x["language"], x["read"]) for x in summary[:20]]
    out.append(
        f'<div class="grid">{bar_chart(read, "documents read per language", BEFORE)}'
        f"{bar_chart(top, 'documents kept per language', KEPT)}</div>"
    )
    for x in summary[:detailed]:
        lang = x["language"]
        lrows = by_lang_journey.get(lang, [])
        drops = [
            [r.step, k, f"{v:,}", f"{v / r.docs_in:.1%}" if r.docs_in else "-"]
            for r in lrows
            for k, v in sorted(r.drops.items(), key=lambda kv: -kv[1])
        ]
        out.append(
            f'<details data-language="{esc(lang)}"><summary>{esc(lang)}: {x["read"]:,} read, '
            f"{x['kept']:,} kept</summary>"
        )
        out.append(
            _table(
                ["step", "docs in", "docs out", "kept", "bytes in", "bytes out"],
                [
                    [
                        r.step,
                        f"{r.docs_in:,}",
                        f"{r.docs_out:,}",
                        f"{r.docs_out / r.docs_in:.1%}" if r.docs_in else "-",
                        f"{r.bytes_in:,}",
                        f"{r.bytes_out:,}",
                    ]
                    for r in lrows
                ],
            )
        )
        if drops:
            out.append(_table(["step", "reason", "documents", f"share of {lang} step input"], drops, left=2))
        out.append("</details>")
    if len(summary) > detailed:
        out.append(
            f'<p class="muted">{len(summary) - detailed} more languages: '
            f"<code>pipeline stats RUN_DIR --language LANG</code>.</p>"
        )
    out.append("</section>")
    return "\n".join(out)


JOURNEY_CHART = "documents out of each step"


def journey_table(steps: list) -> str:
    return _table(
        ["step", "docs in", "docs out", "kept", "dropped", "bytes in", "bytes out", "time s", "notes"],
        [
            [
                r.step,
                f"{r.docs_in:,}",
                f"{r.docs_out:,}",
                f"{r.docs_out / r.docs_in:.1%}" if r.docs_in else "-",
                f"{r.dropped:,}",
                f"{r.bytes_in:,}",
                f"{r.bytes_out:,}",
                f"{r.time_s:.2f}",
                journey_notes(r),
            ]
            for r in steps
        ],
        text=(8,),
    )


def journey_chart(steps: list) -> Figure:
    """Documents out of each step of the journey (no stage's reader or writer)."""
    return bar_chart([(r.step, r.docs_out) for r in steps], JOURNEY_CHART)


def build(run_dir: str | Path, samples_per_reason: int = 5) -> str:
    """The report's HTML for a run directory (stats merged afresh, in memory: nothing in it is written)."""
    run_dir = Path(run_dir)
    merged = read_run(run_dir)
    scores = load_scores(run_dir)
    thr = thresholds(run_dir)
    rows = funnel(merged)
    journey_rows = journey(merged)
    out = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>gristmill report: "
        f"{esc(run_dir.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>gristmill report: {esc(run_dir)}</h1>",
    ]
    incomplete = [s for s in merged["stages"] if s["tasks_completed"] < s["tasks"]]
    for s in incomplete:
        out.append(f'<p class="muted">{esc(s["label"])}: {s["tasks_completed"]}/{s["tasks"]} tasks complete</p>')

    # funnel: the documents' journey, then every stage for whoever wants it
    out.append(
        '<section id="funnel"><h2>Funnel</h2><p class="muted">One row per step that decides what '
        "happens to the documents: the reader, each step of the config (a dedup step over all its "
        "stages), tokenization.</p>"
    )
    out.append(journey_table(journey_rows))
    out.append(f'<div class="grid">{journey_chart(journey_rows)}</div>')
    out.append(
        f'<details id="stages"><summary>Per stage: every stage\'s reader, steps and writer ({len(rows)} rows)</summary>'
    )
    out.append(
        _table(
            ["stage", "step", "docs in", "docs out", "kept", "bytes in", "bytes out", "time s", "MB/s"],
            [
                [
                    r.stage,
                    r.step,
                    f"{r.docs_in:,}",
                    f"{r.docs_out:,}",
                    f"{r.docs_out / r.docs_in:.1%}" if r.docs_in else "-",
                    f"{r.bytes_in:,}",
                    f"{r.bytes_out:,}",
                    f"{r.time_s:.2f}",
                    f"{r.mb_per_s:.1f}" if r.mb_per_s else "-",
                ]
                for r in rows
            ],
            left=2,
        )
    )
    out.append("</details></section>")

    # drops by reason
    out.append('<section id="reasons"><h2>Drops by reason</h2><div class="grid">')
    reason_rows = []
    for r in journey_rows:
        if r.drops:
            items = sorted(r.drops.items(), key=lambda kv: -kv[1])
            out.append(str(bar_chart(items, f"{r.step}: {r.dropped:,} of {r.docs_in:,} dropped", DROPPED)))
            reason_rows += [[r.step, k, f"{v:,}", f"{v / r.docs_in:.1%}" if r.docs_in else "-"] for k, v in items]
        reason_rows += [
            [r.step, f"{k} (a record, not a document)", f"{v:,}", "-"]
            for k, v in r.counters.items()
            if k.startswith("skipped_")
        ]
    out.append("</div>" + _table(["step", "reason", "documents", "share of step input"], reason_rows, left=2))
    out.append("</section>")

    # histograms
    out.append('<section id="histograms"><h2>Scores and document length, kept vs dropped</h2>')
    if not scores:
        out.append('<p class="muted">No score histograms in this run directory (made before they were recorded).</p>')
    for label, steps in scores.items():
        out.append(f"<h3>{esc(label)}</h3><div class=grid>")
        for step, rec in steps.items():
            out.append(str(score_figure(step, rec, thr.get(step))))
            out.append(str(length_figure(step, rec)))
        out.append("</div>")
    out.append("</section>")

    # languages
    langs = languages(merged)
    out.append('<section id="languages"><h2>Languages (langid, before its keep-list)</h2>')
    if langs:
        items = list(langs.items())[:20]
        if len(langs) > 20:
            items.append((f"{len(langs) - 20} more", sum(list(langs.values())[20:])))
        out.append(f"<div class=grid>{bar_chart(items, 'documents per language')}</div>")
    else:
        out.append('<p class="muted">No langid step in this run.</p>')
    out.append("</section>")

    out.append(by_language_html(language_funnel(merged, scores), journey_rows, language_journey(merged, scores)))

    # domains
    dom = top_domains(scores)
    out.append(
        '<section id="domains"><h2>Top domains</h2><p class="muted">Counted in the sampled documents '
        "(up to 50 kept by the last filter and 50 per drop reason, chosen by hash of the document id), "
        "not in all documents.</p><div class=grid>"
    )
    out.append(
        str(bar_chart(dom["kept"], "kept (sampled)", KEPT))
        + str(bar_chart(dom["dropped"], "dropped (sampled)", DROPPED))
    )
    out.append("</div></section>")

    # dedup
    dd = dedup_counters(merged)
    clusters = cluster_sizes(run_dir)
    if dd or clusters:
        out.append('<section id="dedup"><h2>Deduplication</h2>')
        for name, sizes in clusters:
            items = [(f"{size} docs", n) for size, n in sorted(sizes.items(), key=lambda kv: int(kv[0]))]
            out.append(
                f"<h3>{esc(name)}: near-duplicate clusters by size</h3>"
                + str(bar_chart(items, "clusters of each size (documents per cluster)", DROPPED))
            )
        for name, c in dd:
            out.append(f"<h3>{esc(name)}</h3>" + _table(["counter", "value"], [[k, f"{v:,}"] for k, v in c.items()]))
        out.append("</section>")

    # tokens
    tok = token_stats(run_dir)
    if tok:
        import numpy as np

        out.append('<section id="tokens"><h2>Tokens</h2>')
        out.append(
            _table(
                ["split", "documents", "tokens"],
                [[s, f"{v['documents']:,}", f"{v['tokens']:,}"] for s, v in tok["splits"].items()],
            )
        )
        lengths = tok["lengths"]
        if len(lengths):
            top = max(1.0, math.log10(max(int(lengths.max()), 1)) + 0.25)
            edges_log = np.linspace(0, top, 25)
            counts, _ = np.histogram(np.log10(np.maximum(lengths, 1)), bins=edges_log)
            out.append(
                "<div class=grid>"
                + str(
                    histogram(
                        [10**e for e in edges_log],
                        {"documents": counts.tolist()},
                        "document length (tokens)",
                        log_x=True,
                    )
                )
                + "</div>"
            )
        out.append("</section>")

    # training
    metrics = training_metrics(run_dir)
    if metrics:
        loss = [(m["step"], m["loss"]) for m in metrics if "loss" in m and "step" in m]
        val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m and "step" in m]
        out.append('<section id="training"><h2>Training</h2><div class=grid>')
        out.append(str(line_chart({"loss": loss, **({"val_loss": val} if val else {})}, "loss by step")))
        out.extend(str(chart) for chart in _eval_charts(metrics))
        out.append("</div></section>")

    # samples
    out.append(
        '<section id="samples"><h2>Sampled documents</h2><p class="muted">Per filter and reason, documents '
        "chosen by the smallest hash of their id (first lines of up to 300 characters).</p>"
    )
    for label, steps in scores.items():
        for step, rec in steps.items():
            groups: dict[str, list] = {}
            for s in rec["samples"]:
                groups.setdefault("kept" if s["kept"] else s.get("reason") or "unspecified", []).append(s)
            out.append(f"<h3>{esc(label)} / {esc(step)}</h3>")
            for reason in sorted(groups, key=lambda g: (g == "kept", g)):
                docs = groups[reason]
                out.append(
                    f"<details{' open' if reason != 'kept' else ''}><summary>{esc(reason)} "
                    f"({len(docs)} sampled)</summary>"
                )
                out.extend(_sample_html(s) for s in docs[:samples_per_reason])
                out.append("</details>")
    out.append("</section>")
    out.append(SCRIPT + "</body></html>")
    return "\n".join(out)


def _eval_charts(metrics: list[dict]) -> list:
    """The scorings during training (`trainer/scores.py`'s `eval/...` keys) against tokens seen:
    CORE, then each task's centred accuracy (chance at 0, so tasks of 2 and 4 choices share an
    axis) or a language-modelling task's perplexity, then each corpus's bits per byte."""
    scored = [m for m in metrics if "tokens" in m and any(k.startswith("eval/") for k in m)]
    keys = sorted({k for m in scored for k in m if k.startswith("eval/")})
    series: dict[str, list] = {}
    for key in keys:
        parts = key.split("/")
        if key == "eval/core" or (len(parts) == 3 and parts[2] in ("centred", "perplexity", "bits_per_byte")):
            series[key] = [(m["tokens"], m[key]) for m in scored if isinstance(m.get(key), (int, float))]
    charts = []
    if series.get("eval/core"):
        charts.append(line_chart({"CORE": series.pop("eval/core")}, "CORE (mean centred accuracy) by tokens seen"))
    for key, pts in series.items():
        if pts:
            _, name, metric = key.split("/")
            what = {"centred": "centred accuracy", "perplexity": "perplexity", "bits_per_byte": "bits per byte"}
            charts.append(line_chart({name: pts}, f"{name}: {what[metric]} by tokens seen"))
    return charts


def write(run_dir: str | Path, output: str | Path) -> Path:
    output = Path(output)
    html = build(run_dir)
    with replacing(output) as tmp:  # a full disk leaves no half page, nor a .tmp
        tmp.write_text(html, encoding="utf-8")
    return output
