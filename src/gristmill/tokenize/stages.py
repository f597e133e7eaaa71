"""`tokenize`: the stages after the run's last document stage (a global step, `Tokenize`).

    NN_tokenizer_sample (N tasks) each task's id-hash sample of its documents (output/sample_RRRRR.parquet)
    NN_tokenizer  (1 task)  the run's sample from the tasks' samples; train the BPE on it, or load
                            the given one; convert to tokenizer.json; choose the engine (tiktoken
                            when it gives HF's ids on the sample, else HF). Output: tokenizer.json,
                            engine.json
    NN_tokenize   (N tasks) encode each task's share of the documents → output/<bucket>/<rank>.arrow,
                            P buckets by shuffle-key range
    NN_shard_lengths (P tasks) task p: bucket p's document lengths in global order, as running sums
                            (output/<split>_<p>.npy, 8 bytes a document): the walk of every encode
                            file (N x P of them) and every key's sort, divided over P tasks
    NN_shard_plan (1 task)  where the shards are cut: a binary search per cut in those sums,
                            bucket by bucket (memory-mapped: a few pages per cut)
    NN_shards     (P tasks) task p sorts bucket p and writes the shards that start in it
    NN_manifest   (1 task)  tokens/: the shards in global order, tokenizer.json, manifest.json

The global seeded shuffle is a sort by shuffle key; buckets are key ranges, so bucket by bucket
is the global order and the shards are byte-identical for any N and P (see shards.py).

Training runs in a stage, not at plan time, because the documents it learns from do not exist
until the stages before it ran. Its sample is chosen by id hash (the documents with the smallest
`xxh3_64(id)` up to `sample_bytes`), fed in that order: the same documents give the same
tokenizer, whatever the number of tasks that wrote them. The sample is taken in two steps so
that no task reads every document: each sample task keeps the smallest-hash documents of its
share up to `sample_bytes`, and the tokenizer task takes the same selection over their union.
Every document of the run's sample is in its task's sample (the documents before it in hash
order are fewer within its task than in the run), so the result is the one-pass selection.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import regex
import xxhash
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field, model_validator

from gristmill.core.configlib import ConfigError, Fraction, Strict
from gristmill.core.files import save_npy_atomic, write_text_atomic
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.run_folder import AS_GIVEN, RunFolder
from gristmill.core.step import GlobalStep, Stage, StageContext, Step, Workload

TRAIN_SALT = b"gristmill-tokenizer-sample:"
#: the column `tokenize.bucket_weights` reads: the `quality_buckets` step writes it
QUALITY_BUCKET = "quality_bucket"
#: what an encode task counts per quality bucket when weighting (`weights/task_RRRRR.json`)
BUCKET_COUNTS = ("documents", "tokens", "rows", "row_tokens")


def _sample_key(doc) -> int:
    return xxhash.xxh3_64_intdigest(TRAIN_SALT + (doc.id or doc.text).encode("utf-8"))


def hash_sample(docs, budget_bytes: int) -> list[str]:
    """Texts of the smallest-hash documents whose bytes first reach `budget_bytes`, in hash order.

    Independent of the order documents arrive in; holds only the sample in memory.
    """
    return [text for _, text in hash_sample_entries(docs, budget_bytes)]


def hash_sample_entries(docs, budget_bytes: int, encoded: bool = False) -> list[tuple[str, str | bytes]]:
    """(id, text) of `hash_sample`'s documents, in hash order (ascending key, then id); with
    `encoded`, each text as its UTF-8 bytes. The sample is held as UTF-8 (a str holds up to 4
    bytes a character: a page with one emoji), so it takes its `budget_bytes`, plus the one
    document that may take it past."""
    heap: list[tuple[int, str, bytes]] = []  # (-key, id, UTF-8 text): a max-heap on key
    total = 0
    for doc in docs:
        text = doc.text.encode("utf-8")
        # ties on (key, id) compare the texts: UTF-8 bytes sort as their code points
        heapq.heappush(heap, (-_sample_key(doc), doc.id or "", text))
        total += len(text)
        del text
        while len(heap) > 1 and total - len(heap[0][2]) >= budget_bytes:
            total -= len(heapq.heappop(heap)[2])
    entries = sorted(heap, key=lambda e: (-e[0], e[1]))
    heap.clear()
    return [(i, t if encoded else t.decode("utf-8")) for _, i, t in entries]


SAMPLE_SCHEMA = pa.schema([("key", pa.uint64()), ("id", pa.string()), ("text", pa.string())])
#: rows per row group of a task's sample: the tokenizer task holds one group of every task's file
SAMPLE_ROW_GROUP = 16
#: ... and at most this much text (UTF-8) in a group, or one longer document alone
SAMPLE_ROW_GROUP_BYTES = 4 << 20
#: characters of text an encode batch holds: it closes once it reaches this (1,000 web pages are
#: ~5M characters)
ENCODE_BATCH_CHARS = 8_000_000
#: texts compared between tiktoken and HF when choosing the engine: this many bytes of each at
#: most (HF's encodings of a whole 30 MB page hold ~140 bytes per byte: `encode.HF_BYTES_PER_BYTE`)
COMPARE_BYTES = 1 << 20


class TokenizerSampleStep(Step):
    """Task r: the id-hash sample of its documents, up to `sample_bytes` (output/sample_RRRRR.parquet)."""

    type = "🔤 TOKENIZER"
    step_name = "tokenizer_sample"

    def __init__(self, sample_bytes: int):
        super().__init__()
        self.sample_bytes = sample_bytes

    memory_setting = "tokenize.tokenizer.sample_bytes"

    def memory_bytes(self, work: Workload) -> int:
        """The sample (`sample_bytes`, or its share of the text), held as UTF-8 in a heap, then as
        an Arrow table written: ~3x (was ~9x as Python strings, fitted to the scale runs' peak
        RSS); plus the document that may take it past `sample_bytes`, as long as the largest."""
        return int(3 * min(self.sample_bytes, work.text_bytes / max(work.tasks, 1)))

    #: the document that may take the sample past `sample_bytes`: its UTF-8 in the heap, then in
    #: the Arrow table and the Parquet writer (measured: 8.3 bytes per byte of a 30 MB page)
    document_factor = 9.0

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            entries = hash_sample_entries(data or [], self.sample_bytes, encoded=True)
            out = self.stage_path("output", f"sample_{rank:05d}.parquet")
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            keys = [xxhash.xxh3_64_intdigest(TRAIN_SALT + (i.encode("utf-8") if i else t)) for i, t in entries]
            table = pa.table(
                {
                    "key": pa.array(keys, pa.uint64()),
                    "id": pa.array([e[0] for e in entries], pa.string()),
                    # the UTF-8 bytes as Arrow strings, no copy through Python str
                    "text": pa.array([e[1] for e in entries], pa.binary()).view(pa.string()),
                },
                schema=SAMPLE_SCHEMA,
            )
            del entries
            with pq.ParquetWriter(tmp, SAMPLE_SCHEMA, compression="zstd") as writer:
                groups = _groups(pc.binary_length(table.column("text")).to_numpy(zero_copy_only=False))
                for a, b in groups:
                    writer.write_table(table.slice(a, b - a), row_group_size=b - a)
                if not groups:
                    writer.write_table(table)
            os.replace(tmp, out)
        self.stat_update("documents", value=table.num_rows)
        return
        yield


def _groups(sizes) -> list[tuple[int, int]]:
    """[a, b) row ranges of the sample's row groups: `SAMPLE_ROW_GROUP` rows, fewer where that
    would take a group's text past `SAMPLE_ROW_GROUP_BYTES` (a longer document alone)."""
    out, a, held = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > a and (i - a >= SAMPLE_ROW_GROUP or held + size > SAMPLE_ROW_GROUP_BYTES):
            out.append((a, i))
            a, held = i, 0
        held += size
    if a < len(sizes):
        out.append((a, len(sizes)))
    return out


