"""FineWeb's and FineWeb-2's recipes: gristmill's configs against datatrove running the same
recipe with the same thresholds, document by document.

    python benchmarks/recipe_compare.py fineweb|fineweb2 [--wet FILE ...] [--work DIR] [--json OUT]
        [--tokenizers] [--smoke]

gristmill runs `configs/<recipe>.yaml` with the real CLI (`pipeline run`, one task), its input set
to the WET files and every dropped document written with its reason (`output.dropped_sample: 1`);
the `tokenize` step is left out (it decides nothing). datatrove runs the recipe as its own code
for FineWeb and FineWeb-2 does (examples/fineweb.py, fineweb-2-pipeline.py), on its executor
(`LocalPipelineExecutor`), every filter with an exclusion writer: `WarcReader` (which reads the
WET files' conversion records), `URLFilter`, `LanguageFilter`, its Gopher, C4 and FineWeb filters
with the parameters gristmill resolved for the page's language (FineWeb-2: one pipeline per
language, as FineWeb-2 ran them, with the language's word tokenizer), its four MinHash stages
and `PIIFormatter`. Two things are set so that both sides run on the same footing offline:
`LanguageFilter` loads the same models/lid.176.ftz (it has no model argument and would fetch
lid.176.bin), and `URLFilter` splits hosts with tldextract's bundled suffix list
(`TLDExtract(suffix_list_urls=())`, as url_filter does) instead of the list of the day.

Each document's outcome on each side is the step that dropped it (with its reason) or "kept".
The script prints the agreement (same outcome; same step; same reason; for documents both keep,
the same text once PII's replacement strings are set aside) and every disagreement with its
cause, found by re-running the step on the text it decided on:

* `words`: datatrove's filter decides as gristmill's once given gristmill's words (`split_words`)
  instead of its word tokenizer's (spaCy), with the rule's statistic under both word lists;
* `sentences`: the same with gristmill's sentence splitter (C4's fewest-sentences rule);
* `reader`: datatrove's WarcReader did not return the record (libmagic's type for it is shown);
* `near_dedup`: MinHash found a pair on one side only (the pair's Jaccard under each side's
  shingles and the chance that 14 bands of 8 hashes see it);
* `unexplained`: none of these (tests/recipes/test_recipe_compare.py fails on any).

`fineweb2` compares the languages whose datatrove word tokenizer loads here; the pages of the
others are counted up to language ID and listed with what their tokenizer needs. `--tokenizers`
also lists, for all 174 languages of the FineWeb-2 calibration, whether datatrove's tokenizer for
it loads offline. The document-by-document figures and explanations are in docs/recipes.md.

`--smoke`: the smaller WET file only (seconds; checks that the comparison still runs).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
LID = REPO / "models" / "lid.176.ftz"
RECIPES = {"fineweb": REPO / "configs" / "fineweb.yaml", "fineweb2": REPO / "configs" / "fineweb2.yaml"}
KEPT = "kept"
NOT_READ = "not read"
#: FineWeb's MinHash (examples/fineweb.py): 5-grams, 14 buckets of 8 hashes, sha1 of 64 bits;
#: FineWeb-2's the same with xxhash
MINHASH = {"n_grams": 5, "num_buckets": 14, "hashes_per_bucket": 8}


# --- datatrove, offline and on the same model ---------------------------------------------------


def datatrove_offline() -> None:
    """Points datatrove's LanguageFilter at models/lid.176.ftz (it takes no model path and would
    download lid.176.bin) and accepts the installed fastText module (fasttext-community, the
    same API as the `fasttext-numpy2-wheel` datatrove asks for); silences its per-step logs."""
    import datatrove.utils.lid as dt_lid
    from datatrove.pipeline.filters import LanguageFilter
    from loguru import logger

    dt_lid.cached_asset_path_or_download = lambda *a, **k: str(LID)
    dt_lid.check_required_dependencies = lambda *a, **k: None
    LanguageFilter._requires_dependencies = ["fasteners"]
    logger.remove()


def url_filter(exclusion_writer=None):
    """datatrove's URLFilter with tldextract's bundled suffix list (never fetched)."""
    import warnings

    from datatrove.pipeline.filters import URLFilter
    from tldextract import TLDExtract

    warnings.filterwarnings("ignore", "The 'registered_domain' property is deprecated", DeprecationWarning)
    step = URLFilter(exclusion_writer=exclusion_writer)
    step.tldextractor = TLDExtract(suffix_list_urls=())
    return step


def datatrove_filter(step: str, c, language: str, exclusion_writer=None):
    """datatrove's filter for gristmill's `step`, with the parameters of gristmill's resolved
    Config `c` for the page's language; `language` is datatrove's code for its word tokenizer."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    w = exclusion_writer
    if step == "gopher_repetition":
        return GopherRepetitionFilter(
            dup_line_frac=c.dup_line_frac,
            dup_para_frac=c.dup_para_frac,
            dup_line_char_frac=c.dup_line_char_frac,
            dup_para_char_frac=c.dup_para_char_frac,
            top_n_grams=tuple(map(tuple, c.top_n_grams)),
            dup_n_grams=tuple(map(tuple, c.dup_n_grams)),
            exclusion_writer=w,
            language=language,
        )
    if step == "gopher_quality":
        assert c.alpha_words == "tokens", "datatrove's letter share counts every token"
        return GopherQualityFilter(
            min_doc_words=c.min_doc_words,
            max_doc_words=c.max_doc_words,
            min_avg_word_length=c.min_avg_word_length,
            max_avg_word_length=c.max_avg_word_length,
            max_symbol_word_ratio=c.max_symbol_word_ratio,
            max_bullet_lines_ratio=c.max_bullet_lines_ratio,
            max_ellipsis_lines_ratio=c.max_ellipsis_lines_ratio,
            max_non_alpha_words_ratio=c.max_non_alpha_words_ratio,
            min_stop_words=c.min_stop_words,
            stop_words=c.stop_words,  # None: datatrove's English list, as gristmill's for en
            exclusion_writer=w,
            language=language,
        )
    if step == "c4_lines":
        assert c.end_punctuation is None, "datatrove's C4 filter has no end_punctuation parameter"
        assert c.min_paragraph_words == -1, "min_paragraph_words is gristmill's own rule, not C4's"
        return C4QualityFilter(
            exclusion_writer=w,
            split_paragraph=c.split_paragraph,
            remove_citations=c.remove_citations,
            filter_no_terminal_punct=c.filter_no_terminal_punct,
            min_num_sentences=c.min_num_sentences,
            min_words_per_line=c.min_words_per_line,
            max_word_length=c.max_word_length,
            filter_lorem_ipsum=c.filter_lorem_ipsum,
            filter_javascript=c.filter_javascript,
            filter_curly_bracket=c.filter_curly_bracket,
            filter_policy=c.filter_policy,
            language=language,
        )
    if step == "fineweb_quality":
        return FineWebQualityFilter(
            exclusion_writer=w,
            line_punct_thr=c.line_punct_thr,
            line_punct_exclude_zero=c.line_punct_exclude_zero,
            stop_chars=tuple(c.stop_chars) if c.stop_chars is not None else None,
            short_line_thr=c.short_line_thr,
            short_line_length=c.short_line_length,
            char_duplicates_ratio=c.char_duplicates_ratio,
            new_line_ratio=c.new_line_ratio,
            language=language,
        )
    raise ValueError(f"no datatrove filter for {step}")


