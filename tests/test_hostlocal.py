"""The host-local data path (dblp.transport.hostlocal): a worker and the server on its host share a slot.

Real sockets for control, a real shared-memory file for data: the local worker's rounds are
exact and carry no datagram; the slot's name is gone once the server attached; a HELLO naming a
slot that is not there, not ours or of the wrong size is refused with the reason while the real
workers' run goes on; the leftovers of a killed worker are found by their creator's process id.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.transport.hostlocal import LOCAL_DIR, PREFIX, LocalSlot, LocalSlotError, slots
from dblp.protocol.policy import FixedPolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.shard import find_local_shard
from dblp.transport.worker import Worker

SECRET = b"h" * 32
ELEMENTS = 358 * 40 + 11  # several chunks, a short last one


def _mine() -> list[str]:
    return sorted(p.name for p in LOCAL_DIR.glob(f"{PREFIX}{os.getpid()}-*"))


def _grad(i: int, r: int) -> np.ndarray:
    """Exact in float32 (multiples of 1/64 below 2^10): the mean does not depend on the order of sums."""
    return (np.random.default_rng(100 * r + i).integers(-4096, 4096, ELEMENTS) / 64).astype(np.float32)


def _run(srv: ParameterServer, workers: list[Worker], rounds: int, before=None):
    outs: list[list[np.ndarray]] = [[] for _ in workers]
    errors: list[BaseException] = []
    seen: dict = {}

    def serve() -> None:
        try:
            srv.accept_workers()
            seen["server_local"] = sorted(w.wid for w in srv.workers if w.peer.local is not None)
            # no copy on the host-local path's server side: it receives in the slot, reduces into it
            seen["in_slot"] = [(np.shares_memory(srv.session.buffer(w.wid), w.peer.local[1]),
                                np.shares_memory(srv.mean, w.peer.local[0]))
                               for w in srv.workers if w.peer.local is not None]
            srv.serve()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def work(i: int) -> None:
        try:
            with workers[i] as w:
                if i == 0:
                    seen["slots_after_connect"] = _mine()
                for r in range(rounds):
                    outs[i].append(np.array(w.allreduce(_grad(i, r)), copy=True))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=serve)] + [threading.Thread(target=work, args=(i,))
                                                  for i in range(len(workers))]
    threads[0].start()
    if before is not None:  # answered before any worker connects (else it may find the server full)
        before()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return outs, seen


def _server(workers: int = 2, rounds: int = 3) -> ParameterServer:
    return ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=workers, elements=ELEMENTS,
                                        rounds=rounds, policy=FixedPolicy(0.0), peer_timeout=20, secret=SECRET))


def test_a_local_worker_averages_exactly_without_a_datagram_and_leaves_no_file():
    srv = _server()
    local = Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=0, secret=SECRET, local=True)
    net = Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=1, secret=SECRET)
    outs, seen = _run(srv, [local, net], 3)
    for r in range(3):
        want = (_grad(0, r) + _grad(1, r)) * np.float32(0.5)
        assert np.array_equal(outs[0][r], want) and np.array_equal(outs[1][r], want), r
    assert seen["server_local"] == [0]
    assert seen["in_slot"] == [(True, True)]
    assert seen["slots_after_connect"] == []  # unlinked once the server attached
    assert _mine() == []
    chunks = srv.layout.chunks
    rec_local, rec_net = local.last_record, net.last_record
    assert rec_local.down_received == rec_local.up_received == chunks  # every chunk, through the slot
    assert rec_local.up_passes == 1
    assert rec_local.stale == rec_local.duplicate == 0
    assert local.peer is None and net.peer is None  # closed
    assert rec_net.down_received == chunks


def _raw_hello(port: int, local: str) -> str:
    """An insecure-wire client whose HELLO names ``local``; returns the server's answer (BYE text)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(ctl.encode(ctl.Hello(-1, 9, {"elements": ELEMENTS, "names": [], "shapes": []}, local=local)))
        dec, got = ctl.ControlDecoder(), []
        while not got:
            data = s.recv(65536)
            if not data:
                return ""
            got = dec.feed(data)
        return got[0].reason if isinstance(got[0], ctl.Bye) else type(got[0]).__name__


