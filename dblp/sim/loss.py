"""Loss processes of the simulated data channel.

A loss process decides, for the datagrams of one flow (one direction of one
worker's path) that reach the receiving host, which are dropped. It sits at
the receiver's ingress - where the emulation's nftables drop rule sits in
the host's namespace - after the switch queue, so a datagram it drops still
used the link. Control messages are never dropped (they ride TCP).

Specs are plain dicts (they live in ``params.json`` and sweep grids); every
spec takes ``"dirs": "both" | "up" | "down"`` (default both):

======================  =======================================================
kind                    parameters
======================  =======================================================
``bernoulli``           ``p``: independent loss per datagram
``gilbert_elliott``     ``p`` (good->bad), ``r`` (bad->good, default 1-p),
                        ``bad_loss`` (1-h, default 1), ``good_loss`` (1-k,
                        default 0): netem's ``gemodel``, per datagram, each
                        datagram's fate from the state it arrives in
``iteration_bursts``    ``at``: iterations; ``loss``; ``length`` (iterations,
                        default 1): "at iteration k, loss r, for one iteration"
``random_bursts``       ``rate`` (probability a burst starts at an iteration),
                        ``loss``, ``length``: burst iterations drawn from the
                        run's seed, the same for every policy and flow
``time_bursts``         ``at_s``: start times; ``loss``; ``duration_s``:
                        "at time t, loss r for d"
``trace``               ``path`` to a trace of the ``traces/`` format,
                        ``offset_s`` (trace time 0 = simulated time offset_s),
                        ``key``: ``time`` (default) or ``iteration`` (for
                        traces made by ``iteration_burst_segments``)
======================  =======================================================

Iteration-keyed bursts hit every datagram of that iteration's rounds, both
the upstream and the broadcast (as the paper's "for one iteration"), subject
to ``dirs``.

Every flow gets its own instance of each process with its own random stream
(derived from the run's seed, the spec's index, the direction and the
worker), so two runs with the same seed draw the same losses, and the
state of a Gilbert-Elliott chain or a packet-trace cursor is per flow.
Each process answers a whole pass at once (``drops``) for the round-level
mode and one datagram (``drop1``) for the packet-level mode; both draw from
the same distribution.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from ..control import DOWN, UP
from ..wire import ParameterError

KINDS = ("bernoulli", "gilbert_elliott", "iteration_bursts", "random_bursts", "time_bursts", "trace")
DIRS = {"both": (UP, DOWN), "up": (UP,), "down": (DOWN,)}


class LossProcess(Protocol):
    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        """Drop decisions for datagrams reaching the receiver at ``t_s`` (non-decreasing),
        all of iteration ``rnd``; None means none dropped."""
        ...

    def drop1(self, t_s: float, rnd: int) -> bool: ...

    def burst(self, rnd: int) -> bool:
        """Whether an iteration-keyed burst is in force in iteration ``rnd`` (for records)."""
        ...


# -- processes ------------------------------------------------------------------------
class Bernoulli:
    time_based = False

    def __init__(self, p: float, rng: np.random.Generator) -> None:
        self.p = p
        self.rng = rng

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        if self.p <= 0.0:
            return None
        return self.rng.random(t_s.size) < self.p

    def drop1(self, t_s: float, rnd: int) -> bool:
        return self.p > 0.0 and self.rng.random() < self.p

    def burst(self, rnd: int) -> bool:
        return False


class GilbertElliott:
    """netem ``gemodel p r 1-h 1-k``, per datagram, starting in the good state.

    The vector form draws whole sojourns (geometric run lengths) and keeps the
    unfinished run between calls, so a pass of 69k datagrams costs a few
    numpy calls; the scalar form steps the same chain one datagram at a time.
    """

    time_based = False

    def __init__(self, p: float, r: float, bad_loss: float, good_loss: float, rng: np.random.Generator) -> None:
        self.p, self.r, self.bad_loss, self.good_loss = p, r, bad_loss, good_loss
        self.rng = rng
        self.bad = False
        self.left = 0  # datagrams left in the current sojourn (0: not drawn yet)

    def _leave_prob(self) -> float:
        return self.r if self.bad else self.p

    def _draw_left(self) -> None:
        q = self._leave_prob()
        self.left = int(self.rng.geometric(q)) if q > 0 else 1 << 62

    def drop1(self, t_s: float, rnd: int) -> bool:
        if self.left == 0:
            self._draw_left()
        loss = self.bad_loss if self.bad else self.good_loss
        out = loss > 0 and (loss >= 1 or self.rng.random() < loss)
        self.left -= 1
        if self.left == 0:
            self.bad = not self.bad
        return bool(out)

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        n = int(t_s.size)
        if n == 0:
            return None
        is_bad = np.empty(n, bool)
        if self.left == 0:
            self._draw_left()
        take = min(self.left, n)  # finish the current sojourn
        is_bad[:take] = self.bad
        self.left -= take
        if self.left == 0:
            self.bad = not self.bad
        pos = take
        while pos < n:  # whole sojourns, alternating from state self.bad, drawn in bulk
            q1, q2 = (self.r, self.p) if self.bad else (self.p, self.r)
            cycle = (1 / q1 if q1 > 0 else n) + (1 / q2 if q2 > 0 else n)
            k = int(min((n - pos) / cycle * 1.2 + 8, 1_000_000))
            runs = np.empty(2 * k, np.int64)
            runs[0::2] = self.rng.geometric(q1, k) if q1 > 0 else n
            runs[1::2] = self.rng.geometric(q2, k) if q2 > 0 else n
            st = np.empty(2 * k, bool)
            st[0::2], st[1::2] = self.bad, not self.bad
            cum = np.cumsum(runs)
            need = n - pos
            if cum[-1] >= need:
                last = int(np.searchsorted(cum, need))  # first run reaching the end of this call
                is_bad[pos:] = np.repeat(st[: last + 1], runs[: last + 1])[:need]
                over = int(cum[last]) - need
                if over > 0:
                    self.bad, self.left = bool(st[last]), over
                else:
                    self.bad, self.left = not bool(st[last]), 0
                pos = n
            else:  # an even number of whole runs: the state is back to self.bad
                is_bad[pos : pos + int(cum[-1])] = np.repeat(st, runs)
                pos += int(cum[-1])
        if self.bad_loss >= 1.0 and self.good_loss <= 0.0:
            return is_bad if is_bad.any() else None
        prob = np.where(is_bad, self.bad_loss, self.good_loss)
        return self.rng.random(n) < prob

    def burst(self, rnd: int) -> bool:
        return False


class IterationBursts:
    """Loss ``loss[rnd]`` for every datagram of the listed iterations."""

    time_based = False

    def __init__(self, level: dict[int, float], rng: np.random.Generator) -> None:
        self.level = level
        self.rng = rng

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        p = self.level.get(rnd, 0.0)
        if p <= 0.0:
            return None
        if p >= 1.0:
            return np.ones(t_s.size, bool)
        return self.rng.random(t_s.size) < p

    def drop1(self, t_s: float, rnd: int) -> bool:
        p = self.level.get(rnd, 0.0)
        return p > 0.0 and (p >= 1.0 or self.rng.random() < p)

    def burst(self, rnd: int) -> bool:
        return self.level.get(rnd, 0.0) > 0.0


class TimeBursts:
    """Piecewise-constant loss in simulated time: windows ``[start, end)`` at ``loss``."""

    time_based = True

    def __init__(self, starts: np.ndarray, ends: np.ndarray, loss: np.ndarray, rng: np.random.Generator) -> None:
        order = np.argsort(starts)
        self.starts, self.ends, self.loss = starts[order], ends[order], loss[order]
        self.rng = rng

    def _p(self, t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.starts, t, side="right") - 1
        inside = (i >= 0) & (t < self.ends[np.maximum(i, 0)])
        return np.where(inside, self.loss[np.maximum(i, 0)], 0.0)

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        if t_s.size == 0 or t_s[-1] < self.starts[0] or t_s[0] >= self.ends.max():
            return None
        p = self._p(t_s)
        if not p.any():
            return None
        return self.rng.random(t_s.size) < p

    def drop1(self, t_s: float, rnd: int) -> bool:
        p = float(self._p(np.array([t_s]))[0])
        return p > 0.0 and self.rng.random() < p

    def burst(self, rnd: int) -> bool:
        return False


class TraceLoss:
    """Replay of a ``traces/`` file through its reader's drop-process hook.

    Segment traces answer by time (trace time 0 = simulated ``offset_s``);
    packet traces by position: the n-th datagram of this flow that reaches the
    receiver takes the trace's n-th verdict (one cursor per flow).
    """

    time_based = True

    def __init__(self, trace: Any, offset_s: float, rng: np.random.Generator) -> None:
        self.proc = trace.drop_process(rng)
        self.offset_s = offset_s

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        if t_s.size == 0:
            return None
        d = np.asarray(self.proc.drops((t_s - self.offset_s) * 1e6), dtype=bool)
        return d if d.any() else None

    def drop1(self, t_s: float, rnd: int) -> bool:
        return bool(self.proc.drops(np.array([(t_s - self.offset_s) * 1e6]))[0])

    def burst(self, rnd: int) -> bool:
        return False


class Combined:
    """Drop if any process drops. Every process sees every datagram that reaches
    the receiver (so each chain advances as it would alone)."""

    def __init__(self, procs: list) -> None:
        self.procs = procs
        self.time_based = any(p.time_based for p in procs)

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        out = None
        for p in self.procs:
            d = p.drops(t_s, rnd)
            if d is not None:
                out = d if out is None else (out | d)
        return out

    def drop1(self, t_s: float, rnd: int) -> bool:
        hit = False
        for p in self.procs:
            hit |= p.drop1(t_s, rnd)
        return hit

    def burst(self, rnd: int) -> bool:
        return any(p.burst(rnd) for p in self.procs)


# -- specs ------------------------------------------------------------------------------
_PARAMS = {
    "bernoulli": ({"p"}, set()),
    "gilbert_elliott": ({"p"}, {"r", "bad_loss", "good_loss"}),
    "iteration_bursts": ({"at", "loss"}, {"length"}),
    "random_bursts": ({"rate", "loss"}, {"length"}),
    "time_bursts": ({"at_s", "loss", "duration_s"}, set()),
    "trace": ({"path"}, {"offset_s", "key"}),
}


def _prob(kind: str, name: str, v: Any) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ParameterError(f"loss {kind}: {name} must be a probability in [0, 1], got {v!r}")
    return float(v)


def check_specs(specs: list) -> None:
    for i, s in enumerate(specs):
        check_spec(s, i)


def check_spec(spec: Any, index: int = 0) -> None:
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ParameterError(f"loss spec {index} must be a dict with a 'kind' of {KINDS}, got {spec!r}")
    kind = spec["kind"]
    if kind not in _PARAMS:
        raise ParameterError(f"loss spec {index}: unknown kind {kind!r}; known: {KINDS}")
    req, opt = _PARAMS[kind]
    keys = set(spec) - {"kind", "dirs"}
    missing = req - keys
    if missing:
        raise ParameterError(f"loss {kind}: missing {sorted(missing)}")
    extra = keys - req - opt
    if extra:
        raise ParameterError(f"loss {kind}: unknown parameter(s) {sorted(extra)}; known: {sorted(req | opt)}")
    if spec.get("dirs", "both") not in DIRS:
        raise ParameterError(f"loss {kind}: dirs must be one of {sorted(DIRS)}, got {spec.get('dirs')!r}")
    if kind == "bernoulli":
        _prob(kind, "p", spec["p"])
    elif kind == "gilbert_elliott":
        _prob(kind, "p", spec["p"])
        for k in ("r", "bad_loss", "good_loss"):
            if k in spec:
                _prob(kind, k, spec[k])
    elif kind in ("iteration_bursts", "random_bursts", "time_bursts"):
        _prob(kind, "loss", spec["loss"])
        if kind == "iteration_bursts":
            at = spec["at"]
            at = [at] if isinstance(at, int) else at
            if not isinstance(at, list) or not all(isinstance(a, int) and a >= 0 for a in at):
                raise ParameterError(f"loss {kind}: at must be iteration numbers >= 0, got {spec['at']!r}")
        if kind == "random_bursts":
            _prob(kind, "rate", spec["rate"])
        if kind in ("iteration_bursts", "random_bursts"):
            ln = spec.get("length", 1)
            if not (isinstance(ln, int) and ln >= 1):
                raise ParameterError(f"loss {kind}: length must be a positive number of iterations, got {ln!r}")
        if kind == "time_bursts":
            at = spec["at_s"]
            at = [at] if isinstance(at, (int, float)) else at
            if not isinstance(at, list) or not all(isinstance(a, (int, float)) and a >= 0 for a in at):
                raise ParameterError(f"loss {kind}: at_s must be times >= 0 s, got {spec['at_s']!r}")
            d = spec["duration_s"]
            if not (isinstance(d, (int, float)) and d > 0):
                raise ParameterError(f"loss {kind}: duration_s must be positive, got {d!r}")
    elif kind == "trace":
        if spec.get("key", "time") not in ("time", "iteration"):
            raise ParameterError(f"loss trace: key must be time or iteration, got {spec.get('key')!r}")


def burst_iterations(spec: dict, index: int, seed: int, rounds: int) -> dict[int, float]:
    """Iteration -> loss of an iteration-keyed spec (drawn from the run's seed for random bursts)."""
    kind = spec["kind"]
    length = int(spec.get("length", 1))
    loss = float(spec["loss"])
    if kind == "iteration_bursts":
        at = spec["at"]
        starts = [at] if isinstance(at, int) else list(at)
    elif kind == "random_bursts":
        rng = np.random.default_rng([seed, 0xB0B5, index])
        starts = np.flatnonzero(rng.random(rounds) < float(spec["rate"])).tolist()
    else:
        raise ValueError(kind)
    level: dict[int, float] = {}
    for s in starts:
        for k in range(int(s), int(s) + length):
            level[k] = max(level.get(k, 0.0), loss)
    return level


_TRACE_CACHE: dict[str, Any] = {}


def _read_trace(path: str) -> Any:
    if path not in _TRACE_CACHE:
        try:
            from traces import read_trace
        except ImportError as exc:  # pragma: no cover - traces ships with the repo
            raise ParameterError(f"loss trace: the traces package is not importable: {exc}") from exc
        try:
            _TRACE_CACHE[path] = read_trace(path)
        except Exception as exc:  # TraceError, OSError: name the file
            raise ParameterError(f"loss trace {path}: {exc}") from exc
    return _TRACE_CACHE[path]


def make_flow_loss(specs: list, *, seed: int, direction: int, worker: int, rounds: int) -> Combined:
    """The loss process of one flow (direction, worker), from the run's specs."""
    procs = []
    for i, spec in enumerate(specs):
        if direction not in DIRS[spec.get("dirs", "both")]:
            continue
        rng = np.random.default_rng([seed, 0x105, i, direction, worker])
        kind = spec["kind"]
        if kind == "bernoulli":
            procs.append(Bernoulli(float(spec["p"]), rng))
        elif kind == "gilbert_elliott":
            p = float(spec["p"])
            procs.append(GilbertElliott(p, float(spec.get("r", 1.0 - p)), float(spec.get("bad_loss", 1.0)),
                                        float(spec.get("good_loss", 0.0)), rng))
        elif kind in ("iteration_bursts", "random_bursts"):
            procs.append(IterationBursts(burst_iterations(spec, i, seed, rounds), rng))
        elif kind == "time_bursts":
            at = spec["at_s"]
            starts = np.asarray([at] if isinstance(at, (int, float)) else at, dtype=float)
            d = float(spec["duration_s"])
            procs.append(TimeBursts(starts, starts + d, np.full(starts.size, float(spec["loss"])), rng))
        elif kind == "trace":
            tr = _read_trace(str(spec["path"]))
            if spec.get("key", "time") == "iteration":
                gen = (tr.meta.generator or {}).get("params", {})
                if "iterations" not in gen or "loss" not in gen:
                    raise ParameterError(
                        f"loss trace {spec['path']}: key=iteration needs a trace made by iteration_burst_segments "
                        "(generator params 'iterations' and 'loss')"
                    )
                level = {int(k): float(gen["loss"]) for k in gen["iterations"]}
                procs.append(IterationBursts(level, rng))
            else:
                procs.append(TraceLoss(tr, float(spec.get("offset_s", 0.0)), rng))
    return Combined(procs)
