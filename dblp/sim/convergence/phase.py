"""A phase-aware convergence model: a lost gradient charged by the training's gradient-norm regime.

Why: DBLP's design rests on one claim - a gradient lost in the critical
learning regime (CLR) costs more than one lost outside it - and loosens its
tolerance only outside. A model that charges a lost fraction the same in
every iteration can never show DBLP reaching a target accuracy sooner unless
its rounds are faster by more than its extra loss costs. This model charges
the loss by regime and lets real trainings decide how much each costs.

The model (:class:`dblp.sim.convergence.curve.PhaseModel`, per workload)::

    progress:  s_0 = 0,  s_{i+1} = s_i + max(0, 1 - w_i * f_i)
    weight:    w_i = w_crit if iteration i is in the CLR, else w_calm
    accuracy:  acc(s) = a - (a - a0) * (1 + (s / tau) ** k) ** -m

``f_i`` is the fraction of iteration i's averaged gradient that was lost
(``1 - up * down`` in a simulated or emulated run), the regime of iteration
i is what DBLP's own detector (:func:`dblp.sim.convergence.runs.clr_labels`:
:class:`dblp.protocol.policy.DblpPolicy` at eta 0.5, freq 10) decides from the
gradient norms of the iterations before it. ``w_crit`` > ``w_calm`` is the
design's claim; the fit measures both.

Fitted to (:data:`dblp.sim.convergence.runs.PHASE_DATA`, made by ``python -m
dblp.sim.convergence.phase measure``): ``digits_mlp`` and ``small_cnn`` on
the bundled digits, each with its defaults (SGD lr 0.05, momentum 0.9, batch
32 per worker), 3 simulated workers, 300 iterations, test accuracy every 5
iterations, three seeds; each seed's clean run labels its iterations, then
:class:`dblp.train.exchange.DropExchange` zeroes ``round(f * chunks)``
random chunks in the iterations of each schedule
(:data:`dblp.sim.convergence.runs.PHASE_SETTINGS`: uniform, critical-only,
calm-only, early, late, bursts). The parameters (:data:`PHASE_FITTED`) and
the held-out errors (:data:`HELDOUT`) are ``fit``'s and ``report``'s
output; the ``uniform`` control (:data:`UNIFORM_FITTED`, the same model with
``w_crit`` = ``w_calm``, fitted to the same runs) says what charging by
regime buys. ``docs/convergence.md`` has the tables and what they mean.

Also here: the check against the emulation's measured time to accuracy
(:func:`emulation_curves`: a training scenario's ``curves.csv`` with each
run's regime labels from its server records' gradient norms).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

from dblp.results.stats import median
from dblp.sim.convergence.curve import F_MEASURED, PhaseModel, crossings, nelder_mead, noise_rmse, rmse
from dblp.sim.convergence.runs import (PHASE_DATA, PHASE_FIT_SETTINGS, PHASE_SETTINGS, PHASE_WORKLOADS, Curve,
                               clr_labels, load_curves, measure_phases, split)

#: the targets whose held-out error is reported (time to 80% and 90%)
TARGETS = (0.8, 0.9)

#: fitted by ``python -m dblp.sim.convergence.phase fit`` to the PHASE_FIT_SETTINGS runs of PHASE_DATA
PHASE_FITTED: dict[str, PhaseModel] = {
    "digits_mlp": PhaseModel(a=0.9854, tau=4.085, k=3.096, m=0.3311, w_crit=0.5684, w_calm=0.7369),
    "small_cnn": PhaseModel(a=0.9820, tau=77.39, k=1.487, m=3.468, w_crit=1.241, w_calm=0.8468),
}
#: ... and the uniform control: one weight for both regimes, fitted to the same runs
UNIFORM_FITTED: dict[str, PhaseModel] = {
    "digits_mlp": PhaseModel(a=0.9874, tau=4.110, k=2.540, m=0.3927, w_crit=0.6349, w_calm=0.6349),
    "small_cnn": PhaseModel(a=0.9852, tau=67.27, k=1.472, m=2.896, w_crit=0.9964, w_calm=0.9964),
}
#: ... and the emulated trainings' own curve: one weight, fitted to the paper-mode runs of the emulation's fitted
#: seeds (Mininet, real digits_mlp workers; ``python -m dblp.sim.studies.modes_compare fit``, dblp.sim.convergence.modes.MODE_FIT and
#: fit_emulated_curve: shape by RMSE, plateau/scale and weight by the crossings of 90/94%)
EMULATED_FITTED: dict[str, PhaseModel] = {
    "digits_mlp": PhaseModel(a=0.9939, tau=3.233, k=5.359, m=0.1802, w_crit=0.83, w_calm=0.83),
}
#: ``report``'s errors (``--json``): per workload and model, the held-out runs' accuracy RMSE and the median and
#: worst absolute relative error of the iterations to 80% and 90% (:func:`summarize_errors`); ``emulation``: the
#: digits_mlp phase model against the 15 emulated microburst runs (data/convergence_emulated_microburst.csv)
HELDOUT: dict[str, dict] = {
    "digits_mlp": {
        "phase": {"heldout_rmse": 0.0217, "median_0.8": 0.1350, "worst_0.8": 0.2000,
                  "median_0.9": 0.0424, "worst_0.9": 0.2222},
        "uniform": {"heldout_rmse": 0.0227, "median_0.8": 0.1150, "worst_0.8": 0.2000,
                    "median_0.9": 0.0778, "worst_0.9": 0.2222},
    },
    "small_cnn": {
        "phase": {"heldout_rmse": 0.0696, "median_0.8": 0.0330, "worst_0.8": 0.1895,
                  "median_0.9": 0.1720, "worst_0.9": 0.2250},
        "uniform": {"heldout_rmse": 0.0666, "median_0.8": 0.0294, "worst_0.8": 0.1263,
                    "median_0.9": 0.1465, "worst_0.9": 0.2750},
    },
    "emulation": {"median_0.8": 0.1250, "worst_0.8": 0.3571, "median_0.9": 0.1389, "worst_0.9": 0.1404,
                  "median": 0.1319, "rmse": 0.0330},
}

W_MAX = 3.0  # weights are fitted in (0, W_MAX)


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-700.0, min(700.0, x))))


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1.0 - 1e-9)
    return math.log(p / (1.0 - p))


def unpack(x: Sequence[float], *, tie: bool = False) -> PhaseModel:
    """Parameters from the simplex's unbounded coordinates (``tie``: one weight for both regimes)."""
    w_crit = W_MAX * _sig(x[4])
    return PhaseModel(a=_sig(x[0]), tau=math.exp(x[1]), k=math.exp(x[2]), m=math.exp(x[3]), w_crit=w_crit,
                      w_calm=w_crit if tie else W_MAX * _sig(x[5]))


