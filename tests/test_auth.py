"""Authenticated runs (dblp.protocol.auth): the datagram tag, the handshake, and hostile clients against a live server.

The tag is checked three ways: the C helper against the ``cryptography``
package's AES-GCM (an independent implementation), the numpy fallback
against the C helper (same bytes), and a receiver that must count a forged
datagram ``unauthenticated`` and keep its tensor exact. The handshake is
attacked on a live :class:`~dblp.transport.server.ParameterServer` with raw TCP
clients: no proof, a wrong proof, a replayed handshake, the wrong wire.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dblp.protocol import auth
from dblp.protocol import control as ctl
from dblp.protocol import wire
from dblp.protocol.core import Receiver
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.worker import Worker, WorkerError
from hostile import Threads, first_message
from procs import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SECRET = bytes(range(32))
KEY = auth.data_key(SECRET, 0x1234)
ELEMENTS = 358 * 40 + 11  # a short last chunk
ROUNDS = 3


def test_key_depends_on_secret_and_run():
    assert len(KEY) == 16
    assert auth.data_key(SECRET, 0x1235) != KEY
    assert auth.data_key(bytes(32), 0x1234) != KEY


def test_authenticated_layout_sizes():
    lay = wire.ChunkLayout(ELEMENTS, key=KEY)
    assert (lay.header_size, lay.chunk_floats, lay.datagram_size, lay.version) == (40, 358, 1472, 2)
    assert wire.ChunkLayout(ELEMENTS).chunk_floats == 362
    with pytest.raises(wire.ParameterError, match="16 bytes"):
        wire.ChunkLayout(ELEMENTS, key=b"short")


@pytest.mark.skipif(wire._c_mac_rows is None, reason="C helper not built")
@pytest.mark.parametrize("gmac", auth.gmac_implementations() or ["none"])
def test_c_tags_equal_the_cryptography_reference_and_the_fallback(monkeypatch, gmac):
    """Every C implementation of the tag (Intel's ipsec-mb, OpenSSL's GCM) writes the bytes of the
    ``cryptography`` reference and of the pure-Python fallback, and checks them."""
    if gmac != "none":
        from dblp import _fastpath as fast
        prev = fast.use_mac(gmac)
    try:
        _tags_equal_the_reference(monkeypatch)
    finally:
        if gmac != "none":
            fast.use_mac(prev)


def _tags_equal_the_reference(monkeypatch) -> None:
    lay = wire.ChunkLayout(ELEMENTS, key=KEY)
    vals = np.random.default_rng(1).standard_normal(ELEMENTS).astype(np.float32)
    seqs = np.arange(lay.chunks, dtype=np.int64)[::-1].copy()
    rows, lens = wire.encode_chunks(vals, lay, seqs, run_id=0x1234, sender=7, round_no=99)
    hdrs = wire.encode_headers(vals, lay, seqs, run_id=0x1234, sender=7, round_no=99)
    assert np.array_equal(hdrs, rows[:, :40])
    h = wire.parse_headers(rows)
    assert (h["version"] == 2).all() and (h["crc"] == 0).all()
    for i in (0, 1, len(seqs) // 2):  # the short last chunk is row 0
        ref = auth.datagram_tag(KEY, rows[i, :24].tobytes(), rows[i, 40:lens[i]].tobytes())
        assert ref == rows[i, 24:40].tobytes()
    assert wire.rows_ok(rows, lay, lens).all()
    for name in ("_c_encode_rows", "_c_encode_headers", "_c_mac_rows", "_c_crc_placed"):
        monkeypatch.setattr(wire, name, None)
    rows2, lens2 = wire.encode_chunks(vals, lay, seqs, run_id=0x1234, sender=7, round_no=99)
    assert np.array_equal(rows2, rows) and np.array_equal(lens2, lens)
    assert wire.rows_ok(rows, lay, lens).all()
    bad = rows.copy()
    bad[3, 100] ^= 1
    assert wire.rows_ok(bad, lay, lens).tolist() == [i != 3 for i in range(len(seqs))]


def _forgeries(vals: np.ndarray, lay: wire.ChunkLayout, round_no: int) -> list[np.ndarray]:
    """Datagrams with the right run id, sender and round but no valid tag: a wrong key, a
    bit-flipped payload under the right tag, the paper's CRC-only wire, a zero tag."""
    seqs = np.arange(lay.chunks, dtype=np.int64)
    evil = np.full_like(vals, 3.33e29)
    kw = dict(run_id=0x1234, sender=wire.SERVER_ID, round_no=round_no)
    wrong_key, _ = wire.encode_chunks(evil, wire.ChunkLayout(ELEMENTS, key=bytes(16)), seqs, **kw)
    flipped, _ = wire.encode_chunks(vals, lay, seqs, **kw)
    flipped[:, 60] ^= 0x40
    v1, _ = wire.encode_chunks(evil[: ELEMENTS], wire.ChunkLayout(ELEMENTS), np.arange(
        wire.ChunkLayout(ELEMENTS).chunks, dtype=np.int64), **kw)
    zero, _ = wire.encode_chunks(evil, lay, seqs, **kw)
    zero[:, 24:40] = 0
    return [wrong_key, flipped, v1, zero]


