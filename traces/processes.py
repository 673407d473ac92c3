"""The loss-process vocabulary: one spec format, its parser, and the processes it names.

Why here, at the lowest layer: the simulator (``dblp.sim.network.loss``), the
emulation (``emulation.bursts`` schedules, ``scenarios/*`` flags) and the
real-host inventory (``emulation.hosts``, ``[[hosts.loss]]`` tables) all say
"loss r at iteration k" or "Gilbert-Elliott with p, r"; they say it with these
words and are checked by :func:`check_spec`, so a spec that runs in the
simulator runs on hosts and in Mininet unchanged (where the mechanism can
realise it, see :data:`NFT_KINDS`).

A spec is a plain dict (it lives in ``params.json``, sweep grids and TOML);
every spec takes ``"dirs": "both" | "up" | "down"`` (default both):

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
                        ``offset_s`` (trace time 0 = time offset_s),
                        ``key``: ``time`` (default) or ``iteration`` (for
                        traces made by ``iteration_burst_segments``)
======================  =======================================================

The text form (command lines): ``kind:key=value:key=value`` with lists as
``a,b,c`` (:func:`parse_spec`), or the JSON of the dict.

Each process answers a whole batch at once (``drops``) and one datagram
(``drop1``); both draw from the same distribution. ``mean_loss`` gives the
expected fraction lost over a window instead (the simulator's class level,
which follows one representative flow in expectation). The Gilbert-Elliott chain
(:class:`GilbertElliottChain`) is the one implementation of netem's
``gemodel`` in the project: the trace generators lay it out as a file, the
simulator streams it per flow.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

import numpy as np

from .errors import TraceError

KINDS = ("bernoulli", "gilbert_elliott", "iteration_bursts", "random_bursts", "time_bursts", "trace")
#: ``dirs`` values -> the directions they cover
DIRECTIONS: dict[str, tuple[str, ...]] = {"both": ("up", "down"), "up": ("up",), "down": ("down",)}
#: kinds an nftables drop rule switched at iteration starts can realise (hosts, Mininet)
NFT_KINDS = ("bernoulli", "iteration_bursts", "random_bursts")

_PARAMS: dict[str, tuple[set[str], set[str]]] = {
    "bernoulli": ({"p"}, set()),
    "gilbert_elliott": ({"p"}, {"r", "bad_loss", "good_loss"}),
    "iteration_bursts": ({"at", "loss"}, {"length"}),
    "random_bursts": ({"rate", "loss"}, {"length"}),
    "time_bursts": ({"at_s", "loss", "duration_s"}, set()),
    "trace": ({"path"}, {"offset_s", "key"}),
}


class LossSpecError(TraceError):
    """A loss spec is malformed; the message names the kind and the parameter (``param``, when one)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# -- the spec: check, parse, expand ------------------------------------------------------
def _prob(kind: str, name: str, v: Any) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0.0 <= v <= 1.0):
        raise LossSpecError(f"loss {kind}: {name} must be a probability in [0, 1], got {v!r}", name)
    return float(v)


def check_specs(specs: list, *, extra_keys: frozenset[str] = frozenset()) -> None:
    """:func:`check_spec` on each spec of a list."""
    for i, s in enumerate(specs):
        check_spec(s, i, extra_keys=extra_keys)


