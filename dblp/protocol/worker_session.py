"""The worker's round logic (Algorithm 4), sans I/O: S5 and S6 over the worker's sender and
broadcast receiver, with S7's COMMON and S8's compensation on the worker's side.

The rules are stated in :mod:`dblp.protocol.session`, which re-exports :class:`WorkerSession` (import it
from there); the socket worker (:mod:`dblp.transport.worker`), the SimPy model and the training exchange
drive it.
"""

from __future__ import annotations

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.compensation import PAPER, Compensation, UploadFeedback, fill_local
from dblp.protocol.core import DEFAULT_ORDER, DOWN_STREAM, DropCounters, EncodedRound, RoundSender, VirtualRound, send_order
from dblp.protocol.pacing import TokenBucket, make_pacer
from dblp.protocol.records import RoundRecord
from dblp.protocol.sessionbase import RecordContext, SessionBase, _drops, up_stream
from dblp.protocol.wire import SERVER_ID, ChunkLayout, zero_chunks


class WorkerSession(SessionBase):
    """Algorithm 4 for one worker: S5 and S6 over the worker's sender and broadcast receiver."""

    def __init__(
        self,
        layout: ChunkLayout,
        worker: int,
        *,
        run_id: int,
        context: RecordContext,
        order: str = DEFAULT_ORDER,
        seed: int = 0,
        pacer: TokenBucket | None = None,
        max_batch: int = 256,
        peer_addr: tuple[str, int] | None = None,
        consistency: str = "none",
        compensation: Compensation = PAPER,
    ) -> None:
        super().__init__(layout, run_id=run_id, context=context, order=order, seed=seed, max_batch=max_batch,
                         consistency=consistency, compensation=compensation)
        self.worker = worker
        self.pacer = pacer or make_pacer(context.send_rate_bps)
        self.receiver = self._receiver(SERVER_ID, ctl.DOWN, peer_addr)
        self._ufb = UploadFeedback(layout, compensation.feedback_bound) if compensation.upload_feedback else None
        self._own: np.ndarray | None = None  # this round's contribution (C2's local fill)
        self._common: dict[int, ctl.Common] = {}
        self._out: np.ndarray | None = None
        self._t_complete = 0.0
        self.sender: RoundSender | None = None
        self._announced: dict[tuple[int, int], tuple[ctl.RoundStart, float]] = {}
        self._up_headers: np.ndarray | None = None
        self._reported = DropCounters()  # drops already in a record
        self._t0 = self._t_send = self._t_sent = 0.0

    def handle_control(self, msg: ctl.Message, now: float) -> None:
        """ROUND announcements: kept until their round; a broadcast's tolerance goes to the open receiver.
        COMMON (S7): kept until the round finishes."""
        if isinstance(msg, ctl.Common):
            if self.consistency == "intersect" and msg.round == self.round:
                self._common[msg.round] = msg
            return
        if not isinstance(msg, ctl.RoundStart):
            return
        self._announced[(msg.round, msg.direction)] = (msg, now)
        if msg.direction == ctl.UP and msg.grant_bps > 0:  # R12: the next upload starts from the grant
            self.pacer.grant(msg.grant_bps)
        r = self.receiver
        if msg.direction == ctl.DOWN and r.round_no == msg.round and r.active:
            r.set_tolerance(msg.tolerance, now)

    def announced(self, k: int, direction: int) -> bool:
        return (k, direction) in self._announced

    def can_send(self) -> bool:
        """S5: ROUND(k, up) of the current round has arrived."""
        return (self.round, ctl.UP) in self._announced

    def begin_round(self, now: float, values: np.ndarray | None = None, out: np.ndarray | None = None,
                    t_ready: float | None = None) -> RoundSender:
        """S5: start sending this round's gradient (``None``: chunk indices only) and open the
        broadcast receiver into ``out``. ``t_ready`` is when the caller began waiting for the round."""
        k = self.round
        if not self.can_send():
            raise RuntimeError(f"round {k}: ROUND(up) not announced yet")
        self._t0 = now if t_ready is None else t_ready
        self._t_send = now
        order = send_order(self.layout.chunks, self.order, self.seed, k, up_stream(self.worker))
        if values is not None and self._ufb is not None:  # C3: the gradient plus what was not delivered
            values = self._ufb.contribution(values)
        self._own = values if self.compensation.broadcast_fill == "local" else None
        if values is not None:
            enc: EncodedRound | VirtualRound = EncodedRound(
                values, self.layout, round_no=k, run_id=self.run_id, sender=self.worker, order=order,
                buffer=self._up_headers)
            self._up_headers = enc.headers
        else:
            enc = VirtualRound(self.layout, k)
        self.sender = RoundSender(enc, direction=ctl.UP, now=now, order=order, pacer=self.pacer,
                                  max_batch=self.max_batch)
        r = self.receiver
        self._out = out
        r.begin_round(k, out, now)  # tolerance arrives with ROUND(k, down)
        if out is not None:
            r.expect_order(send_order(self.layout.chunks, self.order, self.seed, k, DOWN_STREAM))  # R10
        down = self._announced.get((k, ctl.DOWN))
        if down is not None:  # announced before we opened (simulated control can overtake)
            r.set_tolerance(down[0].tolerance, now)
        return self.sender

    def sent(self, now: float) -> None:
        """The upstream sender is done (STOP received): C3 keeps what it knows undelivered."""
        self._t_sent = now
        if self._ufb is not None and self.sender is not None and getattr(self.sender.enc, "values", None) is not None:
            self._ufb.delivered(self.sender.undelivered())

    def held(self, now: float) -> ctl.Held | None:
        """S7: the broadcast is complete - the HELD message to send the server (None outside ``intersect``)."""
        self._t_complete = now
        if self.consistency != "intersect":
            return None
        return ctl.Held(self.round, np.packbits(self.receiver.mask).tobytes())

    def can_finish(self) -> bool:
        """The broadcast is complete and, under S7, the server's COMMON of this round has arrived."""
        return self.receiver.complete and (self.consistency != "intersect" or self.round in self._common)

    def finish_round(self, now: float, extra: dict | None = None) -> RoundRecord:
        """The broadcast is complete: close the round (R9) and build its record (S6)."""
        k, r, s, c = self.round, self.receiver, self.sender, self.context
        assert s is not None
        extra = dict(extra or {})
        common = self._common.pop(k, None)
        if common is not None:  # S7: apply only the chunks every worker holds
            keep = common.mask(self.layout.chunks)
            if self._out is not None:
                zero_chunks(self._out.reshape(-1), self.layout, np.flatnonzero(~keep))
            extra["common"] = c.count(int(keep.sum()))
            extra["wait_common_s"] = now - self._t_complete
        if self._own is not None and self._out is not None:  # C2: the own contribution where the mean is missing
            extra["filled"] = c.count(fill_local(self._out, self._own, r.mask, self.layout))
        if self._ufb is not None:
            extra["residual_up_norm"] = self._ufb.added
        if not self.compensation.paper:
            extra["compensation"] = self.compensation.label()
        self._out = self._own = None
        r.finish_round()
        up_msg, _ = self._announced.pop((k, ctl.UP))
        down_msg, t_down = self._announced.pop((k, ctl.DOWN))
        self.round += 1
        return RoundRecord(
            source=c.source, role="worker", worker=self.worker, round=k, t_start=self._t0 + c.clock_offset,
            policy=c.policy, tolerance_up=up_msg.tolerance, tolerance_down=down_msg.tolerance, clr=down_msg.clr,
            chunks=c.count(self.layout.chunks), up_latency_s=self._t_sent - self._t_send,
            down_latency_s=now - t_down, round_latency_s=now - self._t0, up_sent=c.count(s.stats.sent),
            up_passes=s.stats.passes, up_received=c.count(s.stats.received), down_received=c.count(r.received),
            early_stop_up=s.stats.early_stop, send_rate_bps=self.pacer.rate_bps, order=c.order,
            **_drops(c, r, self._reported),
            extra={"wait_start_s": self._t_send - self._t0, "wait_server_s": t_down - self._t_sent,
                   "up_wait_reply_s": s.stats.wait_s, **extra},
        )
