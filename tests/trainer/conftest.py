"""Token directories written by hand with pyarrow, following the contract in GUIDE.md
("Token shards"), so the trainer's tests do not depend on the tokenizer stage."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import made_once

EOS = 1


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's CPU ops on one thread, in this process and in the trainings it starts (torchrun's
    ranks take OMP_NUM_THREADS): the tiny model gains nothing from a second thread, whose
    spin-waiting costs several times the step itself on this shared 2-core machine (2 test
    workers). Every training of these tests runs so, so runs compared bit for bit still match."""
    import torch

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer_json(vocab: int, prefix: str = "t") -> str:
    """A word-level tokenizer of ids 0..vocab-1: the reader checks the manifest's vocab_size
    against its tokenizer. Another `prefix` gives another tokenizer of the same size."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    return Tokenizer(WordLevel({f"<{prefix}{i}>": i for i in range(vocab)}, unk_token=f"<{prefix}0>")).to_str()


def write_token_dir(
    root: Path, vocab: int = 300, docs: dict | None = None, shard_docs: int = 40, seed: int = 0, dtype=None
) -> Path:
    """`docs`: split → list of token lists (EOS appended). Default: random documents from `seed`."""
    dtype = pa.uint16() if dtype is None else dtype
    rng = np.random.default_rng(seed)
    if docs is None:
        # a learnable stream: each document repeats a short random motif
        def doc():
            motif = rng.integers(2, vocab, size=rng.integers(3, 9))
            return np.tile(motif, rng.integers(4, 30)).tolist()

        docs = {"train": [doc() for _ in range(160)], "val": [doc() for _ in range(30)]}
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(tokenizer_json(vocab))
    shards = []
    schema = pa.schema(
        [
            pa.field("tokens", pa.large_list(pa.field("item", dtype, nullable=False)), nullable=False),
            pa.field("id", pa.string()),
        ]
    )
    for split, items in docs.items():
        for n, i in enumerate(range(0, len(items), shard_docs)):
            part = [d + [EOS] for d in items[i : i + shard_docs]]
            offsets = np.zeros(len(part) + 1, dtype=np.int64)
            np.cumsum([len(d) for d in part], out=offsets[1:])
            values = np.concatenate([np.asarray(d) for d in part]).astype(dtype.to_pandas_dtype())
            tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))
            ids = [f"<urn:uuid:{split}-{i + j}>" for j in range(len(part))]
            name = f"{split}-{n:05d}.arrow"
            with pa.OSFile(str(root / name), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
                w.write_batch(pa.record_batch([tokens, pa.array(ids)], schema=schema))
            shards.append(
                {
                    "path": name,
                    "split": split,
                    "documents": len(part),
                    "tokens": int(offsets[-1]),
                    "sha256": _sha(root / name),
                }
            )
    splits = {
        s: {
            "shards": sum(1 for x in shards if x["split"] == s),
            "documents": sum(x["documents"] for x in shards if x["split"] == s),
            "tokens": sum(x["tokens"] for x in shards if x["split"] == s),
        }
        for s in docs
    }
    manifest = {
        "format": "gristmill-tokens",
        "version": 1,
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": _sha(root / "tokenizer.json"),
            "vocab_size": vocab,
            "eos_id": EOS,
            "bos_id": EOS,
        },
        "dtype": str(dtype),
        "seed": seed,
        "shards": shards,
        "splits": splits,
        "totals": {"documents": sum(x["documents"] for x in shards), "tokens": sum(x["tokens"] for x in shards)},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


@pytest.fixture(scope="session")
def token_dir(tmp_path_factory) -> Path:
    return made_once(tmp_path_factory, "trainer-tokens", lambda out: write_token_dir(out / "tokens")) / "tokens"


STEPS = 6


def tiny_cfg(tokens: Path, steps: int, *extra: str):
    """The tiny preset, small enough for CPU tests: checkpoints (and validation) every 3 steps."""
    from gristmill.trainer.config import load as load_config

    return load_config(
        "tiny",
        [
            f"data.tokens={tokens}",
            f"steps={steps}",
            "checkpoint.every=3",
            "checkpoint.keep=3",
            "eval.every=3",
            "eval.batches=2",
            "log.progress=false",
            "log.tensorboard=false",
            "data.seq_len=32",
            *extra,
        ],
    )


def losses(out: Path) -> dict[int, float]:
    """step → training loss in `out/metrics.jsonl` (a later record of a step wins)."""
    return {r["step"]: r["loss"] for r in map(json.loads, open(out / "metrics.jsonl")) if "loss" in r}


@pytest.fixture(scope="session")
def baseline(token_dir, tmp_path_factory) -> Path:
    """STEPS steps of the tiny model in one go, checkpoints at steps 3 and 6 (read-only: copy it)."""
    from gristmill.trainer.train import train

    def make(folder: Path) -> None:
        with one_torch_thread():  # made before the tests' own fixture applies
            summary = train(tiny_cfg(token_dir, STEPS), folder / "full")
        assert summary["steps"] == STEPS

    return made_once(tmp_path_factory, "trainer-baseline", make) / "full"


def two_rank_section():
    """A crawl YAML's `train:` section of STEPS steps on two ranks (torchrun, gloo), checkpoints at
    steps 3 and 6, both blocks in one FSDP2 unit."""
    from gristmill.config import TrainSection

    return TrainSection(
        preset="tiny",
        steps=STEPS,
        nproc=2,
        set=[
            "checkpoint.every=3",
            "checkpoint.keep=3",
            "eval.batches=0",
            "log.progress=false",
            "log.tensorboard=false",
            "data.seq_len=32",
            "fsdp_unit_layers=2",
        ],
    )


@pytest.fixture(scope="session")
def two_rank_run(token_dir, tmp_path_factory) -> Path:
    """A run directory whose `train:` section (`two_rank_section`) trained on two ranks through
    the pipeline hook: `tokens/` and `train/` (read-only: copy it)."""
    from rich.console import Console

    from gristmill.trainer.launch import after_pipeline

    def make(folder: Path) -> None:
        run_dir = folder / "run"
        shutil.copytree(token_dir, run_dir / "tokens")
        with one_torch_thread():
            assert after_pipeline(two_rank_section(), run_dir, Console(stderr=True)) == 0

    return made_once(tmp_path_factory, "trainer-two-ranks", make) / "run"
