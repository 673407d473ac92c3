"""An on-path attacker writes into an authenticated control stream: the run ends at once, saying so.

Loopback only. A TCP proxy in one worker's control path forwards the stream frame by
frame and, without the run's secret, writes into it the way an on-path attacker does:

* in place of the genuine ROUND(1, down), a forged one of the same length (tolerance 0.99,
  a made-up tag): TCP then takes the forged bytes instead of the real ones, so the real
  frame never comes and every later frame is out of order;
* behind the genuine ROUND(1, down), an untagged forged one;
* behind the genuine ROUND(2, down), a replay of the genuine ROUND(0, down);
* in place of the worker's first tagged frame toward the server, an untagged BYE and the
  rest of the real frame after it (TCP's view of a shorter injected segment).

Each ends the run within 2 s of the injection, with a message naming tampering on both
sides, the reason in the records, and nothing the attacker sent applied. Before, the first
case waited the whole peer timeout and ended "nothing heard for 120 s ... peer dead".
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.records import read_records
from dblp.transport.server import ParameterServer, ServerConfig, ServerError
from dblp.transport.sockets import TamperError, tamper_message
from dblp.transport.worker import Worker, WorkerError, failed_reason
from hostile import FrameProxy
from procs import PY, ROOT, env, free_port

SECRET = bytes(range(32))
ELEMENTS = 362 * 50
ROUNDS = 5
PEER_TIMEOUT = 30.0  # far above the 2 s the tests allow: a run that waits for it fails them


class OnPath(FrameProxy):
    """A proxy between one worker and the server, without the secret, that writes into the stream
    once (``mode``, the module's docstring); ``injected_at`` is when it did (time.monotonic)."""

    def __init__(self, server_port: int, mode: str) -> None:
        self.mode = mode
        self.injected_at: float | None = None
        self.round0_down = b""
        super().__init__(server_port)

    def _mark(self) -> None:
        if self.injected_at is None:
            self.injected_at = time.monotonic()

    def down(self, n: int, frame: bytes) -> bytes:
        if frame[4] != 3 or self.injected_at is not None:  # ROUND only, and once
            return frame
        r, d = struct.unpack_from("!IB", frame, 5)
        if d == ctl.DOWN and r == 0:
            self.round0_down = frame
        if d == ctl.DOWN and r == 1 and self.mode == "round-in-place":
            (seq,) = struct.unpack_from("!Q", frame, len(frame) - ctl.MAC_TRAILER)
            mac = ctl.ControlMac(os.urandom(32))  # the attacker's guess at the key
            mac.seq = seq  # the sequence number it read off the real frame
            forged = ctl.encode(ctl.RoundStart(1, ctl.DOWN, 0.99), mac)
            assert len(forged) == len(frame)  # exactly the real frame's place in the stream
            self._mark()
            return forged
        if d == ctl.DOWN and r == 1 and self.mode == "round-behind":
            self._mark()
            return frame + ctl.encode(ctl.RoundStart(1, ctl.DOWN, 0.99))
        if d == ctl.DOWN and r == 2 and self.mode == "replay":
            self._mark()
            return frame + self.round0_down
        return frame

    def up(self, n: int, frame: bytes) -> bytes:
        if n == 2 and self.mode == "bye-in-place":  # HELLO, AUTH, then the worker's first tagged frame
            bye = ctl.encode(ctl.Bye("worker done"))
            assert len(bye) < len(frame)
            self._mark()
            return bye + frame[len(bye):]
        return frame


class Outcome:
    """What each side of a tampered run ended with, and when (time.monotonic)."""

    def __init__(self) -> None:
        self.errors: dict[str, BaseException] = {}
        self.ended: dict[str, float] = {}
        self.exact: dict[int, int] = {}
        self.served: int | None = None


def _run(tmp_path: Path, mode: str, on_worker_loss: str = "exit") -> tuple[Outcome, OnPath, list]:
    port = free_port()
    srv_rec, w_rec = tmp_path / "server.jsonl", tmp_path / "worker{}.jsonl"
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=port, workers=2, rounds=ROUNDS, accept_timeout=30,
                                       peer_timeout=PEER_TIMEOUT, records=str(srv_rec), secret=SECRET,
                                       on_worker_loss=on_worker_loss))
    proxy = OnPath(port, mode)
    out = Outcome()

    def serve() -> None:
        try:
            out.served = srv.serve()
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            out.errors["server"] = exc
        out.ended["server"] = time.monotonic()

    def work(wid: int, p: int) -> None:
        try:
            with Worker("127.0.0.1", p, elements=ELEMENTS, worker_id=wid, connect_timeout=10,
                        peer_timeout=PEER_TIMEOUT, records=str(w_rec).format(wid), secret=SECRET) as w:
                ok = 0
                for k in range(ROUNDS):
                    got = w.allreduce(np.full(ELEMENTS, float(wid + 1 + k), np.float32))
                    ok += bool(np.all(got == np.float32((1 + 2 + 2 * k) / 2)))
                out.exact[wid] = ok
        except BaseException as exc:  # noqa: BLE001
            out.errors[f"worker {wid}"] = exc
        out.ended[f"worker {wid}"] = time.monotonic()

    threads = [threading.Thread(target=serve), threading.Thread(target=work, args=(0, proxy.port)),
               threading.Thread(target=work, args=(1, port))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PEER_TIMEOUT + 30)
    assert not any(t.is_alive() for t in threads), out.errors
    recs = list(read_records(srv_rec)) + [r for i in range(2) if Path(str(w_rec).format(i)).exists()
                                          for r in read_records(str(w_rec).format(i))]
    return out, proxy, recs


