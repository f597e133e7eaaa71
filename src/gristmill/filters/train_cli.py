"""`pipeline kenlm train`, `pipeline quality train|distil` and `pipeline train-classifier`: their
arguments. The commands themselves are kenlm_train.py, quality_train.py, quality_distil.py and
classifier_train.py, imported when one runs: they load KenLM, fastText, torch and the filters'
modules (datatrove), which every other `pipeline` command would pay for at start-up.
"""

from __future__ import annotations

import importlib


def _run(module: str, name: str):
    """The command `name` of `module`, imported when it runs."""

    def command(args, console) -> int:
        return getattr(importlib.import_module(module), name)(args, console)

    return command


def add_kenlm_parser(sub) -> None:
    """`pipeline kenlm train ...`: kenlm_train.cmd_kenlm_train."""
    k = sub.add_parser("kenlm", help="KenLM perplexity models")
    ksub = k.add_subparsers(dest="kenlm_command", required=True)
    t = ksub.add_parser("train", help="train a pruned, quantised KenLM binary (CCNet normalisation)")
    t.add_argument("inputs", nargs="+", help="text files (a paragraph per line), WET files, or Parquet files/folders")
    t.add_argument("--output", "-o", required=True, help="model path, e.g. models/kenlm/en.arpa.bin")
    t.add_argument("--order", type=int, default=5)
    t.add_argument(
        "--prune",
        type=int,
        nargs="+",
        default=[0, 0, 1],
        help="lmplz --prune thresholds per order (default: drop singleton 3-grams and up)",
    )
    t.add_argument("--memory", "-S", default="20%", help="lmplz/build_binary memory, e.g. 2G or 20%%")
    t.add_argument("--heldout", type=float, default=0.1, help="fraction of documents held out for evaluation")
    t.add_argument(
        "--detokenize",
        choices=["none", "wikitext"],
        default="none",
        help="undo WikiText's tokenisation of text files first",
    )
    t.add_argument(
        "--cutoff-sample",
        nargs="+",
        metavar="PATH",
        help="documents to compute bucket cut-offs on, CCNet-style (default: the held-out part)",
    )
    t.add_argument("--percentiles", type=float, nargs=2, default=[30, 60], metavar=("HEAD", "MIDDLE"))
    t.add_argument("--quantize", type=int, default=8, help="build_binary -q (probability bits)")
    t.add_argument("--backoff-bits", type=int, default=8, help="build_binary -b (backoff bits)")
    t.add_argument("--seed", type=int, default=0, help="chooses the held-out part")
    t.set_defaults(func=_run("gristmill.filters.kenlm_train", "cmd_kenlm_train"))


def add_quality_parser(sub) -> None:
    """`pipeline quality train|distil ...`: quality_train.cmd_quality_train, quality_distil.cmd_quality_distil."""
    q = sub.add_parser("quality", help="fastText quality classifiers")
    qsub = q.add_subparsers(dest="quality_command", required=True)
    t = qsub.add_parser("train", help="train a hq/lq fastText classifier; report held-out AUC, P/R/F1")
    t.add_argument("--positives", nargs="+", required=True, help="reference text: text files or Parquet files/folders")
    t.add_argument("--negatives", nargs="+", required=True, help="crawl documents: WET files or a run's output Parquet")
    t.add_argument("--output", "-o", required=True, help="model path, e.g. models/quality/en.bin")
    t.add_argument(
        "--detokenize",
        choices=["none", "wikitext"],
        default="none",
        help="undo WikiText's tokenisation of the positives' text files",
    )
    t.add_argument("--min-words", type=int, default=20, help="ignore shorter documents (headings, menus)")
    t.add_argument("--max-per-class", type=int)
    t.add_argument("--heldout", type=float, default=0.2)
    t.add_argument("--threshold", type=float, default=0.5, help="score for the reported precision/recall")
    t.add_argument("--seed", type=int, default=0)
    _fasttext_arguments(t)
    t.set_defaults(func=_run("gristmill.filters.quality_train", "cmd_quality_train"))

    d = qsub.add_parser(
        "distil",
        help="train the fastText classifier on a neural classifier's decisions; report its agreement with them",
    )
    d.add_argument("--teacher", required=True, help="classifier model directory, e.g. models/classifier/judged-en")
    d.add_argument(
        "--documents",
        nargs="+",
        required=True,
        help="the pool: WET files, WARC files (HTML extracted) or a run's output Parquet files/folders",
    )
    d.add_argument("--output", "-o", required=True, help="model path, e.g. models/quality/distilled-en.bin")
    d.add_argument("--language", default="en", help="the teacher's language: the pool's documents are kept in it")
    d.add_argument(
        "--lid-model", default="models/lid.176.ftz", help="fastText LID model for documents without `language`"
    )
    d.add_argument("--min-language-score", type=float, default=0.65, help="as the langid step's min_score")
    d.add_argument("--min-words", type=int, default=20, help="ignore shorter documents (headings, menus)")
    d.add_argument("--max-documents", type=int, help="the pool's first N documents at most (the pool is in memory)")
    d.add_argument("--teacher-label", default="keep", help="the teacher's label whose probability is its score")
    d.add_argument("--teacher-threshold", type=float, default=0.5, help="keep where the teacher's score is >= this")
    d.add_argument(
        "--max-tokens", type=int, help="tokens per document the teacher reads (default: its head.json's, or 512)"
    )
    d.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the teacher runs")
    d.add_argument(
        "--teacher-scores",
        metavar="PARQUET",
        help="a previous distil's .predictions.parquet: the teacher's scores of its documents, reused",
    )
    d.add_argument(
        "--judgments", help="labelled pages (JSONL: id + keep/drop), e.g. configs/classifier/judged-en.jsonl"
    )
    d.add_argument("--heldout", type=float, default=0.25, help="fraction of hosts held out (train-classifier's split)")
    d.add_argument("--threshold", type=float, default=0.5, help="the student's score for keep")
    d.add_argument("--seed", type=int, default=0)
    _fasttext_arguments(d, epoch=25, lr=1.0)  # fastText's tutorial's: a small pool needs more passes
    d.set_defaults(func=_run("gristmill.filters.quality_distil", "cmd_quality_distil"))


