"""The sans-I/O core driven directly, with scripted loss: no sockets."""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_harness import RUN_ID, expected_zero_filled, run_round, wire_trip
from dblp.protocol import control as ctl
from dblp.protocol.core import BACKOFF_MAX_S, EncodedRound, Receiver, RoundSender, SendState, send_order
from dblp.protocol.policy import needed_chunks
from dblp.protocol.wire import ChunkLayout, ParameterError, crc_rows, encode_chunks, parse_headers


def vec(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_layout_fills_mtu():
    lay = ChunkLayout(1_000_000)
    assert lay.datagram_size + 28 == 1500
    assert lay.chunk_floats == 362
    assert lay.chunks == math.ceil(1_000_000 / 362)
    assert ChunkLayout(10, mtu=9000).datagram_size + 28 == 9000 - (9000 - 28 - 24) % 4


@pytest.mark.parametrize("mtu", [10, 55])
def test_mtu_too_small_is_refused_by_name(mtu):
    with pytest.raises(ParameterError, match="mtu"):
        ChunkLayout(100, mtu=mtu)


def test_lossless_round_reconstructs_exactly():
    v = vec(100_003)
    out, snd, rcv, _ = run_round(v, 0.0)
    assert np.array_equal(out, v)
    assert snd.stats.passes == 1 and snd.stats.sent == rcv.layout.chunks
    assert rcv.stats.drops.total() == 0


@pytest.mark.parametrize("p", [0.0, 0.008, 0.1, 0.408, 0.5])
def test_stop_at_exactly_ceil(p):
    v = vec(50_000)
    rng = np.random.default_rng(3)
    out, snd, rcv, delivered = run_round(v, p, drop=lambda s, k: rng.random() < 0.3)
    n = rcv.layout.chunks
    assert rcv.received == math.ceil(round((1 - p) * n, 9)) == needed_chunks(n, p)
    assert snd.done and snd.stats.received == rcv.received
    # every delivered chunk reconstructed bit-exactly, the rest zero-filled
    assert np.array_equal(out, expected_zero_filled(v, rcv.mask, rcv.layout))


def test_needed_chunks_avoids_float_error():
    assert needed_chunks(10, 0.4) == 6
    assert needed_chunks(1000, 0.008) == 992


def test_early_stop_mid_pass():
    v = vec(36_200)  # 100 chunks
    out, snd, rcv, delivered = run_round(v, 0.5, batch=1)
    assert snd.stats.early_stop
    assert snd.stats.passes == 1
    assert snd.stats.sent == 50  # the sender stopped the moment the receiver held 50
    assert rcv.received == 50


def test_in_order_sender_loses_the_tail_every_round():
    v = vec(36_200)
    masks = []
    for r in range(3):
        out, snd, rcv, _ = run_round(v, 0.5, order="inorder", batch=1, round_no=r)
        masks.append(rcv.mask.copy())
    assert all((m == masks[0]).all() for m in masks)
    assert not masks[0][50:].any()


def test_permutation_spreads_the_loss_across_rounds():
    v = vec(36_200)
    masks = [run_round(v, 0.5, order="perm", batch=1, round_no=r)[2].mask.copy() for r in range(6)]
    lost_ever = ~np.logical_and.reduce(masks)
    assert lost_ever.sum() > 90  # almost every chunk is missed in some round
    assert not np.array_equal(masks[0], masks[1])


def test_permutation_is_seeded_and_fresh_per_round():
    a = send_order(1000, "perm", 5, 1, 0)
    assert np.array_equal(a, send_order(1000, "perm", 5, 1, 0))
    assert not np.array_equal(a, send_order(1000, "perm", 5, 2, 0))
    assert np.array_equal(np.sort(a), np.arange(1000))
    with pytest.raises(ParameterError, match="order"):
        send_order(10, "random", 0, 0, 0)


def test_retransmits_only_missing_chunks():
    v = vec(36_200)
    first_pass_lost = set(range(0, 100, 7))
    out, snd, rcv, delivered = run_round(v, 0.0, drop=lambda s, k: k == 1 and s in first_pass_lost)
    assert snd.stats.passes == 2
    assert snd.stats.sent == 100 + len(first_pass_lost)
    assert np.array_equal(out, v)


def test_seventy_percent_burst_pass_counts_match_arithmetic():
    """At 70% loss, a 0.8% tolerance needs ~14 passes, 40.8% about 3."""
    v = vec(362 * 3000)
    for p, expect in [(0.008, 14), (0.408, 3)]:
        rng = np.random.default_rng(11)
        _, snd, rcv, _ = run_round(v, p, drop=lambda s, k: rng.random() < 0.7)
        predicted = next(k for k in range(1, 100) if 1 - 0.7**k >= 1 - p)
        assert predicted == expect
        assert abs(snd.stats.passes - predicted) <= 1


def _datagrams(v: np.ndarray, round_no: int = 0, sender: int = 1):
    lay = ChunkLayout(v.size)
    rows, lengths = encode_chunks(v, lay, np.arange(lay.chunks), run_id=RUN_ID, sender=sender, round_no=round_no)
    return lay, [rows[i, : lengths[i]].tobytes() for i in range(lay.chunks)]


def _receiver(lay, p=0.0, round_no=0, out=None):
    r = Receiver(lay, run_id=RUN_ID, expected_sender=1, direction=ctl.UP)
    out = np.full(lay.elements, 9.0, np.float32) if out is None else out
    r.begin_round(round_no, out, 0.0, tolerance=p)
    return r, out


def _one_round(n: int = 3620, p: float = 0.0) -> tuple[np.ndarray, ChunkLayout, list[bytes], Receiver, np.ndarray]:
    """A tensor of ``n`` floats, its round-0 datagrams, and a receiver of them with tolerance ``p`` and
    its output (9.0 where nothing was written)."""
    v = vec(n)
    lay, dg = _datagrams(v)
    r, out = _receiver(lay, p=p)
    return v, lay, dg, r, out


def _feed(r: Receiver, datagrams: Iterable[bytes]) -> None:
    """Each of ``datagrams`` to ``r`` in a call of its own, at t = 0."""
    for d in datagrams:
        r.receive_datagrams(d, 0.0)


def _send_pass(snd: RoundSender, now: float) -> None:
    """``snd``'s datagrams at ``now`` until it has none, then its control messages (the pass's probe)."""
    while snd.datagrams_to_send(now) is not None:
        pass
    snd.control_to_send()


def test_stale_round_datagram_is_dropped():
    v = vec(3620)
    lay, old = _datagrams(v * 0 + 7, round_no=4)
    _, new = _datagrams(v, round_no=5)
    r, out = _receiver(lay, round_no=5)
    _feed(r, old)  # round k arriving in round k+1
    assert r.stats.drops.stale == lay.chunks and r.received == 0
    _feed(r, new)
    assert np.array_equal(out, v)
    assert r.complete


def test_late_datagrams_after_stop_do_not_change_the_result():
    v, lay, dg, r, out = _one_round(p=0.5)
    _feed(r, dg[:5])
    assert r.complete
    frozen = out.copy()
    _feed(r, dg[5:])
    assert np.array_equal(out, frozen)
    assert r.stats.drops.stale == 5


def test_duplicates_counted_once_accepted():
    v, lay, dg, r, out = _one_round()
    _feed(r, dg[:3] + dg[:3] + dg[1:2])
    assert r.received == 3 and r.stats.drops.duplicate == 4


def test_chunk_indices_without_bytes_follow_the_same_rules():
    """receive_chunks (the simulator's datagrams): runs of the shared index order (taken without
    checking their order), other arrays, repeats, out-of-range and another round's chunks count
    as their datagrams would."""
    from dblp.protocol.core import index_order

    lay = ChunkLayout(20_000)
    idx = index_order(lay.chunks)
    assert not idx.flags.writeable and idx is index_order(lay.chunks)
    r = Receiver(lay, run_id=RUN_ID, expected_sender=1, direction=ctl.UP)
    r.begin_round(3, None, 0.0)
    assert r.receive_chunks(3, idx[2:6], 0.0) == 4  # a run of the index order
    assert r.receive_chunks(3, idx[4:8], 0.0) == 2 and r.stats.drops.duplicate == 2  # 4, 5 again
    assert r.receive_chunks(3, np.array([9, 8]), 0.0) == 2  # not increasing: the general path
    assert r.receive_chunks(3, np.array([10, 10, 11]), 0.0) == 2 and r.stats.drops.duplicate == 3
    assert r.receive_chunks(3, idx[::2][6:8], 0.0) == 2  # a strided view: 12, 14
    assert r.receive_chunks(2, idx[20:25], 0.0) == 0 and r.stats.drops.stale == 5  # another round
    assert r.receive_chunks(3, np.array([lay.chunks - 1, lay.chunks]), 0.0) == 1
    assert r.stats.drops.out_of_range == 1
    assert r.received == 13 and np.flatnonzero(r.mask).tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14,
                                                                     lay.chunks - 1]


