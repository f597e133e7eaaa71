"""`pipeline ablate` end to end on the real WET sample, on CPU: the demo recipe against the same
recipe without its dedup steps (they plan the same curate stage), one BPE trained on both, the
tiny model trained for 40 steps per variant and seed (two seeds), scored on COPA and LAMBADA
during training; then what a re-run after a killed training redoes (nothing finished), the
`--plan` figures, and bad input."""

from __future__ import annotations

import json
import os
import xml.dom.minidom
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, made_once
from tests.pipeline.conftest import demo_config
from tests.trainer.conftest import one_torch_thread

STEPS = 40


def _ablate_yaml(folder: Path, shared_data: Path, **changes) -> Path:
    """configs/ablate-tiny.yaml with its base config made absolute and its output in `folder`."""
    base = folder / "crawl.yaml"
    if not base.is_file():
        base.write_text(yaml.safe_dump(demo_config(shared_data, folder / "unused"), sort_keys=False))
    data = yaml.safe_load((REPO / "configs" / "ablate-tiny.yaml").read_text())
    data.update(base=str(base), out=str(folder / "out"))
    data["eval"]["tasks_file"] = str(REPO / "configs" / "eval" / "tasks.yaml")
    data.update(changes)
    path = folder / "ablate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(autouse=True)
def _data_env(shared_data, monkeypatch):
    monkeypatch.setenv("GRISTMILL_DATA", str(shared_data))


def _make(folder: Path, shared_data: Path) -> None:
    """The ablation run twice: the first time its third training is stopped after step 20 (its
    checkpoint kept) and fails, as a killed one would; the second run finishes it. What each
    launch was asked to train is recorded in launches.json."""
    from rich.console import Console

    from gristmill.ablation.config import load
    from gristmill.ablation.run import Ablation, AblationFailed
    from gristmill.trainer.launch import launch

    os.environ["GRISTMILL_DATA"] = str(shared_data)
    cfg = load(_ablate_yaml(folder, shared_data))
    launches: list[list] = [[], []]

    def in_process(tcfg, out, nproc):
        """The trainer's loop in this process: what torchrun's rank runs, without two interpreters'
        start-up per training (the killed and the resumed training go through the launcher)."""
        from gristmill.trainer.launch import check_tokens, write_resolved
        from gristmill.trainer.train import train

        check_tokens(tcfg)
        write_resolved(tcfg.model_copy(update={"out_dir": str(out)}), out)
        train(tcfg, out)
        return 0

    def killed_third(tcfg, out, nproc):
        launches[0].append(out.name)
        if len(launches[0]) == 3:
            launch(tcfg.model_copy(update={"stop_after": 20}), out, nproc)
            return 1
        return in_process(tcfg, out, nproc)

    def recorded(tcfg, out, nproc):
        launches[1].append(out.name)
        return launch(tcfg, out, nproc) if len(launches[1]) == 1 else in_process(tcfg, out, nproc)

    with one_torch_thread():
        with pytest.raises(AblationFailed, match="re-run the same command to resume"):
            Ablation(cfg, Console(stderr=True), launch=killed_third).run()
        first = {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in _finished_files(folder / "out")}
        assert Ablation(cfg, Console(stderr=True), launch=recorded).run() == 0
    (folder / "launches.json").write_text(json.dumps(launches))
    (folder / "mtimes.json").write_text(json.dumps(first))


def _finished_files(out: Path) -> list[Path]:
    """What the first run finished: curation's task logs, the tokenizer, the token manifests and
    the first two trainings' summaries."""
    files = [*out.glob("curate/*/*/logs/task_*.log"), out / "tokenizer" / "tokenizer.json"]
    done = [p for p in out.glob("train/*/summary.json") if json.loads(p.read_text())["steps"] == STEPS]
    files += [*out.glob("tokens/*/tokens/manifest.json"), *done]
    return files


@pytest.fixture(scope="module")
def ablation(tmp_path_factory, shared_data, lid_model, kenlm_model, quality_model) -> Path:
    return made_once(tmp_path_factory, "ablation-tiny", lambda f: _make(f, shared_data))