#: the destinations `_fasttext_arguments` adds: the keyword arguments of `quality_train.train` and
#: `quality_distil.distil` that fastText takes
FASTTEXT_PARAMS = ("thread", "epoch", "lr", "dim", "word_ngrams", "min_count", "bucket")


def fasttext_params(args) -> dict:
    """fastText's training parameters of a parsed `quality train` or `quality distil` command."""
    return {k: getattr(args, k) for k in FASTTEXT_PARAMS}


def _fasttext_arguments(t, epoch: int = 10, lr: float = 0.2) -> None:
    """fastText's training parameters, as `quality train` and `quality distil` take them."""
    t.add_argument("--thread", type=int, default=1, help="fastText threads (>1 is faster but not reproducible)")
    t.add_argument("--epoch", type=int, default=epoch)
    t.add_argument("--lr", type=float, default=lr)
    t.add_argument("--dim", type=int, default=64)
    t.add_argument("--word-ngrams", type=int, default=2)
    t.add_argument("--min-count", type=int, default=2)
    t.add_argument(
        "--bucket",
        type=int,
        default=100_000,
        help="hash buckets for word n-grams (fastText's 2M default makes a 500 MB model)",
    )


def add_classifier_parser(sub) -> None:
    """`pipeline train-classifier ...`: classifier_train.cmd_train_classifier."""
    t = sub.add_parser(
        "train-classifier",
        help="train a head on a frozen encoder from labelled documents; report held-out accuracy, F1, confusion",
    )
    t.add_argument("data", nargs="+", help="labelled documents: JSONL or Parquet rows (text + label, or id + label)")
    t.add_argument("--encoder", required=True, help="encoder directory, e.g. models/all-MiniLM-L6-v2")
    t.add_argument("--output", "-o", required=True, help="model directory to write, e.g. models/classifier/judged-en")
    t.add_argument("--documents", nargs="+", help="WET files holding the text of rows that give only an `id`")
    t.add_argument("--text-field", default="text")
    t.add_argument("--label-field", default="label", help="a score (regression) or a class name (keep/drop)")
    t.add_argument("--task", choices=["auto", "regression", "classification"], default="auto")
    t.add_argument("--hidden", type=int, default=0, help="units of one hidden layer (0: a linear head)")
    t.add_argument("--heldout", type=float, default=0.25, help="fraction held out (by the URL's host where given)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int, default=300, help="full-batch AdamW steps over the embeddings")
    t.add_argument("--lr", type=float, default=1e-2)
    t.add_argument("--weight-decay", type=float, default=1e-2)
    t.add_argument("--max-tokens", type=int, default=512)
    t.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    t.add_argument("--no-normalize", action="store_true", help="do not L2-normalise the pooled embedding")
    t.set_defaults(func=_run("gristmill.filters.classifier_train", "cmd_train_classifier"))
