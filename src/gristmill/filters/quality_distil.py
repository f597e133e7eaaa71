"""`pipeline quality distil`: the fastText `quality` classifier trained on a neural classifier's
decisions, as DCLM and Nemotron-CC make a classifier cheap enough to run on a whole snapshot.

The teacher is a model directory the `classifier` step loads (`pipeline train-classifier`'s
head on an encoder, or a `*ForSequenceClassification` model); it is validated first
(`check_classifier`), before any document is read. The pool is every document of the inputs
(WET files, WARC files' HTML responses, or a run's output Parquet: `train_corpus.iter_pages`) of
at least `min_words` words in the teacher's language: a Parquet row's `language` where the run
wrote one, else lid.176's top language at `min_language_score` or more (the `langid` step's
rule); exact duplicates (the hash of the CCNet-normalised text) are counted once, the first one
kept. The whole pool is held in memory (its text, once); `max_documents` caps it.

Labels are the teacher's own decisions: `keep` where its score (the probability of `label`, or
a regression's output) is at least `teacher_threshold`, scored in windows by the step's batched
scorer (`classifier_model.Scorer`: on a GPU where one is visible, else on the CPU). They become
`__label__hq` (keep) and `__label__lq` (drop), so the `quality` step loads the student with its
defaults. Pages are held out by the hash of their URL's host (pages of one site are never on
both sides), the hash `pipeline train-classifier` splits by: with the teacher's fraction and
seed the held-out hosts are the ones the teacher never trained on. The student is trained as
`pipeline quality train` trains (`quality_train.fit`: seeded, one thread by default: the same
bytes for the same inputs).

Writes the model, `<model>.report.json`, `<model>.report.txt` and `<model>.predictions.parquet`
(every pool document: id, url, split, the teacher's and the student's scores and decisions, its
judgment where `judgments` has one). The report holds the student's agreement with the teacher on
held-out pages (accuracy, Cohen's kappa, precision/recall/F1 of keep, the confusion matrix), the
teacher's and the student's agreement with the judgments on held-out pages the judgments cover,
and both models' throughput in documents per CPU second (per core) or, on a GPU, per second.
The model is renamed into place last: a model file present means its reports are too.

A previous run's predictions file (`teacher_scores`) supplies the teacher's scores of the
documents it has, if it was made by the same teacher files at the same `max_tokens`: the student
can be trained again (other fastText parameters, seed or threshold) without scoring the pool again.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from gristmill.core.files import temporary_path
from gristmill.filters import classifier_model as cm
from gristmill.filters import fasttext_native
from gristmill.filters.classifier_train import is_heldout, metrics, read_rows
from gristmill.filters.langid import LABEL_PREFIX, MAX_CHARS, sample_text
from gristmill.filters.model_check import ModelError, check_fasttext
from gristmill.filters.quality_train import HQ, LQ, fasttext_params, fit, publish
from gristmill.filters.train_corpus import Page, iter_pages, text_hash

KEEP, DROP = "keep", "drop"
PREDICTIONS = ".predictions.parquet"
#: documents the teacher scores together (sorted by length inside, as the step's window)
WINDOW = 2048
#: CPU seconds the student's throughput is measured over at least (passes over the pool)
STUDENT_TIMING_S = 0.5
#: seconds between the teacher's progress lines
PROGRESS_S = 60


def cohen_kappa(confusion) -> float | None:
    """Cohen's kappa of a square confusion matrix: agreement beyond what the two raters' label
    frequencies give by chance; None where chance agreement is total (one label on both sides)."""
    c = np.asarray(confusion, float)
    n = c.sum()
    if not n:
        return None
    observed = np.trace(c) / n
    chance = float((c.sum(0) * c.sum(1)).sum() / n**2)
    return None if chance >= 1.0 else float((observed - chance) / (1.0 - chance))


def agreement(truth: np.ndarray, pred: np.ndarray) -> dict:
    """How far `pred` agrees with `truth` (booleans: keep): accuracy, Cohen's kappa, precision,
    recall and F1 of keep (and of drop), the confusion matrix (rows: truth; drop, keep)."""
    m = metrics(np.asarray(truth, int), np.asarray(pred, int), [DROP, KEEP])
    return {
        "documents": len(truth),
        "accuracy": m["accuracy"] if len(truth) else None,
        "kappa": cohen_kappa(m["confusion"]),
        KEEP: m["per_class"][KEEP],
        DROP: m["per_class"][DROP],
        "confusion": m["confusion"],
        "labels": [DROP, KEEP],
    }


def split_key(page: Page) -> str:
    """What the held-out split hashes: the URL's host, or the text where there is no URL."""
    host = urlsplit(page.url).hostname if page.url else None
    return host or page.text


