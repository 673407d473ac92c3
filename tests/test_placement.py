"""Receiving payloads in place (core rule R10) over real sockets.

The transport aims each datagram's payload at the tensor slot of the chunk
the sender's order says comes next; the receiver validates it there. These
tests send real datagrams (GSO runs and one per call) and check the result
against the tensor bit for bit, that predictions hit when the order is
known, and that wrong predictions, stale, corrupt and foreign datagrams
never survive into the result (their slots are overwritten by a valid copy
or zero-filled at STOP).
"""

from __future__ import annotations

import select
import socket
import time

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.transport import udp
from dblp.protocol import wire
from dblp.protocol.core import Receiver, send_order
from dblp.protocol.wire import ChunkLayout

pytestmark = pytest.mark.skipif(not udp.place_available(),
                                reason="placement off (C helper not built, or DBLP_NO_C / DBLP_NO_PLACE)")

RUN = 0x5151
SENDER = 2


def _pair(fast):
    rx, tx = udp.DataSocket("127.0.0.1", 0, fast=fast), udp.DataSocket("127.0.0.1", 0, fast=fast)
    return rx, tx


def _send(tx, rx, v, lay, seqs, round_no=4, run_id=RUN, sender=SENDER):
    seqs = np.asarray(seqs, np.int64)
    hdr = wire.encode_headers(v, lay, seqs, run_id=run_id, sender=sender, round_no=round_no)
    tx.send_chunks(hdr, v, seqs, lay.payload_lengths(seqs) + 24, lay, ("127.0.0.1", rx.port))


def _drain(rx, recv: Receiver, now=1.0, want=None, idle=0.3):
    """Feed everything queued through recv_place / receive_placed; returns datagrams placed."""
    width = recv.layout.datagram_size
    rows = np.empty((2048, width), np.uint8)
    lens, srcs, aims = (np.zeros(2048, np.int64) for _ in range(3))
    crcs = np.zeros(2048, np.uint32)
    placed = 0
    while select.select([rx.sock], [], [], idle)[0]:
        plan = recv.placement()
        if plan is None:
            k = rx.recv_rows(rows, lens, srcs)
            recv.receive_batch(rows[:k], lens[:k], now)
        else:
            k, p = rx.recv_place(rows, lens, srcs, aims, crcs, plan)
            placed += p
            recv.receive_placed(rows[:k], lens[:k], aims[:k], now, crcs=crcs[:k])
        if want is not None and recv.received >= want:
            break
    return placed


def _recv_once(rx, recv):
    """One recv_place call on what is queued: (rows, lengths, aims, crcs, k, placed)."""
    time.sleep(0.1)
    rows = np.empty((2048, recv.layout.datagram_size), np.uint8)
    lens, srcs, aims = (np.zeros(2048, np.int64) for _ in range(3))
    crcs = np.zeros(2048, np.uint32)
    k, placed = rx.recv_place(rows, lens, srcs, aims, crcs, recv.placement())
    return rows, lens, aims, crcs, k, placed


def _receiver(lay, round_no=4, out=None, tolerance=None, order=None):
    r = Receiver(lay, run_id=RUN, expected_sender=SENDER, direction=ctl.UP)
    out = np.full(lay.elements, np.nan, np.float32) if out is None else out
    r.begin_round(round_no, out, 0.0, tolerance=tolerance)
    if order is not None:
        r.expect_order(order)
    return r, out


