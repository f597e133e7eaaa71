"""Evaluation during training: the train YAML's `eval.tasks` and `eval.corpora` scored every
`eval.tasks_every` steps and at the end, as `pipeline eval` scores them (gristmill.evaluation's
prompts, tokenization and definitions), with the run's own tokenizer.

Written to metrics.jsonl (and TensorBoard) as one record per scoring, keyed
`eval/<task>/<metric>` (`acc`, `acc_norm`, `acc_bytes`, `centred`; `perplexity` for language
modelling), `eval/<corpus>/bits_per_byte`, `eval/core` (the mean centred accuracy), with `step`
and `tokens` (tokens trained on so far): what the report plots against tokens seen. Per-item
scores go to `<out>/eval/step-NNNNNNNN/<task>.jsonl` (what a paired comparison reads).

The items are read, prompted and tokenized once, when the run starts. Every rank scores all of
them (an FSDP forward needs every rank; the work is small beside training) and rank 0 writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from gristmill.evaluation import bpb
from gristmill.evaluation.scoring import Counters, encode_items, loglikelihoods, perplexity, score_items
from gristmill.evaluation.stats import centred, core_mean
from gristmill.evaluation.tasks import build_items, load_tasks_file, read_records, resolve_corpora, resolve_tasks


class _Scorer:
    """The training model as `scoring`/`bpb` expect one (models.Loaded's interface)."""

    def __init__(self, model, autocast, tokenizer, prefix_id: int, max_len: int, device):
        self.model, self.autocast, self.tokenizer = model, autocast, tokenizer
        self.prefix_id, self.max_len, self.device = prefix_id, max_len, device

    @torch.no_grad()
    def logprobs(self, tokens):
        with self.autocast:
            return torch.log_softmax(self.model(tokens).float(), dim=-1)

    @torch.no_grad()
    def logprobs_at(self, tokens, rows, cols):
        # the model's forward (FSDP's hooks run on it), its logits taken at the scored positions
        with self.autocast:
            logits = self.model(tokens)
        return torch.log_softmax(logits[rows, cols].float(), dim=-1)


class TrainingEval:
    def __init__(self, cfg, tokdir, device) -> None:
        ev = cfg.eval
        self.cfg = ev
        tasks_file = load_tasks_file(ev.tasks_file) if (ev.tasks or ev.corpora) else None
        tok = tokdir.tokenizer()
        self.tokenizer, self.prefix_id, self.max_len, self.device = tok, tokdir.bos_id, cfg.data.seq_len, device
        self.tasks = []
        for spec in resolve_tasks(ev.tasks, tasks_file, ev.tasks_file) if ev.tasks else []:
            layout, records = read_records(spec.path)
            items = build_items(spec, layout, records, ev.limit)
            items, encoded, skipped = encode_items(items, tok, self.prefix_id, self.max_len)
            self.tasks.append((spec.name, layout, items, encoded, skipped))
        self.corpora = (
            [(name, bpb.read_corpus(path)) for name, path in resolve_corpora(ev.corpora, tasks_file)]
            if ev.corpora
            else []
        )

    @property
    def active(self) -> bool:
        return bool(self.tasks or self.corpora)

    def run(self, model, autocast, step: int, out_dir: Path | None) -> dict:
        """The metrics record of this scoring (keys above); per-item files under `out_dir`
        (None: not written, e.g. on ranks other than 0)."""
        was_training = model.training
        model.eval()
        scorer = _Scorer(model, autocast, self.tokenizer, self.prefix_id, self.max_len, self.device)
        rec: dict = {}
        centred_by_task = {}
        try:
            for name, layout, items, encoded, skipped in self.tasks:
                counters = Counters()
                res = loglikelihoods(scorer, encoded, batch_tokens=self.cfg.batch_tokens, counters=counters)
                scores = score_items(items, res, encoded)
                metrics = ["acc", "acc_norm", "acc_bytes"] if layout == "mc" else ["acc"]
                for m in metrics:
                    rec[f"eval/{name}/{m}"] = float(np.mean([s.scores[m] for s in scores]))
                chance = 0.0 if layout == "lm" else float(np.mean([1 / s.n_choices for s in scores]))
                centred_by_task[name] = rec[f"eval/{name}/centred"] = centred(rec[f"eval/{name}/acc"], chance)
                if layout == "lm":
                    rec[f"eval/{name}/perplexity"] = perplexity(scores)
                rec[f"eval/{name}/items"] = len(scores)
                rec[f"eval/{name}/skipped"] = sum(skipped.values())
                rec[f"eval/{name}/truncated"] = counters.truncated
                if out_dir is not None:
                    folder = out_dir / "eval" / f"step-{step:08d}"
                    folder.mkdir(parents=True, exist_ok=True)
                    with open(folder / f"{name}.jsonl", "w") as f:
                        for s in scores:
                            f.write(json.dumps(s.record()) + "\n")
            if centred_by_task:
                rec["eval/core"] = core_mean(centred_by_task)
            for name, text in self.corpora:
                r = bpb.bits_per_byte(scorer, text, max_tokens=self.cfg.corpus_tokens)
                rec[f"eval/{name}/bits_per_byte"] = r["bits_per_byte"]
        finally:
            model.train(was_training)
        return rec
