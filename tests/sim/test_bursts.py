"""A whole-iteration 70% burst costs each tolerance the passes its arithmetic predicts."""

from __future__ import annotations

import pytest

from dblp.sim import SimConfig, simulate

from sim_helpers import passes_for

BURST = 0.7


def test_prediction_is_the_papers():
    assert passes_for(0.008, BURST) == 14  # baseline (EfficientNetB0's 0.8%)
    assert passes_for(0.408, BURST) == 3  # DBLP's P_high = 0.8% + 40%


@pytest.mark.parametrize("p", [0.008, 0.024, 0.408, 0.424])
def test_burst_passes_round_level_paper_size(p):
    cfg = SimConfig(model="resnet50", rounds=3, policy="fixed", p=p,
                    loss=[{"kind": "iteration_bursts", "at": [1], "loss": BURST}])
    res = simulate(cfg)
    k = passes_for(p, BURST)
    for r in res.records:
        if r.round == 1:
            got = r.up_passes if r.role == "worker" else r.down_passes
            assert got == k, (r.role, r.worker, got, k)
            frac = (r.up_received if r.role == "worker" else r.down_received) / r.chunks
            assert frac >= 1 - p  # the stop rule held
        elif r.role == "worker":
            assert r.up_passes == 1


def test_dblp_outside_the_clr_pays_p_high():
    """DBLP with no critical regime after the start: the burst meets P_high both ways."""
    cfg = SimConfig(model="resnet50", rounds=5, policy="dblp", freq=1, eta=1e9, norm_model="sequence",
                    loss=[{"kind": "iteration_bursts", "at": [3], "loss": BURST}])
    res = simulate(cfg)
    p_high = cfg.effective_p_high
    wk = [r for r in res.records if r.role == "worker" and r.round == 3]
    sv = [r for r in res.records if r.role == "server" and r.round == 3]
    assert all(r.tolerance_up == pytest.approx(p_high) for r in wk)
    assert all(r.up_passes == passes_for(p_high, BURST) for r in wk)
    assert all(r.down_passes == passes_for(p_high, BURST) for r in sv)


def test_burst_passes_packet_level():
    cfg = SimConfig(model=1_000_000, rounds=2, policy="fixed", p=0.408, fidelity="packet",
                    loss=[{"kind": "iteration_bursts", "at": [1], "loss": BURST}])
    res = simulate(cfg)
    assert all(r.up_passes == 3 for r in res.records if r.role == "worker" and r.round == 1)
    assert all(r.down_passes == 3 for r in res.records if r.role == "server" and r.round == 1)