def pack(m: PhaseModel, *, tie: bool = False) -> list[float]:
    x = [_logit(m.a), math.log(m.tau), math.log(m.k), math.log(m.m), _logit(m.w_crit / W_MAX)]
    return x if tie else x + [_logit(m.w_calm / W_MAX)]


#: where :func:`fit` starts (w_crit, w_calm): the same, critical loss costing more, and less than calm loss
STARTS = ((0.8, 0.8), (1.5, 0.5), (0.5, 1.5))


def fit(curves: Sequence[Curve], *, tie: bool = False, restarts: int = 2, iterations: int = 1500,
        starts: Sequence[tuple[float, float]] = STARTS) -> PhaseModel:
    """The parameters minimising the accuracy RMSE (:func:`dblp.sim.convergence.curve.rmse`) on ``curves`` (one
    workload's), the best of a simplex search from each of :data:`STARTS`. The curve's start comes from the
    clean runs: the first evaluation at or above half-way from chance to the last clean accuracy."""
    clean = [c for c in curves if c.setting == "clean"] or list(curves)
    last = sum(c.accuracy[-1] for c in clean) / len(clean)
    half = next((i for i, a in zip(clean[0].iterations, clean[0].accuracy) if a >= (0.1 + last) / 2), 20)
    best, best_err = None, math.inf
    for wc, wl in (starts[:1] if tie else starts):
        x = pack(PhaseModel(a=min(0.995, last + 0.01), tau=max(float(half), 2.0), k=3.0, m=0.3, w_crit=wc,
                            w_calm=wl), tie=tie)
        for _ in range(restarts):  # restarting from the best point escapes a collapsed simplex
            x = nelder_mead(lambda p: rmse(unpack(p, tie=tie), curves), x, iterations=iterations)
        err = rmse(unpack(x, tie=tie), curves)
        if err < best_err:
            best, best_err = unpack(x, tie=tie), err
    assert best is not None
    return best