def check_spec(spec: Any, index: int = 0, *, extra_keys: frozenset[str] = frozenset()) -> None:
    """Refuse a malformed spec with a message naming the kind and parameter.

    ``extra_keys``: keys a caller adds beside the spec (the host inventory's
    placement keys ``direction``, ``proto``...), left for the caller to check.
    """
    if not isinstance(spec, dict) or "kind" not in spec:
        raise LossSpecError(f"loss spec {index} must be a dict with a 'kind' of {KINDS}, got {spec!r}", "kind")
    kind = spec["kind"]
    if kind not in _PARAMS:
        raise LossSpecError(f"loss spec {index}: unknown kind {kind!r}; known: {KINDS}", "kind")
    req, opt = _PARAMS[kind]
    keys = set(spec) - {"kind", "dirs"} - set(extra_keys)
    missing = req - keys
    if missing:
        raise LossSpecError(f"loss {kind}: missing {sorted(missing)}", sorted(missing)[0])
    extra = keys - req - opt
    if extra:
        raise LossSpecError(f"loss {kind}: unknown parameter(s) {sorted(extra)}; known: {sorted(req | opt)}",
                            sorted(extra)[0])
    if spec.get("dirs", "both") not in DIRECTIONS:
        raise LossSpecError(f"loss {kind}: dirs must be one of {sorted(DIRECTIONS)}, got {spec.get('dirs')!r}",
                            "dirs")
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
            if not isinstance(at, list) or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0
                                                   for a in at):
                raise LossSpecError(f"loss {kind}: at must be iteration numbers >= 0, got {spec['at']!r}", "at")
        if kind == "random_bursts":
            _prob(kind, "rate", spec["rate"])
        if kind in ("iteration_bursts", "random_bursts"):
            ln = spec.get("length", 1)
            if not (isinstance(ln, int) and not isinstance(ln, bool) and ln >= 1):
                raise LossSpecError(f"loss {kind}: length must be a positive number of iterations, got {ln!r}",
                                    "length")
        if kind == "time_bursts":
            at = spec["at_s"]
            at = [at] if isinstance(at, (int, float)) else at
            if not isinstance(at, list) or not all(isinstance(a, (int, float)) and a >= 0 for a in at):
                raise LossSpecError(f"loss {kind}: at_s must be times >= 0 s, got {spec['at_s']!r}", "at_s")
            d = spec["duration_s"]
            if not (isinstance(d, (int, float)) and d > 0):
                raise LossSpecError(f"loss {kind}: duration_s must be positive, got {d!r}", "duration_s")
    elif kind == "trace":
        if spec.get("key", "time") not in ("time", "iteration"):
            raise LossSpecError(f"loss trace: key must be time or iteration, got {spec.get('key')!r}", "key")


def undeliverable(spec: dict) -> str | None:
    """Why a (checked) spec can never deliver a round, or None.

    A round ends only when a receiver holds at least one chunk, and an
    iteration-keyed burst lasts until its iteration ends: so a process that
    drops every datagram from some point on, or for a whole iteration, makes
    the sender retransmit forever (the simulator spins, the emulation hangs).
    Refused up front: Bernoulli ``p = 1``; a Gilbert-Elliott chain that ends in
    a state of 100% loss (bad state never left with ``bad_loss = 1``, or
    ``good_loss = 1`` with the good state never left); iteration bursts of
    100% loss; a looping time trace, or an iteration-keyed trace, that drops
    everything. Time bursts end by the clock, so 100% loss in them is fine.
    """
    kind = spec["kind"]
    if kind == "bernoulli" and float(spec["p"]) >= 1.0:
        return "loss bernoulli: p=1 drops every datagram; no round could ever finish (use p < 1)"
    if kind == "gilbert_elliott":
        p = float(spec["p"])
        r = float(spec.get("r", 1.0 - p))
        bad, good = float(spec.get("bad_loss", 1.0)), float(spec.get("good_loss", 0.0))
        if (good >= 1.0 and (p == 0.0 or bad >= 1.0)) or (bad >= 1.0 and p > 0.0 and r == 0.0):
            return (f"loss gilbert_elliott: p={p:g} r={r:g} bad_loss={bad:g} good_loss={good:g} ends in a state "
                    "that drops every datagram; no round could ever finish")
    if kind in ("iteration_bursts", "random_bursts") and float(spec["loss"]) >= 1.0:
        if kind == "iteration_bursts" or float(spec["rate"]) > 0:
            return (f"loss {kind}: loss=1 drops every datagram of a burst iteration, which then never ends "
                    "(use loss < 1, or time_bursts for a blackout of fixed length)")
    if kind == "trace":
        tr = _read_trace(str(spec["path"]))
        if spec.get("key", "time") == "iteration":
            if float((tr.meta.generator or {}).get("params", {}).get("loss", 0.0)) >= 1.0:
                return f"loss trace {spec['path']}: its burst iterations lose every datagram and would never end"
        elif getattr(tr.meta, "loop", False) and len(tr) and tr.mean_loss() >= 1.0:
            return f"loss trace {spec['path']}: a looping trace that drops everything; no round could ever finish"
    return None


