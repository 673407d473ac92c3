"""Replicates of a sweep point: means and 95% confidence intervals over seeds.

Why: one seed per point says little when the effect is a handful of events
(burst rates 0.005 and 0.01 can both give exactly one burst in 300
iterations). With ``--seeds N`` every point is simulated with N seeds (the
baseline with the same N: common random numbers, so the bursts are the
same), and each table cell is a mean with the half-width of its Student-t
95% interval; ratios (speedups) are taken per seed, then averaged, so the
interval is that of the paired comparison.

The interval code lives in :mod:`dblp.results.stats` (the emulation's replicates use
it too); this module keeps the simulator's names.
"""

from __future__ import annotations

from dblp.results.stats import mean_ci95, t975

__all__ = ["mean_ci95", "t975"]
