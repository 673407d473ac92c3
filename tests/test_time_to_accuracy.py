"""Time to accuracy, replicate intervals and the CLR detector's view, on synthetic data (no network)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from dblp.results.analysis import replicate_table, verdicts
from dblp.cli.args import parse_targets
from dblp.results.clrview import checks, replay
from dblp.sim.convergence.curve import rmse
from dblp.sim.convergence.phase import model_for
from dblp.sim.convergence.runs import load_curves
from dblp.results.stats import mean_ci95, median, median_range, paired_ci95, spread
from dblp.results.trainreport import first_reach, load_training, run_curve, table_v, time_to_targets


def _write_run(d: Path, evals: list[list[tuple[int, float, float]]], metric: str = "accuracy",
               train_s: float = 10.0) -> None:
    """A training run's folder as dblp.train workers leave it: per worker summary, epochs and evals."""
    for i, ev in enumerate(evals):
        w = d / f"w{i}"
        w.mkdir(parents=True)
        (w / "summary.json").write_text(json.dumps({"metric": metric, "train_s": train_s, "exchange_s": 1.0,
                                                    "final_metric": ev[-1][2], "config": {"batch_size": 32}}))
        (w / "epochs.jsonl").write_text(json.dumps({"epoch": 1, "iterations": ev[-1][0], metric: ev[-1][2]}) + "\n")
        (w / "evals.jsonl").write_text("".join(json.dumps({"iteration": k, "train_s": t, metric: v}) + "\n"
                                               for k, t, v in ev))


def test_first_reach_is_the_first_evaluation_at_or_beyond_the_target():
    curve = [(0, 0.0, 0.1), (5, 2.0, 0.85), (10, 4.0, 0.90), (15, 6.0, 0.89), (20, 8.0, 0.95)]
    assert first_reach(curve, 0.9) == (10.0, 4.0)  # "at": exactly 0.90 counts
    assert first_reach(curve, 0.94) == (20.0, 8.0)  # the dip at 15 does not matter once reached
    assert first_reach(curve, 0.96) == (math.inf, math.inf)  # never reached
    assert first_reach([], 0.5) == (math.inf, math.inf)
    ppl = [(0, 0.0, 900.0), (4, 1.5, 300.0), (8, 3.0, 120.0)]
    assert first_reach(ppl, 300.0, higher=False) == (4.0, 1.5)  # perplexity: at or below
    assert first_reach(ppl, 100.0, higher=False) == (math.inf, math.inf)


def test_run_curve_takes_the_workers_mean_and_the_slowest_clock(tmp_path):
    _write_run(tmp_path / "dblp", [[(3, 1.0, 0.80), (6, 2.0, 0.92), (9, 3.0, 0.95)],
                                   [(3, 1.5, 0.90), (6, 2.5, 0.94), (9, 3.2, 0.93)]])
    run = load_training(tmp_path / "dblp", 2)
    assert run_curve(run) == [(3, 1.5, pytest.approx(0.85)), (6, 2.5, pytest.approx(0.93)),
                              (9, 3.2, pytest.approx(0.94))]
    assert time_to_targets(run, [0.9, 0.94, 0.95]) == {0.9: (6.0, 2.5), 0.94: (9.0, 3.2),
                                                         0.95: (math.inf, math.inf)}


def test_table_v_puts_time_to_last_iteration_beside_time_to_each_target(tmp_path):
    _write_run(tmp_path / "dblp", [[(5, 2.0, 0.91), (10, 4.0, 0.93)]], train_s=8.0)
    _write_run(tmp_path / "baseline", [[(5, 3.0, 0.92), (10, 6.0, 0.95)]], train_s=12.0)
    runs = {n: load_training(tmp_path / n, 1) for n in ("baseline", "dblp")}
    rows = table_v(runs, targets=[0.9, 0.94])
    assert rows[0] == ["run", "train time (s)", "exchange (s)", "time / dblp", "to 90% (s)", "to 90% / dblp",
                       "to 90% (iter)", "to 94% (s)", "to 94% / dblp", "to 94% (iter)"]
    base, dblp = rows[1], rows[2]
    assert base[:4] == ["baseline", 12.0, 1.0, 1.5] and dblp[:4] == ["dblp", 8.0, 1.0, 1.0]
    assert base[4:7] == [3.0, 1.5, 5] and dblp[4:7] == [2.0, 1.0, 5]
    # DBLP never reaches 94%: its time is inf and the baseline's ratio to it is undefined
    assert base[7] == 6.0 and math.isnan(base[8]) and base[9] == 10
    assert math.isinf(dblp[7]) and math.isnan(dblp[8]) and math.isinf(dblp[9])


def test_the_one_median_leaves_out_none_and_nan_and_with_finite_the_infinities():
    """dblp.results.stats.median serves the benchmark's pass-cost summary (None and NaN left out), the
    calibration (finite values only, None when there are none) and the replicate tables."""
    assert median([None, math.nan, 3, 1, 2]) == 2.0 and median([4, None, 1]) == 2.5
    assert median([1.0, math.inf, math.inf, math.nan], finite=True) == 1.0
    assert median([math.inf, None], finite=True, empty=None) is None and math.isnan(median([]))


def test_median_range_is_the_one_median_min_max_cell():
    """The time-to-accuracy table, dblp.train.modes and dblp.train.phasecheck print a figure over
    seeds as median [min-max]; infinite (never reached) as "never", None and NaN left out."""
    assert median_range([3.0, 1.0, 2.0, 10.0], ".1f") == "2.5 [1.0-10.0]"
    assert median_range([120, None, math.nan, 90, 100], ".0f") == "100 [90-120]"
    assert median_range([0.9512], ".3f") == "0.951" and median_range([None, math.nan]) == "-"
    assert median_range([40.0, math.inf, math.inf], ".0f") == "never [40-never]"
    assert median_range([40.0, 50.0, math.inf], ".0f") == "50 [40-never]"