def heldout_errors(model: PhaseModel, curves: Sequence[Curve], targets: Sequence[float] = TARGETS) -> list[dict]:
    """Per schedule and target: iterations to the target measured (seed-mean curve, first evaluation at or
    above it) and predicted (:func:`dblp.sim.convergence.curve.crossings`), and the relative error
    ``model / measured - 1`` (NaN where the measured curve never reaches the target)."""
    rows = crossings(model, curves, targets)
    for r in rows:
        r["rel_err"] = r["model"] / r["measured"] - 1 if math.isfinite(r["measured"]) and r["measured"] else math.nan
    return rows


def summarize_errors(rows: Sequence[dict]) -> dict[str, float]:
    """``median_<t>`` and ``worst_<t>`` of the absolute relative errors per target (NaN rows left out), and
    ``median``/``worst`` over all targets."""
    out: dict[str, float] = {}
    every: list[float] = []
    for t in sorted({r["target"] for r in rows}):
        e = sorted(abs(r["rel_err"]) for r in rows if r["target"] == t and math.isfinite(r["rel_err"]))
        every += e
        out[f"median_{t:g}"] = median(e)
        out[f"worst_{t:g}"] = e[-1] if e else math.nan
    every.sort()
    out["median"] = median(every)
    out["worst"] = every[-1] if every else math.nan
    return out


def regime_costs(curves: Sequence[Curve], target: float) -> list[dict]:
    """The model-free measure of what a lost fraction costs in each regime: per ``crit``/``calm`` schedule,
    the delay to ``target`` against the clean runs (seed-mean curves, iterations) divided by the lost
    iteration-fractions it took before its crossing (``sum f_i`` over iterations < the crossing, mean over
    seeds). 1.0 means each lost fraction costs its own share of an iteration of progress; the design's
    claim is that ``crit`` costs clearly more than ``calm``."""
    out = []
    for wl, cs in by_workload(curves).items():
        rows = {(r["setting"]): r["measured"] for r in crossings(_Noop(), cs, (target,))}
        clean = rows.get("clean", math.inf)
        for name in sorted(n for n in rows if n.split()[0] in ("crit", "calm")):
            hit = rows[name]
            runs = [c for c in cs if c.setting == name]
            lost = (sum(sum(c.fractions()[:int(hit)]) for c in runs) / len(runs)) if math.isfinite(hit) else math.nan
            delay = hit - clean
            out.append({"workload": wl, "setting": name, "target": target, "clean": clean, "measured": hit,
                        "delay": delay, "lost_iterations": lost,
                        "cost": delay / lost if lost and math.isfinite(delay) else math.nan})
    return out


class _Noop(PhaseModel):
    """A stand-in model for :func:`crossings` when only the measured side is wanted."""

    def __init__(self) -> None:
        super().__init__(a=0.5, tau=1.0, k=1.0, m=1.0, w_crit=0.0, w_calm=0.0)


def by_workload(curves: Sequence[Curve]) -> dict[str, list[Curve]]:
    out: dict[str, list[Curve]] = {}
    for c in curves:
        out.setdefault(c.workload, []).append(c)
    return out


# -- in a simulated run ------------------------------------------------------------------------------------

#: ``--convergence``: which model turns a simulated run's losses into time to accuracy
CONVERGENCE_MODELS = {
    "phase": "loss charged by the training's CLR regime (PHASE_FITTED, dblp.sim.convergence.phase)",
    "uniform": "the same runs fitted with one charge in every regime (UNIFORM_FITTED)",
    "emulated": "digits_mlp only: the curve of the emulation's own trainings, one charge in every regime "
                "(EMULATED_FITTED)",
}
DEFAULT_CONVERGENCE = "phase"
DEFAULT_CONVERGENCE_WORKLOAD = "digits_mlp"