def _sample_rows(path: Path):
    pf = pq.ParquetFile(path)
    for g in range(pf.num_row_groups):  # one small row group at a time
        t = pf.read_row_group(g).to_pydict()
        yield from zip(t["key"], t["id"], t["text"])


def read_samples(folder: Path, budget_bytes: int):
    """The candidates of the run's sample from the tasks' samples (in `folder`, local): their
    files, each sorted by (key, id), merged in that order and read lazily, up to `budget_bytes`
    and every document sharing the last key. `hash_sample` over them is the one-pass selection over all documents;
    the task reads ~budget_bytes plus one row group per file, not every task's whole sample."""
    merged = heapq.merge(
        *(_sample_rows(f) for f in sorted(folder.glob("sample_*.parquet"))), key=lambda r: (r[0], r[1])
    )
    total, last = 0, None
    for key, i, text in merged:
        if total >= budget_bytes and key != last:
            return
        yield Document(text=text, id=i)
        total += len(text.encode("utf-8"))
        last = key


class TokenizerStep(Step):
    """Train or load the tokenizer; decide the encoding engine on a sample of the documents."""

    type = "🔤 TOKENIZER"
    step_name = "tokenizer"

    def __init__(self, params: dict, sample_folder: Path | None = None):
        super().__init__()
        self.params = params  # TokenizerSource as a dict (picklable)
        #: the sample tasks' output; None: the documents piped in are sampled here
        self.sample_folder = sample_folder and Path(sample_folder)
        self.sample_tasks = 1  # for the memory model; set by `Tokenize.stages`

    memory_setting = "tokenize.tokenizer.sample_bytes"
    bounded_work = True  # reads at most sample_bytes of the tasks' samples, however large the run

    def memory_bytes(self, work: Workload) -> int:
        """The sample (`sample_bytes` of text, held as UTF-8 in a heap), training on it (the HF
        trainer's word counts: ~4x the sample; its own pool and the pieces in work,
        `TRAINER_BYTES`), the tokenizer, one row group of every sample task's file while they
        are merged (16 documents or `SAMPLE_ROW_GROUP_BYTES`), and the engine check's batch."""
        from gristmill.tokenize.encode import COMPARE_BATCH_BYTES, HF_BYTES_PER_BYTE

        train = bool(self.params.get("train"))
        sample = min(self.params["sample_bytes"], work.text_bytes)
        group = min(SAMPLE_ROW_GROUP * work.text_bytes / max(work.documents, 1), SAMPLE_ROW_GROUP_BYTES)
        # the engine check encodes a batch with HF (up to COMPARE_BATCH_BYTES of text)
        check = HF_BYTES_PER_BYTE * COMPARE_BATCH_BYTES if self.params["engine"] != "hf" else 0
        trainer = TRAINER_BYTES if train else 0
        return int((5 if train else 2) * sample + self.sample_tasks * group + check + trainer + (64 << 20))

    #: the document that may take the sample past `sample_bytes` (its UTF-8 and a row group of
    #: it), then decoded (as Python holds it), fed to the trainer in pieces (`training_pieces`)
    document_factor = 8.0

    @property
    def output(self) -> Path:
        return self.stage_path("output")

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize import encode, tokenizer

        p = self.params
        train = p.get("train")
        with self.track_time():
            sample_folder = self.sample_folder and self.run_folder.staged(self.sample_folder)
            docs = read_samples(sample_folder, p["sample_bytes"]) if sample_folder is not None else (data or [])
            # the sample as UTF-8, each text decoded when the trainer or the check reads it
            sample = [t for _, t in hash_sample_entries(docs, p["sample_bytes"], encoded=True)]
            self.stat_update("documents", value=len(sample))
            self.stat_update("bytes", value=sum(map(len, sample)))
            if train:
                texts = (piece for t in sample for piece in training_pieces(t.decode("utf-8")))
                tok = tokenizer.train(texts, train["vocab_size"], train["min_frequency"], length=len(sample))
            else:
                tok = tokenizer.load(p["path"], p.get("pattern"))
            info = tokenizer.special_ids(
                tok, p["eos_token"], p.get("bos_token"), p.get("pad_token"), where=p.get("path") or "trained tokenizer"
            )
            engine, reason, checked = "hf", "", 0
            if p["engine"] != "hf":
                fast = encode.tiktoken_from_hf(tok)
                reason = fast.reason
                if fast.encoding is not None:
                    check = _Heads(sample[: p["check_docs"]], COMPARE_BYTES)
                    checked, bad = encode.compare(tok, fast.encoding, check)
                    if bad is None:
                        engine = "tiktoken"
                    else:
                        reason = f"tiktoken's ids differ from HF's on sampled document {bad}"
                if p["engine"] == "tiktoken" and engine != "tiktoken":
                    raise ValueError(f"tokenize.tokenizer.engine is tiktoken but it cannot be used: {reason}")
        self.output.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.output / "tokenizer.json", tok.to_str(pretty=True))
        meta = {
            "engine": engine,
            "engine_reason": reason,
            "checked_documents": checked,
            "source": p.get("path") or "trained",
            "vocab_size": info.vocab_size,
            "eos_id": info.eos_id,
            "bos_id": info.bos_id,
            "pad_id": info.pad_id,
        }
        if train:
            meta["trained"] = {**train, "sample_documents": len(sample)}
        write_text_atomic(self.output / "engine.json", json.dumps(meta, indent=2))
        self.stat_update(f"engine_{engine}")
        return
        yield  # a generator that emits nothing: the executor drains it


