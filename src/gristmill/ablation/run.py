"""The ablation, phase by phase; each phase finishes only what is missing.

    curate     each variant's `pipeline run` (its executor: local, Slurm, Ray) into
               <out>/curate/<variant>/, stages planned alike shared (`sharing`)
    tokenizer  <out>/tokenizer/tokenizer.json: the given file, or a BPE trained on a sample of
               the union of the variants' final documents (by id hash, each document once)
    tokenize   every variant's final documents with that tokenizer → <out>/tokens/<variant>/tokens/
    train      every variant × seed for the same token budget through `pipeline train`'s
               launcher (torchrun), scored on the tasks during training → <out>/train/<variant>-s<seed>/
    report     results.json, results.md and SVG plots (`report`)

<out>/variants.json says what curation and tokenization gave each variant (paths relative to
<out>), so training can run elsewhere (a GPU machine) on a copy of <out> alone.
"""

from __future__ import annotations

import heapq
import json
import os
from pathlib import Path

from rich.console import Console

from gristmill.ablation.config import AblateConfig, TrainRun, task_names, train_steps, variant_config
from gristmill.core.configlib import ConfigError
from gristmill.core.files import write_text_atomic

PHASES = ("curate", "train")


class AblationFailed(RuntimeError):
    """A phase could not finish; the message says what to re-run."""


