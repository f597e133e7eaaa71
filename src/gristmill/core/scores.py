"""Score histograms and a deterministic sample of documents, kept per filter step during a run.

Memory is bounded whatever the crawl size: fixed-bin histograms (kept and dropped documents
separately) of the step's score, a document-length histogram before and after the step, and for
each drop reason (and for kept documents) the `SAMPLE_SIZE` documents with the smallest hash of
their id: a uniform sample that a re-run, or a different task split, chooses identically.
Each task writes `<stage>/scores/<step>/<rank>.json` when it finishes; `pipeline.stats`
merges them per stage into `<stage>/scores.json`.

The same record counts documents and bytes in and out and drops by reason per language (the
`language` metadata langid writes; "unknown" where no step labelled the document), so a
multilingual run's funnel can be read per language. Languages are a small closed set (lid.176
has 176 labels); past `MAX_LANGUAGES` distinct values, e.g. from a hostile `language` column of
input Parquet, the rest are counted under "other", so memory stays bounded.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path

import xxhash

from gristmill.core.files import write_text_atomic

SAMPLE_SIZE = 50
SAMPLE_CHARS = 300
#: document length in characters: log10 bins from 1 to 10**7 characters
LENGTH_BINS = {"scale": "log", "lo": 0.0, "hi": 7.0, "n": 28}
LINEAR_01 = {"scale": "linear", "lo": 0.0, "hi": 1.0, "n": 20}
#: the label of documents no step gave a language, and of languages past MAX_LANGUAGES
UNKNOWN_LANGUAGE, OTHER_LANGUAGES = "unknown", "other"
MAX_LANGUAGES = 1024


def bin_edges(bins: dict) -> list[float]:
    """Edges of the bins, in the score's own units (10**x for log bins)."""
    lo, hi, n = bins["lo"], bins["hi"], bins["n"]
    edges = [lo + (hi - lo) * i / n for i in range(n + 1)]
    return [10**e for e in edges] if bins["scale"] == "log" else edges


def binner(bins: dict):
    """The function giving a value's bin: n equal bins from lo to hi, of log10(value) for log
    bins, the first and last taking what falls outside. The bins' numbers are read once (it runs a
    few times per document per step)."""
    lo, n, log10 = bins["lo"], bins["n"], math.log10
    span, last = bins["hi"] - lo, n - 1
    if bins["scale"] == "log":

        def index(value: float) -> int:
            i = int(((log10(value) if value > 0 else lo) - lo) / span * n)
            return 0 if i < 0 else last if i > last else i

    else:

        def index(value: float) -> int:
            i = int((value - lo) / span * n)
            return 0 if i < 0 else last if i > last else i

    return index


