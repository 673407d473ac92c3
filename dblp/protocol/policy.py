"""Loss-tolerance policies: which fraction of a round's chunks may stay lost.

The server owns the policy (Algorithm 3) and announces the tolerance of each
round to the receiver of each direction. Three policies:

* ``reliable``: p = 0, every chunk is retransmitted until delivered;
* ``baseline``: a constant p, MLT's bounded-loss baseline (paper Table I);
* ``dblp``: critical-learning-regime (CLR) switching between ``P_low`` and
  ``P_high`` (paper section III-B, equation 1).

One name per policy everywhere - flags, records, tables, ``DBLPComm``: the
fixed-tolerance policy is ``baseline`` (the paper's word). ``fixed``, its
name before, is accepted wherever a policy is named, and records that say
``fixed`` read as ``baseline`` (:func:`policy_name`). Experiments' runs are
``reliable``, ``baseline`` (fixed p = P_low) and ``dblp``. :func:`run_policy` is the one
translation of such a name (or a policy name) into a :class:`PolicySpec`,
which gives the server's flags, a simulator config's fields and the policy
object. :func:`passes_needed` is the one form of the tolerance arithmetic
(passes until ``1 - loss**k >= 1 - p``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dblp.protocol.wire import ParameterError

# Paper Table I / section III-B defaults.
DEFAULT_P_LOW = 0.008  # EfficientNetB0's MLT tolerance
DEFAULT_K = 0.40  # P_high = P_low + k


def default_p_high(p_low: float) -> float:
    """P_high when none is given: P_low + k, rounded at 1e-12 so that 0.008 + 0.4 is 0.408
    (in flags, file names and tables), not 0.40800000000000003."""
    return round(p_low + DEFAULT_K, 12)
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
    name: str = "baseline"
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
    p_high: float = default_p_high(DEFAULT_P_LOW)
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
    name = policy_name(name)
    if name == "reliable":
        return ReliablePolicy()
    if name == "baseline":
        return FixedPolicy(p)
    if name == "dblp":
        lo = p if p_low is None else p_low
        hi = default_p_high(lo) if p_high is None else p_high
        return DblpPolicy(p_low=lo, p_high=hi, eta=eta, freq=freq)
    raise ParameterError(f"policy must be reliable, baseline or dblp, got {name!r}")


def needed_chunks(chunks: int, tolerance: float) -> int:
    """Chunks the receiver must hold before it stops the sender: ceil((1-p) n).

    Rounded at 1e-9 first so that e.g. (1 - 0.4) * 10 = 6.000000000000001
    needs 6 chunks, not 7.
    """
    return max(1, math.ceil(round((1.0 - tolerance) * chunks, 9)))


# -- names of runs and policies ---------------------------------------------------------------
#: The policies (``--policy``), one name each.
POLICIES: tuple[str, ...] = ("reliable", "baseline", "dblp")
#: An experiment's named runs (``--policies``): ``baseline`` is the fixed policy at P_low.
RUNS: tuple[str, ...] = ("reliable", "baseline", "dblp")
#: Older names, still accepted (and read from records written before): name -> the one name
POLICY_ALIASES: dict[str, str] = {"fixed": "baseline"}
#: what a policy flag's help says about the alias
ALIAS_NOTE = "fixed is accepted as the old name of baseline"


def policy_name(name: str) -> str:
    """The one name of a policy (``fixed`` -> ``baseline``); other names are returned as they are."""
    return POLICY_ALIASES.get(name, name)


@dataclass(frozen=True)
class PolicySpec:
    """A tolerance policy by name and parameters, in the form every driver needs:
    :meth:`flags` (``python -m dblp server``), :meth:`config` (``SimConfig`` fields)
    and :meth:`build` (the policy object)."""

    policy: str  # one of POLICIES
    p: float = 0.0  # the fixed tolerance (baseline), P_low (dblp)
    p_low: float | None = None
    p_high: float | None = None
    eta: float = DEFAULT_ETA
    freq: int = DEFAULT_FREQ

    def build(self) -> Policy:
        return make_policy(self.policy, p=self.p, p_low=self.p_low, p_high=self.p_high, eta=self.eta, freq=self.freq)

    def flags(self) -> list[str]:
        """The server's command-line flags of this policy."""
        if self.policy == "reliable":
            return ["--policy", "reliable"]
        if self.policy == "baseline":
            return ["--policy", "baseline", "--p", repr(float(self.p))]
        a = ["--policy", "dblp", "--p-low", repr(float(self.p if self.p_low is None else self.p_low)),
             "--eta", repr(float(self.eta)), "--freq", str(int(self.freq))]
        return a + (["--p-high", repr(float(self.p_high))] if self.p_high is not None else [])

    def config(self) -> dict[str, Any]:
        """Fields of a ``dblp.sim.config.SimConfig`` (``cfg.with_(**spec.config())``)."""
        return {"policy": self.policy, "p": self.p, "p_low": self.p_low, "p_high": self.p_high,
                "eta": self.eta, "freq": self.freq}