def test_outputs_of_an_ablation(ablation):
    out = ablation / "out"
    results = json.loads((out / "results.json").read_text())
    assert results["baseline"] == "crawl" and set(results["variants"]) == {"crawl", "crawl-nodedup"}
    for name, v in results["variants"].items():
        assert v["documents_kept"] > 0 and v["train_tokens"] > 0 and v["epochs"] > 0, name
        assert v["seeds"] == [0, 1]
    # dedup removed repeated paragraphs: the variant without it has more tokens
    assert results["variants"]["crawl-nodedup"]["train_tokens"] > results["variants"]["crawl"]["train_tokens"]
    assert set(results["tasks"]) == {"copa", "lambada_openai"}
    assert results["tasks"]["copa"]["metric"] == "acc_norm"
    assert results["tasks"]["lambada_openai"]["metric"] == "loglikelihood"
    for task, entry in results["tasks"].items():
        c = entry["vs_baseline"]["crawl-nodedup"]
        assert c["verdict"].split(" (")[0] in ("better", "worse", "not distinguishable"), task
        assert c["ci95"][0] <= c["diff"] <= c["ci95"][1] and c["se_seeds"] is not None
        curve = entry["curves"]["crawl"]
        assert [p["step"] for p in curve] == [20, 40] and [p["tokens"] for p in curve] == [20480, 40960]
        assert all(p["min"] <= p["mean"] <= p["max"] and len(p["seeds"]) == 2 for p in curve)
    md = (out / "results.md").read_text()
    assert "| copa (acc_norm) | crawl-nodedup |" in md and "01_curate: computed in crawl" in md
    for svg in ("copa", "lambada_openai", "differences"):
        doc = xml.dom.minidom.parse(str(out / "plots" / f"{svg}.svg"))  # well-formed
        assert doc.documentElement.tagName == "svg" and doc.getElementsByTagName(
            "polyline" if svg != "differences" else "circle"
        )
    for run in ("crawl-s0", "crawl-s1", "crawl-nodedup-s0", "crawl-nodedup-s1"):
        summary = json.loads((out / "train" / run / "summary.json").read_text())
        assert summary["steps"] == STEPS
        assert (out / "train" / run / "eval" / "step-00000040" / "copa.jsonl").is_file()


def test_one_tokenizer_for_every_variant(ablation):
    out = ablation / "out"
    meta = json.loads((out / "tokenizer" / "meta.json").read_text())
    assert meta["variants"] == ["crawl", "crawl-nodedup"] and meta["vocab_size"] == 512
    shas = {json.loads(p.read_text())["tokenizer"]["sha256"] for p in out.glob("tokens/*/tokens/manifest.json")}
    assert len(shas) == 1 and len(list(out.glob("tokens/*/tokens/manifest.json"))) == 2


def test_a_shared_stage_ran_once(ablation):
    out = ablation / "out"
    a, b = out / "curate" / "crawl" / "01_curate", out / "curate" / "crawl-nodedup" / "01_curate"
    # the variant without dedup got the stage's files as links, not a second run's files
    for rel in ("logs/task_00000.log", "completions/00000", "completions/00001"):
        assert (a / rel).stat().st_ino == (b / rel).stat().st_ino, rel
    outputs = sorted(p.relative_to(a) for p in (a / "output").rglob("*.parquet"))
    assert outputs and all((a / p).stat().st_ino == (b / p).stat().st_ino for p in outputs)
    registry = json.loads((out / "stages.json").read_text())
    shared = [v for v in registry.values() if v.get("shared_with")]
    assert [(v["label"], v["variant"], v["shared_with"]) for v in shared] == [("01_curate", "crawl", ["crawl-nodedup"])]
    # the dedup stages are the baseline's alone
    assert not (out / "curate" / "crawl-nodedup" / "02_exact_dedup_hash").exists()


def test_a_rerun_after_a_killed_training_redoes_nothing_finished(ablation):
    first, second = json.loads((ablation / "launches.json").read_text())
    assert first == ["crawl-s0", "crawl-s1", "crawl-nodedup-s0"]
    assert second == ["crawl-nodedup-s0", "crawl-nodedup-s1"]  # the killed one and the one never started
    resumed = json.loads((ablation / "out" / "train" / "crawl-nodedup-s0" / "summary.json").read_text())
    assert resumed["trained_steps"] == STEPS - 20  # from its step-20 checkpoint, not from the start
    before = json.loads((ablation / "mtimes.json").read_text())
    assert len(before) >= 10 and sum(k.endswith("summary.json") for k in before) == 2
    for rel, mtime in before.items():
        assert (ablation / rel).stat().st_mtime_ns == mtime, f"{rel} was rewritten"


def test_a_rerun_with_another_budget_is_refused(ablation, shared_data):
    """Changed after training, the budget (or seed, model, tasks) would resume a training into another
    one: refused, naming the run and the setting, before anything is launched."""
    from rich.console import Console

    from gristmill.ablation.config import load
    from gristmill.ablation.run import Ablation
    from gristmill.core.configlib import ConfigError

    cfg = load(ablation / "ablate.yaml", ["tokens=81920"])

    def never(*args):
        raise AssertionError("launched a training")

    with pytest.raises(ConfigError, match=r"crawl-s0 was trained with another configuration \(steps: 40 -> 80"):
        Ablation(cfg, Console(stderr=True), launch=never).run("train")