def teacher_fingerprint(info: cm.ModelInfo) -> str:
    """sha256 of the teacher's files (names and bytes): what a reused predictions file must match."""
    h = hashlib.sha256()
    for name, _, _ in info.files:
        h.update(name.encode() + b"\0")
        with open(Path(info.path) / name, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def _check_output(output: Path) -> None:
    """Refuse an output whose folder cannot be made or written, before anything is read or made."""
    if output.is_dir():
        raise ValueError(f"--output {output}: a directory; give the model file's path, e.g. models/quality/en.bin")
    folder = output.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"--output {output}: cannot write in {output.parent} ({folder} is not a directory)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: cannot write in {output.parent} (no write permission, or read-only)")


def read_pool(
    documents: list[str],
    language: str,
    lid_model: str | Path,
    min_language_score: float,
    min_words: int,
    max_documents: int | None,
    log=print,
) -> tuple[list[Page], dict]:
    """The distinct documents of `language` of at least `min_words` words, in input order, and
    how many were read and passed over (and why)."""
    counts = {"read": 0, "too_short": 0, "other_language": 0, "duplicates": 0}
    by = {"metadata": 0, "langid": 0}
    seen: set[int] = set()
    pool: list[Page] = []
    lid = None
    waiting: list[Page] = []
    found: dict[str, int] = {}

    def admit(page: Page) -> None:
        h = text_hash(page.text)
        if h in seen:
            counts["duplicates"] += 1
        else:
            seen.add(h)
            pool.append(page)

    def identify() -> None:
        nonlocal lid
        if lid is None:
            lid = fasttext_native.load_classifier(check_fasttext(lid_model, "fastText LID model"))
        labels, scores = lid.predict_top([sample_text(p.text, MAX_CHARS) for p in waiting])
        for page, label, score in zip(waiting, labels, scores):
            lang = label[len(LABEL_PREFIX) :] if label else "unknown"
            if lang == language and score >= min_language_score:
                by["langid"] += 1
                admit(page)
            else:
                found[lang] = found.get(lang, 0) + 1
                counts["other_language"] += 1
        waiting.clear()

    for page in iter_pages(documents):
        if max_documents and len(pool) >= max_documents:
            break
        counts["read"] += 1
        if len(page.text.split()) < min_words:
            counts["too_short"] += 1
        elif page.language is not None:
            if page.language == language:
                by["metadata"] += 1
                admit(page)
            else:
                found[page.language] = found.get(page.language, 0) + 1
                counts["other_language"] += 1
        else:
            waiting.append(page)
            if len(waiting) >= 256:
                identify()
    if waiting:
        identify()
    del pool[max_documents or len(pool) :]
    counts["documents"] = len(pool)
    counts["language_from"] = by
    if not pool:
        top = ", ".join(f"{k} {v}" for k, v in sorted(found.items(), key=lambda kv: -kv[1])[:5]) or "none"
        raise ValueError(
            f"no documents in language {language!r} of >= {min_words} words among {counts['read']:,} read from "
            f"{', '.join(map(str, documents))} ({counts['too_short']:,} shorter; languages found: {top})"
        )
    log(
        f"pool: {len(pool):,} distinct {language} documents of >= {min_words} words "
        f"({counts['read']:,} read, {counts['too_short']:,} shorter, {counts['other_language']:,} in other languages, "
        f"{counts['duplicates']:,} duplicates)"
    )
    return pool, counts


