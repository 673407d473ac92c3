"""Pacing of the data channel, and the pacing rules R11-R17: a token bucket, the self-pacing rate
arithmetic and the server's rate grants, clock passed in.

A sender that bursts a whole gradient at line rate into a shaped link with a
finite buffer loses datagrams to its own burst. The bucket caps the rate;
``rate_bps = 0`` means unlimited. The rate in force is recorded per round.

Two things decide whether a bucket delivers the rate it is set to:

- **Depth vs. the event loop's sleep.** A sender sleeps until its bucket
  allows more; a sleep is never exact (``epoll`` rounds a wait up to 1 ms,
  a loaded host deschedules for longer). Tokens that arrive while the bucket
  is full are lost, so a bucket shallower than the oversleep caps the rate
  (docs/pacing.md measures it). A real sender's depth is therefore
  :data:`PACE_QUANTUM_S` of the rate, at least :data:`SENDER_MIN_BURST` -
  less than the simulator's 64 KiB, because a server broadcasting to N
  workers wakes late with N full buckets, and N x 64 KiB overfills a
  100-packet queue.
- **Wake size.** The socket loop (:func:`dblp.transport.sockets.pump`) sleeps at
  least :data:`WAKE_S` and at most to the bucket's next datagram, with a
  sub-millisecond sleep where ``epoll`` would round up to 1 ms: a
  multi-Gbit/s sender wakes every quarter millisecond, not every few
  microseconds, and its batches stay well under the bucket's depth.

Pacing rules, each stated once here. They build on the protocol's own rules R1-R10 and R5b
(:mod:`dblp.protocol.core`) and are carried out where their data is: the sender's reports and the
receiver's measurements in :class:`dblp.protocol.core.RoundSender` and :class:`dblp.protocol.core.Receiver`, the
round's grants in :mod:`dblp.protocol.session`, the held control in :mod:`dblp.transport.server` and
:mod:`dblp.transport.sockets`, the arithmetic in this module.

R11 Self-pacing: when a pass's reply comes (BITMAP, or STOP after the PROBE) the sender reports the
    pass to its pacer - datagrams sent, how many of them arrived (the reply's count less the
    previous one), their bytes, the time spent sending, the time from the pass's first datagram to
    the reply, whether it was the round's first pass, and the rate it was sent at. A STOP (the
    receiver counts up to its threshold, and more may be in flight, R5/R6) reports a clean pass when
    at most :data:`dblp.protocol.core.EARLY_CLEAN` of the datagrams sent are unaccounted for, else nothing. A
    fixed-rate pacer ignores the report; the default pacer (:class:`AutoPacer`) sets its rate from
    it, cutting only for loss its own rate caused (the arithmetic is there).
R12 Rate grant (beyond the paper): a self-pacing sender's PROBE states the rate its pass was sent at
    (0, not stated, when unpaced or fixed-rate); the receiver keeps the last stated rate of its peer
    (:attr:`dblp.protocol.core.Receiver.stated_rate_bps`) and the loss of the round's first pass when its
    PROBE comes (:attr:`~dblp.protocol.core.Receiver.first_loss`) with the rate that PROBE states
    (:attr:`~dblp.protocol.core.Receiver.first_rate_bps`). When STOP comes first (a high tolerance: the
    threshold falls mid-pass) and the receiver knows the sender's R3 order, the loss is that of the
    chunks the order put before the last one that arrived: one pass crosses one FIFO path, so each
    of them still missing was lost, and a grant that overflows the bottleneck's queue shows in such
    rounds too; at most :data:`~dblp.protocol.core.EARLY_CLEAN` of them is clean, as R11 takes a STOP. The
    round logic (:mod:`dblp.protocol.session`) grants the next round's upload rate in ROUND(up), one rate for
    every worker, set from all their first passes (:class:`UploadGrant`); the worker's pacer starts
    from it (:meth:`AutoPacer.grant`); a fixed-rate pacer ignores the grant.
R13 Coalesced control (a transport's rule like R10, no message changes): a side may hold the control
    messages it sends one peer and write them later in one piece, in their order, so that one write
    wakes the peer once instead of once per message. Held messages go before any datagram that
    follows them (a ROUND still announces its datagrams), and before the holder waits for input -
    except a STOP, which may be held across waits until the holder's next message to that peer, when
    its timing tells nobody anything: a pass of fewer than :data:`MIN_SAMPLE` datagrams, which R11
    does not report. A STOP that is held is still sent (R5: sent means queued; a PROBE crossing it
    gets no answer), and nothing else that is awaited waits behind it. The server
    (:mod:`dblp.transport.server`) holds: a one-batch round's STOP(up)s until the end of its loop's turn -
    below MIN_SAMPLE chunks, and the last worker's always, until the broadcast, whose ROUND(down)
    they join - and each worker's ROUND(down) until that worker's datagrams, its PROBE(down) until
    the turn ends. A lossless 10,762-element round so costs each worker two control wakeups, not
    three to four (``tests/test_control_cost.py``).
R14 Broadcast rate (beyond the paper: R12 for the server's own streams): a sender keeps its first
    pass's loss at that pass's reply (:attr:`dblp.protocol.core.RoundSender.first_loss`, from the BITMAP's
    count; when STOP comes first, the loss R12's receiver counted, which the STOP states as its span
    - the first pass's datagrams up to the last arrival - when more than
    :data:`~dblp.protocol.core.EARLY_CLEAN` of them are missing; else 0) and the rate that pass was sent at
    (:attr:`~dblp.protocol.core.RoundSender.first_rate_bps`) - a self-pacing sender's. When the next
    broadcast begins, the round logic sets the rate of all the server's self-paced streams from
    every stream's first pass of the round before, by R12's rule (:meth:`PacerGroup.round_done`);
    the streams then hold that rate for the whole round, and their R11 reports move it only until
    the rule has a rate (rounds 0-1: the unpaced flood, then the start it gave).
R15 The flood's dispersion (beyond the paper: the first estimate of R12 and R14): a receiver keeps
    when it accepted the round's first and latest chunk; at the first pass's PROBE it keeps that
    pass's chunks and their span (:attr:`dblp.protocol.core.Receiver.first_received`,
    :attr:`~dblp.protocol.core.Receiver.first_span_s`; a STOP first: the chunks and span at STOP) - without
    the chunks of the first read (:attr:`~dblp.protocol.core.Receiver.lead`): the times are those of the
    reads, and a receiver that reads late finds a backlog whose arrival it did not see, which
    counted in would make the rate many times the link's; the chunks of a later read arrived after
    the read before it, so the rate is a lower bound of the arrival rate over the span. Every
    datagram accepted before that PROBE's answer belongs to the first pass (a retransmission needs
    the answer). The server's receivers (:attr:`~dblp.protocol.core.Receiver.tell_rate`, a self-paced run)
    answer an unpaced first upload pass (its PROBE states no rate) that lost with the rate its
    chunks arrived at (a BITMAP+, :mod:`dblp.protocol.control` type 13): the worker's pacer starts round 0's
    retransmissions from it (:meth:`AutoPacer.on_pass`), not from its own bounds, which the reply's
    delay spoils - the full queue drops the PROBE, and TCP resends it 0.2 s later. (One sender's
    rate is an estimate of its share only where the bottleneck interleaves the senders finely;
    served in bursts, each sees up to the whole link - as the broadcast's streams are, whose
    receivers therefore tell nothing.) When every upload of a round whose first passes were all
    unpaced is in, they lost :data:`FLOOD_LOSS` or more (their mean: an overflow), and no grant
    exists yet, the round logic takes all first passes' chunks over the span from the earliest first
    chunk to the latest last one - while an unpaced flood overflows a queue, the link behind it is
    busy, so that is the bottleneck's rate (packet-train dispersion, the whole pass the train) - as
    every worker's equal share of it. It seeds R12's grant at :data:`HOLD` of the share, the share
    its ceiling (:meth:`UploadGrant.seed`: soft until the first cut, it rises by the step a clean
    round); and it is the floor of R14's start: when the broadcast's own flood gives its group a
    rate below HOLD of the share, the group is seeded there the same way (:meth:`PacerGroup.report`;
    the uploads measure the server's receiving, its sending may be faster) - and so when the flood
    gives it more than :data:`START_CAP` times the share (the brain's upper bound reads the send
    time, which a fast sender makes short). A seed is unproven: the next round's loss is judged as
    at any new rate (a cut, the ceiling the rate); the unpaced passes it was measured on are no
    verdict on it.
R16 A burst's head (beyond the paper: R14 beside R12's burst verdict): when the uploads of the round
    a broadcast serves were taken for a burst by R12's rule (heavy first-pass loss at a proven
    grant: :attr:`UploadGrant.burst`), light first-pass loss in the broadcast before is the burst's
    head - a burst that begins as a round opens meets the last broadcast's slower streams - not the
    group's rate: R14 holds the rate for this broadcast and judges that loss no further
    (:meth:`PacerGroup.round_done`, ``burst``), and the burst and its tail that follow are judged as
    after a burst. A fixed-rate run (no rules) is untouched.
R17 A burst's tail (beyond the paper: R12's verdict on the round after a burst): a burst that ends
    while the next round's first passes are under way spares the uploads that come later, where a
    grant that overflows the server's link loses on every upload. So in the round after a round R12
    took for a burst, heavy first-pass loss beside a worker whose first pass was clean is the
    burst's tail: the grant holds and the loss is no strike (:meth:`UploadGrant.round_done`).
    Congestion is still found, one round later at most: the next round's loss is judged as after any
    round. A run of one worker has no such witness and is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dblp.protocol.wire import ParameterError

MIN_BURST_BYTES = 64 * 1024  # bucket depth at low rates (~44 datagrams of 1,472 bytes)
PACE_QUANTUM_S = 0.005  # a real sender's bucket depth in time at its rate: covers a late wake-up on a busy host
SENDER_MIN_BURST = 16 * 1024  # a real sender's depth at low rates: a host sending N streams bursts N x this
WAKE_S = 0.00025  # the shortest sleep of a paced sender's loop (dblp.transport.sockets.pump)

# -- self-pacing (AutoPacer) ---------------------------------------------------------------------
MIN_SAMPLE = 32  # datagrams a pass must have sent to say anything about the rate
AUTO_FLOOR_BPS = 1e6  # the lowest rate self-pacing sets (a sender never stalls on a bad estimate)
STEP = 0.04  # a clean pass raises the rate by this fraction ...
HOLD = 0.9  # ... up to this fraction of the rate that last lost to congestion (the hand-set --pace-share default)
CEILING_CREEP = 1.002  # ... which creeps up so per clean pass (a lossy probe in some fifty rounds)
HEADROOM = 1.25  # a clean first pass leaves the rate at most this far above its delivery rate
CUT = 0.2  # multiplicative decrease: by 2 x the pass's loss, by this at least ...
MAX_CUT = 0.5  # ... to no less than this fraction of the rate (a burst misread costs 2x, once)
BURSTY_LOSS = 0.2  # a pass losing this much or more at a proven rate: a burst; less: congestion
STRIKES = 2  # rounds in a row losing heavily at a proven rate before it counts as congestion
RECOVERED = 0.8  # after a cut, loss at this fraction of the cut pass's loss or more: the rate was not to blame
FLOOD_LOSS = 0.5  # R15: unpaced first passes losing this much (their mean) overflowed a queue: their span is a rate
START_CAP = 2.0  # R15: a broadcast's flood start above this many times the uploads' share is seeded at the share

class TokenBucket:
    """A fixed-rate bucket (``rate_bps`` bit/s, 0 = unlimited), ``burst_bytes`` deep, or ``depth_s``
    of the rate where that is deeper (the real senders' :func:`make_pacer` asks for
    :data:`PACE_QUANTUM_S`; the simulator, whose timers are exact, keeps the plain depth)."""

    auto = False

    def __init__(self, rate_bps: float = 0.0, burst_bytes: int = MIN_BURST_BYTES, *, depth_s: float = 0.0) -> None:
        try:
            rate = float(rate_bps)
        except (TypeError, ValueError):
            rate = math.nan
        if not math.isfinite(rate) or rate < 0:
            raise ParameterError(f"send rate must be a finite number >= 0 bit/s, got {rate_bps!r}")
        if burst_bytes <= 0:
            raise ParameterError(f"pacing burst must be positive, got {burst_bytes}")
        if not math.isfinite(depth_s) or depth_s < 0:
            raise ParameterError(f"pacing depth must be >= 0 s, got {depth_s!r}")
        self._min_burst = int(burst_bytes)
        self.depth_s = float(depth_s)
        self._t: float | None = None
        self._tokens = math.inf
        self.rate_bps = rate  # sets burst_bytes and fills the bucket (the setter)

    @property
    def rate_bps(self) -> float:
        return self._rate

    @rate_bps.setter
    def rate_bps(self, rate: float) -> None:
        """A new rate takes effect at once (a rule may change it between passes); the depth follows."""
        self._rate = float(rate)
        self.burst_bytes = max(self._min_burst, int(self._rate / 8.0 * self.depth_s))
        self._tokens = min(self._tokens, float(self.burst_bytes))

    @property
    def unlimited(self) -> bool:
        return self._rate == 0.0

    @property
    def last_time(self) -> float:
        return self._t or 0.0

    def _refill(self, now: float) -> None:
        if self._t is not None and now > self._t:
            self._tokens = min(self.burst_bytes, self._tokens + (now - self._t) * self._rate / 8.0)
        self._t = now if self._t is None else max(self._t, now)

    def allowance(self, now: float, item_bytes: int, limit: int) -> int:
        """How many items of ``item_bytes`` may leave now (at most ``limit``)."""
        if self.unlimited:
            return limit
        self._refill(now)
        return max(0, min(limit, int(self._tokens // item_bytes)))

    def consume(self, nbytes: int) -> None:
        if not self.unlimited:
            self._tokens -= nbytes

    def next_time(self, now: float, item_bytes: int) -> float:
        """When one item of ``item_bytes`` will be allowed."""
        if self.unlimited:
            return now
        self._refill(now)
        deficit = item_bytes - self._tokens
        # 1 ns of slack so that float rounding at exactly this time still allows one item
        return now if deficit <= 0 else now + deficit * 8.0 / self._rate + 1e-9

    def on_pass(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
                first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        """A pass's outcome (rule R11; ``rate_bps``: the rate it was sent at; ``arrival_bps``:
        the rate its chunks arrived at, when the receiver told it, R15); a fixed-rate bucket
        ignores it."""

    def grant(self, rate_bps: float) -> None:
        """The server's rate grant (rule R12); a fixed rate is the user's, and stays."""


class AutoPacer(TokenBucket):
    """Self-pacing: the rate set from each pass's outcome, no hand-set rate (``--pace auto``).

    Starts unlimited. After each pass the sender reports (rule R11) the
    datagrams it sent, how many of them arrived (from the BITMAP/STOP count),
    their bytes, how long the sending took (``send_s``), how long from the
    pass's first datagram to the reply (``reply_s``: sending, queueing,
    draining and a round trip) and whether it was a round's first pass.

    The rate rises after clean passes and falls after congestion, both by
    factors of its own rate, driven by the loss of whole passes. (Both
    multiplicative, the senders of one bottleneck keep their ratios: only
    an additive increase - the same bit/s for all - would equalise them, and
    a sender alone knows no such step. docs/pacing.md measures the cost.)

    - start: the first lossy pass of an unpaced sender sets the rate to
      :data:`HOLD` of the rate its chunks arrived at, when the receiver told
      it (rule R15: the flood's dispersion), else to the
      geometric mean of two bounds on its share of the bottleneck: the
      delivery rate ``delivered bytes / reply_s`` (too low by the reply's
      delay) and ``(1 - loss) x bytes / send_s`` (too high by what the queue
      absorbed); clean passes then double it until the first loss
      (``ceiling_bps``, the rate that lost, is then known);
    - a clean pass raises the rate by :data:`STEP`, up to :data:`HOLD` of the
      ceiling and no further: the rate settles where a hand-set
      ``--pace-share 0.9`` would put it, 10% below where loss began, and
      the ceiling creeps up :data:`CEILING_CREEP` per clean pass, so
      capacity others free is found again at the price of one lossy probe
      in some fifty rounds;
      but a round's clean first pass (a whole tensor) leaves the rate at most
      :data:`HEADROOM` times its delivery rate ``bytes / reply_s`` (halving
      at most): a queue that swallowed a whole pass hides the bottleneck
      from loss, not from the delivery rate, and a sender alone on a path
      would otherwise double far past the link and flood the others later;
    - congestion - loss of a pass (i) under :data:`BURSTY_LOSS`, or (ii) of
      any size at a rate above ``good_bps`` (the highest clean rate since the
      last cut): the ceiling becomes the rate, and the rate is cut by
      ``max(2 x loss, CUT)``, to no less than :data:`MAX_CUT` of itself (after
      a loss in the doubling start: back to the last clean rate);
    - bursts: loss of :data:`BURSTY_LOSS` or more at or below ``good_bps`` is
      not the rate's doing (DBLP's bursts, a lossy link): the rate stays, so a
      burst costs no slow-down; only when the first passes of :data:`STRIKES`
      rounds in a row lose so is it taken for congestion;
    - a cut that did not help - the next pass, at the cut rate, loses
      :data:`RECOVERED` of what the cut pass lost or more - was not
      congestion: the old rate comes back, as good (a lossy path is not
      slowed pass after pass).

    Passes of fewer than :data:`MIN_SAMPLE` datagrams say nothing (a small
    retransmission's reply time is one round trip, not a rate), nor does a
    pass that delivered nothing (an outage: R8 backs off), nor a pass sent
    at a rate no longer in force (in a :class:`PacerGroup`, another member's
    report of the same round has already moved the rate).
    """

    auto = True

    def __init__(self, burst_bytes: int = MIN_BURST_BYTES, *, depth_s: float = 0.0) -> None:
        super().__init__(0.0, burst_bytes, depth_s=depth_s)
        self.good_bps = 0.0  # highest clean rate since the last cut (math.inf: unpaced and clean); 0 = none
        self.ceiling_bps = math.inf  # the rate of the last congestion (inf: none yet: the doubling start)
        self._cut: tuple[float, float] | None = None  # (rate before the last cut, loss of the cut pass)
        self._strikes = 0  # rounds in a row whose first pass lost heavily at a good rate
        self.cuts = 0  # congestion verdicts, for records and tests
        self.restores = 0  # cuts undone: the loss did not fall with the rate
        self.grants = 0  # grants applied (R12), for records and tests

    def grant(self, rate_bps: float) -> None:
        """R12: start the next upload at the server's grant (:class:`UploadGrant`), the rate every
        self-pacing worker of the run starts from; this pacer's own rule then acts within the
        round (its retransmission passes) and no higher than the grant: the grant is where it
        holds (``ceiling = grant / HOLD``), and the rate the server proved (a burst at it is not
        the rate's doing).

        Why: the senders of one bottleneck, adapting alone by factors of their own rates, keep
        the ratios their first flood gave them, and a round waits for its slowest upload. The server sees every sender's passes: it decides
        one rate for all."""
        if not (math.isfinite(rate_bps) and rate_bps > 0):
            return
        self.ceiling_bps = rate_bps / HOLD
        self.good_bps = rate_bps
        self._cut = None
        self._strikes = 0
        self.grants += 1
        self.rate_bps = rate_bps

    def on_pass(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
                first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        if sent < MIN_SAMPLE or reply_s <= 0:
            return
        if rate_bps is not None and rate_bps != self.rate_bps:  # news of a rate no longer in force (a group)
            return
        delivered = min(max(delivered, 0), sent)
        loss = 1.0 - delivered / sent
        in_force = self.rate_bps if self.rate_bps > 0 else math.inf
        if loss == 0.0:
            self._clean(in_force, first, delivered * (nbytes / sent) * 8.0 / reply_s)
            return
        if loss >= BURSTY_LOSS and in_force <= self.good_bps:  # a burst, not the rate's doing ...
            if not first:
                return
            self._strikes += 1
            if self._strikes < STRIKES:
                return
            self._strikes = 0  # ... unless round after round
        if self._cut is not None and loss >= RECOVERED * self._cut[1]:  # slower did not help: not congestion
            before = self._cut[0]
            self._cut = None
            self.restores += 1
            self.good_bps = before if before > 0 else math.inf
            self.rate_bps = before
            return
        if delivered == 0:
            return
        self._cut = (self.rate_bps, loss)
        self.cuts += 1
        starting = self.ceiling_bps == math.inf
        if in_force == math.inf and arrival_bps > 0 and math.isfinite(arrival_bps):
            new = HOLD * arrival_bps  # R15: the receiver saw the flood arrive at the bottleneck's rate
        elif in_force == math.inf:  # the unpaced start: between two bounds on the share, then doubling
            lo = delivered * (nbytes / sent) * 8.0 / reply_s  # the reply's delay counted in: too low
            hi = (1.0 - loss) * nbytes * 8.0 / send_s if send_s > 0 else lo  # the queue's fill counted: too high
            new = math.sqrt(lo * max(lo, hi))
        else:
            self.ceiling_bps = in_force
            if starting and 0.0 < self.good_bps < in_force:  # the doubling overshot: the last clean rate
                new = self.good_bps
            else:
                new = in_force * max(MAX_CUT, 1.0 - max(2.0 * loss, CUT))
        self.rate_bps = max(AUTO_FLOOR_BPS, new)
        self.good_bps = 0.0

    def _clean(self, in_force: float, first: bool, delivery_bps: float) -> None:
        self._cut = None
        if first:
            self._strikes = 0
        if in_force == math.inf:
            self.good_bps = math.inf
            return
        if self.ceiling_bps == math.inf:
            new = 2.0 * in_force
        else:  # up by STEP to HOLD x the rate that last lost, never down; the ceiling creeps up
            self.ceiling_bps *= CEILING_CREEP
            new = max(in_force, min(in_force * (1.0 + STEP), HOLD * self.ceiling_bps))
        if first:  # a whole tensor's pass: the path carried delivery_bps; a queue took the rest
            new = max(MAX_CUT * in_force, min(new, HEADROOM * delivery_bps))
        self.good_bps = max(self.good_bps, min(in_force, new))
        self.rate_bps = new


class _Member(TokenBucket):
    """One stream of a :class:`PacerGroup`: its own tokens, the group's rate."""

    auto = True

    def __init__(self, group: "PacerGroup") -> None:
        self.group = group
        super().__init__(0.0, SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)

    def _sync(self) -> None:
        r = self.group.brain.rate_bps
        if r != getattr(self, "_rate", None):
            TokenBucket.rate_bps.fset(self, r)  # type: ignore[attr-defined]

    @property
    def rate_bps(self) -> float:
        self._sync()
        return self._rate

    @rate_bps.setter
    def rate_bps(self, rate: float) -> None:
        TokenBucket.rate_bps.fset(self, rate)  # type: ignore[attr-defined]

    @property
    def unlimited(self) -> bool:
        self._sync()
        return self._rate == 0.0

    def allowance(self, now: float, item_bytes: int, limit: int) -> int:
        self._sync()
        return super().allowance(now, item_bytes, limit)

    def next_time(self, now: float, item_bytes: int) -> float:
        self._sync()
        return super().next_time(now, item_bytes)

    def on_pass(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
                first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        if not self.group.granted:  # R14: once the group has a rate, it moves at round boundaries only
            self.group.report(sent, delivered, nbytes, send_s, reply_s, first, rate_bps, arrival_bps)


class PacerGroup:
    """Streams that share one bottleneck and one rate: a server's broadcast to N workers.

    Why: the N streams leave through the server's one link. Paced apart,
    each would find its own rate from its own losses - streams that get
    through unpaced stay unpaced and flood the queue the others lose in,
    and those fall far below their share (a round lasts as long as its
    slowest stream). So every member paces at one rate, each with its own
    tokens.

    Who sets it (rule R14): in round 0 nothing is known, and one
    :class:`AutoPacer` (``brain``) takes the members' R11 reports - the
    first lossy report of the unpaced flood sets the start rate, and a
    report about a rate the group has already left is ignored. From then on
    the rate moves once a round, at the next broadcast's start, by R12's
    rule on *every* stream's first pass (:meth:`round_done`, an
    :class:`UploadGrant`): the brain alone would move on whichever reply
    comes first, and the first reply of a broadcast is usually a clean
    stream's early STOP, so it would step up a round at a time while the
    streams that lose are ignored as stale."""

    def __init__(self) -> None:
        self.brain = AutoPacer(SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
        # one strike more than the uploads: a burst that begins while a broadcast is under way reaches
        # into two broadcasts in a row, and two strikes would cut the group at every burst
        self.rule = UploadGrant(strikes=STRIKES + 1)
        self.granted = False  # the rule has set a rate: the members' own reports no longer move it
        self.floor_bps = 0.0  # R15: each stream's share as the uploads' first flood measured it (0: none)
        self._floored = False  # R15: seeded at the floor during a broadcast whose first passes were unpaced

    def member(self) -> TokenBucket:
        return _Member(self)

    def report(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
               first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        """A member's R11 report while the group has no rate of the rule's: the brain's. R15: when
        the brain's start - its estimate from the first lossy pass of the unpaced flood - falls
        below :data:`HOLD` of the share the uploads' flood measured (:attr:`floor_bps`), the group
        is seeded at that share instead (:meth:`seed`).

        Why a floor, not the broadcast's first rate: the brain's estimate reads the reply time,
        which the flood's full queue stretches (it drops the PROBE; TCP resends it 0.2 s later),
        so it starts far below the share and climbs to it round by round. But the uploads measure
        the server's receiving, not its sending, and a server may send faster than it receives
        (on loopback it does: ``tests/test_transport.py``'s lossy run), so a broadcast paced at
        the uploads' share from its first datagram would be slowed there. As a floor the
        measurement only lifts a worse guess.

        And a cap, :data:`START_CAP` times the share: the brain's upper bound reads the send time,
        which a server that puts its flood out fast makes far too short, and from a start many
        times the share R14's rule swings (a cut after which the loss cannot fall is undone).
        Twice the share, because the rule's deepest cut is :data:`MAX_CUT` (half): from at most
        twice the share one cut reaches the share, so the loss falls and the cut stands, where from
        further up the loss cannot fall and the cut is undone. It also leaves room for a server
        that sends faster than it receives (on loopback, where no floor is set: its random loss is
        not an overflow)."""
        start = self.brain.rate_bps == 0.0
        self.brain.on_pass(sent, delivered, nbytes, send_s, reply_s, first, rate_bps, arrival_bps)
        if start and self.brain.rate_bps > 0.0 and not (
                HOLD * self.floor_bps <= self.brain.rate_bps <= START_CAP * self.floor_bps):
            self._floored = self.seed(self.floor_bps) > 0

    def seed(self, share_bps: float) -> float:
        """R15: the group's rate from a measured share of each stream (:meth:`UploadGrant.seed`:
        :data:`HOLD` of it, the share its ceiling). Returns the rate (0: none)."""
        g = self.rule.seed(share_bps)
        if g > 0:
            self.granted = True
            self.brain.grant(g)
        return g

    def round_done(self, stated_bps: Sequence[float], losses: Sequence[float], arrival_bps: float = 0.0,
                   burst: bool = False) -> float:
        """R14: a broadcast's streams are done - the rate each first pass was sent at (0: unpaced),
        each first pass's loss, and the mean rate clean streams arrived at (0: some lost), as
        :meth:`UploadGrant.round_done` takes them. Sets and returns the group's next rate (0:
        nothing known yet, the brain's start stands).

        R16: ``burst`` - the uploads of the round this broadcast serves were taken for a burst
        (:attr:`UploadGrant.burst`). Light loss in the broadcast before is then the burst's head
        (a burst is switched on as a round opens, while the last broadcast's slower streams are
        still sending), not the group's rate: the rate is held for the burst round and the loss
        not judged. Why: judged, the head is congestion - a cut that is undone only after the
        burst round, which is then sent at the cut rate. Heavy loss goes to the rule (its
        strikes)."""
        if self._floored:  # R15: seeded during an unpaced broadcast, whose loss says nothing of the seed
            self._floored = False
            # (nor the loss of a stream whose first pass began after the seed: the unpaced streams
            # beside it flooded the queue it lost in - judged, it would halve the seed)
            if not all(r > 0 for r in stated_bps):
                return self.rule.rate_bps
        if burst and self.rule.rate_bps > 0 and losses and 0.0 < sum(losses) / len(losses) < BURSTY_LOSS:
            self.rule.hold_for_burst()
            return self.rule.rate_bps
        g = self.rule.round_done(stated_bps, losses, arrival_bps)
        if g > 0:
            self.granted = True
            self.brain.grant(g)
        return g


class UploadGrant:
    """R12, the server's side: one upload rate for every self-pacing worker, from all their passes.

    Why: senders that adapt alone keep the unequal shares their first flood gave them, and a
    round lasts as long as its slowest upload (docs/pacing.md). The server receives every
    worker's upload: after each round's upstream it knows each worker's first-pass loss (the
    count its first BITMAP carried; none when STOP came first) and, from the PROBEs, the rate
    each pass was sent at. It runs :class:`AutoPacer`'s verdicts on the group:

    - seed: the first round in which workers stated rates (their own R11 estimates after the
      unpaced first flood: a PROBE states its pass's rate), their mean - the sum they found,
      split equally; or, a round with every first pass clean (a STOP before the PROBE states
      nothing), the mean rate the uploads arrived at; judged by that round's loss as below;
    - every worker's first pass clean: the grant rises by :data:`STEP` up to :data:`HOLD` of
      the grant that last lost (the ceiling, creeping :data:`CEILING_CREEP` a round), doubling
      while no loss has been seen at a granted rate, but to at most :data:`HEADROOM` x the
      rate the clean uploads arrived at (a doubling past the share costs a round of retransmissions);
    - first-pass loss (the workers' mean): congestion when under :data:`BURSTY_LOSS` or at a
      grant above the last clean one: the ceiling becomes the grant, which is cut by
      ``max(2 x loss, CUT)`` (to no less than :data:`MAX_CUT`), and the cut grant counts as clean
      after light loss (a fifth less load cannot lose 20%); heavy loss at a clean grant, or
      one step above it, or more than the step up from the last clean grant can lose (a load
      raised f-fold loses at most 1 - 1/f of it: the start's 1.25x steps 20%), is a burst
      (DBLP's), no change, unless :data:`STRIKES` rounds in a row;
      nor does light loss in the round after a burst cut (the burst's tail: a burst of the
      microburst scenario reaches into the next round's first passes), nor heavy loss there
      beside a worker's clean first pass (R17: a burst that ends mid-pass spares the uploads
      that came later; congestion from the grant loses on all of them); a cut after which the
      loss did not fall (:data:`RECOVERED` of it or more) is undone (a lossy path: 25% random
      loss would otherwise halve the grant round after round, to the floor; and a burst's head -
      light loss as it began, a cut, then the burst - is not a reason to stay cut).

    The grant is then every worker's starting rate (:meth:`AutoPacer.grant`)."""

    def __init__(self, strikes: int = STRIKES) -> None:
        self.strikes = strikes  # rounds in a row of heavy loss at a proven grant that make congestion
        self.rate_bps = 0.0  # 0: no grant (nothing stated yet)
        self.ceiling_bps = math.inf
        self.good_bps = 0.0
        self._strikes = 0
        self._tail = False  # the last round was a burst: its tail may fall into the next round's first passes
        self._cut: tuple[float, float, bool] | None = None  # (grant before the last cut, that round's loss,
        # whether that grant was proven and the loss light)
        self._soft = False  # R15: the ceiling is a seed's measured share, not a loss seen: it rises STEP a round
        self.burst = False  # R16: the last round's loss was taken for a burst (DBLP's), not congestion
        self.cuts = 0
        self.restores = 0

    def seed(self, share_bps: float) -> float:
        """R15: the first grant from a measured share (bit/s per worker: the bottleneck's rate
        the round's unpaced first passes arrived at, split equally), when no grant exists yet.
        The grant starts at :data:`HOLD` of it and the share is its ceiling - where a hand-set
        ``--pace-share 0.9`` puts a worker - so it neither doubles past the share nor climbs
        to it from a poor guess (the workers' own estimates from the flood, well below the
        share). The ceiling is soft
        until the first cut: a clean round raises it by :data:`STEP`, not :data:`CEILING_CREEP`,
        so a share measured too low (a burst in the flood, a cold receiver) is left at 4% a
        round, and a right one costs one light loss a few rounds on. Unproven: the next
        round's loss is judged as at any new grant (a cut, the ceiling the grant).
        Returns the grant (0: a grant exists, or the share is not a rate)."""
        if self.rate_bps > 0 or not (math.isfinite(share_bps) and share_bps > 0):
            return 0.0
        self.ceiling_bps = share_bps
        self.good_bps = 0.0
        self._soft = True
        self.rate_bps = max(AUTO_FLOOR_BPS, HOLD * share_bps)
        return self.rate_bps

    def hold_for_burst(self) -> None:
        """R16: a round judged elsewhere to be a burst's head: no verdict, the rate held; the next
        round (the burst) and the one after (its tail) are judged as after a burst."""
        self._cut = None
        self._tail = True

    def round_done(self, stated_bps: Sequence[float], losses: Sequence[float], arrival_bps: float = 0.0,
                   paced: bool = True) -> float:
        """A round's uploads: the rate each worker stated (0: none), each first pass's loss
        fraction, the mean rate clean uploads arrived at (bit/s; 0: some first pass lost), and
        whether any first pass was paced (stated a rate). Returns the next round's grant (0: none);
        :attr:`burst` says whether this round's loss was taken for a burst."""
        self.burst = False
        if self.rate_bps == 0.0:
            rates = [r for r in stated_bps if math.isfinite(r) and r > 0]
            if rates:  # the seed: the sum the workers found alone, split equally
                self.rate_bps = max(AUTO_FLOOR_BPS, sum(rates) / len(rates))
                if not paced:  # stated by later passes: the first passes' loss is the unpaced flood's, no verdict
                    return self.rate_bps
            elif arrival_bps > 0 and math.isfinite(arrival_bps):  # nothing stated, nothing lost: as they arrived
                self.rate_bps = max(AUTO_FLOOR_BPS, arrival_bps)
            else:
                return 0.0
        loss = sum(losses) / len(losses) if losses else 0.0
        g = self.rate_bps
        proven = g <= self.good_bps * (1.0 + STEP) * CEILING_CREEP
        tail, self._tail = self._tail, False
        cut, self._cut = self._cut, None
        if loss == 0.0:
            self._strikes = 0
            self.good_bps = max(self.good_bps, g)
            if self.ceiling_bps == math.inf:  # doubling, but at most HEADROOM x what clean passes delivered
                # (paced below the path they arrive at the grant, so a clean round rises 25%, not 100%,
                # and the start does not double past the share)
                cap = HEADROOM * arrival_bps if arrival_bps > 0 and math.isfinite(arrival_bps) else math.inf
                self.rate_bps = max(MAX_CUT * g, min(2.0 * g, cap))
            else:
                self.ceiling_bps *= (1.0 + STEP) if self._soft else CEILING_CREEP
                self.rate_bps = max(g, min(g * (1.0 + STEP), HOLD * self.ceiling_bps))
            return self.rate_bps
        # a burst, not the rate's doing: heavy loss at a clean grant or one step above it (a +4%
        # step adds 4% to the load, it cannot lose 20% of it) ...
        # (or more than any step up from the last clean grant can lose - a load raised by a factor f loses at
        # most 1 - 1/f of it: a start step of 1.25x at most 20%; 70% during the start is a burst too)
        if cut is not None and cut[2] and loss >= BURSTY_LOSS:
            # a burst's head: light loss at a proven grant as the burst began, a cut, then the burst itself
            self.restores += 1
            self.rate_bps = self.good_bps = cut[0]
            self._strikes, self._tail, self.burst = 0, True, True
            return self.rate_bps
        if tail and proven and (loss < BURSTY_LOSS or (len(losses) > 1 and min(losses) == 0.0)):
            # the round after a burst, at a proven grant: its tail, not the rate - light loss, or (R17) heavy
            # loss beside a clean first pass (a burst that ends mid-pass spares the later uploads; a grant
            # that overflows the server's link loses on every upload): no strike, no cut
            return g
        if loss >= BURSTY_LOSS and (proven or (self.good_bps > 0 and loss > 1.0 - self.good_bps / g)):
            self._strikes += 1
            if self._strikes < self.strikes:
                self._tail = self.burst = True
                return g
        if cut is not None and loss >= RECOVERED * cut[1]:  # slower did not help: a lossy path, not congestion
            self.restores += 1
            self.rate_bps = self.good_bps = cut[0]
            self._strikes = 0
            return self.rate_bps
        self._strikes = 0
        self.cuts += 1
        self._soft = False
        starting = self.ceiling_bps == math.inf
        self.ceiling_bps = g
        self._cut = (g, loss, proven and loss < BURSTY_LOSS)
        if starting and 0.0 < self.good_bps < g:  # the doubling overshot: back to the last clean grant
            self.rate_bps = self.good_bps
        else:  # a cut after light loss is proven for bursts: at a fifth less load, the light loss cannot grow to 20%
            self.rate_bps = max(AUTO_FLOOR_BPS, g * max(MAX_CUT, 1.0 - max(2.0 * loss, CUT)))
            self.good_bps = self.rate_bps if loss < BURSTY_LOSS else 0.0
        return self.rate_bps


def make_pacer(rate_bps: float | None) -> TokenBucket:
    """The pacer of a sender: ``None`` = self-pacing (:class:`AutoPacer`), 0 = unlimited, else fixed bit/s."""
    if rate_bps is None:
        return AutoPacer(SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
    return TokenBucket(rate_bps, SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
