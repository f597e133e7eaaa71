"""benchmarks/make_wet_corpus.py: a small generated corpus read back and checked against its truth."""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import re
import sys
import zlib

import numpy as np
import pytest

from gristmill.dedup.text import jaccard, shingles
from gristmill.filters.fasttext_native import load_classifier
from gristmill.input.wet import WetRecord, iter_wet_records
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import make_wet_corpus as mwc  # noqa: E402

GB, FILE_MB, SEED = 0.003, 1, 11
UUID = re.compile(r"<urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}>")
CONVERSION_FIELDS = [
    "WARC-Type",
    "WARC-Target-URI",
    "WARC-Date",
    "WARC-Record-ID",
    "WARC-Refers-To",
    "WARC-Block-Digest",
    "WARC-Identified-Content-Language",
    "Content-Type",
    "Content-Length",
]


@pytest.fixture(scope="module")
def sample(shared_data, lid_model):
    return mwc.load_sample(shared_data, lid_model)


def _build(out, sample, seed=SEED):
    return mwc.build(out, GB, seed, FILE_MB, progress=False, sample=sample)


@pytest.fixture(scope="module")
def corpus(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("wet_corpus")
    info = _build(out, sample)
    files = sorted(out.glob("*.warc.wet.gz"))
    records = {}  # record id -> (file name, position in the corpus, WetRecord)
    for f in files:
        for ev in iter_wet_records(f):
            assert isinstance(ev, WetRecord), f"{f.name}: {ev}"
            assert ev.record_id not in records
            records[ev.record_id] = (f.name, len(records), ev)
    truth = [json.loads(l) for l in (out / "truth.jsonl").read_text().splitlines()]
    return out, info, files, records, truth


def _members(path):
    data, out = path.read_bytes(), []
    while data:
        d = zlib.decompressobj(31)
        out.append(d.decompress(data))
        assert d.eof, f"{path.name}: truncated gzip member"
        data = d.unused_data
    return out


def test_files_are_laid_out_like_common_crawl_wet(corpus):
    out, info, files, records, _ = corpus
    assert info["files"] == len(files) >= 3
    assert all(re.fullmatch(r"CC-MAIN-\d{14}-\d{14}-\d{5}\.warc\.wet\.gz", f.name) for f in files)
    n_conv = 0
    for f in files[:-1]:  # every full file is about --file-mb; the last holds the rest
        assert FILE_MB * 1e6 <= f.stat().st_size < FILE_MB * 1e6 + 200_000
    for f in files:
        members = _members(f)  # each record is its own gzip member
        assert members[0].startswith(b"WARC/1.0\r\nWARC-Type: warcinfo\r\n")
        assert re.search(rb"\r\nisPartOf: CC-MAIN-2024-\d\d\r\n", members[0])
        assert f"WARC-Filename: {f.name}\r\n".encode() in members[0]
        for m in members[1:]:
            head, sep, rest = m.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            assert lines[0] == "WARC/1.0" and sep
            fields = dict(l.split(": ", 1) for l in lines[1:])
            assert list(fields) == CONVERSION_FIELDS
            payload = rest[: int(fields["Content-Length"])]
            assert rest == payload + b"\r\n\r\n"  # Content-Length exact in bytes
            assert fields["WARC-Block-Digest"] == "sha1:" + base64.b32encode(hashlib.sha1(payload).digest()).decode()
            assert UUID.fullmatch(fields["WARC-Record-ID"]) and UUID.fullmatch(fields["WARC-Refers-To"])
            assert fields["Content-Type"] == "text/plain"
            n_conv += 1
    assert n_conv == info["records"] == len(records)
    urls = [r.url for _, _, r in records.values()]
    assert len(set(urls)) == len(urls) and all(u.startswith(("http://", "https://")) for u in urls)
    assert {r.crawl for _, _, r in records.values()} == {f"CC-MAIN-2024-{5 + SEED % 45:02d}"}


def test_pages_follow_the_sample_languages_and_lengths(corpus, sample, lid_model, wet_files):
    _, info, _, records, truth = corpus
    copies = {t["copy"] for t in truth}
    pages = [r for rid, (_, _, r) in records.items() if rid not in copies]
    assert len(pages) == info["originals"]
    sample_langs = collections.Counter(l for l, _ in sample.pages)
    made = collections.Counter(p.cc_language for p in pages)
    iso3 = {mwc.ISO3[l]: l for l in sample_langs}
    assert set(made) <= set(iso3)
    share = {iso3[k]: v / len(pages) for k, v in made.items()}
    assert abs(share["en"] - sample_langs["en"] / len(sample.pages)) < 0.06
    assert len(made) >= 6  # the minor languages come through too
    # the text is in the language it is labelled with (fastText agrees, as it did on the sample)
    labels, _ = load_classifier(lid_model).predict_top([p.text for p in pages])
    agree = sum(l == "__label__" + iso3[p.cc_language] for l, p in zip(labels, pages))
    assert agree / len(pages) > 0.9
    # page lengths, so records per GB, as in the sample
    made_len = np.array([len(p.text.encode()) for p in pages])
    real_len = np.array([n for _, n in sample.pages])
    assert abs(made_len.mean() / real_len.mean() - 1) < 0.25
    assert abs(np.median(made_len) / np.median(real_len) - 1) < 0.25
    # mutated, not copied: no generated page is a sample page
    real = {r.text for f in wet_files for r in iter_wet_records(f) if isinstance(r, WetRecord)}
    assert len(real) > 500 and not any(p.text in real for p in pages)


def test_planted_pairs_match_the_truth_file(corpus):
    out, info, files, records, truth = corpus
    kinds = collections.Counter(t["kind"] for t in truth)
    assert kinds["exact"] == info["exact"] and kinds["near"] == info["near"]
    n = len(records)
    assert 0.015 * n < kinds["exact"] < 0.05 * n  # --exact-rate 0.03
    assert 0.03 * n < kinds["near"] < 0.07 * n  # --near-rate 0.05
    assert len({t["copy"] for t in truth}) == len(truth)
    order = [f.name for f in files]
    for t in truth:
        ofile, opos, orig = records[t["original"]]
        cfile, cpos, copy = records[t["copy"]]
        assert (ofile, cfile) == (t["original_file"], t["copy_file"])
        assert opos < cpos and order.index(ofile) <= order.index(cfile)
        assert copy.url != orig.url
        if t["kind"] == "exact":
            assert copy.text == orig.text and t["jaccard"] == 1.0
        else:
            j = jaccard(shingles(orig.text), shingles(copy.text))
            assert j == pytest.approx(t["jaccard"], abs=1e-12)
            assert 0.85 <= j <= 0.95 and copy.text != orig.text
    cross = sum(t["original_file"] != t["copy_file"] for t in truth)
    assert 0 < cross < len(truth) and cross == info["cross_file"]  # a file boundary splits some pairs


def test_no_duplicates_besides_the_planted_ones(corpus):
    """Exact: texts repeat only in planted pairs. Near: every pair of pages with shingle Jaccard
    >= 0.6 (candidates: pages sharing one of their 16 smallest shingle hashes) is planted: chance
    overlaps stay well below near dedup's default threshold of 0.8."""
    _, _, _, records, truth = corpus
    planted = {frozenset((t["original"], t["copy"])) for t in truth}
    by_text = collections.defaultdict(list)
    for rid, (_, _, r) in records.items():
        by_text[r.text].append(rid)
    repeats = [frozenset(ids) for ids in by_text.values() if len(ids) > 1]
    assert repeats and all(len(ids) == 2 and ids in planted for ids in repeats)
    ids = list(records)
    sets = [shingles(records[i][2].text) for i in ids]
    holders = collections.defaultdict(list)
    for k, s in enumerate(sets):
        if len(s) >= 50:  # pages of a line or two match by chance and near dedup skips nothing there
            for h in s[:16].tolist():
                holders[h].append(k)
    cand = {(a, b) for ks in holders.values() for i, a in enumerate(ks) for b in ks[i + 1 :]}
    similar = {frozenset((ids[a], ids[b])) for a, b in cand if jaccard(sets[a], sets[b]) >= 0.6}
    assert similar <= planted
    # the check can fail: it finds the planted pairs of pages long enough to be indexed
    where = {rid: k for k, rid in enumerate(ids)}
    indexed = [p for p in planted if all(len(sets[where[i]]) >= 50 for i in p)]
    assert len(indexed) > 20 and len(similar) >= 0.95 * len(indexed)


def test_same_seed_same_bytes_other_seed_other_corpus(corpus, sample, tmp_path):
    out = corpus[0]
    again = _build(tmp_path / "again", sample)
    names = sorted(p.name for p in out.iterdir())
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == names
    for name in names:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    other = _build(tmp_path / "other", sample, seed=SEED + 1)
    assert other["records"] != again["records"] or other["bytes"] != again["bytes"]
    first = sorted((tmp_path / "other").glob("*.gz"))[0]
    assert first.name not in names  # another crawl segment
    assert not set(_members(first)[1:3]) & set(_members(out / names[0])[1:3])


def test_refuses_a_folder_with_files_in_it(corpus, sample):
    """A second run into the first one's folder would leave its extra files beside the new truth."""
    out = corpus[0]
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(SystemExit, match="not empty"):
        mwc.build(out, GB / 3, SEED + 5, FILE_MB, progress=False, sample=sample)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
