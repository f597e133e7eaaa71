"""`decontaminate`: benchmark passages planted into real WET records of several languages are
found (drop) or cut out (cut), near misses are kept, and bad benchmark files stop the planning
with one line; a pipeline run end to end records its drops and refuses a changed benchmark file.

The benchmarks are written by the tests: passages of the Universal Declaration of Human Rights
(the shared udhr2 corpus) in English, German, French, Russian, Chinese, Japanese and Thai,
planted into real records of the WET sample that langid labels with the same language.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from datatrove.data import Document

from gristmill.config import ConfigError, from_dict
from gristmill.core.filter import BATCH_CHARS
from gristmill.core.step import DOCUMENT_BYTES_PER_BYTE
from gristmill.dedup.decontaminate import DOC_BYTES_PER_WORD, DOC_WORDS_BOUND, BenchmarkError, Decontaminate
from gristmill.dedup.text import words
from gristmill.filters.langid import LangId
from gristmill.input.wet import WetReader
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

UDHR = {"en": "eng", "de": "deu", "fr": "fra", "ru": "rus", "zh": "cmn_hans", "ja": "jpn", "th": "tha"}
SPACED = ("en", "de", "fr", "ru")
LANGUAGES = (*SPACED, "zh", "ja", "th")


@pytest.fixture(scope="module")
def labelled(wet_files, lid_model) -> list[Document]:
    lid = LangId(model=str(lid_model), languages=None, min_score=0.0)
    return list(lid.run(WetReader([str(p) for p in wet_files]).run()))


@pytest.fixture(scope="module")
def passages(shared_data) -> dict[str, list[str]]:
    """Per language, UDHR lines of 25 to 45 words (ICU words for zh/ja/th)."""
    out = {}
    with zipfile.ZipFile(shared_data / "corpus" / "multi" / "udhr2.zip") as z:
        for lang, code in UDHR.items():
            lines = [ln.strip() for ln in z.read(f"udhr2/{code}.txt").decode("utf-8").splitlines()]
            out[lang] = [ln for ln in lines if 25 <= len(words(ln, lang)) <= 45]
            assert len(out[lang]) >= 10, lang
    return out


def record(labelled: list[Document], lang: str, i: int = 0) -> Document:
    """A fresh copy of the i-th record langid labels `lang` (with at least 3 lines)."""
    docs = [d for d in labelled if d.metadata["language"] == lang and d.text.count("\n") >= 2]
    d = docs[i % len(docs)]
    return Document(text=d.text, id=d.id, metadata=dict(d.metadata))


def plant(doc: Document, passage: str, own_line: bool = True, at: float = 0.5) -> Document:
    """`doc` with `passage` inserted at fraction `at` of its lines: as a line of its own, or
    inside a line."""
    lines = doc.text.split("\n")
    mid = max(1, min(len(lines) - 1, int(len(lines) * at)))
    if own_line:
        lines.insert(mid, passage)
    else:
        lines[mid] = f"{lines[mid]} {passage} {lines[mid]}"
    return Document(text="\n".join(lines), id=doc.id + "-planted", metadata=dict(doc.metadata))


def write_jsonl(path: Path, texts: list[str], field: str = "question") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)))
    return path


def step(tmp_path: Path, benchmarks: list[dict], **params) -> Decontaminate:
    return Decontaminate(benchmarks=benchmarks, index_dir=str(tmp_path / "index"), **params)


def decide(flt: Decontaminate, doc: Document):
    return flt.filter_batch([doc])[0]


@pytest.fixture(scope="module")
def udhr_step(tmp_path_factory, passages) -> Decontaminate:
    """One benchmark file per language: its first ten passages."""
    folder = tmp_path_factory.mktemp("bench")
    benchmarks = []
    for lang in LANGUAGES:
        path = write_jsonl(folder / f"udhr_{lang}.jsonl", passages[lang][:10])
        benchmarks.append({"path": str(path), "field": "question", "language": lang})
    return Decontaminate(benchmarks=benchmarks, index_dir=str(folder / "index"))


# --- found, in every language ---


@pytest.mark.parametrize("lang", LANGUAGES)
def test_a_planted_passage_is_found_in_a_real_record_of_its_language(udhr_step, labelled, passages, lang):
    doc = record(labelled, lang)
    assert decide(udhr_step, doc) is True  # the real record alone is clean
    for i, own_line in ((2, True), (7, False)):
        planted = plant(doc, passages[lang][i], own_line)
        assert decide(udhr_step, planted) == (False, "contaminated")
        assert planted.metadata["contaminated_by"] == f"udhr_{lang}.jsonl"
    assert udhr_step.stats[f"contaminated_by_udhr_{lang}.jsonl"].total >= 2


def test_no_record_of_the_sample_is_contaminated_by_the_declaration(udhr_step, labelled):
    docs = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in labelled]
    assert len(docs) == 609 and {d.metadata["language"] for d in docs} >= set(LANGUAGES)
    assert udhr_step.filter_batch(docs) == [True] * len(docs)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_twelve_of_thirteen_words_are_kept_and_all_thirteen_dropped(tmp_path, labelled, passages, lang):
    joiner = " " if lang in SPACED else ""
    # 13 words that are 13 words again once written down (Thai words joined without their
    # spaces may segment otherwise)
    w = next(
        w[s : s + 13]
        for p in passages[lang][4:]
        for w in [words(p, lang)]
        for s in range(len(w) - 13)
        if words(joiner.join(w[s : s + 13]), lang) == w[s : s + 13]
    )
    thirteen = joiner.join(w)
    bench = write_jsonl(tmp_path / "b.jsonl", [thirteen])
    flt = step(tmp_path, [{"path": str(bench), "field": "question", "language": lang}])
    assert flt.index.ngrams == 1
    doc = record(labelled, lang, 1)
    assert decide(flt, plant(doc, joiner.join(w[:12]))) is True
    assert decide(flt, plant(doc, joiner.join(w[1:13]))) is True
    assert decide(flt, plant(doc, joiner.join([*w[:6], "x" if lang in SPACED else "猫", *w[7:13]]))) is True
    assert decide(flt, plant(doc, thirteen)) == (False, "contaminated")


def _disguised(passage: str) -> str:
    """The passage upper-cased, with punctuation added after words and runs of spaces, tabs and a
    line break between them."""
    out = []
    for i, token in enumerate(passage.split()):
        out.append(token.upper() + ("," if i % 4 == 1 else "!?" if i % 7 == 3 else ""))
        out.append("\n" if i == 9 else "  \t " if i % 3 == 0 else " ")
    return "«" + "".join(out) + "...»"


@pytest.mark.parametrize("lang", SPACED)
def test_the_passage_with_other_case_punctuation_and_whitespace_is_found(udhr_step, labelled, passages, lang):
    passage = passages[lang][5]
    disguised = _disguised(passage)
    assert disguised.casefold() != passage.casefold() and "\n" in disguised
    assert decide(udhr_step, plant(record(labelled, lang, 2), disguised, own_line=False)) == (False, "contaminated")


@pytest.mark.parametrize("lang", ("zh", "ja"))
def test_the_passage_with_other_punctuation_is_found_in_chinese_and_japanese(udhr_step, labelled, passages, lang):
    w = words(passages[lang][6], lang)
    disguised = "「" + "、".join(w[:8]) + "！" + "".join(w[8:]) + "」。"
    assert disguised != passages[lang][6]
    assert decide(udhr_step, plant(record(labelled, lang, 2), disguised)) == (False, "contaminated")


def test_a_batch_decides_as_documents_one_by_one_and_no_match_spans_two_documents(udhr_step, labelled, passages):
    w = passages["en"][8].split()
    head = record(labelled, "en", 5)
    head.text += "\n" + " ".join(w[:8])  # 8 words of a passage end one document...
    tail = record(labelled, "en", 6)
    tail.text = " ".join(w[8:20]) + "\n" + tail.text  # ...and its next 12 start the next
    joined = Document(text=head.text + "\n" + tail.text, id="joined", metadata={"language": "en"})
    assert decide(udhr_step, joined) == (False, "contaminated")  # together they hold it
    batch = [record(labelled, "en", i) for i in range(5)] + [head, tail]
    batch += [plant(record(labelled, lang, 7), passages[lang][9]) for lang in LANGUAGES] + [record(labelled, "zh", 3)]
    one_by_one = [decide(udhr_step, Document(text=d.text, id=d.id, metadata=dict(d.metadata))) for d in batch]
    assert one_by_one == [True] * 7 + [(False, "contaminated")] * len(LANGUAGES) + [True]
    assert udhr_step.filter_batch(batch) == one_by_one


# --- short benchmark texts ---


def test_a_five_word_benchmark_text_is_ignored_by_default_and_found_with_min_words_5(tmp_path, labelled, passages):
    w = words(passages["en"][3], "en")
    five, nine = " ".join(w[:5]), " ".join(w[10:19])
    bench = [{"path": str(write_jsonl(tmp_path / "short.jsonl", [five, nine])), "field": "question"}]
    doc = record(labelled, "en", 3)
    by_five, by_nine = plant(doc, five.upper() + "."), plant(doc, nine)

    default = step(tmp_path, bench)  # min_words 8: the 9-word text is one 9-gram, the 5-word one ignored
    assert default.index.meta["short_texts_ignored"] == 1 and default.index.meta["short"] == 1
    assert decide(default, by_five) is True
    assert decide(default, by_nine) == (False, "contaminated")

    five_words = step(tmp_path, bench, min_words=5)
    assert five_words.index.meta["short_texts_ignored"] == 0 and five_words.index.meta["short"] == 2
    assert decide(five_words, by_five) == (False, "contaminated")
    assert decide(five_words, doc) is True


def test_short_texts_are_counted_in_the_task_stats(tmp_path, labelled, passages):
    w = words(passages["en"][3], "en")
    bench = [
        {"path": str(write_jsonl(tmp_path / "b.jsonl", [" ".join(w[:5]), passages["en"][0]])), "field": "question"}
    ]
    flt = step(tmp_path, bench)
    list(flt.run(iter([record(labelled, "en")]), rank=0))
    c = {k: v.total for k, v in flt.stats.stats.items()}
    assert c["benchmark_texts"] == 2 and c["benchmark_short_texts_ignored"] == 1
    assert c["benchmark_ngrams"] == len(words(passages["en"][0], "en")) - 12


# --- cut ---


@pytest.mark.parametrize("lang", ("en", "ru", "zh", "ja"))
def test_cut_removes_the_planted_lines_and_leaves_the_rest_byte_identical(tmp_path, labelled, passages, lang):
    flt = step(
        tmp_path,
        [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages[lang][:3])), "field": "question", "language": lang}],
        action="cut",
    )
    doc = record(labelled, lang, 4)
    original = doc.text
    # one passage on a line of its own, another spread over two lines (both lines go), broken
    # at a space, or after a punctuation mark in Chinese and Japanese
    second = passages[lang][1]
    cut_at = len(second) // 2
    while not (second[cut_at].isspace() if lang in SPACED else second[cut_at - 1] in "，、,;；"):
        cut_at += 1
    planted = plant(plant(doc, passages[lang][0], at=0.3), second[:cut_at] + "\n" + second[cut_at:], at=0.7)
    assert decide(flt, planted) is True
    assert planted.text == original
    assert planted.metadata["contaminated_by"] == "b.jsonl"
    c = {k: v.total for k, v in flt.stats.stats.items()}
    assert c["spans_cut"] == 2 and c["lines_cut"] == 3 and c["documents_cut"] == 1
    assert c["bytes_cut"] == len((passages[lang][0] + "\n" + second + "\n\n").encode("utf-8"))


def test_cut_inside_a_line_removes_that_line_only(tmp_path, labelled, passages):
    flt = step(
        tmp_path,
        [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["de"][:1])), "field": "question"}],
        action="cut",
    )
    doc = record(labelled, "de")
    planted = plant(doc, passages["de"][0], own_line=False)
    lines = doc.text.split("\n")
    mid = int(len(lines) * 0.5)
    assert decide(flt, planted) is True
    assert planted.text == "\n".join(lines[:mid] + lines[mid + 1 :])


def test_a_document_left_too_short_after_the_cut_is_dropped(tmp_path, passages):
    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["fr"][:1])), "field": "question"}]
    doc = Document(text=f"Titre\n{passages['fr'][0]}\nfin de la page", id="x", metadata={"language": "fr"})
    assert decide(step(tmp_path, bench, action="cut", min_words_after_cut=6), doc) == (False, "too_short_after_cut")
    assert doc.text == "Titre\nfin de la page"
    kept = Document(text=f"Titre\n{passages['fr'][0]}\nfin de la page", id="y", metadata={"language": "fr"})
    assert decide(step(tmp_path, bench, action="cut"), kept) is True and kept.text == "Titre\nfin de la page"


# --- the index ---


def test_the_index_is_built_once_sorted_and_its_memory_is_declared(tmp_path, passages):
    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["en"])), "field": "question"}]
    first = step(tmp_path, bench)
    folder = first.index.folder
    hashes = np.load(folder / "ngrams.npy")
    assert hashes.dtype == np.uint64 and np.all(hashes[1:] > hashes[:-1])
    expected = sum(len(words(p, "en")) - 12 for p in passages["en"])
    assert expected - 5 <= len(hashes) <= expected  # the declaration repeats a few phrases
    mtime = (folder / "meta.json").stat().st_mtime_ns
    again = step(tmp_path, bench)
    assert again.index.folder == folder and (folder / "meta.json").stat().st_mtime_ns == mtime
    assert step(tmp_path, bench, n=8).index.folder != folder  # another n, another index
    size = sum(f.stat().st_size for f in folder.glob("*.npy"))
    bitmap = np.load(folder / "bitmap.npy")
    # 16 bits per n-gram, up to a power of two (at least 2^16 bits)
    assert len(bitmap) * 8 == 1 << max(16, int(np.ceil(np.log2(16 * len(hashes)))))
    assert np.load(folder / "ngram_files.npy").dtype == np.uint16
    assert first.index.bytes == size <= 10 * len(hashes) + len(bitmap) + 1024
    # and one batch of documents, as every batched filter holds (no dropped sample configured)
    batch = DOCUMENT_BYTES_PER_BYTE * BATCH_CHARS
    assert first.memory_bytes(None) == size + DOC_BYTES_PER_WORD * DOC_WORDS_BOUND + batch


def test_a_damaged_or_half_built_index_is_built_again(tmp_path, labelled, passages):
    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["ru"][:3])), "field": "question"}]
    folder = step(tmp_path, bench).index.folder
    (folder / "bitmap.npy").write_bytes((folder / "bitmap.npy").read_bytes()[:100])  # cut short
    (folder.parent / f"{folder.name}.tmp-99999").mkdir()  # what a build killed half-way leaves
    again = step(tmp_path, bench)
    assert again.index.folder == folder and (folder / "bitmap.npy").stat().st_size > 100
    assert decide(again, plant(record(labelled, "ru"), passages["ru"][2])) == (False, "contaminated")


def test_chinese_texts_without_a_language_are_counted_and_match_no_labelled_page(tmp_path, labelled, passages):
    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["zh"][:3])), "field": "question"}]
    flt = step(tmp_path, bench)  # no `language: zh`: one word per character
    assert flt.index.meta["files"][0]["unspaced_without_language"] == 3
    planted = plant(record(labelled, "zh"), passages["zh"][0])
    assert decide(flt, planted) is True  # the page (labelled zh) has ICU words
    bench[0]["language"] = "zh"
    assert decide(step(tmp_path, bench), planted) == (False, "contaminated")


def test_a_task_maps_the_index_and_refuses_one_changed_since_planning(tmp_path, labelled, passages):
    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["en"][:3])), "field": "question"}]
    flt = step(tmp_path, bench)
    assert decide(flt, plant(record(labelled, "en"), passages["en"][0])) == (False, "contaminated")
    shipped = pickle.dumps(flt)  # as executors ship steps to tasks: no arrays inside
    assert len(shipped) < 20_000
    task = pickle.loads(shipped)
    assert decide(task, plant(record(labelled, "en"), passages["en"][1])) == (False, "contaminated")
    path = flt.index.folder / "ngrams.npy"
    os.utime(path, ns=(0, 0))
    with pytest.raises(BenchmarkError, match="changed since planning"):
        pickle.loads(shipped).tables()


def test_benchmark_formats_parquet_lists_text_and_globs(tmp_path, labelled, passages):
    (tmp_path / "set").mkdir()
    pq.write_table(
        pa.table({"choices": [[passages["en"][0], "a"], [passages["en"][1]]]}), tmp_path / "set" / "x.parquet"
    )
    (tmp_path / "set" / "y.txt").write_text(f"{passages['de'][0]}\n\n{passages['de'][1]}\n")
    flt = step(
        tmp_path,
        [
            {"path": str(tmp_path / "set" / "*.parquet"), "field": "choices"},
            {"path": str(tmp_path / "set" / "*.txt")},
        ],
    )
    assert [f["label"] for f in flt.index.meta["files"]] == ["x.parquet", "y.txt"]
    assert [f["texts"] for f in flt.index.meta["files"]] == [3, 2]
    assert flt.config.benchmarks[0].sha256 == {
        str(tmp_path / "set" / "x.parquet"): _sha(tmp_path / "set" / "x.parquet")
    }
    de = plant(record(labelled, "de"), passages["de"][1])
    assert decide(flt, de) == (False, "contaminated") and de.metadata["contaminated_by"] == "y.txt"
    assert decide(flt, plant(record(labelled, "en"), passages["en"][1])) == (False, "contaminated")


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- bad input: one line naming the file, the line or row and the field ---


def _error(tmp_path, benchmark: dict) -> str:
    with pytest.raises(ValueError) as e:
        step(tmp_path, [benchmark])
    message = str(e.value)
    return message


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"question": "fine text here"}\nnot json at all\n', "b.jsonl:2: not JSON"),
        ('{"question": "fine text here"}\n{"question": "  "}\n', "b.jsonl:2: field 'question' is empty"),
        ('{"question": "fine text here"}\n\n{"other": "x"}\n', "b.jsonl:3: no field 'question' (its fields: 'other')"),
        ('{"question": 3}\n', "b.jsonl:1: field 'question' is int, expected text"),
        ('["question"]\n', "b.jsonl:1: a JSON list, expected an object"),
        ("", "b.jsonl: holds no text in field 'question'"),
    ],
)
def test_bad_jsonl_is_one_line_naming_file_line_and_field(tmp_path, content, expected):
    (tmp_path / "b.jsonl").write_text(content)
    message = _error(tmp_path, {"path": str(tmp_path / "b.jsonl"), "field": "question"})
    assert expected in message and "\n" not in message, message
    assert not list((tmp_path / "index").glob("*"))  # nothing half-built left behind


def test_bad_parquet_and_missing_files_name_what_is_wrong(tmp_path):
    pq.write_table(pa.table({"prompt": ["a text"]}), tmp_path / "p.parquet")
    message = _error(tmp_path, {"path": str(tmp_path / "p.parquet"), "field": "question"})
    assert "p.parquet: no column 'question' (its columns: 'prompt')" in message and "\n" not in message
    pq.write_table(pa.table({"question": ["a text", None]}), tmp_path / "n.parquet")
    message = _error(tmp_path, {"path": str(tmp_path / "n.parquet"), "field": "question"})
    assert "n.parquet: row 1: field 'question' is empty" in message and "\n" not in message
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    assert "bad.parquet: not a readable Parquet file" in _error(
        tmp_path, {"path": str(tmp_path / "bad.parquet"), "field": "q"}
    )

    data = {
        "input": {"paths": ["x"]},
        "steps": [{"decontaminate": {"benchmarks": [{"path": str(tmp_path / "gone.jsonl"), "field": "q"}]}}],
    }
    with pytest.raises(
        ConfigError, match=r"steps\[0\]\.decontaminate\.benchmarks\[0\]\.path: no such file: .*gone\.jsonl"
    ):
        from_dict(data)
    data["steps"][0]["decontaminate"]["benchmarks"][0] = {"path": str(tmp_path / "*.jsonl"), "field": "q"}
    with pytest.raises(ConfigError, match=r"benchmarks\[0\]\.path: no file matches"):
        from_dict(data)
    data["steps"][0]["decontaminate"]["benchmarks"][0] = {"path": str(tmp_path / "p.parquet")}
    with pytest.raises(ConfigError, match=r"benchmarks\[0\]\.field: .*p\.parquet is parquet: name the field"):
        from_dict(data)


# --- a pipeline run, end to end ---

CONFIG = """
run_dir: {run_dir}
executor: {{type: local, tasks: 2, workers: 2}}
input:
  paths: ["{wet}/*.warc.wet.gz"]