def _num(v: str) -> int | float | str:
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def parse_spec(text: str) -> dict:
    """A spec from its text form: JSON, or ``kind:key=value:...`` with lists as ``a,b,c``.

    e.g. ``iteration_bursts:at=279,651:loss=0.7``, ``bernoulli:p=0.01``,
    ``gilbert_elliott:p=0.01:r=0.3``, ``random_bursts:rate=0.005:loss=0.7``,
    ``time_bursts:at_s=1.5:loss=0.7:duration_s=0.05``, ``trace:path=x.loss.csv``.
    The result is checked (:class:`LossSpecError` otherwise).
    """
    s = text.strip()
    if s.startswith("{"):
        try:
            d = json.loads(s)
        except json.JSONDecodeError as exc:
            raise LossSpecError(f"bad loss JSON {s!r}: {exc}") from None
    else:
        kind, *parts = s.split(":")
        d = {"kind": kind}
        for part in parts:
            if "=" not in part:
                raise LossSpecError(f"bad loss spec part {part!r} in {s!r}: expected key=value")
            k, v = part.split("=", 1)
            if "," in v or k in ("at", "at_s"):
                d[k] = [_num(x) for x in v.split(",") if x]
            else:
                d[k] = _num(v)
    check_spec(d)
    return d


def burst_iterations(spec: dict, index: int, seed: int, rounds: int) -> dict[int, float]:
    """Iteration -> loss of an iteration-keyed spec (``random_bursts`` drawn from the run's seed).

    The one expansion of "loss r at iteration k for n iterations": the
    simulator, the Mininet burst injector and the host launcher all switch on
    these iterations. Overlapping bursts take the highest loss.
    """
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
        raise LossSpecError(f"loss {kind}: not keyed by iteration")
    level: dict[int, float] = {}
    for s in starts:
        for k in range(int(s), int(s) + length):
            level[k] = max(level.get(k, 0.0), loss)
    return level


def burst_windows(level: dict[int, float]) -> list[tuple[int, int, float]]:
    """``(first iteration, iterations, loss)`` runs of consecutive iterations at one loss."""
    out: list[tuple[int, int, float]] = []
    for k in sorted(level):
        if out and out[-1][0] + out[-1][1] == k and out[-1][2] == level[k]:
            out[-1] = (out[-1][0], out[-1][1] + 1, level[k])
        else:
            out.append((k, 1, level[k]))
    return out