def _took(out: Outcome, proxy: OnPath, who: str) -> float:
    assert proxy.injected_at is not None
    return out.ended[who] - proxy.injected_at


# In place: the real frames behind the forged one are out of order; how many of them the read that
# brought the forged one held (0 or more) is the timing's, and the message counts exactly those.
IN_PLACE = r"1 forged(, (\d+) out of order)?"


@pytest.mark.parametrize("mode, refused", [("round-in-place", IN_PLACE), ("round-behind", "1 forged"),
                                           ("replay", "1 replayed")])
def test_a_frame_written_into_the_servers_stream_ends_the_run_at_once_naming_tampering(tmp_path, mode, refused):
    out, proxy, recs = _run(tmp_path, mode)
    took = {who: _took(out, proxy, who) for who in ("worker 0", "server", "worker 1")}
    print(f"{mode}: from injection to the end of worker 0 {took['worker 0']:.3f} s, server "
          f"{took['server']:.3f} s, worker 1 {took['worker 1']:.3f} s")
    assert max(took.values()) < 2.0, took  # not the peer timeout's 30 s (before: 120 s by default)
    victim = str(out.errors["worker 0"])
    assert isinstance(out.errors["worker 0"], WorkerError)
    m = re.search(f"control stream of server failed authentication: {refused}; ending the run", victim)
    assert m, victim
    later = int(m.group(2) or 0) if mode == "round-in-place" else 0
    assert "nothing heard" not in victim and "peer dead" not in victim
    srv = str(out.errors["server"])  # the default --on-worker-loss exit: the server fails, naming why
    assert isinstance(out.errors["server"], ServerError)
    assert "worker 0 failed: " in srv and "control stream of server failed authentication" in srv, srv
    other = str(out.errors["worker 1"])  # the honest worker is told the same
    assert "server ended the run" in other and "control stream of server failed authentication" in other, other
    w0 = [r for r in recs if r.role == "worker" and r.worker == 0]
    assert all(r.tolerance_down == 0.0 for r in w0)  # the forged 0.99 was never applied
    failed = [r for r in w0 if "failed" in r.extra]
    assert len(failed) == 1 and failed[0].round == (1 if mode != "replay" else 2)
    assert m.group(0) in failed[0].extra["failed"]
    want = {IN_PLACE: {"forged": 1, "replayed": 0, "reordered": later},
            "1 forged": {"forged": 1, "replayed": 0, "reordered": 0},
            "1 replayed": {"forged": 0, "replayed": 1, "reordered": 0}}[refused]
    assert failed[0].extra["control_refused"] == want
    if mode != "replay":  # the frame the stream stopped being the server's at: the forged ROUND
        assert "the first refused said RoundStart(round=1, direction=1, tolerance=0.99" in victim, victim
    assert [r.round for r in w0 if "failed" not in r.extra] == list(range(failed[0].round))  # rounds before: whole
    srv_failed = [r for r in recs if r.role == "server" and "failed" in r.extra]
    assert [(r.worker, r.round) for r in srv_failed] == [(0, failed[0].round)]