def minhash_config(hash_fc: str):
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.utils.hashing import HashConfig

    return MinhashConfig(hash_config=HashConfig(hash_fc=hash_fc, precision=64), **MINHASH)


def executor(pipeline, logs: Path, tasks: int = 1, workers: int = 1):
    """datatrove's local executor. Its pool's workers are forked from this process (its default,
    "forkserver", forks them from a server process that reaps them and is not itself waited for
    at exit, so their CPU time would reach no `RUSAGE_CHILDREN` of ours; fork also spares them
    the server's start-up)."""
    from datatrove.executor import LocalPipelineExecutor

    return LocalPipelineExecutor(
        pipeline=pipeline, tasks=tasks, workers=workers, logging_dir=str(logs), start_method="fork"
    )


def minhash_stages(reader, work: Path, config, language: str, *, tasks: int, workers: int, tag: str = ""):
    """datatrove's MinHash stages 1-3 (signatures, buckets, clusters), as FineWeb's example lays
    them out; stage 4 (MinhashDedupFilter) goes in the caller's last stage. Returns the
    executors and the folder of the ids to remove."""
    from datatrove.pipeline.dedup import MinhashDedupCluster, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets

    sigs, buckets, remove = (work / f"minhash{tag}" / x for x in ("signatures", "buckets", "remove_ids"))
    logs = work / "logs"
    return [
        executor(
            [reader, MinhashDedupSignature(str(sigs), config=config, language=language)],
            logs / f"mh1{tag}",
            tasks,
            workers,
        ),
        executor(
            [MinhashDedupBuckets(str(sigs), str(buckets), config=config)],
            logs / f"mh2{tag}",
            config.num_buckets,
            workers,
        ),
        executor([MinhashDedupCluster(str(buckets), str(remove), config=config)], logs / f"mh3{tag}", 1, 1),
    ], remove


def warc_reader(files: list[Path], work: Path):
    """datatrove's WarcReader on exactly `files` (it takes a folder: a paths file names them)."""
    from datatrove.pipeline.readers import WarcReader

    folders = {f.parent for f in files}
    if len(folders) != 1:
        raise SystemExit("all WET files must be in one folder (datatrove's reader takes a folder)")
    work.mkdir(parents=True, exist_ok=True)
    paths = work / "paths.txt"
    paths.write_text("".join(f"{f.name}\n" for f in files))
    return WarcReader(str(files[0].parent), paths_file=str(paths))