def _reused_scores(path: str | Path, fingerprint: str, max_tokens: int) -> dict[str, float]:
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--teacher-scores {path}: not found (a previous distil's {PREDICTIONS})")
    try:
        table = pq.read_table(path, columns=["id", "teacher_score"])
        meta = pq.read_schema(path).metadata or {}
    except Exception as e:  # noqa: BLE001 - any unreadable file is one message
        raise ValueError(f"--teacher-scores {path}: not a predictions file ({type(e).__name__}: {e})") from None
    made = meta.get(b"teacher_fingerprint", b"").decode()
    tokens = meta.get(b"teacher_max_tokens", b"").decode()
    if made != fingerprint or tokens != str(max_tokens):
        raise ValueError(
            f"--teacher-scores {path}: made by another teacher or max_tokens (files sha256 {made[:12] or '?'}, "
            f"{tokens or '?'} tokens; this teacher {fingerprint[:12]}, {max_tokens} tokens)"
        )
    return dict(zip(table.column("id").to_pylist(), table.column("teacher_score").to_pylist()))


def _score_teacher(
    info: cm.ModelInfo, pool: list[Page], known: dict[str, float], device: str, max_tokens: int, label, log
) -> tuple[np.ndarray, dict]:
    """The teacher's score of every pool document (from `known` where it has one), and the
    throughput of the scoring."""
    scores = np.array([known.get(p.id, np.nan) for p in pool], np.float32)
    todo = np.flatnonzero(np.isnan(scores))
    timing = {"device": device, "documents": len(todo), "seconds": None, "cpu_seconds": None}
    if not len(todo):
        log(f"teacher: every score taken from the predictions file ({len(pool):,} documents)")
        return scores, timing
    scorer = cm.Scorer(info, device, max_tokens, label=label)
    wall, cpu = time.perf_counter(), time.process_time()
    said = wall
    try:
        for start in range(0, len(todo), WINDOW):
            part = todo[start : start + WINDOW]
            scores[part], _ = scorer.score([pool[i].text for i in part])
            if time.perf_counter() - said > PROGRESS_S and start + WINDOW < len(todo):
                said = time.perf_counter()
                log(f"teacher: {start + len(part):,} of {len(todo):,} documents scored ({said - wall:.0f} s)")
    finally:
        scorer.close()
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    timing.update(seconds=round(wall, 3), cpu_seconds=round(cpu, 3), docs_per_s=len(todo) / wall)
    if not device.startswith("cuda"):
        timing["docs_per_cpu_s"] = len(todo) / cpu
    log(
        f"teacher: scored {len(todo):,} documents on {device} in {wall:.1f} s ({cpu:.1f} CPU s"
        + (f", {len(todo) / cpu:.2f} documents per CPU second)" if not device.startswith("cuda") else ")")
    )
    return scores, timing


def _score_student(model: Path, texts: list[str]) -> tuple[np.ndarray, dict]:
    """The student's probability of hq for each text, as the `quality` step computes it, and its
    throughput (one thread) over one pass, or as many as `STUDENT_TIMING_S` CPU seconds take."""
    predictor = fasttext_native.Predictor(model)
    texts = [sample_text(t, MAX_CHARS) for t in texts]
    cpu = time.process_time()
    scores = np.array(predictor.label_scores(texts, HQ), np.float32)
    done, passes = len(texts), 1
    while (spent := time.process_time() - cpu) < STUDENT_TIMING_S:  # a small pool: passes again
        predictor.label_scores(texts, HQ)
        done += len(texts)
        passes += 1
    return scores, {"documents": done, "passes": passes, "cpu_seconds": round(spent, 3), "docs_per_cpu_s": done / spent}


def _judgments(path: str | Path) -> dict[str, dict]:
    rows = read_rows([path])
    out = {}
    for r in rows:
        if r.get("id") is not None and str(r.get("label")) in (KEEP, DROP):
            out[str(r["id"])] = r
    if not out:
        raise ValueError(f"--judgments {path}: no rows with an `id` and a label keep or drop")
    return out


def _teacher_split(teacher: Path) -> tuple[float, int] | None:
    """The held-out fraction and seed of the teacher's own training, from its report.json."""
    import json

    try:
        r = json.loads((teacher / "report.json").read_text())
        return float(r["heldout_fraction"]), int(r["params"]["seed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _predictions_table(pool, keys, held, t_scores, t_keep, s_scores, s_keep, judged, meta):
    import pyarrow as pa

    return pa.table(
        {
            "id": pa.array([p.id for p in pool], pa.string()),
            "url": pa.array([p.url for p in pool], pa.string()),
            "host": pa.array(keys, pa.string()),
            "split": pa.array(["heldout" if h else "train" for h in held], pa.string()),
            "teacher_score": pa.array(t_scores, pa.float32()),
            "teacher_keep": pa.array(t_keep, pa.bool_()),
            "student_score": pa.array(s_scores, pa.float32()),
            "student_keep": pa.array(s_keep, pa.bool_()),
            "judgment": pa.array(judged, pa.string()),
        }
    ).replace_schema_metadata(meta)


def distil(
    teacher: str | Path,
    documents: list[str],
    output: str | Path,
    language: str = "en",
    lid_model: str | Path = "models/lid.176.ftz",
    min_language_score: float = 0.65,
    min_words: int = 20,
    max_documents: int | None = None,
    teacher_label: str = KEEP,
    teacher_threshold: float = 0.5,
    max_tokens: int | None = None,
    device: str = "auto",
    teacher_scores: str | Path | None = None,
    judgments: str | Path | None = None,
    heldout: float = 0.25,
    threshold: float = 0.5,
    seed: int = 0,
    thread: int = 1,
    epoch: int = 25,
    lr: float = 1.0,
    dim: int = 64,
    word_ngrams: int = 2,
    min_count: int = 2,
    bucket: int = 100_000,
    log=print,
) -> dict:
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    teacher, output = Path(teacher), Path(output)
    _check_output(output)
    info = cm.check_classifier(teacher)  # a missing or broken teacher: one line, nothing read yet
    label = None
    if info.task != "regression":
        if teacher_label not in info.labels:
            raise ModelError(f"{teacher}: no label {teacher_label!r} (it has {list(info.labels)}); set --teacher-label")
        label = info.labels.index(teacher_label)
    if not 0 < heldout < 1:
        raise ValueError(f"--heldout {heldout}: expected a fraction between 0 and 1")
    device = cm.resolve_device(device, f"--teacher {teacher}")
    max_tokens = min(max_tokens or int(info.head.get("max_tokens") or 512), info.max_positions)
    fingerprint = teacher_fingerprint(info)
    known = _reused_scores(teacher_scores, fingerprint, max_tokens) if teacher_scores else {}
    judged_rows = _judgments(judgments) if judgments else {}

    pool, counts = read_pool(documents, language, lid_model, min_language_score, min_words, max_documents, log)
    t_scores, t_timing = _score_teacher(info, pool, known, device, max_tokens, label, log)
    t_keep = t_scores >= teacher_threshold
    n_keep = int(t_keep.sum())
    n_drop = len(pool) - n_keep
    if not n_keep or not n_drop:
        raise ValueError(
            f"the teacher labels all {len(pool):,} documents {KEEP if n_keep else DROP} ({KEEP} {n_keep}, "
            f"{DROP} {n_drop} at score >= {teacher_threshold}): a student needs both labels; "
            "give a larger pool or another --teacher-threshold"
        )
    keys = [split_key(p) for p in pool]
    held = np.array([is_heldout(k, heldout, seed) for k in keys], bool)
    sides = {}
    for name, mask in (("train", ~held), ("heldout", held)):
        sides[name] = {
            "documents": int(mask.sum()),
            KEEP: int((t_keep & mask).sum()),
            DROP: int((~t_keep & mask).sum()),
            "hosts": len({k for k, m in zip(keys, mask) if m}),
        }
    if not sides["heldout"]["documents"] or sides["train"][KEEP] == 0 or sides["train"][DROP] == 0:
        raise ValueError(
            f"the split by host of {len(pool):,} documents leaves training {sides['train'][KEEP]} {KEEP}, "
            f"{sides['train'][DROP]} {DROP} and {sides['heldout']['documents']} held out: "
            "a student needs both labels to train and pages to test; change --heldout or give a larger pool"
        )
    log(
        f"teacher labels: {KEEP} {n_keep:,}, {DROP} {n_drop:,} (score >= {teacher_threshold}); "
        f"{sides['train']['documents']:,} train, {sides['heldout']['documents']:,} held out "
        f"({sides['heldout']['hosts']:,} hosts)"
    )

    params = fasttext_params(seed, thread, epoch, lr, dim, word_ngrams, min_count, bucket)
    examples = [(HQ if k else LQ, p.text) for p, k, h in zip(pool, t_keep, held) if not h]
    tmp_model = fit(examples, output, params)
    tmp_predictions = None
    try:
        s_scores, s_timing = _score_student(tmp_model, [p.text for p in pool])
        s_keep = s_scores >= threshold
        judged = [judged_rows[p.id]["label"] if p.id in judged_rows else None for p in pool]
        report: dict = {
            "model": output.name,
            "labels": [HQ, LQ],
            "teacher": {
                "path": str(teacher),
                "task": info.task,
                "label": teacher_label if label is not None else None,
                "threshold": teacher_threshold,
                "max_tokens": max_tokens,
                "files_sha256": fingerprint,
                "scores_reused_from": str(teacher_scores) if teacher_scores else None,
            },
            "documents": [str(d) for d in documents],
            "language": language,
            "min_words": min_words,
            "pool": counts,
            "teacher_labels": {KEEP: n_keep, DROP: n_drop},
            "split": {"by": "host", "fraction": heldout, "seed": seed, **sides},
            "threshold": threshold,
            "params": params,
            "agreement": {
                "heldout": agreement(t_keep[held], s_keep[held]),
                "train": agreement(t_keep[~held], s_keep[~held]),
            },
            "judgments": None,
            "throughput": {"teacher": t_timing, "student": s_timing, "cores": os.cpu_count()},
            "predictions": output.name + PREDICTIONS,
        }
        if judgments:
            report["judgments"] = _judgment_report(judgments, judged_rows, pool, keys, held, t_keep, s_keep, teacher)
        report["train_seconds"] = round(time.perf_counter() - t0, 1)
        meta = {"teacher_fingerprint": fingerprint, "teacher_max_tokens": str(max_tokens)}
        tmp_predictions = temporary_path(output.with_name(output.name + PREDICTIONS))
        pq.write_table(
            _predictions_table(pool, keys, held, t_scores, t_keep, s_scores, s_keep, judged, meta), tmp_predictions
        )
        publish(output, tmp_model, report, text_report(report), {PREDICTIONS: tmp_predictions})
    except BaseException:
        for p in (tmp_model, tmp_predictions):
            if p is not None:
                Path(p).unlink(missing_ok=True)
        raise
    log(text_report(report).rstrip())
    log(f"wrote {output} ({report['train_seconds']} s)")
    return report


def _judgment_report(path, rows, pool, keys, held, t_keep, s_keep, teacher: Path) -> dict:
    """The teacher's and the student's agreement with the judgments on held-out judged pages;
    how many of them the teacher trained on (its report's split, where it has one)."""
    idx = [i for i, p in enumerate(pool) if held[i] and p.id in rows]
    truth = np.array([rows[pool[i].id]["label"] == KEEP for i in idx], bool)
    split = _teacher_split(teacher)
    seen = None
    if split is not None:
        frac, tseed = split
        seen = 0
        for i in idx:
            url = rows[pool[i].id].get("url")
            key = (urlsplit(url).hostname if url else None) or pool[i].text
            seen += not is_heldout(key, frac, tseed)
    return {
        "file": str(path),
        "judged": len(rows),
        "judged_in_pool": sum(p.id in rows for p in pool),
        "heldout_judged": len(idx),
        "teacher_trained_on": seen,
        "teacher": agreement(truth, t_keep[idx]),
        "student": agreement(truth, s_keep[idx]),
    }


def _fmt(a: dict) -> str:
    k = a[KEEP]
    kappa = "n/a" if a["kappa"] is None else f"{a['kappa']:.3f}"
    acc = "n/a" if a["accuracy"] is None else f"{a['accuracy']:.3f}"
    return (
        f"accuracy {acc}, kappa {kappa}, keep precision {k['precision']:.3f}, recall {k['recall']:.3f}, "
        f"F1 {k['f1']:.3f} ({a['documents']} documents)"
    )


def _confusion(a: dict, rows: str, cols: str) -> list[str]:
    (dd, dk), (kd, kk) = a["confusion"]
    return [
        f"  confusion (rows: {rows}, columns: {cols}): {'drop':>6} {'keep':>6}",
        f"  {'drop':>8} {dd:>6} {dk:>6}",
        f"  {'keep':>8} {kd:>6} {kk:>6}",
    ]


def text_report(r: dict) -> str:
    t, s, tp = r["teacher"], r["split"], r["throughput"]
    lines = [
        f"fastText quality classifier {r['model']} distilled from {t['path']} "
        f"({HQ}: {KEEP} at score >= {t['threshold']}, {t['max_tokens']} tokens)",
        f"documents: {', '.join(r['documents'])}",
        f"pool: {r['pool']['documents']} distinct {r['language']} documents of >= {r['min_words']} words "
        f"({r['pool']['read']} read); teacher labels {KEEP} {r['teacher_labels'][KEEP]}, "
        f"{DROP} {r['teacher_labels'][DROP]}",
        f"split by host (fraction {s['fraction']}, seed {s['seed']}): train {s['train']['documents']} "
        f"({s['train'][KEEP]} {KEEP}, {s['train']['hosts']} hosts), held out {s['heldout']['documents']} "
        f"({s['heldout'][KEEP]} {KEEP}, {s['heldout']['hosts']} hosts)",
        f"student vs teacher, held out: {_fmt(r['agreement']['heldout'])}",
        *_confusion(r["agreement"]["heldout"], "teacher", "student"),
        f"student vs teacher, train: {_fmt(r['agreement']['train'])}",
    ]
    j = r.get("judgments")
    if j:
        seen = "" if j["teacher_trained_on"] is None else f"; the teacher trained on {j['teacher_trained_on']} of them"
        lines += [
            f"judgments ({j['file']}): {j['heldout_judged']} held-out pages judged{seen}",
            f"  teacher vs judgments: {_fmt(j['teacher'])}",
            f"  student vs judgments: {_fmt(j['student'])}",
        ]
    tt, st = tp["teacher"], tp["student"]
    if tt.get("docs_per_cpu_s"):
        teacher_speed = f"{tt['docs_per_cpu_s']:.2f} documents per CPU second"
    elif tt.get("docs_per_s"):
        teacher_speed = f"{tt['docs_per_s']:.1f} documents/s on {tt['device']}"
    else:
        teacher_speed = "not measured (scores reused)"
    lines.append(f"throughput: teacher {teacher_speed}; student {st['docs_per_cpu_s']:,.0f} documents per CPU second")
    return "\n".join(lines) + "\n"


def cmd_quality_distil(args, console) -> int:
    from gristmill.filters.train_cli import fasttext_params

    distil(
        args.teacher,
        args.documents,
        args.output,
        language=args.language,
        lid_model=args.lid_model,
        min_language_score=args.min_language_score,
        min_words=args.min_words,
        max_documents=args.max_documents,
        teacher_label=args.teacher_label,
        teacher_threshold=args.teacher_threshold,
        max_tokens=args.max_tokens,
        device=args.device,
        teacher_scores=args.teacher_scores,
        judgments=args.judgments,
        heldout=args.heldout,
        threshold=args.threshold,
        seed=args.seed,
        **fasttext_params(args),
        log=console.print,
    )
    return 0
