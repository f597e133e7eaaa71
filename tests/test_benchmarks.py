"""Every script in benchmarks/ runs to the end in its `--smoke` mode.

Nothing else runs the benchmarks, so without this they rot silently (a step's signature changes,
the benchmark that calls it breaks, and nobody knows until the next measurement). Each script
runs in a subprocess as a user runs it, with tiny inputs and the same code path as a full run; the
test checks the line that carries its result: the ratio against its peer where it has one, or a
figure of what it made. Figures are never compared with limits: smoke runs measure nothing.

The GPU benchmarks take their CPU path here. Peer sides need the bench extra (`make test`
installs it); without it they print that they skipped, which fails in CI and passes elsewhere.
Generated inputs are shared where one script consumes another's output (the WET corpus of
make_wet_corpus feeds scale_run and ray_vs_local, the scale run feeds near_removal_rules; the
dedup corpus feeds dedup_eval and dedup_throughput), so each is made once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import BENCH, recipe_compare_smoke, smoke

sys.path.insert(0, str(BENCH))
from scale_run import SMOKE_GB  # noqa: E402  (its corpus folder is named after it: it reuses ours)

# modules of the bench extra (pyproject `[project.optional-dependencies] bench`) the peers import
PEER_MODULES = ("warcio", "cchardet", "magic", "spacy", "tldextract", "fasteners")
NUMBER = r"([-+0-9.,e]+|nan)"


def figure(out: str, before: str) -> float:
    """The number that follows `before` (a literal) in the output, which must be there."""
    m = re.search(re.escape(before) + r"\s*×?" + NUMBER, out)
    assert m, f"no line with {before!r} in:\n{out[-4000:]}"
    return float(m.group(1).replace(",", ""))


def peers_installed() -> bool:
    """True when the bench extra is installed; in CI (GRISTMILL_REQUIRE_DATA=1) it must be."""
    missing = [m for m in PEER_MODULES if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
        pytest.fail(f"the bench extra is not installed (missing {', '.join(missing)}): pip install -e '.[bench]'")
    return not missing


def peer_ratio(out: str, before: str) -> float | None:
    """The peer ratio after `before`, positive; None when the peer side said it skipped (no extra)."""
    if not peers_installed():
        assert "skipped" in out and "pip install -e '.[bench]'" in out, out[-4000:]
        return None
    r = figure(out, before)
    assert r > 0, before
    return r


# --- shared inputs: each made once by the script whose smoke test also checks it ------------------


@pytest.fixture(scope="module")
def bench_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("benchmarks")


@pytest.fixture(scope="module")
def wet_corpus(bench_tmp, shared_data, lid_model) -> tuple[Path, str]:
    """make_wet_corpus.py --smoke, written where scale_run.py --smoke looks for its corpus."""
    work = bench_tmp / "scale"
    out = smoke("make_wet_corpus", work / f"wet-{SMOKE_GB:g}", tmp=bench_tmp, data=shared_data)
    return work, out


@pytest.fixture(scope="module")
def scale_run(wet_corpus, bench_tmp, shared_data) -> tuple[Path, str]:
    work, _ = wet_corpus
    return work, smoke("scale_run", "--work", work, tmp=bench_tmp, data=shared_data)


@pytest.fixture(scope="module")
def dedup_corpus(bench_tmp, shared_data) -> tuple[Path, str]:
    out_dir = bench_tmp / "dedup-corpus"
    return out_dir, smoke("make_dedup_corpus", out_dir, tmp=bench_tmp, data=shared_data)


# --- one check per script ------------------------------------------------------------------------


def check_tokenize_throughput(request, tmp, data):
    out = smoke("tokenize_throughput", tmp=tmp, data=data)
    assert figure(out, "gristmill (tiktoken)") > 0  # the token count of our side
    # datatrove's DocumentTokenizer needs only core dependencies: its side always runs
    assert figure(out, "ratio gristmill/datatrove (MB/s per core):") > 0
    assert "token counts differ" not in out  # same tokenizer, same documents: same tokens


def check_filter_throughput(request, tmp, data):
    lid = request.getfixturevalue("lid_model")
    out = smoke("filter_throughput", tmp=tmp, data=data)
    assert figure(out, "gristmill ") == 43  # documents read from the smaller sample file
    peer_ratio(out, "ratio gristmill/datatrove (MB/s per core):")
    peer_ratio(out, "ratio fineweb_quality gristmill/datatrove (per core):")
    assert figure(out, "ratio pii gristmill/datatrove (per core):") > 0  # PIIFormatter needs no extra
    assert figure(out, "pii worst case on 100,000 characters:") > 0
    # --config: the curate stage of run configs (the steps before dedup), the first one the base
    one, two = tmp / "one.yaml", tmp / "two.yaml"
    steps = f"steps: [{{langid: {{model: {lid}}}}}, c4_lines, exact_dedup, gopher_quality]\n"
    one.write_text("input: {paths: [unused]}\n" + steps)
    two.write_text("input: {paths: [unused]}\n" + steps.replace("c4_lines", "{c4_lines: {min_paragraph_words: 80}}"))
    out = smoke("filter_throughput", "--config", one.name, two.name, tmp=tmp, data=data)
    assert figure(out, str(one)) == figure(out, str(two)) == 43  # documents read
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(str(tmp))}
    assert int(rows[str(one)][2]) >= int(rows[str(two)][2])  # kept: the paragraph rule only drops
    assert float(rows[str(one)][-1].rstrip("x")) == 1.0 and float(rows[str(two)][-1].rstrip("x")) > 0


def check_quality_throughput(request, tmp, data):
    for model in ("kenlm_model", "quality_model"):  # skips (fails in CI) without `make models`
        request.getfixturevalue(model)
    out = smoke("quality_throughput", tmp=tmp, data=data)
    assert figure(out, "gristmill kenlm") > 0 and figure(out, "gristmill quality") > 0
    peer_ratio(out, "ratio gristmill/datatrove (perplexity, MB/s per core):")
    peer_ratio(out, "ratio gristmill/datatrove (quality, MB/s per core):")


def check_classifier_throughput(request, tmp, data):
    request.getfixturevalue("minilm_model")  # the packaged encoder under a seeded head, both sides
    out = smoke("classifier_throughput", tmp=tmp, data=data)
    assert figure(out, "ratio ours/plain loop:") > 0
    # same model, same documents, fp32 on CPU: the same scores, so the same classes
    assert figure(out, "same class") == 100.0


def check_decontaminate_throughput(request, tmp, data):
    request.getfixturevalue("lid_model")
    out = smoke("decontaminate_throughput", tmp=tmp, data=data)
    assert figure(out, "gristmill decontaminate: documents") == 43  # the smaller sample file's records
    assert figure(out, "bytes per million n-grams:") > 0
    peer_ratio(out, "ratio gristmill/datatrove (documents per CPU second):")


def check_url_filter_throughput(request, tmp, data):
    out = smoke("url_filter_throughput", tmp=tmp, data=data)
    assert figure(out, "input:") == 2000  # URLs: the sample's 609 and generated ones
    assert "decisions differ" not in out  # the script exits 1 then too
    peer_ratio(out, "ratio gristmill/datatrove (URLs/s per core):")


def check_recipe_compare(request, tmp, data):
    request.getfixturevalue("lid_model")
    # the run tests/recipes/test_recipe_compare.py also reads: made once for both
    _, out = recipe_compare_smoke(request.getfixturevalue("tmp_path_factory"), data, "fineweb")
    if not peers_installed():  # datatrove's side: spaCy, warcio, libmagic, tldextract
        return
    assert figure(out, "recipe fineweb:") == 43  # documents read: the smaller sample file
    assert figure(out, "same outcome (kept, or dropped):") > 0
    assert "unexplained" not in out  # every disagreement has a cause (tests/recipes pins them)


def check_recipe_end_to_end(request, tmp, data):
    request.getfixturevalue("lid_model")
    out = smoke("recipe_end_to_end", tmp=tmp, data=data)
    assert figure(out, "gristmill configs/fineweb.yaml:") > 0  # CPU seconds
    peer_ratio(out, "ratio datatrove/gristmill (CPU-s per GB, end to end):")


def check_make_dedup_corpus(request, tmp, data):
    corpus, out = request.getfixturevalue("dedup_corpus")
    assert figure(out, "wrote") == 300
    assert figure(out, "documents (") == 18  # 6% exact duplicates planted
    assert (corpus / "truth.parquet").is_file() and (corpus / "docs" / "00000.parquet").is_file()


def check_dedup_eval(request, tmp, data):
    corpus, _ = request.getfixturevalue("dedup_corpus")
    out = smoke("dedup_eval", "--corpus", corpus, tmp=tmp, data=data)
    lines = {x.split(":")[0]: x for x in out.splitlines()}
    # the bounds: removing every planted duplicate finds every pair, removing nothing finds none
    assert figure(lines["every planted duplicate removed"], "recall(J>=0.85)") == 1.0
    assert figure(lines["nothing removed"], "recall(J>=0.85)") == 0.0


def check_dedup_throughput(request, tmp, data):
    corpus, _ = request.getfixturevalue("dedup_corpus")
    out = smoke("dedup_throughput", "--corpus", corpus, tmp=tmp, data=data)
    # near dedup finds the planted pairs above its threshold (0.999 on the 10,000-document corpus)
    assert figure(out, "recall(J>=0.85)") >= 0.9  # the first method's line is near_dedup's
    assert figure(out, "near_dedup vs datasketch MinHashLSH:") > 0  # datasketch: a core dependency
    peer_ratio(out, "near_dedup vs datatrove minhash (4 stages):")
    bloom = re.search(r"([\d,]+) items/s/core hash\+test\+set", out)
    assert bloom and int(bloom.group(1).replace(",", "")) > 0, out[-4000:]


def check_cluster_throughput(request, tmp, data):
    out = smoke("cluster_throughput", tmp=tmp, data=data)
    # every task count removes what the one-task union removes (the script exits 1 otherwise)
    assert out.count("(same as one task: True)") == 4, out[-4000:]
    assert figure(out, "components:  4 tasks:") > 0 and figure(out, "rounds") >= 2
    assert figure(out, "CPU s datatrove / gristmill:") > 0  # datatrove: a core dependency, its side always runs
    # --calibrate: the real rounds on both densities and both rules, each fitted to per-node and
    # per-edge costs that `pipeline plan` reads (not written with --smoke)
    cal = tmp / "cal.json"
    out = smoke("cluster_throughput", "--calibrate", "--json", cal, tmp=tmp, data=data)
    got = json.loads(cal.read_text())["removal"]
    assert set(got) == {"kept_neighbour", "components"}
    for rule in got.values():
        assert [g["extra"] for g in rule["graphs"]] == [0.2, 1.5] and len(rule["pairs"]) == 2
        assert all(g["final_round"] >= 2 and g["rounds"][-1]["sent"] == 0 for g in rule["graphs"])
        assert rule["graphs"][1]["edges"] > 1.5 * rule["graphs"][0]["edges"]  # the denser graph
    assert "us a node +" in out
    # --edges: a finished run's own verified edges (near_dedup on the planted corpus, 2 tasks)
    from gristmill.pipeline.planning.on_parquet import run_on_parquet

    corpus, _ = request.getfixturevalue("dedup_corpus")
    run_on_parquet("near_dedup", {"threshold": 0.8}, corpus / "docs", tmp / "near", 2)
    out = smoke("cluster_throughput", "--edges", tmp / "near", tmp=tmp, data=data)
    assert figure(out, f"edges of {tmp / 'near'}:") > 0 and out.count("(same as one task: True)") == 4, out[-4000:]


def check_single_task_stages(request, tmp, data):
    out = smoke("single_task_stages", "--json", tmp / "s.json", tmp=tmp, data=data)
    got = json.loads((tmp / "s.json").read_text())
    assert got["shard_lengths"]["per_file_s"] >= 0 and got["shard_lengths"]["per_document_s"] >= 0
    assert got["shard_plan"]["shards"] >= 1 and got["manifest"]["shards"] == 20
    assert got["tokenizer_merge"]["read_bytes"] >= got["tokenizer_merge"]["budget_bytes"]  # the sample filled
    assert "CPU s" in out


def check_make_large_records(request, tmp, data):
    out = smoke("make_large_records", tmp / "large.warc.wet.gz", tmp=tmp, data=data)
    assert figure(out, "large.warc.wet.gz:") == 3  # records, each of exactly 200,000 bytes of text
    assert "200,000-200,000 bytes" in out
    out = smoke("make_large_records", tmp / "large.warc.gz", "--warc", tmp=tmp, data=data)
    assert figure(out, "large.warc.gz:") == 3  # HTML pages, each response's payload at most 200,000 bytes


def check_large_record_steps(request, tmp, data):
    for model in ("lid_model", "kenlm_model", "quality_model"):
        request.getfixturevalue(model)
    out = smoke("large_record_steps", tmp=tmp, data=data)
    assert figure(out, "steps measured:") == 21  # every step on one 0.3 MB page, in one process
    assert "| gopher_repetition |" in out and "| encode |" in out
    assert "| read_warc_trafilatura |" in out and "| decontaminate |" in out and "| url_filter |" in out


def check_large_records_run(request, tmp, data):
    for model in ("lid_model", "kenlm_model", "quality_model"):
        request.getfixturevalue(model)
    out = smoke("large_records_run", "--work", tmp / "large", tmp=tmp, data=data)
    assert "| 27_manifest |" in out  # the records went through both dedups and tokenization
    assert figure(out, "open: 27 stages, largest task peak") > 0


def check_make_wet_corpus(request, tmp, data):
    work, out = request.getfixturevalue("wet_corpus")
    corpus = work / f"wet-{SMOKE_GB:g}"
    assert figure(out, "wrote") >= 2  # files: 2 MB in 0.5 MB files
    truth = [json.loads(x) for x in (corpus / "truth.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in truth} == {"exact", "near"}
    assert len(list(corpus.glob("*.warc.wet.gz"))) == figure(out, "wrote")


def check_scale_run(request, tmp, data):
    work, out = request.getfixturevalue("scale_run")
    assert "| 27_manifest |" in out  # the permissive config's stages, through the token shards
    assert figure(out, "near dedup (pairs J >= 0.85): recall") >= 0.9
    assert figure(out, "exact dedup: recall") >= 0.9
    assert set(json.loads((work / "results.json").read_text())["runs"]) == {"permissive"}


def check_near_removal_rules(request, tmp, data):
    work, _ = request.getfixturevalue("scale_run")
    run = work / f"run-permissive-{SMOKE_GB:g}-t1"
    out = smoke("near_removal_rules", run, "--truth", work / f"wet-{SMOKE_GB:g}" / "truth.jsonl", tmp=tmp, data=data)
    for rule in ("components", "kept_neighbour"):
        line = next(x for x in out.splitlines() if x.startswith(f"{rule}:"))
        assert figure(line, "documents in some pair,") > 0  # removed
        assert figure(line, "recall") >= 0.9


def check_ray_vs_local(request, tmp, data):
    for model in ("lid_model", "kenlm_model", "quality_model"):  # the demo's steps
        request.getfixturevalue(model)
    work, _ = request.getfixturevalue("wet_corpus")  # the scale run's corpus, as a full run reuses it
    out = smoke("ray_vs_local", "--work", work, tmp=tmp, data=data)
    if importlib.util.find_spec("ray") is None:  # the ray extra: `make test` installs it
        if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
            pytest.fail("ray is not installed: pip install -e '.[ray]'")
        assert "ray side skipped" in out, out[-4000:]
        return
    assert "outputs identical: yes" in out  # the same final documents both ways
    assert figure(out, "ratio ray/local: wall") > 0


def check_calibration_vs_fineweb2(request, tmp, data):
    out = smoke("calibration_vs_fineweb2", tmp=tmp, data=data)
    # the shipped table against FineWeb-2's: a correlation per key, the letter share's on its own line
    assert -1 <= figure(out, "letter-share bound (max_non_alpha_words_ratio), all: r") <= 1
    assert "| max_non_alpha_words_ratio |" in out and "Languages that differ most" in out


def check_word_segmenters(request, tmp, data):
    request.getfixturevalue("lid_model")
    out = smoke("word_segmenters", tmp=tmp, data=data)
    # icu4py (a core dependency) against the regex: its speed as a multiple of the regex's, per text
    ratios = [float(x) for x in re.findall(r"^\| icu4py\s+\| [\d,]+\s+\| ([\d.]+)", out, re.M)]
    assert ratios and all(r > 0 for r in ratios), out[-4000:]
    assert "## Dispatch on" in out


def check_warc_extract_throughput(request, tmp, data):
    out = smoke("warc_extract_throughput", tmp=tmp, data=data)
    assert figure(out, "generated") == 60 and figure(out, "sample:") == 16  # pages; HTML responses
    for title in ("Common Crawl sample (16 pages)", "generated pages (60)"):
        assert figure(out, f"{title}: ratio resiliparse/trafilatura (pages/s per core, reader):") > 0
    # pages of markup: a row per extractor and shape, each with its memory per tag
    rows = [line for line in out.splitlines() if line.startswith("| ") and "| 200 |" in line]
    assert len(rows) == 12 and all(float(r.split("|")[6].replace(",", "")) >= 0 for r in rows), rows


def check_kernels(request, tmp, data):
    out = smoke("kernels", tmp=tmp, data=data)
    for op in ("rms_norm+residual", "swiglu", "rope(qkv)", "linear+cross_entropy"):
        line = next(x for x in out.splitlines() if f" {op} " in x)
        assert figure(line, "×") > 0  # eager reference / ours


def check_profile_step(request, tmp, data):
    out = smoke("profile_step", tmp=tmp, data=data)
    assert "== ours:" in out and "== reference:" in out
    assert figure(out, "ratio ours/reference (tokens/s):") > 0


def check_stream_vs_local(request, tmp, data):
    request.getfixturevalue("lid_model")  # the corpus generator groups pages by language
    pytest.importorskip("moto.server", reason="moto (the test extra) is not installed")
    out = smoke("stream_vs_local", "--work", tmp / "stream", tmp=tmp, data=data)
    # the streamed run (from moto's S3 server in its own process) read the local run's documents
    assert figure(out, "reader: documents identical on both sides:") > 400
    assert figure(out, "reader: ratio stream/local CPU per GB:") > 0
    assert figure(out, "reader: peak RSS of a task: local") > 0


def check_train_throughput(request, tmp, data):
    out = smoke("train_throughput", tmp=tmp, data=data)
    assert figure(out, "tiny  ratio ours/reference:") > 0


def check_eval_throughput(request, tmp, data):
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness (the test extra) is not installed")
    out = smoke("eval_throughput", tmp=tmp, data=data)
    assert figure(out, "ratio ours/lm-eval (items/s):") > 0
    # the same tiny model and items on both sides: the same prediction for every item
    assert figure(out, "items whose prediction differs:") == 0
    assert len(re.findall(r"^\| \w+ \| 8 \| .*\| 8/8 \(100\.0%\) \|", out, re.M)) == 4, out[-3000:]


def check_train_memory(request, tmp, data):
    out = smoke("train_memory", tmp=tmp, data=data)
    # the plan's predicted peak for each (ac, micro-batch) of the tiny preset (no allocator on CPU)
    rows = re.findall(r"^\| tiny \| (none|selective|full) \| \d+ \| ([\d.]+) \|", out, re.M)
    assert len(rows) >= 6 and all(float(gib) > 0 for _, gib in rows), out[-2000:]


def check_resume_world_size(request, tmp, data):
    out = smoke("resume_world_size", tmp=tmp, data=data)
    # on CPU a resumed run is bitwise the uninterrupted one (2 processes → 1)
    assert figure(out, "resume 2 → 1 processes: max relative loss difference") <= 1e-6


def check_task_start(request, tmp, data):
    request.getfixturevalue("lid_model")
    out = smoke("task_start", tmp=tmp, data=data)
    assert figure(out, "ratio exec/fork: CPU") > 0
    assert "outputs identical in every pair: yes" in out
    assert "zygote not used" not in out  # the forked side forked


CHECKS = {name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")}
SLOW = {
    "dedup_throughput",
    "scale_run",
    "near_removal_rules",
    "resume_world_size",
    "url_filter_throughput",
    "large_records_run",
    "recipe_compare",
    "recipe_end_to_end",
    "ray_vs_local",
}
# xdist groups beside the module's own: ray_vs_local starts a Ray cluster, never while
# tests/pipeline/test_ray.py has its own up (2 CPUs each, on a 2-core machine)
GROUPS = {"ray_vs_local": "ray"}


def _marks(script: str) -> list:
    marks = [pytest.mark.slow] if script in SLOW else []
    return marks + ([pytest.mark.xdist_group(GROUPS[script])] if script in GROUPS else [])


def test_every_script_has_a_check():
    scripts = {p.stem for p in BENCH.glob("*.py")}
    assert scripts == set(CHECKS), f"benchmarks without a smoke check: {sorted(scripts - set(CHECKS))}"


@pytest.mark.parametrize("script", [pytest.param(s, marks=_marks(s)) for s in sorted(CHECKS)])
def test_smoke(script, request, tmp_path, shared_data):
    CHECKS[script](request, tmp_path, shared_data)
