"""KenLM perplexity and fastText quality scoring, gristmill against datatrove, one core, same input.

    python benchmarks/quality_throughput.py [--wet FILE ...] [--repeat 5] [--smoke]

Both sides score the same documents (every conversion record of the shared WET sample) with
the same model files — the English KenLM binary and the quality classifier `make models`
trains — in this one process, one after the other:

- `kenlm` (ours) vs datatrove's `CCNetPerplexityStats`. datatrove's `KenlmModel` downloads
  `<lang>.arpa.bin` and a SentencePiece model from the Hugging Face hub; it is pointed at our
  model, and its SentencePiece step is replaced by the identity (we have no SP model offline,
  and our model was trained on whitespace tokens). Its normaliser runs on the whole document
  (deleting newlines), so it scores each document as one line; ours scores line by line.
  Stats groups: `summary` only (the cheapest).
- `quality` (ours) vs datatrove's `FastTextClassifierFilter(keep_labels=("hq", 0.5))`, its
  download bypassed, its `fasttext-numpy2-wheel` distribution check relaxed to the installed
  fastText module (same API), `newline_replacement=" "` as ours.

No thresholds drop documents on either side, so every step sees every document. Prints MB/s
(UTF-8 text bytes scored per CPU second) and the ratio per pair. Needs `make models`; the
datatrove peers need `tldextract` for the stats step (the bench extra: `pip install -e
'.[bench]'`); without it their side is skipped with a line saying so.

`--smoke`: the smaller sample file (43 records), one pass each (seconds; checks that the
benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
KENLM = REPO / "models" / "kenlm" / "en.arpa.bin"
QUALITY = REPO / "models" / "quality" / "en.bin"


def documents(files):
    from datatrove.data import Document

    from gristmill.input.wet import WetRecord, iter_wet_records

    return [
        Document(text=r.text, id=r.record_id, metadata={"language": "en"})
        for f in files
        for r in iter_wet_records(f)
        if isinstance(r, WetRecord)
    ]


def ours_kenlm():
    from gristmill.filters.kenlm import KenLM

    step = KenLM(models={"en": str(KENLM)})
    _ = step.models  # loaded outside the timed loop, as in a run
    return step


def ours_quality():
    from gristmill.filters.quality import Quality

    step = Quality(model=str(QUALITY), min_score=0.0)
    _ = step.model  # loaded outside the timed loop
    return step


def datatrove_perplexity(out_dir: str):
    import datatrove.utils.perplexity as dt_ppl
    from datatrove.pipeline.stats import CCNetPerplexityStats

    dt_ppl.hf_hub_url = lambda repo, path: str(KENLM)
    dt_ppl.cached_asset_path_or_download = lambda path, *a, **k: path

    class Identity:  # no SentencePiece model offline; ours scores whitespace tokens too
        def tokenize(self, text):
            return text

    dt_ppl.KenlmModel.tokenizer = property(lambda self: Identity())
    step = CCNetPerplexityStats(
        output_folder=out_dir, model_dataset="local", language="en", groups_to_compute=["summary"]
    )
    _ = step.model.model  # load outside the timed loop
    return step


def datatrove_fasttext():
    import datatrove.pipeline.filters.fasttext_filter as dt_ft
    from datatrove.pipeline.filters import FastTextClassifierFilter

    dt_ft.cached_asset_path_or_download = lambda path, *a, **k: path
    FastTextClassifierFilter._requires_dependencies = ["fasteners"]  # the installed fastText has the same API
    step = FastTextClassifierFilter(str(QUALITY), keep_labels=("hq", 0.0), newline_replacement=" ")
    _ = step.model  # loaded outside the timed loop
    return step


def measure(build, docs, repeat: int) -> float:
    """Best CPU seconds of `repeat` passes of the step over copies of the documents."""
    import copy

    best = float("inf")
    for _ in range(repeat):
        step = build()
        batch = [copy.copy(d) for d in docs]
        for d in batch:
            d.metadata = dict(d.metadata)
        gc.collect()
        t0 = time.process_time()
        n = sum(1 for _ in step.run(iter(batch), 0, 1))
        best = min(best, time.process_time() - t0)
        assert n == len(docs), (build.__name__, n, len(docs))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wet", nargs="*", type=Path, help="WET files (default: the shared samples)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="the smaller sample file, one pass each: checks that it runs")
    args = ap.parse_args()
    files = args.wet or sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))
    if args.smoke:
        files, args.repeat = files if args.wet else sorted(files, key=lambda f: f.stat().st_size)[:1], 1
    if not files or not KENLM.is_file() or not QUALITY.is_file():
        print(f"need WET files ({DATA}/cc/wet), {KENLM} and {QUALITY} (make models)", file=sys.stderr)
        return 2
    from loguru import logger

    logger.remove()
    docs = documents(files)
    mb = sum(len(d.text.encode("utf-8")) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [
            (
                "perplexity",
                ("gristmill kenlm", ours_kenlm),
                ("datatrove CCNetPerplexityStats", lambda: datatrove_perplexity(tmp)),
            ),
            (
                "quality",
                ("gristmill quality", ours_quality),
                ("datatrove FastTextClassifierFilter", datatrove_fasttext),
            ),
        ]
        print(
            f"input: {len(docs)} documents, {mb:.2f} MB of text ({len(files)} WET files); "
            f"CPU time, best of {args.repeat}; models {KENLM.name}, {QUALITY.name}"
        )
        print(f"{'step':<36} {'cpu s':>7} {'MB/s/core':>10} {'docs/s/core':>12}")
        for task, (a_name, a), (b_name, b) in pairs:
            ta = measure(a, docs, args.repeat)
            print(f"{a_name:<36} {ta:>7.3f} {mb / ta:>10.2f} {len(docs) / ta:>12.0f}")
            try:
                tb = measure(b, docs, args.repeat)
            except ImportError as e:  # tldextract, fasteners: the bench extra
                print(f"  {b_name} skipped: {e} (pip install -e '.[bench]')")
                continue
            print(f"{b_name:<36} {tb:>7.3f} {mb / tb:>10.2f} {len(docs) / tb:>12.0f}")
            print(f"  ratio gristmill/datatrove ({task}, MB/s per core): {tb / ta:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
