"""Loading and training the BPE tokenizer; every source ends as one HF `tokenizer.json`.

Sources: an HF `tokenizer.json`; GPT-2's `encoder.json` + `vocab.bpe` (a folder holding both);
a tiktoken ranks file (`*.tiktoken`, base64 token and rank per line). The last two are converted
to an HF tokenizer so the run keeps a single canonical file that any trainer or `tokenizers` user
can load; the fast encoder (`encode.py`) is rebuilt from that file, not from the source.

Training is a byte-level BPE (GPT-2's pre-tokenizer regex, no normalizer, so decode(encode(t)) == t
for every string) with the special tokens `<|endoftext|>`, `<|bos|>`, `<|pad|>` at ids 0, 1, 2.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gristmill.core import storage

EOS, BOS, PAD = "<|endoftext|>", "<|bos|>", "<|pad|>"
SPECIALS = [EOS, BOS, PAD]

# GPT-2's pre-tokenizer regex as HF's ByteLevel(use_regex=True) applies it.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# tiktoken files carry ranks only; the regex and special tokens of the published ones are these.
TIKTOKEN_KNOWN = {
    "r50k_base": (GPT2_PATTERN, {EOS: 50256}),
    "p50k_base": (GPT2_PATTERN, {EOS: 50256}),
    "cl100k_base": (
        CL100K_PATTERN,
        {
            EOS: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (O200K_PATTERN, {EOS: 199999, "<|endofprompt|>": 200018}),
}


class TokenizerError(ValueError):
    """A tokenizer file that cannot be loaded; the message names the file."""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- loading ------------------------------------------------------------------------------


def _byte_level_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]], pattern: str | None):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(vocab=vocab, merges=merges))
    if pattern is None or pattern == GPT2_PATTERN:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        from tokenizers import Regex

        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _load_gpt2(folder: Path):
    encoder, merges_file = folder / "encoder.json", folder / "vocab.bpe"
    try:
        vocab = json.loads(encoder.read_text(encoding="utf-8"))
        lines = merges_file.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{folder}: cannot read GPT-2 encoder.json/vocab.bpe: {e}") from None
    merges = []
    for n, line in enumerate(lines, 1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{merges_file}:{n}: expected two tokens per merge line, got {line!r}")
        merges.append((parts[0], parts[1]))
    tok = _byte_level_tokenizer(vocab, merges, None)
    specials = [t for t in vocab if t.startswith("<|") and t.endswith("|>")]
    tok.add_special_tokens(specials)
    return tok


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def _load_tiktoken(path: Path, pattern: str | None):
    ranks: dict[bytes, int] = {}
    try:
        for line in path.read_bytes().splitlines():
            if not line.strip():
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: not a tiktoken ranks file (base64 token, rank per line): {e}") from None
    known_pattern, specials = TIKTOKEN_KNOWN.get(path.stem.split(".")[0], (None, {}))
    pattern = pattern or known_pattern
    if pattern is None:
        raise TokenizerError(
            f"{path}: unknown tiktoken encoding; give its pre-tokenizer regex as tokenize.tokenizer.pattern"
        )
    if not specials:
        specials = {EOS: max(ranks.values()) + 1}
    # The merges a tiktoken file implies: each multi-byte token splits, by BPE over lower ranks,
    # into exactly the two parts that merge into it (as HF's TikTokenConverter does).
    b2u = bytes_to_unicode()
    to_str = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = _bpe_split(ranks, token, rank)
        if len(parts) != 2:
            raise TokenizerError(f"{path}: token of rank {rank} is not the merge of two lower-ranked tokens")
        merges.append((to_str(parts[0]), to_str(parts[1])))
    # Specials sit in the model vocabulary too, so HF keeps their published ids (an added token
    # not in the vocabulary is renumbered after it); no merge produces them.
    tok = _byte_level_tokenizer({**{to_str(t): r for t, r in ranks.items()}, **specials}, merges, pattern)
    tok.add_special_tokens(list(specials))
    return tok


def load(path: str | Path, pattern: str | None = None):
    """An HF `tokenizers.Tokenizer` from a tokenizer.json, a GPT-2 folder/file pair, or a tiktoken file."""
    from tokenizers import Tokenizer

    if storage.is_url(path):  # a file on a store: downloaded once per machine
        try:
            path = storage.cached_copy(str(path))
        except OSError as e:
            raise TokenizerError(str(e)) from None
    path = Path(storage.local_or_url(path))
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        elif (path / "encoder.json").is_file() and (path / "vocab.bpe").is_file():
            return _load_gpt2(path)
        else:
            raise TokenizerError(f"{path}: holds neither tokenizer.json nor encoder.json + vocab.bpe")
    if not path.is_file():
        raise TokenizerError(f"{path}: tokenizer file not found")
    if path.name in ("encoder.json", "vocab.bpe"):
        return _load_gpt2(path.parent)
    if path.suffix == ".tiktoken":
        return _load_tiktoken(path, pattern)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
        raise TokenizerError(f"{path}: not a tokenizers tokenizer.json: {e}") from None


# --- training -----------------------------------------------------------------------------


def train(texts: Iterable[str], vocab_size: int, min_frequency: int = 2, length: int | None = None):
    """A byte-level BPE trained on `texts` (in the given order), specials at ids 0-2.

    The same texts in the same order give the same tokenizer.json, byte for byte (tested across
    processes): the trainer breaks count ties by the pair's token ids, not hash order.
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=length)
    return tok


# --- what the manifest needs ----------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerInfo:
    vocab_size: int  # max id + 1: what the token dtype must hold
    eos_id: int
    bos_id: int
    pad_id: int | None


def special_ids(
    tok, eos_token: str = EOS, bos_token: str | None = BOS, pad_token: str | None = PAD, where: str = "tokenizer"
) -> TokenizerInfo:
    """Ids of the special tokens; bos falls back to eos when the tokenizer has no bos (GPT-2)."""
    eos = tok.token_to_id(eos_token)
    if eos is None:
        raise TokenizerError(f"{where}: has no eos token {eos_token!r}")
    bos = tok.token_to_id(bos_token) if bos_token else None
    pad = tok.token_to_id(pad_token) if pad_token else None
    ids = list(tok.get_vocab(with_added_tokens=True).values())
    return TokenizerInfo(vocab_size=max(ids) + 1, eos_id=eos, bos_id=eos if bos is None else bos, pad_id=pad)
