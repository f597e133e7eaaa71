"""The scale run: the pipeline on generated Common Crawl of growing size, cost measured per stage.

    PYTHONPATH=src python benchmarks/scale_run.py [--sizes 0.25 1 4] [--tasks 8] [--workers 2]
        [--work /tmp/gristmill-scale] [--seed 1] [--configs crawl permissive] [--invariance]
        [--write-docs] [--write-calibration] [--smoke]

For each size (GB of compressed WET) it generates a corpus with `make_wet_corpus.py` (kept in
`--work` and reused), then runs `pipeline run` (the real CLI, one process per task) with each
config: `configs/crawl.yaml` as shipped and `configs/scale-permissive.yaml`, which keeps every
language and has no quality filter, so that dedup and tokenization see the whole corpus. Per
stage it reads what the tasks recorded (`<stage>/usage/`: CPU seconds, peak RSS, start and end)
and the disk the stage wrote, and for the dedup stages the recall and precision on the pairs
the generator planted (`truth.jsonl`).

`--invariance` also runs the permissive config at the smallest size with 4 tasks and checks
that its final documents and token shards are those of the run with `--tasks`.
`--write-docs` replaces the table in `docs/scale.md`; `--write-calibration` writes the figures
`pipeline plan` projects from (`src/gristmill/pipeline/planning/scale_calibration.json`).

`--smoke`: one 2 MB corpus, the permissive config, one task, in /tmp/gristmill-scale-smoke unless
--work says otherwise (seconds to a minute; checks that the benchmark still runs, its figures mean
nothing, so it writes neither docs nor calibration).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gristmill.pipeline.execution.usage import stage_usage  # noqa: E402

CONFIGS = {"crawl": ROOT / "configs" / "crawl.yaml", "permissive": ROOT / "configs" / "scale-permissive.yaml"}
CALIBRATION = ROOT / "src" / "gristmill" / "pipeline" / "planning" / "scale_calibration.json"
DOC = ROOT / "docs" / "scale.md"
BEGIN, END = "<!-- scale-run:begin -->", "<!-- scale-run:end -->"
SMOKE_GB = 0.002  # the size of make_wet_corpus.py --smoke


def corpus(work: Path, gb: float, seed: int) -> Path:
    out = work / f"wet-{gb:g}"
    if not (out / "truth.jsonl").is_file():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "make_wet_corpus.py"),
                "--gb",
                str(gb),
                "--seed",
                str(seed),
                str(out),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
    return out


def run_pipeline(config: Path, wet: Path, run_dir: Path, tasks: int, workers: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "gristmill.cli",
        "run",
        str(config),
        "--run-dir",
        str(run_dir),
        "--set",
        "train=null",
        "--set",
        f"executor.tasks={tasks}",
        "--set",
        f"executor.workers={workers}",
        "--set",
        f"input.paths=[{json.dumps(str(wet / '*.warc.wet.gz'))}]",
    ]
    start = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return time.monotonic() - start


def run_wall(run_dir: Path) -> float:
    """First task's start to last task's end, over every stage (the command's own start-up aside)."""
    starts, ends = [], []
    for f in run_dir.glob("*/usage/task_*.json"):
        u = json.loads(f.read_text())
        starts.append(u["start"])
        ends.append(u["end"])
    return max(ends) - min(starts) if starts else 0.0


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def documents_in(stage_folder: Path) -> int | None:
    """Documents the stage's first step read (None for stages that read no documents)."""
    try:
        stats = json.loads((stage_folder / "stats.json").read_text())
    except (OSError, ValueError):
        return None
    c = stats[0]["counters"] if stats else {}
    return c.get("documents", c.get("total"))


def model_estimates(config: Path, wet: Path, tasks: int, workers: int) -> dict[str, float]:
    """The planner's per-task memory estimate of each stage (MB), for this input and task count."""
    from gristmill.config import load
    from gristmill.pipeline.planning.planner import estimate_memory
    from gristmill.pipeline.planning.projection import plan_for_size

    # the configs' paths (models/...) are relative to the repository, as for the runs (cwd=ROOT)
    with contextlib.chdir(ROOT):
        cfg = load(
            str(config),
            [
                "train=null",
                f"executor.tasks={tasks}",
                f"executor.workers={workers}",
                f"input.paths=[{json.dumps(str(wet / '*.warc.wet.gz'))}]",
            ],
            None,
        )
        stages, _ = plan_for_size(cfg, None, None)
    return {e.stage.label: round(e.bytes / 1e6, 1) for e in estimate_memory(cfg, stages)}


def stage_rows(run_dir: Path, input_gb: float, models: dict[str, float] | None = None) -> list[dict]:
    plan = json.loads((run_dir / "plan.json").read_text())
    rows = []
    for st in plan["stages"]:
        folder = run_dir / st["label"]
        u = stage_usage(folder)
        rows.append(
            {
                "model_mb": (models or {}).get(st["label"]),
                "stage": st["name"],
                "label": st["label"],
                "steps": st["steps"],
                "tasks": st["tasks"],
                "docs_in": documents_in(folder),
                "cpu_s": u and round(u.cpu_s, 2),
                "wall_s": u and round(u.wall_s, 2),
                "cpu_s_per_gb": u and round(u.cpu_s / input_gb, 2),
                "max_rss_mb": u and u.max_rss_mb,
                "disk_mb": round(disk_bytes(folder) / 1e6, 2),
            }
        )
    return rows


def _ids(folder: Path) -> set[str]:
    files = sorted(folder.rglob("*.parquet"))
    return {i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()}


def _stage_folder(run_dir: Path, name: str) -> Path | None:
    plan = json.loads((run_dir / "plan.json").read_text())
    for st in plan["stages"]:
        if st["name"] == name:
            return run_dir / st["label"]
    return None


def _input_of(run_dir: Path, first: Path) -> Path:
    """The documents a stage was given: the output of the last stage before it that wrote some."""
    labels = [st["label"] for st in json.loads((run_dir / "plan.json").read_text())["stages"]]
    return (
        run_dir / [lb for lb in labels[: labels.index(first.name)] if (run_dir / lb / "output").is_dir()][-1] / "output"
    )


def keys_by_id(run_dir: Path) -> dict[str, int]:
    """Document id -> order key ((source rank << 40) | offset, as near dedup keys documents)."""
    from gristmill.dedup.order import load_ranks

    sig = _stage_folder(run_dir, "near_dedup_signature")
    rank = load_ranks(sig)[1]
    out = {}
    for f in sorted(_input_of(run_dir, sig).rglob("*.parquet")):
        t = pq.read_table(f, columns=["id", "source", "offset"]).to_pydict()
        out.update({i: (rank[s or ""] << 40) | int(o) for i, s, o in zip(t["id"], t["source"], t["offset"])})
    return out


def shingles_by_key(run_dir: Path, keys: set[int]) -> dict:
    """Order key -> shingle set of the documents near dedup was given, as the stage makes them
    (words by the document's language)."""
    from gristmill.dedup.order import load_ranks
    from gristmill.dedup.text import shingles

    sig = _stage_folder(run_dir, "near_dedup_signature")
    rank = load_ranks(sig)[1]
    out = {}
    for f in sorted(_input_of(run_dir, sig).rglob("*.parquet")):
        t = pq.read_table(f, columns=["source", "offset", "text", "language"]).to_pydict()
        for s, o, x, lang in zip(t["source"], t["offset"], t["text"], t["language"]):
            k = (rank[s or ""] << 40) | int(o)
            if k in keys:
                out[k] = shingles(x, language=lang)
    return out


def jaccard_to_kept(sh: dict, root: dict[int, int], keys) -> list[float]:
    """Shingle Jaccard of each document (order key) with root[key], the one kept in its place."""
    from gristmill.dedup.text import jaccard

    return [jaccard(sh[k], sh[root[k]]) for k in keys if k in sh and root[k] in sh]


def cluster_roots(run_dir: Path) -> dict[int, int] | None:
    """Order key -> the kept document it was removed for (itself when kept), from the cluster stage."""
    from gristmill.dedup.cluster import read_clusters

    stage = _stage_folder(run_dir, "near_dedup_cluster")
    if stage is None:
        return None
    nodes, roots = read_clusters(stage)
    return dict(zip(nodes.tolist(), roots.tolist()))


def dedup_quality(run_dir: Path, truth: list[dict], accidental: bool = False) -> dict:
    """Recall and precision of each dedup on the planted pairs among the documents it was given.

    Recall: of the planted pairs with both documents in the dedup's input, the share of which
    it removed one. Precision: of the documents it removed, the share that belong to a planted
    pair (the generated corpus has no other duplicates at these thresholds: docs/scale.md).
    """
    out = {}
    members = {r["original"] for r in truth} | {r["copy"] for r in truth}
    for dedup, kind, min_j in (("exact_dedup", "exact", 1.0), ("near_dedup", "near", 0.85)):
        first = _stage_folder(run_dir, f"{dedup}_hash" if dedup == "exact_dedup" else f"{dedup}_signature")
        last = _stage_folder(run_dir, f"{dedup}_filter")
        if first is None or last is None:
            continue
        given, kept = _ids(_input_of(run_dir, first)), _ids(last / "output")
        removed = given - kept
        pairs = [
            r
            for r in truth
            if r["kind"] == kind and r["jaccard"] >= min_j and r["original"] in given and r["copy"] in given
        ]
        found = sum(r["original"] in removed or r["copy"] in removed for r in pairs)
        out[dedup] = {
            "pairs": len(pairs),
            "recall": round(found / len(pairs), 4) if pairs else None,
            "removed": len(removed),
            "precision": round(len(removed & members) / len(removed), 4) if removed else None,
        }
        if accidental:
            out[dedup]["outside_planted"] = _accidental(run_dir, removed - members, dedup)
            if dedup == "near_dedup":
                out[dedup]["on_text"] = near_precision(run_dir)
    # Both dedups together: paragraph-level exact dedup (crawl.yaml) removes the lines a near copy
    # shares with its original, so near dedup alone misses pairs the first already broke up.
    first, last = _stage_folder(run_dir, "exact_dedup_hash"), _stage_folder(run_dir, "near_dedup_filter")
    if first is not None and last is not None and len(out) == 2:
        given, kept = _ids(_input_of(run_dir, first)), _ids(last / "output")
        removed = given - kept
        pairs = [r for r in truth if r["jaccard"] >= 0.85 and r["original"] in given and r["copy"] in given]
        found = sum(r["original"] in removed or r["copy"] in removed for r in pairs)
        out["both"] = {
            "pairs": len(pairs),
            "recall": round(found / len(pairs), 4) if pairs else None,
            "removed": len(removed),
            "precision": round(len(removed & members) / len(removed), 4) if removed else None,
        }
    return out


def _accidental(run_dir: Path, removed_outside: set[str], dedup: str) -> dict:
    """The removed documents outside the planted pairs, checked against the text they were
    removed for: exact dedup's must be identical to an earlier kept document; near dedup's are
    compared (shingle Jaccard) with the document kept in their place. High values mean the
    generator made these duplicates by accident (short pages drawing the same lines), so the
    precision on planted pairs understates the dedup's."""
    if not removed_outside:
        return {"checked": 0}
    if dedup == "near_dedup":
        root, key_of = cluster_roots(run_dir), keys_by_id(run_dir)
        keys = [key_of[i] for i in removed_outside if key_of.get(i) in root]
        js = sorted(jaccard_to_kept(shingles_by_key(run_dir, set(keys) | {root[k] for k in keys}), root, keys))
        return {
            "checked": len(js),
            "jaccard_min": round(js[0], 3) if js else None,
            "jaccard_median": round(js[len(js) // 2], 3) if js else None,
            "at_least_0.8": sum(j >= 0.8 for j in js),
        }
    # exact: some kept document has the same normalised text, which is what exact dedup compares
    # (hashes: the kept texts do not fit in memory at scale)
    import xxhash

    from gristmill.dedup.text import normalize

    digest = lambda x: xxhash.xxh3_128_intdigest(normalize(x).encode())  # noqa: E731
    kept, removed = set(), []
    for f in sorted(_input_of(run_dir, _stage_folder(run_dir, f"{dedup}_hash")).rglob("*.parquet")):
        t = pq.read_table(f, columns=["id", "text"]).to_pydict()
        for i, x in zip(t["id"], t["text"]):
            (removed.append(digest(x)) if i in removed_outside else kept.add(digest(x)))
    return {"checked": len(removed_outside), "identical_to_a_kept_document": sum(d in kept for d in removed)}


def near_precision(run_dir: Path, sample: int = 20000, seed: int = 0) -> dict | None:
    """Precision of near dedup checked on the text, not on the truth file: for a random sample of
    the documents it removed, the shingle Jaccard with the document kept in their place (under
    `removal: components`, a chain's end can be removed for a kept document it is not close to)."""
    import random

    import numpy as np

    root = cluster_roots(run_dir)
    removed = sorted(k for k, r in (root or {}).items() if k != r)
    if not removed:
        return None
    chosen = random.Random(seed).sample(removed, min(sample, len(removed)))
    js = np.array(jaccard_to_kept(shingles_by_key(run_dir, set(chosen) | {root[k] for k in chosen}), root, chosen))
    return {
        "removed": len(removed),
        "checked": len(js),
        **{f"at_least_{t}": round(float((js >= t).mean()), 4) for t in (0.8, 0.7, 0.5)},
        "jaccard_min": round(float(js.min()), 3),
    }


def _digest(run_dir: Path) -> dict:
    """What a run produced, independent of how many files it was written in: its final documents
    as a sorted list of (id, text hash), and every token shard file byte for byte."""
    final = _stage_folder(run_dir, "near_dedup_filter")
    docs = []
    for f in sorted((final / "output").rglob("*.parquet")):
        t = pq.read_table(f, columns=["id", "text"]).to_pydict()
        docs += [(i, hashlib.sha256(x.encode()).hexdigest()) for i, x in zip(t["id"], t["text"])]
    tokens = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted((run_dir / "tokens").glob("*"))
        if f.is_file()
    }
    return {
        "documents": hashlib.sha256(json.dumps(sorted(docs)).encode()).hexdigest(),
        "n_documents": len(docs),
        "tokens": tokens,
    }


def _dedup_lines(dedup: dict) -> list[str]:
    names = {
        "exact_dedup": "exact dedup",
        "near_dedup": "near dedup (pairs J >= 0.85)",
        "both": "both dedups together (pairs J >= 0.85)",
    }
    out = []
    for k, v in dedup.items():
        if k not in names or not v.get("pairs"):
            continue
        line = (
            f"{names[k]}: recall {v['recall']:.4f} on {v['pairs']:,} planted pairs in its input; "
            f"removed {v['removed']:,}, {v['precision']:.1%} of them in a planted pair"
        )
        o = v.get("outside_planted") or {}
        if "identical_to_a_kept_document" in o:
            line += (
                f"; the other {o['checked']:,}: {o['identical_to_a_kept_document']:,} have the normalised "
                f"text of a kept document (accidental exact copies)"
            )
        elif o.get("checked"):
            line += (
                f"; the other {o['checked']:,}: {o['at_least_0.8']:,} have Jaccard >= 0.8 with their "
                f"cluster's kept document (median {o['jaccard_median']}, min {o['jaccard_min']})"
            )
        t = v.get("on_text")
        if t:
            line += (
                f". Checked on the text ({t['checked']:,} removed documents drawn at random): "
                f"Jaccard with their cluster's kept document >= 0.8 for {t['at_least_0.8']:.1%}, "
                f">= 0.5 for {t['at_least_0.5']:.1%} (min {t['jaccard_min']})"
            )
        out.append(line)
    return out


def markdown(results: dict) -> str:
    lines = []
    for cfg, runs in results["runs"].items():
        sizes = sorted(runs, key=float)
        lines += [
            f"#### `{CONFIGS[cfg].relative_to(ROOT)}` ({results['tasks']} tasks, {results['workers']} workers)",
            "",
        ]
        head = "| stage | " + " | ".join(
            f"{s} GB: docs in · wall s · CPU s · CPU s/GB · peak RSS MB (model) · disk MB" for s in sizes
        )
        lines += [head + " | CPU s/GB ratio | RSS ratio |", "|---|" + "---|" * (len(sizes) + 2)]
        by_stage = {}
        for s in sizes:
            for row in runs[s]["stages"]:
                by_stage.setdefault(row["label"], {})[s] = row
        for label, per in by_stage.items():
            cells = []
            for s in sizes:
                r = per.get(s)
                cells.append(
                    "—"
                    if r is None
                    else f"{r['docs_in'] if r['docs_in'] is not None else '—'} · {r['wall_s']} · {r['cpu_s']} · "
                    f"{r['cpu_s_per_gb']} · {r['max_rss_mb']} ({r.get('model_mb')}) · {r['disk_mb']}"
                )
            lo, hi = per.get(sizes[0]), per.get(sizes[-1])
            cr = f"{hi['cpu_s_per_gb'] / lo['cpu_s_per_gb']:.2f}" if lo and hi and lo["cpu_s_per_gb"] else "—"
            rr = f"{hi['max_rss_mb'] / lo['max_rss_mb']:.2f}" if lo and hi and lo["max_rss_mb"] else "—"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {cr} | {rr} |")
        lines.append("")
        for s in sizes:
            r = runs[s]
            lines.append(
                f"- {s} GB ({r['input_gb']:.3f} GB read, {r['documents']:,} documents): "
                f"{r['wall_s']:.0f} s wall for the command."
            )
            lines += [f"  - {line}" for line in _dedup_lines(r["dedup"])]
        lines.append("")
    for cfg, pc in results.get("projection", {}).items():
        worst = max(pc["stages"], key=lambda r: abs(r["cpu_error"]), default=None)
        lines.append(
            f"Projection check ({cfg}): `pipeline plan` fitted on {', '.join(f'{g:g}' for g in pc['fitted_on'])} GB "
            f"projects {pc['total_cpu_projected']:.0f} CPU s for {pc['target_gb']} GB; measured "
            f"{pc['total_cpu_measured']:.0f} ({pc['total_cpu_error']:+.1%}). Largest stage error: "
            + (f"{worst['stage']} {worst['cpu_error']:+.1%} CPU" if worst else "—")
            + "; memory model vs measured peak: "
            + ", ".join(f"{r['stage']} {r['rss_error']:+.0%}" for r in pc["stages"])
            + "."
        )
        lines.append("")
    if "invariance" in results:
        inv = results["invariance"]
        lines.append(
            f"Invariance ({inv['size']} GB, permissive): {inv['tasks_a']} vs {inv['tasks_b']} tasks: final "
            f"documents {'identical' if inv['documents_equal'] else 'DIFFERENT'} ({inv['n_documents']:,}), "
            f"token shards {'byte-identical' if inv['tokens_equal'] else 'DIFFERENT'} "
            f"({inv['token_files']} files)."
        )
        lines.append("")
    return "\n".join(lines)


def calibration(results: dict) -> dict:
    """Per config and stage, the measured points `pipeline plan` fits its projection to."""
    out = {"measured": results["date"], "machine": results["machine"], "configs": {}}
    for cfg, runs in results["runs"].items():
        stages = {}
        for s, r in runs.items():
            for row in r["stages"]:
                stages.setdefault(row["stage"], {"steps": row["steps"], "points": []})["points"].append(
                    {
                        "nominal_gb": float(s),
                        "input_gb": r["input_gb"],
                        "documents": r["documents"],
                        "tasks": row["tasks"],
                        "docs_in": row["docs_in"],
                        "cpu_s": row["cpu_s"],
                        "max_rss_mb": row["max_rss_mb"],
                        "disk_mb": row["disk_mb"],
                    }
                )
        out["configs"][cfg] = {"config": str(CONFIGS[cfg].relative_to(ROOT)), "stages": stages}
    return out


def projection_check(results: dict, work: Path, tasks: int, workers: int) -> dict:
    """`pipeline plan`'s projection for the largest size, fitted to the smaller sizes only, against
    what the largest run measured: per stage and in total (CPU seconds, peak RSS)."""
    from gristmill.config import load
    from gristmill.pipeline.planning.projection import plan_for_size, project

    out = {}
    cal = calibration(results)
    for cfg_name, runs in results["runs"].items():
        sizes = sorted(runs, key=float)
        if len(sizes) < 3:
            continue
        target, fit_on = sizes[-1], {float(s) for s in sizes[:-1]}
        wet = work / f"wet-{float(target):g}"
        with contextlib.chdir(ROOT):  # as in model_estimates
            cfg = load(
                str(CONFIGS[cfg_name]),
                [
                    "train=null",
                    f"executor.tasks={tasks}",
                    f"executor.workers={workers}",
                    f"input.paths=[{json.dumps(str(wet / '*.warc.wet.gz'))}]",
                ],
                None,
            )
            stages, size = plan_for_size(cfg, None, None)
        proj = {p.stage.label: p for p in project(cfg, stages, size / 1e9, cal, workers, prefer=cfg_name, sizes=fit_on)}
        rows = []
        for m in runs[target]["stages"]:
            p = proj.get(m["label"])
            if p is None or p.cpu_s is None or not m["cpu_s"]:
                continue
            model = p.estimate_bytes / 1e6
            rows.append(
                {
                    "stage": m["label"],
                    "cpu_projected": round(p.cpu_s, 1),
                    "cpu_measured": m["cpu_s"],
                    "cpu_error": round(p.cpu_s / m["cpu_s"] - 1, 3),
                    "memory_model_mb": round(model, 1),
                    "rss_measured": m["max_rss_mb"],
                    "rss_error": round(model / m["max_rss_mb"] - 1, 3),
                }
            )
        tp, tm = sum(r["cpu_projected"] for r in rows), sum(r["cpu_measured"] for r in rows)
        out[cfg_name] = {
            "target_gb": target,
            "fitted_on": sorted(fit_on),
            "stages": rows,
            "total_cpu_projected": round(tp, 1),
            "total_cpu_measured": round(tm, 1),
            "total_cpu_error": round(tp / tm - 1, 3) if tm else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.25, 1, 4])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, help="corpora, runs and results.json (default: /tmp/gristmill-scale)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["crawl", "permissive"])
    ap.add_argument("--invariance", action="store_true")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--write-calibration", action="store_true")
    ap.add_argument("--results", type=Path, help="JSON results file (default: WORK/results.json); merged into")
    ap.add_argument("--report-only", action="store_true", help="run nothing: re-read the run directories in WORK")
    ap.add_argument("--smoke", action="store_true", help="one 2 MB corpus, permissive, one task: checks that it runs")
    args = ap.parse_args()
    if args.smoke:
        if args.write_docs or args.write_calibration:
            ap.error("--smoke figures mean nothing: not with --write-docs or --write-calibration")
        args.sizes, args.tasks, args.workers, args.configs = [SMOKE_GB], 1, 1, ["permissive"]
    # smoke results are kept apart: results.json is merged into, and feeds docs and calibration
    args.work = (args.work or Path("/tmp/gristmill-scale-smoke" if args.smoke else "/tmp/gristmill-scale")).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    results_path = args.results or args.work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"runs": {}}
    if not args.report_only:
        results.update(
            tasks=args.tasks,
            workers=args.workers,
            date=time.strftime("%Y-%m-%d"),
            machine=f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
        )
    for gb in args.sizes:
        wet = corpus(args.work, gb, args.seed)
        input_gb = sum(f.stat().st_size for f in wet.glob("*.warc.wet.gz")) / 1e9
        truth = [json.loads(x) for x in (wet / "truth.jsonl").read_text().splitlines()]
        for cfg in args.configs:
            run_dir = args.work / f"run-{cfg}-{gb:g}-t{args.tasks}"
            print(f"== {cfg} on {gb:g} GB ({input_gb:.3f} GB) with {args.tasks} tasks -> {run_dir}", flush=True)
            if args.report_only:
                if not (run_dir / "tokens" / "manifest.json").is_file():
                    continue  # not run (or not finished)
                wall = results["runs"].get(cfg, {}).get(f"{gb:g}", {}).get("wall_s") or run_wall(run_dir)
            else:
                wall = run_pipeline(CONFIGS[cfg], wet, run_dir, args.tasks, args.workers)
            stages = stage_rows(run_dir, input_gb, model_estimates(CONFIGS[cfg], wet, args.tasks, args.workers))
            documents = stages[0]["docs_in"] or 0
            results["runs"].setdefault(cfg, {})[f"{gb:g}"] = {
                "input_gb": input_gb,
                "documents": documents,
                "wall_s": wall,
                "stages": stages,
                "dedup": dedup_quality(run_dir, truth, accidental=cfg == "permissive"),
            }
            results_path.write_text(json.dumps(results, indent=1))
    if args.invariance:
        gb = min(args.sizes)
        wet = corpus(args.work, gb, args.seed)
        digests = []
        for tasks in (4, args.tasks):
            run_dir = args.work / f"run-permissive-{gb:g}-t{tasks}"
            if not (run_dir / "tokens" / "manifest.json").is_file():
                run_pipeline(CONFIGS["permissive"], wet, run_dir, tasks, args.workers)
            digests.append(_digest(run_dir))
        results["invariance"] = {
            "size": gb,
            "tasks_a": 4,
            "tasks_b": args.tasks,
            "documents_equal": digests[0]["documents"] == digests[1]["documents"],
            "n_documents": digests[0]["n_documents"],
            "tokens_equal": digests[0]["tokens"] == digests[1]["tokens"],
            "token_files": len(digests[0]["tokens"]),
        }
        results_path.write_text(json.dumps(results, indent=1))
    if len(args.sizes) >= 3 or any(len(r) >= 3 for r in results["runs"].values()):
        results["projection"] = projection_check(results, args.work, args.tasks, args.workers)
        results_path.write_text(json.dumps(results, indent=1))
    text = markdown(results)
    print(text)
    if args.write_docs:
        doc = DOC.read_text()
        if BEGIN in doc:
            doc = doc[: doc.index(BEGIN) + len(BEGIN)] + "\n" + text + "\n" + doc[doc.index(END) :]
        else:
            doc += f"\n{BEGIN}\n{text}\n{END}\n"
        DOC.write_text(doc)
    if args.write_calibration:
        # the unit costs other benchmarks measured (`cluster`, `single_task`) are kept
        kept = {k: v for k, v in json.loads(CALIBRATION.read_text()).items() if k in ("cluster", "single_task")}
        CALIBRATION.write_text(json.dumps(calibration(results) | kept, indent=1) + "\n")
        print(f"calibration written to {CALIBRATION}")


if __name__ == "__main__":
    main()