def model_for(name: str = DEFAULT_CONVERGENCE, workload: str = DEFAULT_CONVERGENCE_WORKLOAD,
              weights: tuple[float, float] | None = None):
    """The convergence model ``name`` (:data:`CONVERGENCE_MODELS`) of ``workload``; refuses unknown names.

    ``weights`` (``--convergence-weights``, phase model only): a what-if - the fitted curve with a lost fraction
    costing ``w_crit`` in the CLR and ``w_calm`` outside instead of the fitted weights, to ask how much cheaper
    calm loss would have to be for DBLP to reach a target sooner."""
    import dataclasses

    from dblp.protocol.wire import ParameterError

    if weights is not None:
        if name != "phase":
            raise ParameterError(f"--convergence-weights needs --convergence phase, not {name!r}")
        if len(weights) != 2 or not all(isinstance(w, (int, float)) and 0 <= w <= W_MAX for w in weights):
            raise ParameterError(f"--convergence-weights must be two numbers W_CRIT,W_CALM in [0, {W_MAX:g}], "
                                 f"got {weights!r}")
        return dataclasses.replace(model_for(name, workload), w_crit=float(weights[0]), w_calm=float(weights[1]))
    if name not in CONVERGENCE_MODELS:
        raise ParameterError(f"--convergence must be one of {', '.join(CONVERGENCE_MODELS)}, got {name!r}")
    table = {"phase": PHASE_FITTED, "uniform": UNIFORM_FITTED, "emulated": EMULATED_FITTED}[name]
    if workload not in table:
        raise ParameterError(f"--convergence-workload must be one of {', '.join(table)}, got {workload!r}")
    return table[workload]


def sim_regimes(cfg, rounds: int) -> list[bool]:
    """Each simulated round's training regime: DBLP's detector at the reference eta/freq
    (:func:`dblp.sim.convergence.runs.clr_labels`) over the run's gradient-norm sequence (``--norms``).

    Why the reference detector and not the run's own: the regime is the training's, the same for DBLP
    and its baseline (same seed, same norms); a DBLP with another eta or freq acts on other rounds, and
    the model charges its loss by the training's regime, not by what it detected."""
    from dblp.sim.model import load_norms

    norms = load_norms(cfg)
    return clr_labels([float(norms[i % norms.size]) for i in range(rounds)])


def add_convergence_args(p) -> None:
    """``--convergence`` and ``--convergence-workload`` (the sweep's and ``python -m dblp.sim run``'s)."""
    p.add_argument("--convergence", choices=list(CONVERGENCE_MODELS), default=DEFAULT_CONVERGENCE,
                   help="the model behind time_to_accuracy_s: " + "; ".join(f"{k}: {v}" for k, v in
                                                                        CONVERGENCE_MODELS.items())
                   + f" (default {DEFAULT_CONVERGENCE})")
    p.add_argument("--convergence-workload", choices=list(PHASE_FITTED), default=DEFAULT_CONVERGENCE_WORKLOAD,
                   help="whose measured accuracy curve time_to_accuracy_s follows (a CPU-trained workload; "
                        f"default {DEFAULT_CONVERGENCE_WORKLOAD})")
    p.add_argument("--convergence-weights", type=_weights_arg, default=None, metavar="W_CRIT,W_CALM",
                   help="what-if for --convergence phase: iterations of progress a lost fraction costs in the CLR "
                        "and outside it (unitless, 0-3; default: the fitted weights)")


def _weights_arg(text: str) -> tuple[float, float]:
    try:
        w = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not two numbers W_CRIT,W_CALM: {text!r}") from None
    if len(w) != 2 or not all(0 <= x <= W_MAX for x in w):
        raise argparse.ArgumentTypeError(f"need two numbers W_CRIT,W_CALM in [0, {W_MAX:g}], got {text!r}")
    return (w[0], w[1])


# -- the emulation's runs ----------------------------------------------------------------------------------


