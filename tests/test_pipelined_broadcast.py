"""Session rule S3b: the sharded mode's broadcast leaves at the reduce, its ROUND(down) after the norm.

A shard server knows its mean before the whole mean's norm (the shard servers' exchange waits for
the slowest shard). Its datagrams go at once; the tolerance follows; nothing of the outcome
changes: the workers get the exact mean, STOP comes at the announced tolerance, and a pass that
ends before the ROUND(down) does not make the receiver answer BITMAPs until it comes (the
transport holds that PROBE behind the ROUND).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.core import Receiver
from dblp.protocol.policy import FixedPolicy
from dblp.protocol.session import ControlToSend, RecordContext, RecordWritten, ReduceRequested, SenderStarted, ServerSession, \
    WorkerSession
from dblp.transport.shard import NormExchange
from dblp.protocol.wire import ChunkLayout, assemble_rows

from test_sharded import _grads, _sharded_run


def _deliver(sender, receiver, now: float) -> None:
    """Every datagram of the sender's current pass into the receiver, in order, none lost."""
    while (b := sender.datagrams_to_send(now)) is not None:
        rows, lengths = assemble_rows(b.headers, b.values, b.seqs, b.layout)
        receiver.receive_batch(rows, lengths, now)


def test_broadcast_begun_before_the_norm_delivers_the_exact_mean_and_stops_at_the_announced_tolerance():
    lay = ChunkLayout(362 * 9 + 5)
    ctx = RecordContext(source="test", policy="fixed", order="perm")
    policy = FixedPolicy(0.0)
    srv = ServerSession(lay, range(2), policy=policy, run_id=7, context=ctx, rounds=1)
    wks = [WorkerSession(lay, w, run_id=7, context=ctx) for w in range(2)]
    grads = [np.arange(lay.elements, dtype=np.float32) * (w + 1) / 64 for w in range(2)]
    outs = [np.full(lay.elements, np.nan, np.float32) for _ in range(2)]
    srv.start(0.0)
    for ev in srv.events():
        if isinstance(ev, ControlToSend):
            wks[ev.worker].handle_control(ev.message, 0.0)
    for w, wk in enumerate(wks):  # the upstreams, lossless
        snd = wk.begin_round(0.0, grads[w], outs[w])
        _deliver(snd, srv.receiver(w), 0.0)
        for m in srv.receiver(w).control_to_send():
            snd.handle_control(m, 0.0)
        assert snd.done
    srv.poll(0.0)
    assert [type(e) for e in srv.events()] == [ReduceRequested]
    mean = (grads[0] + grads[1]) * np.float32(0.5)

    srv.begin_broadcast(0.1, mean)
    started = srv.events()
    assert [type(e) for e in started] == [SenderStarted, SenderStarted]  # datagrams, no ROUND(down) yet
    assert not srv.announced and policy.tolerance == 0.0
    for ev in started:
        rcv = wks[ev.worker].receiver
        _deliver(ev.sender, rcv, 0.1)
        assert rcv.received == lay.chunks and not rcv.complete  # all in, but R5 waits for the tolerance
        assert rcv.control_to_send() == []  # no STOP before the tolerance
        assert [type(m) for m in ev.sender.control_to_send()] == [ctl.Probe]  # the transport holds it

    srv.broadcast(1.5, 0.2, extra={"shard": 0})
    announced = srv.events()
    assert [type(e) for e in announced] == [ControlToSend, ControlToSend] and srv.announced
    assert srv.norms == [1.5]
    for ev in announced:
        assert ev.message == ctl.RoundStart(0, ctl.DOWN, 0.0, False)
        wk = wks[ev.worker]
        wk.handle_control(ev.message, 0.2)
        stop = wk.receiver.control_to_send()
        assert stop == [ctl.Stop(0, ctl.DOWN, lay.chunks)]  # at the announced tolerance, at once
        assert np.array_equal(outs[ev.worker], mean)  # the exact mean, every chunk
        started[ev.worker].sender.handle_control(stop[0], 0.2)
    srv.poll(0.2)
    recs = [e.record for e in srv.events() if isinstance(e, RecordWritten)]
    assert [(r.worker, r.down_passes, r.down_received, r.tolerance_down, r.extra["shard"]) for r in recs] == \
        [(0, 1, lay.chunks, 0.0, 0), (1, 1, lay.chunks, 0.0, 0)]
    with pytest.raises(RuntimeError, match="begin_broadcast in phase"):
        srv.begin_broadcast(0.3, mean)


def test_slow_norm_exchange_finds_every_remote_shard_already_delivered(monkeypatch):
    """Real sockets, 3 shard servers: the hub answers the exchange 0.4 s late. Every shard of a
    worker is all in when its ROUND(down) arrives (the datagrams did not wait for it), the averages
    are exact, and no receiver answered a PROBE with a BITMAP."""
    real_total = NormExchange.total

    def late_total(self, round_no: int, sq_norm: float) -> float:
        if self.shard == 0:
            time.sleep(0.4)
        return real_total(self, round_no, sq_norm)

    monkeypatch.setattr(NormExchange, "total", late_total)
    seen: list[tuple[int, int, int]] = []  # (round, chunks held at ROUND(down), chunks) of remote shards
    bitmaps: list[int] = []
    real_handle = WorkerSession.handle_control
    real_bitmap = Receiver._bitmap

    def handle(self, msg, now):
        if isinstance(msg, ctl.RoundStart) and msg.direction == ctl.DOWN:
            seen.append((msg.round, self.receiver.received, self.layout.chunks))
        return real_handle(self, msg, now)

    def bitmap(self):
        bitmaps.append(self.round_no)
        return real_bitmap(self)

    monkeypatch.setattr(WorkerSession, "handle_control", handle)
    monkeypatch.setattr(Receiver, "_bitmap", bitmap)
    k, elements = 3, 358 * 40 * 3 + 11
    grad = _grads(elements)
    outs, servers, records = _sharded_run(k, elements, 2, grad)
    for r in range(2):
        want = (grad(0, r) + grad(1, r) + grad(2, r)) * np.float32(1.0 / k)
        for i in range(k):
            assert np.array_equal(outs[i][r], want), (i, r)
    # 3 workers x 3 shards x 2 rounds; the host-local shard's LOCAL pass is in as well
    assert len(seen) == 18 and all(held == chunks for _, held, chunks in seen), seen
    assert bitmaps == []  # each pass's PROBE came after the ROUND(down): answered by STOP at once
    total = sum(s.layout.chunks for s in servers)
    assert [(rec.up_passes, rec.down_received) for rec in records] == [(1, total)] * 6
