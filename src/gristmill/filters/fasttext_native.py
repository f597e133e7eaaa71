"""fastText supervised models (lid.176, quality classifiers) predicted by gristmill's own C code.

`langid` and `quality` score every page with a fastText classifier; fastText's `predict` builds
a string and a hash-map lookup per character n-gram of every word, every time the word occurs,
which made language ID as slow as datatrove's (the same model, the same C++). The predictor in
`gristmill/native/fasttext_predict.c` computes a word's input rows once and keeps them in a
cache, and otherwise does what fastText does, in the same order with the same float arithmetic,
so its labels and probabilities are fastText's bit for bit (tested against the fasttext module
on the real sample and on generated text: tests/filters/test_fasttext_native.py).

This module hands the C predictor the model file's arrays as `fasttext_file.read_model` reads
and checks them (quantized matrices decoded into plain float32 rows exactly as fastText adds
them up).

What the text must be: one line, as fastText's Python API wants it; the callers replace newlines
with spaces (the predictor treats a newline as a space, so an unreplaced one changes nothing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gristmill.filters.fasttext_file import read_model
from gristmill.filters.model_check import Checked, ModelError, check_fasttext, unchanged

#: the word cache's size (its table and arenas; emptied when full, which only costs speed):
#: lid.176 holds ~94k distinct words of the shared sample in ~25 MB
CACHE_BYTES = 64 << 20
#: bytes of a line's work per character of text: its UTF-8 copy (up to 4) and the rows of its
#: words (lid.176: ~20 rows of 4 bytes per word of ~6 characters)
LINE_BYTES_PER_CHAR = 24


class Predictor:
    """Predictions of a fastText classifier, fastText's to the bit.

    `predict_top(texts)` -> (labels, scores) as fastText's `predict(texts, k=1)` gives them
    (label None and score 0.0 where it gives none); `label_scores(texts, label)` -> the
    probability `predict(texts, k=-1)` reports for `label`."""

    def __init__(self, path: str | Path, cache_bytes: int = CACHE_BYTES):
        try:
            from gristmill.native import _fasttext
        except ImportError as e:
            raise ImportError(
                f"gristmill's C extension is not built ({e}): install the project (`make setup`, or"
                " `pip install -e .`), which compiles src/gristmill/native/"
            ) from None

        f = read_model(path)  # a damaged file: FastTextFileError (model_check has refused it before)
        self.path = str(path)
        self.labels = f.labels
        self._label_index = {label: i for i, label in enumerate(self.labels)}
        self._native = _fasttext.Predictor(
            dim=f.dim,
            minn=f.minn,
            maxn=f.maxn,
            word_ngrams=f.word_ngrams,
            bucket=f.bucket,
            loss=f.loss,
            words=b"\0".join(f.words) + b"\0",
            types=f.types,
            counts=np.ascontiguousarray(f.counts[np.frombuffer(f.types, np.uint8) == 1]),
            prune_size=f.prune_size,
            prune=f.prune,
            input=f.input,
            input_rows=f.input.shape[0],
            input_from_zero=f.input_from_zero,
            output=f.output,
            output_rows=f.output.shape[0],
            output_scale=f.output_scale,
            cache_bytes=cache_bytes,
        )

    def predict_top(self, texts: list[str]) -> tuple[list[str | None], list[float]]:
        indices, scores = self._native.predict_top(texts)
        labels = self.labels
        return [labels[i] if i >= 0 else None for i in indices], scores

    def label_scores(self, texts: list[str], label: str) -> list[float]:
        try:
            index = self._label_index[label]
        except KeyError:
            raise ModelError(f"{self.path}: no label {label!r} (it has {self.labels})") from None
        return self._native.predict_label(texts, index)

    def rows(self, text: str) -> list[int]:
        """The input rows fastText sums for `text` (its `get_line` ids, with n-grams)."""
        return self._native.rows(text)

    def cache_stats(self) -> dict:
        return self._native.cache_stats()


def load_classifier(path: str | Path | Checked) -> Predictor:
    """The predictor of a fastText classifier validated by `check_fasttext` (validated now if
    given a path), refusing a file changed since."""
    checked = path if isinstance(path, Checked) else check_fasttext(path)
    return Predictor(unchanged(checked))


def memory_bytes(checked: Checked, max_chars: int) -> int:
    """What a loaded predictor holds: the file while it is read, its matrices as float32, the
    word cache, and the work of a text of `max_chars` characters."""
    info = checked.info
    matrices = 4 * info["dim"] * (info["input_rows"] + info["output_rows"])
    return checked.size + matrices + CACHE_BYTES + LINE_BYTES_PER_CHAR * max_chars
