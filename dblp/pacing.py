"""Token-bucket pacing of the data channel, with the clock passed in.

A sender that bursts a whole gradient at line rate into a shaped link with a
finite buffer loses datagrams to its own burst. The bucket caps the rate;
``rate_bps = 0`` means unlimited (the default on loopback). The rate is a
plain attribute so that a later rate-adaptation rule can change it between
passes; the rate in force is recorded per round.
"""

from __future__ import annotations

from .wire import ParameterError


class TokenBucket:
    def __init__(self, rate_bps: float = 0.0, burst_bytes: int = 64 * 1024) -> None:
        if rate_bps < 0:
            raise ParameterError(f"send rate must be >= 0 bit/s, got {rate_bps}")
        if burst_bytes <= 0:
            raise ParameterError(f"pacing burst must be positive, got {burst_bytes}")
        self.rate_bps = float(rate_bps)
        self.burst_bytes = int(burst_bytes)
        self._tokens = float(burst_bytes)
        self._t: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.rate_bps == 0.0

    @property
    def last_time(self) -> float:
        return self._t or 0.0

    def _refill(self, now: float) -> None:
        if self._t is not None and now > self._t:
            self._tokens = min(self.burst_bytes, self._tokens + (now - self._t) * self.rate_bps / 8.0)
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
        return now if deficit <= 0 else now + deficit * 8.0 / self.rate_bps + 1e-9
