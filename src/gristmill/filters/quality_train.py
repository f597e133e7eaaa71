"""`pipeline quality train`: a fastText high-quality/low-quality classifier, as DCLM trains one.

Positives are reference text (text files, a paragraph per line; or a run's Parquet documents),
negatives are crawl documents (WET files or a run's output). Both are exact-deduplicated by the
hash of their CCNet-normalised text (a text in both classes is dropped from the negatives),
balanced by a seeded hash order (independent of input order), and split into training and
held-out parts by hash. Training is fastText `train_supervised`, deterministic for a fixed
`seed` and `thread` count (one thread by default: fastText's Hogwild threads race otherwise).

Writes the model, `<model>.report.json` and `<model>.report.txt`: held-out precision, recall,
F1 at `threshold`, ROC AUC, and score histograms of both classes.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

from gristmill.core.files import temporary_path
from gristmill.filters import fasttext_native
from gristmill.filters.quality import prepare
from gristmill.filters.train_corpus import is_heldout, iter_documents, text_hash

HQ, LQ = "__label__hq", "__label__lq"


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve, rank-based (Mann-Whitney U), ties counted half."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    if not len(pos) or not len(neg):
        return float("nan")
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks (1-based) over runs of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def binary_metrics(pos: np.ndarray, neg: np.ndarray, threshold: float) -> dict:
    tp = int((pos >= threshold).sum())
    fn = len(pos) - tp
    fp = int((neg >= threshold).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "threshold": threshold,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": len(neg) - fp,
    }


def _collect(paths, detokenize: str, min_words: int) -> dict[int, str]:
    """Distinct documents of at least `min_words` words, keyed by normalised-text hash, first kept."""
    out: dict[int, str] = {}
    for text in iter_documents(paths, detokenize):
        if len(text.split()) < min_words:
            continue
        out.setdefault(text_hash(text), text)
    return out


def _seeded_order(keys, seed: int) -> list[int]:
    return sorted(keys, key=lambda h: xxhash.xxh3_64_intdigest(h.to_bytes(8, "little"), seed=seed + 1))


def fasttext_params(
    seed: int, thread: int, epoch: int, lr: float, dim: int, word_ngrams: int, min_count: int, bucket: int
) -> dict:
    """fastText's training parameters as the reports record them (`fit` takes them so)."""
    return {
        "seed": seed,
        "thread": thread,
        "epoch": epoch,
        "lr": lr,
        "dim": dim,
        "wordNgrams": word_ngrams,
        "minCount": min_count,
        "bucket": bucket,
    }


def fit(examples: list[tuple[str, str]], output: Path, params: dict) -> Path:
    """fastText `train_supervised` on (label, text) examples; the model saved beside `output`
    under a temporary name (returned; `publish` renames it). The examples are put in a seeded,
    input-order-independent order first: fastText's SGD sees them in file order."""
    import fasttext

    seed = params["seed"]
    examples = sorted(examples, key=lambda lt: xxhash.xxh3_64_intdigest(lt[1].encode("utf-8"), seed=seed + 2))
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quality-train-", dir=output.parent) as tmp:
        train_file = Path(tmp) / "train.txt"
        train_file.write_text("".join(f"{label} {prepare(t)}\n" for label, t in examples), encoding="utf-8")
        model = fasttext.train_supervised(input=str(train_file), verbose=0, **params)
    tmp_model = temporary_path(output)  # two trainings of one output: each renames its own file
    model.save_model(str(tmp_model))
    return tmp_model


def publish(output: Path, tmp_model: Path, report: dict, text: str, sidecars: dict[str, Path] | None = None) -> None:
    """`<output>.report.json`, `.report.txt` and each finished sidecar file (suffix: its
    temporary path) put in place, then the model renamed to `output`: a model file present
    means its reports are too."""
    Path(f"{output}.report.json").write_text(json.dumps(report, indent=2) + "\n")
    Path(f"{output}.report.txt").write_text(text)
    for suffix, tmp in (sidecars or {}).items():
        os.replace(tmp, f"{output}{suffix}")
    os.replace(tmp_model, output)


