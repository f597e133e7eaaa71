"""`pipeline train-classifier`: a head on a frozen encoder, from labelled documents, as
FineWeb-Edu trains its classifier (there: a regression head on Snowflake's encoder, 450k LLM
labels); the result is a model directory the `classifier` step loads.

Labelled documents are JSONL or Parquet rows with a text and a label: a score (a number, 0-5 on
FineWeb-Edu's scale: a regression head) or a class name (keep/drop: a classification head, its
labels in sorted order so `keep` is the last, the one the step scores by default). A label
file may instead name documents by `id` (a WARC record id) and take their text from WET files
(`--documents`): the project's own judgments of the sample pages are shipped that way
(configs/classifier/judged-en.jsonl), without a copy of the pages.

The encoder's pooled output (mean over the attention mask, L2-normalised, as all-MiniLM-L6-v2
is used; texts cut and truncated to `max_tokens` exactly as the step does) is computed once for
every document, then the head trained on those embeddings: a linear layer or one hidden layer of
GELU (`--hidden`), AdamW over the whole training part at once for a fixed number of epochs,
seeded; classes weighted by their inverse frequency. The held-out part is chosen by a hash of
the URL's host where the rows carry one (pages of one site stay on one side), else of the text.

Writes `<output>/`: the encoder's files (hard links where possible), `head.json`,
`head.safetensors`, `report.json` and `report.txt` (held-out accuracy, F1, confusion matrix; for
a regression also its error and the classes its rounded scores give). Written to
`<output>.tmp` and renamed, so a directory present is a complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from gristmill.filters import classifier_model as cm
from gristmill.filters.model_check import ModelError

ENCODER_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def read_rows(paths: list[str | Path]) -> list[dict]:
    """Rows of JSONL or Parquet files, in order; each a dict."""
    rows: list[dict] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise FileNotFoundError(f"labelled data not found: {path}")
        if path.suffix == ".parquet" or path.is_dir():
            import pyarrow.parquet as pq

            files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
            for f in files:
                rows.extend(pq.read_table(f).to_pylist())
        else:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except ValueError as e:
                        raise ValueError(f"{path}:{n}: not a JSON object ({e})") from None
    return rows


def texts_by_id(wet_files: list[str | Path], ids: set[str]) -> dict[str, str]:
    from gristmill.input.wet import WetRecord, iter_wet_records

    out = {}
    for f in wet_files:
        for rec in iter_wet_records(Path(f)):
            if isinstance(rec, WetRecord) and rec.record_id in ids:
                out[rec.record_id] = rec.text
    return out


def labelled(
    rows: list[dict], text_field: str, label_field: str, documents: list[str] | None, source: str
) -> tuple[list[str], list, list[str]]:
    """(texts, labels, split keys) of the rows; a row without text takes it from `documents` by id."""
    missing_text = [r for r in rows if not r.get(text_field)]
    found: dict[str, str] = {}
    if missing_text:
        if not documents:
            raise ValueError(
                f"{source}: {len(missing_text)} rows have no {text_field!r}; give their WET files with --documents "
                "(rows with an `id` take their text from its record)"
            )
        found = texts_by_id(documents, {str(r.get("id")) for r in missing_text})
    texts, labels, keys = [], [], []
    for i, r in enumerate(rows):
        text = r.get(text_field) or found.get(str(r.get("id")))
        if not text:
            raise ValueError(f"{source}: row {i + 1} (id {r.get('id')!r}): no text, and no record of that id")
        if r.get(label_field) is None:
            raise ValueError(f"{source}: row {i + 1}: no {label_field!r}")
        texts.append(text)
        labels.append(r[label_field])
        host = urlsplit(r["url"]).hostname if r.get("url") else None
        keys.append(host or text)
    return texts, labels, keys


def is_heldout(key: str, fraction: float, seed: int) -> bool:
    h = int.from_bytes(hashlib.sha1(f"{seed}:{key}".encode()).digest()[:8], "little")
    return (h % 10_000) < fraction * 10_000


def embeddings(encoder_dir: Path, texts: list[str], max_tokens: int, head: dict, batch_tokens: int = 8192, log=print):
    """The frozen encoder's pooled output of every text (float32 [n, hidden]), computed once."""
    import torch

    transformers = cm.quiet_transformers()
    tok = transformers.AutoTokenizer.from_pretrained(str(encoder_dir))
    if not tok.is_fast:
        raise ModelError(f"{encoder_dir}: the tokenizer is not a fast tokenizer (tokenizer.json)")
    model = transformers.AutoModel.from_pretrained(str(encoder_dir), dtype=torch.float32).eval()
    max_tokens = min(max_tokens, int(getattr(model.config, "max_position_embeddings", max_tokens)))
    ids = cm.token_ids(tok, texts, max_tokens, max_tokens * cm.CHARS_PER_TOKEN)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = np.zeros((len(ids), model.config.hidden_size), np.float32)
    pad = tok.pad_token_id or 0
    t0, done, start = time.perf_counter(), 0, 0
    with torch.inference_mode():
        while start < len(order):
            size = max(1, min(batch_tokens // len(ids[order[start]]), len(order) - start))
            part = order[start : start + size]
            a, m = cm.padded([ids[i] for i in part], pad)
            out[part] = cm.embed(model, head, torch.from_numpy(a), torch.from_numpy(m)).numpy()
            start += size
            done += len(part)
    log(f"embedded {done:,} documents with {encoder_dir.name} ({time.perf_counter() - t0:.1f} s, {max_tokens} tokens)")
    return out, max_tokens


def metrics(truth: np.ndarray, pred: np.ndarray, labels: list[str]) -> dict:
    """Accuracy, per-class precision/recall/F1, macro F1 and the confusion matrix (rows: truth)."""
    k = len(labels)
    confusion = np.zeros((k, k), int)
    for t, p in zip(truth, pred):
        confusion[t, p] += 1
    per = {}
    for i, name in enumerate(labels):
        tp = confusion[i, i]
        prec = tp / confusion[:, i].sum() if confusion[:, i].sum() else 0.0
        rec = tp / confusion[i].sum() if confusion[i].sum() else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per[name] = {
            "precision": float(prec),
            "recall": float(rec),
            "f1": float(f1),
            "support": int(confusion[i].sum()),
        }
    return {
        "accuracy": float((truth == pred).mean()) if len(truth) else float("nan"),
        "macro_f1": float(np.mean([v["f1"] for v in per.values()])),
        "per_class": per,
        "confusion": confusion.tolist(),
        "labels": labels,
    }


def fit_head(x: np.ndarray, y: np.ndarray, layers: list[int], task: str, epochs: int, lr: float, wd: float, seed: int):
    """The head trained on embeddings `x` (full batch AdamW, seeded): a torch module."""
    import torch

    torch.manual_seed(seed)
    head = cm.build_head(layers)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=wd)
    xt = torch.from_numpy(x)
    if task == "regression":
        yt = torch.from_numpy(y.astype(np.float32))

        def loss_fn(out):
            return torch.nn.functional.mse_loss(out[:, 0], yt)
    else:
        yt = torch.from_numpy(y.astype(np.int64))
        counts = np.bincount(y, minlength=layers[-1]).astype(np.float32)
        weight = torch.from_numpy(np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / layers[-1], 0.0))

        def loss_fn(out):
            return torch.nn.functional.cross_entropy(out, yt, weight=weight.float())

    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(head(xt))
        loss.backward()
        opt.step()
    return head.eval(), float(loss.detach())


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def train(
    data: list[str],
    encoder: str | Path,
    output: str | Path,
    documents: list[str] | None = None,
    text_field: str = "text",
    label_field: str = "label",
    task: str = "auto",
    hidden: int = 0,
    heldout: float = 0.25,
    seed: int = 0,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-2,
    max_tokens: int = 512,
    pooling: str = "mean",
    normalize: bool = True,
    class_range: tuple[int, int] = (0, 5),
    log=print,
) -> dict:
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    encoder, output = Path(encoder), Path(output)
    if not (encoder / "config.json").is_file() or not (encoder / "model.safetensors").is_file():
        raise ModelError(f"{encoder}: not an encoder directory (config.json and model.safetensors)")
    for w in [encoder / "model.safetensors"]:
        cm.safetensors_header(w)  # a truncated encoder is named before an hour of embedding
    source = ", ".join(map(str, data))
    texts, raw, keys = labelled(read_rows(data), text_field, label_field, documents, source)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
    if task == "auto":
        task = "regression" if numeric else "classification"
    if task == "regression":
        if not numeric:
            raise ValueError(
                f"{source}: --task regression needs numeric labels (found {sorted(set(map(str, raw)))[:5]})"
            )
        labels: list[str] = []
        y = np.array(raw, np.float64)
    else:
        labels = sorted(
            {str(v) for v in raw},
            key=lambda v: (not v.lstrip("-").isdigit(), int(v) if v.lstrip("-").isdigit() else 0, v),
        )
        if len(labels) < 2:
            raise ValueError(f"{source}: a classification needs two labels or more (found {labels})")
        y = np.array([labels.index(str(v)) for v in raw], np.int64)
    held = np.array([is_heldout(k, heldout, seed) for k in keys], bool)
    if held.all() or not held.any():
        raise ValueError(
            f"{source}: the held-out split of {len(texts)} documents left one side empty; change --heldout"
        )
    counts = ", ".join(f"{l} {int((y == i).sum())}" for i, l in enumerate(labels))
    by = "host" if keys and keys[0] != texts[0] else "text"
    log(
        f"{len(texts):,} labelled documents ({task}{': ' + counts if counts else ''}); "
        f"{int((~held).sum()):,} train, {int(held.sum()):,} held out (by {by} hash)"
    )
    head_cfg = {"pooling": pooling, "normalize": normalize}
    x, max_tokens = embeddings(encoder, texts, max_tokens, head_cfg, log=log)
    dim = x.shape[1]
    layers = [dim, *([hidden] if hidden else []), 1 if task == "regression" else len(labels)]
    model, final_loss = fit_head(x[~held], y[~held], layers, task, epochs, lr, weight_decay, seed)
    with torch.no_grad():
        out = model(torch.from_numpy(x)).numpy()
    report: dict = {
        "encoder": str(encoder),
        "data": [str(d) for d in data],
        "task": task,
        "labels": labels,
        "documents": len(texts),
        "train": int((~held).sum()),
        "heldout": int(held.sum()),
        "heldout_fraction": heldout,
        "params": {
            "hidden": hidden,
            "epochs": epochs,
            "lr": lr,
            "weight_decay": weight_decay,
            "seed": seed,
            "max_tokens": max_tokens,
            "pooling": pooling,
            "normalize": normalize,
        },
        "final_train_loss": final_loss,
    }
    if task == "regression":
        lo, hi = class_range
        classes = [str(c) for c in range(lo, hi + 1)]
        pred = np.clip(np.round(out[:, 0]), lo, hi).astype(int) - lo
        truth = np.clip(np.round(y), lo, hi).astype(int) - lo
        report["heldout_mse"] = float(((out[held, 0] - y[held]) ** 2).mean())
        report["heldout_metrics"] = metrics(truth[held], pred[held], classes)
        report["train_metrics"] = metrics(truth[~held], pred[~held], classes)
    else:
        pred = out.argmax(1)
        report["heldout_metrics"] = metrics(y[held], pred[held], labels)
        report["train_metrics"] = metrics(y[~held], pred[~held], labels)
    tmp = Path(f"{output}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ENCODER_FILES:
        if (encoder / name).is_file():
            _link_or_copy(encoder / name, tmp / name)
    head = {
        "format": cm.HEAD_FORMAT,
        "version": cm.HEAD_VERSION,
        "task": task,
        "labels": labels or None,
        "layers": layers,
        "activation": "gelu",
        "pooling": pooling,
        "normalize": normalize,
        "max_tokens": max_tokens,
        "encoder": encoder.name,
        "trained_on": [Path(d).name for d in data],
    }
    (tmp / cm.HEAD_CONFIG).write_text(json.dumps(head, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / cm.HEAD_WEIGHTS))
    report["train_seconds"] = round(time.perf_counter() - t0, 1)
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (tmp / "report.txt").write_text(text_report(report))
    shutil.rmtree(output, ignore_errors=True)
    os.replace(tmp, output)
    m = report["heldout_metrics"]
    log(text_report(report).rstrip())
    took = report["train_seconds"]
    log(f"wrote {output}: held-out accuracy {m['accuracy']:.3f}, macro F1 {m['macro_f1']:.3f} ({took} s)")
    return report


def text_report(r: dict) -> str:
    m = r["heldout_metrics"]
    labels = m["labels"]
    lines = [
        f"classifier head on {Path(r['encoder']).name} ({r['task']}; layers {r['params']['hidden'] or 'linear'})",
        f"data: {', '.join(r['data'])}: {r['documents']} documents, {r['train']} train, {r['heldout']} held out",
        f"held out: accuracy {m['accuracy']:.3f}, macro F1 {m['macro_f1']:.3f}"
        + (f", MSE {r['heldout_mse']:.3f}" if "heldout_mse" in r else ""),
    ]
    for name, v in m["per_class"].items():
        lines.append(
            f"  {name:>8}: precision {v['precision']:.3f}, recall {v['recall']:.3f}, F1 {v['f1']:.3f} ({v['support']})"
        )
    lines.append("confusion (rows: truth, columns: predicted): " + " ".join(f"{l:>6}" for l in labels))
    for name, row in zip(labels, m["confusion"]):
        lines.append(f"  {name:>8} " + " ".join(f"{c:>6}" for c in row))
    t = r["train_metrics"]
    lines.append(f"train: accuracy {t['accuracy']:.3f}, macro F1 {t['macro_f1']:.3f}")
    return "\n".join(lines) + "\n"


def cmd_train_classifier(args, console) -> int:
    train(
        args.data,
        args.encoder,
        args.output,
        documents=args.documents,
        text_field=args.text_field,
        label_field=args.label_field,
        task=args.task,
        hidden=args.hidden,
        heldout=args.heldout,
        seed=args.seed,
        epochs=args.epochs,
        lr=args.lr,
        weight_decay=args.weight_decay,
        max_tokens=args.max_tokens,
        pooling=args.pooling,
        normalize=not args.no_normalize,
        log=console.print,
    )
    return 0
