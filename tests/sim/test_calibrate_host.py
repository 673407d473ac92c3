"""Host constants that carry no link or pacing rate (dblp.sim.studies.calibrate).

A lossless round's per-datagram time is the slowest of the host's send cost, the pacing and
the links. The calibration used to take it as the host's cost, so on a network-bound run the
"host constants" were the run's own link and pacing rates (94% of the link's frame rate) and
capped any faster network. Here the 'emulated' runs are the simulator's own records with known
host costs, so what the calibration recovers can be compared with the truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dblp.sim import SimConfig, simulate
from dblp.sim.studies.calibrate import HOST_MARGIN, calibrate

#: the hosts of the fake runs (datagrams/s): slower than a 1 or 2 Gbit/s link's 82,600 / 165,200 frames/s
WORKER_PPS, SERVER_PPS = 16_000.0, 30_000.0


def _star_run(folder: Path, mbps: float, rounds: int = 10) -> SimConfig:
    """A run folder as scenarios/crosscheck.py writes it: the senders paced at 0.9 of their share of
    the server's link (--pace-share 0.9), records, config.json with the run's machine facts."""
    truth = SimConfig(model=1_000_000, workers=3, rounds=rounds, policy="fixed", p=0.008, bandwidth_bps=mbps * 1e6,
                      send_rate_bps=0.9 * mbps * 1e6 / 3, send_pps=WORKER_PPS, server_send_pps=SERVER_PPS,
                      queue_bytes=100 * 1514, wire=1, compute_s=0.005, reduce_s=0.002)
    (folder / "records").mkdir(parents=True)
    simulate(truth, records=str(folder / "records" / "all.jsonl"))
    (folder / "config.json").write_text(json.dumps({
        "workers": 3, "bw_mbps": mbps, "queue_bytes": truth.queue_bytes, "elements": 1_000_000, "seed": 0,
        "send_rate_bps": truth.send_rate_bps,  # the real transport's records carry it; the simulator's do not
        "_run": {"host": "testhost", "cpus": 2, "load": [0.5, 0.4, 0.3], "time": "2026-12-04T22:00:00+0000",
                 "git_commit": "0" * 40}}))
    return truth


def _frame_rate(cfg: SimConfig, bps: float) -> float:
    return bps / (cfg.wire_bytes * 8.0)


def test_a_calibration_carries_no_link_rate(tmp_path):
    """Two runs whose hosts bind, at 1 and 2 Gbit/s: the same host constants from both (within 3%,
    and of the truth), and neither is a link's or a pacer's frame rate."""
    cals = {}
    for mbps in (1000, 2000):
        truth = _star_run(tmp_path / f"{mbps}", mbps)
        cals[mbps], notes = calibrate(tmp_path / f"{mbps}")
        host = notes["estimates"]["host"]
        assert host["worker"]["binding"] and host["server"]["binding"]
        assert host["machine"]["run"]["host"] == "testhost" and host["machine"]["run"]["cpus"] == 2
        assert host["machine"]["run"]["load"] == [0.5, 0.4, 0.3]
        assert host["per_round"]["compute_s"] == pytest.approx(truth.compute_s, rel=0.05)
    a, b = cals[1000], cals[2000]
    assert a.send_pps == pytest.approx(b.send_pps, rel=0.03)
    assert a.server_pps == pytest.approx(b.server_pps, rel=0.03)
    assert a.send_pps == pytest.approx(WORKER_PPS, rel=0.03)
    assert a.server_pps == pytest.approx(SERVER_PPS, rel=0.03)
    for cal in (a, b):
        for bps in (1000e6, 2000e6, 0.9 * 1000e6 / 3, 0.9 * 2000e6 / 3):  # the links and the pacers
            rate = _frame_rate(cal, bps)
            assert abs(cal.send_pps / rate - 1) > 0.05 and abs(cal.server_pps / rate - 1) > 0.05


def test_a_network_bound_run_shows_no_host_cost_and_says_so(tmp_path):
    """At 200 Mbit/s the pacer (60 Mbit/s a worker: 4,950 datagrams/s) and the server's link bind, not
    the hosts: the calibration keeps the base's host rates (not the run's 94% of the link), says the
    run does not show them, and gives the bound it does show."""
    _star_run(tmp_path, 200)
    base = SimConfig()
    cal, notes = calibrate(tmp_path)
    host = notes["estimates"]["host"]
    assert not host["worker"]["binding"] and not host["server"]["binding"]
    assert cal.send_pps == base.send_pps and cal.server_pps == base.server_pps
    assert "not shown by this run" in host["worker"]["how"] and "kept" in host["worker"]["how"]
    pace = _frame_rate(cal, 0.9 * 200e6 / 3)
    assert 1 / host["worker"]["measured_datagram_s"] == pytest.approx(pace, rel=HOST_MARGIN)
    # the prediction of a faster network is then not capped at this run's link: 2 Gbit/s, fast hosts
    fast = cal.with_(bandwidth_bps=2e9, send_rate_bps=0.9 * 2e9 / 3, rounds=4)
    up = [r.up_latency_s / r.up_sent for r in simulate(fast).records if r.role == "worker" and r.round > 0]
    assert max(up) < 0.5 / pace
