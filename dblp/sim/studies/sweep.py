"""Parameter sweeps: DBLP against the baseline over a grid, in parallel.

Every grid point is simulated twice with the same seed - DBLP, and the
paper's baseline (fixed p = P_low) - so both see the same bursts (common
random numbers). Baseline runs that do not depend on DBLP's own parameters
(P_high, eta, detection frequency) are run once and shared. Bursts are the
``random_bursts`` loss process: a burst of ``burst_loss`` for ``burst_len``
iterations starts at each iteration with probability ``burst_rate``.

Output (``--out``): ``sweep.csv`` (one row per grid point: its axes, DBLP's
and the baseline's mean/p99 round latency, send latency, time-to-train,
time to ``--target-accuracy`` (``--convergence``, default the phase-aware
model of :mod:`dblp.sim.convergence.phase`: fed with each round's lost
fraction ``1 - up * down`` and its training regime), lost fractions
(``lost_applied``: that ``1 - up * down``, the map's quantity; ``lost``: the
mean of the up and down losses), passes, and the ratios), ``sweep.json`` (grid,
base parameters, timing) and ``heatmap_<metric>.png``. The table depends only on
the parameters and the seed: the same command gives the same file.

``--seeds N`` runs every point with N seeds (DBLP and baseline paired by
seed): cells are means, ``*_ci95`` columns the half-widths of their 95%
intervals, ``bursts_per_seed`` the bursts each seed drew
(:mod:`dblp.sim.studies.replicates`). Finished simulations are cached in
``OUT/cache`` (one file per configuration hash), so an interrupted sweep
resumes where it stopped; ``--dask tcp://host:8786`` sends the simulations
to a Dask cluster instead of local processes (:mod:`dblp.sim.studies.runners`).

CLR detection sees the ``--norms`` sequence: the default synthetic one jumps
2.5x at each critical point (detected at every eta < 1.5); sweep eta with
``--norms varied`` (mini-batch-like noise) or a real run's export (CSV).

Usage: ``python -m dblp.sim sweep --p-high 0.1,0.2,0.4,0.6 --eta 0.3,0.5,0.7
--burst-rate 0.005,0.01,0.02 --iterations 300 --out results/sweep``
(or ``python scenarios/sweep.py ...``, the same options).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from traces.argtypes import add_verbosity, count_arg, int_arg, name_list_arg
from traces.units import HelpFormatter, UnitError, parse_rate

from dblp.cli.provenance import write_config
from dblp.transport.shard import AGGREGATIONS
from dblp.protocol.wire import ParameterError
from dblp.sim.config import SimConfig
from dblp.protocol.records import round_trace
from dblp.sim.convergence.curve import DEFAULT_TARGET_ACCURACY, add_target_arg, check_target, time_to_accuracy
from dblp.sim.convergence.phase import (DEFAULT_CONVERGENCE, DEFAULT_CONVERGENCE_WORKLOAD, add_convergence_args, model_for,
                                sim_regimes)
from dblp.sim.convergence.modes import add_sim_compensation_args, mode_model, paper_of
from dblp.sim.options import add_config_args, baseline_of, config_from_args
from dblp.sim.studies.replicates import mean_ci95
from dblp.sim.studies.runners import ResultCache, Runner, config_key, connect_check, describe, run_tasks
from dblp.sim.network.topology import TOPOLOGIES

METRICS = ["mean_round_s", "p99_round_s", "mean_up_s", "p99_up_s", "time_to_train_s", "time_to_accuracy_s",
           "iterations_to_accuracy", "tta_extrapolated", "lost_up", "lost_down", "lost", "lost_applied",
           "crit_frac", "up_passes", "down_passes", "clr_frac", "burst_rounds"]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _models(s: str) -> list[Any]:
    out: list[Any] = []
    for x in s.split(","):
        x = x.strip()
        if x:
            try:
                out.append(int(float(x)) if x[0].isdigit() else x)
            except ValueError:
                out.append(x)
    return out


def _rates(s: str) -> list[float]:
    return [parse_rate(x, "Mbit", allow_zero=False) for x in s.split(",") if x.strip()]


#: ``--topology star,leafspine`` (networks of dblp.sim.network.topology), ``--aggregation server,sharded``
#: (modes of dblp.transport.shard): each name refused by name if unknown
_topologies = name_list_arg(TOPOLOGIES, what="topology")
_aggregations = name_list_arg(AGGREGATIONS, what="aggregation")

# axis -> (flag, parser, default values, SimConfig field or None for burst axes)
AXES: dict[str, tuple[str, Callable[[str], list], list, str | None]] = {
    "p_high": ("--p-high", _floats, [0.1, 0.2, 0.4, 0.6], "p_high"),
    "p_low": ("--p-low", _floats, [0.008], "p_low"),
    "eta": ("--eta", _floats, [0.3, 0.5, 0.7], "eta"),
    "freq": ("--freq", _ints, [10], "freq"),
    "burst_rate": ("--burst-rate", _floats, [0.005, 0.01, 0.02], None),
    "burst_loss": ("--burst-loss", _floats, [0.7], None),
    "burst_len": ("--burst-len", _ints, [1], None),
    "model": ("--model", _models, ["resnet50"], "model"),
    "bandwidth_bps": ("--bandwidth", _rates, [10e9], "bandwidth_bps"),
    "topology": ("--topology", _topologies, ["star"], "topology"),
    "aggregation": ("--aggregation", _aggregations, ["server"], "aggregation"),
}


def grid_points(axes: dict[str, list]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def point_config(base: SimConfig, pt: dict[str, Any]) -> SimConfig:
    kw = {AXES[k][3]: v for k, v in pt.items() if AXES[k][3] is not None}
    loss = list(base.loss)
    if pt["burst_rate"] > 0 and pt["burst_loss"] > 0:
        loss.append({"kind": "random_bursts", "rate": pt["burst_rate"], "loss": pt["burst_loss"],
                     "length": int(pt["burst_len"])})
    return base.with_(policy="dblp", loss=loss, **kw)


def run_config(d: dict) -> dict:
    """Simulate one configuration (a process-pool or Dask task); its summary.

    Beside the headline numbers it keeps the per-round trace that time to
    accuracy is computed from (``_round_end_s``, ``_round_lost``:
    :func:`dblp.protocol.records.round_trace`), so the cached result serves
    any ``--target-accuracy``.
    """
    from dblp.sim.model import simulate

    cfg = SimConfig.from_dict(d)
    c = time.process_time()
    res = simulate(cfg)
    s = res.summary()
    s["_round_end_s"], s["_round_lost"] = round_trace(res.records)
    s["_wall_s"] = res.wall_s
    s["_cpu_s"] = time.process_time() - c
    return s


def with_accuracy(summary: dict, target: float, model: Any = None, critical: list[bool] | None = None) -> dict:
    """``summary`` and its time to ``target`` accuracy (:func:`dblp.sim.convergence.curve.time_to_accuracy`, with
    ``model`` and each round's regime ``critical``), ``lost_applied`` - the mean over rounds of the fraction
    of the applied gradient lost, ``1 - up * down``: the model's own ``f`` (``lost`` is the mean of the up
    and down losses, which it is not) - and ``crit_frac``, the share of rounds in the training's CLR."""
    lost = summary["_round_lost"]
    n = len(lost)
    crit = list(critical or [])[:n]
    return {**summary, "lost_applied": sum(lost) / n if n else math.nan,
            "crit_frac": sum(crit) / n if n else math.nan,
            **time_to_accuracy(summary["_round_end_s"], lost, target, model or model_for(), crit or None)}


