"""Pacing of the data channel: a token bucket, and the self-pacing rate arithmetic, clock passed in.

A sender that bursts a whole gradient at line rate into a shaped link with a
finite buffer loses datagrams to its own burst. The bucket caps the rate;
``rate_bps = 0`` means unlimited. The rate in force is recorded per round.

Two things decide whether a bucket delivers the rate it is set to:

- **Depth vs. the event loop's sleep.** A sender sleeps until its bucket
  allows more; a sleep is never exact (``epoll`` rounds a wait up to 1 ms,
  a loaded host deschedules for longer). Tokens that arrive while the bucket
  is full are lost, so a bucket shallower than the oversleep caps the rate:
  the old fixed 64 KiB bucket held 0.58 ms at 900 Mbit/s and delivered ~0.44
  Gbit/s behind 1 ms sleeps (issue #30). The depth is therefore
  :data:`PACE_QUANTUM_S` of the rate (at least :data:`MIN_BURST_BYTES`).
- **Wake size.** The socket loop (:func:`dblp.transport.pump`) sleeps at
  least :data:`WAKE_S` and at most to the bucket's next datagram, with a
  sub-millisecond sleep where ``epoll`` would round up to 1 ms: a
  multi-Gbit/s sender wakes every quarter millisecond, not every few
  microseconds, and its batches stay well under the bucket's depth.

:class:`AutoPacer` is the default pacer (``--pace auto``): it starts
unlimited and sets its own rate from what each pass delivered (core rule
R11, :mod:`dblp.core`): see its docstring for the arithmetic.
"""

from __future__ import annotations

import math

from .wire import ParameterError

MIN_BURST_BYTES = 64 * 1024  # bucket depth at low rates (~44 datagrams of 1,472 bytes)
PACE_QUANTUM_S = 0.005  # a real sender's bucket depth in time at its rate: covers a late wake-up on a busy host
WAKE_S = 0.00025  # the shortest sleep of a paced sender's loop (dblp.transport.pump)

# -- self-pacing (AutoPacer) ---------------------------------------------------------------------
MIN_SAMPLE = 32  # datagrams a pass must have sent to say anything about the rate
AUTO_FLOOR_BPS = 1e6  # the lowest rate self-pacing sets (a sender never stalls on a bad estimate)
GROWTH = 1.25  # a clean pass raises the rate by this factor, at most halfway to the ceiling ...
FAST_GROWTH, FAR = 2.0, 4.0  # ... or by FAST_GROWTH while the ceiling is more than FAR times the rate
SETTLE = 0.1  # ... and not at all while the ceiling is within this fraction above the good rate
CEILING_CREEP = 1.005  # each clean pass lifts the ceiling so (capacity freed by others is found again)
MAX_CUT = 0.5  # a paced sender's rate falls to no less than this fraction in one cut (a burst misread costs 2x, once)
RECOVERED = 0.8  # after a cut, loss at this fraction of the cut pass's loss or more: the rate was not to blame
BURSTY_LOSS = 0.2  # loss of a pass at a proven rate from which on it is taken for a burst, below for congestion
STRIKES = 2  # rounds in a row losing at the good rate before it counts as stale


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
                first: bool = True) -> None:
        """A pass's outcome (core rule R11); a fixed-rate bucket ignores it."""


