"""group > 1: the round level's opt-in aggregation of datagrams, and its error against group 1."""

from __future__ import annotations

import pytest

from dblp.sim import SimConfig, simulate
from dblp.protocol.wire import ParameterError


def test_group_is_close_to_every_datagram():
    base = SimConfig(model="resnet50", rounds=30, loss=[{"kind": "iteration_bursts", "at": [4, 12, 25], "loss": 0.7},
                                                        {"kind": "bernoulli", "p": 0.005}])
    for policy in ("dblp", "fixed"):
        cfg = base.with_(policy=policy)
        a = simulate(cfg).summary()
        b = simulate(cfg.with_(group=16)).summary()
        for k, tol in (("mean_round_s", 0.01), ("time_to_train_s", 0.01), ("p99_round_s", 0.03)):
            assert b[k] == pytest.approx(a[k], rel=tol), (policy, k)  # p99 of 30 rounds: the burst rounds
        assert b["lost"] == pytest.approx(a["lost"], abs=16 / cfg.layout.chunks + 1e-3)


def test_group_records_count_datagrams():
    cfg = SimConfig(model="resnet50", rounds=3, policy="reliable", group=16)
    res = simulate(cfg)
    n = cfg.layout.chunks
    for r in res.records:
        assert r.chunks == n and r.extra["group"] == 16
        got = r.up_received if r.role == "worker" else r.down_received
        assert got == n


def test_group_needs_the_round_level():
    with pytest.raises(ParameterError, match="group"):
        SimConfig(fidelity="packet", group=4)
