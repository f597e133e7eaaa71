"""`pipeline kenlm train`: text → CCNet-normalised corpus → lmplz → pruned, quantised KenLM binary.

Writes, next to the model:
  <model>.stats.json   held-out perplexity percentiles and the CCNet bucket cut-offs
                       (read by the `kenlm` step for `keep_buckets`)
  <model>.report.md    a short human-readable report

The held-out part (a fixed fraction of documents, chosen by hash, see `train_corpus`) is never
given to lmplz. Training text is normalised by the same `ccnet_normalize` the step scores with,
and scored on the same whitespace tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gristmill.filters.ccnet_normalize import normalize_lines
from gristmill.filters.kenlm import load_kenlm, perplexity, score_lines, stats_path
from gristmill.filters.train_corpus import is_heldout, iter_documents

PERCENTILES = (5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95)
MAX_HELDOUT_DOCS = 50_000  # enough for stable percentiles; the rest of the held-out part is unused


class ToolMissing(FileNotFoundError):
    pass


def find_tool(name: str) -> str:
    """lmplz/build_binary: next to this Python (where `make kenlm-bin` puts them), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    raise ToolMissing(
        f"KenLM's `{name}` not found (looked in {here.parent} and on PATH). It is in no Python package: "
        f"build it from the kenlm sdist with `make kenlm-bin` (cmake + Debian's libboost-program-options-dev "
        f"libboost-system-dev libboost-thread-dev libboost-test-dev, ~3 min), or put kenlm's bin/ on PATH."
    )


def _run(cmd: list[str], stdin=None, stdout=None, what: str = "") -> None:
    res = subprocess.run(cmd, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=False)
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace")[-3000:]
        raise RuntimeError(f"{what or cmd[0]} failed (exit {res.returncode}): {' '.join(cmd)}\n{err}")


def doc_perplexities(model, texts) -> np.ndarray:
    pps = [perplexity(score_lines(model, t)) for t in texts]
    return np.array([p for p in pps if p is not None], dtype=np.float64)


def _summary(pps: np.ndarray) -> dict:
    if not len(pps):
        return {"documents": 0}
    return {
        "documents": int(len(pps)),
        "mean": float(pps.mean()),
        "percentiles": {str(p): float(np.percentile(pps, p)) for p in PERCENTILES},
    }


