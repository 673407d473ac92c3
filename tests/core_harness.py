"""Drives one sender and one receiver of the core directly, with scripted loss."""

from __future__ import annotations

from typing import Callable

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import EncodedRound, Receiver, RoundSender, send_order
from dblp.protocol.wire import ChunkLayout

RUN_ID = 0x1234ABCD


def wire_trip(msg: ctl.Message) -> ctl.Message:
    """Every control message crosses the real framing, as over TCP."""
    (out,) = ctl.ControlDecoder().feed(ctl.encode(msg))
    return out


def run_round(
    values: np.ndarray,
    tolerance: float,
    *,
    drop: Callable[[int, int], bool] = lambda seq, pass_no: False,
    mtu: int = 1500,
    order: str = "perm",
    round_no: int = 0,
    max_passes: int = 1000,
    batch: int = 64,
    receiver: Receiver | None = None,
    out: np.ndarray | None = None,
):
    """Returns (out, sender, receiver, delivered_seqs). ``drop(seq, pass)`` decides loss."""
    layout = ChunkLayout(values.size, mtu)
    # Rows stored in the sender's order, as the server and workers do: first
    # passes go out as slices of the encoded buffer.
    enc = EncodedRound(values, layout, round_no=round_no, run_id=RUN_ID, sender=1,
                       order=send_order(layout.chunks, order, 7, round_no, 0))
    snd = RoundSender(enc, direction=ctl.UP, now=0.0, order=enc.order, max_batch=batch)
    rcv = receiver or Receiver(layout, run_id=RUN_ID, expected_sender=1, direction=ctl.UP)
    out = np.full(values.size, np.nan, dtype=np.float32) if out is None else out
    rcv.begin_round(round_no, out, now=0.0, tolerance=tolerance)
    delivered = []
    now = 0.0
    while not snd.done:
        assert snd.stats.passes <= max_passes, "round did not converge"
        now += 0.001
        t = snd.get_timer()
        if t is not None:
            now = max(now, t)
        b = snd.datagrams_to_send(now)
        if b is not None:
            for i in range(len(b)):
                seq = int(b.seqs[i])
                if not drop(seq, snd.stats.passes):
                    rcv.receive_datagrams(b.rows[i, : b.lengths[i]].tobytes(), now)
                    delivered.append(seq)
                # the receiver's immediate STOP reaches the sender mid-pass
                for m in rcv.control_to_send():
                    snd.handle_control(wire_trip(m), now)
                if snd.done:
                    break
        for m in snd.control_to_send():
            rcv.handle_control(wire_trip(m), now)
        for m in rcv.control_to_send():
            snd.handle_control(wire_trip(m), now)
    return out, snd, rcv, delivered


def expected_zero_filled(values: np.ndarray, mask: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    exp = np.zeros_like(values, dtype=np.float32)
    cf = layout.chunk_floats
    for seq in np.flatnonzero(mask):
        exp[seq * cf : (seq + 1) * cf] = values[seq * cf : (seq + 1) * cf]
    return exp
