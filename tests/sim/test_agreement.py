"""Packet level (one event per datagram) and round level (numpy per pass) on the same configurations."""

from __future__ import annotations

import numpy as np
import pytest

from dblp.sim import simulate

from sim_helpers import small, worker_mean

CASES = {
    # Bernoulli loss plus three whole-iteration 70% bursts, DBLP switching tolerances
    "bursts": dict(rounds=36, loss=[{"kind": "bernoulli", "p": 0.02},
                                    {"kind": "iteration_bursts", "at": [6, 17, 28], "loss": 0.7}]),
    # Gilbert-Elliott loss under the baseline's fixed 0.8%
    "gilbert": dict(rounds=20, policy="fixed", loss=[{"kind": "gilbert_elliott", "p": 0.01, "r": 0.25}]),
    # incast: workers at line rate into the server's link, drop-tail queue overflowing
    "incast": dict(rounds=12, send_pps=2e6, policy="fixed", p=0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mean_round_latency_and_received_fractions_agree(case):
    cfg = small(**CASES[case])
    rl = simulate(cfg.with_(fidelity="round"))
    pk = simulate(cfg.with_(fidelity="packet"))
    a, b = rl.summary(), pk.summary()
    assert a["mean_round_s"] == pytest.approx(b["mean_round_s"], rel=0.05), (a, b)
    # received fractions: the tolerance arithmetic decides them in both
    for attr in ("up_received", "down_received"):
        fa = worker_mean(rl.records, attr) / cfg.layout.chunks
        fb = worker_mean(pk.records, attr) / cfg.layout.chunks
        assert fa == pytest.approx(fb, abs=0.005), (attr, fa, fb)
    # the policy saw the same regime sequence
    ta = [r.tolerance_down for r in rl.records if r.role == "server"]
    tb = [r.tolerance_down for r in pk.records if r.role == "server"]
    assert sorted(ta) == sorted(tb)


def test_send_latency_per_round_tracks():
    """Not only the mean: the per-iteration send latency follows the same curve."""
    cfg = small(rounds=16, loss=[{"kind": "iteration_bursts", "at": [4, 11], "loss": 0.7}])
    rl = simulate(cfg.with_(fidelity="round")).records
    pk = simulate(cfg.with_(fidelity="packet")).records
    for k in range(cfg.rounds):
        a = np.mean([r.up_latency_s for r in rl if r.role == "worker" and r.round == k])
        b = np.mean([r.up_latency_s for r in pk if r.role == "worker" and r.round == k])
        assert a == pytest.approx(b, rel=0.05), (k, a, b)