# -- Gilbert-Elliott: the one chain ------------------------------------------------------
class GilbertElliottChain:
    """netem ``gemodel``'s two-state chain, as runs of packets; starts good, as netem's does.

    ``p`` = P(good -> bad), ``r`` = P(bad -> good) per packet. Sojourns are
    drawn as whole arrays of geometric run lengths (never packet by packet);
    the unfinished sojourn is kept between calls, so a flow can be streamed
    in batches. The first call on a fresh chain draws exactly as the trace
    generators always have (the shipped samples reproduce from their seed).
    """

    def __init__(self, p: float, r: float, rng: np.random.Generator) -> None:
        self.p, self.r, self.rng = float(p), float(r), rng
        self.bad = False  # state of the current sojourn
        self.left = 0  # packets left in it (0: the next sojourn starts in state self.bad)

    def runs(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Run lengths and their states (True = bad) of the next ``n`` packets."""
        lens: list[np.ndarray] = []
        states: list[np.ndarray] = []
        need = int(n)
        if need <= 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        if self.left > 0:  # finish the current sojourn
            take = min(self.left, need)
            lens.append(np.array([take], np.int64))
            states.append(np.array([self.bad]))
            self.left -= take
            need -= take
            if self.left == 0:
                self.bad = not self.bad
        if need > 0:
            q1, q2 = (self.r, self.p) if self.bad else (self.p, self.r)
            if q1 == 0.0:  # the state is never left
                lens.append(np.array([need], np.int64))
                states.append(np.array([self.bad]))
                self.left = 1 << 62
            else:
                chunks: list[np.ndarray] = []
                got = 0
                cycle = 1.0 / q1 + (1.0 / q2 if q2 > 0 else float(need))
                while got < need:
                    k = int(min((need - got) / cycle * 1.1 + 16, 5_000_000))
                    a = self.rng.geometric(q1, k)
                    b = self.rng.geometric(q2, k) if q2 > 0 else np.full(k, need, dtype=np.int64)
                    pair = np.empty(2 * k, dtype=np.int64)
                    pair[0::2] = a
                    pair[1::2] = b
                    chunks.append(pair)
                    got += int(pair.sum())
                ln = np.concatenate(chunks)
                cum = np.cumsum(ln)
                last = int(np.searchsorted(cum, need))  # the first run reaching the end of this call
                ln = ln[: last + 1].copy()
                over = int(cum[last]) - need
                ln[-1] -= over
                st = (np.arange(ln.size) % 2 == 1) ^ self.bad
                lens.append(ln)
                states.append(st)
                last_bad = bool(st[-1])
                if over > 0:
                    stuck = (self.r if last_bad else self.p) == 0.0
                    self.bad, self.left = last_bad, (1 << 62) if stuck else over
                else:
                    self.bad, self.left = not last_bad, 0
        return np.concatenate(lens), np.concatenate(states)

    def states(self, n: int) -> np.ndarray:
        """Bad (True) or good of each of the next ``n`` packets."""
        ln, st = self.runs(n)
        return np.repeat(st, ln)


def gilbert_elliott_mean_loss(p: float, r: float, bad_loss: float = 1.0, good_loss: float = 0.0) -> float:
    """Stationary loss of the chain: pi_bad (1-h) + pi_good (1-k), pi_bad = p/(p+r)."""
    if p + r == 0:
        return good_loss
    pb = p / (p + r)
    return pb * bad_loss + (1 - pb) * good_loss


# -- processes ---------------------------------------------------------------------------
class LossProcess(Protocol):
    time_based: bool

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        """Drop decisions for datagrams at times ``t_s`` (non-decreasing), all of
        iteration ``rnd``; None means none dropped."""
        ...

    def drop1(self, t_s: float, rnd: int) -> bool: ...

    def burst(self, rnd: int) -> bool:
        """Whether an iteration-keyed burst is in force in iteration ``rnd`` (for records)."""
        ...

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        """The expected fraction of a flow's datagrams dropped when they arrive spread evenly over
        ``[t0_s, t1_s)`` in iteration ``rnd``: what a model that follows one representative flow in
        expectation (:mod:`dblp.sim.engines.fabric`) takes from the process instead of drawing verdicts."""
        ...


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

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        return self.p


class GilbertElliott:
    """netem ``gemodel p r 1-h 1-k`` per datagram over a :class:`GilbertElliottChain`."""

    time_based = False

    def __init__(self, p: float, r: float, bad_loss: float, good_loss: float, rng: np.random.Generator) -> None:
        self.p, self.r, self.bad_loss, self.good_loss = p, r, bad_loss, good_loss
        self.rng = rng
        self.chain = GilbertElliottChain(p, r, rng)

    def drop1(self, t_s: float, rnd: int) -> bool:
        c = self.chain
        if c.left > 0:  # inside a sojourn: no numpy call (the packet-level simulator asks per datagram)
            bad = c.bad
            c.left -= 1
            if c.left == 0:
                c.bad = not c.bad
        else:
            bad = bool(c.runs(1)[1][0])
        loss = self.bad_loss if bad else self.good_loss
        return loss > 0 and (loss >= 1 or self.rng.random() < loss)

    def drops(self, t_s: np.ndarray, rnd: int) -> np.ndarray | None:
        n = int(t_s.size)
        if n == 0:
            return None
        is_bad = self.chain.states(n)
        if self.bad_loss >= 1.0 and self.good_loss <= 0.0:
            return is_bad if is_bad.any() else None
        prob = np.where(is_bad, self.bad_loss, self.good_loss)
        return self.rng.random(n) < prob

    def burst(self, rnd: int) -> bool:
        return False

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        """The chain's stationary loss (its runs, which decide how the drops cluster, are not kept)."""
        return gilbert_elliott_mean_loss(self.p, self.r, self.bad_loss, self.good_loss)


class IterationBursts:
    """Loss ``level[rnd]`` for every datagram of the listed iterations."""

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

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        return self.level.get(rnd, 0.0)


class TimeBursts:
    """Piecewise-constant loss in time: windows ``[start, end)`` at ``loss``."""

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

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        """The windows' loss weighted by their overlap with ``[t0_s, t1_s)`` (at ``t0_s`` for an instant)."""
        if t1_s <= t0_s:
            return float(self._p(np.array([t0_s]))[0])
        cover = np.clip(np.minimum(self.ends, t1_s) - np.maximum(self.starts, t0_s), 0.0, None)
        return float(min(1.0, (cover * self.loss).sum() / (t1_s - t0_s)))


class TraceLoss:
    """Replay of a trace through its drop-process hook.

    Segment traces answer by time (trace time 0 = ``offset_s``); packet traces
    by position: the n-th datagram of this flow takes the trace's n-th verdict.
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

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        raise LossSpecError("loss trace: a trace keyed by time has no expected loss over a window here "
                            "(replay it per datagram: the round or packet level)", "path")


class Combined:
    """Drop if any process drops. Every process sees every datagram (so each
    chain advances as it would alone)."""

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

    def mean_loss(self, t0_s: float, t1_s: float, rnd: int) -> float:
        """A datagram gets through if every process lets it: 1 - prod(1 - loss_i) (independent draws)."""
        keep = 1.0
        for p in self.procs:
            keep *= 1.0 - p.mean_loss(t0_s, t1_s, rnd)
        return 1.0 - keep


_TRACE_CACHE: dict[str, Any] = {}


def _read_trace(path: str) -> Any:
    if path not in _TRACE_CACHE:
        from .io import read_trace

        try:
            _TRACE_CACHE[path] = read_trace(path)
        except Exception as exc:  # TraceError, OSError: name the file
            raise LossSpecError(f"loss trace {path}: {exc}") from exc
    return _TRACE_CACHE[path]


def make_process(spec: dict, index: int, rng: np.random.Generator, *, seed: int, rounds: int) -> LossProcess:
    """The process a (checked) spec names; ``index``/``seed``/``rounds`` place random bursts."""
    kind = spec["kind"]
    if kind == "bernoulli":
        return Bernoulli(float(spec["p"]), rng)
    if kind == "gilbert_elliott":
        p = float(spec["p"])
        return GilbertElliott(p, float(spec.get("r", 1.0 - p)), float(spec.get("bad_loss", 1.0)),
                              float(spec.get("good_loss", 0.0)), rng)
    if kind in ("iteration_bursts", "random_bursts"):
        return IterationBursts(burst_iterations(spec, index, seed, rounds), rng)
    if kind == "time_bursts":
        at = spec["at_s"]
        starts = np.asarray([at] if isinstance(at, (int, float)) else at, dtype=float)
        d = float(spec["duration_s"])
        return TimeBursts(starts, starts + d, np.full(starts.size, float(spec["loss"])), rng)
    if kind == "trace":
        tr = _read_trace(str(spec["path"]))
        if spec.get("key", "time") == "iteration":
            gen = (tr.meta.generator or {}).get("params", {})
            if "iterations" not in gen or "loss" not in gen:
                raise LossSpecError(
                    f"loss trace {spec['path']}: key=iteration needs a trace made by iteration_burst_segments "
                    "(generator params 'iterations' and 'loss')")
            return IterationBursts({int(k): float(gen["loss"]) for k in gen["iterations"]}, rng)
        return TraceLoss(tr, float(spec.get("offset_s", 0.0)), rng)
    raise LossSpecError(f"loss spec {index}: unknown kind {kind!r}; known: {KINDS}")