def test_a_bye_written_into_the_workers_stream_ends_the_run_at_once_naming_tampering(tmp_path):
    """Before: a forged BYE at a real frame's place ended the run after ~5 s with "control frame
    length 0 out of range". Now the server refuses it at once as forged and says so to both workers."""
    out, proxy, recs = _run(tmp_path, "bye-in-place")
    took = {who: _took(out, proxy, who) for who in ("worker 0", "server", "worker 1")}
    print(f"bye-in-place: from injection to the end of worker 0 {took['worker 0']:.3f} s, server "
          f"{took['server']:.3f} s, worker 1 {took['worker 1']:.3f} s")
    assert max(took.values()) < 2.0, took
    srv = str(out.errors["server"])
    assert ("control stream of worker 0 failed authentication: 1 forged; bytes that are no frame (control frame "
            "length 0 out of range (limit 67108864 bytes)); ending the run") in srv, srv  # (the real frame's tail)
    assert "the first refused said Bye(reason='worker done')" in srv
    for wid in (0, 1):
        told = str(out.errors[f"worker {wid}"])
        assert "server ended the run" in told and "control stream of worker 0 failed authentication" in told, told
    srv_failed = [r for r in recs if r.role == "server" and "failed" in r.extra]
    assert len(srv_failed) == 1 and srv_failed[0].worker == 0
    assert srv_failed[0].extra["control_refused"] == {"forged": 1, "replayed": 0, "reordered": 0}
    w0_failed = [r for r in recs if r.role == "worker" and r.worker == 0 and "failed" in r.extra]
    assert len(w0_failed) == 1 and "the server ended the run" in w0_failed[0].extra["failed"]


def test_with_on_worker_loss_continue_the_tampered_worker_is_dropped_and_the_others_finish(tmp_path):
    out, proxy, recs = _run(tmp_path, "round-in-place", on_worker_loss="continue")
    assert "control stream of server failed authentication" in str(out.errors["worker 0"])
    assert "server" not in out.errors and "worker 1" not in out.errors, out.errors
    assert out.served == ROUNDS  # the server went on with worker 1 alone
    w1 = [r for r in recs if r.role == "worker" and r.worker == 1]
    assert [r.round for r in w1] == list(range(ROUNDS)) and all(r.tolerance_down == 0.0 for r in w1)


