"""The comparison's statistics can be trusted (a planted ablation on tiny CPU models): a variant
trained on text of the evaluated domain comes out "better" than one trained on the same tokens
shuffled, and two identical variants that differ only in their seeds come out "not
distinguishable". Each variant is trained with two seeds (initialisation and data order) and
scored on held-out WikiText-2 test lines as a language-modelling task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gristmill.evaluation.compare import CompareError, compare
from tests.conftest import made_once
from tests.trainer.conftest import one_torch_thread, tiny_cfg

ITEMS = 150
STEPS = 60


def _shuffled_tokens(src: Path, dst: Path) -> Path:
    """`src`'s token directory with every token of the train split shuffled (the same unigram
    counts, no order): rewritten through the trainer tests' writer, with `src`'s tokenizer."""
    from gristmill.tokenize.reader import open_tokens
    from tests.trainer.conftest import write_token_dir

    toks = open_tokens(src)
    docs = {s: [d[:-1].tolist() for d in toks.documents(s)] for s in ("train", "val")}  # without EOS
    flat = np.concatenate([np.asarray(d) for d in docs["train"]])
    np.random.default_rng(0).shuffle(flat)
    cuts = np.cumsum([len(d) for d in docs["train"]])[:-1]
    docs["train"] = [p.tolist() for p in np.split(flat, cuts)]
    root = write_token_dir(dst, vocab=toks.vocab_size, docs=docs, shard_docs=400)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "tokenizer.json").write_bytes(toks.tokenizer_path.read_bytes())
    import hashlib

    manifest["tokenizer"] = {
        **toks.manifest["tokenizer"],
        "sha256": hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest(),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def _lm_task(data: Path, path: Path) -> Path:
    """Held-out lines of the domain (WikiText-2 test) as language modelling: a line's last word given the rest."""
    lines = [ln.strip() for ln in (data / "corpus" / "en" / "wikitext-2.test.txt").read_text().splitlines()]
    lines = [ln for ln in lines if 60 < len(ln) < 400 and not ln.startswith("=")][:ITEMS]
    with open(path, "w") as f:
        for ln in lines:
            ctx, _, last = ln.rpartition(" ")
            f.write(json.dumps({"context": ctx, "continuation": last}) + "\n")
    return path


def _make(folder: Path, trained: Path, data: Path) -> None:
    from gristmill.evaluation.tasks import TaskSpec
    from gristmill.trainer import eval_models as models
    from gristmill.trainer.evaluate import evaluate
    from gristmill.trainer.train import train

    task = _lm_task(data, folder / "heldout.jsonl")
    tokens = {
        "domain": trained / "tokens",
        "shuffled": _shuffled_tokens(trained / "tokens", folder / "shuffled-tokens"),
    }
    runs = [("domain", 0), ("domain", 1), ("shuffled", 0), ("shuffled", 1), ("domain", 2), ("domain", 3)]
    for variant, seed in runs:
        out = folder / f"{variant}-s{seed}"
        with one_torch_thread():
            cfg = tiny_cfg(
                tokens[variant],
                STEPS,
                "data.seq_len=128",
                "checkpoint.every=30",
                "eval.batches=0",
                "optim.lr=3e-3",
                f"seed={seed}",
                f"data.seed={seed}",
            )
            train(cfg, out)
            model = models.load(out, device="cpu")
            evaluate(model, [TaskSpec(path=str(task), name="heldout")], out=out / "scored")


@pytest.fixture(scope="module")
def ablation(trained, tmp_path_factory, shared_data) -> Path:
    return made_once(tmp_path_factory, "eval-planted-ablation", lambda f: _make(f, trained, shared_data))


def test_domain_text_beats_shuffled_tokens(ablation):
    domain = [ablation / "domain-s0" / "scored", ablation / "domain-s1" / "scored"]
    shuffled = [ablation / "shuffled-s0" / "scored", ablation / "shuffled-s1" / "scored"]
    c = compare(domain, shuffled, "heldout", "loglikelihood")
    assert c.verdict == "better" and c.ci[0] > 0 and c.se_seeds > 0 and c.df > 0
    assert compare(shuffled, domain, "heldout", "loglikelihood").verdict == "worse"


def test_identical_variants_with_other_seeds_are_not_distinguishable(ablation):
    a = [ablation / "domain-s0" / "scored", ablation / "domain-s1" / "scored"]
    b = [ablation / "domain-s2" / "scored", ablation / "domain-s3" / "scored"]
    c = compare(a, b, "heldout", "loglikelihood")
    assert c.verdict == "not distinguishable" and c.ci[0] < 0 < c.ci[1]
    # the seeds did train different models: the scores differ item by item
    from gristmill.evaluation.compare import side

    _, sa = side(a, "heldout", "loglikelihood")
    _, sb = side(b, "heldout", "loglikelihood")
    assert not np.allclose(sa, sb)


def test_evaluations_of_other_items_are_refused(ablation, tmp_path):
    a = ablation / "domain-s0" / "scored"
    short = tmp_path / "short"
    (short / "items").mkdir(parents=True)
    lines = (a / "items" / "heldout.jsonl").read_text().splitlines()[:10]
    (short / "items" / "heldout.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CompareError, match="not the same heldout items"):
        compare([a], [short], "heldout", "loglikelihood")
    with pytest.raises(CompareError, match="no score 'acc_norm'"):
        compare([a], [a], "heldout", "acc_norm")
    with pytest.raises(CompareError, match="no per-item scores of task 'piqa'"):
        compare([a], [a], "piqa")


def test_the_command_prints_one_verdict_per_task(ablation, capsys):
    from gristmill.cli import main

    a = ",".join(str(ablation / f"domain-s{s}" / "scored") for s in (0, 1))
    b = ",".join(str(ablation / f"shuffled-s{s}" / "scored") for s in (0, 1))
    assert main(["eval-compare", "--a", a, "--b", b, "--tasks", "heldout", "--metric", "loglikelihood"]) == 0
    out = capsys.readouterr()
    assert "heldout loglikelihood: A - B = +" in out.out + out.err and ": better" in out.out + out.err
    assert main(["eval-compare", "--a", a, "--b", b, "--tasks", "piqa"]) == 2
    assert "no per-item scores of task 'piqa'" in capsys.readouterr().err
