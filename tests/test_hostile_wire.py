"""An on-path attacker on the control connection, a flood before login, a bad insider: against live servers.

Loopback only, every case bounded to seconds. The on-path attacker is a TCP
proxy between one worker and the server that forwards the control stream frame
by frame and, not holding the run's secret, injects a forged ROUND (tolerance
0.99 under the reliable policy) toward the worker, replays a genuine ROUND, and
injects a BYE toward the server. Authenticated, each is refused and counted and
every round stays exact; on the ``--insecure`` wire the forged ROUND is applied,
and the records' cross-check flags the round.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dblp import control as ctl
from dblp.analysis import tolerance_mismatches
from dblp.records import read_records
from dblp.server import ParameterServer, ServerConfig
from dblp.worker import Worker
from procs import free_port

SECRET = bytes(range(32))
ELEMENTS = 362 * 50
ROUNDS = 4


def test_the_decoder_refuses_forged_replayed_and_reordered_frames_and_counts_them():
    key = bytes(32)
    send = ctl.ControlMac(key)
    frames = [ctl.encode(ctl.Probe(k, ctl.UP, 1), send) for k in range(3)]
    dec = ctl.ControlDecoder()
    dec.key(ctl.ControlMac(key))
    assert dec.feed(frames[1]) == []  # seq 1 while 0 is due: reordered
    assert dec.feed(frames[0] + frames[1]) == [ctl.Probe(0, ctl.UP, 1), ctl.Probe(1, ctl.UP, 1)]
    assert dec.feed(frames[0]) == []  # seq 0 again: replayed
    assert dec.feed(ctl.encode(ctl.Bye("forged"))) == []  # no tag at all
    assert isinstance(dec.last_refused, ctl.Bye) and dec.last_refused.reason == "forged"
    tampered = bytearray(frames[2])
    tampered[9] ^= 1  # the pass number
    assert dec.feed(bytes(tampered)) == []
    reflected = ctl.encode(ctl.Probe(2, ctl.UP, 1), ctl.ControlMac(bytes([1]) * 32))  # another key
    assert dec.feed(reflected) == []
    assert dec.feed(frames[2]) == [ctl.Probe(2, ctl.UP, 1)]
    assert dec.refused == {"forged": 3, "replayed": 1, "reordered": 1}
    assert len(frames[0]) == len(ctl.encode(ctl.Probe(0, ctl.UP, 1))) + ctl.MAC_TRAILER


def test_nothing_behind_the_challenge_is_read_before_the_keys():
    dec = ctl.ControlDecoder(hold_after=ctl.CHALLENGE_TYPE)
    injected = ctl.encode(ctl.RoundStart(0, ctl.DOWN, 0.99))
    got = dec.feed(ctl.encode(ctl.Challenge(bytes(16), bytes(32))) + injected)
    assert [type(m) for m in got] == [ctl.Challenge]
    dec.key(ctl.ControlMac(bytes(32)))
    assert dec.feed(b"") == [] and dec.refused["forged"] == 1


def _recv_frame(s: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        part = s.recv(4 - len(head))
        if not part:
            raise ConnectionError
        head += part
    (n,) = struct.unpack("!I", head)
    body = b""
    while len(body) < n:
        part = s.recv(min(1 << 20, n - len(body)))
        if not part:
            raise ConnectionError
        body += part
    return head + body


class OnPath:
    """A proxy in the control path of one worker, without the secret: forwards frames, and
    injects a forged ROUND(1, down, 0.99) and a replay of a genuine ROUND toward the worker and a
    forged BYE toward the server."""

    def __init__(self, server_port: int, replay: bool, bye: bool) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.server_port, self.replay, self.bye = server_port, replay, bye
        self.injected: list[str] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        w, _ = self.listener.accept()
        s = socket.create_connection(("127.0.0.1", self.server_port))
        threading.Thread(target=self._pipe, args=(s, w, self._down), daemon=True).start()
        self._pipe(w, s, self._up)

    def _pipe(self, src: socket.socket, dst: socket.socket, hook) -> None:
        n = 0
        try:
            while True:
                frame = _recv_frame(src)
                dst.sendall(frame + hook(n, frame))
                n += 1
        except OSError:
            pass
        finally:
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _down(self, n: int, frame: bytes) -> bytes:
        if frame[4] != 3:  # ROUND
            return b""
        r, d = struct.unpack_from("!IB", frame, 5)
        if d == ctl.DOWN and r == 0:
            self.round0_down = frame
        if d == ctl.DOWN and r == 1:  # right behind the genuine announcement, in the same segment
            self.injected.append("forged ROUND")
            return ctl.encode(ctl.RoundStart(1, ctl.DOWN, 0.99))
        if d == ctl.DOWN and r == 2 and self.replay:  # a genuine frame of round 0, again
            self.injected.append("replayed ROUND")
            return self.round0_down
        return b""

    def _up(self, n: int, frame: bytes) -> bytes:
        if n == 3 and self.bye:  # HELLO, AUTH, then the worker's first tagged frame: a BYE behind it
            self.injected.append("forged BYE")
            return ctl.encode(ctl.Bye("worker done"))
        return b""


def _run(tmp_path: Path, insecure: bool) -> tuple[list[int], OnPath, list]:
    port = free_port()
    srv_rec, w_rec = tmp_path / "server.jsonl", tmp_path / "worker{}.jsonl"
    kw = dict(insecure=True) if insecure else dict(secret=SECRET)
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=port, workers=2, rounds=ROUNDS, accept_timeout=30,
                                       peer_timeout=20, records=str(srv_rec), **kw))
    proxy = OnPath(port, replay=not insecure, bye=not insecure)
    errors: list[BaseException] = []
    exact: list[int] = []

    def serve() -> None:
        try:
            srv.serve()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def work(wid: int, p: int) -> None:
        try:
            with Worker("127.0.0.1", p, elements=ELEMENTS, worker_id=wid, connect_timeout=10, peer_timeout=20,
                        records=str(w_rec).format(wid), **kw) as w:
                ok = 0
                for k in range(ROUNDS):
                    out = w.allreduce(np.full(ELEMENTS, float(wid + 1 + k), np.float32))
                    ok += bool(np.all(out == np.float32((1 + 2 + 2 * k) / 2)))
                exact.append(ok)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=serve), threading.Thread(target=work, args=(0, proxy.port)),
               threading.Thread(target=work, args=(1, port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    recs = list(read_records(srv_rec)) + [r for i in range(2) for r in read_records(str(w_rec).format(i))]
    return exact, proxy, recs


def test_an_on_path_attacker_cannot_inject_or_replay_control_messages(tmp_path):
    exact, proxy, recs = _run(tmp_path, insecure=False)
    assert sorted(proxy.injected) == ["forged BYE", "forged ROUND", "replayed ROUND"]
    assert exact == [ROUNDS, ROUNDS]  # every round bit-exact at both workers
    w0 = [r for r in recs if r.role == "worker" and r.worker == 0]
    assert [r.tolerance_down for r in w0] == [0.0] * ROUNDS  # the forged 0.99 was never applied
    assert w0[-1].extra["control_refused"] == {"forged": 1, "replayed": 1, "reordered": 0}
    srv_last = [r for r in recs if r.role == "server"][-1]
    assert srv_last.extra["control_refused"] == {"forged": 1}  # the BYE: the run went on
    assert tolerance_mismatches(recs) == []


def test_on_the_insecure_wire_the_forged_round_lands_and_the_records_flag_it(tmp_path):
    _, proxy, recs = _run(tmp_path, insecure=True)
    assert proxy.injected == ["forged ROUND"]
    bad = tolerance_mismatches(recs)
    assert [(b["worker"], b["round"], b["server_down"], b["worker_down"]) for b in bad] == [(0, 1, 0.0, 0.99)]