def test_a_worker_that_fails_says_so_and_the_server_applies_on_worker_loss():
    """Before: a worker leaving with an error said "worker done"; the server took it for an orderly
    end, went on with the others and exited 0 ("served 25 rounds") with a worker lost."""
    for rule, want_error in (("exit", True), ("continue", False)):
        srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=2, rounds=4, accept_timeout=30,
                                           peer_timeout=PEER_TIMEOUT, secret=SECRET, on_worker_loss=rule))
        errors: dict[str, BaseException] = {}
        served: list[int] = []

        def serve() -> None:
            try:
                served.append(srv.serve())
            except BaseException as exc:  # noqa: BLE001
                errors["server"] = exc

        def work(wid: int) -> None:
            try:
                with Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=wid, connect_timeout=10,
                            peer_timeout=PEER_TIMEOUT, secret=SECRET) as w:
                    for k in range(4):
                        if wid == 0 and k == 2:
                            raise RuntimeError("the training step blew up")
                        w.allreduce(np.full(ELEMENTS, 1.0, np.float32))
            except BaseException as exc:  # noqa: BLE001
                errors[f"worker {wid}"] = exc

        threads = [threading.Thread(target=serve)] + [threading.Thread(target=work, args=(i,)) for i in range(2)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(PEER_TIMEOUT + 10)
        assert time.monotonic() - t0 < 10
        assert str(errors["worker 0"]) == "the training step blew up"
        if want_error:
            assert "round 2: worker 0 failed: RuntimeError: the training step blew up" in str(errors["server"])
            assert "failed: round 2: worker 0 failed" in str(errors["worker 1"])
        else:
            assert set(errors) == {"worker 0"} and served == [4], errors


def test_the_goodbye_of_a_failing_worker_and_the_one_line_reason():
    assert failed_reason(None) == "worker done"
    assert failed_reason(KeyboardInterrupt()) == "worker done"  # stopped, not failing
    assert failed_reason(ValueError("bad")) == "failed: ValueError: bad"
    assert failed_reason(WorkerError("worker 0, round 3: x")) == "failed: worker 0, round 3: x"
    assert ctl.failure_of("failed: x") == "x" and ctl.failure_of("worker done") is None and ctl.failure_of(None) is None
    dec = ctl.ControlDecoder()
    dec.key(ctl.ControlMac(bytes(32)))
    dec.feed(ctl.encode(ctl.RoundStart(1, ctl.DOWN, 0.99)))
    assert tamper_message("server", dec) == (
        "control stream of server failed authentication: 1 forged; ending the run (an on-path attacker wrote "
        "into the stream: nothing it sent was applied); the first refused said RoundStart(round=1, direction=1, tolerance=0.99, "
        "clr=False, grant_bps=0.0)")
    assert issubclass(TamperError, Exception)


def test_the_cli_processes_end_within_2_s_of_an_injection_with_exit_2(tmp_path):
    """The real processes (python -m dblp server / worker) behind the proxy: the time from the forged
    ROUND to each process's exit, its status, its last line."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET.hex() + "\n")
    secret.chmod(0o600)
    port = free_port()
    auth = ["--secret-file", str(secret)]
    srv = subprocess.Popen([PY, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
                            "--iterations", "20", "--model", "1M", "--peer-timeout", "30s", *auth],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    try:
        assert "listening" in srv.stdout.readline()
        proxy = OnPath(port, "round-in-place")
        workers = [subprocess.Popen([PY, "-m", "dblp", "worker", "--server", f"127.0.0.1:{p}", "--id", str(i),
                                     "--iterations", "20", "--model", "1M", "--peer-timeout", "30s",
                                     "--records", str(tmp_path / f"w{i}.jsonl"), *auth],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
                   for i, p in enumerate((proxy.port, port))]
        procs = {"server": srv, "worker 0": workers[0], "worker 1": workers[1]}
        ended: dict[str, float] = {}
        deadline = time.monotonic() + 90
        while len(ended) < 3 and time.monotonic() < deadline:
            for who, p in procs.items():
                if who not in ended and p.poll() is not None:
                    ended[who] = time.monotonic()
            time.sleep(0.01)
        assert len(ended) == 3, ended
        logs = {who: p.communicate()[1] for who, p in procs.items()}
        took = {who: t - proxy.injected_at for who, t in ended.items()}
        print("from injection to exit: " + ", ".join(f"{w} {t:.3f} s (exit {procs[w].returncode})"
                                                      for w, t in took.items()))
        assert max(took.values()) < 2.0, (took, logs)
        assert {who: p.returncode for who, p in procs.items()} == {"server": 2, "worker 0": 2, "worker 1": 2}, logs
        assert re.search(f"control stream of server failed authentication: {IN_PLACE}; ending the run",
                         logs["worker 0"]), logs["worker 0"]
        assert "worker 0 failed: " in logs["server"] and "failed authentication" in logs["server"]
        assert "failed authentication" in logs["worker 1"]
        assert all("Traceback" not in log for log in logs.values()), logs
    finally:
        for p in (srv, *locals().get("workers", [])):
            if p.poll() is None:
                p.kill()


def _peer_pair() -> tuple[socket.socket, "object"]:
    """A keyed Peer reading one end of a TCP connection on loopback; the other end, to write into."""
    from dblp.transport.sockets import Peer
    from dblp.transport.udp import DataSocket

    lst = socket.create_server(("127.0.0.1", 0))
    far = socket.create_connection(lst.getsockname())
    near, _ = lst.accept()
    lst.close()
    near.setblocking(False)
    peer = Peer("server", near, DataSocket("127.0.0.1", 0), on_message=lambda p, m: None)
    peer.decoder.key(ctl.ControlMac(bytes(32)))
    return far, peer


def _read(peer) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        peer.read_control(time.monotonic())
        time.sleep(0.01)


def test_an_untagged_bye_before_the_first_authenticated_frame_is_quoted_not_called_tampering():
    """The server's refusal of a login sent before it held the keys (a handshake timeout, its own
    failure) is untagged, and the worker holds its keys already: it ends the login quoting it."""
    far, peer = _peer_pair()
    try:
        far.sendall(ctl.encode(ctl.Bye("refused: no AUTH within 10 s")))
        with pytest.raises(Exception) as err:
            _read(peer)
        assert not isinstance(err.value, TamperError)
        assert str(err.value) == ("server: ended the login with an unauthenticated BYE (its own refusal before the "
                                  "keys, or injected on the path): refused: no AUTH within 10 s")
    finally:
        far.close()
        peer.tcp.close()
        peer.udp.close()


def test_after_an_authenticated_frame_an_untagged_bye_is_tampering():
    far, peer = _peer_pair()
    try:
        far.sendall(ctl.encode(ctl.Meta({"x": 1}), ctl.ControlMac(bytes(32))) + ctl.encode(ctl.Bye("worker done")))
        with pytest.raises(TamperError, match=r"^control stream of server failed authentication: 1 forged; ending "
                                              r"the run .*the first refused said Bye\(reason='worker done'\)$"):
            _read(peer)
    finally:
        far.close()
        peer.tcp.close()
        peer.udp.close()
