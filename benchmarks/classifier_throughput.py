"""The `classifier` step against the plain loop FineWeb-Edu's annotation script runs, same model,
same documents, both timed from text to scores.

    python benchmarks/classifier_throughput.py [--docs 50000] [--device auto|cpu|cuda]
        [--max-tokens 512] [--threads N] [--model DIR] [--json FILE] [--smoke]

The model is FineWeb-Edu's shape, a regression head on an encoder loaded with
`AutoModelForSequenceClassification`: by default the packaged all-MiniLM-L6-v2 (`make
models/all-MiniLM-L6-v2/config.json`) under a seeded head, saved once to a temporary directory
(`--model` takes any sequence classifier). The documents are the shared WET sample's pages,
repeated to `--docs`.

- plain loop: batches of 64 in input order, `tokenizer(batch, padding="longest",
  truncation=True)` (the whole page tokenized), the forward under `torch.autocast` bf16 on GPU
  (fp32 on CPU), scores to the host per batch;
- ours: the `classifier` step (`run` over the documents): texts cut before tokenizing, sorted
  by length inside a window, batched by a token budget, bf16 weights on GPU, the next part of the
  window tokenized while the GPU runs.

Prints documents/s of each, the ratio, and how the two agree (largest score difference, the
share of documents given the same class); on GPU also ours (bf16) against an fp32 forward of
the first documents. On CPU, `--threads` sets torch's threads (default 1, the tokenizer's threads
off: documents/s per core).

`--smoke`: 64 documents, 128 tokens, on CPU (checks the script runs; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
MINILM = REPO / "models" / "all-MiniLM-L6-v2"
WET = (
    "cc/wet/CC-MAIN-20140305060716-00098.head566.warc.wet.gz",
    "cc/wet/CC-MAIN-20170720121902-20170720141902-00000.head43.warc.wet.gz",
)


def pages(jsonl: Path | None = None) -> list[str]:
    if jsonl:  # the same pages written out (`--write-pages`), for a machine without the WET reader's deps
        return [json.loads(line)["text"] for line in jsonl.open()]
    from gristmill.input.wet import WetRecord, iter_wet_records

    return [r.text for f in WET for r in iter_wet_records(DATA / f) if isinstance(r, WetRecord) and r.text.strip()]


def minilm_classifier(out: Path) -> Path:
    """all-MiniLM-L6-v2 under a seeded regression head, as a sequence classifier directory."""
    import torch

    from gristmill.filters.classifier_model import quiet_transformers

    transformers = quiet_transformers()
    if not (MINILM / "config.json").is_file():
        sys.exit(f"{MINILM} missing: run `make models/all-MiniLM-L6-v2/config.json`")
    torch.manual_seed(0)
    transformers.BertForSequenceClassification.from_pretrained(str(MINILM), num_labels=1).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(str(MINILM)).save_pretrained(out)
    return out


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def plain_loop(model_dir: Path, texts: list[str], device: str, autocast: bool, max_tokens: int):
    """FineWeb-Edu's annotation loop; returns (scores, seconds)."""
    import numpy as np
    import torch

    from gristmill.filters.classifier_model import quiet_transformers

    transformers = quiet_transformers()
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.to(device).eval()

    def run(batch):
        inputs = tok(batch, return_tensors="pt", padding="longest", truncation=True, max_length=max_tokens).to(device)
        with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(**inputs).logits.squeeze(-1).float()
        return logits.cpu().numpy()

    run(texts[:64])  # warm-up: kernels chosen, allocator filled
    sync(device)
    t0 = time.perf_counter()
    out = [run(texts[i : i + 64]) for i in range(0, len(texts), 64)]
    sync(device)
    return np.concatenate(out), time.perf_counter() - t0