#: characters of a text the BPE trainer is given at a time (`training_pieces`)
TRAINING_PIECE_CHARS = 1 << 16
#: what the BPE trainer holds beyond its word counts: its thread pool, the pieces its threads
#: work on (~150 bytes per byte of a piece each), the alphabet (measured: 88 MB over the sample
#: on 12 MB of 2 MB pages in 64K pieces, 2 threads)
TRAINER_BYTES = 96 << 20
#: where GPT-2's pre-tokenizer splits whatever surrounds the place: after a letter and before a
#: character that is not one, or after a digit and before one that is not (no pre-token runs
#: on across such a place: ` ?\p{L}+` and ` ?\p{N}+` end there, contractions end in a letter),
#: so a pre-token starts there, and none of the pattern looks behind
_CUT = regex.compile(r"(?<=\p{L})(?=\P{L})|(?<=\p{N})(?=\P{N})")


def training_pieces(text: str, size: int = TRAINING_PIECE_CHARS) -> Iterator[str]:
    """`text` in pieces of about `size` characters for the BPE trainer, each cut where the
    trained tokenizer's pre-tokenizer (GPT-2's regex) splits anyway (`_CUT`), so the trainer
    counts the same words, in the same order. HF's trainer holds ~100-150 bytes per byte of the
    text it works on, per thread (its normalised and pre-tokenised copies with offsets): 2.6 GB
    for one 30 MB page; on 12 MB of 2 MB pages with 2 threads, 309 MB over its start in pieces
    of 1M characters, 99 MB (mostly fixed) in pieces of 64K (measured). A stretch of `size`
    characters with no such place (one word, number, or run of other characters that long) is
    cut where it ends: the only case where the counts differ from the whole text's, and what
    bounds the trainer's memory whatever the text."""
    start, n = 0, len(text)
    while n - start > size:
        m = _CUT.search(text, start + size, min(start + 2 * size, n))
        end = m.start() if m is not None else start + size
        yield text[start:end]
        start = end
    yield text[start:] if start else text


