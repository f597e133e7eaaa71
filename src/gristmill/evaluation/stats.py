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


# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom 1..30; beyond, the normal's
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t at `df` (linear between integer df; 1.96 past 30)."""
    if df >= 30:
        return 1.96 if df > 120 else 2.042 + (1.98 - 2.042) * (df - 30) / 90
    df = max(df, 1.0)
    lo = int(df)
    frac = df - lo
    return _T975[lo - 1] + frac * (_T975[min(lo, 29)] - _T975[lo - 1])


@dataclass
class VariantComparison:
    diff: float  # mean score of `a` − of `b` (each side's seeds averaged)
    ci: tuple[float, float]  # 95%
    se_items: float  # the benchmark's share: paired bootstrap over items
    se_seeds: float | None  # training's share: the seeds' spread (pooled); None with one seed on a side
    df: float | None
    verdict: str


def compare_variants(a, b, *, n: int = 2000, seed: int = 0) -> VariantComparison:
    """Variant `a` against `b`, per-item scores of shape (seeds, items) each, the same items.

    Two sources of noise: the benchmark's items (the items are a sample of the task) and
    training's seeds (another initialisation and data order gives another model). The item part
    is the paired bootstrap's standard error of the difference of the seed-averaged item scores;
    the seed part Student's two-sample standard error of the difference of the per-seed means
    (the seeds' variance pooled over both sides: the same recipe and budget, the same training
    noise). The 95% interval is diff ± t·√(se_items² + se_seeds²), t Student's at na + nb − 2
    degrees of freedom (few seeds give a wide interval: two seeds a side, t = 4.3); with one seed on either
    side training's noise is not measured, the interval is the items' alone (normal), and the
    verdict says so. "better"/"worse" when the interval excludes 0."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"paired comparison of {a.shape[1]} and {b.shape[1]} items: not the same items")
    per_item = a.mean(axis=0) - b.mean(axis=0)
    diff = float(per_item.mean())
    rng = np.random.default_rng(seed)
    boots = per_item[rng.integers(0, per_item.size, size=(n, per_item.size))].mean(axis=1)
    se_items = float(boots.std(ddof=1))
    se_seeds = df = None
    na, nb = a.shape[0], b.shape[0]
    if na >= 2 and nb >= 2:
        # pooled: both sides' seeds are draws of the same training noise (same recipe, same budget)
        ma, mb = a.mean(axis=1), b.mean(axis=1)
        pooled = (((ma - ma.mean()) ** 2).sum() + ((mb - mb.mean()) ** 2).sum()) / (na + nb - 2)
        se_seeds = float(np.sqrt(pooled * (1 / na + 1 / nb)))
        df = float(na + nb - 2)
        half = t975(df) * float(np.sqrt(se_items**2 + se_seeds**2))
    else:
        half = 1.96 * se_items
    lo, hi = diff - half, diff + half
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "not distinguishable"
    if se_seeds is None:
        verdict += " (one seed on a side: training noise not measured)"
    return VariantComparison(diff, (lo, hi), se_items, se_seeds, df, verdict)
