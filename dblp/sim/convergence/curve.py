"""Time to accuracy: the accuracy curve the convergence models share, its walk through a run, its fit.

Why: a simulated run measures latencies, passes and the fraction of each
round's gradient that was lost, but not what those losses cost in
convergence. ``time_to_train_s`` is the time of a fixed number of
iterations; a tolerance that loses more gradient can finish those iterations
sooner and still reach a given accuracy later. This module turns a run's
per-iteration lost fractions and round end times into the simulated time at
which a target test accuracy is reached (``time_to_accuracy_s``), through a
model fitted to real trainings (:mod:`dblp.sim.convergence.phase` fits them;
:mod:`dblp.sim.convergence.modes` scales them per compensation mode).

The curve and its walk (per iteration, no torch, no numpy)::

    progress:  s_0 = 0,  s_{i+1} = s_i + max(0, 1 - w_i * f_i)
    accuracy:  acc(s) = a - (a - a0) * (1 + (s / tau) ** k) ** -m

``f_i`` is the fraction of iteration i's averaged gradient that was lost
(zero-filled: DBLP does not rescale), ``s`` the effective number of lossless
iterations done and ``w_i`` how many iterations of progress a lost fraction
costs in iteration i (:class:`PhaseModel`: ``w_crit`` in the iterations
DBLP's CLR detector puts in the critical regime, ``w_calm`` in the others).
``acc`` rises from chance (``a0`` = 0.1, ten classes) to the plateau ``a``:
an S-shaped start (``k`` > 1) and a power-law tail ``s ** -(k m)`` (slow last
points). A lossless run has ``s_i = i``; a loss can only slow ``s`` (``w >=
0``), so with the same round times the time to accuracy is never shorter
with loss. The trainings lost at most 90% of an iteration
(:data:`F_MEASURED`); above that the gain falls linearly to none at ``f`` = 1
(nothing arrived: no step).

Against measured runs (:mod:`dblp.sim.convergence.runs`): :func:`rmse`,
:func:`noise_rmse` (the seed-to-seed floor no smooth model goes below) and
:func:`crossings` (iterations to each target, measured and modelled); the
fits minimise :func:`rmse` with :func:`nelder_mead`.

In a simulated run (:func:`time_to_accuracy`): ``f_i = 1 - u_i * d_i`` with
``u_i`` the mean over workers of the fraction of their gradients the server
received in round i (the server averages zero-filled gradients) and ``d_i``
the mean fraction of the broadcast the workers received; the accuracy after
round i is reached when the last worker finishes round i. When the target is
not reached within the simulated rounds, the run is extrapolated: further
rounds take the mean round period of the run's second half and lose the
mean fraction of the whole run (``tta_extrapolated`` says so); a target
above the plateau ``a`` is never reached (``inf``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from dblp.protocol.wire import ParameterError
from dblp.sim.convergence.runs import Curve

DEFAULT_TARGET_ACCURACY = 0.93
CHANCE = 0.1  # ten classes
F_MEASURED = 0.9  # the largest lost fraction in the training runs

# -- the model -------------------------------------------------------------------------------------------


def _gain(w: float, f: float) -> float:
    """Iterations of progress of one iteration that lost fraction ``f`` at weight ``w``.

    Beyond the largest fraction measured (:data:`F_MEASURED`) the gain falls linearly to nothing at
    ``f`` = 1 (no gradient at all: no progress), instead of the fitted line's ``1 - w``."""
    if f <= F_MEASURED:
        return max(0.0, 1.0 - w * f)
    return max(0.0, 1.0 - w * F_MEASURED) * (1.0 - f) / (1.0 - F_MEASURED)


