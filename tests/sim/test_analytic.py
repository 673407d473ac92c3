"""With no loss, the round time is the analytic value: bytes / rate plus the overheads."""

from __future__ import annotations

import pytest

from dblp.sim import SimConfig, simulate

from sim_helpers import SMALL, analytic_round_s, worker_mean

RATES = dict(bandwidth_bps=10e9, send_pps=200_000, delay_s=50e-6)


@pytest.mark.parametrize("fidelity", ["round", "packet"])
@pytest.mark.parametrize("workers,policy,p", [(1, "reliable", 0.0), (3, "reliable", 0.0), (1, "fixed", 0.4)])
def test_lossless_round_time_is_analytic(fidelity, workers, policy, p):
    cfg = SimConfig(model=SMALL, workers=workers, rounds=6, policy=policy, p=p, fidelity=fidelity, **RATES)
    res = simulate(cfg)
    steady = set(range(1, cfg.rounds))
    got = worker_mean(res.records, "round_latency_s", steady)
    assert got == pytest.approx(analytic_round_s(cfg, p), rel=0.02)
    assert all(r.up_passes == 1 for r in res.records if r.role == "worker")


def test_lossless_paper_size_round_level():
    """25M parameters (69,061 datagrams per direction), 3 workers, 10 Gbit/s links."""
    cfg = SimConfig(model="resnet50", workers=3, rounds=4, policy="reliable", compute_s=0.01, **RATES)
    res = simulate(cfg)
    got = worker_mean(res.records, "round_latency_s", {1, 2, 3}) + cfg.compute_s
    assert got == pytest.approx(analytic_round_s(cfg, 0.0), rel=0.02)
    # time-to-train: rounds x period, give or take the first round's start
    assert res.end_time_s == pytest.approx(cfg.rounds * analytic_round_s(cfg, 0.0), rel=0.02)