def test_receiver_counts_forged_datagrams_unauthenticated_and_stays_exact():
    lay = wire.ChunkLayout(ELEMENTS, key=KEY)
    vals = np.random.default_rng(2).standard_normal(ELEMENTS).astype(np.float32)
    out = np.zeros(ELEMENTS, np.float32)
    r = Receiver(lay, run_id=0x1234, expected_sender=wire.SERVER_ID, direction=ctl.DOWN)
    r.begin_round(5, out, 0.0, tolerance=0.0)
    forged = _forgeries(vals, lay, 5)
    n_forged = 0
    for rows in forged:
        width = rows.shape[1]
        lens = np.full(rows.shape[0], width, np.int64)
        lens[-1] = width if rows is forged[2] else 40 + (ELEMENTS - (lay.chunks - 1) * 358) * 4
        r.receive_batch(rows, lens, 0.0)
        n_forged += rows.shape[0]
    assert r.received == 0 and not out.any()
    d = r.stats.drops
    assert d.unauthenticated + d.wrong_length == n_forged and d.corrupt == 0
    assert d.wrong_length == 0 or d.wrong_length <= wire.ChunkLayout(ELEMENTS).chunks  # v1 rows: their size
    good, lens = wire.encode_chunks(vals, lay, np.arange(lay.chunks, dtype=np.int64), run_id=0x1234,
                                    sender=wire.SERVER_ID, round_no=5)
    r.receive_batch(good, lens, 0.0)
    assert r.complete and np.array_equal(out, vals)


# -- live server -------------------------------------------------------------------------------
class Run:
    """An authenticated server thread and worker threads that check every averaged gradient exactly."""

    def __init__(self, workers: int = 1, **cfg) -> None:
        self.port = free_port()
        self.srv = ParameterServer(ServerConfig(host="127.0.0.1", port=self.port, workers=workers, rounds=ROUNDS,
                                                accept_timeout=30, peer_timeout=20, secret=SECRET,
                                                handshake_timeout=cfg.pop("handshake_timeout", 5.0), **cfg))
        self.exact: list[int] = []
        self.run = Threads()
        self.errors = self.run.errors
        self.run.start(self.srv.serve)

    def start_worker(self, wid: int, during=None) -> None:
        def work() -> None:
            with Worker("127.0.0.1", self.port, elements=ELEMENTS, worker_id=wid, connect_timeout=10,
                        secret=SECRET) as w:
                n = 0
                for k in range(ROUNDS):
                    g = np.random.default_rng(k).standard_normal(ELEMENTS).astype(np.float32)
                    if during is not None and k == 1:
                        during(w)
                    n += bool(np.array_equal(w.allreduce(g), g))
                self.exact.append(n)

        self.run.start(work)

    def join(self) -> None:
        self.run.join()
        assert not self.errors, self.errors


def hello(nonce: bytes = b"", worker: int = 0) -> ctl.Hello:
    return ctl.Hello(worker, 9, {"elements": ELEMENTS, "names": [], "shapes": []}, nonce=nonce.hex())


