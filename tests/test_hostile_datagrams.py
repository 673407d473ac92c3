"""Hostile data at a live receiver: oversized datagrams and drops between rounds are counted.

Real UDP and TCP sockets on loopback, the transport's own receive loop
(:meth:`dblp.transport.sockets.Peer.read_data`) on every receive path: the C
helper receiving in place (R10), the C helper into rows, and the Python
fallback; each with and without GRO.
"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

import dblp.transport.udp as udp_mod
from dblp.protocol import control as ctl
from dblp.protocol.core import Receiver
from dblp.protocol.records import read_records
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.sockets import Peer
from dblp.transport.udp import DataSocket
from dblp.protocol.wire import ChunkLayout, encode_chunks
from dblp.transport.worker import Worker
from procs import free_port

RUN_ID = 0x0BAD5EED


@pytest.fixture
def tcp_pair():
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    yield a, b
    for s in (a, b, srv):
        s.close()


@pytest.mark.parametrize("path", ["c-place", "c-rows", "python"])
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "gro"])
def test_oversized_datagrams_count_as_wrong_length_on_every_receive_path(path, fast, tcp_pair, monkeypatch):
    if path != "python" and udp_mod._c_recv_rows is None:
        pytest.skip("C helper not built")
    if path != "c-place":
        monkeypatch.setattr(udp_mod, "_c_recv_place", None)
    if path == "python":
        monkeypatch.setattr(udp_mod, "_c_recv_rows", None)
    layout = ChunkLayout(362 * 40)
    values = np.arange(layout.elements, dtype=np.float32)
    rows, lens = encode_chunks(values, layout, np.arange(layout.chunks), run_id=RUN_ID, sender=1, round_no=0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    rx = DataSocket("127.0.0.1", 0, fast=fast)
    try:
        peer = Peer("sender", tcp_pair[0], rx, on_message=lambda p, m: None)
        peer.receiver = Receiver(layout, run_id=RUN_ID, expected_sender=1, direction=ctl.UP,
                                 peer_addr=tx.getsockname())
        out = np.full(layout.elements, np.nan, np.float32)
        peer.receiver.begin_round(0, out, 0.0, tolerance=0.0)
        peer.receiver.expect_order(np.arange(layout.chunks))
        odd = np.arange(1, layout.chunks, 2)
        for i in range(layout.chunks):  # every chunk with 4 bytes of trailing garbage: a valid prefix
            tx.sendto(rows[i, : lens[i]].tobytes() + b"\x00\x01\x02\x03", ("127.0.0.1", rx.port))
        for i in odd:  # then the odd chunks, well-formed
            tx.sendto(rows[i, : lens[i]].tobytes(), ("127.0.0.1", rx.port))
        peer.read_data(0.0)
        r = peer.receiver
        assert r.total_drops.wrong_length == layout.chunks
        assert r.received == odd.size
        assert r.mask.sum() == odd.size and r.mask[odd].all()
        got = out.reshape(layout.chunks, -1)
        assert np.array_equal(got[odd], values.reshape(layout.chunks, -1)[odd])
    finally:
        tx.close()
        rx.close()


def test_drops_between_rounds_land_in_the_next_worker_record(tmp_path):
    """Garbage that reaches a worker while it computes is counted in its next record."""
    port = free_port()
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=port, workers=1, rounds=3, accept_timeout=30))
    t = threading.Thread(target=srv.serve)
    t.start()
    junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with Worker("127.0.0.1", port, elements=362 * 20, records=str(tmp_path / "w.jsonl")) as w:
            g = np.ones(362 * 20, np.float32)
            w.allreduce(g)
            for _ in range(50):  # between rounds: nobody reads the socket now
                junk.sendto(b"\x00" * 100, ("127.0.0.1", w.peer.udp.port))
            w.allreduce(g)
            w.allreduce(g)
            lifetime = w.peer.receiver.total_drops.total()
    finally:
        junk.close()
        t.join(30)
    recs = list(read_records(tmp_path / "w.jsonl"))
    per_record = sum(r.stale + r.duplicate + r.corrupt + r.foreign + r.malformed + r.out_of_range + r.wrong_length
                     for r in recs)
    assert lifetime >= 50
    assert per_record == lifetime  # nothing classified is missing from the records
    assert recs[1].foreign >= 50  # the junk came from a foreign port: counted in the round after it arrived
