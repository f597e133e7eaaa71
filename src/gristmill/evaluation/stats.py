"""Statistics over per-item scores: bootstrap intervals, centred accuracy, the CORE-style mean,
and the paired comparison of two models (or two sets of seeds) on the same items.

Intervals resample items (the source of noise a benchmark adds); a comparison across seeds
resamples items and seeds both, paired by item, so "not distinguishable" means the
difference's interval contains 0 with both the benchmark's and training's noise counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bootstrap_ci(values, *, n: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of `values` over `n` resamples of the items."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n, v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def centred(acc: float, chance: float) -> float:
    """(acc − chance) / (1 − chance): 0 at chance, 1 at perfect (DCLM's CORE)."""
    return (acc - chance) / (1 - chance) if chance < 1 else float("nan")


def core_mean(centred_by_task: dict[str, float]) -> float:
    vals = [v for v in centred_by_task.values() if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


@dataclass
class Comparison:
    diff: float  # mean score of `a` − mean score of `b`
    ci: tuple[float, float]
    p_better: float  # share of resamples in which a > b
    verdict: str  # "better" | "worse" | "not distinguishable"


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n: int = 2000, seed: int = 0, level: float = 0.95) -> Comparison:
    """`a`, `b`: per-item scores, shape (seeds, items) each (the same items in the same order;
    seed counts may differ). Each resample draws items (shared by both sides: the pairing) and,
    per side, seeds with replacement; the verdict is "better"/"worse" when the difference's
    interval excludes 0."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"paired comparison of {a.shape[1]} and {b.shape[1]} items: not the same items")
    rng = np.random.default_rng(seed)
    items = rng.integers(0, a.shape[1], size=(n, a.shape[1]))
    sa = rng.integers(0, a.shape[0], size=(n, a.shape[0]))
    sb = rng.integers(0, b.shape[0], size=(n, b.shape[0]))
    # mean over the drawn seeds of the mean over the drawn items, per resample
    ma = np.stack([a[sa[k]][:, items[k]].mean() for k in range(n)])
    mb = np.stack([b[sb[k]][:, items[k]].mean() for k in range(n)])
    d = ma - mb
    lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2])
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "not distinguishable"
    return Comparison(float(a.mean() - b.mean()), (float(lo), float(hi)), float((d > 0).mean()), verdict)