class AutoPacer(TokenBucket):
    """Self-pacing: the rate set from each pass's outcome, no hand-set rate (``--pace auto``).

    Starts unlimited. After each pass the sender reports (core rule R11) the
    datagrams it sent, how many of them arrived (from the BITMAP/STOP count),
    their bytes, how long the sending took (``send_s``), how long from the
    pass's first datagram to the reply (``reply_s``: sending, queueing,
    draining and a round trip) and whether it was a round's first pass. The
    delivery rate ``D = delivered bytes / reply_s`` is what the path carried
    for this sender: N senders flooding a bottleneck of rate C each see
    D ~ C / N.

    Congestion (loss the sender's own rate causes, which pacing avoids) is
    told from the loss DBLP tolerates (bursts, a lossy link) by asking
    whether the rate is to blame:

    - a pass without loss proves its rate: ``good_bps`` = the highest such
      rate (unlimited counts); the rate then grows by :data:`GROWTH`
      (:data:`FAST_GROWTH` while far below the ceiling, as after the first
      round's unpaced pass, whose D undershoots), but at most halfway to
      ``ceiling_bps`` (the lowest rate that lost to
      congestion), and not at all while that ceiling is within
      :data:`SETTLE` of ``good_bps``. The ceiling creeps up
      :data:`CEILING_CREEP` per clean pass, so capacity others free is found
      again - one lossy probe in tens of rounds.
    - heavy loss (:data:`BURSTY_LOSS` or more) at or below ``good_bps`` is
      not the rate's doing: the rate stays, so a burst costs no slow-down.
      Only when the first passes of :data:`STRIKES` rounds in a row lose so
      at that rate is ``good_bps`` taken for stale and the loss for
      congestion. Light loss at a proven rate is congestion at once: the
      path is shared now (other senders' passes overlap this one's), which
      a drop-tail queue shows as a few percent lost, not as a burst's tens.
    - congestion: the ceiling drops to the rate in force and the rate goes
      back to ``good_bps``; with none proven, to ``min(D, rate x (1 - max(2 x
      loss, 0.1)))`` but not below :data:`MAX_CUT` of the rate (just D after
      an unpaced pass). If the next pass, at the
      cut rate, still loses :data:`RECOVERED` of what the cut pass lost, the
      loss was not the rate's: the old rate comes back, proven good (a
      lossy path is not slowed pass after pass).

    Passes of fewer than :data:`MIN_SAMPLE` datagrams say nothing (a small
    retransmission's reply time is one round trip, not a rate), nor does a
    pass that delivered nothing (an outage: R8 backs off).
    """

    auto = True

    def __init__(self, burst_bytes: int = MIN_BURST_BYTES, *, depth_s: float = 0.0) -> None:
        super().__init__(0.0, burst_bytes, depth_s=depth_s)
        self.good_bps = 0.0  # highest rate a pass was clean at (math.inf: unpaced and clean); 0 = none yet
        self.ceiling_bps = math.inf  # lowest rate at which a pass lost to congestion
        self._cut: tuple[float, float] | None = None  # (rate before the last cut, loss of the cut pass)
        self._strikes = 0  # rounds in a row whose first pass lost at a good rate
        self.cuts = 0  # congestion verdicts, for records and tests
        self.restores = 0  # cuts undone: the loss did not fall with the rate

    def on_pass(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
                first: bool = True) -> None:
        if sent < MIN_SAMPLE or reply_s <= 0:
            return
        delivered = min(max(delivered, 0), sent)
        loss = 1.0 - delivered / sent
        in_force = self.rate_bps if self.rate_bps > 0 else math.inf
        if loss == 0.0:
            self._clean(in_force, first)
            return
        if in_force <= self.good_bps:
            if loss < BURSTY_LOSS:  # light loss at a proven rate: others share the path now
                self.good_bps = 0.0
            elif not first:  # heavy loss at a proven rate: a burst, not the rate's doing ...
                return
            else:
                self._strikes += 1
                if self._strikes < STRIKES:
                    return
                self._strikes = 0  # ... unless round after round: the good rate is no longer good
                self.good_bps = 0.0
        if self._cut is not None and loss >= RECOVERED * self._cut[1]:  # slower did not help: not congestion
            before = self._cut[0]
            self._cut = None
            self.restores += 1
            self.good_bps = max(self.good_bps, before if before > 0 else math.inf)
            self.rate_bps = before
            return
        if delivered == 0:
            return
        offered = nbytes * 8.0 / send_s if send_s > 0 else math.inf
        self.ceiling_bps = min(self.ceiling_bps, in_force if in_force < math.inf else offered)
        self._cut = (self.rate_bps, loss)
        self.cuts += 1
        if 0.0 < self.good_bps < in_force:
            self.rate_bps = self.good_bps
            return
        d = delivered * (nbytes / sent) * 8.0 / reply_s
        if in_force < math.inf:  # a paced sender: cut by 2x the loss (10% at least), by half at most
            d = max(MAX_CUT * in_force, min(d, in_force * (1.0 - max(2.0 * loss, 0.1))))
        self.rate_bps = max(AUTO_FLOOR_BPS, d)

    def _clean(self, in_force: float, first: bool) -> None:
        self._cut = None
        if first:
            self._strikes = 0
        self.good_bps = max(self.good_bps, in_force)
        if self.ceiling_bps < math.inf:
            self.ceiling_bps *= CEILING_CREEP
        if in_force == math.inf:
            return
        nxt = in_force * (FAST_GROWTH if self.ceiling_bps > FAR * in_force else GROWTH)
        if self.ceiling_bps < math.inf:
            nxt = in_force if self.ceiling_bps <= self.good_bps * (1 + SETTLE) else \
                min(nxt, (self.good_bps + self.ceiling_bps) / 2)
        self.rate_bps = max(in_force, nxt)


def make_pacer(rate_bps: float | None) -> TokenBucket:
    """The pacer of a sender: ``None`` = self-pacing (:class:`AutoPacer`), 0 = unlimited, else fixed bit/s."""
    if rate_bps is None:
        return AutoPacer(depth_s=PACE_QUANTUM_S)
    return TokenBucket(rate_bps, depth_s=PACE_QUANTUM_S)