def run_sweep(base: SimConfig, axes: dict[str, list], *, jobs: int = 0, progress: bool = True,
              runner: Runner = run_config, seeds: int = 1, dask: str | None = None,
              cache: ResultCache | None = None,
              target_accuracy: float = DEFAULT_TARGET_ACCURACY, convergence: str = DEFAULT_CONVERGENCE,
              convergence_workload: str = DEFAULT_CONVERGENCE_WORKLOAD,
              convergence_weights: tuple[float, float] | None = None) -> tuple[list[dict], dict]:
    """Rows of the table (grid order) and timing info.

    Each point runs with ``seeds`` seeds (``base.seed``, ``base.seed + 1``, ...),
    DBLP and its baseline with the same seed; a cell is the mean over seeds,
    with a ``_ci95`` half-width column beside it when ``seeds`` > 1
    (:mod:`dblp.sim.studies.replicates`). ``time_to_accuracy_s`` is the simulated
    time to ``target_accuracy`` by the ``convergence`` model of ``convergence_workload``
    (:func:`dblp.sim.convergence.phase.model_for`), each round charged by its training regime
    (:func:`dblp.sim.convergence.phase.sim_regimes`: the same for DBLP and its baseline).
    """
    check_target(target_accuracy)
    model = model_for(convergence, convergence_workload, convergence_weights)
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ParameterError(f"--seeds must be a positive integer, got {seeds!r}")
    points = grid_points(axes)
    tasks: dict[str, SimConfig] = {}
    plan = []
    for pt in points:
        pairs = []
        for s in range(seeds):
            d = point_config(base.with_(seed=base.seed + s), pt)
            b = paper_of(baseline_of(d))  # the paper's fixed baseline, uncompensated
            kd, kb = config_key(d), config_key(b)
            tasks.setdefault(kd, d)
            tasks.setdefault(kb, b)
            pairs.append((kd, kb))
        plan.append((pt, pairs))
    t0 = time.perf_counter()
    results, cached = run_tasks(tasks, runner, jobs=jobs, dask=dask, cache=cache, progress=progress)
    wall = time.perf_counter() - t0
    results = {k: with_accuracy(r, target_accuracy, mode_model(model, tasks[k].compensation, convergence)[0],
                                sim_regimes(tasks[k], len(r["_round_lost"])))
               for k, r in results.items()}
    rows = [_row(pt, pairs, results, base, seeds) for pt, pairs in plan]
    info = {"runs": len(tasks), "cached": cached, "grid_points": len(points), "seeds": seeds, "wall_s": wall,
            "jobs": jobs or os.cpu_count() or 1, "dask": dask, "target_accuracy": target_accuracy,
            "convergence": convergence, "convergence_workload": convergence_workload,
            "convergence_weights": convergence_weights,
            "sim_cpu_s": sum(r.get("_cpu_s", 0.0) for r in results.values())}
    return rows, info


