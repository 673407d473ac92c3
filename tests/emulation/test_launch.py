"""The one launcher (dblp/runs/launch.py), the one round watcher (dblp/transport/watch.py) and the one
writer of nft rule text (emulation/nft.py): no root, local processes on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from dblp.protocol.records import read_records
from emulation import nft
from dblp.runs.launch import Launch, LaunchError, LocalRunner, RunArgs, server_argv, worker_argv
from dblp.transport.watch import RoundWatcher, follow


def test_local_launch_runs_a_server_and_workers_and_the_watcher_counts_iterations(tmp_path):
    args = RunArgs(workers=2, iterations=6, model=20_000, policy=["--policy", "reliable"], source="emulation",
                   compute_s=0.002, port=0)
    seen: list[int] = []
    with Launch(LocalRunner(), "srv", ["w1", "w2"], args, records_dir=tmp_path / "records",
                log_dir=tmp_path / "logs", bind="127.0.0.1") as run:
        assert run.port and run.port > 0
        with RoundWatcher(run.server_records, args.workers, seen.append, poll_s=0.005):
            run.wait(120)
    srv = list(read_records(tmp_path / "records" / "server.jsonl"))
    assert sorted((r.round, r.worker) for r in srv) == [(k, w) for k in range(6) for w in range(2)]
    for w in range(2):
        assert [r.round for r in read_records(tmp_path / "records" / f"worker{w}.jsonl")] == list(range(6))
    assert seen and seen == sorted(seen) and seen[-1] == 6  # iteration starts, in order, up to the end


def test_a_failing_worker_is_named_with_its_log(tmp_path):
    args = RunArgs(workers=1, iterations=3, model=1000, policy=["--policy", "reliable"], port=0,
                   worker_extra=["--no-such-flag"])
    with pytest.raises(LaunchError, match="worker0 on w1 exited with 2") as ei:
        with Launch(LocalRunner(), "srv", ["w1"], args, records_dir=tmp_path / "r", log_dir=tmp_path / "l",
                    bind="127.0.0.1") as run:
            run.wait(60)
    assert "no-such-flag" in str(ei.value)


def test_command_lines_state_their_units():
    a = RunArgs(workers=3, iterations=10, model="1e6", policy=["--policy", "dblp"], pace_bps=150e6,
                compute_s=0.005, peer_timeout_s=60)
    s, w = server_argv(a, "/r/s.jsonl"), worker_argv(a, 1, "10.0.0.1:29500", "/r/w1.jsonl")
    assert s[s.index("--pace") + 1] == "150000000bit" and s[s.index("--iterations") + 1] == "10"
    assert w[w.index("--compute") + 1] == "5ms" and w[w.index("--peer-timeout") + 1] == "60s"
    assert s[-2:] == ["--policy", "dblp"] and "--plain" in s and "--plain" in w


def test_follow_reads_only_complete_new_lines(tmp_path):
    """Each step waits for the follower to have read what it should (sleeps of 50 ms as barriers
    failed when the follower thread got the CPU late: stop was set before it read anything); the
    pause after the half line only gives it the chance to yield "b" alone, which would be wrong."""
    p = tmp_path / "f.jsonl"
    stop = threading.Event()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.extend(follow(p, stop, 0.001)))

    def until(n: int) -> None:
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.001)

    t.start()
    time.sleep(0.02)
    with open(p, "ab") as fh:
        fh.write(b"a\nb")
        fh.flush()
        until(1)
        time.sleep(0.05)
        fh.write(b"c\n")
    until(2)
    stop.set()
    t.join(2)
    assert got == [b"a", b"bc"]


def test_nft_text_and_counters():
    lines = nft.chain_lines("t", "ingress_eth0_udp", "ingress", "eth0") + \
        nft.drop_lines("t", "ingress_eth0_udp", nft.match("udp"), 0.7)
    assert 'add chain netdev t ingress_eth0_udp { type filter hook ingress device "eth0" priority -500; ' \
           'policy accept; }' in lines
    assert lines[-1] == ('add rule netdev t ingress_eth0_udp meta l4proto udp numgen random mod 10000 < 7000 '
                         'counter name "drop_ingress_eth0_udp" drop')
    assert nft.drop_lines("t", "c", "x", 1.0)[-1].endswith('counter name "drop_c" drop')  # no numgen at 100%
    assert len(nft.drop_lines("t", "c", "x", 0.0)) == 2  # count only
    assert nft.match("udp", (5000, 5999)) == "udp dport 5000-5999"
    with pytest.raises(ValueError):
        nft.match("all", (1, 2))
    raw = nft.parse_counters('{"nftables": [{"metainfo": {}}, {"counter": {"name": "seen_c", "packets": 10, '
                             '"bytes": 900}}, {"counter": {"name": "drop_c", "packets": 7, "bytes": 630}}]}')
    assert nft.chain_counters(raw, "c") == {"seen_packets": 10, "seen_bytes": 900, "dropped_packets": 7,
                                            "dropped_bytes": 630}
    assert nft.dropped_total(raw) == 7 and nft.parse_counters("") == {} and nft.parse_counters("garbage") == {}


def test_the_host_transports_are_launch_runners(tmp_path):
    """The inventory's transports (here the local one) start a run through the same Launch."""
    from emulation.hosts import make_transport, parse_inventory

    inv = parse_inventory({"run": {"transport": "local"}, "hosts": [{"name": "srv", "role": "server"},
                                                                     {"name": "w1", "role": "worker"}]})
    args = RunArgs(workers=1, iterations=3, model=5000, policy=["--policy", "reliable"], port=0)
    with make_transport(inv) as tr, Launch(tr, "srv", ["w1"], args, records_dir=tmp_path / "r",
                                           log_dir=tmp_path / "l", bind=tr.bind_address(inv.server)) as run:
        run.wait(60)
    assert [r.round for r in read_records(tmp_path / "r" / "worker0.jsonl")] == [0, 1, 2]
