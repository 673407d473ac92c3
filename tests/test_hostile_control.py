"""Hostile clients on a live server's control port: refused by name, never in the way of the real workers.

A real :class:`~dblp.transport.server.ParameterServer` (in a thread) and real
:class:`~dblp.transport.worker.Worker` objects on loopback; the hostile clients
speak raw TCP. Each hostile case must be refused with a BYE that says why,
the run must start without waiting for a silent client, the server's
memory must not grow with what a HELLO claims, and the real workers'
averaged gradients must stay exact.
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import time

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.worker import Worker, WorkerError
from hostile import Threads, first_message
from procs import free_port

ELEMENTS = 362 * 50
ROUNDS = 3


def hello_frame(body: dict | bytes) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return struct.pack("!IB", len(raw) + 1, 1) + raw


def valid(worker: int, elements: int = ELEMENTS) -> dict:
    return {"worker": worker, "udp_port": 9, "spec": {"elements": elements, "names": [], "shapes": []},
            "version": ctl.PROTOCOL_VERSION}


class Run:
    """A server thread plus worker threads that check every averaged gradient exactly."""

    def __init__(self, workers: int = 2, **cfg) -> None:
        self.port = free_port()
        self.srv = ParameterServer(ServerConfig(host="127.0.0.1", port=self.port, workers=workers, rounds=ROUNDS,
                                                accept_timeout=30, **cfg))
        self.exact: list[int] = []
        self.started = time.monotonic()
        self.first_round_s: float | None = None
        self.run = Threads()
        self.errors = self.run.errors
        self.run.start(self.srv.serve)

    def start_worker(self, wid: int, n: int) -> None:
        def work() -> None:
            with Worker("127.0.0.1", self.port, elements=ELEMENTS, worker_id=wid, connect_timeout=10) as w:
                ok = 0
                for k in range(ROUNDS):
                    g = np.full(ELEMENTS, float(wid + 1 + k), np.float32)
                    out = w.allreduce(g)
                    if self.first_round_s is None:
                        self.first_round_s = time.monotonic() - self.started
                    want = np.float32(sum(i + 1 + k for i in range(n)) / n)
                    ok += bool(np.all(out == want))
                self.exact.append(ok)

        self.run.start(work)

    def join(self) -> None:
        self.run.join()
        assert not self.errors, self.errors


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _peak_rss_kib() -> int:
    """This process's peak resident size since the last reset (VmHWM), in KiB; ru_maxrss where /proc lacks it."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss_kib() -> int:
    """Reset the peak to the current resident size (``5`` into /proc/self/clear_refs), so that what an earlier
    test made pytest hold cannot hide a growth here; returns the peak after the reset, in KiB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _peak_rss_kib()


def test_bad_hellos_are_refused_by_name_and_the_run_stays_exact():
    run = Run(workers=2, handshake_timeout=30)
    cases = {
        "silent": (b"\x00\x00\x00", None),  # 3 bytes of a frame, then nothing
        "huge": (hello_frame(valid(-1, 10**12)), "GiB"),
        "type": (hello_frame({**valid(-1), "spec": {"elements": "x"}}), "spec.elements must be an integer"),
        "range": (hello_frame(valid(99)), "worker id 99 is out of range"),
        "json": (hello_frame(b"[1, 2"), "malformed control message"),
        "kind": (ctl.encode(ctl.Bye("hi")), "expected HELLO, got Bye"),
        "version": (hello_frame({**valid(-1), "version": 7}), "protocol version 7"),
    }
    rss0 = _reset_peak_rss_kib()
    socks = {}
    for name, (frame, _) in cases.items():
        socks[name] = connect(run.port)
        socks[name].sendall(frame)
    replies = {name: first_message(socks[name]) for name in cases if name != "silent"}
    for name, (_, why) in cases.items():
        if why is not None:
            assert isinstance(replies[name], ctl.Bye) and why in replies[name].reason, (name, replies[name])
    run.start_worker(0, 2)
    deadline = time.monotonic() + 30  # worker 0's login is through: a second claim of id 0 is refused
    while 0 not in run.srv.logged_in:  # (a 0.5 s sleep here: refused for want of authentication instead
        assert time.monotonic() < deadline and not run.errors, run.errors  # when worker 0 came late)
        time.sleep(0.005)
    dup = connect(run.port)
    dup.sendall(hello_frame(valid(0)))
    reply = first_message(dup)
    assert isinstance(reply, ctl.Bye) and "worker id 0 is taken" in reply.reason
    run.start_worker(1, 2)
    run.join()
    assert run.exact == [ROUNDS, ROUNDS]  # every round bit-exact at both workers
    assert run.srv.logged_in == [0, 1]  # the refused claims never logged in
    # the silent client held up nothing (its handshake deadline is 30 s) and was let go at the start
    assert run.first_round_s is not None and run.first_round_s < 10
    silent = first_message(socks["silent"])
    assert silent is None or (isinstance(silent, ctl.Bye) and "has its workers" in silent.reason)
    # a HELLO claiming 10^12 elements made the server allocate nothing (peak resident size, KiB)
    assert _peak_rss_kib() - rss0 < 200 * 1024
    for s in [*socks.values(), dup]:
        s.close()


def test_a_silent_connection_is_dropped_at_its_deadline():
    run = Run(workers=1, handshake_timeout=0.5)
    silent = connect(run.port)
    silent.sendall(b"\x00\x00\x00\x07")  # 4 of 7 promised bytes, then nothing
    t = time.monotonic()
    reply = first_message(silent)
    assert isinstance(reply, ctl.Bye) and "no HELLO within 0.5 s" in reply.reason
    assert time.monotonic() - t < 3
    run.start_worker(0, 1)
    run.join()
    assert run.exact == [ROUNDS]


def test_a_worker_with_another_tensor_size_than_the_server_is_told_so():
    run = Run(workers=1, elements=ELEMENTS)
    with pytest.raises(WorkerError, match="this run's tensor has 18,100"):
        with Worker("127.0.0.1", run.port, elements=ELEMENTS + 1, connect_timeout=10, peer_timeout=10):
            pass
    run.start_worker(0, 1)
    run.join()
    assert run.exact == [ROUNDS]


@pytest.mark.parametrize("mode", ["exit", "continue"])
def test_a_silent_worker_is_named_and_continue_mode_logs_it_once(mode, caplog):
    """Worker 1 connects and then never sends: the server names it (not worker 0) after peer_timeout."""
    port = free_port()
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=port, workers=2, rounds=ROUNDS, accept_timeout=30,
                                       peer_timeout=1.0, on_worker_loss=mode))
    results: list[int] = []

    def worker0() -> None:
        with Worker("127.0.0.1", port, elements=ELEMENTS, worker_id=0, peer_timeout=10) as w:
            for _ in range(ROUNDS):
                w.allreduce(np.ones(ELEMENTS, np.float32))
                results.append(1)

    run = Threads()
    errors = run.errors
    run.start(srv.serve)
    run.start(worker0)
    with caplog.at_level("ERROR", logger="dblp.transport.server"):
        silent = Worker("127.0.0.1", port, elements=ELEMENTS, worker_id=1, peer_timeout=30).connect()
        run.join(30)
    silent.close()
    if mode == "exit":
        server_err = next(e for e in errors if not isinstance(e, WorkerError))
        assert "waiting for worker 1 " in str(server_err) and "worker 0" not in str(server_err)
        assert results == []  # worker 0's first round never completed: the server ended the run
    else:
        assert errors == [] and results == [1] * ROUNDS  # worker 0 went on alone
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "waiting for worker 1 " in lines[0] and "continuing with 1 of 2" in lines[0]
