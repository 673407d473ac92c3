"""The simulator's receive cost and sender batching (the cross-check's missed terms, docs/crosscheck.md).

A datagram's cost has a part per datagram sent and a part per datagram delivered: on the emulator's
shared cores a datagram a burst drops before its receiver costs only the first, so the broadcast of
a burst round goes faster per datagram than a lossless one. And the transport's paced sender leaves
in batches (its loop sleeps, then sends what its bucket allows) into its own drop-tail egress queue,
which a 20-packet TBF cannot hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dblp.sim import SimConfig, simulate
from dblp.sim.studies.calibrate import calibrate

SEND_S, RECV_S = 30e-6, 20e-6  # a host's send part and the receiving host's part of one datagram
BURST = {"kind": "iteration_bursts", "at": [3], "loss": 0.7}


def _per_datagram(recs, rnd: int) -> float:
    """The server's broadcast time per datagram in round ``rnd`` (the calibration's statistic)."""
    sv = [r for r in recs if r.role == "server" and r.round == rnd]
    return max(r.down_latency_s for r in sv) / sum(r.down_sent for r in sv)


@pytest.mark.parametrize("fidelity", ["round", "packet"])
def test_receive_part_is_charged_only_for_delivered_datagrams(fidelity):
    """Hosts that bind (10 Gbit/s links): a lossless broadcast takes send + receive a datagram, as the
    send cost alone of the same total does (to 1e-9); a 70% burst's broadcast send + 0.3 receive."""
    common = dict(model=200_000, workers=3, rounds=5, bandwidth_bps=10e9, loss=[BURST], fidelity=fidelity,
                  policy="baseline", p=0.008)
    split = simulate(SimConfig(**common, send_pps=1 / SEND_S, recv_cost_s=RECV_S, server_recv_cost_s=RECV_S)).records
    whole = simulate(SimConfig(**common, send_pps=1 / (SEND_S + RECV_S))).records
    assert _per_datagram(split, 2) == pytest.approx(SEND_S + RECV_S, rel=0.03)
    assert _per_datagram(split, 2) == pytest.approx(_per_datagram(whole, 2), rel=1e-9)
    assert _per_datagram(split, 3) == pytest.approx(SEND_S + 0.3 * RECV_S, rel=0.05)  # 36 us, not 50
    assert _per_datagram(whole, 3) == pytest.approx(SEND_S + RECV_S, rel=0.05)
    up = [r.up_latency_s / r.up_sent for r in split if r.role == "worker" and r.round == 3]
    assert max(up) == pytest.approx(SEND_S + 0.3 * RECV_S, rel=0.10)  # an upload's receiver is the server


