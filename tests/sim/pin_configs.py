"""Small configurations whose simulated outcome is pinned (tests/sim/data/engine_pins*.json).

``engine_pins_original.json`` was recorded from the engines before their
cost was made linear in the worker count; ``engine_pins.json`` from the
rewritten round level with the port re-evaluating every pass at every
change (``dblp.sim.engines.fast.EAGER_PORT``). The pins hold every record's passes,
counts and latencies, so a rewrite that changes a result shows up.
Regenerate only for an intended change of the model, and say so.
"""

from __future__ import annotations

from typing import Any

_BURSTS = {"kind": "iteration_bursts", "at": [2, 5, 9], "loss": 0.7}

PIN_CONFIGS: dict[str, dict[str, Any]] = {
    "w3_bursts": dict(model=200_000, workers=3, rounds=20, freq=5,
                      loss=[_BURSTS, {"kind": "bernoulli", "p": 0.01}]),
    "w8_incast": dict(model=200_000, workers=8, rounds=10, freq=5, server_bandwidth_bps=5e9,
                      queue_bytes=30 * 1514, loss=[{"kind": "bernoulli", "p": 0.005}]),
    "w16_fixed": dict(model=100_000, workers=16, rounds=6, policy="fixed", p=0.02, queue_bytes=50 * 1514,
                      compute_s=1e-3, compute_jitter_s=2e-4, loss=[_BURSTS]),
    "w5_reliable_timebursts": dict(model=150_000, workers=5, rounds=8, policy="reliable", host_slice=256,
                                   loss=[{"kind": "time_bursts", "at_s": [0.01, 0.03], "loss": 0.5,
                                          "duration_s": 0.004}]),
    "w4_paced": dict(model=150_000, workers=4, rounds=8, send_rate_bps=2e9, freq=5, loss=[_BURSTS]),
    "w12_slowserver": dict(model=60_000, workers=12, rounds=6, server_send_pps=300_000.0, send_pps=150_000.0,
                           reduce_s=5e-4, loss=[{"kind": "bernoulli", "p": 0.02}]),
    "packet_w3": dict(model=40_000, workers=3, rounds=6, fidelity="packet", freq=5,
                      loss=[_BURSTS, {"kind": "bernoulli", "p": 0.01}]),
    "packet_w6_incast": dict(model=30_000, workers=6, rounds=4, fidelity="packet", server_bandwidth_bps=4e9,
                             queue_bytes=20 * 1514),
}

FIELDS = ("up_latency_s", "down_latency_s", "round_latency_s", "up_sent", "up_passes", "up_received",
          "down_sent", "down_passes", "down_received", "stale", "t_start")


def fingerprint(res: Any) -> dict:
    """What is pinned of a run: its end time and every record's fields above."""
    recs = sorted(res.records, key=lambda r: (r.role, r.worker, r.round))
    return {"end_time_s": res.end_time_s,
            "records": [[r.role, r.worker, r.round] + [getattr(r, f) for f in FIELDS] for r in recs]}