class _Heads(Sequence):
    """UTF-8 texts as str, each its first `max_bytes` bytes (less a character cut there),
    decoded when read."""

    def __init__(self, encoded: list[bytes], max_bytes: int):
        self.encoded, self.max_bytes = encoded, max_bytes

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        t = self.encoded[i]
        if len(t) <= self.max_bytes:
            return t.decode("utf-8")
        # the texts are valid UTF-8 (encoded from str): only a character cut at the end is left out
        return t[: self.max_bytes].decode("utf-8", errors="ignore")


class EncodeStep(Step):
    """Encode this task's documents in batches; write `<output>/<bucket>/<rank>.arrow` (intermediate)."""

    type = "🔤 TOKENIZER"
    step_name = "encode"

    def __init__(
        self,
        tokenizer_folder: Path,
        *,
        seed: int,
        val_fraction: float,
        threads: int,
        batch_docs: int,
        buckets: int = 1,
        bucket_weights: dict[int, int] | None = None,
    ):
        super().__init__()
        self.tokenizer_folder = Path(tokenizer_folder)
        self.seed, self.val_fraction, self.threads, self.batch_docs = seed, val_fraction, threads, batch_docs
        self.buckets = buckets
        #: copies of a train document by its quality bucket (None: every document once)
        self.bucket_weights = bucket_weights
        #: the engine expected at planning (the tokenizer stage decides it): for the memory model
        self.engine_hint = "tiktoken"

    def memory_bytes(self, work: Workload) -> int:
        """The tokenizer, one batch (`batch_docs` documents or `ENCODE_BATCH_CHARS` characters:
        its texts, token ids, the buckets' Arrow buffers: ~10x the batch's text with tiktoken,
        fitted to the scale runs' peak RSS; HF's encodings: `HF_BYTES_PER_BYTE`)."""
        from gristmill.tokenize.encode import HF_BYTES_PER_BYTE

        batch = min(self.batch_docs * work.text_bytes / max(work.documents, 1), ENCODE_BATCH_CHARS)
        return int((HF_BYTES_PER_BYTE if self.engine_hint == "hf" else 10) * batch + (64 << 20))

    #: a document of `encode.LONG_CHARS` or more encoded alone: tiktoken's ids as a numpy array
    #: (its buffer and the array: 8 bytes a token), the tokens column with its EOS and the
    #: Arrow batch (measured: 54, 76 and 164 MB over 2, 8 and 30 MB pages, docs/scale.md "Large
    #: records"); with HF, its encodings and ids of the whole text (`encode.HF_BYTES_PER_BYTE`:
    #: HF's tokenizers may normalise or match added tokens across any cut, so no cut is safe)
    document_factor = 5.0
    document_fixed = 48 << 20

    def document_bytes(self, work: Workload) -> int:
        from gristmill.tokenize.encode import HF_BYTES_PER_BYTE

        if self.engine_hint != "hf" or not work.max_document_bytes:
            return super().document_bytes(work)
        return int(self.document_fixed + HF_BYTES_PER_BYTE * work.max_document_bytes)

    @property
    def output(self) -> Path:
        return self.stage_path("output")

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize.encode import Encoder
        from gristmill.tokenize.shards import BucketedWriter, token_dtype

        tok = self.run_folder.staged(self.tokenizer_folder)
        meta = json.loads((tok / "engine.json").read_text())
        encoder = Encoder.from_file(tok / "tokenizer.json", meta["engine"], self.threads)
        writer = BucketedWriter(
            self.output,
            rank,
            self.buckets,
            token_dtype(meta["vocab_size"]),
            meta["eos_id"],
            self.seed,
            self.val_fraction,
        )
        batch = []
        weighting: dict[int, dict[str, int]] = {}

        def flush():
            with self.track_time(unit="batch"):
                texts = [d.text for d in batch]
                before = writer.tokens
                if self.bucket_weights is None:
                    writer.write([d.id or "" for d in batch], texts, encoder.encode_batch(texts))
                else:
                    self._write_weighted(writer, encoder, batch, weighting)
            self.stat_update("documents", value=len(batch))
            self.stat_update("bytes", value=sum(len(t.encode("utf-8")) for t in texts))
            self.stat_update("tokens", value=writer.tokens - before)
            batch.clear()

        chars = 0
        try:
            for doc in data or []:
                batch.append(doc)
                chars += len(doc.text)
                if len(batch) >= self.batch_docs or chars >= ENCODE_BATCH_CHARS:
                    flush()
                    chars = 0
            if batch:
                flush()
        except BaseException:  # the encoder or a step before failed: no half-written bucket file is left
            writer.abort()
            raise
        writer.close()
        if self.bucket_weights is not None:
            for b, tally in sorted(weighting.items()):  # tokens as written, copies included
                self.stat_update(f"tokens_bucket_{b:03d}", value=tally["row_tokens"])
            write_text_atomic(
                self.stage_path("weights", f"task_{rank:05d}.json"),
                json.dumps({str(b): v for b, v in sorted(weighting.items())}) + "\n",
            )
        return
        yield

    def _write_weighted(self, writer, encoder, batch: list[Document], weighting: dict) -> None:
        """`batch` with each train document written `bucket_weights[its quality_bucket]` times
        (a bucket not named: once; 0: not at all), each copy its own row (`<id>#2`, `#3`, ...: its
        own shuffle key, so the copies are spread over the shards), always in the train split; a
        val document is written once (or not, at weight 0): the val split stays a sample of the
        documents, not of the weighting."""
        from gristmill.tokenize.shards import is_val

        kept = []
        for d in batch:
            b = d.metadata.get(QUALITY_BUCKET)
            if b is None:
                raise ValueError(
                    f"document {d.id}: no {QUALITY_BUCKET} (tokenize.bucket_weights needs a quality_buckets step)"
                )
            w = self.bucket_weights.get(int(b), 1)
            weighting.setdefault(int(b), {"weight": w, **dict.fromkeys(BUCKET_COUNTS, 0)})["documents"] += 1
            if w > 0:
                kept.append((d, int(b), w))
        ids, texts, tokens, val = [], [], [], []
        for (d, b, w), t in zip(kept, encoder.encode_batch([d.text for d, _, _ in kept])):
            doc_id = d.id or ""
            v = is_val(doc_id, self.val_fraction)
            copies = 1 if v else w
            ids.extend([doc_id] + [f"{doc_id}#{c}" for c in range(2, copies + 1)])
            texts.extend([d.text] * copies)
            tokens.extend([t] * copies)
            val.extend([v] * copies)
            tally = weighting[b]
            tally["tokens"] += len(t) + 1  # with its EOS, as in the shards
            tally["rows"] += copies
            tally["row_tokens"] += copies * (len(t) + 1)
        writer.write(ids, texts, tokens, val)


