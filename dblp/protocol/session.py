"""The round logic of the parameter server and the worker (Algorithms 3 and 4), sans I/O.

:mod:`dblp.protocol.core` states the per-transfer rules R1-R10 and :mod:`dblp.protocol.pacing` the pacing
rules R11-R17; this module states, once, what a *round* is made of on each side, so the
socket server and worker (:mod:`dblp.transport.server`, :mod:`dblp.transport.worker`), the SimPy model
(:mod:`dblp.sim.model`) and the training exchange drive the same logic and cannot drift
apart (a broadcast's chunk order, for one, is chosen here and nowhere else). The server's
side, :class:`ServerSession`, is implemented here, the worker's in :mod:`dblp.protocol.worker_session`,
what both share in :mod:`dblp.protocol.sessionbase`; this module re-exports their names, so callers
import them from here.

Round rules, each stated once here:

S1  The server opens worker ``w``'s upstream of round ``k`` under the
    policy's current tolerance and announces it with ROUND(k, up, p, clr);
    it receives into a buffer of its own per worker (Alg. 3 l.3-5).
S2  When every live worker's upstream is complete (the core's STOP rule),
    the server closes those rounds and asks its driver to reduce: the mean
    and its L2 norm are data work the driver does (numpy/C on real hosts, a
    model in the simulator) (l.6-7).
S3  The norm goes to the tolerance policy (CLR detection, eq. (1)) - unless
    it is not finite (a driver without the aggregation guard of
    :mod:`dblp.protocol.reduce`): then the policy is not fed and its tolerance and
    CLR state hold for the round (recorded ``norm_not_finite``); the
    returned ``p_down`` is announced with ROUND(k, down, p_down, clr) and the
    mean broadcast to every live worker in one chunk order
    (:data:`dblp.protocol.core.DOWN_STREAM`), encoded once (l.8-10).
S3b A driver whose norm comes later than its mean (the sharded mode, whose
    norm is the shard servers' exchange, :mod:`dblp.transport.shard`) may start the
    broadcast's datagrams at the reduce (:meth:`ServerSession.begin_broadcast`)
    and announce ROUND(k, down, p_down) once the norm is in
    (:meth:`ServerSession.broadcast`): the workers' receivers are open since
    S5 and take the datagrams before it (the core's R5 waits for the
    tolerance), so nothing of the protocol's outcome changes - the STOP still
    comes at the announced tolerance - but the exchange's wait for the slowest
    shard no longer holds the broadcast back.
S4  As soon as worker ``w``'s broadcast is stopped, the server writes that
    worker's record of round ``k`` and opens its upstream of round ``k+1``
    (S1) - without waiting for slower workers.
S5  A worker sends round ``k`` only after ROUND(k, up) arrived; it sends with
    R3 stream ``1 + w``; it opens its broadcast receiver at the same time,
    whose tolerance arrives with ROUND(k, down) (Alg. 4).
S6  Records (:class:`dblp.protocol.records.RoundRecord`) are built here and only here; each
    counts every datagram its receiver dropped since the previous record.
S7  Consistency mode ``intersect`` (beyond the paper, whose bounded-loss
    broadcast lets replicas drift: each worker loses its own chunks): a worker
    whose broadcast is complete reports the chunks it holds (HELD); once every
    live worker has, the server announces their intersection (COMMON) and
    every worker applies exactly those chunks, zeroing the rest - so all
    replicas apply the same update. Cost: one control round trip after the
    slowest worker's broadcast.
S8  Loss compensation (:mod:`dblp.protocol.compensation`, C1-C6; the paper's zero-fill by default): the
    server states the run's options in META; its driver reduces by C1's estimate
    (:attr:`ServerSession.compensation`), the server session adds and carries C4's residual
    around each broadcast, and each worker session carries C3's residual across its uploads and
    fills by C2 as its round finishes. Receivers on both sides stop by the run's stop rule (core
    R5b). Every record states the options (``extra.compensation``) and the residuals' norms.

A session never reads a clock: every call takes ``now`` in the driver's
seconds (monotonic or simulated); ``clock_offset`` turns it into the
records' ``t_start`` (wall-clock epoch on real hosts, 0 in simulation).
Drivers take events with :meth:`ServerSession.next_event`, in the style of
aioquic's ``QuicConnection.next_event``.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.compensation import PAPER, BroadcastFeedback, Compensation
from dblp.protocol.core import (DEFAULT_ORDER, DOWN_STREAM, DropCounters, EncodedRound, Receiver, RoundSender, VirtualRound,
                   send_order)
from dblp.protocol.pacing import ServerPacing, TokenBucket, make_pacer
from dblp.protocol.records import RoundRecord
from dblp.protocol.sessionbase import CONSISTENCY, RecordContext, SessionBase, _drops, up_stream
from dblp.protocol.wire import SERVER_ID, ChunkLayout
from dblp.protocol.worker_session import WorkerSession

__all__ = [
    "CONSISTENCY", "ControlToSend", "Event", "Phase", "RecordContext", "RecordWritten", "ReduceRequested",
    "RoundEnded", "RoundOpening", "SenderStarted", "ServerSession", "WorkerSession", "up_stream",
]


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlToSend:
    """Send ``message`` on the control channel to ``worker`` (server side) or to the server."""

    worker: int
    message: ctl.Message


@dataclass(frozen=True)
class SenderStarted:
    """Drive ``sender`` (a :class:`~dblp.protocol.core.RoundSender`) toward ``worker`` until it is done."""

    worker: int
    sender: RoundSender


@dataclass(frozen=True)
class RoundOpening:
    """Round ``round`` is about to open (before its first ROUND(up) leaves): a clock for
    what must happen exactly at a round's start (the emulation's loss bursts)."""

    round: int


@dataclass(frozen=True)
class ReduceRequested:
    """Every live worker's upstream of ``round`` is in: reduce, then call ``broadcast``."""

    round: int
    workers: tuple[int, ...]


