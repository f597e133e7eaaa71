"""Score run configs against the judged pages of the shared sample (docs/judgments/sample.tsv).

    python docs/judgments/score.py CONFIG [CONFIG ...] [--set KEY=VALUE ...] [--json OUT] [--list]

Each CONFIG is run on the sample as `pipeline run` runs it (its filters and dedup, in a temporary
run directory; its `tokenize` step and `train:` section left out: they decide nothing), and the
documents it writes are compared with the verdicts people gave the pages, page by page:

* scope `en`: the pages langid labels `en` (score >= 0.5); scope `non-en`: every other label;
* a page the run writes and a reader would keep is a true positive, one a reader would drop a
  false positive, one it does not write that a reader would keep a false negative;
* precision = TP / (TP + FP), recall = TP / (TP + FN); the same over the pages judged `sure`,
  per language, per WET file and per half of the sample (halves by a hash of the page's host,
  so that pages of one site fall in one half).

`--list` prints every false positive and false negative with the step and reason that decided
it (from the run's dropped-document samples, written for every dropped page here). Run from the
repository root with `PYTHONPATH=src` (the configs' model paths are relative to it).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import yaml

HERE = Path(__file__).resolve().parent
JUDGMENTS = HERE / "sample.tsv"


def load_judgments(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f, delimiter="\t")}


def half(url: str) -> str:
    host = urlsplit(url).hostname or url
    return "A" if int(hashlib.sha1(host.encode()).hexdigest(), 16) % 2 == 0 else "B"


def run_config(config: Path, overrides: list[str], workdir: Path) -> tuple[set[str], dict[str, str]]:
    """The ids of the documents the config writes, and the decisive `step: reason` of every
    document it drops (its dropped samples, at rate 1)."""
    data = yaml.safe_load(config.read_text())
    data["steps"] = [s for s in data["steps"] if not (isinstance(s, dict) and "tokenize" in s) and s != "tokenize"]
    data.pop("train", None)
    data.pop("tokenize", None)
    run_dir = workdir / config.stem
    data["run_dir"] = str(run_dir)
    data.setdefault("output", {})["dropped_sample"] = 1.0
    cfg = workdir / f"{config.stem}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "gristmill.cli", "run", str(cfg), "--force"]
    for o in overrides:
        cmd += ["--set", o]
    # a failed task is finished by running the same command again (what a user does)
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(cmd[:-1], check=True, stdout=subprocess.DEVNULL)
    stages = sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / "output").is_dir())
    kept = {
        i
        for f in sorted((stages[-1] / "output").rglob("*.parquet"))
        for i in pq.read_table(f, columns=["id"])["id"].to_pylist()
    }
    reasons = {}
    for f in sorted(run_dir.glob("*/dropped/*/**/*.parquet")):
        step = f.relative_to(run_dir).parts[2]
        table = pq.read_table(f)
        cols = table.column_names
        for i, r in zip(
            table["id"].to_pylist(), table["drop_reason"].to_pylist() if "drop_reason" in cols else [None] * len(table)
        ):
            reasons.setdefault(i, f"{step}: {r}" if r else step)
    return kept, reasons


def confusion(rows: list[dict], kept: set[str]) -> dict:
    tp = sum(r["verdict"] == "keep" and r["id"] in kept for r in rows)
    fp = sum(r["verdict"] == "drop" and r["id"] in kept for r in rows)
    fn = sum(r["verdict"] == "keep" and r["id"] not in kept for r in rows)
    tn = len(rows) - tp - fp - fn
    return {
        "pages": len(rows),
        "keep": tp + fn,
        "kept": tp + fp,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": round(tp / (tp + fp), 3) if tp + fp else None,
        "recall": round(tp / (tp + fn), 3) if tp + fn else None,
    }


def score(judged: dict[str, dict], kept: set[str]) -> dict:
    out = {}
    for scope, inside in (("en", lambda r: r["language"] == "en"), ("non-en", lambda r: r["language"] != "en")):
        rows = [r for r in judged.values() if inside(r)]
        groups = defaultdict(list)
        for r in rows:
            groups[f"language {r['language']}"].append(r)
            groups[f"file {r['wet_file'][:25]}"].append(r)
            groups[f"half {half(r['url'])}"].append(r)
        out[scope] = {
            "all": confusion(rows, kept),
            "sure": confusion([r for r in rows if r["confidence"] == "sure"], kept),
            **{k: confusion(v, kept) for k, v in sorted(groups.items())},
        }
    return out


def fmt(c: dict) -> str:
    p = "-" if c["precision"] is None else f"{c['precision']:.2f}"
    r = "-" if c["recall"] is None else f"{c['recall']:.2f}"
    return f"kept {c['kept']:3d} of {c['pages']:3d}  TP {c['tp']:3d}  FP {c['fp']:3d}  FN {c['fn']:3d}  P {p}  R {r}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", type=Path)
    ap.add_argument("--set", action="append", default=[], dest="overrides", help="passed to every run")
    ap.add_argument("--judgments", type=Path, default=JUDGMENTS)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--list", action="store_true", help="print each false positive and false negative")
    args = ap.parse_args()
    judged = load_judgments(args.judgments)
    results = {}
    with tempfile.TemporaryDirectory(prefix="judgments-") as tmp:
        for config in args.configs:
            kept, reasons = run_config(config, args.overrides, Path(tmp))
            results[str(config)] = res = score(judged, kept)
            print(f"== {config}")
            for scope, groups in res.items():
                for name, c in groups.items():
                    if c["pages"] and (name in ("all", "sure") or c["keep"] or c["kept"]):
                        print(f"  {scope:6s} {name:32s} {fmt(c)}")
            if args.list:
                for r in judged.values():
                    inside = r["id"] in kept
                    if (r["verdict"] == "keep") != inside:
                        why = "kept" if inside else reasons.get(r["id"], "?")
                        kind = "FP" if inside else "FN"
                        print(f"  {kind} {r['language']} {r['confidence']:6s} {r['url'][:70]}  [{why}] {r['reason']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