class AccuracyCurve:
    """What every convergence model shares: the accuracy curve over effective iterations and the walk
    through a run (:class:`PhaseModel`; :class:`dblp.sim.convergence.modes.ModeModel` scales another's loss).

    A subclass gives ``a``, ``tau``, ``k``, ``m``, ``a0`` and ``step(s, f, critical)``; ``critical`` is
    whether DBLP's CLR detector has the iteration in the critical regime (a share in [0, 1] for
    extrapolated iterations), ignored by a model that does not charge loss by regime."""

    a: float
    tau: float
    k: float
    m: float
    a0: float

    def step(self, s: float, f: float, critical: float = 0.0) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def accuracy_at(self, s: float) -> float:
        return self.a - (self.a - self.a0) * (1.0 + (max(s, 0.0) / self.tau) ** self.k) ** -self.m

    def progress_needed(self, target: float) -> float:
        """Effective iterations to reach accuracy ``target`` (inf above the plateau)."""
        if target <= self.a0:
            return 0.0
        if target >= self.a:
            return math.inf
        return self.tau * (((self.a - target) / (self.a - self.a0)) ** (-1.0 / self.m) - 1.0) ** (1.0 / self.k)

    def curve(self, fractions: Iterable[float], critical: Sequence[bool] | None = None) -> list[float]:
        """Accuracy before training and after each iteration with these lost fractions (and regimes)."""
        s = 0.0
        out = [self.accuracy_at(0.0)]
        for i, f in enumerate(fractions):
            s = self.step(s, f, bool(critical[i]) if critical is not None and i < len(critical) else False)
            out.append(self.accuracy_at(s))
        return out

    def iterations_to(self, target: float, fractions: Sequence[float], *, critical: Sequence[bool] | None = None,
                      then: float | None = None, then_critical: float = 0.0, limit: int = 100_000) -> float:
        """Iterations until ``target`` is reached: through ``fractions`` (in the regimes ``critical``), then
        (if given) losing ``then`` per iteration for ever, a share ``then_critical`` of those iterations
        critical; ``inf`` if never. Beyond ``limit`` extra iterations the settled rate is used."""
        need = self.progress_needed(target)
        if need == 0.0:
            return 0.0
        s = 0.0
        for i, f in enumerate(fractions):
            s = self.step(s, f, bool(critical[i]) if critical is not None and i < len(critical) else False)
            if s >= need:
                return float(i + 1)
        if then is None or math.isinf(need):
            return math.inf
        n = len(fractions)
        for _ in range(limit):
            s = self.step(s, then, then_critical)
            n += 1
            if s >= need:
                return float(n)
        rate = self.step(s, then, then_critical) - s  # the weight has long settled
        return n + math.ceil((need - s) / rate) if rate > 0 else math.inf


@dataclass(frozen=True)
class PhaseModel(AccuracyCurve):
    """Accuracy per iteration when a lost fraction costs ``w_crit`` iterations of progress in the iterations
    DBLP's CLR detector puts in the critical regime and ``w_calm`` in the others (``w_crit`` = ``w_calm``: the
    same charge in every regime); fitted in :mod:`dblp.sim.convergence.phase`."""

    a: float
    tau: float
    k: float
    m: float
    w_crit: float  # cost of a lost fraction in a critical-regime iteration
    w_calm: float  # ... and in any other
    a0: float = CHANCE

    def weight(self, critical: float) -> float:
        return self.w_calm + (self.w_crit - self.w_calm) * float(critical)

    def step(self, s: float, f: float, critical: float = 0.0) -> float:
        return s + _gain(self.weight(critical), f)


# -- against measured runs, and the fit ------------------------------------------------------------------


def rmse(model: AccuracyCurve, curves: Sequence[Curve]) -> float:
    """Root mean square of model - measured accuracy over every evaluation of ``curves``."""
    se, n = 0.0, 0
    preds: dict[tuple, list[float]] = {}  # seeds of one schedule share the prediction (unless labelled)
    for c in curves:
        key = (c.workload, c.schedule, c.seed if c.labels is not None else None)
        pred = preds.get(key)
        if pred is None:
            pred = preds[key] = model.curve(c.fractions(), c.critical())
        for i, acc in zip(c.iterations, c.accuracy):
            se += (pred[i] - acc) ** 2
            n += 1
    return math.sqrt(se / n) if n else math.nan


def noise_rmse(curves: Sequence[Curve]) -> float:
    """RMSE of each run against the mean of its schedule's runs (seeds), scaled to a per-run spread."""
    by: dict[str, list[Curve]] = {}
    for c in curves:
        by.setdefault(c.setting, []).append(c)
    se, n = 0.0, 0
    for runs in by.values():
        if len(runs) < 2:
            continue
        for j in range(len(runs[0].accuracy)):
            vals = [r.accuracy[j] for r in runs]
            m = sum(vals) / len(vals)
            se += sum((v - m) ** 2 for v in vals) * len(vals) / (len(vals) - 1)  # unbiased per-run variance
            n += len(vals)
    return math.sqrt(se / n) if n else math.nan


