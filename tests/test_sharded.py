"""The sharded mode (dblp.transport.shard): k shard servers, each averaging 1/k of the tensor, on real sockets.

Lossless rounds average exactly (bit for bit the single server's arithmetic on each shard); under
loss every chunk a worker gets is the shard server's average or zero, within each shard's
tolerance; every shard server's policy sees the same norm - the whole mean's, from the shards'
squared norms - and so announces the same tolerance.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.policy import FixedPolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.shard import NormExchange, NormExchangeError, ShardedWorker, merge_records, shard_bounds
from dblp.protocol.wire import ParameterError
from scripted_loss import ScriptedLoss, lossy

SECRET = b"s" * 32


def test_shard_bounds_cut_evenly_and_refuse_what_cannot_be_cut():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(25_000_000, 4)[-1] == (18_750_000, 25_000_000)
    sizes = [b - a for a, b in shard_bounds(1_000_003, 7)]
    assert sum(sizes) == 1_000_003 and max(sizes) - min(sizes) <= 1
    with pytest.raises(ParameterError, match="cannot be cut into 4 shards"):
        shard_bounds(3, 4)
    with pytest.raises(ParameterError, match="shards must be >= 1"):
        shard_bounds(3, 0)


def _sharded_run(k: int, elements: int, rounds: int, grad, *, policy=None, loss: bool = False,
                 insecure: bool = False):
    """k shard servers and k sharded workers in threads on 127.0.0.1. Returns (results[i][round],
    servers, worker records)."""
    bounds = shard_bounds(elements, k)
    servers: list[ParameterServer] = []
    hub: tuple[str, int] = ("127.0.0.1", 0)
    for j, (a, b) in enumerate(bounds):
        cfg = ServerConfig(port=0, workers=k, elements=b - a, rounds=rounds, shards=k, shard=j, shard_hub=hub,
                           policy=policy() if policy else FixedPolicy(0.0), peer_timeout=30,
                           secret=None if insecure else SECRET, insecure=insecure)
        servers.append(ParameterServer(cfg))
        if j == 0:
            hub = ("127.0.0.1", servers[0].norm_exchange.port)
    scripts = [ScriptedLoss() for _ in range(k)]  # one per shard: its own (direction, worker, round, chunk)
    outs: list[list[np.ndarray]] = [[] for _ in range(k)]
    records: list = []
    errors: list[BaseException] = []

    def serve(j: int) -> None:
        try:
            srv = servers[j]
            srv.accept_workers()
            if loss:
                for w in srv.workers:
                    lossy(w.peer.udp, scripts[j], ctl.DOWN, w.wid, w.peer)
            srv.serve()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def work(i: int) -> None:
        try:
            addrs = [("127.0.0.1", s.port) for s in servers]
            with ShardedWorker(addrs, elements=elements, worker_id=i, peer_timeout=30,
                               secret=None if insecure else SECRET, insecure=insecure) as w:
                if loss:
                    for j, sw in enumerate(w.shards):
                        lossy(sw.peer.udp, scripts[j], ctl.UP, i, sw.peer)
                for r in range(rounds):
                    outs[i].append(np.array(w.allreduce(grad(i, r)), copy=True))
                    records.append(w.last_record)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(j,)) for j in range(k)]
    threads += [threading.Thread(target=work, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return outs, servers, records


def _grads(elements: int):
    """Gradients whose sums are exact in float32 (multiples of 1/64 below 2^10), so the mean does not
    depend on the order in which a server adds its workers' buffers."""
    def grad(i: int, r: int) -> np.ndarray:
        return (np.random.default_rng(1000 * r + i).integers(-4096, 4096, elements) / 64).astype(np.float32)
    return grad


@pytest.mark.parametrize("k", [2, 3])
def test_lossless_sharded_rounds_average_exactly_and_share_one_norm(k):
    elements = 358 * 50 * k + 17  # several chunks per shard, a short last chunk
    grad = _grads(elements)
    outs, servers, records = _sharded_run(k, elements, 3, grad)
    for r in range(3):
        g = [grad(i, r) for i in range(k)]
        want = g[0] + g[1]
        for x in g[2:]:
            want = want + x
        want = want * np.float32(1.0 / k)  # the server's arithmetic: sum, then one multiply
        for i in range(k):
            assert np.array_equal(outs[i][r], want), (i, r)
        whole = math.sqrt(float(np.sum(want.astype(np.float64) ** 2)))
        norms = [s.norms[r] for s in servers]
        assert norms == [norms[0]] * k  # every shard's policy saw the same number...
        assert norms[0] == pytest.approx(whole, rel=1e-5)  # ...the whole mean's norm
    # one merged record per worker and round: every chunk of every shard, nothing dropped
    assert len(records) == 3 * k
    chunks = sum(s.layout.chunks for s in servers)
    for rec in records:
        assert rec.chunks == chunks and rec.up_received == chunks and rec.down_received == chunks
        assert rec.extra["aggregation"] == "sharded" and rec.extra["shards"] == k
        assert rec.extra["local_shard"] == rec.worker  # all on 127.0.0.1: the worker's own index
        assert rec.unauthenticated == rec.corrupt == rec.duplicate == 0