def ours(model_dir: Path, texts: list[str], device: str, max_tokens: int, batch_tokens: int | None):
    """The classifier step over the documents; returns (scores, seconds, step stats)."""
    import numpy as np
    from datatrove.data import Document

    from gristmill.filters.classifier import Classifier

    step = Classifier(model=str(model_dir), device=device, max_tokens=max_tokens, batch_tokens=batch_tokens)
    _ = step.model  # loaded outside the timed loop, as in a run
    list(step.run(iter([Document(text=t, id=str(i)) for i, t in enumerate(texts[:256])])))  # warm-up
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    t0 = time.perf_counter()
    out = list(step.run(iter(docs)))
    sync(device)
    seconds = time.perf_counter() - t0
    return np.array([d.metadata["classifier_score"] for d in out], np.float32), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=None, help="documents (default 50,000 on GPU, 2,000 on CPU)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch threads (tokenizer threads off at 1)")
    ap.add_argument(
        "--batch-tokens", type=int, nargs="+", default=[None], help="ours: padded tokens per forward pass (each timed)"
    )
    ap.add_argument("--model", type=Path, help="a sequence classifier directory (default: MiniLM + seeded head)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--pages", type=Path, help="the sample's pages as JSONL ({text}), instead of the WET files")
    ap.add_argument("--write-pages", type=Path, help="write the sample's pages as JSONL and exit")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.device, args.docs, args.max_tokens = "cpu", 64, 128

    if args.write_pages:
        with args.write_pages.open("w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in pages())
        return
    import numpy as np
    import torch

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
        if args.threads == 1:
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
    n = args.docs or (50_000 if device == "cuda" else 2_000)
    sample = pages(args.pages)
    texts = (sample * (n // len(sample) + 1))[:n]
    chars = sum(len(t) for t in texts)
    with tempfile.TemporaryDirectory(prefix="classifier-bench-") as tmp:
        model_dir = args.model or minilm_classifier(Path(tmp) / "minilm-cls")
        gpu = torch.cuda.get_device_name() if device == "cuda" else f"{args.threads} CPU thread(s)"
        print(
            f"{n:,} documents ({len(sample)} sample pages repeated, {chars / n:,.0f} characters each on average), "
            f"{args.max_tokens} tokens, {device} ({gpu}), model {model_dir.name}"
        )
        ref, t_ref = plain_loop(model_dir, texts, device, device == "cuda", args.max_tokens)
        print(
            f"plain loop (batches of 64, padding longest, {'autocast bf16' if device == 'cuda' else 'fp32'}): "
            f"{n / t_ref:,.0f} docs/s ({t_ref:.1f} s)"
        )
        precision = "bf16" if device == "cuda" else "fp32"
        timed = {}
        for bt in args.batch_tokens:
            got, seconds = ours(model_dir, texts, device, args.max_tokens, bt)
            timed[bt] = (got, seconds)
            label = f"batch_tokens {bt}" if bt else "default batch_tokens"
            print(f"ours (classifier step, {precision}, {label}): {n / seconds:,.0f} docs/s ({seconds:.1f} s)")
        best = min(timed, key=lambda bt: timed[bt][1])
        got, t_ours = timed[best]
        ratio = t_ref / t_ours
        print(f"ratio ours/plain loop: {ratio:.2f}x")
        if device == "cpu":
            print(f"per core: ours {n / t_ours / args.threads:,.1f} docs/s, plain loop {n / t_ref / args.threads:,.1f}")

        def cls(s):
            return np.round(np.clip(s, 0, 5)).astype(int)

        diff = float(np.abs(got - ref).max())
        same = float((cls(got) == cls(ref)).mean())
        print(f"agreement ours/plain loop: largest |score difference| {diff:.2e}, same class {100 * same:.2f}%")
        figures = {
            "documents": n,
            "device": device,
            "gpu": gpu,
            "max_tokens": args.max_tokens,
            "plain_docs_per_s": n / t_ref,
            "ours_docs_per_s": n / t_ours,
            "ratio": ratio,
            "ours_by_batch_tokens": {str(bt): n / sec for bt, (_, sec) in timed.items()},
            "max_abs_diff_vs_plain": diff,
            "same_class_vs_plain": same,
        }
        if device == "cuda":  # bf16 against an fp32 forward: the tolerance the step runs at
            k = min(n, 4096)
            fp32, _ = plain_loop(model_dir, texts[:k], device, False, args.max_tokens)
            d32 = np.abs(got[:k] - fp32)
            same32 = float((cls(got[:k]) == cls(fp32)).mean())
            print(
                f"ours bf16 against an fp32 forward ({k:,} documents): |difference| max {d32.max():.3f}, "
                f"mean {d32.mean():.4f}, same class {100 * same32:.2f}%"
            )
            figures |= {
                "bf16_vs_fp32_max": float(d32.max()),
                "bf16_vs_fp32_mean": float(d32.mean()),
                "bf16_same_class": same32,
            }
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