def crossings(model: AccuracyCurve, curves: Sequence[Curve],
              targets: Sequence[float] = (0.8, 0.9, DEFAULT_TARGET_ACCURACY)) -> list[dict]:
    """Iterations to each target: measured (first evaluation at or above it of the mean over a schedule's
    seeds; 5-iteration resolution) against the model's, per workload and schedule - the error time to
    accuracy inherits (with a fixed round time, the relative error of the time is that of the iterations).

    Runs whose seeds lost differently (regime labels, measured losses) are predicted seed by seed: the
    model's crossing is where the mean of the seeds' predicted curves reaches the target."""
    by: dict[tuple[str, str], list[Curve]] = {}
    for c in curves:
        by.setdefault((c.workload, c.setting), []).append(c)
    out = []
    for (wl, name), runs in by.items():
        n = min(len(r.accuracy) for r in runs)
        mean = [sum(r.accuracy[j] for r in runs) / len(runs) for j in range(n)]
        per_seed = any(r.labels is not None for r in runs)
        if per_seed:
            preds = [model.curve(r.fractions(), r.critical()) for r in runs]
            m = min(len(p) for p in preds)
            pmean = [sum(p[i] for p in preds) / len(preds) for i in range(m)]
        for t in targets:
            measured = next((i for i, a in zip(runs[0].iterations, mean) if a >= t), math.inf)
            if per_seed:
                predicted = float(next((i for i, a in enumerate(pmean) if a >= t), math.inf))
            else:
                predicted = model.iterations_to(t, runs[0].fractions())
            out.append({"workload": wl, "setting": name, "target": t, "measured": measured, "model": predicted})
    return out


def nelder_mead(fn: Callable[[list[float]], float], x0: Sequence[float], *, step: float = 0.5,
                iterations: int = 3000, tol: float = 1e-10) -> list[float]:
    """Minimise ``fn`` from ``x0`` (the textbook simplex: reflect, expand, contract, shrink)."""
    pts = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(len(x0))]
    vals = [fn(p) for p in pts]
    for _ in range(iterations):
        order = sorted(range(len(pts)), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        cen = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]
        refl = [c + (c - w) for c, w in zip(cen, pts[-1])]
        fr = fn(refl)
        if fr < vals[0]:
            exp_ = [c + 2 * (c - w) for c, w in zip(cen, pts[-1])]
            fe = fn(exp_)
            pts[-1], vals[-1] = (exp_, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(cen, pts[-1])]
            fc = fn(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [[b + 0.5 * (p - b) for b, p in zip(pts[0], q)] for q in pts[1:]]
                vals = [vals[0]] + [fn(p) for p in pts[1:]]
    return pts[min(range(len(pts)), key=vals.__getitem__)]


# -- a simulated run's time to accuracy ------------------------------------------------------------------


def time_to_accuracy(ends: Sequence[float], lost: Sequence[float], target: float, model: AccuracyCurve,
                     critical: Sequence[bool] | None = None) -> dict[str, float]:
    """``time_to_accuracy_s``, ``iterations_to_accuracy`` and ``tta_extrapolated`` (1.0 when the target lies
    beyond the simulated rounds and the run was extrapolated; see the module docstring). ``critical``: each
    round's training regime (:func:`dblp.sim.convergence.phase.sim_regimes`), for a model that charges loss
    by regime; extrapolated rounds are critical in the run's share of them."""
    n = len(ends)
    if n == 0:
        return {"time_to_accuracy_s": math.nan, "iterations_to_accuracy": math.nan, "tta_extrapolated": math.nan}
    mean_lost = sum(lost) / n
    share = sum(1 for c in list(critical or [])[:n] if c) / n
    it = model.iterations_to(target, lost, critical=critical, then=mean_lost, then_critical=share)
    if it == 0.0:
        t = 0.0
    elif math.isinf(it):
        t = math.inf
    elif it <= n:
        t = ends[int(it) - 1]
    else:
        h = n // 2
        period = (ends[-1] - ends[h - 1]) / (n - h) if h >= 1 else ends[-1] / n
        t = ends[-1] + (it - n) * period
    return {"time_to_accuracy_s": t, "iterations_to_accuracy": it, "tta_extrapolated": float(it > n)}


def check_target(target: float) -> None:
    """A target accuracy must lie strictly between chance and 1 (a fraction, not a percentage)."""
    if not (isinstance(target, (int, float)) and CHANCE < target < 1.0):
        raise ParameterError(f"--target-accuracy must be a fraction between {CHANCE} (chance) and 1, got {target!r}"
                             + (" (a percentage? write 0.93 for 93%)" if isinstance(target, (int, float))
                                and 1.0 < target <= 100.0 else ""))


def _target_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        check_target(v)
    except ParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--target-accuracy ")) from None
    return v


def add_target_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The ``--target-accuracy`` flag of ``python -m dblp.sim run`` and ``sweep`` (one definition)."""
    p.add_argument("--target-accuracy", type=_target_arg, default=DEFAULT_TARGET_ACCURACY, metavar="FRACTION",
                   help="test accuracy (a fraction: 0.93 = 93%%) whose simulated time time_to_accuracy_s reports, "
                        "from a convergence model fitted to CPU training runs (--convergence; above the model's "
                        "plateau: never reached, inf)")
