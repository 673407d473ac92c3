"""Time to accuracy per loss-compensation mode: what a lost fraction costs when the round compensates.

Why: the convergence models (:mod:`dblp.sim.convergence.phase`) were fitted on trainings that zero-fill
every lost chunk, the paper's rule. A compensating round (:mod:`dblp.protocol.compensation`: the unbiased upload
estimate C1, the local broadcast fill C2, error feedback C3/C4) loses the same chunks but applies a
better update, so the same lost fraction costs less progress. The stop rule (core R5b) needs no term
of its own: it changes *how much* is lost, which the records already carry (``1 - up * down``).

The model: the mode's effective lost fraction is ``f_eff = c_mode * f`` (capped at 1), fed to the
workload's fitted curve unchanged::

    progress:  s_{i+1} = s_i + gain(w_i, c_mode * f_i)         (gain, w_i: dblp.sim.convergence.curve.PhaseModel)

``c_mode`` is one number per convergence model and compensation label without its stop rule
(:func:`mode_key`); the paper's is 1 by definition, so the paper's predictions are exactly those of the
base model. The factors (:data:`MODE_FACTORS`) are fitted on real CPU trainings of each mode - the
emulation's runs (:func:`emulation_runs`: Mininet, real digits_mlp workers, measured per-iteration loss)
of the fitted seeds (:data:`MODE_FIT`): per mode, the ``c`` whose model best times the runs' crossings of
the targets (:func:`fit_factor`), divided by the paper runs' own best ``c`` on the same base, so a factor
measures the mode against the paper and not the base curve's bias. Two bases: the default ``phase``
model (fitted on simulated-worker trainings) and ``emulated``
(:data:`dblp.sim.convergence.phase.EMULATED_FITTED`, the emulated paper-mode runs' own curve:
:func:`fit_emulated_curve`). A mode without a fitted factor is charged as the paper (``c`` = 1) and says
so (``fitted`` False in :func:`mode_model`).

``python -m dblp.sim.studies.modes_compare fit RUN`` refits the factors; ``compare RUN...`` puts, per run folder,
condition and configuration, the emulation's measured time to each target beside the model's (driven
by the run's measured loss and clock) and the simulator's (``python -m dblp.sim run`` on a calibration
of the emulation, the run's bursts and compensation), with the errors, and sweeps the burst rate to find
where DBLP's configurations reach the target sooner than the fixed baseline (:mod:`dblp.sim.studies.modes_compare`).
The fitted values, the held-out errors and where the model is wrong: ``docs/convergence.md`` (per
compensation mode).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from dblp.protocol.compensation import Compensation
from dblp.sim.convergence.curve import AccuracyCurve

#: per convergence model (``--convergence``) and compensation label without its stop rule (:func:`mode_key`): the
#: factor on a lost fraction (fitted by MODE_FIT's command; "paper" is 1 by definition)
MODE_FACTORS: dict[str, dict[str, float]] = {
    "phase": {"paper": 1.0, "unbiased+fill-local": 0.78},
    "emulated": {"paper": 1.0, "unbiased+fill-local": 0.83},
}
#: the targets whose crossings the factors are fitted to (the emulation's)
FIT_TARGETS = (0.9, 0.94)
#: where MODE_FACTORS come from: the run folder, its fitted seeds, the command that printed them
MODE_FIT: dict[str, Any] = {"source": "results/tta-digits-paperbursts", "seeds": (0, 1),
                            "command": "python -m dblp.sim.studies.modes_compare fit results/tta-digits-paperbursts --seeds 0,1",
                            # the fitted runs' RMS log-error of time to 90/94% at the fitted factors (paper,
                            # unbiased+fill-local): the single-seed scatter no factor removes
                            "fit_log_err": {"phase": (0.1987, 0.1878), "emulated": (0.0910, 0.0855)}}
C_MAX = 1.5  # factors and the emulated curve's weight are searched in [0, C_MAX]


def mode_key(comp: Compensation) -> str:
    """The label whose factor charges ``comp``: its :meth:`~dblp.protocol.compensation.Compensation.label` without
    the stop rule (the stop rule changes the lost fraction itself, which the records measure)."""
    parts = [p for p in comp.label().split("+") if not p.startswith("stop-")]
    return "+".join(parts) or "paper"


#: what a curve is made of (:class:`dblp.sim.convergence.curve.AccuracyCurve`), which a mode takes from its base
_CURVE_PARAMETERS = ("a", "tau", "k", "m", "a0")


@dataclass(frozen=True)
class ModeModel(AccuracyCurve):
    """A base convergence model with each lost fraction scaled by the mode's factor ``c``."""

    base: AccuracyCurve
    c: float

    def __post_init__(self) -> None:
        """The curve is the base's (its plateau, scale, shape and start): only the loss is scaled."""
        for name in _CURVE_PARAMETERS:
            object.__setattr__(self, name, getattr(self.base, name))

    def step(self, s: float, f: float, critical: float = 0.0) -> float:
        return self.base.step(s, min(1.0, self.c * f), critical)