def read_weighting(run_folder: RunFolder, folder: Path, tasks: int) -> dict:
    """The encode tasks' weighting (`<encode stage>/weights/task_RRRRR.json`, in `run_folder`)
    summed per bucket: the manifest's `weighting.buckets`."""
    files = sorted(run_folder.listed(folder, "task_*.json"))
    if len(files) != tasks:
        raise FileNotFoundError(f"{folder}: {len(files)} of {tasks} encode tasks wrote what their weighting did")
    total: dict[str, dict[str, int]] = {}
    for f in files:
        for b, v in json.loads(run_folder.staged(f).read_text()).items():
            t = total.setdefault(b, {"weight": v["weight"], **dict.fromkeys(BUCKET_COUNTS, 0)})
            for k in BUCKET_COUNTS:
                t[k] += v[k]
    return {b: {**v, "epochs": v["weight"]} for b, v in sorted(total.items(), key=lambda kv: int(kv[0]))}


class ShardLengthsStep(Step):
    """Task p: bucket p's document lengths in global order, as running sums per split
    (`output/train_PPPPP.npy`, `output/val_PPPPP.npy`), for `shard_plan`."""

    type = "🔤 TOKENIZER"
    step_name = "shard_lengths"

    def __init__(self, encoded: Path, *, buckets: int):
        super().__init__()
        self.encoded, self.buckets = Path(encoded), buckets

    memory_setting = "tokenize.shard_tasks"

    def memory_bytes(self, work: Workload) -> int:
        """One bucket's `SortedBucket` without tokens at a time, and the encode files' footers (8 MB).
        Measured (4 GB scale run, 131k documents a bucket): ~570 bytes per document of a bucket,
        not the ~55 of its arrays: the key and length columns sit between the token values of each
        record batch, so the mapped pages read for them are resident with their neighbours."""
        return int(600 * work.documents / self.buckets) + (8 << 20)

    @property
    def output(self) -> Path:
        return self.stage_path("output")

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize.shards import bucket_cumsums, bucket_dir

        with self.track_time():
            for b in range(rank, self.buckets, world_size):
                sums = bucket_cumsums(bucket_dir(self.run_folder.path(self.encoded), b), self.run_folder)
                for split, cum in sums.items():
                    save_npy_atomic(self.output / f"{split}_{b:05d}.npy", cum)
                self.stat_update("documents", value=sum(len(c) for c in sums.values()))
        return
        yield