def train(
    positives: list[str],
    negatives: list[str],
    output: str | Path,
    detokenize: str = "none",
    min_words: int = 20,
    max_per_class: int | None = None,
    heldout: float = 0.2,
    threshold: float = 0.5,
    seed: int = 0,
    thread: int = 1,
    epoch: int = 10,
    lr: float = 0.2,
    dim: int = 64,
    word_ngrams: int = 2,
    min_count: int = 2,
    bucket: int = 100_000,
    log=print,
) -> dict:
    t0 = time.perf_counter()
    pos = _collect(positives, detokenize, min_words)
    neg = _collect(negatives, "none", min_words)
    both = pos.keys() & neg.keys()
    for h in both:
        del neg[h]
    output = Path(output)
    n = min(len(pos), len(neg), max_per_class or 1 << 62)
    if n < 10:
        raise ValueError(
            f"too few documents to train on: {len(pos)} positives, {len(neg)} negatives "
            f"of >= {min_words} words after dedup"
        )
    chosen = {HQ: [pos[h] for h in _seeded_order(pos, seed)[:n]], LQ: [neg[h] for h in _seeded_order(neg, seed)[:n]]}
    split = {"train": [], "heldout": []}
    for label, texts in chosen.items():
        for t in texts:
            split["heldout" if is_heldout(t, heldout, seed) else "train"].append((label, t))
    log(
        f"documents: {len(pos):,} positives, {len(neg):,} negatives distinct (>= {min_words} words; "
        f"{len(both)} in both dropped from negatives); {n:,} per class; "
        f"{len(split['train']):,} train, {len(split['heldout']):,} held out"
    )
    params = fasttext_params(seed, thread, epoch, lr, dim, word_ngrams, min_count, bucket)
    tmp_model = fit(split["train"], output, params)

    held = split["heldout"]
    # scored as the quality step scores: the saved file, through gristmill's predictor
    predictor = fasttext_native.Predictor(tmp_model)
    scores = np.array(predictor.label_scores([t for _, t in held], HQ)) if held else np.array([])
    is_pos = np.array([label == HQ for label, _ in held], dtype=bool)
    p_scores, n_scores = scores[is_pos], scores[~is_pos]
    bins = np.linspace(0, 1, 11)
    report = {
        "model": output.name,
        "labels": [HQ, LQ],
        "positives": [str(p) for p in positives],
        "negatives": [str(p) for p in negatives],
        "detokenize": detokenize,
        "min_words": min_words,
        "distinct": {"positives": len(pos), "negatives": len(neg), "in_both": len(both)},
        "per_class": n,
        "train_examples": len(split["train"]),
        "heldout": {"fraction": heldout, "positives": int(is_pos.sum()), "negatives": int((~is_pos).sum())},
        "params": params,
        "metrics": {**binary_metrics(p_scores, n_scores, threshold), "roc_auc": roc_auc(p_scores, n_scores)},
        "histogram": {
            "bins": bins.round(2).tolist(),
            "positives": np.histogram(p_scores, bins)[0].tolist(),
            "negatives": np.histogram(n_scores, bins)[0].tolist(),
        },
        "train_seconds": round(time.perf_counter() - t0, 1),
    }
    publish(output, tmp_model, report, _text_report(report))
    m = report["metrics"]
    log(
        f"wrote {output}: held-out ROC AUC {m['roc_auc']:.4f}, precision {m['precision']:.3f}, "
        f"recall {m['recall']:.3f}, F1 {m['f1']:.3f} at {threshold} ({report['train_seconds']} s)"
    )
    return report


def _text_report(r: dict) -> str:
    m, h = r["metrics"], r["histogram"]
    lines = [
        f"fastText quality classifier {r['model']} ({HQ} vs {LQ})",
        f"positives: {', '.join(r['positives'])} (detokenize: {r['detokenize']})",
        f"negatives: {', '.join(r['negatives'])}",
        f"{r['per_class']} documents per class (>= {r['min_words']} words, deduplicated); "
        f"{r['train_examples']} train, held out {r['heldout']['positives']} hq + {r['heldout']['negatives']} lq",
        f"held-out: ROC AUC {m['roc_auc']:.4f}; at score >= {m['threshold']}: precision {m['precision']:.3f}, "
        f"recall {m['recall']:.3f}, F1 {m['f1']:.3f} (tp {m['tp']}, fp {m['fp']}, fn {m['fn']}, tn {m['tn']})",
        "",
        f"{'P(hq) bin':<12} {'hq':>5} {'lq':>5}",
    ]
    for i, (a, b) in enumerate(zip(h["bins"], h["bins"][1:])):
        lines.append(f"{a:.1f}-{b:.1f}{'':<5} {h['positives'][i]:>5} {h['negatives'][i]:>5}")
    return "\n".join(lines) + "\n"


def cmd_quality_train(args, console) -> int:
    from gristmill.filters.train_cli import fasttext_params

    train(
        args.positives,
        args.negatives,
        args.output,
        detokenize=args.detokenize,
        min_words=args.min_words,
        max_per_class=args.max_per_class,
        heldout=args.heldout,
        threshold=args.threshold,
        seed=args.seed,
        **fasttext_params(args),
        log=console.print,
    )
    return 0
