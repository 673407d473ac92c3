"""Time to accuracy: the shared curve and walk (with the default, phase-aware model), in runs and sweeps."""

from __future__ import annotations

import math

import pytest

from dblp.sim import SimConfig
from dblp.sim.convergence import curve as cv
from dblp.sim.convergence.phase import model_for
from dblp.sim.convergence.runs import PHASE_DATA, load_curves
from dblp.sim.cli import main as cli_main
from dblp.sim.studies.replicates import mean_ci95
from dblp.sim.studies.runners import ResultCache
from dblp.sim.studies.sweep import run_sweep

MODEL = model_for()  # the default: phase-aware, digits_mlp
CURVES = [c for c in load_curves(PHASE_DATA) if c.workload == "digits_mlp"]


def _tta(ends: list[float], lost: list[float], target: float = cv.DEFAULT_TARGET_ACCURACY) -> dict[str, float]:
    return cv.time_to_accuracy(ends, lost, target, MODEL)


def test_nelder_mead_finds_a_known_minimum():
    x = cv.nelder_mead(lambda p: (p[0] - 3) ** 2 + 10 * (p[1] + 1) ** 2, [0.0, 0.0])
    assert x == pytest.approx([3.0, -1.0], abs=1e-3)


def _ends(n: int, period: float = 0.01) -> list[float]:
    return [period * (i + 1) for i in range(n)]


def test_zero_loss_is_fastest_and_more_loss_is_never_faster():
    n = 300
    times = [_tta(_ends(n), [f] * n)["time_to_accuracy_s"] for f in (0.0, 0.05, 0.2, 0.4, 0.6, 0.8)]
    assert times == pytest.approx([0.62, 0.64, 0.72, 0.87, 1.10, 1.49])
    # loss in a single round never speeds things up either
    clean = _tta(_ends(n), [0.0] * n)["time_to_accuracy_s"]
    for i in (0, 10, 50):
        lost = [0.0] * n
        lost[i] = 0.9
        assert _tta(_ends(n), lost)["time_to_accuracy_s"] >= clean


def test_monotone_in_the_target_and_clean_runs_follow_the_clean_curve():
    n = 300
    its = [_tta(_ends(n), [0.0] * n, t)["iterations_to_accuracy"] for t in (0.5, 0.8, 0.9, 0.93)]
    assert its == [7.0, 19.0, 40.0, 62.0]
    # without loss, progress is the iteration count: the clean curve's own crossing
    assert its[2] == math.ceil(MODEL.progress_needed(0.9))


def test_loss_early_costs_accuracy_and_loss_on_the_plateau_does_not():
    """As measured: 80% loss over iterations 0-40 lags the clean run by many points; over 120-300 by none."""
    n = 300
    clean = MODEL.curve([0.0] * n)
    early = MODEL.curve([0.8 if i < 40 else 0.0 for i in range(n)])
    late = MODEL.curve([0.8 if i >= 120 else 0.0 for i in range(n)])
    assert clean[40] - early[40] == pytest.approx(0.126, abs=1e-3)
    assert clean[n] - late[n] == pytest.approx(0.006, abs=1e-3)
    # the measured runs (3 seeds, an evaluation every 5 iterations) say the same
    mean = {s: [sum(c.accuracy[j] for c in CURVES if c.setting == s) / 3 for j in range(61)]
            for s in ("clean", "early 0.8", "late 0.8")}
    assert mean["clean"][8] - mean["early 0.8"][8] > 0.1  # after 40 iterations
    assert abs(mean["clean"][-1] - mean["late 0.8"][-1]) < 0.01
    # time to accuracy: loss before the target is reached delays it; loss after it does not
    ends = _ends(n)
    before = [0.6 if 5 <= i < 35 else 0.0 for i in range(n)]
    after = [0.6 if 150 <= i < 180 else 0.0 for i in range(n)]
    assert [_tta(ends, lost)["iterations_to_accuracy"] for lost in ([0.0] * n, before, after)] == [62.0, 75.0, 62.0]