def emulation_curves(run: Path) -> list[Curve]:
    """A curve file with regime labels (:func:`dblp.sim.convergence.runs.write_measured`), or a training
    scenario's runs (``RUN/curves.csv``, :func:`dblp.results.trainreport.write_curves`) with each run's
    regime labels: DBLP's detector over the gradient norms its server recorded per round (``RUN[/seed<s>]/
    <policy>/records/server.jsonl``, ``calm/<policy>`` for microburst's runs without bursts; the norm of the
    averaged gradient, as a DBLP server sees it). A run without records keeps no labels (all calm)."""
    if run.is_file():
        return load_curves(run)
    curves = load_curves(run / "curves.csv")
    for c in curves:
        policy = c.setting.split()[-1]
        sub = Path("calm", policy) if c.setting.startswith("no bursts") else Path(policy)  # microburst's layout
        for folder in (run / f"seed{c.seed}" / sub, run / sub):
            rec = folder / "records" / "server.jsonl"
            if rec.exists():
                c.labels = clr_labels(_server_norms(rec))
                break
    return curves


def _server_norms(path: Path) -> list[float]:
    """Round -> the gradient norm of the server's record (the first worker's row of each round)."""
    by: dict[int, float] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r.get("role") == "server" and r.get("grad_norm") is not None:
                by.setdefault(int(r["round"]), float(r["grad_norm"]))
    return [by[k] for k in sorted(by)]


# -- python -m dblp.sim.convergence.phase measure | fit | report ------------------------------------------


def _print_rows(rows: Sequence[dict], fitted: Sequence[str]) -> None:
    print(f"{'workload':<11} {'schedule':<32} {'target':>6} {'measured':>8} {'model':>6} {'error':>7}")
    for r in rows:
        mark = "" if r["setting"] in fitted else " *"
        err = f"{r['rel_err']:+.0%}" if math.isfinite(r["rel_err"]) else "-"
        print(f"{r['workload']:<11} {r['setting'] + mark:<32} {r['target']:>6.2f} {r['measured']:>8} "
              f"{r['model']:>6.0f} {err:>7}")