def datatrove_fineweb(
    files: list[Path],
    work: Path,
    configs: dict[str, object],
    *,
    exclusions: bool = True,
    tokenizer: Path | None = None,
    tasks: int = 1,
    workers: int = 1,
) -> list:
    """FineWeb's pipeline (datatrove's examples/fineweb.py) on WET files, as executors to run in
    order: filtering, MinHash signatures, buckets, clusters, then the dedup filter, PII and the
    final documents (and, with `tokenizer`, DocumentTokenizer and DocumentTokenizerMerger).
    `configs`: gristmill's resolved English Config per step, whose parameters datatrove gets."""
    from datatrove.pipeline.dedup import MinhashDedupFilter
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    def excluded(step):
        return JsonlWriter(str(work / "removed" / step)) if exclusions else None

    filtered = str(work / "filtered")
    stage1 = [
        warc_reader(files, work),
        url_filter(excluded("url_filter")),
        LanguageFilter(languages=["en"], language_threshold=0.65, exclusion_writer=excluded("langid")),
        *(
            datatrove_filter(step, configs[step], "en", excluded(step))
            for step in ("gopher_repetition", "gopher_quality", "c4_lines", "fineweb_quality")
        ),
        JsonlWriter(filtered),
    ]
    stages = [executor(stage1, work / "logs" / "filter", tasks, workers)]
    mh, remove = minhash_stages(JsonlReader(filtered), work, minhash_config("sha1"), "en", tasks=tasks, workers=workers)
    stages += mh
    last = [
        JsonlReader(filtered),
        MinhashDedupFilter(str(remove), exclusion_writer=excluded("near_dedup")),
        PIIFormatter(),
        JsonlWriter(str(work / "final")),
    ]
    if tokenizer is not None:
        from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerMerger

        last.append(
            DocumentTokenizer(
                str(work / "tokens"), tokenizer_name_or_path=str(tokenizer), eos_token="<|endoftext|>", seed=0
            )
        )
    stages.append(executor(last, work / "logs" / "final", tasks, workers))
    if tokenizer is not None:
        merger = DocumentTokenizerMerger(str(work / "tokens"), str(work / "merged"), save_filename="fineweb", seed=0)
        stages.append(executor([merger], work / "logs" / "merge", 1, 1))
    return stages


# --- gristmill's side ----------------------------------------------------------------------------


def derived_config(recipe: str, files: list[Path], work: Path) -> Path:
    """configs/<recipe>.yaml on `files`, one task, every dropped document written, no tokens."""
    data = yaml.safe_load(RECIPES[recipe].read_text())
    data["steps"] = [s for s in data["steps"] if "tokenize" not in s]
    data.pop("tokenize", None)
    data.pop("train", None)
    data["input"] = {"paths": [str(f) for f in files]}
    data["executor"] = {"type": "local", "tasks": 1, "workers": 1}
    data["output"] = {**data.get("output", {}), "dropped_sample": 1.0}
    data["run_dir"] = str(work / "gristmill")
    path = work / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def resolved_steps(config: Path):
    """(step name, built step or None, parameters) of a run config's steps, in order, resolved
    as a run resolves them (calibration merged); the heuristic filters are built (their
    per-language Configs), the steps that load a model or a cache are not."""
    from gristmill.config import load
    from gristmill.core.filter import Filter
    from gristmill.core.step import registered_steps

    with contextlib.chdir(REPO):  # the configs' relative paths (models/, configs/calibration/)
        cfg = load(config)
    registry = registered_steps()
    out = []
    for spec in cfg.steps:
        cls = registry[spec.name]
        # filters whose decisions are compared are built bare (no model, no cache); the rest by name
        simple = issubclass(cls, Filter) and spec.name not in ("langid", "url_filter")
        out.append((spec.name, cls(spec.params) if simple else None, spec.params))
    return out


def start_gristmill(config: Path, run_dir: Path, log: Path) -> subprocess.Popen:
    """`pipeline run` of `config`, started: datatrove's side runs meanwhile (`finish` waits)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [sys.executable, "-m", "gristmill.cli", "run", str(config), "--run-dir", str(run_dir), "--force"]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, log: Path) -> None:
    if proc.wait():
        raise SystemExit(f"pipeline run failed ({proc.returncode}); its log, {log}:\n{log.read_text()[-3000:]}")


@dataclass
class Side:
    """One side's outcome per document id: (step that dropped it, reason) or (KEPT, None)."""

    name: str
    outcome: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: the text as the dropping step saw it, or the final text of a kept document
    text: dict[str, str] = field(default_factory=dict)
    language: dict[str, str | None] = field(default_factory=dict)
    url: dict[str, str] = field(default_factory=dict)

    def add(self, doc_id, step, reason, text, language, url):
        if doc_id in self.outcome:
            raise ValueError(f"{self.name}: document {doc_id} has two outcomes")
        self.outcome[doc_id] = (step, reason)
        self.text[doc_id], self.language[doc_id], self.url[doc_id] = text, language, url


