"""Loss-tolerance policies: which fraction of a round's chunks may stay lost.

The server owns the policy (Algorithm 3) and announces the tolerance of each
round to the receiver of each direction. Three policies:

* ``reliable``: p = 0, every chunk is retransmitted until delivered;
* ``fixed``: a constant p, MLT's bounded-loss baseline (paper Table I);
* ``dblp``: critical-learning-regime (CLR) switching between ``P_low`` and
  ``P_high`` (paper section III-B, equation 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .wire import ParameterError

# Paper Table I / section III-B defaults.
DEFAULT_P_LOW = 0.008  # EfficientNetB0's MLT tolerance
DEFAULT_K = 0.40  # P_high = P_low + k
DEFAULT_ETA = 0.5  # Accordion's threshold, used by the paper
DEFAULT_FREQ = 10  # the paper leaves DBLP_freq unstated; 10 iterations is our default


def check_tolerance(name: str, p: float) -> float:
    if not (isinstance(p, (int, float)) and math.isfinite(p) and 0.0 <= p < 1.0):
        raise ParameterError(f"{name} must be in [0, 1), got {p!r}")
    return float(p)


@dataclass
class ReliablePolicy:
    name: str = "reliable"
    tolerance: float = 0.0
    clr: bool = False

    def update(self, step: int, grad_norm: float) -> float:
        return 0.0


@dataclass
class FixedPolicy:
    p: float
    name: str = "fixed"
    clr: bool = False

    def __post_init__(self) -> None:
        check_tolerance("p", self.p)

    @property
    def tolerance(self) -> float:
        return self.p

    def update(self, step: int, grad_norm: float) -> float:
        return self.p


@dataclass
class DblpPolicy:
    """CLR detection on the averaged gradient's L2 norm.

    Rule (Algorithm 3 lines 9-14): at every step that is a multiple of
    ``freq``, the tolerance is reset to ``P_high`` unless
    ``|prev - curr| / prev >= eta``, in which case the critical regime is
    entered and ``P_low`` holds until the next check, i.e. for ``freq``
    steps. Training starts in the critical regime (the start is "indisputably
    critical", section IV-D), so step 0, which has no previous norm, is not a
    check and ``P_low`` holds until step ``freq``.

    ``prev`` is the norm of the previous iteration, as the paper states
    (section IV-E); ``compare="previous_check"`` compares with the norm at the
    previous check instead, as Accordion does.
    """

    p_low: float = DEFAULT_P_LOW
    p_high: float = DEFAULT_P_LOW + DEFAULT_K
    eta: float = DEFAULT_ETA
    freq: int = DEFAULT_FREQ
    compare: str = "previous_iteration"
    name: str = "dblp"
    tolerance: float = field(init=False)
    clr: bool = field(init=False, default=True)
    _prev: float | None = field(init=False, default=None)
    _last_check_norm: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        check_tolerance("p_low", self.p_low)
        check_tolerance("p_high", self.p_high)
        if self.p_high < self.p_low:
            raise ParameterError(f"p_high ({self.p_high}) must be >= p_low ({self.p_low})")
        if not (math.isfinite(self.eta) and self.eta >= 0):
            raise ParameterError(f"eta must be a non-negative number, got {self.eta!r}")
        if int(self.freq) != self.freq or self.freq < 1:
            raise ParameterError(f"freq must be a positive integer, got {self.freq!r}")
        if self.compare not in ("previous_iteration", "previous_check"):
            raise ParameterError(f"compare must be previous_iteration or previous_check, got {self.compare!r}")
        self.tolerance = self.p_low

    def detect(self, prev: float | None, curr: float) -> bool:
        """Equation 1: relative change of the gradient norm of at least eta."""
        if prev is None or not math.isfinite(curr):
            return False
        if prev == 0.0:
            return curr != 0.0
        return abs(prev - curr) / prev >= self.eta

    def update(self, step: int, grad_norm: float) -> float:
        """Feed the norm of step ``step``'s averaged gradient; returns the new tolerance."""
        if step > 0 and step % self.freq == 0:
            ref = self._prev if self.compare == "previous_iteration" else self._last_check_norm
            self.clr = self.detect(ref, grad_norm)
            self.tolerance = self.p_low if self.clr else self.p_high
        if step % self.freq == 0:
            self._last_check_norm = grad_norm
        self._prev = grad_norm
        return self.tolerance


Policy = ReliablePolicy | FixedPolicy | DblpPolicy


def make_policy(
    name: str,
    *,
    p: float = DEFAULT_P_LOW,
    p_low: float | None = None,
    p_high: float | None = None,
    eta: float = DEFAULT_ETA,
    freq: int = DEFAULT_FREQ,
) -> Policy:
    """Build a policy from CLI-style arguments, refusing bad values by name."""
    if name == "reliable":
        return ReliablePolicy()
    if name == "fixed":
        return FixedPolicy(p)
    if name == "dblp":
        lo = p if p_low is None else p_low
        hi = lo + DEFAULT_K if p_high is None else p_high
        return DblpPolicy(p_low=lo, p_high=hi, eta=eta, freq=freq)
    raise ParameterError(f"policy must be reliable, fixed or dblp, got {name!r}")


def needed_chunks(chunks: int, tolerance: float) -> int:
    """Chunks the receiver must hold before it stops the sender: ceil((1-p) n).

    Rounded at 1e-9 first so that e.g. (1 - 0.4) * 10 = 6.000000000000001
    needs 6 chunks, not 7.
    """
    return max(1, math.ceil(round((1.0 - tolerance) * chunks, 9)))