class ScoreRecorder:
    def __init__(self, step: str, score_field: str | None, bins: dict):
        self.step = step
        self.score_field = score_field or "length_chars"
        self.use_length = score_field is None
        self.bins = bins
        self._score_bin, self._length_bin = binner(bins), binner(LENGTH_BINS)
        n = bins["n"]
        self.hist = {"kept": [0] * n, "dropped": [0] * n}
        self.missing = {"kept": 0, "dropped": 0}
        self.length = {"before": [0] * LENGTH_BINS["n"], "after": [0] * LENGTH_BINS["n"]}
        # (reason or "" for kept) -> max-heap (as negated hashes) of the SAMPLE_SIZE smallest hashes
        self._heaps: dict[str, list] = {}
        self._n = 0
        #: language -> {"in", "kept", "bytes_in", "bytes_out", "dropped": {reason: n}}
        self.languages: dict[str, dict] = {}

    def add(self, doc, length_before: int, keep: bool, reason: str | None, bytes_in: int, bytes_out: int) -> None:
        """One document the step saw; `bytes_in`/`bytes_out` are its UTF-8 size before and
        after the step (`bytes_out` 0 when dropped)."""
        self._count_language(doc, keep, reason, bytes_in, bytes_out)
        self.length["before"][self._length_bin(length_before)] += 1
        if keep:
            self.length["after"][self._length_bin(len(doc.text))] += 1
        side = "kept" if keep else "dropped"
        score = length_before if self.use_length else doc.metadata.get(self.score_field)
        if score is None:
            self.missing[side] += 1
        else:
            self.hist[side][self._score_bin(score)] += 1
        key = "" if keep else (reason or "unspecified")
        h = xxhash.xxh3_64_intdigest(doc.id or doc.text)
        heap = self._heaps.setdefault(key, [])
        if len(heap) < SAMPLE_SIZE:  # (-hash, -arrival): equal hashes (duplicate ids) keep the first
            heapq.heappush(heap, (-h, -self._n, self._sample(doc, h, score, keep, key)))
        elif -heap[0][0] > h:
            heapq.heapreplace(heap, (-h, -self._n, self._sample(doc, h, score, keep, key)))
        self._n += 1

    def _count_language(self, doc, keep: bool, reason: str | None, bytes_in: int, bytes_out: int) -> None:
        lang = doc.metadata.get("language") or UNKNOWN_LANGUAGE
        rec = self.languages.get(lang)
        if rec is None:
            if len(self.languages) >= MAX_LANGUAGES:
                lang = OTHER_LANGUAGES
                rec = self.languages.get(lang)
            if rec is None:
                rec = self.languages[lang] = {"in": 0, "kept": 0, "bytes_in": 0, "bytes_out": 0, "dropped": {}}
        rec["in"] += 1
        rec["bytes_in"] += bytes_in
        if keep:
            rec["kept"] += 1
            rec["bytes_out"] += bytes_out
        else:
            key = reason or "unspecified"
            rec["dropped"][key] = rec["dropped"].get(key, 0) + 1

    @staticmethod
    def _sample(doc, h: int, score, keep: bool, reason: str) -> dict:
        return {
            "hash": h,
            "score": None if score is None else float(score),
            "id": doc.id,
            "url": doc.metadata.get("url"),
            "kept": keep,
            "reason": reason or None,
            "text": doc.text[:SAMPLE_CHARS],
        }

    def as_dict(self) -> dict:
        samples = sorted(
            (s for heap in self._heaps.values() for *_, s in heap), key=lambda s: (s["reason"] or "", s["hash"])
        )
        return {
            "step": self.step,
            "score_field": self.score_field,
            "bins": self.bins,
            "hist": self.hist,
            "missing": self.missing,
            "length_bins": LENGTH_BINS,
            "length": self.length,
            "samples": samples,
            "languages": dict(sorted(self.languages.items())),
        }

    def write(self, folder: Path, rank: int) -> None:
        write_text_atomic(folder / f"{rank:05d}.json", json.dumps(self.as_dict()))


def merge(parts: list[dict]) -> dict:
    """Merge per-task score records of one step (histograms summed, samples re-chosen by hash)."""
    out = json.loads(json.dumps(parts[0]))
    for p in parts[1:]:
        for side in out["hist"]:
            out["hist"][side] = [a + b for a, b in zip(out["hist"][side], p["hist"][side])]
            out["missing"][side] += p["missing"][side]
        for side in out["length"]:
            out["length"][side] = [a + b for a, b in zip(out["length"][side], p["length"][side])]
    out["languages"] = merge_languages([p.get("languages") for p in parts])
    groups: dict[str, list] = {}
    for p in parts:
        for s in p["samples"]:
            groups.setdefault(s["reason"] or "", []).append(s)
    out["samples"] = [
        s for key in sorted(groups) for s in heapq.nsmallest(SAMPLE_SIZE, groups[key], key=lambda s: s["hash"])
    ]
    return out


def merge_languages(parts: list[dict | None]) -> dict[str, dict] | None:
    """Sum per-language counts of one step over tasks; None if a task recorded none (a score
    file written before languages were counted), since a partial sum would be wrong."""
    if not parts or any(p is None for p in parts):
        return None
    out: dict[str, dict] = {}
    for part in parts:
        for lang, rec in part.items():
            acc = out.setdefault(lang, {"in": 0, "kept": 0, "bytes_in": 0, "bytes_out": 0, "dropped": {}})
            for key in ("in", "kept", "bytes_in", "bytes_out"):
                acc[key] += rec[key]
            for reason, n in rec["dropped"].items():
                acc["dropped"][reason] = acc["dropped"].get(reason, 0) + n
    return {lang: {**rec, "dropped": dict(sorted(rec["dropped"].items()))} for lang, rec in sorted(out.items())}
