"""Loss processes: distributions, per-pass and per-datagram forms, trace replay, spec checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.sim import simulate
from dblp.sim.network.loss import GilbertElliott, burst_iterations, check_spec, make_flow_loss
from dblp.protocol.wire import ParameterError

from sim_helpers import small

SAMPLES = Path(__file__).resolve().parents[2] / "traces" / "samples"


def _runs(d: np.ndarray) -> float:
    """Mean length of runs of True."""
    edges = np.diff(np.concatenate(([0], d.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return float((ends - starts).mean())


def test_gilbert_elliott_vector_and_scalar_forms_agree():
    p, r, n = 0.02, 0.25, 200_000
    vec = GilbertElliott(p, r, 1.0, 0.0, np.random.default_rng(1))
    parts = [vec.drops(np.zeros(k), 0) for k in (1, 7, 50_000, 3, 149_939)]
    dv = np.concatenate([x if x is not None else np.zeros(k, bool) for x, k in zip(parts, (1, 7, 50_000, 3, 149_939))])
    sca = GilbertElliott(p, r, 1.0, 0.0, np.random.default_rng(2))
    ds = np.array([sca.drop1(0.0, 0) for _ in range(n)])
    stationary = p / (p + r)
    for d in (dv, ds):
        assert d.mean() == pytest.approx(stationary, rel=0.1)
        assert _runs(d) == pytest.approx(1 / r, rel=0.1)


def test_bernoulli_and_bursts_by_iteration_and_time():
    specs = [{"kind": "bernoulli", "p": 0.1, "dirs": "up"},
             {"kind": "iteration_bursts", "at": [5], "loss": 1.0, "length": 2},
             {"kind": "time_bursts", "at_s": [2.0], "loss": 1.0, "duration_s": 0.5}]
    up = make_flow_loss(specs, seed=0, direction=ctl.UP, worker=0, rounds=10)
    down = make_flow_loss(specs, seed=0, direction=ctl.DOWN, worker=0, rounds=10)
    t = np.linspace(0.0, 1.0, 50_000)
    assert up.drops(t, 0).mean() == pytest.approx(0.1, abs=0.01)
    assert down.drops(t, 0) is None  # bernoulli is up only
    assert down.drops(t, 5).all() and down.drops(t, 6).all() and down.drops(t, 7) is None
    assert down.burst(5) and down.burst(6) and not down.burst(7)
    tt = np.array([1.9, 2.1, 2.4, 2.6])
    assert down.drops(tt, 0).tolist() == [False, True, True, False]
    assert down.drop1(2.2, 0) and not down.drop1(2.7, 0)


def test_random_bursts_come_from_the_seed():
    spec = {"kind": "random_bursts", "rate": 0.05, "loss": 0.7, "length": 1}
    a = burst_iterations(spec, 0, 7, 1000)
    assert a == burst_iterations(spec, 0, 7, 1000)
    assert a != burst_iterations(spec, 0, 8, 1000)
    assert 25 <= len(a) <= 80 and set(a.values()) == {0.7}


def test_trace_replay_segments_and_packets():
    seg = make_flow_loss([{"kind": "trace", "path": str(SAMPLES / "onoff-lognormal.loss.csv")}],
                         seed=0, direction=ctl.UP, worker=0, rounds=1)
    from traces import read_trace

    tr = read_trace(SAMPLES / "onoff-lognormal.loss.csv")
    t = np.sort(np.random.default_rng(0).uniform(0, tr.duration_us / 1e6, 400_000))
    d = seg.drops(t, 0)
    assert d is not None and d.mean() == pytest.approx(tr.mean_loss(), rel=0.15)
    pk = make_flow_loss([{"kind": "trace", "path": str(SAMPLES / "bernoulli-1pct.pkts")}],
                        seed=0, direction=ctl.UP, worker=0, rounds=1)
    ptr = read_trace(SAMPLES / "bernoulli-1pct.pkts")
    first = pk.drops(np.zeros(4000), 0)
    rest = np.array([pk.drop1(0.0, 0) for _ in range(len(ptr) - 4000)])
    got = np.concatenate([first if first is not None else np.zeros(4000, bool), rest])
    assert np.array_equal(got, ptr.drops)  # the n-th datagram takes the n-th verdict


def test_trace_keyed_by_iteration():
    spec = {"kind": "trace", "path": str(SAMPLES / "paper-efficientnet-70pct.loss.csv"), "key": "iteration"}
    loss = make_flow_loss([spec], seed=0, direction=ctl.UP, worker=0, rounds=930)
    assert [k for k in range(930) if loss.burst(k)] == [279, 651]


def test_trace_in_a_simulation():
    cfg = small(rounds=6, loss=[{"kind": "trace", "path": str(SAMPLES / "gilbert-elliott-netem.pkts")}])
    res = simulate(cfg)
    assert max(r.up_passes for r in res.records if r.role == "worker") >= 2


@pytest.mark.parametrize("spec,msg", [
    ({"kind": "bernouli", "p": 0.1}, "unknown kind"),
    ({"kind": "bernoulli"}, "missing"),
    ({"kind": "bernoulli", "p": 1.5}, "probability"),
    ({"kind": "bernoulli", "p": 0.1, "rate": 2}, "unknown parameter"),
    ({"kind": "iteration_bursts", "at": [-1], "loss": 0.7}, "iteration"),
    ({"kind": "time_bursts", "at_s": [1], "loss": 0.7, "duration_s": 0}, "duration_s"),
    ({"kind": "bernoulli", "p": 0.1, "dirs": "sideways"}, "dirs"),
])
def test_bad_specs_are_refused_by_name(spec, msg):
    with pytest.raises(ParameterError, match=msg):
        check_spec(spec)


def test_missing_trace_file_is_a_clear_error(tmp_path):
    with pytest.raises(ParameterError, match="nope.pkts"):
        simulate(small(rounds=1, loss=[{"kind": "trace", "path": str(tmp_path / "nope.pkts")}]))


def test_mean_loss_is_the_expected_fraction_over_a_window():
    """``mean_loss`` (the class level's view of a process) against the processes' own draws."""
    specs = [{"kind": "iteration_bursts", "at": [3], "loss": 0.7},
             {"kind": "time_bursts", "at_s": [1.0], "loss": 0.5, "duration_s": 0.2},
             {"kind": "bernoulli", "p": 0.1}]
    f = make_flow_loss(specs, seed=0, direction=ctl.UP, worker=0, rounds=10)
    assert f.mean_loss(0.0, 0.5, 0) == pytest.approx(0.1)  # Bernoulli alone
    assert f.mean_loss(0.0, 0.5, 3) == pytest.approx(1 - 0.3 * 0.9)  # and the burst iteration's 70%
    # the time burst covers 0.2 s of [0.9, 1.3): half of 0.2 / 0.4 lost, then the Bernoulli 10%
    assert f.mean_loss(0.9, 1.3, 0) == pytest.approx(1 - (1 - 0.25) * 0.9)
    t = np.linspace(0.9, 1.3, 400_000, endpoint=False)
    assert f.drops(t, 0).mean() == pytest.approx(1 - 0.75 * 0.9, abs=0.003)
    ge = make_flow_loss([{"kind": "gilbert_elliott", "p": 0.02, "r": 0.25}], seed=0, direction=ctl.UP, worker=0,
                        rounds=1)
    assert ge.mean_loss(0.0, 1.0, 0) == pytest.approx(0.02 / 0.27)
    tr = make_flow_loss([{"kind": "trace", "path": str(SAMPLES / "onoff-lognormal.loss.csv")}], seed=0,
                        direction=ctl.UP, worker=0, rounds=1)
    with pytest.raises(Exception, match="keyed by time"):
        tr.mean_loss(0.0, 1.0, 0)
