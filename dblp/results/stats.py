"""Replicate statistics: means with Student-t 95% intervals, medians, paired differences.

Why one module: the simulator's sweeps (:mod:`dblp.sim.studies.sweep`) and the emulation's
``--seeds N`` replicates (:mod:`dblp.results.trainreport`, ``scenarios/microburst.py``) state
their spread the same way, so an interval means the same in every table.

* :func:`mean_ci95`: mean and the half-width of its 95% interval (Student t);
* :func:`spread`: median, mean, that interval and the range of one figure over seeds;
* :func:`median_range`: the median with the range, ``median [min-max]``, as a table cell;
* :func:`paired_ci95`: the mean of per-seed differences ``a_i - b_i`` and its interval.
  Replicates are interleaved (seed ``s`` of every policy runs back to back), so a
  difference is taken per seed and machine drift cancels; the difference is "larger
  than the spread" when its interval excludes 0.

No scipy needed: the t quantiles are tabulated to 30 degrees of freedom and a
Cornish-Fisher expansion beyond (error < 1e-4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["t975", "mean_ci95", "median", "median_range", "Spread", "spread", "paired_ci95"]

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


def median(values: Iterable[float | None], *, finite: bool = False, empty: Any = math.nan) -> Any:
    """The median of the values that are numbers, as a float: None and NaN are left out, and with
    ``finite`` the infinities too (without it an infinite one sorts last: "not reached" in most seeds
    gives an infinite median); ``empty`` (nan) when none is left."""
    v = sorted(f for f in (float(x) for x in values if x is not None)
               if not math.isnan(f) and (not finite or math.isfinite(f)))
    if not v:
        return empty
    h = len(v) // 2
    return v[h] if len(v) % 2 else (v[h - 1] + v[h]) / 2


def median_range(values: Iterable[float | None], spec: str = ".4g") -> str:
    """``median [min-max]`` of the values that are numbers (None and NaN left out), each formatted
    with ``spec``, as a table cell: the value alone when there is one, "-" when there is none, and
    "never" for an infinite one (a target a seed never reaches). A range, not an interval: the few
    seeds of a training comparison say where each landed, and :meth:`Spread.text` keeps the
    ``[lo, hi]`` form for the 95% interval of the mean."""
    v = [f for f in (float(x) for x in values if x is not None) if not math.isnan(f)]
    if not v:
        return "-"
    f = lambda x: "never" if math.isinf(x) else format(x, spec)  # noqa: E731
    if len(v) == 1:
        return f(v[0])
    return f"{f(median(v))} [{f(min(v))}-{f(max(v))}]"


@dataclass(frozen=True)
class Spread:
    """One figure over replicates: ``n`` non-NaN values, their median and range, the mean and
    its 95% interval ``[lo, hi]`` (nan with fewer than two finite values)."""

    n: int
    median: float
    mean: float
    lo: float
    hi: float
    min: float
    max: float

    def text(self, spec: str = ".4g") -> str:
        """``median [lo, hi]`` as a table cell; "not reached" for an infinite median."""
        if math.isnan(self.median):
            return "-"
        if math.isinf(self.median):
            return "not reached"
        if math.isnan(self.lo):
            return format(self.median, spec) + ("" if self.n < 2 else " [-]")
        return f"{self.median:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"


def spread(values: Sequence[float]) -> Spread:
    """:class:`Spread` of ``values`` (NaN left out; see :func:`mean_ci95` for infinite ones)."""
    v = [float(x) for x in values if not math.isnan(float(x))]
    m, h = mean_ci95(v)
    return Spread(n=len(v), median=median(v), mean=m, lo=m - h, hi=m + h,
                  min=min(v) if v else math.nan, max=max(v) if v else math.nan)


def paired_ci95(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, bool]:
    """Mean of the per-seed differences ``a_i - b_i``, its 95% half-width, and whether the interval
    excludes 0 (the difference is larger than the run-to-run spread). Pairs with a NaN are left
    out; with an infinite difference (one side never reached a target) the mean is that infinity,
    the half-width nan and the answer False unless every pair differs in that same direction. Two pairs
    with the same difference give a zero-width interval that estimates no spread at all: no verdict
    (False) below three pairs."""
    d = [float(x) - float(y) for x, y in zip(a, b) if not (math.isnan(float(x)) or math.isnan(float(y)))]
    d = [x for x in d if not math.isnan(x)]  # inf - inf: both never reached, no difference to tell
    m, h = mean_ci95(d)
    if math.isinf(m):
        return m, math.nan, len(d) >= 2 and all(math.copysign(1, x) == math.copysign(1, m) and x != 0 for x in d)
    return m, h, math.isfinite(h) and abs(m) > h and (h > 0 or len(d) >= 3)