class Ablation:
    def __init__(self, cfg: AblateConfig, console: Console | None = None, launch=None, command=None):
        self.cfg, self.console = cfg, console or Console(stderr=True)
        self.out = cfg.out_dir
        self._launch = launch  # (TrainConfig, out_dir, nproc) -> exit code; default: the trainer's launcher
        self.command = command

    # --- bookkeeping ----------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.out / "variants.json"

    def state(self) -> dict:
        return json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}

    def save_state(self, state: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.state_file, json.dumps(state, indent=2))

    def say(self, line: str, style: str = "") -> None:
        self.console.print(f"[{style}]{line}[/]" if style else line, markup=bool(style), highlight=False)

    # --- the whole ablation -----------------------------------------------------------------

    def run(self, only: str | None = None) -> int:
        """Every phase, or `only` "curate" (curate, tokenizer, tokenize) or "train" (train,
        report: on the token shards curation left in <out>). Returns the exit code: 0, or 1
        when a variant was left out (its curation kept nothing)."""
        self.out.mkdir(parents=True, exist_ok=True)
        from gristmill.dirlock import hold

        with hold(self.out, "ablation output"):
            if only in (None, "curate"):
                self.check_eval()  # a bad task name or tokenizer stops the ablation before any curation
                self.check_tokenizer()
                state = self.curate()
                tok = self.tokenizer(state)
                self.tokenize_all(state, tok)
            if only in (None, "train"):
                state = self.state()
                missing = [n for n in self.cfg.names() if n not in state or "tokens" not in state[n]]
                missing = [n for n in missing if not state.get(n, {}).get("skipped")]
                if missing:
                    raise AblationFailed(
                        f"variant {missing[0]}: no token shards in {self.out}/tokens/{missing[0]};"
                        " run the curation first (`pipeline ablate CONFIG --only curate`)"
                    )
                self.check_eval()
                runs = self.train_all(state)
                from gristmill.ablation.report import write_report

                results = write_report(self.cfg, state, runs, self.out)
                for line in results["verdict_lines"]:
                    self.say(line)
                self.say(f"wrote {self.out / 'results.json'}, {self.out / 'results.md'} and {self.out}/plots/", "green")
        skipped = {n: s["skipped"] for n, s in self.state().items() if s.get("skipped")}
        for name, why in skipped.items():
            self.say(f"variant {name} left out: {why}", "red")
        return 1 if skipped else 0

    # --- curation ------------------------------------------------------------------------------

    def curate(self) -> dict:
        from gristmill.ablation.sharing import StageRegistry, stage_keys
        from gristmill.pipeline.planning.planner import plan
        from gristmill.pipeline.report.journey import funnel
        from gristmill.pipeline.runner import run

        state = self.state()
        registry = StageRegistry(self.out)
        configs = {name: variant_config(self.cfg, name) for name in self.cfg.names()}
        # every variant planned (its models and inputs checked) before the first one runs
        plans = {name: plan(vcfg) for name, vcfg in configs.items()}
        for name, vcfg in configs.items():
            run_dir = Path(vcfg.run_dir)
            stages = plans[name]
            keys = stage_keys(vcfg, stages)
            linked = registry.share(name, run_dir, stages, keys)
            if linked:
                self.say(f"variant {name}: {len(linked)} stages shared with an earlier variant ({', '.join(linked)})")
            self.say(f"variant {name}: curating into {run_dir}", "bold")
            command = [*(self.command or ["pipeline", "ablate"])]
            merged = run(vcfg, console=self.console, wait=True, command=command)
            final = stages[-1].output
            rows = funnel(merged)
            read = next((r.docs_out for r in rows if r.kind == "reader"), 0)
            kept = _count_documents(final)
            entry = state.get(name, {})
            entry.update(
                run_dir=_rel(run_dir, self.out),
                documents=_rel(final, self.out),
                read=read,
                kept=kept,
                stages=[s.label for s in stages],
                stage_keys=keys,
            )
            entry.pop("skipped", None)
            if kept == 0:
                why = f"its curation kept no documents (of {read:,} read; see `pipeline stats {run_dir}`)"
                if name == self.cfg.baseline:
                    raise AblationFailed(f"variant {name} (the baseline): {why}")
                entry["skipped"] = why
                entry.pop("tokens", None)
                self.say(f"variant {name}: {why}; it is left out, the others go on", "red")
            state[name] = entry
            self.save_state(state)
        return state

    # --- one tokenizer ---------------------------------------------------------------------------

    def check_tokenizer(self) -> None:
        """A given tokenizer loads and has the vocabulary the config says and the model can hold."""
        from gristmill.tokenize import tokenizer as bpe

        spec = self.cfg.tokenizer
        if spec.path is None:
            vocab = spec.train.vocab_size
        else:
            try:
                vocab = bpe.special_ids(bpe.load(spec.path), where=spec.path).vocab_size
            except bpe.TokenizerError as e:
                raise ConfigError(f"tokenizer.path: {e}") from None
            if spec.vocab_size is not None and vocab != spec.vocab_size:
                raise ConfigError(
                    f"tokenizer.path: {spec.path} has a vocabulary of {vocab:,}, not the"
                    f" {spec.vocab_size:,} of tokenizer.vocab_size"
                )
        name = self.cfg.baseline
        self.train_config(name, self.cfg.seeds[0], {name: {"tokens": "tokens", "vocab_size": vocab}})

    def tokenizer(self, state: dict) -> Path:
        """<out>/tokenizer/tokenizer.json (made once), checked against the config's vocabulary."""
        from gristmill.tokenize import tokenizer as bpe

        spec = self.cfg.tokenizer
        folder = self.out / "tokenizer"
        path = folder / "tokenizer.json"
        meta_path = folder / "meta.json"
        if spec.path is not None:
            try:
                tok = bpe.load(spec.path)
                info = bpe.special_ids(tok, where=spec.path)
            except bpe.TokenizerError as e:
                raise ConfigError(f"tokenizer.path: {e}") from None
            if spec.vocab_size is not None and info.vocab_size != spec.vocab_size:
                raise ConfigError(
                    f"tokenizer.path: {spec.path} has a vocabulary of {info.vocab_size:,}, not the"
                    f" {spec.vocab_size:,} of tokenizer.vocab_size"
                )
            text = tok.to_str(pretty=True)
            if path.is_file() and path.read_text() != text:
                raise ConfigError(
                    f"tokenizer.path: {spec.path} is not the tokenizer {self.out} was tokenized with ({path});"
                    " use another out, or remove its tokens/ and tokenizer/"
                )
            folder.mkdir(parents=True, exist_ok=True)
            if not path.is_file():
                write_text_atomic(path, text)
                write_text_atomic(meta_path, json.dumps({"source": spec.path, "vocab_size": info.vocab_size}))
            return path
        if path.is_file():
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
            if meta.get("vocab_size_asked") not in (None, spec.train.vocab_size):
                raise ConfigError(
                    f"tokenizer.train.vocab_size: {spec.train.vocab_size:,}, but {path} was trained with"
                    f" {meta['vocab_size_asked']:,}; use another out, or remove its tokens/ and tokenizer/"
                )
            self.say(f"tokenizer: {path} already trained")
            return path
        names = [n for n in self.cfg.names() if not state[n].get("skipped")]
        folders = [self.out / state[n]["documents"] for n in names]
        sample = union_sample(folders, spec.sample_bytes)
        from gristmill.tokenize.stages import training_pieces

        self.say(
            f"tokenizer: training a {spec.train.vocab_size:,}-entry BPE on {len(sample):,} documents"
            f" ({sum(len(t.encode()) for t in sample) / 1e6:.1f} MB) of {len(names)} variants"
        )
        texts = (piece for t in sample for piece in training_pieces(t))
        tok = bpe.train(texts, spec.train.vocab_size, spec.train.min_frequency, length=len(sample))
        info = bpe.special_ids(tok)
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, tok.to_str(pretty=True))
        write_text_atomic(
            meta_path,
            json.dumps(
                {
                    "source": "trained",
                    "vocab_size_asked": spec.train.vocab_size,
                    "vocab_size": info.vocab_size,
                    "variants": names,
                    "documents": len(sample),
                }
            ),
        )
        return path

    def tokenize_all(self, state: dict, tok: Path) -> None:
        from gristmill.ablation.sharing import stage_complete
        from gristmill.pipeline.execution.executors import make_executor
        from gristmill.pipeline.planning.on_parquet import plan_on_parquet
        from gristmill.pipeline.report.journey import merge_stage
        from gristmill.tokenize.tokenizer import sha256_file

        want = sha256_file(tok)
        t = self.cfg.tokenize
        for name in self.cfg.names():
            entry = state[name]
            if entry.get("skipped"):
                continue
            folder = self.out / "tokens" / name
            manifest_path = folder / "tokens" / "manifest.json"
            if manifest_path.is_file():
                manifest = json.loads(manifest_path.read_text())
                if manifest["tokenizer"]["sha256"] != want:
                    raise ConfigError(
                        f"variant {name}: {manifest_path} was encoded with another tokenizer (sha256"
                        f" {manifest['tokenizer']['sha256'][:12]}…, not {want[:12]}…); remove {folder} to re-encode"
                    )
            else:
                vcfg = variant_config(self.cfg, name)
                tasks = t.tasks or vcfg.executor.tasks
                params = {
                    "tokenizer": {"path": str(tok)},
                    "shard_tokens": t.shard_tokens,
                    "val_fraction": t.val_fraction,
                    "seed": t.seed,
                }
                stages = plan_on_parquet(
                    "tokenize",
                    params,
                    self.out / entry["documents"],
                    folder,
                    tasks=tasks,
                    workers=vcfg.executor.workers,
                )
                self.say(f"variant {name}: tokenizing into {folder / 'tokens'}", "bold")
                for stage in stages:
                    if not stage_complete(stage.folder, stage.tasks):
                        make_executor(stage).run()
                    merge_stage(stage.folder)
                manifest = json.loads(manifest_path.read_text())
            train_tokens = manifest["splits"].get("train", {}).get("tokens", 0)
            if not train_tokens:
                entry["skipped"] = "its documents gave no training tokens"
                continue
            entry.update(tokens=_rel(folder / "tokens", self.out), train_tokens=train_tokens)
            entry["vocab_size"] = manifest["tokenizer"]["vocab_size"]
            self.save_state(state)
        self.save_state(state)

    # --- training ------------------------------------------------------------------------------

    def check_eval(self) -> None:
        """Tasks and corpora resolve (one line naming the bad one), before anything runs."""
        from gristmill.evaluation.tasks import load_tasks_file, resolve_corpora, resolve_tasks

        ev = self.cfg.eval
        if not self.cfg.tasks and not self.cfg.corpora:
            raise ConfigError("tasks: name at least one task (or corpus) to compare the variants on")
        tasks_file = load_tasks_file(ev.tasks_file)
        resolve_tasks(self.cfg.tasks, tasks_file, ev.tasks_file)
        resolve_corpora(self.cfg.corpora, tasks_file)
        unknown = sorted(set(ev.metrics) - set(task_names(self.cfg)))
        if unknown:
            raise ConfigError(
                f"eval.metrics: {unknown[0]!r} is not one of the tasks ({', '.join(task_names(self.cfg))})"
            )

    def train_config(self, name: str, seed: int, state: dict):
        from gristmill.trainer.config import from_dict

        m, ev = self.cfg.model, self.cfg.eval
        base = from_dict({"preset": m.preset, "data": {"tokens": "."}}, m.set, source=f"model.preset {m.preset}")
        steps = train_steps(self.cfg.tokens, base.data.global_batch, base.data.seq_len)
        per_step = base.data.global_batch * base.data.seq_len
        every = max(1, round(ev.every_tokens / per_step)) if ev.every_tokens else 0
        data = {
            "preset": m.preset,
            "data": {"tokens": str(self.out / state[name]["tokens"]), "seed": seed},
            "seed": seed,
            "steps": steps,
            "eval": {
                "tasks": list(self.cfg.tasks),
                "corpora": list(self.cfg.corpora),
                "tasks_every": every,
                "limit": ev.limit,
                "corpus_tokens": ev.corpus_tokens,
                "tasks_file": ev.tasks_file,
                "batch_tokens": ev.batch_tokens,
            },
        }
        cfg = from_dict(data, m.set, source=f"model.preset {m.preset}")
        vocab = state[name].get("vocab_size")
        if cfg.model.vocab_size is not None and vocab is not None and cfg.model.vocab_size < vocab:
            raise ConfigError(
                f"model.set: model.vocab_size {cfg.model.vocab_size:,} is smaller than the tokenizer's vocabulary"
                f" ({vocab:,}, {self.out / 'tokenizer' / 'tokenizer.json'})"
            )
        return cfg

    def train_all(self, state: dict) -> list[TrainRun]:
        runs = []
        for name in self.cfg.names():
            if state[name].get("skipped"):
                continue
            for seed in self.cfg.seeds:
                tcfg = self.train_config(name, seed, state)
                out = self.out / "train" / f"{name}-s{seed}"
                runs.append(TrainRun(name, seed, out, tcfg.steps))
                check_same_training(tcfg, out)
                if trained(out, tcfg.steps):
                    self.say(f"train {name} seed {seed}: already trained ({tcfg.steps} steps)")
                    continue
                self.say(f"train {name} seed {seed}: {tcfg.steps} steps → {out}", "bold")
                code = self.launch(tcfg, out)
                if code == 2:
                    raise AblationFailed(f"train {name} seed {seed}: stopped on unusable input; see the line above")
                if code:
                    raise AblationFailed(
                        f"train {name} seed {seed}: exited with code {code}; re-run the same command to resume"
                        f" from its last checkpoint ({out / 'checkpoints'})"
                    )
        return runs

    def launch(self, tcfg, out: Path) -> int:
        if self._launch is not None:
            return self._launch(tcfg, out, self.cfg.model.nproc)
        from gristmill.trainer.launch import launch

        return launch(tcfg, out, self.cfg.model.nproc)


