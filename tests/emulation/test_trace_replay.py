"""Trace replay in Mininet: the loss a replayed trace achieves on the data path.

* segments: ``scenarios/trace_replay.py`` replays a bursty ON/OFF trace on the
  server's link (both directions) against a *reliable* DBLP run, and the loss
  is measured from the run's RoundRecords. Why a reliable run: every datagram
  it sends is needed until delivered (retransmissions only of what the
  receiver's bitmap reports missing), so sent - delivered is exactly what the
  path lost; a bounded-loss run stops early and leaves datagrams in flight
  that would count as lost. The bar: within 20% (relative) of the
  trace's mean loss over the run.
* packets: the exact per-packet mode drops exactly the datagrams the trace
  names (the receiver reports every sequence number it got), once and looped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from traces import PacketTrace, onoff_segments, read_trace, write_trace

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

RECEIVER = r"""
import json, socket, struct, sys
port, ready, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", port))
open(ready, "w").close()
got = []
s.settimeout(30)
while True:
    try:
        d = s.recv(2048)
    except socket.timeout:
        break
    got.append(struct.unpack_from("!IQ", d)[1])
    s.settimeout(1.0)
json.dump(got, open(out, "w"))
"""


@pytest.mark.mininet
def test_replayed_trace_loss_from_reliable_run_records(tmp_path):
    # bursty: ON 5 ms at 30% / OFF 20 ms at 0 (lognormal), looped; mean ~6%
    tr = onoff_segments(duration_us=3_000_000, on_mean_us=5_000, off_mean_us=20_000, on_loss=0.3, seed=11)
    tr = type(tr)(tr.start_us, tr.loss, tr.duration_us, meta=tr.meta.with_(loop=True))
    path = write_trace(tr, tmp_path / "onoff.loss.csv")
    cmd = [PY, str(ROOT / "scenarios" / "trace_replay.py"), "--trace", str(path), "--policies", "reliable",
           "--model", "2e5", "--iterations", "40", "--workers", "2", "--bandwidth", "200",
           "--results", str(tmp_path), "--quiet",
           # paced by hand: a self-paced run's own probes and round 0's flood drop at the TBF queues
           # too, and the records count those beside the trace's (in a CI rehearsal: down
           # 9.09% in the records against 6.38% of the trace while sending, the nft rule 6.16%)
           "--pace-share", "0.9"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Loss replayed" in out.stdout
    (run,) = list(tmp_path.glob("trace_replay-*"))
    s = json.loads((run / "summary_runs.json").read_text())["reliable"]["loss"]
    want = s["requested_mean_loss"]  # the trace's mean over the rounds' span
    assert 0.03 < want < 0.10
    rec = s["records"]
    assert rec["up"]["sent"] > 20_000 and rec["down"]["sent"] > 20_000
    ws = s["while_sending"]  # the trace's mean over the windows each direction was on the link
    msg = (f"trace mean over the run {want:.4%}; while sending up {ws['up']:.4%}, down {ws['down']:.4%}; "
           f"records: up {rec['up']['loss']:.4%}, down {rec['down']['loss']:.4%}; "
           f"achieved schedule {s['achieved_mean_loss']:.4%}; kernel {s['kernel']}")
    print(msg)
    # Each direction samples the schedule only while it sends (half of each round), and the 5 ms
    # bursts make that half's mean differ from the run's by up to ~10% (one CI run: down 7.84% vs
    # 6.52%, +20%): hold each direction to the trace over its own windows, and both together (they
    # cover the rounds' span) to the run's mean. Per direction the records also oversample the lossy
    # windows: retransmission passes follow a burst and meet its tail (a CI rehearsal on an idle machine:
    # down 7.36% in the records vs 5.85% over the down windows, +26%; 2 of 3 rehearsals stayed within
    # 20%), so a direction gets 35% and the two together keep 20%.
    for direction in ("up", "down"):
        assert 0.5 * want < ws[direction] < 1.5 * want, msg
        assert abs(rec[direction]["loss"] / ws[direction] - 1) < 0.35, msg
    both = 1 - ((rec["up"]["delivered"] + rec["down"]["delivered"]) / (rec["up"]["sent"] + rec["down"]["sent"]))
    assert abs(both / want - 1) < 0.20, msg
    # the schedule the replayer installed tracks the trace closely
    assert abs(s["achieved_mean_loss"] / want - 1) < 0.05, msg
    # what was applied is on record: every change, and the achieved schedule as a trace file
    events = [json.loads(line) for line in open(run / "reliable" / "replay.jsonl")]
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop"
    changes = [e for e in events if e["event"] == "change"]
    assert len(changes) > 50 and all(e["t"] >= e.get("t_aim", e["t_due"]) - 1e-3 for e in changes)
    ach = read_trace(run / "reliable" / "achieved.loss.csv")
    assert ach.meta.source.startswith("emulation.replay") and 0.03 < ach.mean_loss() < 0.10
    for f in ("latency.png", "cdf.png", "loss.png", "summary.csv", "rounds.csv", "rounds.jsonl"):
        assert (run / f).stat().st_size > 0


def _transfer(net, tmp_path: Path, count: int, port: int = 9100) -> set[int]:
    ready, res = tmp_path / f"ready{port}", tmp_path / f"got{port}.json"
    script = tmp_path / "receiver.py"
    script.write_text(RECEIVER)
    rx = net.popen("srv", [PY, str(script), str(port), str(ready), str(res)])
    t_end = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < t_end, "receiver did not bind"
        time.sleep(0.01)
    sent = json.loads(net.cmd("w1", [PY, "-m", "emulation.udptool", "send", "--dst", net.ip("srv"), "--port",
                                     str(port), "--count", str(count), "--size", "200", "--pace", "10M"]))
    assert sent["errors"] == 0
    rx.wait(timeout=30)
    return set(json.loads(res.read_text()))


@pytest.mark.mininet
def test_packet_trace_drops_exactly_the_traced_packets(tmp_path):
    from emulation.loss import LossController, LossTarget
    from emulation.net import EmuNet
    from emulation.replay import TraceReplayer
    from topologies.star import StarTopo

    pk = read_trace(ROOT / "traces" / "samples" / "gilbert-elliott-netem.pkts")
    assert isinstance(pk, PacketTrace)
    n = len(pk) + 1500
    with EmuNet(StarTopo(n=1, bw=100, buffer_pkts=200), name="replaytest") as net, LossController(net) as lc:
        target = [LossTarget("srv", "ingress", "udp")]
        for loop in (False, True):
            with TraceReplayer(lc, pk, target, tmp_path / f"pk{loop}.jsonl", loop=loop) as rp:
                got = _transfer(net, tmp_path, n, port=9100 + loop)
            k = np.arange(n)
            want_lost = set(np.flatnonzero(pk.drops[k % len(pk)] if loop else
                                           np.concatenate((pk.drops, np.zeros(n - len(pk), bool)))).tolist())
            assert set(range(n)) - got == want_lost, f"loop={loop}"
            kern = rp.summary()["kernel"]["srv:ingress:udp"]
            assert kern["seen"] == n and kern["dropped"] == len(want_lost)
        # a short segments trace played once ends by itself and removes its rules
        seg = onoff_segments(duration_us=300_000, on_mean_us=20_000, off_mean_us=20_000, on_loss=0.5, seed=2)
        with TraceReplayer(lc, seg, target) as rp:
            assert rp.wait(30)  # 0.3 s of trace; the margin is for nft calls on a loaded 2-core machine
        assert rp.table not in net.cmd("srv", ["nft", "list", "tables"])
        assert abs(rp.summary()["achieved_mean_loss"] - seg.mean_loss()) < 0.05 * seg.mean_loss() + 0.002