def mode_model(base: AccuracyCurve, comp: Compensation, convergence: str = "phase",
               factors: dict[str, float] | None = None) -> tuple[AccuracyCurve, float, bool]:
    """``(model, c, fitted)`` for a run with compensation ``comp`` under the ``convergence`` model's factors
    (:data:`MODE_FACTORS`, or ``factors``): ``base`` itself where ``c`` is 1 (the paper, and any mode without a
    fitted factor: ``fitted`` False), else :class:`ModeModel`."""
    table = MODE_FACTORS.get(convergence, {}) if factors is None else factors
    key = mode_key(comp)
    c = table.get(key)
    fitted = c is not None
    c = 1.0 if c is None else float(c)
    return (base if c == 1.0 else ModeModel(base, c)), c, fitted


# -- the simulator's flags ----------------------------------------------------------------------------------


class _SimFlags:
    """An argparse target that adds :func:`dblp.protocol.compensation.add_compensation_args`'s flags to the simulator's
    parser: the alias ``--reduce`` is left out (there it is the server's reduce time), and an absent flag
    leaves it None, so ``--params``' options stand (:func:`dblp.sim.options.config_from_args`
    takes only flags given)."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser

    def add_argument(self, *names: str, **kw: Any) -> Any:
        taken = getattr(self.parser, "_option_string_actions", {})
        names = tuple(n for n in names if n not in taken)
        default = kw.pop("default", None)
        kw["help"] = f"{kw.get('help', '')} (default: {default}, or --params')"
        return self.parser.add_argument(*names, default=None, **kw)


def add_sim_compensation_args(p: Any) -> None:
    """The compensation options and stop rule on ``python -m dblp.sim run`` and ``sweep`` (one definition:
    :func:`dblp.protocol.compensation.add_compensation_args`)."""
    from dblp.protocol.compensation import add_compensation_args

    g = p.add_argument_group("loss compensation and stop rule (dblp.protocol.compensation; the paper's by default)")
    add_compensation_args(_SimFlags(g))


def paper_of(cfg: Any) -> Any:
    """``cfg`` with the paper's compensation and stop rule: the fixed baseline a DBLP mode is compared with."""
    return cfg.with_(**Compensation(feedback_bound=cfg.feedback_bound).to_dict())


# -- the emulation's runs ------------------------------------------------------------------------------------


@dataclass
class EmuRun:
    """One emulated training: its condition, configuration, seed, per-iteration loss and regime, and the
    evaluations ``(iteration, train_s, accuracy)`` (the workers' mean accuracy, the slowest one's clock)."""

    folder: str
    condition: str
    run: str
    seed: int
    comp: Compensation
    lost: list[float]
    labels: list[bool]
    evals: list[tuple[int, float, float]]
    bursts: tuple[int, ...] = ()

    @property
    def policy(self) -> str:
        return self.run.split("-")[0]

    def iterations(self) -> int:
        return len(self.lost)


def run_compensation(name: str) -> Compensation:
    """A microburst run folder's name -> its compensation: ``baseline``, ``dblp``, ``reliable`` are the
    paper's, ``dblp-<label>`` is ``<label>`` (:meth:`dblp.protocol.compensation.Compensation.from_label`)."""
    return Compensation.from_label(name.split("-", 1)[1]) if "-" in name else Compensation()