#: train-config keys that say how or where a training runs, not what it computes (prefixes)
_HOW = ("out_dir", "data.tokens", "data.verify", "log.", "nproc", "checkpoint.", "stop_after", "eval.batch_tokens")
_HOW += ("kernels", "compile", "ac", "fsdp", "master_weights", "fused_", "optim.overlap_update")


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, val in node.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def check_same_training(tcfg, out: Path) -> None:
    """A training resumed or skipped must be the one this config asks for: its train_config.yaml
    (written when it started) may differ in how it ran, never in what it computes (the budget,
    the seed, the model, the optimizer, the scoring)."""
    import yaml

    path = out / "train_config.yaml"
    if not path.is_file():
        return
    old = _flat(yaml.safe_load(path.read_text()) or {})
    new = _flat(tcfg.model_dump(mode="json"))
    diffs = [
        f"{k}: {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k, "<unset>") != new.get(k, "<unset>") and not k.startswith(_HOW)
    ]
    if diffs:
        raise ConfigError(
            f"{out} was trained with another configuration ({'; '.join(diffs[:3])}"
            f"{f' and {len(diffs) - 3} more' if len(diffs) > 3 else ''}); use another out, or remove it to train again"
        )


def trained(out: Path, steps: int) -> bool:
    path = out / "summary.json"
    if not path.is_file():
        return False
    summary = json.loads(path.read_text())
    return summary.get("steps", 0) >= steps


