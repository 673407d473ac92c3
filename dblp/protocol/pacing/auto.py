"""Self-pacing (rule R11): the rate a sender sets from each pass's outcome, and a sender's pacer.

The rule is stated in :mod:`dblp.protocol.pacing`; :class:`AutoPacer` carries out its arithmetic
and R12's grant on the worker's side, :func:`make_pacer` picks a sender's bucket from the run's
pacing flag.
"""

from __future__ import annotations

import math

from dblp.protocol.pacing.bucket import MIN_BURST_BYTES, PACE_QUANTUM_S, SENDER_MIN_BURST, TokenBucket

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
        the ratios their first flood gave them, and a round waits for its slowest upload. The
        server sees every sender's passes: it decides one rate for all."""
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


def make_pacer(rate_bps: float | None) -> TokenBucket:
    """The pacer of a sender: ``None`` = self-pacing (:class:`AutoPacer`), 0 = unlimited, else fixed bit/s."""
    if rate_bps is None:
        return AutoPacer(SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
    return TokenBucket(rate_bps, SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