def test_duplicates_inside_one_gro_batch():
    v, lay, dg, r, out = _one_round()
    batch = b"".join([dg[0], dg[1], dg[0], dg[2]])
    assert r.receive_datagrams(batch, 0.0, seg_size=len(dg[0])) == 3
    assert r.stats.drops.duplicate == 1


def test_corrupt_truncated_foreign_and_out_of_range():
    v, lay, dg, r, out = _one_round()
    flipped = bytearray(dg[0]); flipped[100] ^= 0x01
    r.receive_datagrams(bytes(flipped), 0.0)
    assert r.stats.drops.corrupt == 1
    r.receive_datagrams(dg[1][:-4], 0.0)
    assert r.stats.drops.wrong_length == 1
    r.receive_datagrams(dg[1][:10], 0.0)
    assert r.stats.drops.malformed == 1
    r.receive_datagrams(b"", 0.0)
    assert r.stats.drops.malformed == 2
    _, other = _datagrams(v, sender=2)
    r.receive_datagrams(other[3], 0.0)
    assert r.stats.drops.foreign == 1
    # an out-of-range seq with a valid CRC
    rows = np.frombuffer(dg[2], np.uint8).copy().reshape(1, -1)
    h = parse_headers(rows)
    h["seq"] = 10_000
    h["crc"] = crc_rows(rows)[0]
    r.receive_datagrams(rows.tobytes(), 0.0)
    assert r.stats.drops.out_of_range == 1
    assert r.received == 0
    assert (out == 9.0).all()  # nothing written