@dataclass(frozen=True)
class RecordWritten:
    """A round record is ready (write it, keep it, or watch it)."""

    record: RoundRecord


@dataclass(frozen=True)
class RoundEnded:
    """Every live worker's broadcast of ``round`` was stopped."""

    round: int


Event = ControlToSend | SenderStarted | RoundOpening | ReduceRequested | RecordWritten | RoundEnded


class Phase(enum.Enum):
    UPSTREAM = "upstream"  # receiving the workers' gradients
    REDUCE = "reduce"  # waiting for the driver's reduce
    BROADCAST = "broadcast"  # sending the mean
    DONE = "done"  # the configured number of rounds is served




# -- the server -------------------------------------------------------------------------------


@dataclass
class _Up:
    """The server's view of one worker: its upstream receiver and broadcast sender."""

    receiver: Receiver
    buffer: np.ndarray | None
    tolerance: float = 0.0
    sender: RoundSender | None = None
    recorded: bool = True  # this round's record is written (nothing to do until the next broadcast)
    reported: DropCounters = field(default_factory=DropCounters)  # drops already in a record


class ServerSession(SessionBase):
    """Algorithm 3 for one run: S1-S4, S6 and S7 over one core receiver and sender per worker.

    ``values=True`` gives each worker a receive buffer (real data);
    ``values=False`` runs the core on chunk indices alone
    (:class:`~dblp.protocol.core.VirtualRound`), as the simulator does.
    """

    def __init__(
        self,
        layout: ChunkLayout,
        workers: Iterable[int],
        *,
        policy: Any,
        run_id: int,
        context: RecordContext,
        order: str = DEFAULT_ORDER,
        seed: int = 0,
        rounds: int | None = None,
        values: bool = True,
        pacer: Callable[[int], TokenBucket] | None = None,
        max_batch: int = 256,
        peer_addrs: dict[int, tuple[str, int]] | None = None,
        consistency: str = "none",
        compensation: Compensation = PAPER,
    ) -> None:
        super().__init__(layout, run_id=run_id, context=context, order=order, seed=seed, max_batch=max_batch,
                         consistency=consistency, compensation=compensation)
        self._bfb = BroadcastFeedback(layout, compensation.feedback_bound) \
            if compensation.broadcast_feedback and values else None  # C4
        self._mean: np.ndarray | None = None  # the mean of the broadcast in flight (C4)
        self._unsent_all: np.ndarray | None = None  # C4: chunks no broadcast stream handed out
        self._common_mask: dict[int, np.ndarray] = {}  # C4 under S7: round -> chunks every replica applied
        self._held: dict[int, dict[int, np.ndarray]] = {}  # S7: round -> worker -> chunks it holds
        self.common: dict[int, int] = {}  # S7: round -> chunks every worker applied
        self._t_last = 0.0  # when the last HELD arrived
        self.policy = policy
        self.rounds = rounds
        self.values = values
        # one pacer per worker for the whole run: a self-pacing one learns across rounds (R11); the broadcast's
        # streams share the server's link, so self-paced they share one rate (R14), and the uploads get one grant
        # (R12) - granted when the server self-paces too (the run's pacing is the same on both sides; a fixed-rate
        # run grants nothing). dblp.protocol.pacing decides the rates; this session says when.
        self_paced = pacer is None and context.send_rate_bps is None
        rates = self.rates = ServerPacing(layout.datagram_size) if self_paced else None
        if rates is not None:
            pacer = lambda w: rates.member()  # noqa: E731
        self._pacer = pacer or (lambda w: make_pacer(context.send_rate_bps))
        self._pacers: dict[int, TokenBucket] = {}
        addrs = peer_addrs or {}
        self.peers: dict[int, _Up] = {
            w: _Up(self._receiver(w, ctl.UP, addrs.get(w)), np.zeros(layout.elements, np.float32) if values else None)
            for w in workers
        }
        for p in self.peers.values():  # R15: a self-paced run's uploads are told their flood's arrival rate
            p.receiver.tell_rate = self_paced
        self._opened = -1  # the last round announced as opening
        self._unrecorded = 0  # broadcasts of this round not yet recorded (S4)
        self.phase = Phase.UPSTREAM
        self.norms: list[float] = []
        self._events: deque[Event] = deque()
        self._t0 = 0.0
        self._t_up = 0.0
        self._p_down = 0.0
        self._clr = False
        self._norm = float("nan")
        self._extra: dict = {}
        self._down_headers: np.ndarray | None = None
        self._begun = False  # S3b: the broadcast is under way, its ROUND(down) not yet out

    # -- driver API -----------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Open round 0's upstream of every worker (S1)."""
        self._t0 = now
        for w in self.peers:
            self._open_upstream(w, 0, now)

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        out = list(self._events)
        self._events.clear()
        return out

    @property
    def live(self) -> tuple[int, ...]:
        return tuple(self.peers)

    def receiver(self, w: int) -> Receiver:
        return self.peers[w].receiver

    def buffer(self, w: int) -> np.ndarray | None:
        return self.peers[w].buffer

    def receive_into(self, w: int, buffer: np.ndarray) -> None:
        """Take worker ``w``'s upstream in ``buffer`` from the next round it opens on: the host-local
        slot (dblp.transport.hostlocal), where the worker's values already are, so the driver has nothing
        to copy. Call it before :meth:`start`."""
        p = self.peers[w]
        if p.buffer is None or buffer.dtype != np.float32 or buffer.size != self.layout.elements:
            raise ValueError(f"worker {w}: a receive buffer must be float32 of {self.layout.elements} elements")
        p.buffer = buffer

    def broadcast_done(self, w: int) -> bool:
        """Whether worker ``w``'s broadcast of the current round is stopped (or not started)."""
        p = self.peers.get(w)
        return p is None or p.sender is None or p.sender.done

    def waiting_on(self) -> tuple[int, ...]:
        """The workers the round is waiting for now (to name a silent peer)."""
        if self.phase is Phase.UPSTREAM:
            return tuple(w for w, p in self.peers.items() if not p.receiver.complete)
        if self.phase is Phase.BROADCAST:
            return tuple(w for w, p in self.peers.items() if p.sender is not None and not p.sender.done)
        return ()

    def wants_poll(self) -> bool:
        """Whether :meth:`poll` would make progress now (a pure query, for event-loop predicates)."""
        if self.phase is Phase.UPSTREAM:
            return all(p.receiver.complete for p in self.peers.values())
        if self.phase is Phase.BROADCAST:
            return any(not p.recorded and p.sender is not None and p.sender.done for p in self.peers.values())
        return False

    def poll(self, now: float, worker: int | None = None) -> None:
        """Act on what the core objects did since the last call (S2, S4). ``worker``: the driver
        knows only this worker's broadcast can have stopped (the simulator's per-flow callback),
        so a round of N stopping broadcasts costs N checks, not N^2."""
        if self.phase is Phase.UPSTREAM and self.peers and all(p.receiver.complete for p in self.peers.values()):
            self._t_up = now
            if self.rates is not None:  # R12, R15: every upload is in, its first pass's loss known: the next grant
                self.rates.uploads_done([p.receiver for p in self.peers.values()])
            for p in self.peers.values():
                p.receiver.finish_round()
            self.phase = Phase.REDUCE
            self._events.append(ReduceRequested(self.round, self.live))
        elif self.phase is Phase.BROADCAST:
            for w in (self.peers if worker is None else (worker,) if worker in self.peers else ()):
                p = self.peers[w]
                if not p.recorded and p.sender is not None and p.sender.done:
                    self._down_done(w, now)
            self._maybe_end(now)

    def begin_broadcast(self, now: float, mean: np.ndarray | None = None) -> None:
        """S3b: start the broadcast of the mean (``None``: chunk indices only) before its norm is
        known; :meth:`broadcast` with the norm announces the tolerance later."""
        if self.phase is not Phase.REDUCE:
            raise RuntimeError(f"begin_broadcast in phase {self.phase.value}, expected reduce")
        self._start_senders(now, mean)
        self.phase = Phase.BROADCAST
        self._begun = True

    @property
    def announced(self) -> bool:
        """Whether this round's ROUND(down) is out (False between S3b's begin and the norm)."""
        return self.phase is Phase.BROADCAST and not self._begun

    def broadcast(self, norm: float, now: float, mean: np.ndarray | None = None, extra: dict | None = None) -> None:
        """S3: feed the mean's norm to the policy and broadcast the mean (``None``: chunk indices only).
        After :meth:`begin_broadcast` (S3b) the datagrams are under way: only the tolerance is announced."""
        begun = self.phase is Phase.BROADCAST and self._begun
        if self.phase is not Phase.REDUCE and not begun:
            raise RuntimeError(f"broadcast in phase {self.phase.value}, expected reduce")
        k = self.round
        self.norms.append(norm)
        self._norm = norm
        kept = {k: v for k, v in self._extra.items() if k == "residual_down_norm"} if begun else {}
        self._extra = {**kept, **dict(extra or {}), "compensation": self.compensation.label()}
        if math.isfinite(norm):
            self._p_down = float(self.policy.update(k, norm))
        else:  # S3': the CLR detector never sees a non-finite norm; the tolerance and CLR state hold
            self._p_down = float(self.policy.tolerance)
            self._extra["norm_not_finite"] = True
        self._clr = bool(self.policy.clr)
        for w, p in self.peers.items():
            self._events.append(ControlToSend(w, ctl.RoundStart(k, ctl.DOWN, self._p_down, self._clr)))
        if begun:
            self._begun = False
            return
        self._start_senders(now, mean)
        self.phase = Phase.BROADCAST

    def _start_senders(self, now: float, mean: np.ndarray | None) -> None:
        """The broadcast's senders, one per live worker, over one encoding of the mean (S3), with
        C4's residual added first."""
        k = self.round
        if self._bfb is not None and mean is not None:
            self._extra["residual_down_norm"] = self._bfb.add_to(mean)
            self._mean = mean
            self._unsent_all = np.ones(self.layout.chunks, bool)
        order = send_order(self.layout.chunks, self.order, self.seed, k, DOWN_STREAM)  # once, for every worker
        if mean is not None:
            enc: EncodedRound | VirtualRound = EncodedRound(
                mean, self.layout, round_no=k, run_id=self.run_id, sender=SERVER_ID, order=order,
                buffer=self._down_headers)
            self._down_headers = enc.headers
        else:
            enc = VirtualRound(self.layout, k)
        if self.rates is not None:  # R14, R16: the last broadcast's first passes set this one's rate
            self.rates.broadcast_begins([p.sender for p in self.peers.values()
                                         if p.sender is not None and p.sender.done])
        for w, p in self.peers.items():
            p.sender = RoundSender(enc, direction=ctl.DOWN, now=now, order=order, pacer=self._worker_pacer(w),
                                   max_batch=self.max_batch)
            p.recorded = False
            self._events.append(SenderStarted(w, p.sender))
        self._unrecorded = len(self.peers)

    def _worker_pacer(self, w: int) -> TokenBucket:
        """The broadcast pacer toward worker ``w``, made on first use and kept for the run."""
        b = self._pacers.get(w)
        if b is None:
            b = self._pacers[w] = self._pacer(w)
        return b

    def remove(self, w: int, now: float) -> None:
        """Worker ``w`` left or died: the round goes on with the others."""
        p = self.peers.pop(w, None)
        if p is not None and not p.recorded:
            self._unrecorded -= 1
        self._t_last = now
        for k in sorted(self._held):
            self._maybe_common(k)
        self._maybe_end(now)

    def handle_control(self, w: int, msg: ctl.Message, now: float) -> None:
        """A round-logic message from worker ``w`` (S7's HELD); the core's own go to the core objects."""
        if not isinstance(msg, ctl.Held) or self.consistency != "intersect" or w not in self.peers:
            return
        if not (self.round - 1 <= msg.round <= self.round) or msg.round in self.common:
            return  # not a broadcast in flight: stale or forged, ignored
        self._held.setdefault(msg.round, {})[w] = msg.mask(self.layout.chunks)
        self._t_last = now
        self._maybe_common(msg.round)

    def _maybe_common(self, k: int) -> None:
        held = self._held.get(k, {})
        if not self.peers or not all(w in held for w in self.peers):
            return
        common = np.logical_and.reduce([held[w] for w in self.peers])
        self.common[k] = int(common.sum())
        if self._bfb is not None:
            self._common_mask[k] = common
        bits = np.packbits(common).tobytes()
        for w in self.peers:
            self._events.append(ControlToSend(w, ctl.Common(k, bits)))
        del self._held[k]
        self._maybe_end(self._t_last)

    # -- inside ---------------------------------------------------------------------------------
    def _open_upstream(self, w: int, k: int, now: float) -> None:
        if k > self._opened:
            self._opened = k
            self._events.append(RoundOpening(k))
        p = self.peers[w]
        p.tolerance = float(self.policy.tolerance)
        p.receiver.begin_round(k, p.buffer, now, tolerance=p.tolerance)
        if p.buffer is not None or self.rates is not None:
            # the worker's R3 order, so its datagrams are received in place (R10), and R12 knows what the
            # first pass lost when STOP comes before its PROBE
            p.receiver.expect_order(send_order(self.layout.chunks, self.order, self.seed, k, up_stream(w)))
        self._events.append(ControlToSend(w, ctl.RoundStart(k, ctl.UP, p.tolerance, bool(self.policy.clr),
                                                            self.rates.grant_bps if self.rates is not None else 0.0)))

    def _down_done(self, w: int, now: float) -> None:
        p = self.peers[w]
        if self._unsent_all is not None and p.sender is not None:  # C4: what this stream never handed out
            mine = np.zeros(self.layout.chunks, bool)
            mine[p.sender.undelivered()] = True
            self._unsent_all &= mine
        p.recorded = True
        self._unrecorded -= 1
        self._events.append(RecordWritten(self._server_record(w, p, now)))
        if self.rounds is None or self.round + 1 < self.rounds:
            self._open_upstream(w, self.round + 1, now)

    def _maybe_end(self, now: float) -> None:
        """The round ends when every broadcast is stopped and, under S7, its COMMON is out."""
        if self.phase is not Phase.BROADCAST:
            return
        if self._unrecorded == 0 and (self.consistency != "intersect"
                                                              or self.round in self.common or not self.peers):
            self._carry_broadcast()
            self._events.append(RoundEnded(self.round))
            self.round += 1
            self._t0 = now
            self.phase = Phase.DONE if self.rounds is not None and self.round >= self.rounds else Phase.UPSTREAM

    def _carry_broadcast(self) -> None:
        """C4: the round's broadcasts are over - carry what no replica was given (under S7: applied)."""
        if self._bfb is None or self._mean is None or self._unsent_all is None:
            return
        common = self._common_mask.pop(self.round, None)
        self._bfb.round_over(self._mean, ~common if common is not None else self._unsent_all)
        self._mean = self._unsent_all = None

    def _server_record(self, w: int, p: _Up, now: float) -> RoundRecord:
        r, s, c = p.receiver, p.sender, self.context
        assert s is not None
        extra = {"wait_others_s": self._t_up - self._t0, "down_wait_reply_s": s.stats.wait_s, **self._extra}
        if self.rates is not None:  # R12's evidence: this upload's first-pass loss, the next round's grant
            extra.update(up_first_loss=r.first_loss, grant_bps=self.rates.grant_bps)
        return RoundRecord(
            source=c.source, role="server", worker=w, round=self.round, t_start=self._t0 + c.clock_offset,
            policy=c.policy, tolerance_up=p.tolerance, tolerance_down=self._p_down, clr=self._clr,
            grad_norm=self._norm, chunks=c.count(self.layout.chunks),
            up_latency_s=r.stats.t_done - r.stats.t_first, down_latency_s=s.stats.t_done - s.stats.t_start,
            round_latency_s=now - self._t0, up_received=c.count(r.received), down_sent=c.count(s.stats.sent),
            down_passes=s.stats.passes, down_received=c.count(s.stats.received), early_stop_down=s.stats.early_stop,
            send_rate_bps=s.pacer.rate_bps, order=c.order, **_drops(c, r, p.reported),
            extra=extra,
        )
