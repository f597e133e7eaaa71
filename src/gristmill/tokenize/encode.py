"""Batched, multi-threaded encoding: tiktoken where it provably gives HF's ids, else HF tokenizers.

A plain byte-level BPE (BPE model without dropout, affixes or byte fallback; no normalizer; GPT-2's
ByteLevel regex or a Split regex + ByteLevel pre-tokenizer; no non-special added tokens) is the
same function tiktoken computes from `mergeable_ranks` (token bytes → id) and the same regex.
tiktoken is ~4× faster per core. Whether the two agree is checked on real documents before
tiktoken is used (`compare`); the planner's tokenizer stage makes that choice once per run, so
every encode task uses the same engine.

Document text is always encoded as ordinary text: a literal `<|endoftext|>` inside a web page
becomes ordinary tokens, never the EOS id (HF: `encode_special_tokens = True`; tiktoken:
`encode_ordinary_batch`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gristmill.tokenize.tokenizer import GPT2_PATTERN, unicode_to_bytes

#: texts this long (characters) or longer are encoded alone into numpy arrays (tiktoken)
LONG_CHARS = 1 << 20


@dataclass
class FastPath:
    encoding: object | None  # tiktoken.Encoding
    reason: str  # why not, when encoding is None


def tiktoken_from_hf(tok, name: str = "gristmill") -> FastPath:
    """A tiktoken Encoding equivalent to `tok` when it is a plain byte-level BPE."""
    spec = json.loads(tok.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return FastPath(None, f"model is {model.get('type')}, not BPE")
    if (
        model.get("dropout")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or model.get("byte_fallback")
    ):
        return FastPath(None, "BPE with dropout, subword affixes or byte fallback")
    if spec.get("normalizer"):
        return FastPath(None, f"has a normalizer ({spec['normalizer'].get('type')})")
    pre = spec.get("pre_tokenizer") or {}
    pattern = None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        pattern = GPT2_PATTERN
    elif pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers", [])
        if (
            len(parts) == 2
            and parts[0].get("type") == "Split"
            and "Regex" in parts[0].get("pattern", {})
            and parts[0].get("behavior") == "Isolated"
            and not parts[0].get("invert")
            and parts[1].get("type") == "ByteLevel"
            and not parts[1].get("use_regex", True)
            and not parts[1].get("add_prefix_space")
        ):
            pattern = parts[0]["pattern"]["Regex"]
    if pattern is None:
        return FastPath(None, "pre-tokenizer is not byte-level with a regex tiktoken can run")
    added = spec.get("added_tokens", [])
    if any(not a.get("special") for a in added):
        return FastPath(None, "has non-special added tokens (HF matches them inside text)")
    specials = {a["content"]: a["id"] for a in added}
    u2b = unicode_to_bytes()
    ranks: dict[bytes, int] = {}
    for token, i in model.get("vocab", {}).items():
        if token in specials:
            continue
        try:
            ranks[bytes(u2b[c] for c in token)] = i
        except KeyError:
            return FastPath(None, f"vocabulary entry {token!r} is not byte-level")
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        return FastPath(None, "vocabulary lacks a byte or repeats an id")
    import tiktoken

    try:
        enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except Exception as e:  # noqa: BLE001 - a regex fancy-regex rejects, a rank clash
        return FastPath(None, f"tiktoken refused it: {e}")
    return FastPath(enc, "")


def hf_encode_batch(tok, texts: Sequence[str]) -> list[list[int]]:
    tok.encode_special_tokens = True
    fast = getattr(tok, "encode_batch_fast", None) or tok.encode_batch  # no offsets: faster
    return [e.ids for e in fast(list(texts), add_special_tokens=False)]


#: bytes HF's encodings (ids, tokens, offsets, masks) and their ids as Python lists hold per byte
#: of text: measured 44 on a batch of 256 web pages, 133 on one 5 MB page (4 bytes a character),
#: 150 on the engine check's 1 MiB batches of 2 MB pages' heads
HF_BYTES_PER_BYTE = 160
#: bytes of text (UTF-8) `compare` encodes with both engines at a time
COMPARE_BATCH_BYTES = 1 << 20


def compare(
    tok, encoding, texts: Sequence[str], batch: int = 256, max_bytes: int = COMPARE_BATCH_BYTES
) -> tuple[int, int | None]:
    """(documents compared, index of the first whose ids differ or None). Batches of `batch`
    texts and at most `max_bytes` of UTF-8, a longer text alone (HF holds `HF_BYTES_PER_BYTE`
    per byte); each text is read from `texts` when its batch is made."""
    start, n = 0, len(texts)
    while start < n:
        chunk, held = [], 0
        while start + len(chunk) < n and len(chunk) < batch:
            text = texts[start + len(chunk)]
            size = len(text.encode("utf-8"))
            if chunk and held + size > max_bytes:
                break  # read again for the next batch
            chunk.append(text)
            held += size
        del text
        hf = hf_encode_batch(tok, chunk)
        tk = encoding.encode_ordinary_batch(chunk, num_threads=1)
        for i, (a, b) in enumerate(zip(hf, tk)):
            if a != b:
                return n, start + i
        start += len(chunk)
        del chunk, hf, tk
    return n, None


class Encoder:
    """Encodes batches of texts with the engine chosen for the run (`"tiktoken"` or `"hf"`)."""

    def __init__(self, tok, engine: str = "hf", threads: int = 1):
        self.tok = tok
        self.threads = max(1, threads)
        self.engine = engine
        self.encoding = None
        if engine == "tiktoken":
            fast = tiktoken_from_hf(tok)
            if fast.encoding is None:
                raise ValueError(f"tiktoken engine requested but unusable: {fast.reason}")
            self.encoding = fast.encoding

    @classmethod
    def from_file(cls, path: str | Path, engine: str = "hf", threads: int = 1) -> Encoder:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), engine, threads)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int] | np.ndarray]:
        """Each text's ids. With tiktoken, a text of `LONG_CHARS` or more is encoded alone into
        a numpy array (4 bytes a token; a Python list of a 30 MB page's ~7M ids holds ~36 bytes
        a token): the same ids (ordinary text, no special token recognised)."""
        if self.encoding is None:
            return hf_encode_batch(self.tok, texts)
        long = [i for i, t in enumerate(texts) if len(t) >= LONG_CHARS]
        if not long:
            return self.encoding.encode_ordinary_batch(list(texts), num_threads=self.threads)
        out: list = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) < LONG_CHARS]
        encoded = self.encoding.encode_ordinary_batch([texts[i] for i in short], num_threads=self.threads)
        for i, ids in zip(short, encoded):
            out[i] = ids
        for i in long:
            out[i] = self.encoding.encode_to_numpy(texts[i], allowed_special=set(), disallowed_special=())
        return out

    def decode(self, ids) -> str:
        return self.tok.decode(list(map(int, ids)), skip_special_tokens=False)