def train(
    inputs: list[str],
    output: str | Path,
    order: int = 5,
    prune: list[int] = (0, 0, 1),
    memory: str = "20%",
    heldout: float = 0.1,
    detokenize: str = "none",
    cutoff_sample: list[str] | None = None,
    cutoff_percentiles: tuple[float, float] = (30, 60),
    quantize: int = 8,
    backoff_bits: int = 8,
    seed: int = 0,
    log=print,
) -> dict:
    """Train a KenLM binary at `output`; return the statistics written to its sidecar."""
    lmplz, build_binary = find_tool("lmplz"), find_tool("build_binary")  # before any work
    if not 0 < heldout < 1:
        raise ValueError(f"--heldout: expected a fraction between 0 and 1, got {heldout}")
    if len(prune) > order:
        raise ValueError(f"--prune: {len(prune)} thresholds for an order-{order} model")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kenlm-train-", dir=output.parent) as tmp:
        corpus = Path(tmp) / "train.txt"
        held: list[str] = []
        n_train = n_lines = n_tokens = n_held = 0
        with open(corpus, "w", encoding="utf-8") as f:
            for text in iter_documents(inputs, detokenize):
                if is_heldout(text, heldout, seed):
                    n_held += 1
                    if len(held) < MAX_HELDOUT_DOCS:
                        held.append(text)
                    continue
                lines = normalize_lines(text)
                if not lines:
                    continue
                n_train += 1
                n_lines += len(lines)
                n_tokens += sum(len(l.split()) for l in lines)
                f.write("\n".join(lines) + "\n")
        if n_tokens == 0:
            raise ValueError(f"no training text in {inputs}")
        log(
            f"corpus: {n_train:,} documents, {n_lines:,} lines, {n_tokens:,} tokens for training; "
            f"{n_held:,} documents held out"
        )
        arpa = Path(tmp) / "model.arpa"
        # --skip_symbols: <s>, </s>, <unk> in the text are whitespace, not an error.
        # --discount_fallback: small corpora (tests, WikiText-2) can lack the counts of counts that
        # modified Kneser-Ney discounts need; fall back instead of failing.
        cmd = [lmplz, "-o", str(order), "-S", memory, "-T", tmp, "--skip_symbols", "--discount_fallback"]
        if any(prune):
            cmd += ["--prune", *map(str, prune)]
        with open(corpus, "rb") as fin, open(arpa, "wb") as fout:
            _run(cmd, stdin=fin, stdout=fout, what="lmplz")
        tmp_bin = Path(tmp) / "model.bin"
        _run(
            [
                build_binary,
                "-q",
                str(quantize),
                "-b",
                str(backoff_bits),
                "-S",
                memory,
                "-T",
                tmp,
                "trie",
                str(arpa),
                str(tmp_bin),
            ],
            what="build_binary",
        )
        model = load_kenlm(tmp_bin)
        held_pps = doc_perplexities(model, held)
        if cutoff_sample:
            ref_pps = doc_perplexities(model, iter_documents(cutoff_sample))
            ref_name = [str(p) for p in cutoff_sample]
        else:
            ref_pps, ref_name = held_pps, "heldout"
        if not len(ref_pps):
            raise ValueError("no documents to compute the bucket cut-offs from (held-out part empty?)")
        lo, hi = (float(np.percentile(ref_pps, p)) for p in cutoff_percentiles)
        stats = {
            "model": output.name,
            "model_sha256": hashlib.sha256(tmp_bin.read_bytes()).hexdigest(),
            "order": order,
            "prune": list(prune),
            "quantize": [quantize, backoff_bits],
            "structure": "trie",
            "normalization": "ccnet (lower, strip accents, digits to 0, unicode punctuation)",
            "tokenization": "whitespace tokens of the normalised text (CCNet: SentencePiece)",
            "inputs": [str(p) for p in inputs],
            "detokenize": detokenize,
            "seed": seed,
            "train": {"documents": n_train, "lines": n_lines, "tokens": n_tokens},
            "heldout_fraction": heldout,
            "heldout": _summary(held_pps),
            "cutoffs": {
                "head": lo,
                "middle": hi,
                "percentiles": list(cutoff_percentiles),
                "sample": ref_name,
                "sample_documents": int(len(ref_pps)),
            },
            "train_seconds": round(time.perf_counter() - t0, 1),
        }
        stats_path(output).write_text(json.dumps(stats, indent=2) + "\n")
        Path(f"{output}.report.md").write_text(_report(stats))
        os.replace(tmp_bin, output)  # last: a model file present means its sidecar is too
    log(
        f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB), {stats_path(output).name}, {output.name}.report.md: "
        f"held-out median perplexity {stats['heldout'].get('percentiles', {}).get('50', float('nan')):.0f}, "
        f"cut-offs head < {lo:.0f} <= middle < {hi:.0f} <= tail, {stats['train_seconds']} s"
    )
    return stats


def _report(s: dict) -> str:
    h = s["heldout"]
    rows = "\n".join(f"| p{p} | {v:.1f} |" for p, v in h.get("percentiles", {}).items())
    c = s["cutoffs"]
    return f"""# KenLM model {s["model"]}

- order {s["order"]}, pruning {s["prune"]}, {s["structure"]} quantised to {s["quantize"][0]}/{s["quantize"][1]} bits
- trained on {s["train"]["documents"]:,} documents, {s["train"]["lines"]:,} lines, {s["train"]["tokens"]:,} tokens
  from {", ".join(s["inputs"])} (detokenize: {s["detokenize"]})
- {s["normalization"]}; {s["tokenization"]}
- held-out: {h["documents"]:,} documents ({s["heldout_fraction"]:.0%} by hash, never seen by lmplz)

## Held-out document perplexity

| percentile | perplexity |
|---|---|
{rows}

## Buckets (`keep_buckets` in the `kenlm` step)

head < {c["head"]:.1f} <= middle < {c["middle"]:.1f} <= tail — percentiles {c["percentiles"]} of
{c["sample_documents"]:,} documents of {c["sample"]}.
"""


def cmd_kenlm_train(args, console) -> int:
    try:
        _train_from_args(args, console)
    except RuntimeError as e:  # lmplz/build_binary failed: their message says why
        console.print(f"[red]error[/] {e}", markup=True, highlight=False)
        return 1
    return 0


def _train_from_args(args, console) -> None:
    train(
        args.inputs,
        args.output,
        order=args.order,
        prune=args.prune,
        memory=args.memory,
        heldout=args.heldout,
        detokenize=args.detokenize,
        cutoff_sample=args.cutoff_sample,
        cutoff_percentiles=tuple(args.percentiles),
        quantize=args.quantize,
        backoff_bits=args.backoff_bits,
        seed=args.seed,
        log=console.print,
    )