def _burst_run(folder: Path) -> SimConfig:
    """A run folder as scenarios/crosscheck.py writes it, its 'Mininet' the simulator with a known split:
    the broadcast's datagrams cost the workers 15 of 45 us, the uploads' cost the server nothing."""
    truth = SimConfig(model=1_000_000, workers=3, rounds=12, policy="baseline", p=0.008, bandwidth_bps=1e9,
                      send_rate_bps=0.9 * 1e9 / 3, send_pps=16_000.0, server_send_pps=1 / 30e-6, recv_cost_s=15e-6,
                      queue_bytes=100 * 1514, wire=1, compute_s=0.005, reduce_s=0.002,
                      loss=[{"kind": "iteration_bursts", "at": [5], "loss": 0.7},
                            {"kind": "iteration_bursts", "at": [9], "loss": 0.7}])
    (folder / "records").mkdir(parents=True)
    simulate(truth, records=str(folder / "records" / "all.jsonl"))
    (folder / "config.json").write_text(json.dumps({
        "workers": 3, "bw_mbps": 1000, "queue_bytes": truth.queue_bytes, "elements": 1_000_000, "seed": 0,
        "send_rate_bps": truth.send_rate_bps}))
    events = [{"event": "start", "t": 0.0}]
    for b, k in enumerate((5, 9)):
        events += [{"event": "apply", "kind": "iteration", "burst": b, "iteration": k, "loss": 0.7, "t": 1.0 + b},
                   {"event": "remove", "burst": b, "iteration": k + 1, "t": 1.5 + b}]
    (folder / "bursts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return truth


def test_calibration_splits_send_and_receive_from_burst_rounds(tmp_path):
    """A lossless round gives send + receive, a burst round send + 0.3 receive: the calibration recovers
    the workers' 15 us (within 10%) and the server's 30 us send part, and finds no receive part upstream."""
    _burst_run(tmp_path)
    cal, notes = calibrate(tmp_path)
    host = notes["estimates"]["host"]
    assert host["server"]["binding"] and host["worker"]["binding"]
    assert cal.recv_cost_s == pytest.approx(15e-6, rel=0.10)
    assert 1 / cal.server_pps == pytest.approx(30e-6, rel=0.10)
    assert 1 / cal.server_pps + cal.recv_cost_s == pytest.approx(45e-6, rel=0.03)
    assert host["server"]["receive"].startswith("fitted") and host["server"]["receive_s"] == cal.recv_cost_s
    assert cal.server_recv_cost_s < 0.05 / cal.send_pps  # the uploads' burst rounds are no faster
    assert 1 / cal.send_pps + cal.server_recv_cost_s == pytest.approx(1 / 16_000, rel=0.03)
    plain, _ = calibrate(tmp_path, refine=False)  # no simulation asked for: no split
    assert plain.recv_cost_s == 0.0 and plain.server_recv_cost_s == 0.0


def test_sender_batching_overflows_a_20_packet_queue():
    """200 Mbit/s, 20-packet queues, senders paced at 0.9 of their share (as the cross-check's Mininet
    run): smooth paced flows never overflow (one pass each way); a loop that wakes every 4 ms sends
    batches into its own egress queue and the broadcast needs retransmission passes (Mininet: 2.5)."""
    common = dict(model=1_000_000, workers=3, rounds=4, bandwidth_bps=200e6, queue_bytes=20 * 1514,
                  send_rate_bps=0.9 * 200e6 / 3, send_pps=28_000.0, server_send_pps=31_000.0, fidelity="packet",
                  policy="baseline", p=0.008)
    for wake, down_lo, down_hi in ((0.0, 1, 1), (0.004, 2, 6)):
        recs = simulate(SimConfig(**common, wake_s=wake)).records
        down = [r.down_passes for r in recs if r.role == "server" and r.round > 0]
        assert down_lo <= min(down) and max(down) <= down_hi, (wake, down)
    # the round level batches the bucket's releases too (no own egress queue there): same passes, the
    # rate unchanged; each way a pass waits up to a wake more and starts with the real sender's shallower
    # bucket (5 ms of 60 Mbit/s, 37.5 kB, against the simulator's 64 KiB: ~3.5 ms): within 5 wakes of ~1 s
    smooth = simulate(SimConfig(**{**common, "fidelity": "round"})).records
    batched = simulate(SimConfig(**{**common, "fidelity": "round"}, wake_s=0.004)).records
    for a, b in zip(smooth, batched):
        assert (a.up_passes, a.down_passes) == (b.up_passes, b.down_passes)
        assert 0 <= b.round_latency_s - a.round_latency_s < 5 * 0.004


def test_negative_receive_cost_or_wake_is_refused():
    for name in ("recv_cost_s", "server_recv_cost_s", "wake_s"):
        with pytest.raises(Exception, match=name):
            SimConfig(**{name: -1e-6})


def test_self_pacing_reaches_the_simulated_pacers():
    """self_pacing hands the sessions no pacer: the core's AutoPacer sets each worker's rate from its
    passes (R11), as the transport's --pace auto. 6 workers, 100 Mbit/s: the upload rate starts
    unlimited (0), is set after the first lossy pass and rises (measured: 0, 0, 25.1, 31.7, 40.3, 50.0
    Mbit/s in rounds 0-5); a fixed rate stays."""
    common = dict(model=300_000, workers=6, rounds=6, bandwidth_bps=100e6, fidelity="packet", policy="baseline",
                  p=0.008)
    recs = simulate(SimConfig(**common, self_pacing=True)).records
    rates = [r.send_rate_bps for r in sorted(recs, key=lambda r: r.round) if r.role == "worker" and r.worker == 0]
    assert rates[0] == 0.0 and 10e6 < rates[2] < rates[-1] < 100e6
    fixed = simulate(SimConfig(**common, send_rate_bps=15e6)).records
    assert {r.send_rate_bps for r in fixed if r.role == "worker"} == {15e6}
    with pytest.raises(Exception, match="packet level only"):
        SimConfig(**{**common, "fidelity": "round"}, self_pacing=True)
    with pytest.raises(Exception, match="exclude each other"):
        SimConfig(**common, self_pacing=True, send_rate_bps=15e6)