@pytest.mark.parametrize("case", ["missing", "wrong_size", "symlink"])
def test_a_hello_naming_a_bad_slot_is_refused_and_the_run_goes_on(case, tmp_path):
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=2, elements=ELEMENTS, rounds=2,
                                       policy=FixedPolicy(0.0), peer_timeout=20, insecure=True))
    path = f"/dev/shm/{PREFIX}{os.getpid()}-{'ab' * 16}"
    if case == "wrong_size":
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
    elif case == "symlink":
        os.symlink(tmp_path / "elsewhere", path)
    answers: list[str] = []
    workers = [Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=i, insecure=True) for i in range(2)]
    try:
        outs, _ = _run(srv, workers, 2, before=lambda: answers.append(_raw_hello(srv.port, path)))
    finally:
        if os.path.lexists(path):
            os.unlink(path)
    why = {"missing": "No such file", "wrong_size": "holds 64 bytes", "symlink": "cannot open"}[case]
    assert answers[0].startswith("refused: host-local slot:") and why in answers[0], answers
    assert srv.refused == {"hello": 1}
    for r in range(2):
        want = (_grad(0, r) + _grad(1, r)) * np.float32(0.5)
        assert np.array_equal(outs[0][r], want) and np.array_equal(outs[1][r], want)


def test_a_hello_naming_a_path_outside_the_slots_is_malformed():
    d = {"worker": -1, "udp_port": 9, "version": 1, "spec": {"elements": 5}, "local": "/etc/passwd"}
    import json

    body = json.dumps(d).encode()
    frame = len(body + b"x").to_bytes(4, "big") + bytes([1]) + body
    with pytest.raises(ctl.ControlError, match="local must be a host-local slot's path"):
        ctl.ControlDecoder().feed(frame)
    with pytest.raises(LocalSlotError, match="not a host-local slot's path"):
        LocalSlot.open("/dev/shm/../etc/passwd", 5)


def test_slot_round_trip_and_leftovers_of_a_dead_creator():
    slot = LocalSlot.create(10)
    try:
        slot.up[:] = np.arange(10, dtype=np.float32)
        other = LocalSlot.open(slot.path, 10)
        assert np.array_equal(other.up, np.arange(10, dtype=np.float32))
        other.down[:] = 7
        assert np.all(slot.down == 7)
        assert oct(os.stat(slot.path).st_mode & 0o777) == "0o600"
        other.close()
    finally:
        slot.unlink()
        slot.close()
    # a slot named after a process that is gone is a leftover; ours (alive) is not
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = LOCAL_DIR / f"{PREFIX}{dead}-{'cd' * 16}"
    stale.write_bytes(b"")
    live = LocalSlot.create(4)
    try:
        found = dict(slots())
        assert found[stale] == int(dead) and found[Path(live.path)] == os.getpid()
        if os.geteuid() == 0:  # python -m emulation.cleanup removes it (and only it)
            from emulation.cleanup import cleanup

            # a private, empty registry: only the slot sweep, never another engineer's live runs
            done = cleanup(verbose=False, registry=Path(tempfile.mkdtemp()), sweeps=frozenset({"slots"}))
            assert str(stale) in done["slots"]
            assert not stale.exists() and os.path.exists(live.path)
    finally:
        stale.unlink(missing_ok=True)
        live.unlink()
        live.close()


def test_find_local_shard_by_address():
    # one server at an address of this host: that shard; every server on loopback: the worker's own
    assert find_local_shard([("203.0.113.1", 1), ("127.0.0.1", 2)]) == 1
    assert find_local_shard([("127.0.0.1", 1), ("127.0.0.1", 2)], worker_id=1) == 1
    assert find_local_shard([("127.0.0.1", 1), ("127.0.0.1", 2)]) is None
    assert find_local_shard([("203.0.113.1", 1), ("203.0.113.2", 2)], worker_id=0) is None


def test_a_worker_that_cannot_make_its_slot_uses_the_network(monkeypatch, tmp_path, caplog):
    import dblp.transport.hostlocal

    monkeypatch.setattr(dblp.transport.hostlocal, "LOCAL_DIR", tmp_path / "absent")  # like a missing or full /dev/shm
    srv = _server()
    local = Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=0, secret=SECRET, local=True)
    net = Worker("127.0.0.1", srv.port, elements=ELEMENTS, worker_id=1, secret=SECRET)
    with caplog.at_level("WARNING", logger="dblp.transport.worker"):
        outs, seen = _run(srv, [local, net], 2)
    assert seen["server_local"] == []
    assert "goes over the network instead" in caplog.text
    for r in range(2):
        want = (_grad(0, r) + _grad(1, r)) * np.float32(0.5)
        assert np.array_equal(outs[0][r], want) and np.array_equal(outs[1][r], want), r
