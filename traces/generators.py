"""Seedable loss-trace generators, each stating where its parameters come from.

Every generator returns a trace whose metadata carries ``provenance:
"generated"``, the generator's name, all its parameters and the seed, so a
file can be regenerated bit for bit and can never be mistaken for a
measurement. Sampling is vectorised: state sojourns are drawn as whole
arrays of run lengths, never packet by packet.

Models
------
* **Bernoulli** - independent loss with probability ``loss`` per packet
  (netem ``loss random P``, mahimahi ``mm-loss``).
* **Gilbert-Elliott** - two states, good and bad, parameterised exactly as
  netem's ``loss gemodel p r 1-h 1-k`` (tc-netem(8); kernel
  ``net/sched/sch_netem.c``, ``loss_gilb_ell``): ``p`` = P(good -> bad) and
  ``r`` = P(bad -> good) per packet, ``1-h`` = loss probability in the bad
  state, ``1-k`` = loss probability in the good state. Defaults follow
  iproute2: ``r = 1 - p``, ``1-h = 1``, ``1-k = 0``. Each packet's fate uses
  the state it arrives in; the state then moves (netem's order). The chain
  starts in the good state, as netem's does (the chain is
  :class:`traces.processes.GilbertElliottChain`, the simulator's too). Stationary P(bad) =
  p / (p + r); with 1-h = 1 and 1-k = 0 the mean loss run is 1/r packets.
* **ON/OFF microbursts** - alternating OFF (loss ``off_loss``) and ON
  (loss ``on_loss``) periods with heavy-tailed durations. Benson et al.,
  "Network traffic characteristics of data centers in the wild" (IMC'10)
  found packet arrivals at data-center switches to follow an ON/OFF pattern
  whose ON and OFF periods are heavy-tailed and fitted best by lognormal
  curves; Kandula et al., "The nature of data center traffic" (IMC'09)
  report congestion episodes whose lengths spread over orders of magnitude.
  Zhang et al., "High-resolution measurement of data center microbursts"
  (IMC'17) measured microbursts lasting tens to hundreds of microseconds,
  below what millisecond-resolution traces express. Parameters: the mean ON
  and mean OFF durations (microseconds) and one shape parameter - ``sigma``
  of the underlying normal for ``lognormal`` (the lognormal's mu is solved
  so the mean is exact: mu = ln(mean) - sigma^2/2), or the tail index
  ``alpha`` (> 1) for ``pareto`` (scale x_m = mean (alpha-1)/alpha).
  ``exponential`` reproduces mahimahi's ``mm-onoff``. The defaults (ON mean
  100 us, OFF mean 10 ms, sigma 1, ON loss 0.7) are illustrative values
  inside the ranges those papers report, NOT values fitted to their data.
* **Iteration burst** - the paper's microburst experiment (DBLP,
  arXiv 2605.01989, V-B): "injecting a 70% packet loss rate over the
  unreliable transmission channel for one iteration", at iterations chosen
  at random (e.g. 279 and 651 of 930 for EfficientNetB0). Iterations are
  given by boundaries or by a nominal period; the chosen iteration indices
  are recorded in the parameters so a round-aware replayer can key the burst
  on the iteration number instead of the clock.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import TraceError
from .meta import TraceMeta
from .model import PacketTrace, SegmentTrace
from .processes import GilbertElliottChain, gilbert_elliott_mean_loss

__all__ = ["bernoulli_packets", "bernoulli_segments", "gilbert_elliott_mean_loss", "gilbert_elliott_packets",
           "gilbert_elliott_segments", "draw_durations", "onoff_mean_loss", "onoff_segments",
           "iteration_burst_segments"]

DISTRIBUTIONS = ("lognormal", "pareto", "exponential", "fixed")


def _prob(name: str, x: float) -> float:
    x = float(x)
    if not 0.0 <= x <= 1.0:
        raise TraceError(f"{name} must be a probability in [0, 1], got {x}")
    return x


def _positive(name: str, x: float) -> float:
    x = float(x)
    if not (x > 0 and np.isfinite(x)):
        raise TraceError(f"{name} must be positive, got {x}")
    return x


def _meta(name: str, params: dict[str, Any], seed: int | None, description: str, **kw: Any) -> TraceMeta:
    return TraceMeta(
        provenance="generated",
        source=f"traces.generators.{name}",
        description=description,
        seed=seed,
        generator={"name": name, "params": params},
        **kw,
    )


# -- Bernoulli -----------------------------------------------------------------
def bernoulli_packets(
    loss: float, n_packets: int, *, seed: int | None = None, packet_interval_us: float | None = None
) -> PacketTrace:
    """Each of ``n_packets`` packets is dropped independently with probability ``loss``."""
    loss = _prob("loss", loss)
    if n_packets <= 0:
        raise TraceError("n_packets must be positive")
    rng = np.random.default_rng(seed)
    drops = rng.random(int(n_packets)) < loss
    params = {"loss": loss, "n_packets": int(n_packets)}
    meta = _meta(
        "bernoulli", params, seed, f"Bernoulli loss {loss:g} per packet", packet_interval_us=packet_interval_us
    )
    return PacketTrace(drops, meta)


def bernoulli_segments(loss: float, duration_us: int, *, seed: int | None = None) -> SegmentTrace:
    """Constant loss ``loss`` for ``duration_us`` (one segment; replay draws per packet)."""
    loss = _prob("loss", loss)
    duration_us = int(_positive("duration_us", duration_us))
    params = {"loss": loss, "duration_us": duration_us}
    meta = _meta("bernoulli", params, seed, f"Bernoulli loss {loss:g} for {duration_us} µs")
    return SegmentTrace(np.array([0]), np.array([loss]), duration_us, meta=meta)


# -- Gilbert-Elliott -------------------------------------------------------------
def _ge_params(p: float, r: float | None, bad_loss: float, good_loss: float) -> tuple[float, float, float, float]:
    p = _prob("p", p)
    r = 1.0 - p if r is None else _prob("r", r)
    return p, r, _prob("bad_loss (1-h)", bad_loss), _prob("good_loss (1-k)", good_loss)


def _ge_recorded(p: float, r: float, bad_loss: float, good_loss: float) -> tuple[dict[str, float], str]:
    """The chain's parameters as both forms record them, in netem's names, and their netem text."""
    params = {"p": p, "r": r, "one_minus_h": bad_loss, "one_minus_k": good_loss}
    return params, f"netem gemodel p={p:g} r={r:g} 1-h={bad_loss:g} 1-k={good_loss:g}"


def gilbert_elliott_packets(
    p: float,
    r: float | None = None,
    bad_loss: float = 1.0,
    good_loss: float = 0.0,
    *,
    n_packets: int,
    seed: int | None = None,
    packet_interval_us: float | None = None,
) -> PacketTrace:
    """Per-packet Gilbert-Elliott, netem ``gemodel p r 1-h 1-k`` (``bad_loss`` = 1-h, ``good_loss`` = 1-k)."""
    p, r, bad_loss, good_loss = _ge_params(p, r, bad_loss, good_loss)
    if n_packets <= 0:
        raise TraceError("n_packets must be positive")
    rng = np.random.default_rng(seed)
    lengths, bad = GilbertElliottChain(p, r, rng).runs(int(n_packets))
    prob = np.repeat(np.where(bad, bad_loss, good_loss), lengths)
    drops = rng.random(prob.size) < prob
    params, gemodel = _ge_recorded(p, r, bad_loss, good_loss)
    params["n_packets"] = int(n_packets)
    desc = f"Gilbert-Elliott ({gemodel}), stationary loss {gilbert_elliott_mean_loss(p, r, bad_loss, good_loss):.4g}"
    return PacketTrace(drops, _meta("gilbert-elliott", params, seed, desc, packet_interval_us=packet_interval_us))


def gilbert_elliott_segments(
    p: float,
    r: float | None = None,
    bad_loss: float = 1.0,
    good_loss: float = 0.0,
    *,
    duration_us: int,
    packet_interval_us: float,
    seed: int | None = None,
) -> SegmentTrace:
    """Gilbert-Elliott states laid out in time for packets every ``packet_interval_us``.

    The state sequence is the same chain as :func:`gilbert_elliott_packets`;
    each state becomes a segment with loss 1-h (bad) or 1-k (good). Replayed
    against a flow at that packet rate it reproduces netem's statistics with
    time-based (kernel-rule) replay. Times are rounded to whole microseconds;
    sojourns shorter than 1 us are merged away.
    """
    p, r, bad_loss, good_loss = _ge_params(p, r, bad_loss, good_loss)
    duration_us = int(_positive("duration_us", duration_us))
    iv = _positive("packet_interval_us", packet_interval_us)
    rng = np.random.default_rng(seed)
    n = int(np.ceil(duration_us / iv))
    lengths, bad = GilbertElliottChain(p, r, rng).runs(n)
    ends = np.rint(np.cumsum(lengths) * iv).astype(np.int64)
    starts = np.concatenate(([0], ends[:-1]))
    level = np.where(bad, bad_loss, good_loss)
    keep = (starts < duration_us) & (np.append(starts[1:], duration_us + 1) > starts)
    params, gemodel = _ge_recorded(p, r, bad_loss, good_loss)
    params.update(duration_us=duration_us, packet_interval_us=iv)
    desc = f"Gilbert-Elliott states ({gemodel}) for one packet every {iv:g} µs"
    meta = _meta("gilbert-elliott", params, seed, desc, packet_interval_us=iv)
    return SegmentTrace(starts[keep], level[keep], duration_us, meta=meta).merged()


# -- ON/OFF microbursts -------------------------------------------------------------
def draw_durations(
    dist: str, mean: float, k: int, rng: np.random.Generator, *, sigma: float = 1.0, alpha: float = 1.5
) -> np.ndarray:
    """``k`` durations with the given mean from a named distribution (see module doc)."""
    if dist == "lognormal":
        mu = np.log(mean) - sigma**2 / 2
        return rng.lognormal(mu, sigma, k)
    if dist == "pareto":
        if alpha <= 1:
            raise TraceError("pareto alpha must exceed 1 for a finite mean")
        xm = mean * (alpha - 1) / alpha
        return xm * (1.0 + rng.pareto(alpha, k))
    if dist == "exponential":
        return rng.exponential(mean, k)
    if dist == "fixed":
        return np.full(k, float(mean))
    raise TraceError(f"unknown distribution {dist!r} (known: {', '.join(DISTRIBUTIONS)})")


def onoff_mean_loss(on_mean_us: float, off_mean_us: float, on_loss: float, off_loss: float = 0.0) -> float:
    """Long-run time-weighted loss of an ON/OFF trace."""
    return (on_loss * on_mean_us + off_loss * off_mean_us) / (on_mean_us + off_mean_us)


def onoff_segments(
    *,
    duration_us: int,
    on_mean_us: float = 100.0,
    off_mean_us: float = 10_000.0,
    on_loss: float = 0.7,
    off_loss: float = 0.0,
    dist: str = "lognormal",
    sigma: float = 1.0,
    alpha: float = 1.5,
    start_on: bool = False,
    seed: int | None = None,
) -> SegmentTrace:
    """Alternating OFF/ON periods with heavy-tailed durations (see module doc).

    Durations are rounded to whole microseconds (at least 1 us). The trace
    starts with an OFF period unless ``start_on``.
    """
    duration_us = int(_positive("duration_us", duration_us))
    on_mean_us = _positive("on_mean_us", on_mean_us)
    off_mean_us = _positive("off_mean_us", off_mean_us)
    on_loss, off_loss = _prob("on_loss", on_loss), _prob("off_loss", off_loss)
    if dist == "lognormal":
        _positive("sigma", sigma)
    rng = np.random.default_rng(seed)
    chunks: list[np.ndarray] = []
    got = 0
    while got < duration_us:
        k = int(min((duration_us - got) / (on_mean_us + off_mean_us) * 1.2 + 16, 5_000_000))
        on = draw_durations(dist, on_mean_us, k, rng, sigma=sigma, alpha=alpha)
        off = draw_durations(dist, off_mean_us, k, rng, sigma=sigma, alpha=alpha)
        pair = np.empty(2 * k)
        first, second = (on, off) if start_on else (off, on)
        pair[0::2] = first
        pair[1::2] = second
        d = np.maximum(np.rint(pair), 1).astype(np.int64)
        chunks.append(d)
        got += int(d.sum())
    d = np.concatenate(chunks)
    starts = np.concatenate(([0], np.cumsum(d)[:-1]))
    is_on = (np.arange(d.size) % 2 == 0) == start_on
    keep = starts < duration_us
    params = {
        "duration_us": duration_us,
        "on_mean_us": on_mean_us,
        "off_mean_us": off_mean_us,
        "on_loss": on_loss,
        "off_loss": off_loss,
        "dist": dist,
        "start_on": start_on,
    }
    if dist == "lognormal":
        params["sigma"] = float(sigma)
    elif dist == "pareto":
        params["alpha"] = float(alpha)
    desc = (
        f"ON/OFF microbursts: {dist} ON mean {on_mean_us:g} µs at loss {on_loss:g}, "
        f"OFF mean {off_mean_us:g} µs at loss {off_loss:g}"
    )
    meta = _meta("onoff", params, seed, desc)
    return SegmentTrace(starts[keep], np.where(is_on, on_loss, off_loss)[keep], duration_us, meta=meta).merged()


# -- the paper's "70% for one iteration" ----------------------------------------------
def iteration_burst_segments(
    *,
    loss: float = 0.7,
    base_loss: float = 0.0,
    iteration_us: float | None = None,
    boundaries_us: Sequence[int] | np.ndarray | None = None,
    iterations: Sequence[int] | None = None,
    count: int | None = None,
    total_iterations: int | None = None,
    duration_us: int | None = None,
    seed: int | None = None,
) -> SegmentTrace:
    """Loss ``loss`` during whole iterations, ``base_loss`` elsewhere.

    Iteration i spans ``[boundaries_us[i], boundaries_us[i+1])``, or
    ``[i*iteration_us, (i+1)*iteration_us)`` with a nominal period. The burst
    iterations are ``iterations``, or ``count`` of them drawn at random
    (seeded) from ``range(total_iterations)``, as the paper chose its burst
    iterations at random.
    """
    loss, base_loss = _prob("loss", loss), _prob("base_loss", base_loss)
    if (iteration_us is None) == (boundaries_us is None):
        raise TraceError("give exactly one of iteration_us or boundaries_us")
    if boundaries_us is not None:
        b = np.asarray(boundaries_us, dtype=np.int64)
        if b.ndim != 1 or b.size < 2 or b[0] != 0 or np.any(np.diff(b) <= 0):
            raise TraceError("boundaries_us must start at 0, increase strictly, and hold at least 2 values")
        n_iter = b.size - 1
        if total_iterations is not None and total_iterations != n_iter:
            raise TraceError(f"total_iterations={total_iterations} but boundaries give {n_iter}")
        total_iterations = n_iter
    else:
        iv = _positive("iteration_us", iteration_us)  # type: ignore[arg-type]
        if total_iterations is None:
            if duration_us is not None:
                total_iterations = int(np.ceil(duration_us / iv))
            elif iterations is not None and len(iterations):
                total_iterations = int(max(iterations)) + 1
            else:
                raise TraceError("give total_iterations or duration_us")
        b = np.rint(np.arange(total_iterations + 1) * iv).astype(np.int64)
    rng = np.random.default_rng(seed)
    if iterations is None:
        if count is None:
            raise TraceError("give iterations, or count (and total_iterations) to choose them at random")
        if not 0 < count <= total_iterations:
            raise TraceError(f"count must be in 1..{total_iterations}")
        chosen = np.sort(rng.choice(total_iterations, size=int(count), replace=False))
    else:
        chosen = np.unique(np.asarray(iterations, dtype=np.int64))
        if chosen.size == 0 or chosen[0] < 0 or chosen[-1] >= total_iterations:
            raise TraceError(f"iterations must lie in 0..{total_iterations - 1}")
    dur = int(b[-1]) if duration_us is None else int(_positive("duration_us", duration_us))
    level = np.full(total_iterations, base_loss)
    level[chosen] = loss
    starts = b[:-1]
    if dur > b[-1]:  # time after the last iteration: back to the base loss
        starts, level = np.append(starts, b[-1]), np.append(level, base_loss)
    keep = starts < dur
    params: dict[str, Any] = {
        "loss": loss,
        "base_loss": base_loss,
        "iterations": [int(i) for i in chosen],
        "total_iterations": int(total_iterations),
    }
    if iteration_us is not None:
        params["iteration_us"] = float(iteration_us)
    else:
        params["boundaries_us"] = [int(x) for x in b]
    if count is not None and iterations is None:
        params["count"] = int(count)
    desc = (
        f"loss {loss:g} for one iteration at iteration(s) {', '.join(map(str, params['iterations']))} "
        f"of {total_iterations}, {base_loss:g} elsewhere (the DBLP paper's microburst, V-B)"
    )
    meta = _meta("iteration-burst", params, seed, desc)
    return SegmentTrace(starts[keep], level[keep], dur, meta=meta).merged()