def emulation_runs(folder: str | Path) -> list[EmuRun]:
    """Every finished run of a microburst results folder (``[seed<s>/]<run>/`` with bursts,
    ``[seed<s>/]calm/<run>/`` without): evaluations from the workers' ``evals.jsonl``, loss
    (``1 - up * down``) from the round records, regimes from DBLP's detector over the server's recorded
    gradient norms. A run still in progress (a worker without its summary) is left out."""
    import json

    from dblp.results.analysis import load
    from dblp.results.trainreport import load_training, run_curve
    from dblp.protocol.records import round_trace
    from dblp.sim.convergence.phase import _server_norms
    from dblp.sim.convergence.runs import clr_labels

    top = Path(folder)
    cfg = json.loads((top / "config.json").read_text(encoding="utf-8"))
    der = cfg.get("derived", {})
    bursts = tuple(int(b) for b in der.get("bursts_list", []))
    workers = int(cfg.get("workers", 3))
    seed_dirs = sorted((d for d in top.glob("seed*") if d.is_dir() and d.name[4:].isdigit()),
                       key=lambda d: int(d.name[4:]))
    places = [(int(d.name[4:]), d) for d in seed_dirs] or [(int(cfg.get("seed", 0)), top)]
    out: list[EmuRun] = []
    for seed, base in places:
        for cond, where, bs in ((f"bursts at {','.join(map(str, bursts))}", base, bursts),
                                ("no bursts", base / "calm", ())):
            if not where.is_dir():
                continue
            for d in sorted(where.iterdir()):
                if d.name == "calm" or not (d / "records" / "server.jsonl").exists():
                    continue
                try:
                    run = load_training(d, workers)
                    comp = run_compensation(d.name)
                except ValueError:
                    continue  # unfinished, or not a run of ours
                _, lost = round_trace(load(d / "records"))
                out.append(EmuRun(str(top), cond, d.name, seed, comp, lost,
                                  clr_labels(_server_norms(d / "records" / "server.jsonl")),
                                  [(int(k), float(t), float(v)) for k, t, v in run_curve(run)], bs))
    return out


# -- fitting and predicting -------------------------------------------------------------------------------------


def predicted_curve(model: AccuracyCurve, r: EmuRun) -> list[float]:
    """The model's accuracy after each iteration of ``r``, driven by its measured loss and regimes."""
    return model.curve(r.lost, r.labels)


def run_rmse(model: AccuracyCurve, runs: Sequence[EmuRun]) -> float:
    """Accuracy RMSE of ``model`` over every evaluation of ``runs``."""
    se, n = 0.0, 0
    for r in runs:
        pred = predicted_curve(model, r)
        for k, _, acc in r.evals:
            if k < len(pred):
                se += (pred[k] - acc) ** 2
                n += 1
    return math.sqrt(se / n) if n else math.nan


def crossing_error(model: AccuracyCurve, runs: Sequence[EmuRun], targets: Sequence[float] = FIT_TARGETS) -> float:
    """Root mean square of ``log(model / measured)`` time to each target over ``runs`` (runs that never reach
    a target left out of it; a model that never does, where the run did, counts as a factor of 10)."""
    se, n = 0.0, 0
    for r in runs:
        for t in targets:
            meas = measured_reach(r, t)[1]
            if not math.isfinite(meas) or meas <= 0:
                continue
            pred = model_reach(model, r, t)[1]
            se += math.log(pred / meas) ** 2 if math.isfinite(pred) and pred > 0 else math.log(10.0) ** 2
            n += 1
    return math.sqrt(se / n) if n else math.nan