@pytest.mark.parametrize("fast", [None, False])
@pytest.mark.parametrize("order", ["blocks", "perm"])
def test_a_round_in_the_expected_order_lands_in_place_bit_exact(fast, order):
    lay = ChunkLayout(362 * 3000 + 101)
    v = np.random.default_rng(1).standard_normal(lay.elements).astype(np.float32)
    seqs = send_order(lay.chunks, order, 7, 4, 3)
    recv, out = _receiver(lay, tolerance=0.0, order=seqs)
    rx, tx = _pair(fast)
    try:
        _send(tx, rx, v, lay, seqs)
        placed = _drain(rx, recv, want=lay.chunks)
    finally:
        rx.close()
        tx.close()
    assert recv.complete and recv.received == lay.chunks
    assert np.array_equal(out, v)
    # every datagram but the tensor's (short) last chunk is received in place
    assert placed >= lay.chunks - 1 - 2 * (lay.chunks // 2048 + 1), placed
    assert recv.stats.drops.corrupt == 0 and recv.stats.drops.duplicate == 0
    assert recv.placement() is None  # nothing is placed after STOP


@pytest.mark.parametrize("fast", [None, False])
def test_wrong_predictions_are_moved_not_lost(fast):
    """The receiver expects one order, the sender uses another: payloads land
    in wrong slots, are moved back to their rows and accepted from there."""
    lay = ChunkLayout(362 * 1500)
    v = np.random.default_rng(2).standard_normal(lay.elements).astype(np.float32)
    recv, out = _receiver(lay, tolerance=0.0, order=send_order(lay.chunks, "blocks", 7, 4, 3))
    rx, tx = _pair(fast)
    try:
        _send(tx, rx, v, lay, np.random.default_rng(3).permutation(lay.chunks))
        placed = _drain(rx, recv, want=lay.chunks)
    finally:
        rx.close()
        tx.close()
    assert recv.received == lay.chunks and np.array_equal(out, v)
    assert placed < lay.chunks // 4  # mostly mispredicted, yet exact


@pytest.mark.parametrize("fast", [None, False])
def test_stale_corrupt_and_foreign_datagrams_never_reach_the_result(fast):
    """Bad datagrams arrive first, aimed at the very slots the good ones need:
    they scribble there, fail R4, and the slots end exact (good copy) or zero
    (still missing at STOP)."""
    lay = ChunkLayout(362 * 800)
    n = lay.chunks
    v = np.random.default_rng(4).standard_normal(lay.elements).astype(np.float32)
    junk = np.full(lay.elements, 1234.5, np.float32)
    order = np.arange(n)
    recv, out = _receiver(lay, order=order)  # tolerance comes later, as for a worker's broadcast
    rx, tx = _pair(fast)
    foreign = udp.DataSocket("127.0.0.1", 0, fast=fast)
    try:
        _send(tx, rx, junk, lay, order, round_no=3)  # stale: the previous round
        _send(tx, rx, junk, lay, order[: n // 2], run_id=RUN + 1)  # another run
        _send(tx, rx, junk, lay, order[: n // 2], sender=SENDER + 1)  # another worker's id
        hdr = wire.encode_headers(junk, lay, order[: n // 2], run_id=RUN, sender=SENDER, round_no=4)
        hdr[:, 4] ^= 0xFF  # corrupt CRC fields
        tx.send_chunks(hdr, junk, order[: n // 2], lay.payload_lengths(order[: n // 2]) + 24, lay,
                       ("127.0.0.1", rx.port))
        _drain(rx, recv)
        assert recv.received == 0
        d = recv.stats.drops
        assert d.stale == n and d.foreign == n // 2 * 2 and d.corrupt == n // 2
        # now 90% of the good round, in order; the last 10% never arrives
        good = order[: int(n * 0.9)]
        _send(tx, rx, v, lay, good)
        _drain(rx, recv)
        assert recv.received == good.size
        recv.set_tolerance(0.1 + 1e-9, 2.0)  # the threshold holds: STOP, zero-fill (R7)
    finally:
        rx.close()
        tx.close()
        foreign.close()
    assert recv.complete
    cf = lay.chunk_floats
    got = out.reshape(-1)
    have = np.zeros(lay.elements, bool)
    for s in good.tolist():
        have[s * cf : (s + 1) * cf] = True
    assert np.array_equal(got[have], v[have])
    assert np.all(got[~have] == 0.0)  # no junk, no NaN left from before the round


def test_a_foreign_source_is_dropped_even_when_it_names_the_right_chunk():
    """Same run id, sender id, round and valid CRC, but another source address:
    the transport marks it foreign; the placed payload is not accepted."""
    lay = ChunkLayout(362 * 200)
    v = np.random.default_rng(5).standard_normal(lay.elements).astype(np.float32)
    recv, out = _receiver(lay, tolerance=0.0)
    rx, tx = _pair(None)
    try:
        _send(tx, rx, v, lay, np.arange(lay.chunks))
        rows, lens, aims, crcs, k, placed = _recv_once(rx, recv)
        assert k == lay.chunks and placed == lay.chunks - 1
        recv.receive_placed(rows[:k], lens[:k], aims[:k], 1.0, foreign=np.ones(k, bool), crcs=crcs[:k])
    finally:
        rx.close()
        tx.close()
    assert recv.received == 0 and recv.stats.drops.foreign == lay.chunks


def test_crcs_taken_in_recv_place_equal_the_receivers_own():
    lay = ChunkLayout(362 * 100)
    v = np.random.default_rng(6).standard_normal(lay.elements).astype(np.float32)
    recv, out = _receiver(lay)
    rx, tx = _pair(None)
    try:
        _send(tx, rx, v, lay, np.arange(lay.chunks))
        rows, lens, aims, crcs, k, placed = _recv_once(rx, recv)
    finally:
        rx.close()
        tx.close()
    p = aims[:k] >= 0
    assert p.sum() == placed == lay.chunks - 1
    mine = wire.crc_placed(rows[:k][p, :24], out, aims[:k][p], lay)
    assert np.array_equal(crcs[:k][p], mine)
    assert np.array_equal(mine, wire.parse_headers(rows[:k][p])["crc"])


def test_odd_sized_runs_are_cut_into_rows_under_placement():
    """A GRO run of another segment size lands across header/slot pairs; it is
    gathered back and cut into rows (counted malformed; one longer than a row,
    wrong_length), and the slots it
    touched are fixed by the good round that follows."""
    lay = ChunkLayout(362 * 400)
    v = np.random.default_rng(7).standard_normal(lay.elements).astype(np.float32)
    recv, out = _receiver(lay, tolerance=0.0)
    rx = udp.DataSocket("127.0.0.1", 0)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = udp.DataSocket("127.0.0.1", 0)
    try:
        for i in range(40):
            raw.sendto(bytes([i]) * 700, ("127.0.0.1", rx.port))
        raw.sendto(b"\xee" * 3000, ("127.0.0.1", rx.port))
        time.sleep(0.1)
        _drain(rx, recv)
        d = recv.stats.drops
        assert recv.received == 0 and d.malformed + d.corrupt == 40
        assert d.wrong_length == 1  # the 3000-byte datagram: longer than a row, so never of exact length (R4)
        _send(tx, rx, v, lay, np.arange(lay.chunks))
        _drain(rx, recv, want=lay.chunks)
    finally:
        rx.close()
        tx.close()
        raw.close()
    assert recv.complete and np.array_equal(out, v)


def test_recv_place_refuses_inconsistent_arguments():
    from dblp._fastpath import recv_place

    lay = ChunkLayout(362 * 10)
    recv, _ = _receiver(lay)
    plan = recv.placement()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ok = dict(rows=np.empty((64, lay.datagram_size), np.uint8), lens=np.zeros(64, np.int64),
              srcs=np.zeros(64, np.int64), aims=np.zeros(64, np.int64), crcs=np.zeros(64, np.uint32))
    try:
        def call(**kw):
            a = {**ok, **kw}
            return recv_place(s.fileno(), a["rows"], a["lens"], a["srcs"], a["aims"], plan.out, plan.mask,
                              a.get("claim", plan.claim), plan.order, plan.pos, plan.cursor, a["crcs"],
                              a.get("cb", plan.chunk_bytes), 0, 1, a.get("key", b""))

        assert call()[0] == 0  # nothing queued
        with pytest.raises(ValueError, match="\\+ chunk_bytes"):
            call(rows=np.empty((64, 100), np.uint8))
        with pytest.raises(ValueError, match="\\+ chunk_bytes"):  # a key makes the header 40 bytes
            call(key=bytes(16))
        with pytest.raises(ValueError, match="16 bytes"):
            call(key=b"short")
        with pytest.raises(ValueError, match="int64 per row"):
            call(aims=np.zeros(3, np.int64))
        with pytest.raises(ValueError, match="same chunks"):
            call(claim=np.zeros(3, np.uint8))
    finally:
        s.close()
    with pytest.raises(ValueError, match="permutation"):
        recv.expect_order(np.zeros(lay.chunks, np.int64))
    with pytest.raises(ValueError, match="permutation"):
        recv.expect_order(np.arange(lay.chunks + 1))