def test_sharded_rounds_under_loss_are_exact_or_zero_within_each_shards_tolerance():
    k, p = 3, 0.2
    elements = 358 * 120 + 5
    grad = _grads(elements)
    outs, servers, records = _sharded_run(k, elements, 3, grad, policy=lambda: FixedPolicy(p), loss=True)
    bounds = shard_bounds(elements, k)
    zero_chunks = 0
    for r in range(3):
        for j, (a, b) in enumerate(bounds):
            cf = servers[j].layout.chunk_floats
            n = servers[j].layout.chunks
            got = [outs[i][r][a:b] for i in range(k)]
            for c in range(n):
                sl = slice(c * cf, min((c + 1) * cf, b - a))
                vals = [x[sl] for x in got if x[sl].any()]
                # every worker that holds the chunk holds the same bytes: the shard server's average
                assert all(np.array_equal(v, vals[0]) for v in vals), (r, j, c)
            for i in range(k):
                lost = sum(not got[i][c * cf:min((c + 1) * cf, b - a)].any() for c in range(n))
                assert lost <= math.floor(p * n + 1e-9), (r, j, i, lost, n)  # the STOP rule, per shard
                zero_chunks += lost
    assert zero_chunks > 0  # the script did lose broadcast chunks that stayed lost
    # uplink loss too: chunks were retransmitted, and the records count every shard's passes
    assert max(rec.up_passes for rec in records) >= 2


def test_merge_records_spans_the_slowest_shard():
    from dblp.protocol.records import RoundRecord

    a = RoundRecord("loopback", "worker", 0, 4, t_start=10.0, round_latency_s=0.5, up_latency_s=0.2,
                    down_latency_s=0.3, chunks=10, up_sent=12, up_received=10, down_received=9, up_passes=2,
                    stale=1)
    b = RoundRecord("loopback", "worker", 0, 4, t_start=10.1, round_latency_s=0.6, up_latency_s=0.4,
                    down_latency_s=0.1, chunks=11, up_sent=11, up_received=11, down_received=11, up_passes=1,
                    unauthenticated=2)
    m = merge_records([a, b])
    assert (m.t_start, m.round_latency_s) == (10.0, pytest.approx(0.7))
    assert (m.up_latency_s, m.down_latency_s, m.up_passes) == (0.4, 0.3, 2)
    assert (m.chunks, m.up_sent, m.down_received, m.stale, m.unauthenticated) == (21, 23, 20, 1, 2)
    assert m.extra == {"aggregation": "sharded", "shards": 2}


def test_norm_exchange_refuses_a_peer_without_the_runs_secret():
    hub = NormExchange(0, 2, ("127.0.0.1", 0), SECRET, timeout=5, connect_timeout=3)
    peer = NormExchange(1, 2, ("127.0.0.1", hub.port), b"x" * 32, timeout=5, connect_timeout=3)
    t = threading.Thread(target=lambda: _swallow(peer.total, 0, 1.0))
    t.start()
    with pytest.raises(NormExchangeError, match=r"shard server\(s\) \[1\] did not connect"):
        hub.total(0, 2.0)  # the wrong-keyed introduction is closed; the real shard 1 never comes
    t.join(10)
    good = NormExchange(1, 2, ("127.0.0.1", hub.port), SECRET, timeout=5, connect_timeout=3)
    t = threading.Thread(target=lambda: _swallow(good.total, 0, 1.5))
    t.start()
    assert hub.total(0, 2.0) == 3.5
    t.join(10)
    for x in (hub, peer, good):
        x.close()


def _swallow(f, *args):
    try:
        f(*args)
    except (NormExchangeError, OSError):
        pass