def test_intervals_on_known_samples():
    m, h = mean_ci95([1.0, 2.0, 3.0])  # s = 1, t(2) = 4.302653
    assert m == 2.0 and h == pytest.approx(4.302653 / math.sqrt(3))
    s = spread([3.0, 1.0, 2.0, 10.0])
    assert (s.n, s.median, s.mean, s.min, s.max) == (4, 2.5, 4.0, 1.0, 10.0)
    assert s.hi - s.mean == pytest.approx(3.182446 * math.sqrt(50 / 3) / 2)  # s^2 = 50/3, t(3)
    assert median([1.0, math.inf, math.inf]) == math.inf and spread([1.0, math.inf, 5.0]).text() == "5 [-]"  # no interval with a seed that never reached it
    assert spread([1.0, math.inf, math.inf]).text() == "not reached"
    d, h, beyond = paired_ci95([3.0, 4.0, 5.0], [1.0, 1.0, 1.0])  # differences 2, 3, 4: 3 +- 2.48
    assert d == 3.0 and h == pytest.approx(4.302653 / math.sqrt(3)) and beyond
    d, h, beyond = paired_ci95([2.0, 3.0, 4.0], [1.0, 1.0, 1.0])  # 1, 2, 3: 2 +- 2.48 holds 0
    assert d == 2.0 and not beyond
    assert paired_ci95([math.inf, math.inf], [3.0, 4.0])[2]  # never reached, each seed: a real difference
    # two seeds with the same difference: a zero-width interval estimates no spread, no verdict; three do
    assert paired_ci95([25.0, 25.0], [20.0, 20.0]) == (5.0, 0.0, False)
    assert paired_ci95([25.0, 25.0, 25.0], [20.0, 20.0, 20.0]) == (5.0, 0.0, True)


def test_replicate_table_gives_medians_intervals_and_the_paired_verdict():
    tables = [[["run", "time (s)"], ["baseline", b], ["dblp", d]] for b, d in ((10.0, 7.0), (11.0, 7.5), (12.0, 7.2))]
    rows, long = replicate_table(tables)
    h = 4.302653 * 1.0 / math.sqrt(3)
    assert rows[1] == ["baseline", f"11 [{11 - h:.4g}, {11 + h:.4g}]"]
    dblp = next(r for r in long if r[0] == "dblp")
    assert dblp[2:5] == [3, 7.2, pytest.approx(7.2333333)]
    assert dblp[9] == pytest.approx(-3.7666667) and dblp[11] is True  # -3, -3.5, -4.8: beyond the spread
    assert verdicts(long, ["time (s)"], ("dblp", "baseline")) == [
        f"  {'dblp':<28} {'time (s)':<18} dblp - baseline = -3.767 +- {dblp[10]:.3g}: larger than the spread"]


def test_targets_are_checked_against_the_workloads_metric():
    assert parse_targets(None, "accuracy") == [0.9, 0.94]
    assert parse_targets("0.94,0.9", "accuracy") == [0.9, 0.94]
    assert parse_targets("300,150", "perplexity") == [300.0, 150.0]  # the easiest first
    with pytest.raises(ValueError, match="percentage"):
        parse_targets("94", "accuracy")
    with pytest.raises(ValueError, match="> 1"):
        parse_targets("0.5", "perplexity")
    with pytest.raises(ValueError, match="not a number"):
        parse_targets("0.9,x", "accuracy")


def test_detector_checks_and_replay_follow_the_policy():
    # norm halves at 10 (change 0.5 >= eta 0.5: stays critical), moves 10% at 20 (leaves), jumps at 30 (back)
    norms = [4.0] * 10 + [2.0] * 10 + [1.8] * 10 + [3.6] * 10
    cs = checks(norms, eta=0.5, freq=10)
    assert [(c["step"], c["clr"]) for c in cs] == [(10, True), (20, False), (30, True)]
    assert [round(c["change"], 3) for c in cs] == [0.5, 0.1, 1.0]
    (g,) = replay(norms, [0.5], [10])
    assert g == {"eta": 0.5, "freq": 10, "clr_share": 30 / 40, "first_exit": 20, "reentries": 1}
    (g,) = replay(norms, [0.05], [10])  # every check sees >= 5%: never leaves
    assert g["first_exit"] is None and g["clr_share"] == 1.0


def test_measured_curves_feed_the_convergence_model(tmp_path):
    p = tmp_path / "curves.csv"
    with open(p, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["setting", "seed", "workers", "batch_size", "iteration", "lost_fraction", "train_s", "accuracy"])
        for i in range(11):
            acc = {5: 0.6, 10: 0.8}.get(i, "")
            w.writerow(["dblp", 0, 3, 32, i, "0.5" if i < 10 else "", "" if acc == "" else i * 0.1, acc])
    (c,) = load_curves(p)
    assert (c.setting, c.seed, c.iterations, c.accuracy) == ("dblp", 0, [5, 10], [0.6, 0.8])
    assert c.fractions() == [0.5] * 10
    model = model_for()
    pred = model.curve([0.5] * 10)
    assert rmse(model, [c]) == pytest.approx(math.sqrt(((pred[5] - 0.6) ** 2 + (pred[10] - 0.8) ** 2) / 2))