def _lengths_of(folder: Path, run_folder: RunFolder = AS_GIVEN):
    """Bucket b's running sums from `shard_lengths`' output (in `run_folder`), memory-mapped; one
    clear line for a bucket it did not write."""

    def load(b: int) -> dict:
        out = {}
        for split in ("train", "val"):
            f = run_folder.staged(folder, f"{split}_{b:05d}.npy")
            try:
                out[split] = np.load(f, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise ValueError(f"{f}: lengths of bucket {b} unreadable ({e}): run the step again") from None
        return out

    return load


class ShardPlanStep(Step):
    """Where the shards are cut (`output/plan.json`), from the buckets' running sums of document
    lengths (`shard_lengths`' output; without it, from the encode outputs' keys and lengths)."""

    type = "🔤 TOKENIZER"
    step_name = "shard_plan"

    def __init__(self, encoded: Path, *, buckets: int, shard_tokens: int, lengths: Path | None = None):
        super().__init__()
        self.encoded, self.buckets, self.shard_tokens = Path(encoded), buckets, shard_tokens
        self.lengths = lengths and Path(lengths)

    memory_setting = "tokenize.shard_tasks"

    def memory_bytes(self, work: Workload) -> int:
        """From `shard_lengths`' sums: a few mapped pages per cut and the plan (16 MB). Else one
        bucket at a time as `ShardLengthsStep` holds it."""
        if self.lengths is not None:
            return 16 << 20
        return int(600 * work.documents / self.buckets) + (8 << 20)

    @property
    def output(self) -> Path:
        return self.stage_path("output")

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize.shards import plan_shards

        rf = self.run_folder
        flat = sorted(rf.listed(self.encoded, "*.arrow"))
        if flat:  # one file per task, not per bucket: no bucket would hold its documents
            raise ValueError(f"{flat[0]}: encode output of an older layout; rerun with --force")
        with self.track_time():
            sums = _lengths_of(self.lengths, rf) if self.lengths is not None else None
            plan = plan_shards(rf.path(self.encoded), self.buckets, self.shard_tokens, sums, rf)
        self.output.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.output / "plan.json", json.dumps(plan))
        self.stat_update("documents", value=sum(s["documents"] for s in plan["shards"]))
        self.stat_update("shards", value=len(plan["shards"]))
        return
        yield


class ShardStep(Step):
    """Task p: write the planned shards that start in bucket p (`output/shards/`, `output/<p>.json`)."""

    type = "🔤 TOKENIZER"
    step_name = "shards"

    def __init__(self, encoded: Path, plan_folder: Path, tokenizer_folder: Path):
        super().__init__()
        self.encoded, self.plan_folder, self.tokenizer_folder = Path(encoded), Path(plan_folder), Path(tokenizer_folder)
        self.shard_tokens = 0  # for the memory model; set by `Tokenize.stages`

    memory_setting = "tokenize.shard_tasks"

    def memory_bytes(self, work: Workload) -> int:
        """~55 bytes per document of its bucket (keys, lengths, order), one shard's tokens, and the
        bucket's encoded tokens, memory-mapped but resident once read (~1 byte per byte of text:
        ~4 bytes per token of ~4 characters)."""
        return int(
            55 * work.documents / max(work.tasks, 1) + 4 * self.shard_tokens + work.text_bytes / max(work.tasks, 1)
        )

    #: a shard closes after the document that brings it to `shard_tokens`: one more document's
    #: tokens, gathered and written (at most a token per byte, 4 bytes each, twice)
    document_factor = 8.0

    @property
    def output(self) -> Path:
        return self.stage_path("output")

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize.shards import token_dtype, write_planned_shards

        rf = self.run_folder
        meta = json.loads((rf.staged(self.tokenizer_folder) / "engine.json").read_text())
        plan_file = rf.staged(self.plan_folder, "plan.json")
        plan = json.loads(plan_file.read_text())
        if plan["buckets"] != world_size:
            raise ValueError(f"{plan_file}: planned for {plan['buckets']} shard tasks, this stage runs {world_size}")
        with self.track_time():
            root, out, dtype = rf.path(self.encoded), self.output / "shards", token_dtype(meta["vocab_size"])
            entries = write_planned_shards(root, plan, rank, out, dtype, run_folder=rf)
        write_text_atomic(self.output / f"{rank:05d}.json", json.dumps(entries))
        self.stat_update("documents", value=sum(e["documents"] for e in entries))
        self.stat_update("tokens", value=sum(e["tokens"] for e in entries))
        self.stat_update("shards", value=len(entries))
        return
        yield


