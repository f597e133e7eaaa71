"""What an ablation found: results.json, results.md and SVG plots in <out>/.

Per task, the score compared is a per-item score of the trainings' own scorings
(`<run>/eval/step-N/<task>.jsonl`): `acc_norm` for multiple choice, `acc` for schema tasks,
`loglikelihood` for language modelling (`eval.metrics` chooses another). Curves are the mean of
that score over the items at each scoring, per seed; a variant's line is the seeds' mean, its
band their range. The final difference of each variant from the baseline, its 95% interval and
the verdict are `evaluation.compare` over the last scoring (`stats.compare_variants`: items
paired, seeds' spread counted). Corpora (bits per byte, lower is better) have no items: their
interval is the seeds' alone (Student's t on the pooled per-seed values; one seed a side: none).
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

import numpy as np

from gristmill.ablation.config import AblateConfig, TrainRun, task_names
from gristmill.core.files import write_text_atomic
from gristmill.evaluation.compare import CompareError, compare, item_scores
from gristmill.evaluation.stats import t975

COLORS = ["#3b7dd8", "#e0703a", "#2e9e5b", "#9b59b6", "#c0392b", "#7f8c8d", "#d4ac0d", "#16a085"]


def _metric(cfg: AblateConfig, task: str, run: Path, step: int) -> str:
    if task in cfg.eval.metrics:
        return cfg.eval.metrics[task]
    first = json.loads((run / "eval" / f"step-{step:08d}" / f"{task}.jsonl").open().readline())
    scores = first.get("scores", {})
    return "acc_norm" if "acc_norm" in scores else "loglikelihood" if "loglikelihood" in scores else "acc"


def _scorings(run: Path, task: str) -> list[int]:
    folder = run / "eval"
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in folder.glob("step-*") if (p / f"{task}.jsonl").is_file())


def _corpus_curves(run: Path, corpus: str) -> dict[int, float]:
    out = {}
    path = run / "metrics.jsonl"
    for line in path.open() if path.is_file() else []:
        rec = json.loads(line)
        key = f"eval/{corpus}/bits_per_byte"
        if key in rec:
            out[rec["step"]] = rec[key]
    return out


def _corpus_names(cfg: AblateConfig) -> list[str]:
    from gristmill.evaluation.tasks import load_tasks_file, resolve_corpora

    return [name for name, _ in resolve_corpora(cfg.corpora, load_tasks_file(cfg.eval.tasks_file))]


def write_report(cfg: AblateConfig, state: dict, runs: list[TrainRun], out: Path) -> dict:
    by_variant: dict[str, list[TrainRun]] = {}
    for r in runs:
        by_variant.setdefault(r.variant, []).append(r)
    names = [n for n in cfg.names() if n in by_variant]
    base = cfg.baseline
    steps = runs[0].steps
    from gristmill.trainer.config import load as load_train  # the trained config, as written

    tcfg = load_train(runs[0].out / "train_config.yaml")
    per_step = tcfg.data.global_batch * tcfg.data.seq_len
    results: dict = {
        "config": cfg.model_dump(mode="json"),
        "baseline": base,
        "tokens_per_run": steps * per_step,
        "steps": steps,
        "variants": {},
        "tasks": {},
        "corpora": {},
        "skipped": {n: s["skipped"] for n, s in state.items() if s.get("skipped")},
    }
    for name in names:
        s = state[name]
        results["variants"][name] = {
            "documents_read": s.get("read"),
            "documents_kept": s.get("kept"),
            "train_tokens": s.get("train_tokens"),
            "epochs": steps * per_step / s["train_tokens"] if s.get("train_tokens") else None,
            "seeds": [r.seed for r in by_variant[name]],
            "runs": [str(r.out.relative_to(out)) for r in by_variant[name]],
        }
    lines = []
    for task in task_names(cfg):
        metric = _metric(cfg, task, by_variant[base][0].out, steps)
        entry = {"metric": metric, "curves": {}, "final": {}, "vs_baseline": {}}
        for name in names:
            curve = {}
            for r in by_variant[name]:
                for step in _scorings(r.out, task):
                    _, vals = item_scores(r.out, task, metric, step)
                    curve.setdefault(step, []).append(float(vals.mean()))
            entry["curves"][name] = [
                {
                    "step": st,
                    "tokens": st * per_step,
                    "mean": float(np.mean(v)),
                    "min": min(v),
                    "max": max(v),
                    "seeds": v,
                }
                for st, v in sorted(curve.items())
            ]
            last = curve.get(steps, [])
            entry["final"][name] = {"mean": float(np.mean(last)) if last else None, "seeds": last}
        for name in names:
            if name == base:
                continue
            try:
                c = compare(
                    [r.out for r in by_variant[name]], [r.out for r in by_variant[base]], task, metric, step=steps
                )
            except CompareError as e:
                entry["vs_baseline"][name] = {"error": str(e)}
                continue
            entry["vs_baseline"][name] = {
                "diff": c.diff,
                "ci95": list(c.ci),
                "se_items": c.se_items,
                "se_seeds": c.se_seeds,
                "df": c.df,
                "verdict": c.verdict,
            }
            lines.append(
                f"{task} ({metric}): {name} - {base} = {c.diff:+.4f}, 95% [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}]:"
                f" {_plain(c.verdict)}"
            )
        results["tasks"][task] = entry
    for corpus in _corpus_names(cfg):
        entry = {"metric": "bits_per_byte", "curves": {}, "final": {}, "vs_baseline": {}}
        finals = {}
        for name in names:
            curve = {}
            for r in by_variant[name]:
                for st, v in _corpus_curves(r.out, corpus).items():
                    curve.setdefault(st, []).append(v)
            entry["curves"][name] = [
                {
                    "step": st,
                    "tokens": st * per_step,
                    "mean": float(np.mean(v)),
                    "min": min(v),
                    "max": max(v),
                    "seeds": v,
                }
                for st, v in sorted(curve.items())
            ]
            finals[name] = curve.get(steps, [])
            entry["final"][name] = {
                "mean": float(np.mean(finals[name])) if finals[name] else None,
                "seeds": finals[name],
            }
        for name in names:
            if name != base and finals[name] and finals[base]:
                diff, ci, verdict = seeds_comparison(finals[name], finals[base], lower_is_better=True)
                entry["vs_baseline"][name] = {"diff": diff, "ci95": ci, "verdict": verdict}
                ci_text = f", 95% [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else ""
                lines.append(
                    f"{corpus} (bits per byte, lower is better): {name} - {base} = {diff:+.4f}{ci_text}: {verdict}"
                )
        results["corpora"][corpus] = entry
    results["verdict_lines"] = lines
    shared = out / "stages.json"
    if shared.is_file():
        results["shared_stages"] = [
            {"label": v["label"], "computed_in": v["variant"], "shared_with": v["shared_with"]}
            for v in sorted(json.loads(shared.read_text()).values(), key=lambda v: v["label"])
            if v.get("shared_with")
        ]
    write_text_atomic(out / "results.json", json.dumps(results, indent=2))
    write_text_atomic(out / "results.md", markdown(results))
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    for kind in ("tasks", "corpora"):
        for name, entry in results[kind].items():
            write_text_atomic(plots / f"{name}.svg", curve_svg(f"{name}: {entry['metric']}", entry["curves"]))
    write_text_atomic(plots / "differences.svg", differences_svg(results))
    return results


def _plain(verdict: str) -> str:
    return verdict.replace("not distinguishable", "not distinguishable at this budget")


def seeds_comparison(a: list[float], b: list[float], lower_is_better: bool = False):
    """(diff, 95% interval or None, verdict) of per-seed values: Student's t on the pooled spread."""
    diff = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return diff, None, "one seed on a side: no interval"
    pooled = (float(np.sum((np.array(a) - np.mean(a)) ** 2)) + float(np.sum((np.array(b) - np.mean(b)) ** 2))) / (
        len(a) + len(b) - 2
    )
    half = t975(len(a) + len(b) - 2) * math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    lo, hi = diff - half, diff + half
    good, bad = (hi < 0, lo > 0) if lower_is_better else (lo > 0, hi < 0)
    return diff, [lo, hi], "better" if good else "worse" if bad else "not distinguishable at this budget"