def test_foreign_source_address_is_dropped():
    v = vec(3620)
    lay, dg = _datagrams(v)
    r = Receiver(lay, run_id=RUN_ID, expected_sender=1, direction=ctl.UP, peer_addr=("10.0.0.1", 5000))
    r.begin_round(0, np.zeros(lay.elements, np.float32), 0.0, tolerance=0.0)
    r.receive_datagrams(dg[0], 0.0, addr=("10.0.0.9", 5000))
    assert r.stats.drops.foreign == 1 and r.received == 0
    r.receive_datagrams(dg[0], 0.0, addr=("10.0.0.1", 5000))
    assert r.received == 1


def test_reordering_is_harmless():
    v, lay, dg, r, out = _one_round(36_200)
    _feed(r, (dg[i] for i in np.random.default_rng(2).permutation(len(dg))))
    assert np.array_equal(out, v)


def test_probe_answers_bitmap_then_stop():
    v, lay, dg, r, out = _one_round()
    _feed(r, dg[:4])
    r.handle_control(ctl.Probe(0, ctl.UP, 1), 0.0)
    (bm,) = r.control_to_send()
    bm = wire_trip(bm)
    assert isinstance(bm, ctl.Bitmap) and bm.received == 4
    assert list(np.flatnonzero(bm.mask(lay.chunks))) == [0, 1, 2, 3]
    _feed(r, dg[4:])
    (stop,) = r.control_to_send()  # sent without waiting for a probe
    assert isinstance(stop, ctl.Stop) and stop.received == lay.chunks
    r.handle_control(ctl.Probe(0, ctl.UP, 2), 0.0)
    assert r.control_to_send() == []  # R5: the STOP is already on the reliable channel, not sent twice