def test_sharded_loopback_and_bad_shard_flags_from_the_command_line():
    run = subprocess.run([sys.executable, "-m", "dblp", "loopback", "--model", "200000", "--aggregation", "sharded",
                          "--iterations", "2", "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for argv, why in ((["--shards", "3", "--shard", "3", "--model", "1M"], "--shard must be below --shards"),
                      (["--shards", "2", "--shard-hub", "nohost"], "expected HOST:PORT")):
        r = subprocess.run([sys.executable, "-m", "dblp", "server", "--insecure", *argv], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "dblp", "loopback", "--aggregation", "sharded", "--workers", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "at least 2 workers" in r.stderr and "Traceback" not in r.stderr


def test_a_dead_shard_hub_ends_a_shard_server_with_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    x = NormExchange(1, 2, ("127.0.0.1", port), SECRET, timeout=2, connect_timeout=1)
    with pytest.raises(NormExchangeError, match=f"cannot reach the shard hub at 127.0.0.1:{port}"):
        x.total(0, 1.0)


def test_round_clock_serves_several_shard_servers_at_once(tmp_path):
    """The emulation's round hook with one connection per shard server: a round is open once any shard
    opened it and ended once every shard ended it (a burst then covers that round on every shard)."""
    from dblp.transport.watch import RoundHookServer

    seen: list[tuple[int, int]] = []
    hook = RoundHookServer(tmp_path / "r.sock", lambda first, last: seen.append((first, last)) or first <= 1 <= last)
    hook.start()
    try:
        a, b = (socket.socket(socket.AF_UNIX) for _ in range(2))
        for c in (a, b):
            c.connect(str(tmp_path / "r.sock"))
        fa, fb = a.makefile("rwb", buffering=0), b.makefile("rwb", buffering=0)

        def ask(f, line: bytes) -> bytes:
            f.write(line)
            return f.readline()

        assert ask(fa, b"open 0\n") == b"0\n"
        assert ask(fb, b"open 0\n") == b"0\n"
        assert ask(fa, b"end 0\n") == b"0\n" and hook.ended == -1  # shard b still in round 0
        assert ask(fa, b"open 1\n") == b"1\n"  # a's round 1 is the burst round: active
        assert ask(fb, b"end 0\n") == b"1\n" and hook.ended == 0
        assert ask(fb, b"open 1\n") == b"1\n"
        assert ask(fa, b"end 1\n") == b"1\n" and hook.ended == 0  # b still sends round 1: the burst stays
        assert ask(fb, b"end 1\n") == b"0\n" and hook.ended == 1
        assert seen[-1] == (2, 1)
        for c in (fa, fb, a, b):
            c.close()
    finally:
        hook.stop()


def test_norm_exchange_refuses_its_own_message_reflected():
    """A man in the middle that sends a shard server's message back to it as the hub's total is refused
    (the tag binds the sender's role), instead of the server taking its own squared norm for the sum."""
    with socket.create_server(("127.0.0.1", 0)) as fake_hub:
        peer = NormExchange(1, 2, ("127.0.0.1", fake_hub.getsockname()[1]), SECRET, timeout=5, connect_timeout=3)
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: errors.append(_raises(peer.total, 3, 2.5)))
        t.start()
        conn, _ = fake_hub.accept()
        with conn:
            conn.sendall(b"n" * 16)  # the nonce
            intro = conn.recv(30, socket.MSG_WAITALL)
            msg = conn.recv(30, socket.MSG_WAITALL)
            assert len(intro) == len(msg) == 30
            conn.sendall(msg)  # round 3's message, straight back
            t.join(10)
    peer.close()
    assert isinstance(errors[0], NormExchangeError) and "without this run's tag" in str(errors[0])


def test_norm_tag_is_the_auth_modules_message_tag_as_the_wire_has_it():
    """The norm exchange tags with dblp.protocol.auth's one message MAC: HMAC-SHA256 of the purpose, the
    sender's role, the connection's nonce and the message, cut to 16 bytes (the wire as it was)."""
    import hashlib
    import hmac
    import struct

    from dblp.protocol import auth
    from dblp.protocol.login import NORM_MESSAGE_BYTES, encode_norm

    body = b"b" * 14
    want = hmac.new(SECRET, b"dblp-shard-norm/peer" + b"n" * 16 + body, hashlib.sha256).digest()[:16]
    assert auth.norm_tag(SECRET, b"n" * 16, body, False) == want
    assert auth.message_tag(SECRET, b"dblp-shard-norm/peer", b"n" * 16 + body, 16) == want
    assert auth.norm_tag(SECRET, b"n" * 16, body, True) != want  # the hub's role gives another tag
    assert auth.norm_tag(None, b"n" * 16, body, False) == bytes(16)  # --insecure: the size kept, no tag
    msg = encode_norm(SECRET, b"n" * 16, 3, 1, 2.5, from_hub=False)  # what a shard server sends
    head = struct.pack("!IHd", 3, 1, 2.5)
    assert NORM_MESSAGE_BYTES == len(msg) == 30
    assert msg == head + hmac.new(SECRET, b"dblp-shard-norm/peer" + b"n" * 16 + head, hashlib.sha256).digest()[:16]


def _raises(f, *args) -> BaseException | None:
    try:
        f(*args)
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return exc
    return None
