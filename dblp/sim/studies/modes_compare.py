"""The emulation's measured time to accuracy beside the model's and the simulator's, per mode and condition.

Why a command of its own: the per-mode convergence model (:mod:`dblp.sim.convergence.modes`) is only worth what it
predicts on runs it was not fitted on, and the question it serves - from which burst rate does a DBLP
configuration reach the target sooner than the fixed baseline - needs the emulation's points and the
simulator's sweep in one table. Three columns per (run folder, condition, configuration, target):

* **measured**: the first evaluation at or above the target (median and range over the seeds not fitted
  on; the emulation evaluates every few iterations);
* **model**: the mode's convergence model driven by each run's own measured per-iteration loss and
  regimes, its crossing placed on the run's evaluation grid and training clock - the convergence model's
  error alone;
* **sim**: ``python -m dblp.sim run``'s prediction - a simulation of the same configuration (a calibration
  of one fitted emulation run: :func:`dblp.sim.studies.calibrate.calibrate`; the run's policy, bursts, seed and
  compensation), its time to the target by the same mode model, on the same evaluation grid - the
  simulator's error, timing included.

Then the burst-rate sweep: bursts every N iterations (the emulation's loss, one iteration each), the
baseline and each DBLP configuration simulated over the seeds, and the lowest rate (bursts per 100
iterations) from which a DBLP configuration's median time to the target is below the baseline's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from dblp.results.stats import median, median_range
from dblp.sim.convergence.modes import (MODE_FACTORS, MODE_FIT, EmuRun, emulation_runs, fit_emulated_curve, fit_factors, measured_reach, mode_model,
                    model_reach, run_rmse)

#: how much sooner than the baseline counts: strictly, and by more than the emulation's typical seed spread
MARGINS = (0.0, 0.1)
#: the sweep's burst periods (iterations between bursts; 0: no bursts)
PERIODS = (0, 100, 60, 40, 30, 20, 15, 10, 7, 5, 4, 3, 2)


def _policy_fields(conf: dict, policy: str) -> dict[str, Any]:
    """The SimConfig policy fields of a microburst run of ``policy`` (its config.json's tolerances)."""
    from dblp.protocol.policy import run_policy

    der = conf.get("derived", {})
    p_low = float(conf.get("p-low") or 0.008)
    if policy == "dblp":
        return run_policy("dblp", p_low, der.get("p_high"), float(conf.get("eta", 0.5)),
                          int(conf.get("freq", 10))).config()
    return run_policy(policy, p_low).config()


def sim_config(params: Any, conf: dict, policy: str, comp: Any, bursts: Sequence[int], rounds: int, seed: int,
               loss: float) -> Any:
    """The calibrated configuration with one run's policy, compensation, bursts, length and seed."""
    spec = [{"kind": "iteration_bursts", "at": list(bursts), "loss": loss}] if bursts else []
    return params.with_(**_policy_fields(conf, policy), **comp.to_dict(), loss=spec, rounds=rounds, seed=seed)


def sim_reach(cfg: Any, model: Any, targets: Sequence[float], every: int) -> dict[float, tuple[float, float]]:
    """Simulate ``cfg``; per target, ``(iteration, simulated s)`` of the model's crossing placed on an
    evaluation grid of ``every`` iterations (as the emulation would have seen it)."""
    from dblp.protocol.records import round_trace
    from dblp.sim.convergence.phase import sim_regimes
    from dblp.sim.model import simulate

    res = simulate(cfg)
    ends, lost = round_trace(res.records)
    n = len(ends)
    crit = sim_regimes(cfg, n)
    out = {}
    for t in targets:
        it = model.iterations_to(t, lost, critical=crit, then=sum(lost) / n, then_critical=sum(crit) / n)
        if math.isinf(it):
            out[t] = (math.inf, math.inf)
            continue
        q = max(every, math.ceil(it / every) * every)
        h = n // 2
        period = (ends[-1] - ends[h - 1]) / (n - h)
        out[t] = (float(q), ends[q - 1] if q <= n else ends[-1] + (q - n) * period)
    return out


def _every(runs: Sequence[EmuRun]) -> int:
    """The runs' evaluation period: the most common gap between evaluations (the last may be shorter)."""
    from collections import Counter

    gaps = Counter(b[0] - a[0] for r in runs for a, b in zip(r.evals, r.evals[1:]))
    return max(1, gaps.most_common(1)[0][0]) if gaps else 1


def _fmt(vals: Sequence[float]) -> str:
    """A table cell of seconds or iterations over the seeds: ``median [min-max]`` to one decimal."""
    return median_range(vals, ".1f")


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1.0 if math.isfinite(pred) and math.isfinite(meas) and meas > 0 else math.nan


def compare(folders: Sequence[str], targets: Sequence[float], *, calibrate_from: str | None = None,
            fit_seeds: dict[str, set[int]] | None = None, sim: bool = True,
            periods: Sequence[int] = PERIODS, sweep_seeds: int = 2, convergence: str = "emulated") -> dict[str, Any]:
    """The rows of the comparison and the burst-rate sweep (see the module docstring); JSON-safe but for
    infinities. ``fit_seeds``: per folder, the seeds the factors were fitted on (left out of the rows)."""
    from dblp.sim.studies.calibrate import calibrate
    from dblp.sim.convergence.phase import model_for

    base = model_for(convergence)
    fit_seeds = fit_seeds or {}
    rows: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    params = None
    first_conf: dict | None = None
    grid = 1
    for folder in folders:
        runs = emulation_runs(folder)
        conf = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        first_conf = first_conf or conf
        skip = fit_seeds.get(str(Path(folder)), set())
        held = [r for r in runs if r.seed not in skip]
        grid = _every(runs)
        if sim and params is None:
            src = calibrate_from or next((str(Path(r.folder) / f"seed{r.seed}" / r.run) for r in runs
                                          if r.run == "baseline" and r.bursts), None)
            if src is None:
                raise ValueError(f"{folder}: no baseline run with bursts to calibrate the simulator from")
            if not Path(src).exists():
                src = str(Path(folder) / "baseline")  # a one-seed folder
            params, _ = calibrate(src)
            calibrated = src
        every: dict[tuple[str, str], list[EmuRun]] = {}
        for r in runs:  # the measured side of the burst-rate answer: every seed
            every.setdefault((r.condition, r.run), []).append(r)
        for (cond, name), rs in sorted(every.items()):
            points.append({"folder": folder, "condition": cond, "run": name, "seeds": [r.seed for r in rs],
                           "bursts_per_100": 100.0 * len(rs[0].bursts) / max(1, rs[0].iterations()),
                           **{f"{t:g}": [measured_reach(r, t)[1] for r in rs] for t in targets}})
        by: dict[tuple[str, str], list[EmuRun]] = {}
        for r in held:
            by.setdefault((r.condition, r.run), []).append(r)
        for (cond, name), rs in sorted(by.items()):
            model, c, fitted = mode_model(base, rs[0].comp, convergence)
            sims = [sim_reach(sim_config(params, conf, r.policy, r.comp, r.bursts, r.iterations(), r.seed,
                                         float(conf.get("burst-loss", 0.7))), model, targets, grid)
                    for r in rs] if sim else []
            for t in targets:
                meas = [measured_reach(r, t)[1] for r in rs]
                mod = [model_reach(model, r, t)[1] for r in rs]
                simt = [g[t][1] for g in sims]
                its = {"measured_it": [measured_reach(r, t)[0] for r in rs],
                       "model_it": [model_reach(model, r, t)[0] for r in rs], "sim_it": [g[t][0] for g in sims]}
                rows.append({"folder": folder, "condition": cond, "run": name, "mode_c": c, "fitted": fitted,
                             "seeds": [r.seed for r in rs], "target": t, "measured_s": meas, "model_s": mod,
                             "sim_s": simt, **its, "model_err": _err(median(mod), median(meas)),
                             "model_it_err": _err(median(its["model_it"]), median(its["measured_it"])),
                             "sim_it_err": _err(median(its["sim_it"]), median(its["measured_it"])) if sims
                             else math.nan,
                             "sim_err": _err(median(simt), median(meas)) if simt else math.nan,
                             "bursts_per_100": 100.0 * len(rs[0].bursts) / max(1, rs[0].iterations())})
    out: dict[str, Any] = {"rows": rows, "targets": list(targets), "grid": grid, "convergence": convergence,
                           "emulation_points": points}
    if sim and params is not None and first_conf is not None:
        out["calibrated_from"] = calibrated
        out["sweep"] = burst_sweep(params, first_conf, rows, targets, periods, sweep_seeds, grid, convergence)
    return out


def burst_sweep(params: Any, conf: dict, rows: Sequence[dict], targets: Sequence[float], periods: Sequence[int],
                seeds: int, grid: int, convergence: str = "emulated") -> dict[str, Any]:
    """The baseline and each DBLP configuration of ``rows`` at bursts every N iterations, median simulated
    time to each target over ``seeds``, and per configuration the lowest rate from which it is sooner."""
    from dblp.sim.convergence.phase import model_for
    from dblp.sim.convergence.modes import run_compensation

    base = model_for(convergence)
    names = ["baseline"] + sorted({r["run"] for r in rows if r["run"].startswith("dblp")})
    n = max(int(conf.get("derived", {}).get("iterations", 154)), 1)
    loss = float(conf.get("burst-loss", 0.7))
    points = []
    for per in periods:
        bursts = list(range(per, n, per)) if per else []
        rate = 100.0 * len(bursts) / n
        pt: dict[str, Any] = {"period": per, "bursts_per_100": rate}
        for name in names:
            comp = run_compensation(name)
            model, _, _ = mode_model(base, comp, convergence)
            policy = name.split("-")[0]
            got = [sim_reach(sim_config(params, conf, policy, comp, bursts, n, s, loss), model, targets, grid)
                   for s in range(seeds)]
            pt[name] = {t: median([g[t][1] for g in got]) for t in targets}
        points.append(pt)
    cross: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == "baseline":
            continue
        cross[name] = {}
        for t in targets:
            for margin in MARGINS:
                sooner = [pt[name][t] < (1.0 - margin) * pt["baseline"][t] for pt in points]
                first = next((i for i in range(len(points)) if all(sooner[i:])), None)
                cross[name][f"{t:g}@{margin:g}"] = points[first]["bursts_per_100"] if first is not None else None
    return {"points": points, "crossover": cross, "seeds": seeds}


def print_report(res: dict[str, Any]) -> None:
    print(f"convergence model: {res['convergence']} (dblp.sim.convergence.modes.MODE_FACTORS)")
    print(f"time to target, seconds of training clock (median [range] over the seeds not fitted on; evaluations "
          f"every {res['grid']} iterations); model: the mode's convergence model on each run's measured loss "
          "and clock; sim: python -m dblp.sim run on the calibration"
          + (f" of {res['calibrated_from']}" if res.get("calibrated_from") else ""))
    hdr = f"{'condition':<22} {'run':<36} {'c':>5} {'target':>6} {'seeds':>6} {'measured':>19} {'model':>19} " \
          f"{'err':>6} {'sim':>19} {'err':>6}"
    print(hdr)
    for r in res["rows"]:
        cond = f"{Path(r['folder']).name}: {r['condition']}" if len(r["condition"]) < 12 else r["condition"]
        e1 = f"{r['model_err']:+.0%}" if math.isfinite(r["model_err"]) else "-"
        e2 = f"{r['sim_err']:+.0%}" if math.isfinite(r["sim_err"]) else "-"
        print(f"{cond[:22]:<22} {r['run']:<36} {r['mode_c']:>5.2f}{'' if r['fitted'] else '?'} {r['target']:>5.2f} "
              f"{','.join(map(str, r['seeds'])):>6} {_fmt(r['measured_s']):>19} {_fmt(r['model_s']):>19} {e1:>6} "
              f"{_fmt(r['sim_s']):>19} {e2:>6}")
    print("iterations to target (median): measured / model / sim")
    for r in res["rows"]:
        print(f"  {r['condition'][:22]:<22} {r['run']:<36} {r['target']:>5.2f} {median(r['measured_it']):>6.0f} "
              f"{median(r['model_it']):>6.0f} {median(r['sim_it']) if r['sim_it'] else math.nan:>6.0f}")
    errs = {k: sorted(abs(r[k]) for r in res["rows"] if math.isfinite(r[k]))
            for k in ("model_err", "sim_err", "model_it_err", "sim_it_err")}
    for k, v in errs.items():
        if v:
            print(f"{k}: median {median(v):.1%}, worst {v[-1]:.1%} over {len(v)} rows; "
                  f"within 15%: {sum(1 for x in v if x <= 0.15)}/{len(v)}")
    sw = res.get("sweep")
    if not sw:
        return
    names = [k for k in sw["points"][0] if k not in ("period", "bursts_per_100")]
    for t in res["targets"]:
        print(f"\nburst-rate sweep (simulated, median of {sw['seeds']} seeds): time to {t:.0%} (s)")
        print(f"{'every':>5} {'per 100 it':>10} " + " ".join(f"{n[:30]:>30}" for n in names))
        for pt in sw["points"]:
            print(f"{pt['period'] or '-':>5} {pt['bursts_per_100']:>10.2f} "
                  + " ".join(f"{pt[n][t]:>30.2f}" for n in names))
        for name, c in sw["crossover"].items():
            parts = []
            for margin in MARGINS:
                r = c[f"{t:g}@{margin:g}"]
                what = "sooner" if margin == 0 else f">= {margin:.0%} sooner"
                parts.append(f"{what} from " + (f"{r:.2f}/100 on" if r is not None else "no swept rate on"))
            print(f"  {name} against the baseline to {t:.0%}: " + "; ".join(parts))
        print(f"  emulation, measured (median [range] over every seed, s) at {t:.0%}:")
        for rate in sorted({p["bursts_per_100"] for p in res["emulation_points"]}):
            pts = [p for p in res["emulation_points"] if p["bursts_per_100"] == rate]
            base = next((median(p[f"{t:g}"]) for p in pts if p["run"] == "baseline"), math.nan)
            print(f"    {rate:.2f}/100: " + "; ".join(
                f"{p['run']} {_fmt(p[f'{t:g}'])}" + (f" (x{base / median(p[f'{t:g}']):.2f})"
                                                      if p["run"] != "baseline" and math.isfinite(base) else "")
                for p in pts))


def cmd_compare(args: argparse.Namespace) -> int:
    targets = [float(x) for x in args.targets.split(",") if x.strip()]
    fit_seeds = {str(Path(MODE_FIT["source"])): set(MODE_FIT["seeds"])} if not args.all_seeds else {}
    try:
        res = compare(args.folders, targets, calibrate_from=args.calibrate_from, fit_seeds=fit_seeds,
                      sim=not args.no_sim, periods=[int(x) for x in args.periods.split(",")],
                      sweep_seeds=args.sweep_seeds, convergence=args.convergence)
    except (OSError, ValueError) as exc:
        print(f"python -m dblp.sim.studies.modes_compare compare: error: {exc}", file=sys.stderr)
        return 2
    print_report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def add_compare_parser(sub: Any) -> argparse.ArgumentParser:
    c = sub.add_parser("compare", help="measured time to target per mode and condition beside the model's and the "
                                       "simulator's, and the burst-rate sweep")
    c.add_argument("folders", nargs="+", help="microburst results folders (config.json, seed<s>/<run>/)")
    c.add_argument("--targets", default="0.9,0.94", help="target accuracies, comma-separated (default 0.9,0.94)")
    c.add_argument("--all-seeds", action="store_true",
                   help=f"also the seeds the factors were fitted on (default: {MODE_FIT['source']}'s seeds "
                        f"{','.join(map(str, MODE_FIT['seeds']))} left out)")
    c.add_argument("--calibrate-from", default=None, metavar="RUN",
                   help="the emulation run the simulator is calibrated on (default: the first folder's first "
                        "baseline run with bursts)")
    c.add_argument("--no-sim", action="store_true", help="the model column only (no simulation, no sweep)")
    c.add_argument("--periods", default=",".join(map(str, PERIODS)),
                   help="the sweep's burst periods in iterations, 0 = no bursts (default: %(default)s)")
    c.add_argument("--sweep-seeds", type=int, default=2, help="simulated seeds per sweep point (default 2)")
    c.add_argument("--convergence", choices=sorted(MODE_FACTORS), default="emulated",
                   help="the base convergence model and its factors (dblp.sim.convergence.modes.MODE_FACTORS; default emulated)")
    c.add_argument("--json", default=None, metavar="FILE", help="write the rows and the sweep as JSON")
    c.set_defaults(func=cmd_compare)
    return c


def main(argv: list[str] | None = None) -> int:
    from dblp.cli.args import parser
    from dblp.sim.convergence.phase import model_for

    p = parser(prog="python -m dblp.sim.studies.modes_compare", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit each mode's factor on an emulation folder's seeds and print MODE_FACTORS")
    f.add_argument("folder", help="a microburst results folder (config.json, seed<s>/<run>/)")
    f.add_argument("--seeds", default="0,1", help="the seeds fitted on, comma-separated (default 0,1)")
    add_compare_parser(sub)
    args = p.parse_args(argv)
    if args.cmd == "compare":
        return int(args.func(args))
    seeds = {int(s) for s in args.seeds.split(",") if s.strip()}
    try:
        runs = [r for r in emulation_runs(args.folder) if r.seed in seeds]
    except (OSError, ValueError) as exc:
        print(f"python -m dblp.sim.studies.modes_compare fit: error: {args.folder}: {exc}", file=sys.stderr)
        return 2
    emu = fit_emulated_curve(runs)
    print(f"{len(runs)} runs of seeds {sorted(seeds)} in {args.folder}")
    print(f'EMULATED_FITTED = {{"digits_mlp": {emu!r}}}  # accuracy RMSE {run_rmse(emu, runs):.4f} over these runs')
    tables = {}
    for name, base in (("phase", model_for("phase")), ("emulated", emu)):
        res = fit_factors(base, runs)
        print(f"\n{name} base: {'mode':<24} {'runs':>4} {'c':>6} {'log-err at c':>12} {'at c = 1':>9}")
        for key, v in res.items():
            print(f"{'':>{len(name) + 7}}{key:<24} {v['runs']:>4} {v['c']:>6.2f} {v['err']:>12.4f} {v['err_c1']:>9.4f}")
        ref = res.get("paper", {}).get("c") or 1.0  # a mode's factor is its charge against the paper's, same base
        tables[name] = {k: (1.0 if k == "paper" else round(v["c"] / ref, 2)) for k, v in res.items()}
    print(f"\nMODE_FACTORS = {tables!r}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