def test_tolerance_may_arrive_after_the_data():
    v = vec(3620)
    lay, dg = _datagrams(v)
    r = Receiver(lay, run_id=RUN_ID, expected_sender=1, direction=ctl.UP)
    out = np.zeros(lay.elements, np.float32)
    r.begin_round(0, out, 0.0)
    _feed(r, dg[:6])
    assert not r.complete and r.received == 6
    r.set_tolerance(0.5, 0.0)
    assert r.complete


def test_outage_backs_off_instead_of_spinning():
    v = vec(3620)
    lay = ChunkLayout(v.size)
    snd = RoundSender(EncodedRound(v, lay, round_no=0, run_id=1, sender=1), direction=ctl.UP, now=0.0)
    now = 0.0
    delays = []
    for _ in range(12):
        _send_pass(snd, now)
        snd.handle_control(ctl.Bitmap(0, ctl.UP, 0, np.packbits(np.zeros(lay.chunks, bool)).tobytes()), now)
        if snd.state is SendState.BACKOFF:
            t = snd.get_timer()
            delays.append(t - now)
            assert snd.datagrams_to_send(now) is None  # nothing before the timer
            now = t
    assert delays[0] == pytest.approx(0.001) and max(delays) == pytest.approx(BACKOFF_MAX_S)
    # the path recovers: progress resets the backoff at once
    _send_pass(snd, now)
    snd.handle_control(ctl.Bitmap(0, ctl.UP, 3, np.packbits(np.arange(lay.chunks) < 3).tobytes()), now)
    assert snd.state is SendState.SENDING


def test_sender_measures_its_wait_for_replies_and_backoff():
    """wait_s: PROBE -> BITMAP, PROBE -> STOP and R8 backoff, never time spent sending."""
    v = vec(3620)
    lay = ChunkLayout(v.size)
    snd = RoundSender(EncodedRound(v, lay, round_no=0, run_id=1, sender=1), direction=ctl.UP, now=0.0)

    _send_pass(snd, 1.0)  # pass 1 ends at t = 1.0 (the probe goes out)
    none = np.packbits(np.zeros(lay.chunks, bool)).tobytes()
    snd.handle_control(ctl.Bitmap(0, ctl.UP, 1, none), 1.25)  # progress: pass 2 at once
    assert snd.stats.wait_s == pytest.approx(0.25)
    _send_pass(snd, 2.0)
    snd.handle_control(ctl.Bitmap(0, ctl.UP, 1, none), 2.5)  # no progress: R8 backoff of 1 ms
    assert snd.state is SendState.BACKOFF
    _send_pass(snd, snd.get_timer())  # pass 3 starts after the backoff, ends at once
    assert snd.stats.wait_s == pytest.approx(0.25 + 0.5 + 0.001)
    snd.handle_control(ctl.Stop(0, ctl.UP, lay.chunks), 2.501 + 0.1)
    assert snd.done and snd.stats.passes == 3
    assert snd.stats.wait_s == pytest.approx(0.25 + 0.5 + 0.001 + 0.1)


def test_control_messages_of_other_rounds_are_ignored():
    v = vec(3620)
    lay = ChunkLayout(v.size)
    snd = RoundSender(EncodedRound(v, lay, round_no=3, run_id=1, sender=1), direction=ctl.UP, now=0.0)
    snd.handle_control(ctl.Stop(2, ctl.UP, 10), 0.0)
    snd.handle_control(ctl.Stop(3, ctl.DOWN, 10), 0.0)
    assert not snd.done and snd.stats.ignored_control == 2
    snd.handle_control(ctl.Stop(3, ctl.UP, 10), 0.0)
    assert snd.done


