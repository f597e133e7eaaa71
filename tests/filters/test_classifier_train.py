"""`pipeline train-classifier`: a head trained on a frozen encoder's embeddings, written as a
model directory the `classifier` step loads and scores with exactly as transformers' encoder
and the head's own weights compute (small encoders built here, and the packaged
all-MiniLM-L6-v2 on pages the project judged)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datatrove.data import Document
from safetensors.torch import load_file

from gristmill.filters import classifier_model as cm
from gristmill.filters.classifier import Classifier
from gristmill.filters.classifier_train import train
from gristmill.filters.model_check import ModelError
from gristmill.filters.train_corpus import iter_documents
from tests.cli_process import pipeline
from tests.filters.test_classifier import close, wordpiece_tokenizer

transformers = cm.quiet_transformers()
REPO = Path(__file__).resolve().parents[2]
JUDGED = REPO / "configs" / "classifier" / "judged-en.jsonl"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pages(wet_files) -> list[str]:
    return list(iter_documents(wet_files))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, pages) -> Path:
    """A small BERT encoder (random weights) with a WordPiece tokenizer trained on the pages."""
    path = tmp_path_factory.mktemp("encoder") / "bert"
    tok = wordpiece_tokenizer(pages, 2000, 128)
    cfg = transformers.BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def head_reference(path: Path, texts: list[str], max_tokens: int) -> np.ndarray:
    """transformers' encoder, mean pooling over the mask, L2 norm, then the head's layers from
    head.safetensors by hand: what a trained directory must score."""
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    enc = transformers.AutoModel.from_pretrained(str(path)).eval()
    head = json.loads((path / "head.json").read_text())
    w = load_file(str(path / "head.safetensors"))
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 16):
            t = tok(texts[i : i + 16], padding="longest", truncation=True, max_length=max_tokens, return_tensors="pt")
            states = enc(**t).last_hidden_state
            m = t["attention_mask"].unsqueeze(-1).float()
            x = torch.nn.functional.normalize((states * m).sum(1) / m.sum(1), dim=1)
            n = len(head["layers"]) - 1
            for j in range(n):
                x = x @ w[f"{2 * j}.weight"].T + w[f"{2 * j}.bias"]
                if j < n - 1:
                    x = torch.nn.functional.gelu(x)
            out.append(x)
    return torch.cat(out).numpy()


def scores(path: Path, texts: list[str], **params) -> tuple[np.ndarray, list[int]]:
    step = Classifier(model=str(path), device="cpu", **params)
    docs = list(step.run(iter([Document(text=t, id=str(i)) for i, t in enumerate(texts)])))
    return np.array([d.metadata["classifier_score"] for d in docs]), [d.metadata["classifier_class"] for d in docs]


def test_classification_head_scores_as_its_weights_do(encoder, tmp_path, pages):
    texts = pages[:240]
    rows = [{"text": t, "label": "keep" if len(t) > 3000 else "drop"} for t in texts]
    out = tmp_path / "model"
    report = train([str(write_jsonl(tmp_path / "l.jsonl", rows))], encoder, out, hidden=16, epochs=50, log=lambda *a: 0)
    head = json.loads((out / "head.json").read_text())
    assert head["labels"] == ["drop", "keep"] and head["layers"] == [32, 16, 2] and head["task"] == "classification"
    m = report["heldout_metrics"]
    confusion = np.array(m["confusion"])
    assert confusion.sum() == report["heldout"] > 20 and report["train"] + report["heldout"] == len(texts)
    assert m["accuracy"] == pytest.approx(np.trace(confusion) / confusion.sum())
    assert "held out: accuracy" in (out / "report.txt").read_text()
    ref = torch.softmax(torch.from_numpy(head_reference(out, pages[240:300], 128)), 1).numpy()
    got, classes = scores(out, pages[240:300])
    assert close(got, ref[:, 1]) and classes == ref.argmax(1).tolist()  # keep, the last label, by default


def test_regression_head_from_scores(encoder, tmp_path, pages):
    texts = pages[:200]
    rows = [{"text": t, "score": min(5, t.count("\n") // 10)} for t in texts]
    out = tmp_path / "model"
    report = train(
        [str(write_jsonl(tmp_path / "s.jsonl", rows))], encoder, out, label_field="score", epochs=50, log=lambda *a: 0
    )
    assert report["task"] == "regression" and report["heldout_mse"] >= 0
    assert report["heldout_metrics"]["labels"] == ["0", "1", "2", "3", "4", "5"]
    ref = head_reference(out, pages[300:340], 128)[:, 0]
    got, classes = scores(out, pages[300:340])
    assert close(got, ref) and classes == [int(round(min(max(float(s), 0), 5))) for s in ref]


def test_packaged_minilm_head_on_judged_pages(minilm_model, tmp_path, wet_files, pages):
    """The shipped recipe's shape on part of its labels: rows naming WARC records, their text
    taken from the WET files, the host-hash split, and the step faithful to the head."""
    rows = [json.loads(line) for line in JUDGED.read_text().splitlines()]
    assert len(rows) == 459 and {r["label"] for r in rows} == {"keep", "drop"}
    part = write_jsonl(tmp_path / "part.jsonl", rows[:60])
    out = tmp_path / "judged"
    train([str(part)], minilm_model, out, documents=[str(w) for w in wet_files], epochs=30, log=lambda *a: 0)
    texts = pages[:24]
    ref = torch.softmax(torch.from_numpy(head_reference(out, texts, 512)), 1).numpy()
    got, _ = scores(out, texts, batch_tokens=4096)
    assert close(got, ref[:, 1])


def test_bad_labels_and_heads_are_one_clear_error(encoder, tmp_path, pages):
    no_text = write_jsonl(tmp_path / "ids.jsonl", [{"id": "<urn:uuid:x>", "label": "keep"}] * 3)
    with pytest.raises(ValueError, match="3 rows have no 'text'; give their WET files with --documents"):
        train([str(no_text)], encoder, tmp_path / "m")
    one = write_jsonl(tmp_path / "one.jsonl", [{"text": t, "label": "keep"} for t in pages[:20]])
    with pytest.raises(ValueError, match=r"two labels or more \(found \['keep'\]\)"):
        train([str(one)], encoder, tmp_path / "m")
    rows = [{"text": t, "label": "keep" if i % 2 else "drop"} for i, t in enumerate(pages[:80])]
    out = tmp_path / "m"
    train([str(write_jsonl(tmp_path / "ok.jsonl", rows))], encoder, out, epochs=5, log=lambda *a: 0)
    assert not Path(f"{out}.tmp").exists()
    head = json.loads((out / "head.json").read_text())
    (out / "head.json").write_text(json.dumps({**head, "layers": [48, 2]}))
    with pytest.raises(ModelError, match="the head has the wrong shape: it takes 48 inputs, the encoder gives 32"):
        Classifier(model=str(out))
    (out / "head.json").write_text(json.dumps(head))
    w = out / "head.safetensors"
    w.write_bytes(w.read_bytes()[:-8])
    with pytest.raises(ModelError, match="truncated safetensors file"):
        Classifier(model=str(out))


def test_cli_train_classifier(encoder, tmp_path, pages):
    rows = [{"text": t, "label": "keep" if len(t) > 3000 else "drop"} for t in pages[:100]]
    data = write_jsonl(tmp_path / "l.jsonl", rows)
    r = pipeline("train-classifier", str(data), "--encoder", str(encoder), "-o", str(tmp_path / "m"), "--epochs", "20")
    assert r.returncode == 0, r.stderr
    assert "held out: accuracy" in r.stderr and (tmp_path / "m" / "head.safetensors").is_file()
    bad = pipeline(
        "train-classifier", str(tmp_path / "none.jsonl"), "--encoder", str(encoder), "-o", str(tmp_path / "x")
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: labelled data not found")