def talk(port: int, *msgs: ctl.Message, raw: bytes = b"") -> tuple[socket.socket, ctl.Message | None]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(raw + b"".join(ctl.encode(m) for m in msgs))
    return s, read(s)


def read(s: socket.socket) -> ctl.Message | None:
    return first_message(s, timeout=None)  # (the socket's own 10 s)


def test_hostile_handshakes_are_refused_and_counted_while_the_real_worker_runs_exactly():
    run = Run()
    # 1. a HELLO without a nonce (an unauthenticated client, or the paper's worker)
    s, reply = talk(run.port, hello())
    assert isinstance(reply, ctl.Bye) and "requires authentication" in reply.reason
    s.close()
    # 2. a client that does not hold the secret: a CHALLENGE comes, its AUTH fails
    nonce = auth.new_nonce()
    s, ch = talk(run.port, hello(nonce))
    assert isinstance(ch, ctl.Challenge)
    assert not auth.check_proof(bytes(32), "server", nonce, ch.nonce, ctl.canonical_hello(hello(nonce)), ch.proof)
    s.sendall(ctl.encode(ctl.AuthProof(auth.proof(bytes(32), "worker", nonce, ch.nonce,
                                                   ctl.canonical_hello(hello(nonce))))))
    reply = read(s)
    assert isinstance(reply, ctl.Bye) and "authentication failed" in reply.reason
    s.close()
    # 3. a recorded good handshake replayed on a new connection: the server's nonce is new
    nonce = auth.new_nonce()
    s, ch = talk(run.port, hello(nonce))
    good = ctl.AuthProof(auth.proof(SECRET, "worker", nonce, ch.nonce, ctl.canonical_hello(hello(nonce))))
    s.close()  # the eavesdropper saw HELLO and this AUTH
    s, ch2 = talk(run.port, hello(nonce))
    assert isinstance(ch2, ctl.Challenge) and ch2.nonce != ch.nonce
    s.sendall(ctl.encode(good))
    reply = read(s)
    assert isinstance(reply, ctl.Bye) and "authentication failed" in reply.reason
    s.close()
    # 4. a reflected proof (the server's own, sent back as the worker's) fails: the role is in it
    nonce = auth.new_nonce()
    s, ch = talk(run.port, hello(nonce))
    s.sendall(ctl.encode(ctl.AuthProof(ch.proof)))
    reply = read(s)
    assert isinstance(reply, ctl.Bye) and "authentication failed" in reply.reason
    s.close()
    # 5. AUTH before any challenge, and a malformed AUTH
    s, reply = talk(run.port, ctl.AuthProof(bytes(32)))
    assert isinstance(reply, ctl.Bye) and "expected HELLO" in reply.reason
    s.close()
    nonce = auth.new_nonce()
    s, ch = talk(run.port, hello(nonce))
    s.sendall(b"\x00\x00\x00\x04\x0b\x01\x02\x03")  # AUTH of 3 bytes
    reply = read(s)
    assert isinstance(reply, ctl.Bye) and "AUTH of 3 bytes" in reply.reason
    s.close()
    # 6. a worker holding the wrong secret learns that the server is not its server, and stops
    with pytest.raises(WorkerError, match="does not hold this run's secret"):
        Worker("127.0.0.1", run.port, elements=ELEMENTS, worker_id=0, connect_timeout=10,
               secret=bytes(32)).connect()
    # 7. an insecure worker is told so
    with pytest.raises(WorkerError, match="requires authentication"):
        Worker("127.0.0.1", run.port, elements=ELEMENTS, worker_id=0, connect_timeout=10,
               insecure=True).connect()
    run.start_worker(0)
    run.join()
    assert run.exact == [ROUNDS]
    assert run.srv.refused["auth"] >= 5 and run.srv.refused["malformed"] >= 1


