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
    assert abs(bf.estimated_fp_rate() - measured) < 0.25 * fp_rate + 3 / probes**0.5 * fp_rate**0.5


def test_sizing_exceeds_textbook_bits_for_blocked_layout():
    n_blocks, k = size_for(10**6, 1e-3)
    textbook = -(10**6) * np.log(1e-3) / np.log(2) ** 2
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
    halves = [
        BloomFilter.create(tmp_path / f"s{i}.bloom", 100_000, 1e-3, r, nb, k)
        for i, r in enumerate([(0, nb // 2), (nb // 2, nb)])
    ]
    blocks = whole.blocks_of(items)
    for bf, sel in zip(halves, [blocks < nb // 2, blocks >= nb // 2]):
        bf.test_and_set(items[sel])
    assert np.array_equal(np.concatenate([halves[0].bits, halves[1].bits]), np.asarray(whole.bits))


def test_filter_file_is_allocated_when_created(tmp_path):
    bf = BloomFilter.create(tmp_path / "f.bloom", 200_000, 1e-3)
    st = (tmp_path / "f.bloom").stat()
    assert st.st_size == bf.size_bytes > 256 << 10
    assert st.st_blocks * 512 >= st.st_size  # not sparse: writes through the map cannot fault
    assert not bf.bits.any()


FULL_DISK = r"""
import sys
import numpy as np
from gristmill.dedup.bloom import BloomFilter, hash128
try:
    bf = BloomFilter.create(sys.argv[1], 1_000_000, 1e-3)  # ~1.8 MB on a 1 MB filesystem
except OSError as e:
    print(e)
    sys.exit(3)
bf.test_and_set(hash128([str(i).encode() for i in range(1_000_000)]))
bf.save()
"""


def test_full_disk_is_a_clear_error_at_creation_not_a_sigbus(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import gristmill

    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(
            f"cannot mount a 1 MB tmpfs to fill ({mount.stderr.strip()}); "
            "test_filter_file_is_allocated_when_created covers the allocation"
        )
    try:
        env = dict(os.environ, PYTHONPATH=str(Path(gristmill.__file__).parents[1]))
        path = disk / "filter" / "slice_00000.bloom"
        path.parent.mkdir()
        out = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, env=env)
        # a sparse file would have been created, and the child killed by SIGBUS (-7) when the
        # first page beyond the filesystem's space was written through the map
        assert out.returncode == 3, (out.returncode, out.stderr[-2000:])
        line = out.stdout.strip()
        assert line.startswith(f"[Errno 28] {path}: cannot reserve ") and line.endswith("No space left on device")
        assert not path.exists()  # nothing half-made left behind
    finally:
        subprocess.run(["umount", str(disk)], check=True)