steps:
  - langid: {{model: {lid}, languages: null, min_score: 0.0}}
  - decontaminate:
      benchmarks:
        - {{path: {bench}/qa.jsonl, field: question}}
        - {{path: "{bench}/udhr_*.parquet", field: text, language: zh}}
      index_dir: {index}
  - gopher_quality: {{}}
output: {{dropped_sample: 1.0}}
"""


def test_a_pipeline_run_drops_contaminated_records_and_refuses_a_changed_benchmark(
    tmp_path, shared_data, lid_model, labelled, passages
):
    # three real records' paragraphs as the "benchmark": those records are contaminated
    victims = [d for d in labelled if d.metadata["language"] == "en" and len(d.text) > 2000][:3]
    paragraphs = [max(d.text.split("\n"), key=len) for d in victims]
    bench = tmp_path / "bench"
    bench.mkdir()
    write_jsonl(bench / "qa.jsonl", paragraphs)
    pq.write_table(pa.table({"text": passages["zh"][:5]}), bench / "udhr_zh.parquet")
    text = CONFIG.format(
        run_dir=tmp_path / "run", wet=shared_data / "cc" / "wet", lid=lid_model, bench=bench, index=tmp_path / "index"
    )
    (tmp_path / "crawl.yaml").write_text(text)
    cfg = from_dict(yaml.safe_load(text))
    merged = run(cfg)

    stage = next(s for s in merged["stages"] if s["label"].endswith("curate"))
    counters = next(s for s in stage["steps"] if s["name"].endswith("01_decontaminate"))["counters"]
    assert counters["dropped_contaminated"] >= 3 and counters["contaminated_by_qa.jsonl"] >= 3
    assert counters["benchmark_files"] == 2 and counters["benchmark_texts"] == 8
    dropped = pq.read_table(tmp_path / "run" / "01_curate" / "dropped" / "01_decontaminate").to_pylist()
    assert {v.id for v in victims} <= {r["id"] for r in dropped}
    assert {r["drop_reason"] for r in dropped} == {"contaminated"} and {r["contaminated_by"] for r in dropped} == {
        "qa.jsonl"
    }
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    entry = recorded["steps"][1]["decontaminate"]["benchmarks"][0]
    assert entry["sha256"] == {str(bench / "qa.jsonl"): _sha(bench / "qa.jsonl")}

    stats = pipeline("stats", str(tmp_path / "run"), check=True, env={**os.environ, "COLUMNS": "250"}).stdout
    row = next(ln for ln in stats.splitlines() if "01_decontaminate" in ln and "contaminated" in ln)
    assert f" {counters['dropped_contaminated']} " in row

    # the same command resumes; a changed benchmark file is a changed configuration
    again = pipeline("run", str(tmp_path / "crawl.yaml"))
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr[-2000:]
    with (bench / "qa.jsonl").open("a") as f:
        f.write(json.dumps({"question": "one more question of the benchmark"}) + "\n")
    changed = pipeline("run", str(tmp_path / "crawl.yaml"))
    assert changed.returncode != 0
    assert "holds a run made with another configuration" in changed.stderr
    assert f"sha256.{bench / 'qa.jsonl'}" in changed.stderr, changed.stderr[-2000:]
    # the config.yaml of the run names the old sha256: resuming from it refuses the file too
    pinned = pipeline("validate", str(tmp_path / "run" / "config.yaml"))
    assert pinned.returncode != 0 and "benchmarks[0].sha256: " in pinned.stderr and "changed (recorded" in pinned.stderr


def _planning_peak(tmp_path: Path, bench: dict, **params) -> tuple[str, int]:
    """(the error line, or "", and the peak RSS over the imports) of building the step in a
    fresh process, as `pipeline run` plans it."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import resource, sys
        from gristmill.dedup.decontaminate import Decontaminate, BenchmarkError
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            Decontaminate(benchmarks=[{bench!r}], index_dir={str(tmp_path / "index")!r}, **{params!r})
            message = ""
        except BenchmarkError as e:
            message = str(e)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((peak - base) * 1024, message, sep="\\t")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    peak, message = out.stdout.strip().split("\t", 1) if "\t" in out.stdout else (out.stdout.strip(), "")
    return message, int(peak)


