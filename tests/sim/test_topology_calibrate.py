"""Calibrating on a leaf-spine run: the refinement simulates the run's network, and a worker's
send cost comes from its single-pass records only (dblp.sim.studies.calibrate)."""

from __future__ import annotations

import json

import pytest

from dblp.sim import SimConfig, simulate
from dblp.sim.studies.calibrate import calibrate

from sim_helpers import worker_mean


def _leafspine_run(folder, truth: SimConfig) -> None:
    """A run folder as scenarios/crosscheck.py writes it: records, and config.json with the
    scenario's keys (rates in bit/s, the uplink under ``uplink_bandwidth``)."""
    (folder / "records").mkdir(parents=True)
    simulate(truth, records=str(folder / "records" / "all.jsonl"))
    (folder / "config.json").write_text(json.dumps({
        "workers": truth.workers, "bw_mbps": truth.bandwidth_bps / 1e6, "queue_bytes": truth.queue_bytes,
        "topology": "leafspine", "racks": truth.racks, "uplink_bandwidth": truth.uplink_bandwidth_bps,
        "elements": 1_000_000, "seed": truth.seed}))


def test_calibrate_on_an_oversubscribed_leaf_spine_recovers_the_hosts(tmp_path):
    """Rack 2's two workers (13,000 datagrams/s each, 157 Mbit/s) overflow their 250 Mbit/s
    uplink in every round and need a second pass; the rack-1 worker never does. Its
    single-pass records give the send cost; the rack-2 ones (their per-datagram time holds the
    uplink's drops and the second pass, 83 us against 77) would make the hosts ~8% slower, and
    a star refinement would then have nothing to match them to."""
    truth = SimConfig(model=1_000_000, workers=3, rounds=12, policy="fixed", p=0.008, topology="leafspine",
                      racks=2, bandwidth_bps=500e6, uplink_bandwidth_bps=250e6, send_pps=13_000,
                      server_send_pps=30_000, queue_bytes=100 * 1514, wire=1)
    res = simulate(truth)
    rack2 = [r for r in res.records if r.role == "worker" and r.worker != 1 and r.round > 0]
    assert all(r.up_passes >= 2 for r in rack2)
    _leafspine_run(tmp_path, truth)
    cfg, _ = calibrate(tmp_path)
    assert (cfg.topology, cfg.racks, cfg.uplink_bandwidth_bps) == ("leafspine", 2, 250e6)
    assert cfg.send_pps == pytest.approx(truth.send_pps, rel=0.02)
    assert cfg.server_pps == pytest.approx(truth.server_pps, rel=0.03)
    for attr in ("round_latency_s", "up_latency_s", "up_passes"):
        assert worker_mean(simulate(cfg).records, attr) == pytest.approx(worker_mean(res.records, attr), rel=0.03)
