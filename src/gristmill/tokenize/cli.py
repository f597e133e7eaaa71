"""`pipeline tokenizer train`, `pipeline tokens inspect`, `pipeline tokens export`."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from gristmill.core import storage
from gristmill.core.configlib import ConfigError
from gristmill.core.files import temporary_path


def _documents(inputs: list[str]):
    """Documents from Parquet files/folders (`text`, `id` columns) or plain text files (one each)."""
    import pyarrow.parquet as pq

    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files = sorted(path.rglob("*.parquet"), key=lambda p: (p.name, str(p)))
            if not files:
                raise ConfigError(f"{path}: no .parquet files in this folder")
        elif path.is_file():
            files = [path]
        else:
            raise ConfigError(f"{path}: no such file or folder")
        for f in files:
            if f.suffix == ".parquet":
                pf = pq.ParquetFile(f)
                for i in range(pf.num_row_groups):
                    t = pf.read_row_group(i, columns=[c for c in ("text", "id") if c in pf.schema_arrow.names])
                    ids = t.column("id").to_pylist() if "id" in t.column_names else [None] * t.num_rows
                    for n, (text, doc_id) in enumerate(zip(t.column("text").to_pylist(), ids)):
                        yield SimpleNamespace(text=text, id=doc_id or f"{f}:{i}:{n}")
            else:
                yield SimpleNamespace(text=f.read_text(encoding="utf-8", errors="replace"), id=str(f))


def cmd_tokenizer_train(args, console: Console) -> int:
    from gristmill.tokenize import tokenizer
    from gristmill.tokenize.stages import hash_sample

    t0 = time.perf_counter()
    sample = hash_sample(_documents(args.inputs), args.sample_bytes)
    if not sample:
        raise ConfigError("no documents in the inputs")
    with console.status(f"training a byte-level BPE of {args.vocab_size} on {len(sample):,} documents"):
        tok = tokenizer.train(sample, args.vocab_size, args.min_frequency, length=len(sample))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tok.to_str(pretty=True))
    mb = sum(len(t.encode("utf-8")) for t in sample) / 1e6
    console.print(
        f"[bold green]done[/] {out}: vocab {tok.get_vocab_size()}, trained on {len(sample):,} documents"
        f" ({mb:.1f} MB) in {time.perf_counter() - t0:.1f} s, sha256 {tokenizer.sha256_file(out)[:16]}"
    )
    return 0


def _histogram(lengths) -> Table:
    """A table of `lengths` (a numpy array) in powers-of-two bins."""
    import numpy as np

    table = Table(title="document lengths (tokens, incl. EOS)")
    for col, just in (("tokens", "right"), ("documents", "right"), ("", "left")):
        table.add_column(col, justify=just)
    if len(lengths) == 0:
        return table
    top = int(np.ceil(np.log2(max(int(lengths.max()), 2))))
    edges = [0] + [2**k for k in range(1, top + 1)]
    counts = [int(((lengths > lo) & (lengths <= hi)).sum()) for lo, hi in zip(edges, edges[1:])]
    peak = max(counts) or 1
    for lo, hi, n in zip(edges, edges[1:], counts):
        if n or lo >= 8:
            table.add_row(f"{lo + 1}–{hi}", f"{n:,}", "█" * round(40 * n / peak))
    return table


def local_tokens(given: str) -> str | Path:
    """A token directory given as a URL (`s3://bucket/run` or `.../run/tokens`), copied to local
    scratch: the shards are memory-mapped. Files already there at the manifest's size are kept
    (the shards' sha256 in the manifest is checked when they are read); others are fetched."""
    import json

    if not storage.is_url(given):
        return given
    root = next(
        (
            r
            for r in (given.rstrip("/"), storage.join(given, "tokens"))
            if storage.exists(storage.join(r, "manifest.json"))
        ),
        None,
    )
    if root is None:
        raise ConfigError(f"{given}: no manifest.json in it or in its tokens/ (a token directory or a run directory)")
    manifest = json.loads(storage.read_bytes(storage.join(root, "manifest.json")))
    names = ["manifest.json", manifest.get("tokenizer", {}).get("file", "tokenizer.json")]
    names += [s["path"] for s in manifest.get("shards", [])]
    local = storage.scratch_root() / "tokens" / hashlib.sha256(root.encode()).hexdigest()[:16]
    fs, remote = storage.filesystem(root)
    with storage.errors(root, "listing the token directory"):
        sizes = {k.rsplit("/", 1)[-1]: int(v.get("size") or 0) for k, v in fs.find(remote, detail=True).items()}
    wanted = [n for n in names if not (local / n).is_file() or (local / n).stat().st_size != sizes.get(n, -1)]
    local.mkdir(parents=True, exist_ok=True)
    if wanted:
        with storage.errors(root, f"copying {len(wanted)} files of the token directory to {local}"):
            fs.get([f"{remote.rstrip('/')}/{n}" for n in wanted], [str(local / n) for n in wanted])
    return local


def _some_shards(toks, what: str) -> None:
    """A manifest that names no shard (no documents reached tokenization) has nothing to show or
    export: one line, not the first read of a shard that is not there."""
    from gristmill.tokenize.reader import TokenShardError

    if not toks.manifest["shards"] or not toks.splits:
        raise TokenShardError(
            f"{toks.root / 'manifest.json'}: no shards in any split (no documents were tokenized): nothing to {what}"
        )


def cmd_tokens_inspect(args, console: Console) -> int:
    from gristmill.tokenize.reader import open_tokens

    toks = open_tokens(local_tokens(args.dir), verify=True if args.verify else False)
    _some_shards(toks, "inspect")
    if args.split and args.split not in toks.splits:
        raise ConfigError(
            f"--split {args.split}: {toks.root / 'manifest.json'} has no shards of this split"
            f" (it has: {', '.join(toks.splits)})"
        )
    toks.check()  # every shard opens as the manifest says and every id is in the vocabulary, or one error line
    out = Console()
    m = toks.manifest
    t = Table(title=f"token shards: {toks.root}")
    for col in ("split", "shards", "documents", "tokens", "tokens/doc"):
        t.add_column(col, justify="left" if col == "split" else "right")
    for split, s in m["splits"].items():
        t.add_row(
            split,
            f"{s['shards']:,}",
            f"{s['documents']:,}",
            f"{s['tokens']:,}",
            f"{s['tokens'] / s['documents']:.0f}" if s["documents"] else "-",
        )
    tot = m["totals"]
    t.add_row(
        "all",
        f"{len(m['shards']):,}",
        f"{tot['documents']:,}",
        f"{tot['tokens']:,}",
        f"{tot['tokens'] / tot['documents']:.0f}" if tot["documents"] else "-",
    )
    out.print(t)
    tk = m["tokenizer"]
    out.print(
        f"tokenizer {tk['file']} ({tk['source']}), vocab {tk['vocab_size']:,}, eos {tk['eos_id']},"
        f" bos {tk['bos_id']}, dtype {m['dtype']}, engine {tk.get('engine', '?')}, seed {m['seed']},"
        f" val fraction {m['split']['val_fraction']}"
        + (", sha256 verified" if args.verify else "")
        + f", every id < {tk['vocab_size']:,}"
    )
    split = args.split or (toks.splits[0] if toks.splits else None)
    if split:
        shard = toks.shards(split)[0]
        doc = shard.document(0)
        text = toks.decode(doc)
        out.print(f"\n[bold]sample[/] {split} document 0 of {shard.path.name} (id {shard.ids[0]}, {len(doc)} tokens):")
        out.print(repr(text[: args.chars]) + ("…" if len(text) > args.chars else ""), markup=False)
        out.print(f"ids: {doc[:24].tolist()}{' …' if len(doc) > 24 else ''}")
    out.print(_histogram(toks.document_lengths(args.split)))
    return 0


def cmd_tokens_export(args, console: Console) -> int:
    from gristmill.tokenize.reader import open_tokens

    toks = open_tokens(local_tokens(args.dir), verify="lazy")
    _some_shards(toks, "export")
    # --format bin writes one split (train unless given); megatron one prefix per split
    splits = [args.split] if args.split else (["train"] if args.format == "bin" else toks.splits)
    for split in splits:
        if split not in toks.splits:
            raise ConfigError(
                f"--split {split}: {toks.root / 'manifest.json'} has no shards of this split"
                f" (it has: {', '.join(toks.splits) or 'none'})"
            )
    # the checks of `tokens inspect` and of training (tokenizer, shards, every id in the
    # vocabulary), before the first byte is written: a refused export leaves nothing behind
    for split in splits:
        toks.check(split)
    if args.format == "megatron":
        return _export_megatron(toks, splits, args.output, console)
    if storage.is_url(args.output):
        raise ConfigError(
            f"-o {args.output}: --format bin writes a local file (np.memmap reads it); --format megatron "
            "writes to object storage"
        )
    args.split = splits[0]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(out)  # two exports to one file: each renames its own whole file
    n = 0
    try:
        with open(tmp, "wb") as f:
            for tokens in toks.stream(args.split):
                f.write(tokens.tobytes())  # already little-endian uint16/uint32
                n += len(tokens)
        tmp.replace(out)  # an earlier file at `out` stays whole until the new one is complete
    except BaseException as e:  # a full disk, Ctrl-C: no half-written file left behind
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(out)  # a failed write names no file
        raise
    console.print(
        f"[bold green]done[/] {out}: {n:,} {toks.dtype} tokens of split {args.split}"
        f" ({out.stat().st_size / 1e6:.1f} MB); read with np.memmap({str(out)!r}, dtype=np.{toks.dtype},"
        " mode='r')"
    )
    return 0


def _export_megatron(toks, splits: list[str], output: str, console: Console) -> int:
    from gristmill.tokenize.megatron import LocalFolder, StoreFolder, write_megatron

    if storage.is_url(output):
        if storage.protocol(output) in storage.READ_ONLY:
            raise ConfigError(f"-o {output}: {storage.protocol(output)}:// is read-only")
        fs, path = storage.filesystem(output)
        with storage.errors(output, "looking it up"):
            is_file = fs.isfile(path)
        if is_file:
            raise ConfigError(f"-o {output}: is an object; --format megatron writes a folder of <split>.bin/.idx")
        dest = StoreFolder(output)
    else:
        out = Path(storage.local_or_url(output))
        if out.exists() and not out.is_dir():
            raise ConfigError(f"-o {out}: is a file; --format megatron writes a folder of <split>.bin/.idx")
        dest = LocalFolder(out)
    written = write_megatron(toks, dest, splits)
    for w in written:
        console.print(
            f"[bold green]done[/] {w.prefix}.bin/.idx: {w.documents:,} documents, {w.tokens:,} {w.dtype} tokens"
            f" ({(w.bin_bytes + w.idx_bytes) / 1e6:.1f} MB)",
            soft_wrap=True,  # paths unbroken, to be copied
        )
    paths = {w.split: w.prefix for w in written}
    hint = (
        f"--train-data-path {paths['train']} --valid-data-path {paths['val']}"
        if {"train", "val"} <= set(paths)
        else f"--data-path {next(iter(paths.values()))}"
    )
    tk = toks.manifest["tokenizer"]
    console.print(
        f"Megatron-LM: {hint} (vocab {tk['vocab_size']:,}, eod id {tk['eos_id']}: every document ends in it)",
        soft_wrap=True,
    )
    if isinstance(dest, StoreFolder):  # each export to a store has a folder of its own
        console.print(
            f"committed as {dest.pointer_url}, which names the current export's paths (they change with each"
            " export: read them from it, docs/token-shards.md)",
            soft_wrap=True,
        )
    return 0


def add_parsers(sub) -> None:
    tz = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer").add_subparsers(
        dest="tok_cmd", required=True
    )
    tr = tz.add_parser("train", help="train a byte-level BPE on Parquet documents or text files")
    tr.add_argument("inputs", nargs="+", help="Parquet files/folders (a `text` column) or text files")
    tr.add_argument("--vocab-size", type=int, required=True)
    tr.add_argument("--min-frequency", type=int, default=2)
    tr.add_argument(
        "--sample-bytes",
        type=int,
        default=100_000_000,
        help="train on the documents with the smallest id hash up to this many bytes",
    )
    tr.add_argument("-o", "--output", required=True, help="tokenizer.json to write")
    tr.set_defaults(func=cmd_tokenizer_train)

    tk = sub.add_parser("tokens", help="inspect or export token shards").add_subparsers(
        dest="tokens_cmd", required=True
    )
    ins = tk.add_parser("inspect", help="totals, a decoded sample and the document length histogram")
    ins.add_argument("dir", help="a token directory or a run directory holding tokens/ (a path or a URL)")
    ins.add_argument("--split", help="split for the sample and histogram (default: all for the histogram)")
    ins.add_argument("--chars", type=int, default=400, help="characters of the decoded sample to print")
    ins.add_argument("--no-verify", dest="verify", action="store_false", help="skip the sha256 check of the shards")
    ins.set_defaults(func=cmd_tokens_inspect)
    ex = tk.add_parser(
        "export", help="write a split as one flat token file (nanoGPT's .bin) or Megatron's indexed dataset"
    )
    ex.add_argument("dir", help="a token directory or a run directory holding tokens/ (a path or a URL)")
    ex.add_argument(
        "--format",
        default="bin",
        choices=["bin", "megatron"],
        help="bin: one file of tokens; megatron: OUT/<split>.bin + .idx per split (--data-path OUT/train)",
    )
    ex.add_argument("--split", help="the split to write (bin: default train; megatron: default every split)")
    ex.add_argument(
        "-o", "--output", required=True, help="bin: the file; megatron: the folder (a path or a URL, s3://...)"
    )
    ex.set_defaults(func=cmd_tokens_export)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `pipeline tokens ...`")
