"""Reading a token directory: manifest checks, zero-copy token streams, document offsets.

    toks = open_tokens("runs/crawl/tokens")            # verify=True: sha256 of every shard now
    for shard in toks.shards("train"):
        shard.tokens    # numpy view (uint16/uint32) over the memory-mapped Arrow values buffer
        shard.offsets   # int64, len = documents + 1: document i is tokens[offsets[i]:offsets[i+1]]
    toks.decode(next(toks.documents("val")))

`verify="lazy"` checks a shard's sha256 the first time it is opened; `verify=False` trusts the
files. Document and token counts are always checked against the manifest when a shard opens (a
cheap check that catches truncation without hashing). `toks.check(split)` is the one check that
`tokens inspect`, `tokens export` and training run: the tokenizer (`check_tokenizer`: its sha256
and vocabulary as the manifest says), every shard opened, and every token id below the manifest's
vocabulary size: a shard written with another tokenizer passes its sha256 (the manifest was
written for it) but would index past the model's embedding.

Every file a manifest names must lie inside its directory (no absolute path, no `..` or symlink
leading out): a manifest is data, and must not make a reader open whatever file it names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa

from gristmill.tokenize.shards import FORMAT, VERSION, sha256_file


class TokenShardError(ValueError):
    """A token directory or shard that does not match its manifest; names the file."""


@dataclass
class Shard:
    path: Path
    split: str
    documents: int
    num_tokens: int
    table: pa.Table = field(repr=False)
    tokens: np.ndarray = field(repr=False)  # zero-copy view
    offsets: np.ndarray = field(repr=False)  # document boundaries, relative to `tokens`

    @property
    def ids(self) -> list[str]:
        return self.table.column("id").to_pylist()

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


class TokenDir:
    def __init__(self, root: Path, manifest: dict, verify: bool | Literal["lazy"]):
        self.root = root
        self.manifest = manifest
        self.verify_mode = verify
        self._verified: set[str] = set()
        self._open: dict[str, Shard] = {}
        self._tokenizer = None
        self._tokenizer_checked = False

    # --- manifest facts -------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest["dtype"])

    @property
    def eos_id(self) -> int:
        return self.manifest["tokenizer"]["eos_id"]

    @property
    def bos_id(self) -> int:
        return self.manifest["tokenizer"]["bos_id"]

    @property
    def vocab_size(self) -> int:
        return self.manifest["tokenizer"]["vocab_size"]

    @property
    def splits(self) -> list[str]:
        return [s for s, v in self.manifest["splits"].items() if v["shards"]]

    def entries(self, split: str | None = None) -> list[dict]:
        return [s for s in self.manifest["shards"] if split is None or s["split"] == split]

    # --- verification ---------------------------------------------------------------------
    def verify(self, split: str | None = None) -> None:
        """sha256 of every shard (of `split`) against the manifest; raises naming the first bad file."""
        for entry in self.entries(split):
            self._verify_entry(entry)

    def _verify_entry(self, entry: dict) -> None:
        path = self.root / entry["path"]
        if entry["path"] in self._verified:
            return
        if not path.is_file():
            raise TokenShardError(f"{path}: shard listed in manifest.json is missing")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise TokenShardError(
                f"{path}: sha256 {digest} does not match manifest.json ({entry['sha256']}):"
                " the shard is truncated, modified or from another run"
            )
        self._verified.add(entry["path"])

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.manifest["tokenizer"]["file"]

    def verify_tokenizer(self) -> None:
        """sha256 of the tokenizer file against the manifest: shards decode only with the tokenizer
        that wrote them, and a swapped file would not say so."""
        path, want = self.tokenizer_path, self.manifest["tokenizer"]["sha256"]
        if not path.is_file():
            raise TokenShardError(f"{path}: tokenizer listed in manifest.json is missing")
        digest = sha256_file(path)
        if digest != want:
            raise TokenShardError(
                f"{path}: sha256 {digest} does not match manifest.json ({want}): the tokenizer was"
                " replaced by another, or the manifest was written for another one"
            )

    def check_tokenizer(self) -> None:
        """The tokenizer as the manifest says: its sha256, and its vocabulary size (max id + 1, as
        the tokenize step computes it) equal to `tokenizer.vocab_size`. A manifest edited to a
        smaller vocabulary would build a model whose embedding cannot hold the tokenizer's ids.
        Loads the tokenizer once (well under a second for a 100k vocabulary)."""
        if self._tokenizer_checked:
            return
        self.verify_tokenizer()
        path = self.tokenizer_path
        try:
            ids = self.tokenizer().get_vocab(with_added_tokens=True).values()
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
            raise TokenShardError(f"{path}: not a tokenizers tokenizer.json: {str(e).splitlines()[0]}") from None
        size = max(ids) + 1 if ids else 0
        if size != self.vocab_size:
            raise TokenShardError(
                f"{self.root / 'manifest.json'}: tokenizer.vocab_size is {self.vocab_size}, but {path}"
                f" holds ids up to {size - 1} (vocabulary size {size}): the manifest was edited or"
                " written for another tokenizer"
            )
        self._tokenizer_checked = True

    # --- access ---------------------------------------------------------------------------
    def shard(self, entry: dict | str) -> Shard:
        if isinstance(entry, str):
            entry = next((e for e in self.manifest["shards"] if e["path"] == entry), None) or {"path": entry}
        name = entry["path"]
        if name in self._open:
            return self._open[name]
        if self.verify_mode == "lazy":
            self._verify_entry(entry)
        path = self.root / name
        if not path.is_file():
            raise TokenShardError(f"{path}: shard listed in manifest.json is missing")
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise TokenShardError(f"{path}: not a readable Arrow IPC file: {e}") from None
        kind = table.schema.field("tokens").type if "tokens" in table.schema.names else None
        if (
            kind is None
            or not (pa.types.is_large_list(kind) or pa.types.is_list(kind))
            or kind.value_type != pa.from_numpy_dtype(self.dtype)
        ):
            raise TokenShardError(
                f"{path}: expected a `tokens` column of large_list<{self.dtype}> (the dtype in"
                f" manifest.json), found {kind or 'no such column'}"
            )
        if table.num_rows and table.column("tokens").num_chunks != 1:
            table = table.combine_chunks()  # copies; gristmill writes one batch per shard
        col = table.column("tokens").chunk(0) if table.num_rows else None
        if col is None:
            tokens, offsets = np.zeros(0, dtype=self.dtype), np.zeros(1, dtype=np.int64)
        else:
            offsets = col.offsets.to_numpy()
            tokens = col.values.to_numpy(zero_copy_only=True)
            if offsets[0] != 0:
                tokens, offsets = tokens[offsets[0] :], offsets - offsets[0]
        if tokens.dtype != self.dtype:
            raise TokenShardError(f"{path}: tokens are {tokens.dtype}, manifest.json says {self.dtype}")
        if entry.get("documents") is not None and (
            table.num_rows != entry["documents"] or int(offsets[-1]) != entry["tokens"]
        ):
            raise TokenShardError(
                f"{path}: holds {table.num_rows} documents / {int(offsets[-1])} tokens,"
                f" manifest.json says {entry['documents']} / {entry['tokens']}"
            )
        shard = Shard(
            path, entry.get("split", "?"), table.num_rows, int(offsets[-1]), table, tokens[: offsets[-1]], offsets
        )
        self._open[name] = shard
        return shard

    def check(self, split: str | None = None) -> None:
        """The tokenizer (`check_tokenizer`), then every shard (of `split`) opened with the checks of
        `shard()` and every token id below `vocab_size`; raises TokenShardError naming the first bad
        file. One pass over the mapped values buffers (numpy max), nothing copied unless an id is
        out of range. The check of `tokens inspect`, `tokens export` and training alike."""
        self.check_tokenizer()
        for entry in self.entries(split):
            shard = self.shard(entry)
            if shard.num_tokens and int(shard.tokens.max()) >= self.vocab_size:
                pos = int(np.argmax(shard.tokens >= self.vocab_size))
                doc = int(np.searchsorted(shard.offsets, pos, side="right")) - 1
                raise TokenShardError(
                    f"{shard.path}: token id {int(shard.tokens[pos])} "
                    f"(document {doc}, token {pos - int(shard.offsets[doc])};"
                    f" largest id {int(shard.tokens.max())}) is not below the vocabulary size {self.vocab_size} of"
                    " manifest.json: the shard was written with another tokenizer, or is corrupt"
                )

    def shards(self, split: str = "train") -> list[Shard]:
        return [self.shard(e) for e in self.entries(split)]

    def stream(self, split: str = "train") -> Iterator[np.ndarray]:
        """The split's training token stream, one zero-copy array per shard, in manifest order."""
        for shard in self.shards(split):
            yield shard.tokens

    def documents(self, split: str = "train") -> Iterator[np.ndarray]:
        for shard in self.shards(split):
            for i in range(shard.documents):
                yield shard.document(i)

    def document_lengths(self, split: str | None = None) -> np.ndarray:
        parts = [np.diff(s.offsets) for e in self.entries(split) for s in [self.shard(e)]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def tokenizer(self):
        from tokenizers import Tokenizer

        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        return self._tokenizer

    def decode(self, ids) -> str:
        return self.tokenizer().decode(list(map(int, ids)), skip_special_tokens=False)


def resolve_dir(path: str | Path) -> Path:
    """A token directory, or a run directory holding `tokens/`."""
    path = Path(path)
    if not (path / "manifest.json").is_file() and (path / "tokens" / "manifest.json").is_file():
        path = path / "tokens"
    return path


def _inside(mf: Path, key: str, name: str) -> None:
    """`name` (a file the manifest names) is a relative path that stays inside the manifest's
    directory once resolved: no absolute path, and no `..` or symlink leading out of it."""
    root = mf.parent
    if Path(name).is_absolute():
        raise TokenShardError(
            f"{mf}: {key} {name!r} is an absolute path; a manifest names files inside its own directory"
        )
    top, target = root.resolve(), (root / name).resolve()
    if target == top or not target.is_relative_to(top):
        raise TokenShardError(
            f"{mf}: {key} {name!r} leads outside the token directory (to {target}); a manifest names"
            " files inside its own directory"
        )


def _check_manifest(mf: Path, m: dict) -> None:
    """The keys readers index, so that a damaged manifest is one message instead of a KeyError,
    and the files it names inside its directory."""

    def bad(key: str, expected: str):
        raise TokenShardError(f"{mf}: {key}: expected {expected}")

    tok = m.get("tokenizer")
    if not isinstance(tok, dict):
        bad("tokenizer", "an object")
    for key in ("vocab_size", "eos_id"):
        if not isinstance(tok.get(key), int) or isinstance(tok.get(key), bool) or tok[key] < 0:
            bad(f"tokenizer.{key}", "a non-negative integer")
    if m.get("dtype") not in ("uint16", "uint32"):
        bad("dtype", "uint16 or uint32")
    if not isinstance(tok.get("file"), str):
        bad("tokenizer.file", "a file name")
    if not isinstance(tok.get("sha256"), str):
        bad("tokenizer.sha256", "a hex string")
    _inside(mf, "tokenizer.file", tok["file"])
    splits = m.get("splits")
    if not isinstance(splits, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("shards"), int) for v in splits.values()
    ):
        bad("splits", "an object of split → {shards, documents, tokens}")
    shards = m.get("shards")
    if not isinstance(shards, list):
        bad("shards", "a list")
    for i, e in enumerate(shards):
        if not isinstance(e, dict) or not isinstance(e.get("path"), str) or not isinstance(e.get("split"), str):
            bad(f"shards[{i}]", "an object with `path` and `split`")
        for key in ("documents", "tokens"):
            if not isinstance(e.get(key), int):
                bad(f"shards[{i}].{key}", "an integer")
        if not isinstance(e.get("sha256"), str):
            bad(f"shards[{i}].sha256", "a hex string")
        _inside(mf, f"shards[{i}].path", e["path"])


def open_tokens(path: str | Path, verify: bool | Literal["lazy"] = True) -> TokenDir:
    root = resolve_dir(path)
    mf = root / "manifest.json"
    if not mf.is_file():
        raise TokenShardError(
            f"{mf}: not found (a token directory holds manifest.json; run `pipeline run` with a `tokenize` step)"
        )
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as e:
        raise TokenShardError(f"{mf}: not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        got = manifest if isinstance(manifest, dict) else {}
        raise TokenShardError(
            f"{mf}: format {got.get('format')!r} version {got.get('version')!r};"
            f" this reader reads {FORMAT!r} version {VERSION}"
        )
    _check_manifest(mf, manifest)
    tokdir = TokenDir(root, manifest, verify)
    if verify is True:
        tokdir.verify_tokenizer()
        tokdir.verify()
    return tokdir