def best_on_grid(err: Any, step: float = 0.01) -> float:
    """The ``x`` in [0, :data:`C_MAX`] (a grid of ``step``) with the least ``err(x)``, the middle of the best
    stretch (crossings sit on the runs' evaluation grid, so such an error is a step function)."""
    grid = [i * step for i in range(int(round(C_MAX / step)) + 1)]
    errs = [err(x) for x in grid]
    best = min(errs)
    at = [x for x, e in zip(grid, errs) if e <= best + 1e-12]
    return at[len(at) // 2]


def fit_factor(base: AccuracyCurve, runs: Sequence[EmuRun], targets: Sequence[float] = FIT_TARGETS,
               step: float = 0.01) -> float:
    """The factor ``c`` in [0, :data:`C_MAX`] whose model best times the crossings of ``targets`` in ``runs``
    (:func:`crossing_error`; a grid of ``step``, the middle of the best stretch: the crossings sit on the
    runs' evaluation grid, so the error is a step function of ``c``). Why crossings and not the accuracy
    RMSE: time to a target is what the factor is for, and the RMSE hardly moves with it (the runs' early rise,
    where most evaluations lie, loses little)."""
    return best_on_grid(lambda c: crossing_error(ModeModel(base, c), runs, targets), step)


def fit_factors(base: AccuracyCurve, runs: Sequence[EmuRun],
                targets: Sequence[float] = FIT_TARGETS) -> dict[str, dict[str, float]]:
    """Per mode key: the fitted ``c``, the runs it came from, and the crossing error (:func:`crossing_error`)
    at it and at ``c`` = 1. The paper's is fitted too, as a check of the base curve (its factor stays 1)."""
    by: dict[str, list[EmuRun]] = {}
    for r in runs:
        by.setdefault(mode_key(r.comp), []).append(r)
    out = {}
    for key, rs in sorted(by.items()):
        c = fit_factor(base, rs, targets)
        out[key] = {"c": c, "runs": len(rs), "err": crossing_error(ModeModel(base, c), rs, targets),
                    "err_c1": crossing_error(base, rs, targets)}
    return out


def as_curves(runs: Sequence[EmuRun]) -> list:
    """The runs as :class:`dblp.sim.convergence.runs.Curve` (each its own schedule), for the curve fit."""
    from dblp.sim.convergence.runs import Curve, Schedule

    out = []
    for r in runs:
        name = f"{r.condition} {r.run} {r.seed}"
        out.append(Curve(name, r.seed, Schedule(name, 0.0), [k for k, _, _ in r.evals], [a for _, _, a in r.evals],
                         lost=list(r.lost), labels=list(r.labels)))
    return out


LOW_LOSS = 0.05  # a run losing less than this mean fraction shows the curve's shape, not the charge


def fit_emulated_curve(runs: Sequence[EmuRun], targets: Sequence[float] = FIT_TARGETS) -> Any:
    """The emulated trainings' own curve (:data:`dblp.sim.convergence.phase.EMULATED_FITTED`) from the
    paper-mode runs among ``runs``, in three steps: the phase model's shape (one weight) fitted to the
    accuracy RMSE of the runs that lost little (:data:`LOW_LOSS`: the baseline and stop-once runs); its
    plateau ``a`` and scale ``tau`` refitted on a grid to those runs' crossings of ``targets``
    (:func:`crossing_error`); then the weight fitted to the crossings of every paper run (DBLP's early stop
    loses ~40%) - the paper's own charge of a lost fraction, against which every other mode's factor is
    measured. Why crossings and not only the RMSE: a run's first evaluation at or above a target comes
    earlier than the smooth mean curve's crossing (the accuracy jitters +-2 points on 360 test images), and
    the first evaluation is what time to accuracy measures."""
    import dataclasses

    from dblp.sim.convergence.phase import fit

    paper = [r for r in runs if mode_key(r.comp) == "paper"]
    low = [r for r in paper if r.lost and sum(r.lost) / len(r.lost) < LOW_LOSS] or paper
    shape = fit(as_curves(low), tie=True, iterations=600, restarts=1)
    grid = [(shape.a + da, shape.tau * ft) for da in (-0.01 + 0.002 * i for i in range(11))
            for ft in (0.6 + 0.02 * j for j in range(31)) if shape.a + da < 1.0]
    errs = [crossing_error(dataclasses.replace(shape, a=a, tau=tau), low, targets) for a, tau in grid]
    a, tau = grid[min(range(len(grid)), key=errs.__getitem__)]
    shape = dataclasses.replace(shape, a=a, tau=tau)
    w = best_on_grid(lambda x: crossing_error(dataclasses.replace(shape, w_crit=x, w_calm=x), paper, targets))
    return dataclasses.replace(shape, w_crit=w, w_calm=w)


def first_eval_at_or_after(r: EmuRun, iteration: float) -> tuple[float, float]:
    """``(iteration, train_s)`` of the first evaluation of ``r`` at or after ``iteration`` - where the
    emulation would have seen a crossing the model puts at ``iteration``; beyond the last evaluation the
    run's mean seconds per iteration carry the clock on; ``(inf, inf)`` for an infinite iteration."""
    if math.isinf(iteration):
        return math.inf, math.inf
    for k, t, _ in r.evals:
        if k >= iteration:
            return float(k), t
    k, t, _ = r.evals[-1]
    return float(iteration), t + (iteration - k) * t / k


def measured_reach(r: EmuRun, target: float) -> tuple[float, float]:
    """``(iteration, train_s)`` of the first evaluation at or above ``target`` (``(inf, inf)``: never)."""
    return next(((float(k), t) for k, t, a in r.evals if a >= target), (math.inf, math.inf))


def model_reach(model: AccuracyCurve, r: EmuRun, target: float) -> tuple[float, float]:
    """The model's crossing of ``target`` on ``r``'s measured loss, placed on ``r``'s evaluation grid and
    clock; past the run, extrapolated at its mean loss and critical share (as a simulated run is)."""
    n = r.iterations()
    it = model.iterations_to(target, r.lost, critical=r.labels, then=sum(r.lost) / n if n else 0.0,
                             then_critical=sum(r.labels[:n]) / n if n else 0.0, limit=1000)
    return first_eval_at_or_after(r, it)