def run_policy(
    name: str,
    p_low: float = DEFAULT_P_LOW,
    p_high: float | None = None,
    eta: float = DEFAULT_ETA,
    freq: int = DEFAULT_FREQ,
) -> PolicySpec:
    """The policy of a named run or policy: ``reliable`` (p = 0), ``baseline`` or
    ``fixed`` (p = ``p_low``), ``dblp`` (``p_low`` in the CLR, ``p_high`` outside,
    default :func:`default_p_high`). Parameters a policy does not use are left at their defaults,
    so equal policies compare equal. Checks every value (ParameterError)."""
    if name == "reliable":
        spec = PolicySpec("reliable")
    elif policy_name(name) == "baseline":
        spec = PolicySpec("baseline", p=p_low)
    elif name == "dblp":
        spec = PolicySpec("dblp", p=p_low, p_low=p_low, p_high=default_p_high(p_low) if p_high is None else p_high,
                          eta=eta, freq=freq)
    else:
        raise ParameterError(f"policy must be one of {', '.join(RUNS)} ({ALIAS_NOTE}), got {name!r}")
    spec.build()  # refuse bad values here, by name
    return spec


def parse_runs(text: str) -> list[str]:
    """``"reliable,baseline,dblp"`` -> the list, each checked against :data:`RUNS`."""
    runs = [policy_name(x.strip()) for x in text.split(",") if x.strip()]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        raise ParameterError(f"unknown run {bad[0]!r}: use a comma list of {', '.join(RUNS)}")
    if not runs:
        raise ParameterError("no run named: use a comma list of " + ", ".join(RUNS))
    return runs


# -- pass arithmetic ---------------------------------------------------------------------------
def passes_needed(loss: float, tolerance: float, chunks: int | None = None, max_passes: int = 1000) -> int:
    """Passes a sender needs when every pass loses ``loss`` of what it sends:
    the smallest k with ``1 - loss**k >= 1 - tolerance`` (paper V-B arithmetic:
    at 70% loss, 0.8% needs 14 passes and 40.8% needs 3).

    With ``chunks`` given, the chunk count rounds the allowance: the expected
    missing count ``chunks * loss**k`` must fall to the chunks the receiver may
    miss (:func:`needed_chunks`) plus half a chunk, so p = 0 needs a finite
    number of passes. Without it, p = 0 needs ``max_passes``.
    """
    if loss <= 0:
        return 1
    if loss >= 1:
        return max_passes
    q = (chunks - needed_chunks(chunks, tolerance) + 0.5) / chunks if chunks else tolerance
    if q >= 1:
        return 1
    if q <= 0:
        return max_passes
    # 1e-9: 0.7**k at exactly p (a tolerance written as a power) needs k, not k + 1
    return min(max_passes, max(1, math.ceil(math.log(q) / math.log(loss) - 1e-9)))
