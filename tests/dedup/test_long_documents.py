"""Pages of megabytes through dedup: shingled, hashed and trimmed a piece at a time, with exactly
the results of the whole text. The pieces are forced small here (`CHUNK_CHARS`), so that every
page of the corpus takes the long-document paths."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.dedup import exact, near
from gristmill.dedup import text as dedup_text
from gristmill.dedup.bloom import hash128
from gristmill.dedup.exact import DUP, ExactDedup, ExactDedupHash, ExactDedupPlan, _paragraphs
from gristmill.dedup.minhash import MinHasher
from gristmill.dedup.near import NearDedup, NearDedupPlan, NearDedupSignature
from gristmill.dedup.text import shingle_chunks, shingle_hashes, shingles, words
from gristmill.text import words as words_mod

PIECE = 150


@pytest.fixture(scope="module")
def corpus(dedup_corpus) -> list[Document]:
    t = pq.read_table(dedup_corpus / "docs").slice(0, 800).to_pydict()
    return [
        Document(text=t["text"][i], id=t["id"][i], metadata={k: t[k][i] for k in ("source", "offset") if k in t})
        for i in range(len(t["id"]))
    ]


def copies(docs):
    return [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs]


def test_shingles_of_pieces_are_the_shingles_of_the_text(corpus):
    texts = [(d.text, d.metadata.get("language")) for d in corpus] + [("two words", None), ("", None)]
    for text, lang in texts:
        whole = shingle_hashes([words(text, lang)], 5)[0]
        parts = list(shingle_chunks(text, 5, lang, size=PIECE))
        assert np.array_equal(np.concatenate(parts) if parts else np.empty(0, np.uint64), whole)


def test_long_documents_shingle_and_sign_as_whole_ones(corpus, tmp_path, monkeypatch):
    cfg = NearDedup.Config(threshold=0.8)
    bands, rows = cfg.band_rows()

    def bands_written(folder):
        phase = NearDedupSignature(NearDedupPlan(cfg, bands, rows, 1, 1))
        phase.stage_folder = folder
        list(phase.run(iter(copies(corpus)), 0, 1))
        return {f.relative_to(folder): np.load(f) for f in sorted(folder.glob("bands/*/*.npy"))}

    whole_sets = [shingles(d.text, 5, d.metadata.get("language")) for d in corpus]
    whole = bands_written(tmp_path / "whole")
    for module in (words_mod, dedup_text, near):
        monkeypatch.setattr(module, "CHUNK_CHARS", PIECE)
    assert sum(len(d.text) >= PIECE for d in corpus) > 700
    pieces = bands_written(tmp_path / "pieces")
    assert whole.keys() == pieces.keys() and len(whole) == bands
    assert all(np.array_equal(whole[k], pieces[k]) for k in whole)
    assert all(np.array_equal(a, shingles(d.text, 5, d.metadata.get("language"))) for a, d in zip(whole_sets, corpus))
    # a long page's signature, a piece of shingles at a time, is the whole page's
    hasher = MinHasher(cfg.num_perm, cfg.seed)
    text = "\n".join(d.text for d in corpus[:50])
    sig, count = near._long_signature(hasher, text, 5, None)
    x = shingle_hashes([words(text)], 5)[0]
    assert count == len(x) and np.array_equal(sig, hasher.signatures_flat(x, np.array([len(x)]))[0])


def test_long_documents_hash_and_trim_as_whole_ones(corpus, tmp_path, monkeypatch):
    cfg = ExactDedup.Config(granularity="paragraph", capacity=100_000, fp_rate=1e-3, min_doc_words=50)
    n_blocks, k = ExactDedup(cfg).sizing()

    def hashed(folder):
        phase = ExactDedupHash(ExactDedupPlan(cfg, n_blocks, k, slices=1, documents=None))
        phase.stage_folder = folder
        list(phase.run(iter(copies(corpus)), 0, 1))
        rec = np.concatenate([np.load(f) for f in sorted(folder.glob("hashes/*/*.npy"))])
        return np.sort(rec, order=["src", "offset", "para"])

    def trimmed(docs):
        """Every other paragraph of each document a duplicate: the filter's decisions and texts."""
        phase = exact.ExactDedupFilter(ExactDedupPlan(cfg, n_blocks, k, slices=1, documents=None))
        out = []
        for d in docs:
            items = _paragraphs(d.text, "paragraph")[::2]
            dups = np.zeros(len(items), dtype=DUP)
            dups["para"] = [p for p, _ in items]
            if items:
                h = hash128([t.encode("utf-8") for _, t in items])
                dups["hi"], dups["lo"] = h[:, 0], h[:, 1]
            phase._dups, phase._keys = dups, lambda _doc: 0
            out.append((phase.filter(d, cfg), d.text))
        return out

    whole_paragraphs = [_paragraphs(d.text, "paragraph") for d in corpus]
    whole, whole_trimmed = hashed(tmp_path / "whole"), trimmed(copies(corpus))
    for module in (words_mod, exact):
        monkeypatch.setattr(module, "CHUNK_CHARS", PIECE)
    monkeypatch.setattr(exact, "BATCH_BYTES", 2000)  # a long page's items flushed a few at a time
    assert [_paragraphs(d.text, "paragraph") for d in corpus] == whole_paragraphs
    assert np.array_equal(hashed(tmp_path / "pieces"), whole)
    assert trimmed(copies(corpus)) == whole_trimmed
    results = {r if isinstance(r, bool) else r[1] for r, _ in whole_trimmed}
    assert results == {True, "exact_duplicate_paragraphs"}  # both ways decided
