"""gristmill's fastText predictor (`fasttext_native`) against fastText itself, number for number.

The reference is the fasttext module (fasttext-community, the distribution gristmill pins),
predicting the same texts with newlines replaced by spaces, as its API requires. Every label
and every probability must be the same float32: the predictor replicates fastText's tokenizer,
n-gram hashing, pruning, row sums and losses in the same order with the same arithmetic.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from gristmill.filters.fasttext_file import FastTextFileError, read_model
from gristmill.filters.fasttext_native import Predictor, load_classifier
from gristmill.filters.model_check import ModelError
from gristmill.filters.train_corpus import iter_documents


def _reference(path):
    import fasttext

    return fasttext.FastText._FastText(model_path=str(path))


def _top_of_fasttext(model, texts):
    labels, scores = model.predict([t.replace("\n", " ") for t in texts], k=1)
    return [l[0] if len(l) else None for l in labels], [np.float32(s[0]) if len(s) else np.float32(0) for s in scores]


def _label_of_fasttext(model, texts, label):
    labels, probs = model.predict([t.replace("\n", " ") for t in texts], k=-1)
    return [np.float32(dict(zip(l, p)).get(label, 0.0)) for l, p in zip(labels, probs)]


def assert_same_top(predictor, reference, texts):
    labels, scores = predictor.predict_top(texts)
    ref_labels, ref_scores = _top_of_fasttext(reference, texts)
    for i, (a, b, x, y) in enumerate(zip(labels, ref_labels, scores, ref_scores)):
        assert (a, np.float32(x)) == (b, y), f"text {i} {texts[i][:80]!r}: ours {a} {x!r}, fastText's {b} {y!r}"


def assert_same_label_scores(predictor, reference, texts, label):
    ours = predictor.label_scores(texts, label)
    ref = _label_of_fasttext(reference, texts, label)
    for i, (x, y) in enumerate(zip(ours, ref)):
        assert np.float32(x) == y, f"text {i} {texts[i][:80]!r}: ours {x!r}, fastText's {y!r}"


@pytest.fixture(scope="module")
def sample_texts(wet_files) -> list[str]:
    return list(iter_documents(wet_files))


def test_lid_is_fasttext_on_the_sample(lid_model, sample_texts):
    predictor = Predictor(lid_model)
    assert_same_top(predictor, _reference(lid_model), sample_texts)
    # the second pass reads every word from the cache: the same numbers
    stats = predictor.cache_stats()
    assert stats["misses"] > 10_000 and stats["resets"] == 0
    assert_same_top(predictor, _reference(lid_model), sample_texts)
    assert predictor.cache_stats()["misses"] == stats["misses"]


def test_a_full_cache_empties_and_changes_nothing(lid_model, sample_texts):
    predictor = Predictor(lid_model, cache_bytes=1 << 20)  # the smallest: a few thousand words
    assert_same_top(predictor, _reference(lid_model), sample_texts)
    assert predictor.cache_stats()["resets"] > 5


def test_quality_probabilities_are_fasttext_s(quality_model, sample_texts):
    predictor = load_classifier(quality_model)
    reference = _reference(quality_model)
    for label in ("__label__hq", "__label__lq"):
        assert_same_label_scores(predictor, reference, sample_texts, label)
    assert_same_top(predictor, reference, sample_texts)


def _hostile_texts(pages: list[str]) -> list[str]:
    rng = random.Random(7)
    planes = [(0x20, 0x7F), (0xA0, 0x2FF), (0x300, 0x36F), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1F6FF),
              (0x20000, 0x2A6DF), (0xE000, 0xF8FF)]  # fmt: skip

    def noise(n):
        out = []
        for _ in range(n):
            lo, hi = rng.choice(planes)
            out.append(chr(rng.randint(lo, hi)) if rng.random() < 0.85 else rng.choice(" \t\v\f\r\0\n"))
        return "".join(out)

    words = " ".join(pages[:20]).split()
    texts = [
        "",
        " ",
        "\t\v\f\r\0",
        "\n\n",
        "hello",
        "</s>",
        "la maison </s> the house is red",  # a "</s>" ends fastText's line there
        "</s></s> x",
        "__label__en __label__de what language is this",
        "__label__xx only labels __label__",
        "__label__en",
        "a" * 5000,  # one word longer than the cache keeps
        ("Straße " * 200) + "x" * 70000,
        "é" * 3000 + " " + "日本語" * 2000,
        "\u0301\u0301 a\u0301 \u200b\u200d zero\u200bwidth",
        "\U0001f600 \U0001f600\U0001f601 smile \U00020000\U0002a6d6",
        "tab\tseparated\vvertical\fform\rfeed\0nul words",
        "\xa0non-breaking\xa0spaces\u2003em\u3000ideographic are not separators to fastText",
    ]
    texts += [noise(rng.randint(1, 400)) for _ in range(300)]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 300))) for _ in range(100)]
    # the same words in new orders and cases: cached words next to new ones
    texts += [" ".join(w.upper() if rng.random() < 0.3 else w for w in rng.sample(words, 50)) for _ in range(50)]
    return texts


def test_hostile_texts_are_predicted_as_fasttext_does(lid_model, quality_model, sample_texts):
    texts = _hostile_texts(sample_texts)
    for model in (lid_model, quality_model):
        predictor = Predictor(model)
        assert_same_top(predictor, _reference(model), texts)
        assert_same_top(predictor, _reference(model), texts[::-1])  # now with a warm cache


def test_a_text_that_is_not_str_or_not_utf8_is_refused(lid_model):
    predictor = Predictor(lid_model)
    with pytest.raises(TypeError, match="expected str"):
        predictor.predict_top([b"bytes"])
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8 (fastText refuses it too)
        predictor.predict_top(["ok", "bad \ud800 surrogate"])
    with pytest.raises(ModelError, match="no label '__label__zz'"):
        predictor.label_scores(["x"], "__label__zz")


# --- every kind of supervised model fastText trains ----------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, lid_model, sample_texts):
    """Small classifiers trained on the sample (labels: lid.176's), one per loss, n-gram setting
    and quantization, saved as fastText saves them."""
    import fasttext

    lid = _reference(lid_model)
    labels, _ = lid.predict([t.replace("\n", " ") for t in sample_texts], k=1)
    folder = tmp_path_factory.mktemp("ft-models")
    train = folder / "train.txt"
    train.write_text("".join(f"{l[0]} {t.replace(chr(10), ' ')}\n" for l, t in zip(labels, sample_texts)))
    # fastText quantizes an output matrix of 256 rows or more only: 300 labels (each line's
    # lid.176 label, a number with it, one line per sentence of the sample)
    many = folder / "many.txt"
    sentences = [s for t in sample_texts for s in t.split("\n") if len(s.split()) > 3]
    many.write_text("".join(f"{labels[i % len(labels)][0]}{i % 300} {s}\n" for i, s in enumerate(sentences)))
    models = {}
    for name, kw in {
        "hs": dict(loss="hs", minn=2, maxn=4),
        "softmax_bigrams": dict(loss="softmax", wordNgrams=2),
        "ova_trigrams": dict(loss="ova", wordNgrams=3, minn=3, maxn=5),
        "ns": dict(loss="ns", neg=3, minn=1, maxn=3),
        "hs_quantized": dict(loss="hs", minn=2, maxn=4),
        "softmax_bigrams_quantized": dict(loss="softmax", wordNgrams=2),
    }.items():
        data = many if name.endswith("quantized") else train
        model = fasttext.train_supervised(
            input=str(data), epoch=2, dim=24, bucket=50_000, thread=1, seed=1, verbose=0, **kw
        )
        if name.endswith("quantized"):  # norms, pruning (cutoff) and the output matrix quantized too
            model.quantize(input=str(data), qnorm=True, qout=True, cutoff=3000, retrain=False, dsub=2)
        models[name] = folder / f"{name}.{'ftz' if name.endswith('quantized') else 'bin'}"
        model.save_model(str(models[name]))
    return models


@pytest.mark.parametrize(
    "name", ["hs", "softmax_bigrams", "ova_trigrams", "ns", "hs_quantized", "softmax_bigrams_quantized"]
)
def test_every_loss_and_quantization_is_fasttext_s(trained, name, sample_texts):
    path = trained[name]
    predictor, reference = Predictor(path), _reference(path)
    texts = sample_texts[:200] + _hostile_texts(sample_texts)[:120]
    assert_same_top(predictor, reference, texts)
    for label in predictor.labels[:3]:
        assert_same_label_scores(predictor, reference, texts, label)
    f = read_model(path)
    assert (f.prune is not None) == name.endswith("quantized")


# --- damaged files -------------------------------------------------------------------------------


def test_cut_or_damaged_files_are_refused_with_the_section(tmp_path, lid_model):
    data = lid_model.read_bytes()
    for cut in (3, 50, 120, 40_000, 200_000, 600_000, 930_000, len(data) - 1):
        bad = tmp_path / f"cut{cut}.ftz"
        bad.write_bytes(data[:cut])
        with pytest.raises(FastTextFileError, match="ends at byte|inconsistent|magic"):
            read_model(bad)
    extra = tmp_path / "extra.ftz"
    extra.write_bytes(data + b"\0" * 7)
    with pytest.raises(FastTextFileError, match="7 unexpected bytes"):
        read_model(extra)
    # a dictionary header that asks for more labels than there are entries
    size_at = 8 + 12 * 4 + 8
    lying = bytearray(data)
    struct.pack_into("<i", lying, size_at + 8, 10_000)
    (tmp_path / "lying.ftz").write_bytes(bytes(lying))
    with pytest.raises(FastTextFileError, match="inconsistent dictionary header"):
        read_model(tmp_path / "lying.ftz")