def main(argv: list[str] | None = None) -> int:
    from traces.argtypes import count_arg

    from dblp.cli.args import parser

    p = parser(prog="python -m dblp.sim.convergence.phase", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="train every workload under every phase schedule (needs torch; ~15 min)")
    m.add_argument("--out", default=str(PHASE_DATA), help="CSV of the accuracy curves (default: the shipped data "
                                                          "file; the norms go beside it, <name>_norms.csv)")
    m.add_argument("--workloads", default=",".join(PHASE_WORKLOADS), help="comma-separated workloads "
                   f"(default {','.join(PHASE_WORKLOADS)})")
    m.add_argument("--iterations", type=count_arg(1), default=300, help="training iterations of each run")
    m.add_argument("--seeds", type=count_arg(1), default=3, help="runs per schedule (seeds 0..N-1)")
    f = sub.add_parser("fit", help="fit both models (phase-aware and uniform) per workload and print them (~2 min)")
    r = sub.add_parser("report", help="the shipped models against the runs: held-out iterations to 80/90%% per "
                                      "workload, the emulation check, a plot")
    for q in (f, r):
        q.add_argument("--data", default=str(PHASE_DATA), help="CSV written by 'measure' (default: the shipped "
                                                               "data file)")
    r.add_argument("--emulation", action="append", default=[], metavar="RUN",
                   help="a training scenario's run folder (curves.csv, records): its runs against the digits_mlp "
                        "models (repeatable; default: none)")
    r.add_argument("--plot", default=None, metavar="PNG", help="draw the held-out runs against both models")
    r.add_argument("--json", default=None, metavar="FILE", help="write the error tables as JSON")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        measure_phases(Path(args.out), workloads=[w.strip() for w in args.workloads.split(",") if w.strip()],
                       iterations=args.iterations, seeds=range(args.seeds))
        return 0
    try:
        curves = load_curves(Path(args.data))
    except (OSError, KeyError, ValueError) as exc:
        print(f"python -m dblp.sim.convergence.phase {args.cmd}: error: --data {args.data}: {exc}", file=sys.stderr)
        return 2
    groups = by_workload(curves)
    if args.cmd == "fit":
        for wl, cs in groups.items():
            fit_set, _ = split(cs, PHASE_FIT_SETTINGS)
            ph, un = fit(fit_set), fit(fit_set, tie=True)
            print(f'    "{wl}": {ph!r},  # fit RMSE {rmse(ph, fit_set):.4f}')
            print(f'    "{wl}": {un!r},  # uniform, fit RMSE {rmse(un, fit_set):.4f}')
        return 0
    out: dict = {}
    fitted_names = PHASE_FIT_SETTINGS
    for wl, cs in groups.items():
        if wl not in PHASE_FITTED:
            print(f"{wl}: no fitted model (fitted: {', '.join(PHASE_FITTED)})", file=sys.stderr)
            continue
        fit_set, held = split(cs, fitted_names)
        out[wl] = {}
        for name, model in (("phase", PHASE_FITTED[wl]), ("uniform", UNIFORM_FITTED[wl])):
            rows = heldout_errors(model, held)
            summ = summarize_errors(rows)
            out[wl][name] = {"model": model.__dict__, "fit_rmse": rmse(model, fit_set),
                             "heldout_rmse": rmse(model, held), "noise_rmse": noise_rmse(cs), **summ, "rows": rows}
            print(f"\n{wl}, {name} model {model!r}")
            _print_rows(heldout_errors(model, cs), fitted_names)
            res = out[wl][name]
            print(f"fit RMSE {res['fit_rmse']:.4f}, held-out RMSE {res['heldout_rmse']:.4f}, "
                  f"seed noise {res['noise_rmse']:.4f}; held-out iterations-to-target error: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in summ.items()))
    print("\nwhat a lost fraction cost per regime, model-free (regime_costs: delay to the target against the clean "
          "runs / lost iteration-fractions before it)")
    print(f"{'workload':<11} {'schedule':<9} {'target':>6} {'clean':>5} {'runs':>5} {'delay':>5} {'lost':>6} "
          f"{'cost':>5}")
    for t in TARGETS:
        for c in regime_costs(curves, t):
            out.setdefault("regime_costs", []).append(c)
            print(f"{c['workload']:<11} {c['setting']:<9} {t:>6.2f} {c['clean']:>5} {c['measured']:>5} "
                  f"{c['delay']:>5} {c['lost_iterations']:>6.1f} {c['cost']:>5.2f}")
    emulated: list[Curve] = []
    for run in args.emulation:
        try:
            emu = emulation_curves(Path(run))
            emulated += emu
        except (OSError, KeyError, ValueError) as exc:
            print(f"python -m dblp.sim.convergence.phase report: error: --emulation {run}: {exc}", file=sys.stderr)
            return 2
        out.setdefault("emulation", {})[run] = {}
        for name, model in (("phase", PHASE_FITTED["digits_mlp"]), ("uniform", UNIFORM_FITTED["digits_mlp"])):
            rows = heldout_errors(model, emu)
            summ = summarize_errors(rows)
            out["emulation"][run][name] = {"rmse": rmse(model, emu), "noise_rmse": noise_rmse(emu), **summ,
                                           "rows": rows}
            print(f"\nemulation {run}, digits_mlp {name} model")
            _print_rows(rows, ())
            print(f"RMSE {rmse(model, emu):.4f} (seed noise {noise_rmse(emu):.4f}); iterations-to-target error: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in summ.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot:
        from dblp.sim.plots import plot_phase_convergence

        scatter: dict[str, list[dict]] = {}
        for wl, cs in groups.items():
            sets = [("held-out", split(cs, fitted_names)[1])] + ([("emulated", emulated)] if wl == "digits_mlp"
                                                                  else [])
            for label, runs in sets:
                for kind, table in (("phase-aware", PHASE_FITTED), ("uniform", UNIFORM_FITTED)):
                    if wl in table and runs:
                        scatter.setdefault(wl, []).extend({**r, "set": label, "kind": kind}
                                                          for r in crossings(table[wl], runs, TARGETS))
        png = plot_phase_convergence(groups, PHASE_FITTED, UNIFORM_FITTED, Path(args.plot), scatter)
        print(f"wrote {png}")
    return 0


__all__ = ["F_MEASURED", "HELDOUT", "PHASE_FITTED", "PHASE_SETTINGS", "TARGETS", "UNIFORM_FITTED", "emulation_curves",
           "fit", "heldout_errors", "main", "summarize_errors"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
