"""Run recorder: one folder holding config, bursts, counters and per-round records."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from emu_helpers import udp_transfer

REPO = Path(__file__).resolve().parents[2]

WRITER = """
import sys
from dblp.protocol.records import RoundRecord, RecordWriter
role, worker, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with RecordWriter(path) as w:
    for r in range(3):
        w.write(RoundRecord(source="emulation", role=role, worker=worker, round=r,
                            up_latency_s=0.01 * (r + 1), extra={"burst": r == 1}))
"""


def test_recorder_without_net(tmp_path):
    from dblp.protocol.records import RoundRecord, RecordWriter
    from emulation.recorder import RunRecorder

    rec = RunRecorder("unit", {"iterations": 2}, root=tmp_path)
    assert rec.path.name.startswith("unit-")
    with RecordWriter(rec.record_path("worker", 1)) as w:
        w.write(RoundRecord(source="emulation", role="worker", worker=1, round=1))
        w.write(RoundRecord(source="emulation", role="worker", worker=1, round=0))
    summary = rec.finish()
    assert summary["records"] == 2 and summary["rounds"] == 2
    lines = (rec.path / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1]
    cfg = json.loads((rec.path / "config.json").read_text())
    assert cfg["iterations"] == 2 and "kernel" in cfg["_run"]
    # a second run in the same second gets its own folder
    assert RunRecorder("unit", root=tmp_path).path != rec.path


@pytest.mark.mininet
def test_run_folder_collects_everything(tmp_path, ready_file):
    from emulation.bursts import BurstInjector, IterationBurst
    from emulation.loss import LossController, LossTarget
    from emulation.net import EmuNet
    from emulation.recorder import RunRecorder
    from topologies.star import StarTopo

    rec = RunRecorder("emu", {"bw": 100}, root=tmp_path)
    target = LossTarget("srv")
    with EmuNet(StarTopo(n=2, bw=100)) as net, LossController(net) as lc:
        lc.set_loss(target, 0.0)  # counters from the start
        rec.snapshot("start", net=net, loss=lc)
        with BurstInjector(lc, [IterationBurst(1, 0.7)], [target], rec.bursts_path) as inj:
            for k in range(3):
                inj.on_iteration(k)
                udp_transfer(net, "w1", "srv", 9500 + k, ready_file, count=200, rate_mbps=20)
        env_path = f"PYTHONPATH={REPO}"
        for role, worker, host in (("server", 0, "srv"), ("worker", 1, "w1"), ("worker", 2, "w2")):
            path = rec.record_path(role, worker if role == "worker" else None)
            net.cmd(host, ["env", env_path, sys.executable, "-c", WRITER, role, worker, path])
        summary = rec.finish(net=net, loss=lc)
        srv_port = net.switch_port("srv")
    files = sorted(p.name for p in rec.path.iterdir())
    assert files == ["bursts.jsonl", "config.json", "counters_end.json", "counters_start.json",
                     "records", "rounds.jsonl", "summary.json"]
    assert sorted(os.listdir(rec.records_dir)) == ["server.jsonl", "worker1.jsonl",
                                                  "worker2.jsonl"]
    assert summary["records"] == 9 and summary["rounds"] == 3
    assert summary["burst_events"] == 4  # start, apply, remove, stop
    nft = summary["nft_delta"][target.label()]
    assert nft["seen_packets"] == 600
    # 70% of 200 datagrams, drawn by the kernel (nft numgen random, no seed): 140 +- 6.5. The window of
    # 120-160 it had failed once in ~650 runs (binomial tails: 1.5e-3); 100-180 once in ~1e9 (1.1e-9)
    assert 0.5 * 200 <= nft["dropped_packets"] <= 0.9 * 200
    # the switch port towards srv forwarded all 600 datagrams (the drops happen at srv's ingress)
    assert summary["qdisc_delta"][srv_port]["sent_packets"] >= 600
    end = json.loads((rec.path / "counters_end.json").read_text())
    assert end["qdisc"][srv_port]["dropped"] == 0
    assert end["shapes"][srv_port]["bw_mbps"] == 100.0