def test_forged_datagrams_with_the_right_run_id_and_round_are_dropped_unauthenticated():
    """A sender that sees the traffic (run id, round, addresses) but not the key forges a whole
    round toward the server, from the worker's own address and port: nothing it sent is averaged."""
    run = Run()
    sent = {}

    def forge(w: Worker) -> None:
        srv_addr = w.peer.udp_addr
        lay = w.layout
        # the next round's number is known to an observer; forged from the worker's own source port
        for rows in _forgeries(np.zeros(ELEMENTS, np.float32), lay, w.round + 1):
            for k in range(rows.shape[0]):
                w.peer.udp.sock.sendto(rows[k].tobytes(), srv_addr)
        sent["n"] = sum(r.shape[0] for r in _forgeries(np.zeros(ELEMENTS, np.float32), lay, 0))
        sent["receiver"] = run.srv.workers[0].peer.receiver

    run.start_worker(0, during=forge)
    run.join()
    assert run.exact == [ROUNDS]
    drops = sent["receiver"].total_drops
    assert drops.corrupt == 0
    assert drops.unauthenticated + drops.wrong_length + drops.stale >= sent["n"] - 5
    assert drops.unauthenticated >= 2 * (ELEMENTS // 358)


def test_an_insecure_server_refuses_an_authenticated_worker_and_accepts_an_insecure_one():
    port = free_port()
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=port, workers=1, rounds=1, accept_timeout=30,
                                       insecure=True))
    th = threading.Thread(target=srv.serve)
    th.start()
    with pytest.raises(WorkerError, match="runs --insecure"):
        Worker("127.0.0.1", port, elements=ELEMENTS, connect_timeout=10, secret=SECRET).connect()
    with Worker("127.0.0.1", port, elements=ELEMENTS, connect_timeout=10, insecure=True) as w:
        assert w.layout.version == 1 and w.layout.chunk_floats == 362
        g = np.arange(ELEMENTS, dtype=np.float32)
        assert np.array_equal(w.allreduce(g), g)
    th.join(30)


def test_the_server_listens_on_loopback_by_default():
    assert ServerConfig().host == "127.0.0.1"


# -- the command line -----------------------------------------------------------------------------
def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != auth.SECRET_ENV}
    return subprocess.run([sys.executable, "-m", "dblp", *args], capture_output=True, text=True, cwd=REPO,
                          env={**e, **(env or {})}, timeout=60)


def test_cli_refuses_missing_bad_and_open_secrets(tmp_path):
    r = _cli("worker", "--server", "127.0.0.1:1", "--iterations", "1")
    assert r.returncode == 2 and "no secret" in r.stderr and "Traceback" not in r.stderr
    r = _cli("worker", "--server", "127.0.0.1:1", env={auth.SECRET_ENV: "xyz"})
    assert r.returncode == 2 and "must be hex digits" in r.stderr
    f = tmp_path / "secret"
    f.write_text(auth.new_secret())
    f.chmod(0o644)
    r = _cli("worker", "--server", "127.0.0.1:1", "--secret-file", str(f))
    assert r.returncode == 2 and "readable by others" in r.stderr and "chmod 600" in r.stderr
    r = _cli("worker", "--server", "127.0.0.1:1", "--secret-file", str(tmp_path / "none"))
    assert r.returncode == 2 and "--secret-file" in r.stderr and "Traceback" not in r.stderr
    r = _cli("secret")
    assert r.returncode == 0 and len(bytes.fromhex(r.stdout.strip())) == 32


def test_cli_server_makes_a_secret_file_and_a_worker_uses_it(tmp_path):
    port = free_port()
    f = tmp_path / "run.secret"
    srv = subprocess.Popen([sys.executable, "-m", "dblp", "server", "--port", str(port), "--workers", "1",
                            "--iterations", "2", "--secret-file", str(f)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env={k: v for k, v in os.environ.items() if k != auth.SECRET_ENV})
    try:
        line = srv.stdout.readline()
        assert "listening on 127.0.0.1" in line and f"new secret in {f}" in line
        assert (f.stat().st_mode & 0o777) == 0o600
        r = _cli("worker", "--server", f"127.0.0.1:{port}", "--iterations", "2", "--model", "10000",
                 "--secret-file", str(f))
        assert r.returncode == 0, r.stderr
        assert srv.wait(30) == 0
    finally:
        srv.kill()
