"""Per item, `pipeline eval`'s predictions are lm-evaluation-harness's (0.4.13, HFLM on CPU,
offline, the same file through a `dataset_path: json` task YAML), on the HF directory
`export-hf` wrote for a tiny trained model: every layout (multiple choice 0- and 3-shot,
schema 5-shot, language modelling), and BoolQ, whose passages exceed the model's 256 tokens
(both truncate from the left). Log-likelihoods agree to float32 rounding (ours runs our model,
lm-eval transformers' LlamaForCausalLM)."""

from __future__ import annotations

import math

import pytest

from gristmill.evaluation.lm_eval_tasks import write_task_dir
from gristmill.evaluation.tasks import load_tasks_file, read_records, resolve_tasks
from gristmill.trainer import eval_models as models
from gristmill.trainer.evaluate import evaluate_task

TASKS = ["piqa", "arc_easy", "copa", "winogrande", "lambada_openai", "boolq"]
LIMIT = 8


@pytest.fixture(scope="module")
def both(trained, tmp_path_factory, shared_data):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    mp = pytest.MonkeyPatch()
    mp.setenv("GRISTMILL_DATA", str(shared_data))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-datasets")))
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    try:
        specs = resolve_tasks(TASKS, load_tasks_file(), "tasks.yaml")
        folder = tmp_path_factory.mktemp("lm-eval-tasks")
        names = write_task_dir([(s, read_records(s.path)[0]) for s in specs], folder)
        model = models.load(trained / "hf", device="cpu")
        ours = {s.name: evaluate_task(model, s, limit=LIMIT) for s in specs}
        res = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={trained / 'hf'},dtype=float32",
            tasks=names,
            task_manager=TaskManager(include_path=str(folder)),
            limit=LIMIT,
            log_samples=True,
            device="cpu",
            batch_size=8,
            fewshot_random_seed=1234,
        )
    finally:
        mp.undo()
    theirs = {s.name: sorted(res["samples"][n], key=lambda x: x["doc_id"]) for s, n in zip(specs, names)}
    summary = {s.name: res["results"][n] for s, n in zip(specs, names)}
    return ours, theirs, summary


@pytest.mark.parametrize("task", TASKS)
def test_per_item_predictions_equal_lm_eval(both, task):
    ours, theirs, summary = both
    ours_summary, rows = ours[task]
    assert sum(ours_summary["skipped"].values()) == 0  # lm-eval stops on what we would skip
    assert [r["index"] for r in rows] == [s["doc_id"] for s in theirs[task]] == list(range(LIMIT))
    for r, s in zip(rows, theirs[task]):
        lls = [float(x[0]) for x in s["filtered_resps"]]
        greedy = [bool(x[1]) for x in s["filtered_resps"]]
        assert r["lls"] == pytest.approx(lls, abs=2e-4), f"{task} item {r['index']}"
        assert r["scores"]["acc"] == s["acc"], f"{task} item {r['index']}"
        if "acc_norm" in s:
            assert r["scores"]["acc_norm"] == s["acc_norm"], f"{task} item {r['index']}"
        if r["layout"] == "lm":
            assert r["greedy"] == greedy
    assert ours_summary["acc"] == pytest.approx(summary[task]["acc,none"])
    if ours_summary["layout"] == "lm":
        assert math.log(ours_summary["perplexity"]) == pytest.approx(
            math.log(summary[task]["perplexity,none"]), rel=1e-5
        )
    if task == "boolq":
        assert ours_summary["truncated"] > 0