def _row(pt: dict[str, Any], pairs: list[tuple[str, str]], results: dict[str, dict], base: SimConfig,
         seeds: int) -> dict[str, Any]:
    """One grid point's table row: means over its seeds (and 95% half-widths)."""
    row: dict[str, Any] = dict(pt)
    row.update(seed=base.seed, seeds=seeds, rounds=base.rounds, fidelity=base.fidelity)
    per = {"dblp": [results[kd] for kd, _ in pairs], "base": [results[kb] for _, kb in pairs]}

    def put(name: str, values: list[float]) -> None:
        m, h = mean_ci95(values)
        row[name] = m
        if seeds > 1:
            row[f"{name}_ci95"] = h

    for who in ("dblp", "base"):
        for m in METRICS:
            put(f"{who}_{m}", [r[m] for r in per[who]])
    a, b = per["dblp"], per["base"]
    put("speedup_mean", [_ratio(y["mean_round_s"], x["mean_round_s"]) for x, y in zip(a, b)])
    put("speedup_p99", [_ratio(y["p99_round_s"], x["p99_round_s"]) for x, y in zip(a, b)])
    put("speedup_time_to_train", [_ratio(y["time_to_train_s"], x["time_to_train_s"]) for x, y in zip(a, b)])
    put("speedup_time_to_accuracy", [_ratio(y["time_to_accuracy_s"], x["time_to_accuracy_s"]) for x, y in zip(a, b)])
    put("lost_extra", [x["lost"] - y["lost"] for x, y in zip(a, b)])
    put("lost_applied_extra", [x["lost_applied"] - y["lost_applied"] for x, y in zip(a, b)])
    bursts = [int(r["burst_rounds"]) for r in a]  # the baseline sees the same bursts (same seed)
    row["bursts_total"] = sum(bursts)
    row["bursts_per_seed"] = ";".join(str(n) for n in bursts)
    # dblp.sim.model.collapse_warning, per simulation of this point (DBLP and baseline, every seed)
    warned = [r["collapse_warning"] for r in a + b if r.get("collapse_warning")]
    row["collapse_runs"] = len(warned)
    row["collapse_warning"] = warned[0] if warned else ""
    return row