def test_a_record_over_max_record_bytes_is_refused_before_it_is_held(tmp_path):
    """A 96 MB one-line `.txt` (and a gzipped JSONL record of as much) once took planning to ~25
    bytes a byte; now the reader holds at most `max_record_bytes` of a line, refuses it naming
    file, line and setting, and the planning process peaks far below what the line would cost."""
    import gzip

    line = b"ab cd ef gh " * (8 << 20)  # 96 MB, no newline
    (tmp_path / "one.txt").write_bytes(b"a fine first line of a benchmark text here\n" + line)
    message, peak = _planning_peak(tmp_path, {"path": str(tmp_path / "one.txt")})
    assert message == (
        f"{tmp_path / 'one.txt'}:2: a line of over 1,048,576 bytes (decontaminate.max_record_bytes): no benchmark "
        "text is that long; raise the setting if this one is"
    )
    assert peak < 64 << 20, peak  # the line held as words: ~3 GB
    with gzip.open(tmp_path / "big.jsonl.gz", "wb") as f:
        f.write(b'{"question": "' + line + b'"}\n')
    message, peak = _planning_peak(tmp_path, {"path": str(tmp_path / "big.jsonl.gz"), "field": "question"})
    assert message.startswith(f"{tmp_path / 'big.jsonl.gz'}:1: a line of over 1,048,576 bytes") and peak < 64 << 20
    pq.write_table(
        pa.table({"q": ["a short text of enough words to count here", "x " * (1 << 20)]}), tmp_path / "p.parquet"
    )
    message = _error(tmp_path, {"path": str(tmp_path / "p.parquet"), "field": "q"})
    assert "p.parquet: row 1: field 'q' of 2,097,152 bytes, over 1,048,576 (decontaminate.max_record_bytes)" in message
    # at the limit, and with the limit raised, the record is read
    ok = " ".join(f"w{i}" for i in range(200_000))[: 1 << 20]
    (tmp_path / "at.txt").write_text(ok + "\n")  # exactly the limit's bytes, and its newline
    assert step(tmp_path, [{"path": str(tmp_path / "at.txt")}]).index.ngrams > 100_000
    assert step(tmp_path, [{"path": str(tmp_path / "p.parquet"), "field": "q"}], max_record_bytes=4 << 20).index.ngrams


