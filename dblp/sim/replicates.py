"""Replicates of a sweep point: means and 95% confidence intervals over seeds.

Why: one seed per point says little when the effect is a handful of events
(burst rates 0.005 and 0.01 can both give exactly one burst in 300
iterations). With ``--seeds N`` every point is simulated with N seeds (the
baseline with the same N: common random numbers, so the bursts are the
same), and each table cell is a mean with the half-width of its Student-t
95% interval; ratios (speedups) are taken per seed, then averaged, so the
interval is that of the paired comparison.

No scipy needed: the t quantiles are tabulated to 30 degrees of freedom and
a Cornish-Fisher expansion beyond (error < 1e-4).
"""

from __future__ import annotations

import math
from typing import Sequence

# t_{0.975, df} for df = 1..30
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
_Z975 = 1.959963985


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (nan with one value).

    NaN values (a ratio over a zero) are left out; all of them: (nan, nan). An
    infinite value (a target accuracy some seed never reaches) makes the mean
    infinite, with no interval: leaving it out would report the seeds that
    did reach it as if all had.
    """
    v = [float(x) for x in values if not math.isnan(float(x))]
    infs = {x for x in v if math.isinf(x)}
    if infs:
        return (infs.pop() if len(infs) == 1 else math.nan), math.nan
    if not v:
        return math.nan, math.nan
    m = math.fsum(v) / len(v)
    if len(v) < 2:
        return m, math.nan
    var = math.fsum((x - m) ** 2 for x in v) / (len(v) - 1)
    return m, t975(len(v) - 1) * math.sqrt(var / len(v))
