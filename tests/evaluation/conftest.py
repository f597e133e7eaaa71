"""A tiny model trained on real text, in the three forms `pipeline eval` takes: a training
output folder, one of its checkpoints, and the HF directory `export-hf` makes of it.

The tokenizer is a byte-level BPE of 512 ids trained on WikiText-2's validation text; the
token shards are that text's lines, written as the trainer's tests write theirs
(tests/trainer/conftest.py), with this tokenizer in place of the word-level one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import made_once
from tests.trainer.conftest import one_torch_thread, tiny_cfg, write_token_dir

VOCAB = 512
SEQ = 256  # the model's max_seq_len: long prompts are truncated (counted)
TRAIN_TASKS = ("copa", "winogrande", "lambada_openai")
TRAIN_LIMIT = 8


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def _make_run(folder: Path, data: Path) -> None:
    from gristmill.tokenize.tokenizer import special_ids, train
    from gristmill.trainer.export import export_hf
    from gristmill.trainer.train import train as train_model

    text = (data / "corpus" / "en" / "wikitext-2.valid.txt").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if len(ln.strip()) > 40]
    tok = train(lines[:3000], VOCAB)
    info = special_ids(tok)
    docs = [tok.encode(ln).ids for ln in lines[:1500]]
    root = write_token_dir(
        folder / "tokens", vocab=VOCAB, docs={"train": docs[:1400], "val": docs[1400:]}, shard_docs=400
    )
    (root / "tokenizer.json").write_text(tok.to_str())
    mf = json.loads((root / "manifest.json").read_text())
    mf["tokenizer"].update(
        sha256=hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest(),
        vocab_size=info.vocab_size,
        eos_id=info.eos_id,
        bos_id=info.bos_id,
    )
    (root / "manifest.json").write_text(json.dumps(mf, indent=2))
    env = os.environ.get("GRISTMILL_DATA")
    os.environ["GRISTMILL_DATA"] = str(data)
    try:
        with one_torch_thread():
            cfg = tiny_cfg(
                root,
                40,
                f"data.seq_len={SEQ}",
                "checkpoint.every=20",
                "eval.batches=0",
                "optim.lr=3e-3",
                # scored during training (trainer.scores) at steps 20 and 40
                f"eval.tasks=[{','.join(TRAIN_TASKS)}]",
                "eval.corpora=[wikitext2_valid]",
                "eval.tasks_every=20",
                f"eval.limit={TRAIN_LIMIT}",
                "eval.corpus_tokens=2000",
            )
            train_model(cfg, folder / "run")
    finally:
        if env is None:
            os.environ.pop("GRISTMILL_DATA", None)
        else:
            os.environ["GRISTMILL_DATA"] = env
    export_hf(folder / "run", folder / "hf")


@pytest.fixture(scope="session")
def trained(tmp_path_factory, shared_data) -> Path:
    """`tokens/`, `run/` (checkpoints at steps 20 and 40) and `hf/` (step 40 exported); read-only."""
    return made_once(tmp_path_factory, "eval-trained", lambda f: _make_run(f, shared_data))