def _ratio(num: float, den: float) -> float:
    if math.isinf(num) and math.isinf(den):
        return float("nan")  # neither reaches the target: no ratio
    return num / den if den else float("nan")


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


_AXIS_HELP = {"model": "gradient sizes: model names or element counts",
              "topology": "networks: star (the paper's), leafspine, twosites; their parameters from the "
                          "--racks/--wan-... flags",
              "bandwidth_bps": "worker link rates; a bare number is Mbit/s",
              "aggregation": "who averages: server (--servers dedicated hosts), sharded (a shard server on each "
                             "worker's host)"}


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("grid (comma-separated values; the product is swept)")
    for name, (flag, _, default, _f) in AXES.items():
        g.add_argument(flag, dest=f"axis_{name}", default=None,
                       help=f"{_AXIS_HELP.get(name, name + ' values')} (default {','.join(str(v) for v in default)})")
    add_config_args(p, skip=tuple(a[0] for a in AXES.values()))
    p.set_defaults(rounds=None)
    o = p.add_argument_group("sweep")
    o.add_argument("--jobs", type=int_arg(0), default=0, help="parallel processes (default: all cores)")
    o.add_argument("--out", default="results/sweep", help="folder of the sweep's files")
    o.add_argument("--x", default=None, help="heatmap x axis (default: the first axis with several values)")
    o.add_argument("--y", default=None, help="heatmap y axis (default: the next one)")
    add_verbosity(o)  # -q: no progress bar (already there when p came from dblp.cli.args.parser)
    o.add_argument("--seeds", type=count_arg(1), default=1,
                   help="replicates per grid point (seeds --seed, --seed+1, ...): means and 95%% confidence "
                        "half-widths (*_ci95 columns) in the table (default 1)")
    o.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run the simulations on a Dask scheduler, e.g. tcp://host:8786 (needs the 'cluster' "
                        "extra on every machine; default: local processes)")
    o.add_argument("--cache", default=None, metavar="DIR",
                   help="finished simulations, one file per configuration, so an interrupted sweep resumes "
                        "(default: OUT/cache)")
    o.add_argument("--no-cache", action="store_true", help="simulate every point again and keep nothing")
    add_target_arg(o)
    add_convergence_args(o)
    add_sim_compensation_args(p)


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise ParameterError(f"--seeds must be at least 1, got {args.seeds}")
    if args.dask:
        connect_check(args.dask)
    axes = {}
    for name, (flag, parse, default, _f) in AXES.items():
        raw = getattr(args, f"axis_{name}")
        try:
            axes[name] = parse(raw) if raw is not None else list(default)
        except (ValueError, UnitError, argparse.ArgumentTypeError) as exc:
            raise ParameterError(f"{flag}: {exc}") from None
        if not axes[name]:
            raise ParameterError(f"{flag}: no values")
    base = config_from_args(args, **({} if args.rounds is not None or args.params else {"rounds": 300}))
    multi = [n for n, v in axes.items() if len(v) > 1]
    x = args.x or (multi[0] if multi else "p_high")
    y = args.y or (multi[1] if len(multi) > 1 else next(n for n in AXES if n != x))
    for a in (x, y):
        if a not in AXES:
            raise ParameterError(f"--x/--y must be one of {list(AXES)}, got {a!r}")
    for pt in grid_points(axes):  # validate every point before spending time
        point_config(base, pt).validate()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, args)  # the resolved flags, commit and package versions (--config takes it back)
    cache = None if args.no_cache else ResultCache(args.cache or out / "cache")
    rows, info = run_sweep(base, axes, jobs=args.jobs, progress=not args.quiet, seeds=args.seeds, dask=args.dask,
                           cache=cache, target_accuracy=args.target_accuracy, convergence=args.convergence,
                           convergence_workload=args.convergence_workload,
                           convergence_weights=args.convergence_weights)
    write_csv(rows, out / "sweep.csv")
    meta = {"axes": axes, "base": base.to_dict(), **info, "x": x, "y": y,
            "collapsed_points": sum(1 for r in rows if r["collapse_runs"])}  # dblp.sim.model.collapse_warning
    (out / "sweep.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    from dblp.sim.plots import plot_sweep

    varied = [k for k in AXES if len(axes[k]) > 1]
    z = next((k for k in varied if k not in (x, y)), None)  # small multiples: one row of panels per value
    pngs = plot_sweep(rows, x, y, out, z=z, averaged=[k for k in varied if k not in (x, y, z)],
                      target_accuracy=args.target_accuracy,
                      convergence=f"{args.convergence_workload}, {args.convergence} model"
                      + (" w_crit,w_calm = {},{}".format(*args.convergence_weights)
                         if args.convergence_weights else ""))
    print(f"{info['grid_points']} grid points x {info['seeds']} seeds, {info['runs']} simulations of {base.rounds} "
          f"iterations ({info['cached']} from the cache) in {info['wall_s']:.1f} s on "
          f"{describe(args.jobs, args.dask)} -> {out / 'sweep.csv'}, "
          + ", ".join(p.name for p in pngs))
    collapsed = [r for r in rows if r["collapse_runs"]]
    if collapsed:  # one line for the sweep, the first point's figure (each row has its own in sweep.csv)
        first = collapsed[0]
        print(f"{len(collapsed)} of {len(rows)} grid points collapsed (in {sum(r['collapse_runs'] for r in rows)} "
              f"of their {2 * info['seeds'] * len(rows)} DBLP/baseline runs; collapse_warning in sweep.csv), "
              f"e.g. at {({k: first[k] for k in varied})}: "
              f"{first['collapse_warning']}")
    for col, what in (("speedup_time_to_train", "time-to-train"),
                      ("speedup_time_to_accuracy", f"time-to-{args.target_accuracy:.0%}-accuracy")):
        finite = [r for r in rows if math.isfinite(r[col])]
        if finite:
            best = max(finite, key=lambda r: r[col])
            print(f"best {what} speedup x{best[col]:.3f} at {({k: best[k] for k in varied})}")
        else:
            print(f"{what}: no grid point where both DBLP and the baseline reach it")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("sweep", help="sweep a parameter grid, DBLP vs baseline, in parallel",
                       description=__doc__, formatter_class=HelpFormatter)
    from dblp.cli.args import add_config_flags

    add_config_flags(p)
    add_sweep_args(p)
    p.set_defaults(func=cmd_sweep)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scenarios/sweep.py``."""
    import sys

    from dblp.protocol.wire import ParameterError

    from dblp.cli.args import parser

    p = parser(prog="scenarios/sweep.py", description=__doc__)
    add_sweep_args(p)
    args = p.parse_args(argv)
    try:
        return cmd_sweep(args)
    except ParameterError as exc:
        print(f"sweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: interrupted", file=sys.stderr)
        return 130
