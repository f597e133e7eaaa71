"""fastText's model file (.bin, .ftz), read and checked whole, for gristmill's own predictor.

`read_model(path)` parses everything fastText's `loadModel` reads (header, dictionary with its
pruning index, input and output matrices, dense or product-quantized with optional norms) and
checks it as fastText never does: every size against the file's length, every row a word or
n-gram can name against the input matrix, the output matrix against the labels, no byte left
over. A file that passes cannot make the C predictor (`gristmill/native/fasttext_predict.c`) read
out of bounds; one that fails raises `FastTextFileError` saying where (`model_check` words it for
the user: "truncated or corrupt fastText model (...)"). Quantized rows are decoded into float32
exactly as fastText adds them up (`norm * centroid`, a float product).

The layout, from fastText 0.9's sources (fasttext.cc `loadModel`, args.cc, dictionary.cc,
densematrix.cc, quantmatrix.cc, productquantizer.cc): int32 magic 793712314 and version (11 or
12); 12 int32 args and a double; the dictionary (int32 size, nwords, nlabels; int64 ntokens,
pruneidx_size; per entry a NUL-terminated word, int64 count, int8 type; pruneidx_size pairs of
int32); bool quantized input; the input matrix; bool quantized output; the output matrix.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: fastText's FASTTEXT_FILEFORMAT_MAGIC_INT32
FASTTEXT_MAGIC = 793712314


class FastTextFileError(ValueError):
    """The file is not a fastText model this reader can use; the message says why."""


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
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def _ends(self, need: int, section: str) -> str:
        return (
            f"the file ends at byte {len(self.data):,}, inside the {section},"
            f" which needs at least {self.pos + max(need, 0):,} bytes"
        )

    def unpack(self, fmt: str, section: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise FastTextFileError(self._ends(size, section))
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return out

    def array(self, dtype, count: int, section: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if count < 0 or self.pos + size > len(self.data):
            raise FastTextFileError(self._ends(size, section))
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.pos)
        self.pos += size
        return out


def _quantizer(r: _Reader, section: str) -> tuple[int, int, int, int, np.ndarray]:
    dim, nsubq, dsub, lastdsub = r.unpack("<iiii", section)
    if dim <= 0 or nsubq <= 0 or dsub <= 0 or lastdsub <= 0 or (nsubq - 1) * dsub + lastdsub != dim:
        raise FastTextFileError(f"impossible {section} ({dim}, {nsubq}, {dsub}, {lastdsub})")
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
            raise FastTextFileError(f"impossible {name} shape {m} x {n}")
        return r.array("<f4", m * n, name).reshape(m, n), None
    qnorm, m, n, codesize = r.unpack("<?qqi", name)
    if m < 0 or n != dim:
        raise FastTextFileError(f"impossible quantized {name} shape {m} x {n}")
    codes = r.array(np.uint8, codesize, name)
    pq = _quantizer(r, f"{name} quantizer")
    if pq[0] != dim or codesize != m * pq[1]:
        raise FastTextFileError(f"the {name}'s quantizer does not fit its {m} x {n} shape")
    rows = _pieces(codes.reshape(m, pq[1]), pq)
    scale = None
    if qnorm:
        norm_codes = r.array(np.uint8, m, f"{name} norm codes")
        npq = _quantizer(r, f"{name} norm quantizer")
        scale = _pieces(norm_codes.reshape(m, 1), npq)[:, 0] if npq[1] == 1 else None
        if scale is None:
            raise FastTextFileError(f"the {name}'s norm quantizer has {npq[1]} sub-quantizers, not 1")
        if not scaled_rows:
            rows = rows * scale[:, None]  # float32 products, as fastText's `alpha * c[n]`
            scale = None
    return rows, scale


def read_model(path: str | Path) -> ModelFile:
    """Parse a fastText .bin/.ftz file; raises FastTextFileError saying what is wrong (where the
    file ends, which section is impossible)."""
    path = Path(path)
    data = path.read_bytes()
    r = _Reader(data)
    magic, version = r.unpack("<ii", "header")
    if magic != FASTTEXT_MAGIC:
        raise FastTextFileError("bad magic number: not a fastText model")
    if version not in (11, 12):
        raise FastTextFileError(f"fastText file format version {version}; this reader reads 11 and 12")
    dim, _ws, _epoch, _min_count, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr_rate = r.unpack(
        "<12i", "header"
    )
    r.unpack("<d", "header")
    if dim <= 0:
        raise FastTextFileError(f"impossible vector dimension {dim} in the header")
    if model != _SUPERVISED:
        raise FastTextFileError("not a supervised fastText model (a classifier is needed)")
    if loss not in _LOSSES:
        raise FastTextFileError(f"unknown fastText loss {loss}")
    if version == 11:
        maxn = 0  # fastText: old supervised models have no character n-grams
    size, nwords, nlabels, _ntokens, prune_size = r.unpack("<iiiqq", "dictionary")
    if size < 0 or nwords < 0 or nlabels <= 0 or nwords + nlabels != size or prune_size < -1:
        raise FastTextFileError(f"inconsistent dictionary header ({size} entries, {nwords} words, {nlabels} labels)")
    words, counts, types = [], np.empty(size, dtype=np.int64), bytearray(size)
    for i in range(size):
        end = data.find(b"\0", r.pos)
        if end < 0:
            raise FastTextFileError(r._ends(len(data) + 1 - r.pos, "dictionary"))
        words.append(data[r.pos : end])
        r.pos = end + 1
        counts[i], types[i] = r.unpack("<qb", "dictionary")
    if sum(t == 0 for t in types) != nwords or any(t not in (0, 1) for t in types):
        raise FastTextFileError("the dictionary's entry types do not match its header")
    prune = None
    if prune_size > 0:
        pairs = r.array("<i4", 2 * prune_size, "dictionary's pruning index").reshape(prune_size, 2)
        if (pairs[:, 0] < 0).any() or (pairs[:, 0] >= bucket).any():
            raise FastTextFileError(f"the pruning index names n-grams outside the {bucket} buckets")
        prune = np.ascontiguousarray(pairs)
    (quant_input,) = r.unpack("<?", "input matrix")
    inp, _ = _matrix(r, quant_input, "input matrix", dim, scaled_rows=False)
    (qout,) = r.unpack("<?", "output matrix")
    out, scale = _matrix(r, quant_input and qout, "output matrix", dim, scaled_rows=True)
    if r.pos != len(data):
        raise FastTextFileError(f"{len(data) - r.pos:,} unexpected bytes after the output matrix")
    # every row a word can name must exist (the C code reads them unchecked)
    if bucket <= 0 and (maxn > 0 or word_ngrams > 1):
        raise FastTextFileError(f"n-grams hashed into {bucket} buckets")
    if prune is not None and (pairs[:, 1] < 0).any():
        raise FastTextFileError("the pruning index maps n-grams to negative rows")
    if prune_size == -1:
        needed = nwords + bucket
    elif prune is not None:
        needed = nwords + int(prune[:, 1].max()) + 1
    else:
        needed = nwords
    if inp.shape[0] < needed:
        raise FastTextFileError(f"the input matrix has {inp.shape[0]} rows, its dictionary names {needed}")
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