def test_extrapolation_and_unreachable_targets():
    short = _tta(_ends(10), [0.0] * 10)
    assert short["tta_extrapolated"] == 1.0
    need = math.ceil(MODEL.progress_needed(cv.DEFAULT_TARGET_ACCURACY))
    assert short["iterations_to_accuracy"] == need == 62
    assert short["time_to_accuracy_s"] == pytest.approx(0.01 * need)
    above = _tta(_ends(10), [0.0] * 10, min(0.999, MODEL.a + 0.001))
    assert math.isinf(above["time_to_accuracy_s"])
    never = _tta(_ends(10), [1.0] * 10)  # nothing ever arrives
    assert math.isinf(never["time_to_accuracy_s"])


def test_bad_target_is_refused_naming_the_flag(capsys):
    for bad in ("93", "0.05", "x"):
        with pytest.raises(SystemExit) as e:
            cli_main(["run", "--target-accuracy", bad])
        assert e.value.code == 2
        assert "--target-accuracy" in capsys.readouterr().err
    with pytest.raises(cv.ParameterError, match="--target-accuracy"):
        cv.check_target(1.5)


def test_infinite_values_make_an_infinite_mean():
    assert mean_ci95([1.0, math.inf, 3.0])[0] == math.inf
    assert math.isnan(mean_ci95([math.inf, -math.inf])[0])


BASE = SimConfig(model=100_000, workers=2, rounds=40, freq=3)
AXES = {"p_high": [0.2, 0.6], "p_low": [0.008], "eta": [0.5], "freq": [3], "burst_rate": [0.2], "burst_loss": [0.7],
        "burst_len": [1], "model": [100_000], "bandwidth_bps": [10e9]}


def test_sweep_rows_report_time_to_accuracy_and_the_cache_serves_any_target(tmp_path):
    cache = ResultCache(tmp_path)
    rows, info = run_sweep(BASE, AXES, jobs=1, progress=False, cache=cache, target_accuracy=0.9)
    assert info["target_accuracy"] == 0.9
    for r in rows:
        assert r["dblp_time_to_accuracy_s"] > 0 and r["base_time_to_accuracy_s"] > 0
        assert r["speedup_time_to_accuracy"] == pytest.approx(r["base_time_to_accuracy_s"]
                                                              / r["dblp_time_to_accuracy_s"])
        # the baseline loses at most P_low: it converges (nearly) as the clean curve does
        assert r["base_iterations_to_accuracy"] <= math.ceil(model_for().progress_needed(0.9)) + 1  # the default
    lossier = rows[1]  # P_high 0.6 loses more than 0.2 in the bursts, so it needs at least as many iterations
    assert lossier["dblp_lost"] >= rows[0]["dblp_lost"]
    assert lossier["dblp_iterations_to_accuracy"] >= rows[0]["dblp_iterations_to_accuracy"]

    def never(d: dict) -> dict:
        raise AssertionError("simulated again")

    again, info2 = run_sweep(BASE, AXES, jobs=1, progress=False, cache=cache, runner=never, target_accuracy=0.8)
    assert info2["cached"] == info["runs"]
    assert all(a["dblp_time_to_accuracy_s"] <= r["dblp_time_to_accuracy_s"] for a, r in zip(again, rows))


def test_run_prints_and_writes_time_to_accuracy(tmp_path, capsys):
    rc = cli_main(["run", "--model", "100000", "--iterations", "20", "--target-accuracy", "0.9",
                   "--summary", str(tmp_path / "s.json")])
    assert rc == 0
    assert "time-to-90%-accuracy" in capsys.readouterr().out
    import json

    s = json.loads((tmp_path / "s.json").read_text())
    assert s["dblp"]["time_to_accuracy_s"] > 0 and s["dblp"]["tta_extrapolated"] in (0.0, 1.0)