class ManifestStep(Step):
    """Gather every shard task's files into the run's token directory (`<run_dir>/tokens`)."""

    type = "🔤 TOKENIZER"
    step_name = "manifest"

    def __init__(
        self,
        plan_folder: Path,
        shard_folder: Path,
        tokenizer_folder: Path,
        tokens_dir: Path,
        *,
        seed: int,
        val_fraction: float,
        shard_tokens: int,
        weighting: tuple[Path, int, dict[int, int]] | None = None,
    ):
        super().__init__()
        self.plan_folder, self.shard_folder = Path(plan_folder), Path(shard_folder)
        self.tokenizer_folder, self.tokens_dir = Path(tokenizer_folder), Path(tokens_dir)
        self.seed, self.val_fraction, self.shard_tokens = seed, val_fraction, shard_tokens
        #: (the encode stage's weighting folder, its tasks, the weights): the manifest says
        #: what the bucket weighting did
        self.weighting = weighting

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from gristmill.tokenize.shards import finish_tokens, token_dtype

        rf = self.run_folder
        tok = rf.staged(self.tokenizer_folder)
        meta = json.loads((tok / "engine.json").read_text())
        plan = json.loads(rf.staged(self.plan_folder, "plan.json").read_text())
        shard_folder = rf.staged(self.shard_folder)  # the shard tasks' lists and shards
        written = {}
        for p in range(plan["buckets"]):
            f = shard_folder / f"{p:05d}.json"
            if not f.is_file():
                raise FileNotFoundError(f"{f}: shard task {p} left no list of its shards")
            written.update({e["path"]: e for e in json.loads(f.read_text())})
        missing = [s["path"] for s in plan["shards"] if s["path"] not in written]
        if missing:
            raise ValueError(f"{shard_folder}: planned shards not written: {', '.join(missing[:5])}")
        with self.track_time():
            manifest = finish_tokens(
                shard_folder / "shards",
                [written[s["path"]] for s in plan["shards"]],
                rf.path(self.tokens_dir),
                tokenizer_file=tok / "tokenizer.json",
                tokenizer_meta={k: meta[k] for k in ("source", "vocab_size", "eos_id", "bos_id", "pad_id", "engine")},
                dtype=token_dtype(meta["vocab_size"]),
                seed=self.seed,
                val_fraction=self.val_fraction,
                shard_tokens=self.shard_tokens,
                extra=None if self.weighting is None else {"weighting": self._weighting()},
            )
        self.stat_update("documents", value=manifest["totals"]["documents"])
        self.stat_update("tokens", value=manifest["totals"]["tokens"])
        self.stat_update("shards", value=len(manifest["shards"]))
        return
        yield

    def _weighting(self) -> dict:
        folder, tasks, weights = self.weighting
        return {
            "field": QUALITY_BUCKET,
            "weights": {str(b): w for b, w in sorted(weights.items())},
            "rule": "a train document is written `weight` times (its epochs), each copy its own row id#2, id#3, ...;"
            " weight 0 drops it; a bucket not named has weight 1; a val document is written once (or not, at 0)",
            "buckets": read_weighting(self.run_folder, folder, tasks),
        }


class TrainTokenizerConfig(Strict):
    vocab_size: int = Field(ge=259, description="vocabulary size, including 256 bytes and 3 special tokens")
    min_frequency: int = Field(2, ge=1, description="a pair merges only if seen at least this often")


class TokenizerSourceConfig(Strict):
    path: str | None = Field(
        None, description="tokenizer.json, a folder with GPT-2's encoder.json + vocab.bpe, or a .tiktoken file"
    )
    train: TrainTokenizerConfig | None = Field(None, description="or: train a byte-level BPE on the run's documents")
    sample_bytes: int = Field(
        100_000_000, ge=1, description="documents (by id hash) to train on and to check tiktoken against HF"
    )
    check_docs: int = Field(1000, ge=1, description="sampled documents on which tiktoken must give HF's ids to be used")
    engine: Literal["auto", "tiktoken", "hf"] = Field("auto", description="auto: tiktoken when it gives HF's ids")
    pattern: str | None = Field(None, description="pre-tokenizer regex of a .tiktoken file not known by name")
    eos_token: str = "<|endoftext|>"
    bos_token: str | None = "<|bos|>"
    pad_token: str | None = "<|pad|>"

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.train is None):
            raise ValueError("give exactly one of `path` (load a tokenizer) or `train` (train one)")
        return self


