"""The token bucket that paces a sender's data channel, clock passed in.

A sender that bursts a whole gradient at line rate into a shaped link with a finite buffer loses
datagrams to its own burst. The bucket caps the rate; ``rate_bps = 0`` means unlimited. The rate
in force is recorded per round.

Two things decide whether a bucket delivers the rate it is set to:

- **Depth vs. the event loop's sleep.** A sender sleeps until its bucket allows more; a sleep is
  never exact (``epoll`` rounds a wait up to 1 ms, a loaded host deschedules for longer). Tokens
  that arrive while the bucket is full are lost, so a bucket shallower than the oversleep caps
  the rate (docs/pacing.md measures it). A real sender's depth is therefore
  :data:`PACE_QUANTUM_S` of the rate, at least :data:`SENDER_MIN_BURST` - less than the
  simulator's 64 KiB, because a server broadcasting to N workers wakes late with N full buckets,
  and N x 64 KiB overfills a 100-packet queue.
- **Wake size.** The socket loop (:func:`dblp.transport.sockets.pump`) sleeps at least
  :data:`WAKE_S` and at most to the bucket's next datagram, with a sub-millisecond sleep where
  ``epoll`` would round up to 1 ms: a multi-Gbit/s sender wakes every quarter millisecond, not
  every few microseconds, and its batches stay well under the bucket's depth.
"""

from __future__ import annotations

import math

from dblp.protocol.wire import ParameterError

MIN_BURST_BYTES = 64 * 1024  # bucket depth at low rates (~44 datagrams of 1,472 bytes)
PACE_QUANTUM_S = 0.005  # a real sender's bucket depth in time at its rate: covers a late wake-up on a busy host
SENDER_MIN_BURST = 16 * 1024  # a real sender's depth at low rates: a host sending N streams bursts N x this
WAKE_S = 0.00025  # the shortest sleep of a paced sender's loop (dblp.transport.sockets.pump)


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

