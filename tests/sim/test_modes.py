"""The per-mode convergence term (dblp.sim.convergence.modes): its arithmetic, its flags, and the paper mode unchanged."""

from __future__ import annotations

import json
import math

import pytest

from dblp.protocol.compensation import Compensation
from dblp.sim.cli import build_parser, main
from dblp.sim.convergence.curve import PhaseModel, time_to_accuracy
from dblp.sim.convergence.phase import EMULATED_FITTED, model_for
from dblp.sim.convergence.modes import (MODE_FACTORS, EmuRun, ModeModel, crossing_error, first_eval_at_or_after, fit_factor,
                            measured_reach, mode_key, mode_model, model_reach, paper_of, run_compensation)
from dblp.sim.options import config_from_args

BASE = PhaseModel(a=0.9, tau=10.0, k=1.0, m=1.0, w_crit=1.0, w_calm=0.5)


def test_mode_key_leaves_the_stop_rule_out():
    assert mode_key(Compensation()) == "paper"
    assert mode_key(Compensation(stop_rule="once")) == "paper"
    assert mode_key(Compensation("unbiased", "local", stop_rule="once")) == "unbiased+fill-local"
    assert mode_key(Compensation(feedback="upload")) == "ef-upload"
    assert run_compensation("dblp-unbiased+fill-local+stop-once") == Compensation("unbiased", "local",
                                                                                    stop_rule="once")
    assert run_compensation("baseline") == run_compensation("dblp") == Compensation()


def test_the_factor_scales_each_lost_fraction_by_hand():
    m = ModeModel(BASE, 0.5)
    # s1 = 0 + 1 - w_crit * 0.5 * 0.4 = 0.8; s2 = 0.8 + 1 - w_calm * 0.5 * 0.4 = 1.7
    assert m.step(0.0, 0.4, True) == pytest.approx(0.8)
    curve = m.curve([0.4, 0.4], [True, False])
    assert curve[1] == pytest.approx(0.9 - 0.8 / 1.08)
    assert curve[2] == pytest.approx(0.9 - 0.8 / 1.17)
    assert (m.a, m.tau, m.k, m.m, m.a0) == (0.9, 10.0, 1.0, 1.0, 0.1)
    assert ModeModel(BASE, 2.0).step(0.0, 0.8, False) == 0.0  # c * f capped at 1: nothing arrived, no step
    assert ModeModel(BASE, 1.0).curve([0.3] * 5) == BASE.curve([0.3] * 5)


def test_mode_model_returns_the_base_for_the_paper_and_unfitted_modes():
    base = model_for()
    assert mode_model(base, Compensation()) == (base, 1.0, True)
    assert mode_model(base, Compensation(stop_rule="once"))[0] is base
    m, c, fitted = mode_model(base, Compensation(feedback="both"))
    assert (m, c, fitted) == (base, 1.0, False)
    m, c, fitted = mode_model(base, Compensation("unbiased", "local"), factors={"unbiased+fill-local": 0.25})
    assert isinstance(m, ModeModel) and m.c == 0.25 and fitted
    for table in MODE_FACTORS.values():
        assert table["paper"] == 1.0
    assert mode_model(base, Compensation("unbiased", "local"))[1] == MODE_FACTORS["phase"]["unbiased+fill-local"]
    assert mode_model(EMULATED_FITTED["digits_mlp"], Compensation("unbiased", "local"), "emulated")[1] == \
        MODE_FACTORS["emulated"]["unbiased+fill-local"]


def test_paper_mode_time_to_accuracy_is_todays():
    """The numbers the models gave before the mode term existed (same trace, same regimes)."""
    ends = [0.5 * (i + 1) for i in range(60)]
    lost = [0.7 if i in (10, 30) else (0.4 if i % 2 else 0.01) for i in range(60)]
    crit = [i < 10 or 20 <= i < 25 for i in range(60)]
    today = {("phase", 0.8): (11.5, 23.0), ("phase", 0.9): (24.0, 48.0), ("phase", 0.94): (44.5, 89.0),
             ("uniform", 0.9): (25.0, 50.0)}
    for (name, t), (sec, it) in today.items():
        model, _, _ = mode_model(model_for(name), Compensation(), name)
        got = time_to_accuracy(ends, lost, t, model, crit)
        assert (got["time_to_accuracy_s"], got["iterations_to_accuracy"]) == (sec, it)