class TokenizeConfig(Strict):
    tokenizer: TokenizerSourceConfig = Field(
        description="the BPE: `{path: ...}` loads one, `{train: {vocab_size: N}}` trains one on the run's documents"
    )
    shard_tokens: int = Field(100_000_000, ge=1, description="a shard is closed once it holds this many tokens")
    val_fraction: Fraction = Field(0.01, description="share of documents (by id hash) in the val split")
    seed: int = Field(0, ge=0, description="seed of the global document shuffle")
    threads: int = Field(1, ge=1, description="encoding threads per task (tiktoken)")
    batch_docs: int = Field(1000, ge=1, description="documents encoded per batch")
    tasks: int | None = Field(None, ge=1, description="encode tasks (default: executor.tasks)")
    shard_tasks: int | None = Field(
        None, ge=1, description="shard tasks = shuffle-key buckets (default: the encode tasks)"
    )
    bucket_weights: dict[int, int] | None = Field(
        None,
        description="copies of a train document by its `quality_bucket` (the quality_buckets step): {bucket: k},"
        " k = 0 drops it, k > 1 repeats it; a bucket not named: once",
    )

    @model_validator(mode="after")
    def _weights(self):
        bad = {b: w for b, w in (self.bucket_weights or {}).items() if b < 0 or w < 0}
        if bad:
            raise ValueError(f"bucket_weights: buckets and weights are 0 or more (got {bad})")
        return self


class Tokenize(GlobalStep):
    """BPE token shards of the run's final documents (`<run_dir>/tokens/`), the run's last step.
    A top-level `tokenize:` section beside `steps:` is read as this step."""

    yaml_name = "tokenize"
    Config = TokenizeConfig
    last_step = "it tokenizes the run's final documents"

    def check_source(self) -> str:
        """Fail before the run starts on a tokenizer that cannot be loaded (names the config key).
        Returns the engine the encode tasks will most likely use (for their memory model): the
        tokenizer stage decides it, tiktoken when it gives HF's ids; a trained byte-level BPE
        always can."""
        from gristmill.tokenize import encode, tokenizer

        src = self.config.tokenizer
        if src.engine != "auto":
            engine = src.engine
        else:
            engine = "tiktoken"
        if src.path is None:
            return engine
        try:
            tok = tokenizer.load(src.path, src.pattern)
            tokenizer.special_ids(tok, src.eos_token, src.bos_token, src.pad_token, where=src.path)
        except tokenizer.TokenizerError as e:
            raise ConfigError(f"tokenize.tokenizer.path: {e}") from None
        if src.engine == "auto" and encode.tiktoken_from_hf(tok).encoding is None:
            engine = "hf"
        return engine

    def stages(self, ctx: StageContext) -> None:
        cfg = self.config
        engine = self.check_source()
        if cfg.bucket_weights is not None and QUALITY_BUCKET not in ctx.fields:
            raise ConfigError(
                f"tokenize.bucket_weights: the documents have no {QUALITY_BUCKET} column: put a quality_buckets"
                " step before tokenize"
            )

        def output(stage: Stage) -> Path:  # what the steps keep: names in the run directory
            return Path(stage.label, "output")

        sample = ctx.stage(
            "tokenizer_sample",
            [ParquetReader(ctx.documents), TokenizerSampleStep(cfg.tokenizer.sample_bytes)],
            tasks=cfg.tasks,
        )
        prep = ctx.stage("tokenizer", [TokenizerStep(cfg.tokenizer.model_dump(), output(sample))], tasks=1)
        prep.pipeline[0].sample_tasks = sample.tasks
        buckets = cfg.shard_tasks or cfg.tasks or ctx.tasks  # one bucket per shard task
        enc = ctx.stage(
            "tokenize",
            [
                ParquetReader(ctx.documents),
                EncodeStep(
                    output(prep),
                    seed=cfg.seed,
                    val_fraction=cfg.val_fraction,
                    threads=cfg.threads,
                    batch_docs=cfg.batch_docs,
                    buckets=buckets,
                    bucket_weights=cfg.bucket_weights,
                ),
            ],
            tasks=cfg.tasks,
        )
        enc.pipeline[1].engine_hint = engine
        lengths = ctx.stage("shard_lengths", [ShardLengthsStep(output(enc), buckets=buckets)], tasks=buckets)
        plan = ctx.stage(
            "shard_plan",
            [ShardPlanStep(output(enc), buckets=buckets, shard_tokens=cfg.shard_tokens, lengths=output(lengths))],
            tasks=1,
        )
        shards = ctx.stage("shards", [ShardStep(output(enc), output(plan), output(prep))], tasks=buckets)
        shards.pipeline[0].shard_tokens = cfg.shard_tokens
        ctx.stage(
            "manifest",
            [
                ManifestStep(
                    output(plan),
                    output(shards),
                    output(prep),
                    Path("tokens"),
                    seed=cfg.seed,
                    val_fraction=cfg.val_fraction,
                    shard_tokens=cfg.shard_tokens,
                    weighting=None
                    if cfg.bucket_weights is None
                    else (Path(enc.label, "weights"), enc.tasks, cfg.bucket_weights),
                )
            ],
            tasks=1,
        )
