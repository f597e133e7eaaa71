"""`pipeline eval` on a tiny model trained on WikiText-2: the three forms of MODEL give the same
scores, results and per-item files are written, truncation and skips are counted, a tokenizer
of another vocabulary is refused; the statistics behave."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gristmill.cli import main
from gristmill.evaluation.stats import bootstrap_ci, centred, paired_bootstrap
from gristmill.trainer import eval_models as models

TASKS = "piqa,winogrande,lambada_openai,boolq"


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory, shared_data):
    """results.json of `pipeline eval` on the run folder, its first checkpoint and the HF export."""
    out = {}
    for name, model in [
        ("run", trained / "run"),
        ("ckpt20", trained / "run" / "checkpoints" / "step-00000020"),
        ("hf", trained / "hf"),
    ]:
        d = tmp_path_factory.mktemp(f"eval-{name}")
        argv = ["eval", str(model), "--tasks", TASKS, "--out", str(d), "--limit", "12", "--device", "cpu"]
        if name == "run":
            argv += ["--corpora", "wikitext2", "--corpus-tokens", "3000"]
        assert main(argv) == 0
        out[name] = (d, json.loads((d / "results.json").read_text()))
    return out


def test_results_and_items_are_written(evaluated):
    d, res = evaluated["run"]
    assert res["model"].endswith("step-00000040") and res["model_kind"] == "checkpoint"
    assert set(res["tasks"]) == set(TASKS.split(","))
    piqa = res["tasks"]["piqa"]
    assert piqa["layout"] == "mc" and piqa["items"] + sum(piqa["skipped"].values()) == 12
    lo, hi = piqa["acc_ci95"]
    assert lo <= piqa["acc"] <= hi and piqa["chance"] == 0.5
    assert piqa["centred"] == pytest.approx((piqa["acc"] - 0.5) / 0.5)
    assert res["tasks"]["winogrande"]["layout"] == "schema" and "acc_norm" not in res["tasks"]["winogrande"]
    lam = res["tasks"]["lambada_openai"]
    assert lam["layout"] == "lm" and lam["chance"] == 0 and lam["perplexity"] > 1
    # BoolQ's passages are longer than the model's 256 tokens: truncated from the left, counted
    assert res["tasks"]["boolq"]["truncated"] > 0 and res["tasks"]["boolq"]["truncated_tokens"] > 0
    assert res["core"] == pytest.approx(np.mean([t["centred"] for t in res["tasks"].values()]))
    wt = res["corpora"]["wikitext2"]
    assert wt["tokens"] == 3000 and 0.5 < wt["bits_per_byte"] < 8
    rows = [json.loads(line) for line in open(d / "items" / "piqa.jsonl")]
    assert len(rows) == piqa["items"] and all(len(r["lls"]) == 2 for r in rows)
    assert np.mean([r["scores"]["acc"] for r in rows]) == piqa["acc"]
    assert all(r["pred"] == int(np.argmax(r["lls"])) for r in rows)


def test_the_export_scores_as_the_checkpoint(evaluated):
    """The HF export (loaded into our model through its config.json) and the run folder's newest
    checkpoint it was made from: the same log-likelihoods."""
    run_dir, run = evaluated["run"]
    hf_dir, hf = evaluated["hf"]
    assert hf["model_kind"] == "hf-llama"
    for task in TASKS.split(","):
        a = [json.loads(line)["lls"] for line in open(run_dir / "items" / f"{task}.jsonl")]
        b = [json.loads(line)["lls"] for line in open(hf_dir / "items" / f"{task}.jsonl")]
        np.testing.assert_allclose(np.concatenate(a), np.concatenate(b), rtol=1e-5, atol=1e-4)
    # the earlier checkpoint is another model
    ck = evaluated["ckpt20"][1]
    assert ck["model"].endswith("step-00000020")
    assert ck["tasks"]["lambada_openai"]["perplexity"] != run["tasks"]["lambada_openai"]["perplexity"]


def test_a_tokenizer_of_another_vocabulary_is_refused(trained, shared_data, tmp_path, capsys):
    gpt2 = tmp_path / "gpt2"
    from gristmill.tokenize.tokenizer import load

    gpt2.mkdir()
    (gpt2 / "tokenizer.json").write_text(load(shared_data / "tokenizers" / "gpt2").to_str())
    code = main(
        ["eval", str(trained / "hf"), "--tasks", "copa", "--out", str(tmp_path / "o"), "--tokenizer", str(gpt2)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "the model's vocabulary has 512 ids, its tokenizer" in err and "50,257" in err
    with pytest.raises(models.ModelError, match="another vocabulary"):
        models.load(trained / "run", tokenizer=str(gpt2))


def test_bad_model_and_task_arguments_are_one_line(trained, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nothing"), "--tasks", "copa", "--out", str(tmp_path / "o")]) == 2
    assert "no such model" in capsys.readouterr().err
    assert main(["eval", str(trained / "hf"), "--tasks", "copa,nope", "--out", str(tmp_path / "o")]) == 2
    assert "task 'nope': neither a task of configs/eval/tasks.yaml" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "choices": ["a", "b"], "gold": 3}) + "\n")
    assert main(["eval", str(trained / "hf"), "--tasks", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1: 'gold' 3 is out of range for 2 choices" in capsys.readouterr().err


def test_a_checkpoint_that_fails_its_checksums_is_not_scored(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    victim = next((run / "checkpoints" / "step-00000040").glob("*.distcp"))
    victim.write_bytes(victim.read_bytes()[:-8])
    m = models.load(run, device="cpu")  # the newest intact one instead, said on stderr
    assert m.source.endswith("step-00000020")
    assert "step-00000040" in capsys.readouterr().err


def test_statistics():
    assert centred(0.25, 0.25) == 0 and centred(1.0, 0.25) == 1
    lo, hi = bootstrap_ci([1.0] * 50 + [0.0] * 50)
    assert 0.38 < lo < 0.5 < hi < 0.62
    rng = np.random.default_rng(0)
    base = rng.random((2, 400)) < 0.5
    better = base | (rng.random((2, 400)) < 0.3)  # flips ~30% of the misses to hits
    # two "seeds" of the same model: items as hard for both, each side's own coin flips
    p = rng.random(400)
    same = rng.random((2, 400)) < p
    again = rng.random((2, 400)) < p
    assert paired_bootstrap(better, base).verdict == "better"
    assert paired_bootstrap(base, better).verdict == "worse"
    assert paired_bootstrap(same, again).verdict == "not distinguishable"
    with pytest.raises(ValueError, match="not the same items"):
        paired_bootstrap(base, base[:, :10])


def test_scores_during_training_are_pipeline_evals_of_that_step(trained, shared_data, monkeypatch):
    """The train YAML's eval.tasks/eval.corpora, scored at steps 20 and 40 into metrics.jsonl
    under eval/<task>/<metric>, with tokens seen; the same figures as `pipeline eval`'s scoring
    of the checkpoint of that step, item by item."""
    from gristmill.evaluation.tasks import load_tasks_file, resolve_tasks
    from gristmill.trainer.evaluate import evaluate_task

    from .conftest import TRAIN_LIMIT, TRAIN_TASKS

    recs = [json.loads(line) for line in open(trained / "run" / "metrics.jsonl")]
    scored = [r for r in recs if "eval/core" in r]
    assert [r["step"] for r in scored] == [20, 40]
    assert scored[0]["tokens"] == 20 * scored[1]["tokens"] // 40 > 0
    assert all(0 < r["eval/wikitext2_valid/bits_per_byte"] < 10 for r in scored)
    monkeypatch.setenv("GRISTMILL_DATA", str(shared_data))
    model = models.load(trained / "run" / "checkpoints" / "step-00000020", device="cpu")
    for spec in resolve_tasks(list(TRAIN_TASKS), load_tasks_file(), "tasks.yaml"):
        summary, rows = evaluate_task(model, spec, limit=TRAIN_LIMIT)
        assert scored[0][f"eval/{spec.name}/acc"] == summary["acc"]
        assert scored[0][f"eval/{spec.name}/centred"] == pytest.approx(summary["centred"])
        during = [json.loads(line) for line in open(trained / "run" / "eval" / "step-00000020" / f"{spec.name}.jsonl")]
        np.testing.assert_allclose([x["lls"] for x in during], [r["lls"] for r in rows], rtol=1e-5, atol=1e-4)