def test_plan_prints_cpu_and_gpu_hours_disk_and_wall(
    tmp_path, shared_data, capsys, lid_model, kenlm_model, quality_model
):
    from gristmill.cli import main

    path = _ablate_yaml(tmp_path, shared_data)
    assert main(["ablate", str(path), "--plan", "--json", "--gpu", "h200"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["curation"]["cpu_hours"] > 0 and plan["curation"]["disk_bytes"] > 0
    assert plan["curation"]["shared_stages"] == 1  # 01_curate, planned by both variants
    assert plan["training"]["runs"] == 4 and plan["training"]["steps"] == STEPS
    assert plan["training"]["gpu_hours"] > 0 and plan["training"]["checkpoint_bytes"] > 0
    assert plan["wall_s"] > 0 and plan["disk_bytes"] > 0
    assert not (tmp_path / "out").exists()  # nothing ran
    assert main(["ablate", str(path), "--plan"]) == 0
    text = capsys.readouterr().err
    assert "CPU-hours" in text and "GPU-hours" in text and "wall" in text


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    return err


def test_bad_input_is_one_error_naming_it(tmp_path, shared_data, capsys):
    from gristmill.cli import main

    def ablate(**changes) -> int:
        return main(["ablate", str(_ablate_yaml(tmp_path, shared_data, **changes)), "--plan"])

    assert ablate(base=str(tmp_path / "missing.yaml")) == 2
    assert "base: " in (err := _error(capsys)) and "missing.yaml: run config not found" in err
    assert ablate(variants={"crawl": {}, "b": {"sett": ["x=1"]}}) == 2
    assert "variants.b.sett" in _error(capsys)
    assert ablate(variants={"crawl": {}, "b": {"drop": ["no_such_step"]}}) == 2
    assert "variants.b.drop: no step 'no_such_step'" in _error(capsys)
    assert ablate(variants={"crawl": {}, "b": {"set": ["steps[1].langid.bogus=1"]}}) == 2
    assert "variant b" in (err := _error(capsys)) and "steps[1].langid.bogus" in err
    assert ablate(variants={"crawl": {}}) == 2
    assert "at least two variants" in _error(capsys)
    gpt2 = str(shared_data / "tokenizers" / "gpt2")
    path = _ablate_yaml(tmp_path, shared_data, tokenizer={"path": gpt2, "vocab_size": 512})
    assert main(["ablate", str(path)]) == 2
    assert "has a vocabulary of 50,257, not the 512 of tokenizer.vocab_size" in _error(capsys)
    path = _ablate_yaml(tmp_path, shared_data)
    assert main(["ablate", str(path), "--only", "train"]) == 1  # nothing curated yet
    assert "variant crawl: no token shards" in (err := capsys.readouterr().err) and "--only curate" in err
    path = _ablate_yaml(tmp_path, shared_data, tasks=["no_such_task"])
    assert main(["ablate", str(path)]) == 2
    assert "task 'no_such_task'" in _error(capsys)
    assert not (tmp_path / "out" / "curate").exists()  # refused before any curation


def test_a_variant_that_keeps_nothing_is_left_out(tmp_path, shared_data, capsys, lid_model):
    """A variant whose curation keeps no document is named and left out; the others are curated
    and tokenized (the curation phase alone: no training needed to show it)."""
    from gristmill.cli import main

    base = tmp_path / "langid.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "executor": {"tasks": 2, "workers": 2},
                "input": {"paths": [str(shared_data / "cc" / "wet" / "*.warc.wet.gz")]},
                "steps": [{"langid": {"model": str(REPO / "models" / "lid.176.ftz"), "languages": ["en"]}}],
            }
        )
    )
    variants = {"en": {}, "none": {"set": ["steps[0].langid.min_score=1.0"]}}
    path = _ablate_yaml(tmp_path, shared_data, base=str(base), variants=variants, baseline="en")
    assert main(["ablate", str(path), "--only", "curate"]) == 1
    err = capsys.readouterr().err
    assert "variant none left out: its curation kept no documents (of 609 read" in err
    state = json.loads((tmp_path / "out" / "variants.json").read_text())
    assert state["none"]["kept"] == 0 and "skipped" in state["none"] and "tokens" not in state["none"]
    assert state["en"]["kept"] > 0 and (tmp_path / "out" / state["en"]["tokens"] / "manifest.json").is_file()
