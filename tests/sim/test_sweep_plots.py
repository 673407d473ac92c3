"""dblp.sim.plots.plot_sweep on a small synthetic sweep table: small multiples (one row of panels per value of
the third axis) with each cell's mean and 95% half-width."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest

from dblp.sim import plots


def _table() -> list[dict]:
    """2 x 2 x 3 grid (p_high, eta, burst_rate), 3 seeds: DBLP's time to train falls with p_high, the
    baseline's rises with the burst rate, every value's half-width is a tenth of it."""
    rows = []
    for p in (0.1, 0.4):
        for e in (0.3, 0.6):
            for b in (0.005, 0.01, 0.02):
                d, base = 10.0 - 10 * p, 10.0 + 100 * b
                rows.append({"p_high": p, "eta": e, "burst_rate": b, "seeds": 3,
                             "dblp_time_to_train_s": d, "dblp_time_to_train_s_ci95": d / 10,
                             "base_time_to_train_s": base, "base_time_to_train_s_ci95": base / 10,
                             "speedup_time_to_train": base / d, "speedup_time_to_train_ci95": 0.05,
                             "dblp_lost": p, "dblp_lost_ci95": 0.01, "base_lost": 0.008, "base_lost_ci95": 0.0,
                             "lost_extra": p - 0.008, "lost_extra_ci95": 0.01})
    return rows


def test_small_multiples_one_row_per_third_axis_value_with_intervals(tmp_path, monkeypatch):
    seen = []
    real = plots.heatmap

    def spy(grid, xs, ys, xlabel, ylabel, title, ax, **kw):
        seen.append((title, np.array(grid, float), kw.get("ci")))
        real(grid, xs, ys, xlabel, ylabel, title, ax, **kw)

    monkeypatch.setattr(plots, "heatmap", spy)
    paths = plots.plot_sweep(_table(), "p_high", "eta", tmp_path, z="burst_rate")
    assert [p.name for p in paths] == ["heatmap_time_to_train_s.png", "heatmap_lost.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    # time to train: 3 rows (burst rates) x 3 panels (DBLP, baseline, ratio); lost: the baseline is flat
    # (0.008 everywhere), so 3 rows x 2 panels
    ttt, lost = seen[:9], seen[9:]
    assert len(ttt) == 9 and len(lost) == 6
    assert [t for t, _, _ in ttt[::3]] == [f"DBLP [burst_rate = {b}]" for b in (0.005, 0.01, 0.02)]
    assert [t.split("\n")[0] for t, _, _ in ttt[2::3]] == [f"baseline / DBLP [burst_rate = {b}]"
                                                           for b in (0.005, 0.01, 0.02)]
    # each panel's cells are that burst rate's values, not a mean over burst rates: baseline 10.5, 11, 12
    for (_, grid, ci), b in zip(ttt[1::3], (0.005, 0.01, 0.02)):
        assert grid == pytest.approx(np.full((2, 2), 10 + 100 * b))
        assert ci == pytest.approx(np.full((2, 2), (10 + 100 * b) / 10))
    _, dblp_grid, dblp_ci = ttt[0]
    assert dblp_grid == pytest.approx(np.array([[9.0, 6.0], [9.0, 6.0]]))  # rows: eta, columns: p_high
    assert dblp_ci == pytest.approx(np.array([[0.9, 0.6], [0.9, 0.6]]))
    _, ratio, ratio_ci = ttt[8]  # burst rate 0.02: the per-seed speedup column, with its interval
    assert ratio == pytest.approx(np.array([[12 / 9, 12 / 6], [12 / 9, 12 / 6]]))
    assert ratio_ci == pytest.approx(np.full((2, 2), 0.05))
    _, diff, _ = lost[1]
    assert diff == pytest.approx(np.array([[0.092, 0.392], [0.092, 0.392]]))
    # the figure has three rows of panels: 4.3 in each at 110 dpi
    assert matplotlib.image.imread(paths[0]).shape[0] == round(3 * 4.3 * 110)


def test_without_a_third_axis_one_row_and_no_interval_for_averaged_cells(tmp_path, monkeypatch):
    seen = []
    real = plots.heatmap
    monkeypatch.setattr(plots, "heatmap", lambda g, *a, **kw: (seen.append((np.array(g, float), kw.get("ci"))),
                                                               real(g, *a, **kw)))
    plots.plot_sweep(_table(), "p_high", "eta", tmp_path, averaged=["burst_rate"])
    # averaged over the burst rates the baseline is 11.17 everywhere: one number in the title, 2 panels a metric
    assert len(seen) == 4
    grid, ci = seen[0]  # DBLP: the mean over 3 burst rates, which has no one interval
    assert grid == pytest.approx(np.array([[9.0, 6.0], [9.0, 6.0]]))
    assert np.isnan(ci).all()
    ratio, _ = seen[1]
    m = 10 + 100 * (0.005 + 0.01 + 0.02) / 3  # the baseline averaged over burst rates
    assert ratio == pytest.approx(np.array([[m / 9, m / 6], [m / 9, m / 6]]))  # the mean of the speedups
    assert matplotlib.image.imread(tmp_path / "heatmap_time_to_train_s.png").shape[0] == round(4.3 * 110)