def test_deep_json_and_lone_surrogates_are_one_line_naming_file_and_line(tmp_path):
    ok = '{"question": "a fine benchmark question of enough words"}\n'
    cases = {
        "deep.jsonl": (
            ok + '{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "deep.jsonl:2: JSON nested too deep",
        ),
        "surrogate.jsonl": (
            ok + '{"question": "text with a lone \\ud800 surrogate in it"}\n',
            "surrogate.jsonl:2: field 'question' holds a lone surrogate (U+D800",
        ),
        "in_a_list.jsonl": (ok + '{"question": ["fine", "\\udfff"]}\n', "in_a_list.jsonl:2: field 'question' holds"),
    }
    for name, (content, expected) in cases.items():
        (tmp_path / name).write_text(content)
        message = _error(tmp_path, {"path": str(tmp_path / name), "field": "question"})
        assert expected in message and "\n" not in message and "Recursion" not in message, message


def test_the_plan_counts_what_building_the_index_holds(tmp_path, passages):
    """`memory_bytes` is the larger of a task's figure and the build's (a record at
    max_record_bytes, a batch of words, the n-grams), so `pipeline plan` refuses a record limit
    that the planning could not hold, naming the setting."""
    from gristmill.dedup.decontaminate import BUILD_BATCH_BYTES, BUILD_BYTES_PER_NGRAM, RECORD_BYTES_PER_BYTE

    bench = [{"path": str(write_jsonl(tmp_path / "b.jsonl", passages["en"])), "field": "question"}]
    small, large = step(tmp_path, bench), step(tmp_path, bench, max_record_bytes=64 << 20)
    assert large.index.folder == small.index.folder  # the limit does not shape the index
    build = RECORD_BYTES_PER_BYTE * (64 << 20) + BUILD_BATCH_BYTES + BUILD_BYTES_PER_NGRAM * large.index.ngrams
    assert large.build_bytes() == build and large.memory_bytes(None) == build > small.memory_bytes(None)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(tmp_path / "run"),
                "executor": {"memory_gb_per_task": 1},
                "input": {"paths": [str(tmp_path / "b.jsonl")]},
                "steps": [
                    {
                        "decontaminate": {
                            "benchmarks": bench,
                            "index_dir": str(tmp_path / "index"),
                            "max_record_bytes": 1 << 30,
                        }
                    }
                ],
            }
        )
    )
    res = pipeline("plan", str(cfg))
    import re

    out = " ".join((res.stdout + res.stderr).split())
    m = re.search(r"✗ 01_curate: needs ~([\d.]+) GB per task", out)
    assert m and float(m.group(1)) >= 32, out  # 32 bytes a byte of a 1 GiB record