def _rel(path: Path, root: Path) -> str:
    return os.path.relpath(path, root)


def _parquet_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.parquet") if p.is_file())


def _count_documents(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in _parquet_files(folder)) if folder.is_dir() else 0


def _documents(folder: Path):
    import pyarrow.parquet as pq
    from datatrove.data import Document

    for path in _parquet_files(folder):
        for batch in pq.ParquetFile(path).iter_batches(columns=["id", "text"], batch_size=256):
            for i, text in zip(batch.column("id").to_pylist(), batch.column("text").to_pylist()):
                yield Document(text=text or "", id=i)


def union_sample(folders: list[Path], budget_bytes: int) -> list[str]:
    """The id-hash sample (`tokenize.stages.hash_sample`) of the union of the folders' documents,
    a document found in several variants counted once: each folder's own sample holds every
    document of the union's that it has, so the union's is taken over theirs."""
    import xxhash

    from gristmill.tokenize.stages import TRAIN_SALT, hash_sample_entries

    candidates: dict[str, tuple[int, str]] = {}
    for folder in folders:
        for doc_id, text in hash_sample_entries(_documents(folder), budget_bytes):
            key = xxhash.xxh3_64_intdigest(TRAIN_SALT + (doc_id or text).encode("utf-8"))
            candidates.setdefault(doc_id or text, (key, text))
    ordered = heapq.nsmallest(len(candidates), ((k, i, t) for i, (k, t) in candidates.items()))
    out, total = [], 0
    for _, _, text in ordered:
        if total >= budget_bytes:
            break
        out.append(text)
        total += len(text.encode("utf-8"))
    return out
