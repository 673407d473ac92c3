"""Arrivals on a path of several ports stay in send order (FIFO), so delivery always moves on.

A leaf-spine run whose uplink is slower than the host links re-evaluates the
path port by port; before arrivals were kept sorted, delivery of the last
datagrams in flight rescheduled itself at the same instant forever (found by
the leaf-spine cross-check: a 1M-element run did not finish in 120 s).
"""

import numpy as np

from dblp.sim import SimConfig, simulate


def test_leafspine_with_a_slow_uplink_finishes_and_delivers_in_order():
    cfg = SimConfig(model=1_000_000, workers=3, rounds=10, bandwidth_bps=500e6, queue_bytes=151_400, wire=2,
                    topology="leafspine", racks=2, spines=1, uplink_bandwidth_bps=250e6, policy="fixed", p=0.008,
                    send_pps=12_261.2, server_send_pps=30_584.5, send_rate_bps=150e6, compute_s=0.00663,
                    loss=[{"kind": "iteration_bursts", "at": [3], "loss": 0.7}])
    res = simulate(cfg)
    rounds = sorted({r.round for r in res.records})
    assert rounds == list(range(10))
    lat = np.array([r.round_latency_s for r in res.records if r.role == "worker"])
    assert np.isfinite(lat).all() and (lat > 0).all()
