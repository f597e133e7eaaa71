"""The blocked Bloom filter: measured false-positive rate, batch semantics, save and reload."""

from __future__ import annotations

import numpy as np
import pytest

from gristmill.dedup.bloom import BloomFilter, hash128, size_for


def _hashes(prefix: str, n: int) -> np.ndarray:
    return hash128([f"{prefix}-{i}".encode() for i in range(n)])


@pytest.mark.parametrize("fp_rate", [1e-2, 1e-3])
def test_false_positive_rate_at_capacity_is_within_1_5x_of_target(tmp_path, fp_rate):
    cap = 200_000
    bf = BloomFilter.create(tmp_path / "f.bloom", cap, fp_rate)
    assert not bf.test_and_set(_hashes("in", cap)).all()
    probes = 1_000_000 if fp_rate < 1e-2 else 300_000
    measured = bf.contains(_hashes("out", probes)).mean()
    assert fp_rate / 1.5 < measured < fp_rate * 1.5, measured
    # the fill-based estimate agrees with the measurement
    assert abs(bf.estimated_fp_rate() - measured) < 0.25 * fp_rate + 3 / probes ** 0.5 * fp_rate ** 0.5


def test_sizing_exceeds_textbook_bits_for_blocked_layout():
    n_blocks, k = size_for(10**6, 1e-3)
    textbook = -10**6 * np.log(1e-3) / np.log(2) ** 2
    assert n_blocks * 512 > textbook and k % 8 == 0


def test_batch_answers_equal_one_by_one_insertion(tmp_path):
    h = _hashes("x", 3000)
    h = np.concatenate([h, h[::7], h[:5]])  # repeats, inside one batch too
    batch = BloomFilter.create(tmp_path / "a.bloom", 100, 0.3)  # tiny: many same-block items
    single = BloomFilter.create(tmp_path / "b.bloom", 100, 0.3)
    got = batch.test_and_set(h)
    want = np.array([single.test_and_set(h[i : i + 1])[0] for i in range(len(h))])
    assert np.array_equal(got, want)
    assert got[3000:].all()  # every repeat is reported present


def test_saved_filter_reopens_and_slices_combine(tmp_path):
    items = _hashes("saved", 50_000)
    whole = BloomFilter.create(tmp_path / "whole.bloom", 100_000, 1e-3)
    whole.test_and_set(items)
    whole.save()
    again = BloomFilter.open(tmp_path / "whole.bloom")
    assert again.contains(items).all()
    assert again.contains(_hashes("other", 20_000)).mean() < 1e-3
    # the same filter as two slices of blocks: each item goes to the slice holding its block
    nb, k = whole.meta.n_blocks, whole.meta.k
    halves = [BloomFilter.create(tmp_path / f"s{i}.bloom", 100_000, 1e-3, r, nb, k)
              for i, r in enumerate([(0, nb // 2), (nb // 2, nb)])]
    blocks = whole.blocks_of(items)
    for bf, sel in zip(halves, [blocks < nb // 2, blocks >= nb // 2]):
        bf.test_and_set(items[sel])
    assert np.array_equal(np.concatenate([halves[0].bits, halves[1].bits]), np.asarray(whole.bits))