def markdown(results: dict) -> str:
    base = results["baseline"]
    out = [
        f"# Ablation: {len(results['variants'])} variants, {results['tokens_per_run']:,} tokens per run"
        f" ({results['steps']} steps), baseline `{base}`",
        "",
        "| variant | documents kept / read | training tokens | epochs | seeds |",
        "|---|---|---|---|---|",
    ]
    for name, v in results["variants"].items():
        ep = f"{v['epochs']:.2f}" if v["epochs"] is not None else "-"
        out.append(
            f"| {name} | {v['documents_kept']:,} / {v['documents_read']:,} | {v['train_tokens']:,} | {ep} |"
            f" {', '.join(map(str, v['seeds']))} |"
        )
    for name, why in results["skipped"].items():
        out.append(f"| {name} | left out: {why} | | | |")
    out += [
        "",
        "| task (score) | variant | final (mean of seeds) | − baseline | 95% interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("tasks", "corpora"):
        for task, entry in results[kind].items():
            for name, fin in entry["final"].items():
                mean = f"{fin['mean']:.4f}" if fin["mean"] is not None else "-"
                c = entry["vs_baseline"].get(name)
                if name == base:
                    out.append(f"| {task} ({entry['metric']}) | {name} | {mean} | baseline | | |")
                elif c is None or "error" in c:
                    out.append(f"| {task} ({entry['metric']}) | {name} | {mean} | - | - | {c and c.get('error')} |")
                else:
                    ci = f"[{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]" if c.get("ci95") else "-"
                    out.append(
                        f"| {task} ({entry['metric']}) | {name} | {mean} | {c['diff']:+.4f} | {ci} |"
                        f" {_plain(c['verdict'])} |"
                    )
    if results.get("shared_stages"):
        out += ["", "Stages computed once and shared:", ""]
        out += [
            f"- {s['label']}: computed in {s['computed_in']}, shared with {', '.join(s['shared_with'])}"
            for s in results["shared_stages"]
        ]
    out += ["", "Plots: plots/<task>.svg (score against tokens, seeds' range shaded), plots/differences.svg.", ""]
    return "\n".join(out)


# --- SVG, written directly (no plotting library needed) -----------------------------------------


def _svg(width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' font-family="sans-serif" font-size="12">' + "".join(body) + "</svg>\n"
    )


def _num(v: float) -> str:
    return f"{v / 1e6:.3g}M" if abs(v) >= 1e6 else f"{v / 1e3:.3g}k" if abs(v) >= 1e3 else f"{v:.3g}"


def curve_svg(title: str, curves: dict[str, list[dict]], width: int = 640, height: int = 320) -> str:
    ml, mr, mt, mb = 60, 130, 28, 36
    pw, ph = width - ml - mr, height - mt - mb
    pts = [p for c in curves.values() for p in c]
    body = [f'<text x="{ml}" y="18" font-weight="bold">{escape(title)}</text>']
    if not pts:
        return _svg(width, height, body + [f'<text x="{ml}" y="{mt + 20}">no scorings</text>'])
    x0, x1 = 0, max(p["tokens"] for p in pts) or 1
    y0, y1 = min(p["min"] for p in pts), max(p["max"] for p in pts)
    if y1 <= y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    X = lambda x: ml + (x - x0) / (x1 - x0) * pw  # noqa: E731
    Y = lambda y: mt + ph - (y - y0) / (y1 - y0) * ph  # noqa: E731
    body += [
        f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
        f'<text x="{ml - 4}" y="{Y(y1) + 4:.1f}" text-anchor="end">{_num(y1)}</text>',
        f'<text x="{ml - 4}" y="{Y(y0) + 4:.1f}" text-anchor="end">{_num(y0)}</text>',
        f'<text x="{ml}" y="{mt + ph + 14}">0</text>',
        f'<text x="{ml + pw}" y="{mt + ph + 14}" text-anchor="end">{_num(x1)}</text>',
        f'<text x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle">tokens</text>',
    ]
    for k, (name, c) in enumerate(curves.items()):
        color = COLORS[k % len(COLORS)]
        if not c:
            continue
        band = [(X(p["tokens"]), Y(p["max"])) for p in c] + [(X(p["tokens"]), Y(p["min"])) for p in reversed(c)]
        body.append(
            f'<polygon fill="{color}" fill-opacity="0.18" stroke="none"'
            f' points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in band)}"/>'
        )
        line = " ".join(f"{X(p['tokens']):.1f},{Y(p['mean']):.1f}" for p in c)
        body.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{line}"/>')
        body += [f'<circle cx="{X(p["tokens"]):.1f}" cy="{Y(p["mean"]):.1f}" r="2.5" fill="{color}"/>' for p in c]
        body.append(f'<text x="{ml + pw + 8}" y="{mt + 14 + 16 * k}" fill="{color}">{escape(name)}</text>')
    return _svg(width, height, body)


def differences_svg(results: dict, width: int = 640) -> str:
    """Each variant's final difference from the baseline per task, with its 95% interval."""
    rows = []
    for kind in ("tasks", "corpora"):
        for task, entry in results[kind].items():
            for name, c in entry["vs_baseline"].items():
                if "diff" in c:
                    rows.append((f"{task} ({entry['metric']}): {name}", c["diff"], c.get("ci95"), c["verdict"]))
    ml, mr, mt, row = 260, 130, 30, 22
    height = mt + row * max(len(rows), 1) + 20
    pw = width - ml - mr
    body = [
        f'<text x="8" y="18" font-weight="bold">'
        f"{escape('difference from ' + results['baseline'] + ', 95% interval')}</text>"
    ]
    if not rows:
        return _svg(width, height, body + [f'<text x="8" y="{mt + 14}">no comparison</text>'])
    lim = max(max(abs(r[1]), *(abs(v) for v in (r[2] or [0]))) for r in rows) or 1
    X = lambda v: ml + (v + lim) / (2 * lim) * pw  # noqa: E731
    body.append(f'<line x1="{X(0):.1f}" y1="{mt - 6}" x2="{X(0):.1f}" y2="{mt + row * len(rows)}" stroke="#999"/>')
    for i, (label, diff, ci, verdict) in enumerate(rows):
        y = mt + i * row + row / 2
        color = "#2e9e5b" if verdict.startswith("better") else "#c0392b" if verdict.startswith("worse") else "#7f8c8d"
        body.append(f'<text x="{ml - 8}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
        if ci:
            body.append(
                f'<line x1="{X(ci[0]):.1f}" y1="{y:.1f}" x2="{X(ci[1]):.1f}" y2="{y:.1f}"'
                f' stroke="{color}" stroke-width="2"/>'
            )
        body.append(f'<circle cx="{X(diff):.1f}" cy="{y:.1f}" r="4" fill="{color}"/>')
        body.append(
            f'<text x="{ml + pw + 8}" y="{y + 4:.1f}" fill="{color}">{escape(_plain(verdict).split(" (")[0])}</text>'
        )
    return _svg(width, height, body)
