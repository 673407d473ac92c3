"""The phase-aware convergence model: its fit, its documented held-out errors, and its use in runs and sweeps."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.sim import SimConfig
from dblp.sim.convergence import phase as cp
from dblp.sim.convergence.curve import PhaseModel, rmse, time_to_accuracy
from dblp.sim.convergence.runs import (PHASE_DATA, PHASE_FIT_SETTINGS, PHASE_SETTINGS, Curve, Schedule, clr_labels,
                                       load_curves, split, write_measured)
from dblp.sim.studies.sweep import run_sweep, with_accuracy
from dblp.protocol.wire import ParameterError

ROOT = Path(__file__).resolve().parents[2]
EMULATED = PHASE_DATA.with_name("convergence_emulated_microburst.csv")


def test_clr_labels_follow_dblps_detector():
    """The start is critical until the first check (step 10); a 2x jump seen at a check holds the CLR for the
    next 10 iterations; a flat norm never enters it again."""
    norms = [1.0] * 40
    norms[20] = 2.0  # checked at step 20 against step 19: |1 - 2| / 1 = 1 >= 0.5
    lab = clr_labels(norms)
    assert lab[:11] == [True] * 11 and lab[11:21] == [False] * 10
    assert lab[21:31] == [True] * 10 and lab[31:] == [False] * 9


def test_phase_model_charges_loss_by_regime():
    m = PhaseModel(a=0.95, tau=10.0, k=2.0, m=0.5, w_crit=1.0, w_calm=0.25)
    assert m.step(0.0, 0.8, True) == pytest.approx(0.2)  # 1 - 1.0 * 0.8
    assert m.step(0.0, 0.8, False) == pytest.approx(0.8)  # 1 - 0.25 * 0.8
    assert m.step(0.0, 0.8, 0.5) == pytest.approx(1 - 0.625 * 0.8)  # an extrapolated mix of the regimes
    n = 400
    crit = [i < 30 for i in range(n)]
    lossy_crit = m.iterations_to(0.9, [0.8 if c else 0.0 for c in crit], critical=crit)
    lossy_calm = m.iterations_to(0.9, [0.0 if c else 0.8 for c in crit], critical=crit)
    clean = m.iterations_to(0.9, [0.0] * n, critical=crit)
    assert clean == math.ceil(m.progress_needed(0.9))
    # 30 critical iterations at 0.8: 24 iterations of progress lost; a calm one at 0.8 gains 0.8, so the
    # 140 iterations of progress after the first 30 take 175
    assert clean == 170 and lossy_crit == clean + 24
    assert lossy_calm == pytest.approx(30 + 175, abs=1)


def _synthetic(truth: PhaseModel, n: int = 60, every: int = 5) -> list[Curve]:
    """Noise-free runs of ``truth``: labels alternate in blocks of 10 (as DBLP's checks do)."""
    labels = [(i // 10) % 2 == 0 for i in range(n)]
    out = []
    for sch in (Schedule("clean", 0.0), Schedule("crit 0.8", 0.8, phase="crit"),
                Schedule("calm 0.8", 0.8, phase="calm"), Schedule("const 0.5", 0.5)):
        c = Curve(sch.name, 0, sch, list(range(0, n + 1, every)), [], labels=labels)
        pred = truth.curve(c.fractions(), c.critical())
        c.accuracy = [pred[i] for i in c.iterations]
        out.append(c)
    return out


def test_fit_recovers_the_parameters_of_synthetic_runs():
    truth = PhaseModel(a=0.95, tau=15.0, k=2.5, m=0.6, w_crit=1.4, w_calm=0.3)
    curves = _synthetic(truth)
    got = cp.fit(curves, restarts=2, iterations=700, starts=[(0.8, 0.8)])
    assert rmse(got, curves) < 2e-3
    assert got.w_crit == pytest.approx(1.4, abs=0.1)
    assert got.w_calm == pytest.approx(0.3, abs=0.1)
    assert got.tau == pytest.approx(15.0, rel=0.1)
    # the uniform control cannot tell the regimes apart: a single weight in between, a worse fit
    tied = cp.fit(curves, tie=True, restarts=1, iterations=500)
    assert tied.w_crit == tied.w_calm and 0.3 < tied.w_crit < 1.4
    assert rmse(tied, curves) > 3 * rmse(got, curves)


def test_heldout_error_is_the_relative_error_of_the_seed_mean_crossing():
    """Two seeds measured 0.85 and 0.75 at iteration 10 (mean 0.80: the 80% crossing is 10); the model
    (labels given: per seed, then averaged) reaches 80% at its own iteration; error = model / measured - 1."""
    m = PhaseModel(a=0.99, tau=1.2, k=2.0, m=0.5, w_crit=1.0, w_calm=1.0)  # 80% after 6 iterations, 90% after 12
    sch = Schedule("held", 0.0)
    runs = [Curve("held", s, sch, [0, 5, 10, 15], acc, labels=[False] * 15)
            for s, acc in ((0, [0.1, 0.5, 0.85, 0.9]), (1, [0.1, 0.5, 0.75, 0.9]))]
    want = math.ceil(m.progress_needed(0.8))
    assert want == 6 and math.ceil(m.progress_needed(0.9)) == 12
    rows = cp.heldout_errors(m, runs, (0.8, 0.9))
    r80 = next(r for r in rows if r["target"] == 0.8)
    r90 = next(r for r in rows if r["target"] == 0.9)
    assert r80["measured"] == 10 and r80["model"] == want
    assert r80["rel_err"] == pytest.approx(want / 10 - 1)
    assert r90["measured"] == 15 and r90["model"] == 12 and r90["rel_err"] == pytest.approx(-0.2)
    s = cp.summarize_errors(rows)
    assert s["median_0.8"] == pytest.approx(abs(want / 10 - 1))
    assert s["worst"] == pytest.approx(max(abs(r80["rel_err"]), abs(r90["rel_err"])))


def test_the_shipped_models_reproduce_the_documented_heldout_errors():
    groups = cp.by_workload(load_curves(PHASE_DATA))
    assert set(groups) == {"digits_mlp", "small_cnn"}
    for wl, cs in groups.items():
        assert {c.setting for c in cs} == {s.name for s in PHASE_SETTINGS}
        assert all(c.labels is not None and len(c.labels) == 300 for c in cs)
        fit_set, held = split(cs, PHASE_FIT_SETTINGS)
        for name, model in (("phase", cp.PHASE_FITTED[wl]), ("uniform", cp.UNIFORM_FITTED[wl])):
            doc = cp.HELDOUT[wl][name]
            got = cp.summarize_errors(cp.heldout_errors(model, held))
            for k in ("median_0.8", "worst_0.8", "median_0.9", "worst_0.9"):
                assert got[k] == pytest.approx(doc[k], abs=0.005), (wl, name, k)
            assert rmse(model, held) == pytest.approx(doc["heldout_rmse"], abs=1e-3)


def test_emulated_runs_travel_with_their_labels(tmp_path):
    emu = cp.emulation_curves(EMULATED)
    assert len(emu) == 15 and all(c.labels is not None for c in emu)
    dblp = [c for c in emu if c.setting.endswith("dblp")]
    share = [sum(c.critical()) / len(c.critical()) for c in dblp]
    assert all(0.15 < s < 0.45 for s in share)  # the P_low share the emulation measured: 0.17-0.29 (+ start)
    back = load_curves(write_measured(emu, tmp_path / "c.csv"))
    assert [c.critical() for c in back] == [c.critical() for c in emu]
    doc = cp.HELDOUT["emulation"]
    got = cp.summarize_errors(cp.heldout_errors(cp.PHASE_FITTED["digits_mlp"], emu))
    assert got["median"] == pytest.approx(doc["median"], abs=0.005)


def test_lost_applied_is_the_models_fraction():
    """A P_high round (50% lost up and down) misses 1 - 0.5 * 0.5 = 0.75 of the applied gradient: the map
    shows that, not the mean of up and down (0.5)."""
    s = {"_round_end_s": [1.0, 2.0, 3.0, 4.0], "_round_lost": [0.75, 0.75, 0.0, 0.0]}
    out = with_accuracy(s, 0.9, critical=[True, False, False, False])
    assert out["lost_applied"] == pytest.approx(0.375)
    assert out["crit_frac"] == pytest.approx(0.25)


BASE = SimConfig(model=100_000, workers=2, rounds=40, freq=3)
AXES = {"p_high": [0.6], "p_low": [0.008], "eta": [0.5], "freq": [3], "burst_rate": [0.2], "burst_loss": [0.7],
        "burst_len": [1], "model": [100_000], "bandwidth_bps": [10e9]}


def test_the_sweep_uses_the_phase_model_and_keeps_the_others():
    rows, info = run_sweep(BASE, AXES, jobs=1, progress=False, target_accuracy=0.9)
    assert info["convergence"] == "phase" and info["convergence_workload"] == "digits_mlp"
    r = rows[0]
    regimes = cp.sim_regimes(BASE, 40)
    assert r["dblp_crit_frac"] == pytest.approx(sum(regimes) / 40)
    assert r["dblp_lost_applied"] >= r["base_lost_applied"]
    uniform, _ = run_sweep(BASE, AXES, jobs=1, progress=False, target_accuracy=0.9, convergence="uniform")
    assert uniform[0]["dblp_mean_round_s"] == r["dblp_mean_round_s"]  # the same simulations
    with pytest.raises(ParameterError, match="--convergence"):
        run_sweep(BASE, AXES, jobs=1, progress=False, convergence="nope")


def test_time_to_accuracy_extrapolates_with_the_runs_share_of_critical_rounds():
    m = PhaseModel(a=0.95, tau=10.0, k=2.0, m=0.5, w_crit=1.0, w_calm=0.0)
    ends = [0.1 * (i + 1) for i in range(4)]
    calm = time_to_accuracy(ends, [0.5] * 4, 0.9, m, [False] * 4)  # calm loss is free: the clean count
    assert calm["iterations_to_accuracy"] == math.ceil(m.progress_needed(0.9))
    half = time_to_accuracy(ends, [0.5] * 4, 0.9, m, [True, False, True, False])
    need = m.progress_needed(0.9)  # every round gains 1 - 0.5 * 0.5 on average
    assert half["iterations_to_accuracy"] == pytest.approx(need / 0.75, abs=1.5)
    assert half["tta_extrapolated"] == 1.0


def test_cli_refuses_a_missing_file_and_lists_its_commands():
    out = subprocess.run([sys.executable, "-m", "dblp.sim.convergence.phase", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "measure" in out.stdout and "report" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "dblp.sim.convergence.phase", "report", "--data", "/nonexistent.csv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--data" in bad.stderr and "Traceback" not in bad.stderr


def test_dblp_reaches_90_percent_sooner_only_if_calm_loss_is_cheap():
    """A DBLP-like run - outside the CLR (three rounds of four after the first 11) rounds 1.7x shorter and 75% of
    the gradient lost (P_high 0.5 up and down), in it the baseline's round - against a baseline losing 0.8%
    (1.42x longer to the last round): with the fitted digits_mlp weights (w_calm 0.74) DBLP needs 61 rounds
    to 90% against 41 and is 0.90x as fast; at the what-if weights 1.2 / 0 it needs 40 and is 1.33x."""
    n = 300
    crit = [i < 11 or i % 4 == 0 for i in range(n)]
    dblp_lost = [0.0 if c else 0.75 for c in crit]
    base_lost = [0.008] * n
    fast = list(itertools.accumulate(1.0 if c else 1 / 1.7 for c in crit))
    slow = [float(i + 1) for i in range(n)]

    def speedup(model: PhaseModel) -> float:
        d = time_to_accuracy(fast, dblp_lost, 0.9, model, crit)["time_to_accuracy_s"]
        b = time_to_accuracy(slow, base_lost, 0.9, model, crit)["time_to_accuracy_s"]
        return b / d

    fitted = cp.model_for("phase", "digits_mlp")
    assert fitted == cp.PHASE_FITTED["digits_mlp"]
    assert speedup(fitted) == pytest.approx(0.896, abs=0.005)
    assert speedup(cp.model_for("phase", "digits_mlp", (1.2, 0.5))) == pytest.approx(1.045, abs=0.005)
    assert speedup(cp.model_for("phase", "digits_mlp", (1.2, 0.0))) == pytest.approx(1.325, abs=0.005)
    with pytest.raises(ParameterError, match="--convergence-weights"):
        cp.model_for("uniform", "digits_mlp", (1.2, 0.0))


def test_report_draws_the_measured_bands_beside_the_models(tmp_path):
    """The convergence figure draws each setting's seeds as a band against the models' curves: the report
    runs on the shipped data, says where it wrote, and the PNG has the figure's documented size."""
    from PIL import Image

    png = tmp_path / "fig.png"
    out = subprocess.run([sys.executable, "-m", "dblp.sim.convergence.phase", "report", "--plot", str(png)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"wrote {png}" in out.stdout
    with Image.open(png) as im:
        assert im.size == (1364, 1045)
        colours = len(im.convert("RGB").getcolors(maxcolors=1 << 24))
    assert colours > 200  # bands (alpha-blended fills) and curves, not an empty canvas