def test_control_decoder_rejects_garbage_and_reassembles():
    msgs = [ctl.RoundStart(1, ctl.DOWN, 0.408, True), ctl.Probe(1, ctl.UP, 2), ctl.Stop(9, 0, 5), ctl.Bye("x"),
            ctl.Hello(2, 4000, {"elements": 5, "names": ["w"], "shapes": [[5]]}), ctl.Meta({"a": 1}),
            ctl.Bitmap(1, 1, 2, np.packbits(np.array([1, 0, 1], bool)).tobytes())]
    data = b"".join(ctl.encode(m) for m in msgs)
    dec = ctl.ControlDecoder()
    got = []
    for i in range(0, len(data), 3):  # TCP may cut anywhere
        got += dec.feed(data[i : i + 3])
    assert got == msgs
    with pytest.raises(ctl.ControlError):
        ctl.ControlDecoder().feed(b"\x00\x00\x00\x02\x63\x00")
    with pytest.raises(ctl.ControlError):
        ctl.ControlDecoder().feed(b"\xff\xff\xff\xff\x01")
    with pytest.raises(ctl.ControlError):
        ctl.ControlDecoder().feed(b"\x00\x00\x00\x02\x03\x00")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 20_000),
    p=st.sampled_from([0.0, 0.008, 0.024, 0.2, 0.408, 0.9]),
    loss=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**16),
    order=st.sampled_from(["perm", "inorder"]),
    mtu=st.sampled_from([1500, 200, 9000]),
)
def test_property_any_loss_pattern(n, p, loss, seed, order, mtu):
    v = vec(n, seed)
    rng = np.random.default_rng(seed)
    out, snd, rcv, _ = run_round(v, p, drop=lambda s, k: rng.random() < loss, order=order, mtu=mtu)
    lay = rcv.layout
    assert rcv.received >= needed_chunks(lay.chunks, p)
    assert rcv.received == int(rcv.mask.sum())
    assert np.array_equal(out, expected_zero_filled(v, rcv.mask, lay))


def test_block_order_permutes_runs_of_chunks_and_spreads_loss():
    from dblp.protocol.core import ORDER_BLOCK

    n = 10 * ORDER_BLOCK + 17  # a short last block
    a = send_order(n, "blocks", 5, 1, 0)
    assert np.array_equal(np.sort(a), np.arange(n))
    starts = a[np.flatnonzero(np.diff(a, prepend=-2) != 1)]
    assert all(s % ORDER_BLOCK == 0 for s in starts)  # runs begin on block boundaries, in index order inside
    assert not np.array_equal(a, np.sort(a))
    assert not np.array_equal(a, send_order(n, "blocks", 5, 2, 0))  # fresh each round
    assert np.array_equal(a, send_order(n, "blocks", 5, 1, 0))  # and seeded
    v = vec(362 * 40 * ORDER_BLOCK)
    masks = [run_round(v, 0.5, order="blocks", batch=1, round_no=r)[2].mask.copy() for r in range(6)]
    lost_ever = ~np.logical_and.reduce(masks)
    assert lost_ever.mean() > 0.9  # the tail is not always the part that is lost


def test_one_encoding_feeds_senders_on_several_threads():
    """The server's broadcast encoding is shared by its senders, which its parallel event loops drive
    from several threads (dblp.transport.sockets.pump_parallel): retransmission lookups and lazy encoding
    racing each other must give every thread the headers a lone thread gets."""
    import threading

    layout = ChunkLayout(358 * 300 + 7, key=b"k" * 16)
    values = np.random.default_rng(0).standard_normal(layout.elements).astype(np.float32)
    order = send_order(layout.chunks, "blocks", 1, 3, 0)
    seqs = np.random.default_rng(1).permutation(layout.chunks)
    want = EncodedRound(values, layout, round_no=3, run_id=9, sender=0xFFFF, order=order).take(seqs)[0]
    errors: list[BaseException] = []
    for _ in range(100):
        enc = EncodedRound(values, layout, round_no=3, run_id=9, sender=0xFFFF, order=order)
        go = threading.Barrier(4)

        def take() -> None:
            try:
                go.wait()
                assert np.array_equal(enc.take(seqs)[0], want)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        ts = [threading.Thread(target=take) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors, errors[:3]