def _step_of_folder(name: str) -> str:
    """`05_near_dedup` -> `near_dedup` (a dropped/ folder is named after the step's id)."""
    return re.sub(r"^\d+_", "", name)


def gristmill_side(run_dir: Path) -> Side:
    import pyarrow.parquet as pq

    side = Side("gristmill")
    plan = json.loads((run_dir / "plan.json").read_text())
    final = None
    for st in plan["stages"]:
        folder = run_dir / st["label"]
        for step_dir in sorted((folder / "dropped").glob("*")):
            for f in sorted(step_dir.rglob("*.parquet")):
                for r in pq.read_table(f).to_pylist():
                    step = _step_of_folder(step_dir.name)
                    side.add(r["id"], step, r["drop_reason"], r["text"], r.get("language"), r.get("url"))
        if any((folder / "output").rglob("*.parquet")):
            final = folder / "output"
    for f in sorted(final.rglob("*.parquet")):
        for r in pq.read_table(f).to_pylist():
            side.add(r["id"], KEPT, None, r["text"], r.get("language"), r.get("url"))
    return side


def _jsonl(folder: Path):
    for f in sorted(folder.rglob("*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)


def datatrove_side(work: Path, steps: list[str], languages: list[str]) -> Side:
    """datatrove's outcomes, its reasons named as gristmill's: URLFilter's by the table above;
    LanguageFilter and MinhashDedupFilter give none, so the page's label (of `languages`, the
    kept ones, or not) and `near_duplicate` name them."""
    side = Side("datatrove")
    for step in steps:
        for r in _jsonl(work / "removed" / step):
            m = r.get("metadata", {})
            reason = m.get("filter_reason")
            if step == "url_filter":
                from gristmill.filters.url_filter import DATATROVE_REASONS

                reason = DATATROVE_REASONS.get(reason, reason)
            elif step == "langid":
                reason = "low_language_score" if m.get("language") in languages else "language_not_kept"
            elif step == "near_dedup":
                reason = "near_duplicate"
            side.add(r["id"], step, reason, r["text"], m.get("language"), m.get("url"))
    for r in _jsonl(work / "final"):
        m = r.get("metadata", {})
        side.add(r["id"], KEPT, None, r["text"], m.get("language"), m.get("url"))
    return side


# --- explaining a disagreement ------------------------------------------------------------------


@contextlib.contextmanager
def patched(words: bool, language: str | None, sentences: bool):
    """datatrove's filters with gristmill's word splitter (for pages labelled `language`)
    and/or sentence splitter in place of their tokenizer's."""
    from datatrove.pipeline.filters import (
        c4_filters,
        fineweb_quality_filter,
        gopher_quality_filter,
        gopher_repetition_filter,
    )

    from gristmill.text.words import split_sentences, split_words

    saved = []
    if words:
        ours = lambda text, _language=None: list(split_words(text, language))  # noqa: E731
        for module in (gopher_quality_filter, gopher_repetition_filter, fineweb_quality_filter):
            saved.append((module, "split_into_words", module.split_into_words))
            module.split_into_words = ours
    if sentences:
        saved.append((c4_filters, "split_into_sentences", c4_filters.split_into_sentences))
        c4_filters.split_into_sentences = lambda text, _language=None: split_sentences(text)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _decide(filter_, text: str, language: str | None, meta: dict | None = None):
    """(keep, reason) of one filter on one text (datatrove's and gristmill's alike)."""
    from datatrove.data import Document

    doc = Document(text=text, id="x", metadata={"language": language, **(meta or {})})
    result = filter_.filter(doc) if not hasattr(filter_, "config_for") else filter_.filter_batch([doc])[0]
    return (True, None) if result is True else (False, None) if result is False else tuple(result)


def _rule_detail(reason: str, text: str, ours: list[str], theirs: list[str], c, language, sentence_counts) -> str:
    """The statistic of the rule behind `reason`, with gristmill's words and datatrove's."""
    from datatrove.pipeline.filters.gopher_repetition_filter import find_all_duplicate, find_top_duplicate, get_n_grams

    from gristmill.filters.gopher_quality import language_stop_words
    from gristmill.text.words import PUNCTUATION_CHARS

    def both(f, fmt="{:.3f}"):
        return f"{fmt.format(f(ours))} with gristmill's words, {fmt.format(f(theirs))} with datatrove's"

    content = lambda w: [x for x in w if x.strip(PUNCTUATION_CHARS)]  # noqa: E731
    if reason in ("gopher_short_doc", "gopher_long_doc"):
        bound = c.min_doc_words if reason == "gopher_short_doc" else c.max_doc_words
        return f"words (punctuation aside): {both(lambda w: len(content(w)), '{}')}; bound {bound}"
    if reason in ("gopher_below_avg_threshold", "gopher_above_avg_threshold"):
        mean = lambda w: sum(map(len, content(w))) / max(len(content(w)), 1)  # noqa: E731
        return f"mean word length {both(mean, '{:.2f}')}; bounds {c.min_avg_word_length}-{c.max_avg_word_length}"
    if reason == "gopher_below_alpha_threshold":
        share = lambda w: sum(any(map(str.isalpha, x)) for x in w) / max(len(w), 1)  # noqa: E731
        return f"share of words with a letter {both(share)}; at least {c.max_non_alpha_words_ratio}"
    if reason == "gopher_enough_stop_words":
        stops = frozenset(c.stop_words) if c.stop_words is not None else language_stop_words(language)
        found = lambda w: len(stops & set(w))  # noqa: E731
        return f"distinct stop words {both(found, '{}')}; at least {c.min_stop_words}"
    if reason in ("gopher_too_many_hashes", "gopher_too_many_ellipsis"):
        what = "#" if reason.endswith("hashes") else "ellipses"
        n = text.count("#") if what == "#" else text.count("...") + text.count("…")
        return f"{n} {what} per word: {both(lambda w: n / max(len(w), 1))}; at most {c.max_symbol_word_ratio}"
    if m := re.fullmatch(r"top_(\d+)_gram", reason):
        n = int(m.group(1))
        bound = dict(c.top_n_grams)[n]
        top = lambda w: (find_top_duplicate(get_n_grams(w, n)) if len(w) >= n else 0) / len(text)  # noqa: E731
        return f"top {n}-gram's share of characters {both(top)}; at most {bound}"
    if m := re.fullmatch(r"duplicated_(\d+)_n_grams", reason):
        n = int(m.group(1))
        bound = dict(c.dup_n_grams)[n]
        share = both(lambda w: find_all_duplicate(w, n) / len(text))
        return f"repeated {n}-grams' share of characters {share}; at most {bound}"
    if reason == "list_ratio":
        newlines = text.count("\n")
        return f"newlines per word {both(lambda w: newlines / max(len(w), 1))}; at most {c.new_line_ratio}"
    if reason == "too_few_sentences" and sentence_counts:
        return (
            f"sentences in the kept lines: {sentence_counts[0]} by gristmill's splitter, "
            f"{sentence_counts[1]} by datatrove's (spaCy); at least {c.min_num_sentences}"
        )
    return ""


def _sentence_counts(dt_filter, text: str, language: str | None, dt_language: str) -> tuple[int, int]:
    """Sentences C4 counts in the lines it keeps of `text`: (gristmill's splitter, datatrove's)."""
    from datatrove.pipeline.filters import c4_filters

    from gristmill.text.words import split_sentences

    counted = []
    original = c4_filters.split_into_sentences
    for split in (lambda t, lang=None: split_sentences(t), original):
        total = [0]

        def counting(t, lang=None, split=split, total=total):
            out = split(t, lang)
            total[0] += len(out)
            return out

        c4_filters.split_into_sentences = counting
        try:
            _decide(copy.deepcopy(dt_filter), text, language)
        finally:
            c4_filters.split_into_sentences = original
        counted.append(total[0])
    return counted[0], counted[1]


@dataclass
class Disagreement:
    doc_id: str
    url: str | None
    language: str | None
    gristmill: tuple[str, str | None]
    datatrove: tuple[str, str | None]
    step: str  # the first step where the sides part
    cause: str
    detail: str
    rule: str = ""  # the reason given at that step by the side that dropped the page there

    def row(self) -> str:
        g, d = (f"{s}" + (f" ({r})" if r else "") for s, r in (self.gristmill, self.datatrove))
        page = self.url or self.doc_id
        return f"| {page} | {self.language or '-'} | {g} | {d} | {self.step} | {self.cause} | {self.detail} |"


class Explainer:
    """Re-decides the step where the two sides part on the text it saw, to name the cause."""

    def __init__(self, steps, dt_languages: dict[str, str], files: list[Path]):
        self.dt_languages, self.files = dt_languages, files
        self.order = [name for name, _, _ in steps]
        self.built = {name: (step, params) for name, step, params in steps}
        self._records = None

    def dt_language(self, language):
        return self.dt_languages.get(language, "en")

    def records(self) -> dict[str, bytes]:
        """Each WET conversion record's payload by record id, as datatrove's reader gets it."""
        if self._records is None:
            from warcio.archiveiterator import ArchiveIterator

            self._records = {}
            for f in self.files:
                with open(f, "rb") as fh:
                    for rec in ArchiveIterator(fh):
                        if rec.rec_type == "conversion":
                            self._records[rec.rec_headers["WARC-Record-ID"]] = rec.content_stream().read()
        return self._records

    def __call__(self, doc_id, g: Side, d: Side) -> Disagreement:
        go, do = g.outcome.get(doc_id, (NOT_READ, None)), d.outcome.get(doc_id, (NOT_READ, None))
        language = g.language.get(doc_id) or d.language.get(doc_id)
        url = g.url.get(doc_id) or d.url.get(doc_id)

        def make(step, cause, detail):
            rule = go[1] if go[0] == step else do[1] if do[0] == step else ""
            return Disagreement(doc_id, url, language, go, do, step, cause, detail, rule or "")

        if do[0] == NOT_READ:
            import magic

            payload = self.records().get(doc_id, b"")
            return make(
                "reader",
                "reader",
                f"datatrove's WarcReader skips it: libmagic types the record {magic.from_buffer(payload, mime=True)}",
            )
        rank = lambda o: self.order.index(o[0]) if o[0] in self.order else len(self.order)  # noqa: E731
        step = self.order[min(rank(go), rank(do))] if min(rank(go), rank(do)) < len(self.order) else KEPT
        if step == KEPT:  # both keep: the texts differ
            return make(KEPT, "text", _text_difference(g.text[doc_id], d.text[doc_id]))
        if step == "near_dedup":
            return make(step, "near_dedup", self.near_dedup_detail(doc_id, g, d))
        dropper = g if rank(go) <= rank(do) else d
        text = dropper.text[doc_id]
        ours, _ = self.built[step]
        if ours is None:
            return make(step, "unexplained", f"{step} decides without words; both sides should agree")
        c = ours.config_for(language)
        dt_lang = self.dt_language(language)
        dt = datatrove_filter(step, c, dt_lang)
        g_result = _decide(ours, text, language)
        with patched(True, language, False):
            words_only = _decide(copy.deepcopy(dt), text, language)
        with patched(False, language, True):
            sentences_only = _decide(copy.deepcopy(dt), text, language)
        with patched(True, language, True):
            both = _decide(copy.deepcopy(dt), text, language)
        if words_only == g_result:
            cause = "words"
        elif sentences_only == g_result:
            cause = "sentences"
        elif both == g_result:
            cause = "words+sentences"
        else:
            cause = "unexplained"
        from datatrove.utils.text import split_into_words

        from gristmill.text.words import split_words

        ours_words, theirs_words = list(split_words(text, language)), split_into_words(text, dt_lang)
        counts = _sentence_counts(dt, text, language, dt_lang) if step == "c4_lines" else None
        reasons = [r for r in (go[1] if go[0] == step else None, do[1] if do[0] == step else None) if r]
        details = [_rule_detail(r, text, ours_words, theirs_words, c, language, counts) for r in dict.fromkeys(reasons)]
        return make(step, cause, "; ".join(x for x in details if x))

    def near_dedup_detail(self, doc_id, g: Side, d: Side) -> str:
        """The document's closest partner among the documents near dedup was given (on the side
        that removed it), its Jaccard under gristmill's shingles, and the chance LSH sees it."""
        from gristmill.dedup.text import jaccard, shingles

        side = g if g.outcome[doc_id][0] == "near_dedup" else d
        after = set(self.order[self.order.index("near_dedup") :]) | {KEPT}
        reached = [i for i, (s, _) in side.outcome.items() if s in after and i != doc_id]
        lang = side.language.get(doc_id)
        mine = shingles(side.text[doc_id], 5, lang)
        best = max(((jaccard(mine, shingles(side.text[i], 5, side.language.get(i))), i) for i in reached), default=None)
        if best is None:
            return "no other document reached near dedup"
        j, partner = best
        p = 1 - (1 - j**8) ** 14
        return (
            f"removed by {side.name} only; closest document {side.url.get(partner) or partner}: Jaccard {j:.3f} "
            f"(5-gram shingles), found by 14 bands of 8 hashes with probability {p:.2f}"
        )


def _text_difference(a: str, b: str) -> str:
    import difflib

    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    ops = [(tag, a[i1:i2][:60], b[j1:j2][:60]) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]
    return f"{len(ops)} differing spans, first: {ops[0]!r}" if ops else "equal"


# --- comparing -----------------------------------------------------------------------------------


def _pii_neutral(text: str) -> str:
    """The text with FineWeb's replacement strings set aside: gristmill picks one per document
    and address, datatrove rotates through them per task."""
    from gristmill.filters.pii import PII

    c = PII.Config()
    for s in c.email_replacement:
        text = text.replace(s, "<email>")
    for s in c.ip_replacement:
        text = text.replace(s, "<ip>")
    return text


@dataclass
class Report:
    recipe: str
    documents: int
    compared: int
    same_outcome: int
    same_step: int
    same_reason: int
    kept_both: int
    same_text: int
    funnel: dict[str, tuple[int, int]]
    disagreements: list[Disagreement]
    not_compared: dict[str, dict] = field(default_factory=dict)

    def lines(self) -> list[str]:
        pct = lambda n: f"{n}/{self.compared} ({n / max(self.compared, 1):.1%})"  # noqa: E731
        out = [
            f"recipe {self.recipe}: {self.documents} documents read, {self.compared} compared",
            f"same outcome (kept, or dropped): {pct(self.same_outcome)}",
            f"same step: {pct(self.same_step)}",
            f"same step and reason: {pct(self.same_reason)}",
            f"kept by both: {self.kept_both}, same text (PII replacements aside): {self.same_text}",
            "",
            "| step | dropped by gristmill | dropped by datatrove |",
            "|---|---:|---:|",
            *(f"| {s} | {a} | {b} |" for s, (a, b) in self.funnel.items()),
            "",
            f"disagreements: {len(self.disagreements)}"
            + (f" ({', '.join(f'{k} {v}' for k, v in Counter(x.cause for x in self.disagreements).items())})"),
        ]
        by_rule = Counter(
            (x.step, x.rule, x.cause, (x.gristmill[0] == KEPT) != (x.datatrove[0] == KEPT)) for x in self.disagreements
        )
        for (step, rule, cause, flips), n in sorted(by_rule.items(), key=lambda kv: -kv[1]):
            out.append(
                f"  {n:>3} parted at {step} ({rule or '-'}), cause {cause}"
                + (", kept by one side only" if flips else "")
            )
        if self.disagreements:
            out += [
                "| page | lid | gristmill | datatrove | parted at | cause | detail |",
                "|---|---|---|---|---|---|---|",
                *(x.row() for x in self.disagreements),
            ]
        for lang, info in self.not_compared.items():
            out.append(
                f"not compared beyond language ID: {lang} ({info['pages']} pages kept by langid on both sides): "
                f"{info['why']}"
            )
        return out


def compare(recipe: str, g: Side, d: Side, explain: Explainer, skip: set[str] = frozenset()) -> Report:
    """Document by document; `skip`: ids left out (languages datatrove cannot tokenize here)."""
    ids = sorted((set(g.outcome) | set(d.outcome)) - skip)
    same_outcome = same_step = same_reason = kept_both = same_text = 0
    disagreements = []
    funnel = {s: [0, 0] for s in explain.order if s not in ("pii",)}
    for i in ids:
        go, do = g.outcome.get(i, (NOT_READ, None)), d.outcome.get(i, (NOT_READ, None))
        for k, o in enumerate((go, do)):
            if o[0] in funnel:
                funnel[o[0]][k] += 1
        same_outcome += (go[0] == KEPT) == (do[0] == KEPT) and NOT_READ not in (go[0], do[0])
        same_step += go[0] == do[0]
        reason_equal = go == do
        same_reason += reason_equal
        if go[0] == do[0] == KEPT:
            kept_both += 1
            equal = _pii_neutral(g.text[i]) == _pii_neutral(d.text[i])
            same_text += equal
            if not equal:
                disagreements.append(explain(i, g, d))
        elif not reason_equal:
            disagreements.append(explain(i, g, d))
    return Report(
        recipe,
        len(set(g.outcome) | set(d.outcome)),
        len(ids),
        same_outcome,
        same_step,
        same_reason,
        kept_both,
        same_text,
        {s: tuple(v) for s, v in funnel.items()},
        disagreements,
    )


# --- the two recipes -----------------------------------------------------------------------------


def compare_fineweb(files: list[Path], work: Path) -> Report:
    config = derived_config("fineweb", files, work)
    proc = start_gristmill(config, work / "gristmill", work / "gristmill.log")
    steps = resolved_steps(config)
    en = {name: step.config_for("en") for name, step, _ in steps if step is not None}
    dt_work = work / "datatrove"
    for ex in datatrove_fineweb(files, dt_work, en):
        ex.run()
    finish(proc, work / "gristmill.log")
    order = [name for name, _, _ in steps]
    g, d = gristmill_side(work / "gristmill"), datatrove_side(dt_work, order, ["en"])
    return compare("fineweb", g, d, Explainer(steps, {}, files))


def fineweb2_codes(labels) -> dict[str, str]:
    """{lid.176 label: FineWeb-2's language-script code (datatrove's tokenizer key)}, as the
    calibration maps them."""
    from gristmill.pipeline.calibration.fineweb2 import default_configs_dir, read_fineweb2

    return read_fineweb2(default_configs_dir(), languages=sorted(labels)).mapping


def tokenizer_status(code: str) -> str | None:
    """None when datatrove's word tokenizer for `code` loads and splits here, else why not."""
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    try:
        load_word_tokenizer(code).word_tokenize("Das ist ein Test. Это тест.")
    except Exception as e:  # noqa: BLE001 - ImportError (a package missing), ValueError (no assignment), ...
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return None


def compare_fineweb2(files: list[Path], work: Path) -> Report:
    from datatrove.pipeline.dedup import MinhashDedupFilter
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    config = derived_config("fineweb2", files, work)
    proc = start_gristmill(config, work / "gristmill", work / "gristmill.log")
    steps = resolved_steps(config)
    built = {name: step for name, step, _ in steps}
    languages = next(p for name, _, p in steps if name == "langid").languages
    dt_work = work / "datatrove"
    by_language = dt_work / "by_language"
    stage1 = [
        warc_reader(files, dt_work),
        url_filter(JsonlWriter(str(dt_work / "removed" / "url_filter"))),
        LanguageFilter(
            languages=languages,
            language_threshold=0.65,
            exclusion_writer=JsonlWriter(str(dt_work / "removed" / "langid")),
        ),
        JsonlWriter(str(by_language), output_filename="${language}/${rank}.jsonl.gz"),
    ]
    executor(stage1, dt_work / "logs" / "language").run()
    present = sorted(p.name for p in by_language.iterdir()) if by_language.is_dir() else []
    codes = fineweb2_codes(present)
    not_compared = {}
    order = [name for name, _, _ in steps]
    filters = [s for s in order if s in ("gopher_repetition", "fineweb_quality", "gopher_quality")]
    for lang in present:
        code = codes[lang]
        why = tokenizer_status(code)
        if why:
            pages = sum(1 for _ in _jsonl(by_language / lang))
            not_compared[lang] = {"code": code, "pages": pages, "why": why}
            continue

        def excluded(step, lang=lang):
            return JsonlWriter(str(dt_work / "removed" / step), output_filename=f"{lang}_${{rank}}.jsonl.gz")

        mh, remove = minhash_stages(
            JsonlReader(str(by_language / lang)), dt_work, minhash_config("xxhash"), code, tasks=1, workers=1, tag=lang
        )
        for ex in mh:
            ex.run()
        last = [
            JsonlReader(str(by_language / lang)),
            MinhashDedupFilter(str(remove), exclusion_writer=excluded("near_dedup")),
            *(datatrove_filter(s, built[s].config_for(lang), code, excluded(s)) for s in filters),
            PIIFormatter(),
            JsonlWriter(str(dt_work / "final"), output_filename=f"{lang}_${{rank}}.jsonl.gz"),
        ]
        executor(last, dt_work / "logs" / f"final_{lang}").run()
    finish(proc, work / "gristmill.log")
    g, d = gristmill_side(work / "gristmill"), datatrove_side(dt_work, order, languages)
    # the pages of languages not compared: both sides' outcome up to language ID only
    skip = {
        i for i, lang in g.language.items() if lang in not_compared and g.outcome[i][0] not in ("url_filter", "langid")
    }
    report = compare("fineweb2", g, d, Explainer(steps, codes, files), skip)
    report.not_compared = not_compared
    return report


def tokenizer_table() -> list[str]:
    """Every language of the FineWeb-2 calibration: datatrove's tokenizer for it, loading here or not."""
    import csv

    from datatrove.utils._import_utils import ASSETS_PATH

    cal = yaml.safe_load((REPO / "configs" / "calibration" / "fineweb2.yaml").read_text())
    labels = sorted({lang for step in cal.values() for lang in step["per_language"]})
    codes = fineweb2_codes(labels)
    rows = {
        f"{r['code_3']}_{r['script']}": r for r in csv.DictReader(open(Path(ASSETS_PATH) / "tokenizer_assignment.csv"))
    }
    by_reason: dict[str, list[str]] = {}
    for label in labels:
        row = rows.get(codes[label], {})
        kind = f"{row.get('type') or 'none'}({row.get('tok_code') or ''})"
        why = tokenizer_status(codes[label])
        key = "loads offline" if why is None else f"does not load: {why}"
        by_reason.setdefault(key, []).append(f"{label}={codes[label]} {kind}")
    out = []
    for key, items in sorted(by_reason.items(), key=lambda kv: (kv[0] != "loads offline", kv[0])):
        out.append(f"{key} ({len(items)}): {', '.join(items)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", choices=sorted(RECIPES))
    ap.add_argument("--wet", nargs="*", type=Path, help="WET files, one folder (default: the shared samples)")
    ap.add_argument("--work", type=Path, help="where both sides write (default: a temporary folder, removed)")
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--tokenizers", action="store_true", help="list datatrove's tokenizer of every FineWeb-2 language")
    ap.add_argument("--smoke", action="store_true", help="the smaller sample file: checks that it runs")
    args = ap.parse_args()
    files = args.wet or sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))
    if args.smoke and not args.wet:
        files = sorted(files, key=lambda f: f.stat().st_size)[:1]
    if not files or not LID.is_file():
        print(f"need WET files ({DATA}/cc/wet) and {LID} (make models)", file=sys.stderr)
        return 2
    datatrove_offline()
    work = args.work or Path(tempfile.mkdtemp(prefix="recipe-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        # datatrove's executors log each task and its stats to stderr: the report is the output
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
            report = (compare_fineweb if args.recipe == "fineweb" else compare_fineweb2)(files, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"input: {', '.join(f.name for f in files)}")
    print("\n".join(report.lines()))
    if args.tokenizers:
        print("\ndatatrove's word tokenizers of the FineWeb-2 calibration's languages:")
        print("\n".join(tokenizer_table()))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    **{k: v for k, v in report.__dict__.items() if k != "disagreements"},
                    "disagreements": [x.__dict__ for x in report.disagreements],
                },
                indent=1,
                ensure_ascii=False,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
