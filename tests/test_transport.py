"""The real transport on loopback: server and worker processes, real sockets."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from procs import free_port, reports, start_server, start_verify_workers
from dblp.protocol.policy import FixedPolicy, ReliablePolicy
from dblp.protocol.records import read_records
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.protocol.wire import ChunkLayout, encode_chunks
from dblp.transport.worker import Worker, WorkerError

ELEMENTS = 5_000_000
ROUNDS = 20
is_root = os.geteuid() == 0 and shutil.which("nft") is not None


def test_lossless_5m_three_worker_processes_exact_mean(tmp_path):
    port = free_port()
    srv = start_server(port, "--workers", "3", "--policy", "reliable", "--iterations", str(ROUNDS),
                       records=str(tmp_path / "server.jsonl"))
    try:
        reps = reports(start_verify_workers(port, 3, ELEMENTS, ROUNDS), timeout=240)
        srv.wait(timeout=30)
    finally:
        srv.kill()
    assert srv.returncode == 0, srv.stderr.read()
    for r in reps:
        assert r["rounds"] == ROUNDS
        assert r["bad_chunks"] == 0
        assert r["exact_rounds"] == ROUNDS  # bit-exact mean every round
    recs = list(read_records(tmp_path / "server.jsonl"))
    assert len(recs) == 3 * ROUNDS
    assert all(rec.up_received == rec.chunks and rec.down_received == rec.chunks for rec in recs)


@pytest.fixture
def lossy_netns():
    """A network namespace whose loopback drops 25% of UDP datagrams (nftables)."""
    if not is_root:
        pytest.skip("needs root and nft for a loss rule in a network namespace")
    from emulation.lossyns import LossyLoopback

    with LossyLoopback(0.25) as ns:
        yield ns.name


def test_lossy_rounds_zero_fill_and_threshold(lossy_netns, tmp_path):
    """25% loss, fixed tolerance 10%: every chunk is exact or zero, >= 90% arrive each round."""
    port = free_port()
    rounds = 20
    srv = start_server(port, "--workers", "3", "--policy", "fixed", "--p", "0.1", "--iterations", str(rounds),
                       "--plain", netns=lossy_netns, records=str(tmp_path / "server.jsonl"))
    try:
        reps = reports(start_verify_workers(port, 3, ELEMENTS, rounds, "--plain", netns=lossy_netns), timeout=400)
        srv.wait(timeout=30)
    finally:
        srv.kill()
    assert srv.returncode == 0, srv.stderr.read()
    for r in reps:
        assert r["rounds"] == rounds and r["bad_chunks"] == 0
        assert r["min_down_frac"] >= 0.9
        assert min(r["up_fracs"]) >= 0.9
        assert r["min_full_frac"] < 1.0  # loss really happened and was zero-filled
    recs = list(read_records(tmp_path / "server.jsonl"))
    assert all(rec.up_frac >= 0.9 and rec.down_frac >= 0.9 for rec in recs)
    assert max(rec.down_passes for rec in recs) >= 2


def _thread_server(**kw) -> tuple[ParameterServer, threading.Thread, dict]:
    cfg = ServerConfig(host="127.0.0.1", port=0, **kw)
    srv = ParameterServer(cfg)
    result: dict = {}

    def run():
        try:
            result["rounds"] = srv.serve()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return srv, th, result


def test_fuzzed_datagrams_never_crash_or_corrupt():
    n = 50_000
    srv, th, result = _thread_server(workers=1, policy=ReliablePolicy(), peer_timeout=10)
    rng = np.random.default_rng(0)
    with Worker("127.0.0.1", srv.port, elements=n) as w:
        g = rng.standard_normal(n).astype(np.float32)
        assert np.array_equal(w.allreduce(g), g)
        srv_addr = w.peer.udp_addr
        lay = ChunkLayout(n)
        # Replays of the round just finished: valid in every byte but the round.
        # (A valid chunk of the *open* round from the registered peer is, by
        # design, indistinguishable from the worker's own and is accepted.)
        rows, lengths = encode_chunks(g, lay, np.arange(lay.chunks), run_id=int(w.meta["run_id"]), sender=0,
                                      round_no=w.round - 1)
        valid = [rows[i, : lengths[i]].tobytes() for i in range(lay.chunks)]
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent = 0
        for i in range(3000):
            kind = i % 5
            if kind == 0:
                d = rng.bytes(int(rng.integers(0, 1600)))
            elif kind == 1:  # bit flips in a valid datagram
                b = bytearray(valid[i % len(valid)])
                for j in rng.integers(0, len(b), 3):
                    b[j] ^= 1 << int(rng.integers(0, 8))
                d = bytes(b)
            elif kind == 2:
                d = valid[i % len(valid)][: int(rng.integers(0, len(valid[0])))]
            elif kind == 3:  # a stale round
                r2, l2 = encode_chunks(g * 0 + 99, lay, np.arange(3), run_id=int(w.meta["run_id"]), sender=0,
                                       round_no=w.round + 50)
                d = r2[0, : l2[0]].tobytes()
            else:
                d = valid[i % len(valid)]
            # from the registered peer's own address (deep checks) and from a stranger
            (w.peer.udp.sock if i % 2 else stranger).sendto(d, srv_addr)
            sent += 1
        time.sleep(0.2)
        for r in range(3):  # the server keeps serving exact rounds
            g = rng.standard_normal(n).astype(np.float32)
            assert np.array_equal(w.allreduce(g), g)
        drops = srv.workers[0].peer.receiver.total_drops
    th.join(timeout=10)
    assert "error" not in result
    assert drops.foreign >= 1500 * 0.9  # the stranger's half (random ones may also fail earlier checks)
    assert drops.unauthenticated + drops.malformed + drops.wrong_length + drops.stale + drops.duplicate > 500
    assert drops.corrupt == 0  # the authenticated wire: a bad tag is unauthenticated, never a CRC matter


def test_bad_parameters_are_refused_by_name():
    from dblp.cli.commands import main

    assert main(["server", "--policy", "fixed", "--p", "1.0", "--port", "0"]) == 2
    assert main(["server", "--policy", "dblp", "--eta", "-0.5", "--port", "0"]) == 2
    assert main(["server", "--mtu", "40", "--port", "0"]) == 2
    with pytest.raises(Exception, match="peer_timeout"):
        ServerConfig(peer_timeout=0)


def test_dead_worker_gives_the_server_a_clear_error(tmp_path):
    port = free_port()
    rec = tmp_path / "server.jsonl"
    srv = start_server(port, "--workers", "3", "--policy", "reliable", "--peer-timeout", "5", records=str(rec))
    ws = start_verify_workers(port, 3, 200_000, 10_000)
    try:
        deadline = time.monotonic() + 60  # kill once rounds flow (on a loaded machine workers start slowly)
        while (not rec.exists() or rec.stat().st_size == 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        ws[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        _, err = srv.communicate(timeout=20)
        assert time.monotonic() - t0 < 15
        assert srv.returncode == 2
        assert "worker 1" in err
        for i in (0, 2):  # the survivors hear that the server went away, they do not hang
            _, werr = ws[i].communicate(timeout=20)
            assert ws[i].returncode != 0 and "server" in werr
    finally:
        for p in ws + [srv]:
            p.kill()


def _two_workers_continuing(n: int, peer_timeout: float) -> tuple[ParameterServer, threading.Thread, dict, Worker, Worker]:
    """A lossless server that goes on without a lost worker, and its two workers, connected."""
    srv, th, result = _thread_server(workers=2, policy=FixedPolicy(0.0), on_worker_loss="continue",
                                     peer_timeout=peer_timeout)
    w0 = Worker("127.0.0.1", srv.port, elements=n, worker_id=0)
    w1 = Worker("127.0.0.1", srv.port, elements=n, worker_id=1)
    t = threading.Thread(target=w1.connect)
    t.start()
    w0.connect()
    t.join()
    return srv, th, result, w0, w1


def test_continue_policy_keeps_serving_remaining_workers():
    n = 20_000
    srv, th, result, w0, w1 = _two_workers_continuing(n, peer_timeout=5)
    g = np.ones(n, np.float32)
    t = threading.Thread(target=w1.allreduce, args=(g * 3,))
    t.start()
    assert np.allclose(w0.allreduce(g), 2.0)
    t.join()
    w1.peer.tcp.close()  # dies without BYE
    w1.peer.udp.close()
    assert np.allclose(w0.allreduce(g), 1.0)  # served alone
    w0.close()
    th.join(timeout=10)
    assert "error" not in result


def test_worker_lost_as_a_round_ends_does_not_stall_the_next_round():
    """Worker 1 dies with its broadcast of round 0 unstopped while worker 0's upstream of round 1 is
    already in: its loss ends round 0, and the server must go straight to round 1's reduce (it once
    waited for an upstream that was complete, until the peer timeout ended the run)."""
    n = 20_000
    srv, th, result, w0, w1 = _two_workers_continuing(n, peer_timeout=30)
    w1.session.receiver.control_to_send = lambda: []  # w1 never STOPs the server's broadcast to it
    g = np.ones(n, np.float32)
    t = threading.Thread(target=w1.allreduce, args=(g * 3,))
    t.start()
    assert np.allclose(w0.allreduce(g), 2.0)
    t.join()
    first = w0.peer.sender
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("mean", w0.allreduce(g)))
    t.start()
    deadline = time.monotonic() + 20  # until the server holds all of worker 0's round 1 (it STOPped it)
    while not (w0.peer.sender is not first and w0.peer.sender.done):
        assert time.monotonic() < deadline, "worker 0's round 1 upstream did not finish"
        time.sleep(0.01)
    t0 = time.monotonic()
    w1.peer.tcp.close()  # dies without BYE, the broadcast's probes unread
    w1.peer.udp.close()
    t.join(timeout=25)
    assert "error" not in result
    assert np.allclose(out["mean"], 1.0)  # served alone, at once
    assert time.monotonic() - t0 < 10
    w0.close()
    th.join(timeout=10)
    assert result.get("rounds") == 2


def test_dead_server_gives_workers_a_clear_error_in_bounded_time():
    n = 20_000
    srv, th, result = _thread_server(workers=1, policy=ReliablePolicy())
    w = Worker("127.0.0.1", srv.port, elements=n, peer_timeout=3)
    w.connect()
    w.allreduce(np.ones(n, np.float32))
    # the server host vanishes without closing: its sockets stay open, nothing answers
    srv.workers[0].peer.tcp.shutdown(socket.SHUT_RDWR)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="server"):
        w.allreduce(np.ones(n, np.float32))
    assert time.monotonic() - t0 < 10
    w.close()


@pytest.mark.parametrize("elements", [20_000, 2_000_000])  # idle-waiting vs mostly mid-pass when cut
def test_vanished_server_host_is_detected_by_keepalive_in_bounded_time(elements):
    """The server's host goes silent without closing anything (every packet
    dropped): the worker fails with a clear error well before its 120 s
    silence timeout, through TCP keepalive (idle connection) or
    TCP_USER_TIMEOUT (a probe in flight), whichever state it was caught in."""
    if not is_root:
        pytest.skip("needs root and nft for a network namespace")
    from emulation.lossyns import LossyLoopback
    from procs import env, prefix, PY, ROOT

    port = free_port()
    with LossyLoopback(0.0) as ns:
        pre = prefix(ns.name)
        srv = subprocess.Popen(pre + [PY, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port),
                                      "--workers", "1", "--policy", "reliable"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
        wk = subprocess.Popen(pre + [PY, "-m", "dblp", "worker", "--server", f"127.0.0.1:{port}", "--model", str(elements),
                                     "--iterations", "100000", "--compute", "50ms", "--progress"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
        try:
            first = wk.stdout.readline()  # rounds are flowing (however slow the machine is)
            assert "round 0" in first, wk.stderr.read()
            srv.send_signal(signal.SIGSTOP)  # the host "vanishes": no FIN, no RST ...
            ns.run(["nft", "add", "table", "inet", "cut"])  # ... and no ACK either
            ns.run(["nft", "add", "chain", "inet", "cut", "in", "{ type filter hook input priority -10; }"])
            ns.run(["nft", "add", "rule", "inet", "cut", "in", "tcp", "dport", str(port), "drop"])
            t0 = time.monotonic()
            _, err = wk.communicate(timeout=60)
            elapsed = time.monotonic() - t0
            assert wk.returncode == 2, err
            assert "server" in err
            assert elapsed < 40, elapsed
        finally:
            for p in (wk, srv):
                p.kill()
                p.wait()


def test_results_are_not_copied_and_held_results_are_never_overwritten():
    """The averaged tensor is received into the returned array; a result the
    caller keeps (array, view or torch tensor) is never reused for a later round."""
    torch = pytest.importorskip("torch")
    n = 40_000
    srv, th, result = _thread_server(workers=1, policy=ReliablePolicy(), peer_timeout=10, rounds=8)
    kept = []
    with Worker("127.0.0.1", srv.port, elements=n) as w:
        for r in range(4):  # held: every round needs a new buffer
            kept.append((r, w.allreduce(np.full(n, float(r), np.float32))))
        view = kept[1][1][10:20]
        del kept[1:]
        t = torch.from_numpy(w.allreduce(np.full(n, 4.0, np.float32)))  # held through a tensor
        used = []
        for i in range(3):  # not held: the same pool buffer every time
            res = w.allreduce(np.full(n, 5.0 + i, np.float32))
            assert np.all(res == 5.0 + i)
            used.append(next(id(b) for b in w._results if np.shares_memory(b, res)))  # pool buffers stay alive
            del res
    th.join(10)
    assert result.get("rounds") == 8, result
    assert np.all(kept[0][1] == 0.0) and np.all(view == 1.0)
    assert torch.all(t == 4.0)
    assert len(set(used)) == 1  # reused once nobody held it


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("fast", [None, False])
def test_ipv6_rounds_are_exact_and_fit_the_link_mtu(fast):
    """A server on ::1: sockets, source keys (C and Python alike) and the chunk size follow IPv6
    (40-byte IP header: 353 floats per 1500-byte packet on the authenticated wire)."""
    from dblp.transport.udp import addr_key

    srv = ParameterServer(ServerConfig(host="::1", port=0, workers=2, rounds=2, accept_timeout=20, fast=fast))
    th = threading.Thread(target=srv.serve)
    th.start()
    n = 353 * 30 + 5
    res: list[bool] = []
    layouts: list = []

    def work(i: int) -> None:
        with Worker("::1", srv.port, elements=n, worker_id=i, fast=fast) as w:
            layouts.append(w.layout)
            for k in range(2):
                g = np.full(n, float(i + k), np.float32)
                res.append(bool(np.array_equal(w.allreduce(g), np.full(n, 0.5 + k, np.float32))))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    th.join(60)
    assert res == [True] * 4
    assert {(lay.chunk_floats, lay.mtu) for lay in layouts} == {(353, 1480)}
    assert addr_key(("::ffff:10.0.0.1", 5)) == addr_key(("10.0.0.1", 5))
    assert addr_key(("::1", 5)) >> 62 == 1 and addr_key(("::1", 5)) != addr_key(("::1", 6))


@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_event_loops_average_exactly(threads, monkeypatch):
    """The server's loops over its workers on `threads` threads (transport.pump_parallel): every
    round's mean is exact, whatever the split of the 4 workers among the loops."""
    import dblp.transport.server

    monkeypatch.setattr(dblp.transport.server, "PARALLEL_MIN_DATAGRAMS", 0)  # 4 x 415 datagrams: parallel all the same
    n, k, rounds = 150_001, 4, 3
    srv, th, result = _thread_server(workers=k, policy=FixedPolicy(0.0), threads=threads, rounds=rounds,
                                     peer_timeout=20)
    grads = [[(np.random.default_rng(10 * r + i).integers(-4096, 4096, n) / 64).astype(np.float32)
              for r in range(rounds)] for i in range(k)]
    outs: list[list] = [[] for _ in range(k)]

    def work(i: int) -> None:
        with Worker("127.0.0.1", srv.port, elements=n, worker_id=i) as w:
            for r in range(rounds):
                outs[i].append(np.array(w.allreduce(grads[i][r]), copy=True))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    th.join(timeout=20)
    assert "error" not in result and result["rounds"] == rounds
    for r in range(rounds):
        want = ((grads[0][r] + grads[1][r]) + grads[2][r] + grads[3][r]) * np.float32(1 / k)
        for i in range(k):
            assert np.array_equal(outs[i][r], want), (threads, i, r)
