"""fastText supervised models (lid.176, quality classifiers) predicted by gristmill's own C code.

`langid` and `quality` score every page with a fastText classifier; fastText's `predict` builds
a string and a hash-map lookup per character n-gram of every word, every time the word occurs,
which made language ID as slow as datatrove's (the same model, the same C++). The predictor in
`gristmill/native/fasttext_predict.c` computes a word's input rows once and keeps them in a
cache, and otherwise does what fastText does, in the same order with the same float arithmetic,
so its labels and probabilities are fastText's bit for bit (tested against the fasttext module
on the real sample and on generated text: tests/filters/test_fasttext_native.py).

This module reads the model file (the layout `model_check.fasttext_layout` walks), decodes
quantized matrices (.ftz: product-quantized rows, optionally scaled by a quantized norm) into
plain float32 rows exactly as fastText adds them up, and hands the arrays to the C predictor.

What the text must be: one line, as fastText's Python API wants it; the callers replace newlines
with spaces (the predictor treats a newline as a space, so an unreplaced one changes nothing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gristmill.filters.model_check import FASTTEXT_MAGIC, Checked, ModelError, check_fasttext, unchanged

#: the word cache's size (its table and arenas; emptied when full, which only costs speed):
#: lid.176 holds ~94k distinct words of the shared sample in ~25 MB
CACHE_BYTES = 64 << 20
#: bytes of a line's work per character of text: its UTF-8 copy (up to 4) and the rows of its
#: words (lid.176: ~20 rows of 4 bytes per word of ~6 characters)
LINE_BYTES_PER_CHAR = 24
_LOSSES = {1: "hs", 2: "ns", 3: "softmax", 4: "ova"}
_SUPERVISED = 3
_KSUB = 256


@dataclass
class ModelFile:
    """A fastText model file's parts, matrices decoded to float32 rows."""

    dim: int
    minn: int
    maxn: int
    word_ngrams: int
    bucket: int
    loss: int
    words: list[bytes]  # the dictionary's entries, words then labels, in the file's order
    types: bytes  # 0 word, 1 label, per entry
    counts: np.ndarray  # int64 per entry
    prune_size: int
    prune: np.ndarray | None  # int32 (prune_size, 2): an n-gram's bucket and its row among the kept ones
    input: np.ndarray  # float32 (rows, dim)
    input_from_zero: bool  # quantized: fastText sums rows from zero; dense: from the first row
    output: np.ndarray  # float32 (rows, dim)
    output_scale: np.ndarray | None  # float32 per output row (quantized output with norms)

    @property
    def labels(self) -> list[str]:
        return [w.decode("utf-8", "replace") for w, t in zip(self.words, self.types) if t == 1]


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.path, self.pos = data, path, 0

    def unpack(self, fmt: str, section: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ModelError(f"{self.path}: the file ends inside the {section}")
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return out

    def array(self, dtype, count: int, section: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if count < 0 or self.pos + size > len(self.data):
            raise ModelError(f"{self.path}: the file ends inside the {section}")
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.pos)
        self.pos += size
        return out


def _quantizer(r: _Reader, section: str) -> tuple[int, int, int, int, np.ndarray]:
    dim, nsubq, dsub, lastdsub = r.unpack("<iiii", section)
    if dim <= 0 or nsubq <= 0 or dsub <= 0 or lastdsub <= 0 or (nsubq - 1) * dsub + lastdsub != dim:
        raise ModelError(f"{r.path}: impossible {section} ({dim}, {nsubq}, {dsub}, {lastdsub})")
    return dim, nsubq, dsub, lastdsub, r.array("<f4", dim * _KSUB, section)


def _pieces(codes: np.ndarray, pq) -> np.ndarray:
    """The centroid pieces of each row (ProductQuantizer::get_centroids), concatenated."""
    dim, nsubq, dsub, lastdsub, centroids = pq
    rows = codes.shape[0]
    out = np.empty((rows, dim), dtype=np.float32)
    for m in range(nsubq):
        d = lastdsub if m == nsubq - 1 else dsub
        table = centroids[m * _KSUB * dsub : m * _KSUB * dsub + _KSUB * d].reshape(_KSUB, d)
        out[:, m * dsub : m * dsub + d] = table[codes[:, m]]
    return out


def _matrix(r: _Reader, quantized: bool, name: str, dim: int, scaled_rows: bool):
    """(rows as float32, per-row scale or None). Quantized input rows are decoded with their
    norm multiplied in (fastText adds `norm * centroid`); a quantized output keeps the norm as a
    scale (fastText multiplies the dot product by it)."""
    if not quantized:
        m, n = r.unpack("<qq", name)
        if m < 0 or n != dim:
            raise ModelError(f"{r.path}: impossible {name} shape {m} x {n}")
        return r.array("<f4", m * n, name).reshape(m, n), None
    qnorm, m, n, codesize = r.unpack("<?qqi", name)
    if m < 0 or n != dim:
        raise ModelError(f"{r.path}: impossible quantized {name} shape {m} x {n}")
    codes = r.array(np.uint8, codesize, name)
    pq = _quantizer(r, f"{name} quantizer")
    if pq[0] != dim or codesize != m * pq[1]:
        raise ModelError(f"{r.path}: the {name}'s quantizer does not fit its {m} x {n} shape")
    rows = _pieces(codes.reshape(m, pq[1]), pq)
    scale = None
    if qnorm:
        norm_codes = r.array(np.uint8, m, f"{name} norm codes")
        npq = _quantizer(r, f"{name} norm quantizer")
        scale = _pieces(norm_codes.reshape(m, 1), npq)[:, 0] if npq[1] == 1 else None
        if scale is None:
            raise ModelError(f"{r.path}: the {name}'s norm quantizer has {npq[1]} sub-quantizers, not 1")
        if not scaled_rows:
            rows = rows * scale[:, None]  # float32 products, as fastText's `alpha * c[n]`
            scale = None
    return rows, scale


def read_model(path: str | Path) -> ModelFile:
    """Parse a fastText .bin/.ftz file; raises ModelError naming what is wrong."""
    path = Path(path)
    data = path.read_bytes()
    r = _Reader(data, path)
    magic, version = r.unpack("<ii", "header")
    if magic != FASTTEXT_MAGIC or version not in (11, 12):
        raise ModelError(f"{path}: not a fastText model of file format 11 or 12")
    dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_rate = r.unpack(
        "<12i", "header"
    )
    r.unpack("<d", "header")
    if model != _SUPERVISED:
        raise ModelError(f"{path}: not a supervised fastText model (a classifier is needed)")
    if loss not in _LOSSES:
        raise ModelError(f"{path}: unknown fastText loss {loss}")
    if version == 11:
        maxn = 0  # fastText: old supervised models have no character n-grams
    size, nwords, nlabels, _ntokens, prune_size = r.unpack("<iiiqq", "dictionary")
    if size < 0 or nwords < 0 or nlabels <= 0 or nwords + nlabels != size or prune_size < -1:
        raise ModelError(f"{path}: inconsistent dictionary header ({size} entries, {nwords} words, {nlabels} labels)")
    words, counts, types = [], np.empty(size, dtype=np.int64), bytearray(size)
    for i in range(size):
        end = data.find(b"\0", r.pos)
        if end < 0:
            raise ModelError(f"{path}: the file ends inside the dictionary")
        words.append(data[r.pos : end])
        r.pos = end + 1
        counts[i], types[i] = r.unpack("<qb", "dictionary")
    if sum(t == 0 for t in types) != nwords or any(t not in (0, 1) for t in types):
        raise ModelError(f"{path}: the dictionary's entry types do not match its header")
    prune = None
    if prune_size > 0:
        pairs = r.array("<i4", 2 * prune_size, "dictionary's pruning index").reshape(prune_size, 2)
        if (pairs[:, 0] < 0).any() or (pairs[:, 0] >= bucket).any():
            raise ModelError(f"{path}: the pruning index names n-grams outside the {bucket} buckets")
        prune = np.ascontiguousarray(pairs)
    (quant_input,) = r.unpack("<?", "input matrix")
    inp, _ = _matrix(r, quant_input, "input matrix", dim, scaled_rows=False)
    (qout,) = r.unpack("<?", "output matrix")
    out, scale = _matrix(r, quant_input and qout, "output matrix", dim, scaled_rows=True)
    if r.pos != len(data):
        raise ModelError(f"{path}: {len(data) - r.pos:,} unexpected bytes after the output matrix")
    # every row a word can name must exist (the C code reads them unchecked)
    if bucket <= 0 and (maxn > 0 or word_ngrams > 1):
        raise ModelError(f"{path}: n-grams hashed into {bucket} buckets")
    if prune is not None and (pairs[:, 1] < 0).any():
        raise ModelError(f"{path}: the pruning index maps n-grams to negative rows")
    if prune_size == -1:
        needed = nwords + bucket
    elif prune is not None:
        needed = nwords + int(prune[:, 1].max()) + 1
    else:
        needed = nwords
    if inp.shape[0] < needed:
        raise ModelError(f"{path}: the input matrix has {inp.shape[0]} rows, its dictionary names {needed}")
    return ModelFile(
        dim=dim,
        minn=minn,
        maxn=maxn,
        word_ngrams=word_ngrams,
        bucket=bucket,
        loss=loss,
        words=words,
        types=bytes(types),
        counts=counts,
        prune_size=prune_size,
        prune=prune,
        input=np.ascontiguousarray(inp, dtype=np.float32),
        input_from_zero=quant_input,
        output=np.ascontiguousarray(out, dtype=np.float32),
        output_scale=scale,
    )


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

        f = read_model(path)
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