def test_sim_run_takes_the_compensation_flags(tmp_path):
    p = build_parser()
    a = p.parse_args(["run", "--upload-estimate", "unbiased", "--broadcast-fill", "local", "--stop-rule", "once",
                      "--feedback", "upload", "--feedback-bound", "2", "--reduce", "2ms"])
    want = Compensation("unbiased", "local", "upload", 2.0, "once")
    assert config_from_args(a).compensation == want
    assert Compensation.from_args(a) == want
    assert config_from_args(a).reduce_s == pytest.approx(0.002)  # --reduce stays the server's reduce time
    plain = p.parse_args(["run"])
    assert plain.upload_estimate is None and config_from_args(plain).compensation == Compensation()
    params = tmp_path / "params.json"
    config_from_args(a).to_json(params)
    kept = p.parse_args(["run", "--params", str(params)])
    assert config_from_args(kept).compensation == want  # absent flags leave --params' options
    assert paper_of(config_from_args(a)).compensation == Compensation(feedback_bound=2.0)
    with pytest.raises(SystemExit):
        p.parse_args(["run", "--upload-estimate", "mean"])


def test_sim_run_paper_numbers_unchanged_and_modes_reported(tmp_path, capsys):
    args = ["run", "--model", "1e5", "--iterations", "40", "--loss", "iteration_bursts:at=10,25:loss=0.7",
            "--baseline", "--target-accuracy", "0.9"]
    out = tmp_path / "paper.json"
    assert main(args + ["--summary", str(out)]) == 0
    s = json.loads(out.read_text())
    # the simulator's run before the mode term existed printed these
    assert s["dblp"]["time_to_accuracy_s"] == pytest.approx(0.32980374975999893, rel=1e-9)
    assert s["baseline"]["time_to_accuracy_s"] == pytest.approx(0.28091423551999833, rel=1e-9)
    assert (s["dblp"]["iterations_to_accuracy"], s["baseline"]["iterations_to_accuracy"]) == (62.0, 41.0)
    assert s["dblp"]["compensation"] == "paper" and s["dblp"]["convergence_mode_factor"] == 1.0
    out2 = tmp_path / "mode.json"
    assert main(args + ["--upload-estimate", "unbiased", "--broadcast-fill", "local", "--summary", str(out2)]) == 0
    m = json.loads(out2.read_text())
    assert m["dblp"]["compensation"] == "unbiased+fill-local"
    assert m["dblp"]["convergence_mode_factor"] == MODE_FACTORS["phase"]["unbiased+fill-local"]
    assert m["baseline"]["compensation"] == "paper"  # the fixed baseline stays the paper's
    assert m["baseline"]["time_to_accuracy_s"] == s["baseline"]["time_to_accuracy_s"]
    assert "mode unbiased+fill-local: a lost fraction charged x" in capsys.readouterr().out


def _run(evals, lost, labels=None) -> EmuRun:
    return EmuRun("f", "bursts at 2", "dblp", 0, Compensation(), list(lost), list(labels or [False] * len(lost)),
                  list(evals))


def test_crossings_on_the_evaluation_grid_by_hand():
    r = _run([(3, 1.5, 0.5), (6, 3.0, 0.8), (9, 4.5, 0.95)], [0.0] * 9)
    assert measured_reach(r, 0.9) == (9.0, 4.5)
    assert measured_reach(r, 0.99) == (math.inf, math.inf)
    assert first_eval_at_or_after(r, 7.2) == (9.0, 4.5)
    assert first_eval_at_or_after(r, 6) == (6.0, 3.0)
    assert first_eval_at_or_after(r, 12) == (12.0, 6.0)  # past the run: its 0.5 s an iteration carry on
    # BASE without loss: acc(s) = 0.9 - 0.8 / (1 + s / 10) reaches 0.5 at s = 10: past the run, on its clock ...
    assert model_reach(BASE, r, 0.5) == (10.0, 5.0)
    # ... and 0.26 at s = 2.5 -> iteration 3
    assert model_reach(BASE, r, 0.26) == (3.0, 1.5)


def test_fit_factor_recovers_a_known_factor():
    lost = [0.6] * 60
    truth = ModeModel(BASE, 0.4)
    curve = truth.curve(lost)
    evals = [(k, 0.1 * k, curve[k]) for k in range(1, 61)]
    runs = [_run(evals, lost)]
    targets = (0.5, 0.55, 0.6, 0.65, 0.7)
    assert crossing_error(truth, runs, targets) == 0.0
    assert fit_factor(BASE, runs, targets) == pytest.approx(0.4, abs=0.03)


def test_the_emulated_model_is_digits_mlp_only():
    from dblp.protocol.wire import ParameterError

    assert model_for("emulated") is EMULATED_FITTED["digits_mlp"]
    with pytest.raises(ParameterError, match="convergence-workload"):
        model_for("emulated", "small_cnn")
    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    flat = " ".join(help_text.split())
    assert "--upload-estimate {zero,unbiased}" in flat and "(default: zero, or --params')" in flat
