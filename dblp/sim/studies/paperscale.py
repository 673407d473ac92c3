"""``python -m dblp.sim predict``: the paper's full-length microburst runs (EfficientNet-B0, 930
iterations; ResNet50, 1395) simulated from a calibration, next to the paper's own figures.

Why: a GPU session has minutes, not the hours the paper's runs take; what it can measure is a
calibration (host send rates, reduce time, the link) and each model's compute per iteration on that
GPU. The simulator then runs the paper's configurations - its iteration counts, burst iterations,
70% burst loss and tolerances (Table I) - on those constants and prints:

* Table II / III: DBLP's and the baseline's send latency at each burst, the tail (max) and the
  average, and DBLP's speedups, beside the paper's (4.68x and 5.88x at EfficientNet-B0's bursts);
* Table V: the training time of both with and without bursts, normalised to DBLP, and the
  baseline's extra time in percent beside the paper's (23.86% / 17.44% for EfficientNet-B0,
  19.78% / 17.51% for ResNet50).

What it assumes, and prints: the network is the calibration's (its link rate, queue, pacing and
host send rates); the gradient size is the model's with the paper's data set's classes (what
``dblp.train`` builds); the compute per iteration is the calibration's when it was made on a run of
the same model, else the one given with ``--compute`` (labelled "stated", e.g. a CPU measurement or
a GPU figure from elsewhere: then not a GPU measurement of this session); the gradient norms - the
CLR detector's input - are the simulator's synthetic ones (a jump every ``critical_every``
iterations), since a short GPU run cannot show the norms of 930 iterations.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.units import HelpFormatter, duration_arg

from dblp.sim.config import SimConfig

__all__ = ["PAPER_RUNS", "PaperRun", "predict", "add_parser"]


@dataclass(frozen=True)
class PaperRun:
    """One of the paper's microburst runs (section V-B) and what it reports."""

    model: str
    elements: int  # gradient floats of the model with the data set's classes (dblp.train's build)
    iterations: int
    bursts: tuple[int, ...]
    p_low: float
    p_high: float
    dblp_s: tuple[float, ...]  # Table II/III: at each burst, tail, average (seconds)
    baseline_s: tuple[float, ...]
    speedups: tuple[float, ...]  # as the paper prints them
    extra_time_bursts_pct: float  # Table V: the baseline's training time over DBLP's, minus 1
    extra_time_calm_pct: float
    table: str


#: The paper's numbers (arXiv 2605.01989: Tables I-III and V, section V-B).
PAPER_RUNS: dict[str, PaperRun] = {
    "efficientnet_b0": PaperRun("efficientnet_b0", 4_020_358, 930, (279, 651), 0.008, 0.408,
                                (0.4621, 0.3619, 1.1305, 0.5907), (2.1629, 2.1293, 2.1629, 0.9236),
                                (4.68, 5.88, 1.91, 1.56), 23.86, 17.44, "Table II"),
    "resnet50": PaperRun("resnet50", 23_712_932, 1395, (372, 651, 1209), 0.024, 0.424,
                         (2.3017, 2.4367, 2.6885, 5.6665, 3.1966), (10.1180, 10.0079, 10.0118, 10.1180, 4.8519),
                         (4.40, 4.11, 3.72, 1.79, 1.52), 19.78, 17.51, "Table III"),
}
BURST_LOSS = 0.7


def _policy_cfg(cfg: SimConfig, name: str, run: PaperRun) -> SimConfig:
    from dblp.protocol.policy import run_policy

    return cfg.with_(**run_policy(name, run.p_low, run.p_high, cfg.eta, cfg.freq).config())


def predict(cal: SimConfig, model: str, *, compute_s: float, out: Path | None = None, fidelity: str = "round",
            calm: bool = True) -> dict[str, Any]:
    """Simulate ``model``'s paper run on ``cal``'s constants with ``compute_s`` per iteration;
    return the tables (and write them, the records and a plot into ``out``)."""
    from dblp.results.analysis import bursts_text, summarize, table_ii
    from dblp.sim.model import simulate

    run = PAPER_RUNS[model]
    base = cal.with_(model=run.elements, rounds=run.iterations, compute_s=compute_s, compute_jitter_s=0.0,
                     norms=None, fidelity=fidelity,
                     loss=[{"kind": "iteration_bursts", "at": list(run.bursts), "loss": BURST_LOSS}])
    records: dict[str, list] = {}
    times: dict[tuple[str, str], float] = {}
    conditions = [("bursts", base)] + ([("calm", base.with_(loss=[]))] if calm else [])
    for cond, c in conditions:
        for name in ("baseline", "dblp"):
            path = None
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                path = out / f"{model}-{name}-{cond}.jsonl"
                path.unlink(missing_ok=True)
            res = simulate(_policy_cfg(c, name, run), records=str(path) if path else None)
            times[(cond, name)] = float(res.summary()["time_to_train_s"])
            if cond == "bursts":
                records[name] = res.records
    sums = {k: summarize(v, run.bursts) for k, v in records.items()}
    rows = table_ii(sums["baseline"], sums["dblp"], run.bursts)
    keep = [i for i, h in enumerate(rows[0]) if h != "p99"]  # the paper's tables have no p99 column
    rows = [[r[i] for i in keep] for r in rows]
    rows += [["Paper: DBLP", *run.dblp_s], ["Paper: Baseline", *run.baseline_s], ["Paper: speedup (x)", *run.speedups]]
    t5 = [["condition", "run", "train time (s)", "time / dblp", "baseline extra (%)", "paper (%)"]]
    for cond in [c for c, _ in conditions]:
        d, b = times[(cond, "dblp")], times[(cond, "baseline")]
        paper = run.extra_time_bursts_pct if cond == "bursts" else run.extra_time_calm_pct
        label = f"with bursts at {bursts_text(run.bursts)}" if cond == "bursts" else "no bursts"
        t5.append([label, "baseline", b, b / d, 100 * (b / d - 1), paper])
        t5.append([label, "dblp", d, 1.0, 0.0, 0.0])
    result = {"model": model, "table": run.table, "table_ii": rows, "table_v": t5,
              "speedups": rows[3][1:], "paper_speedups": list(run.speedups)}
    if out is not None:
        with open(out / f"{model}-table_ii.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
        with open(out / f"{model}-table_v.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(t5)
        from dblp.results.analysis import plot_latency

        setup = (f"simulated {model}, {cal.workers} workers, {cal.bandwidth_bps / 1e6:g} Mbit/s, compute "
                 f"{compute_s * 1e3:.1f} ms/iteration, 70% bursts at {','.join(map(str, run.bursts))}")
        plot_latency(records, out / f"{model}-latency.png", run.bursts,
                     f"Predicted send latency, the paper's {model} run ({run.table} / Fig. 2)", setup=setup)
        (out / f"{model}-prediction.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    return result


def cmd_predict(args: argparse.Namespace) -> int:
    from dblp.results.analysis import format_table

    cal = SimConfig.from_json(args.params) if args.params else SimConfig()
    meta: dict[str, Any] = {}
    if args.params:
        raw = json.loads(Path(args.params).read_text())
        meta = raw.get("_calibration") or raw.get("_crosscheck") or {}
    out = Path(args.out) if args.out else None
    status = 0
    for model in args.models.split(","):
        model = model.strip()
        if model not in PAPER_RUNS:
            print(f"dblp.sim predict: error: --models: {model!r} is not one of the paper's microburst runs "
                  f"({', '.join(PAPER_RUNS)})", file=sys.stderr)
            return 2
        run = PAPER_RUNS[model]
        if args.compute is not None:
            compute, how = args.compute, args.compute_source or "stated on the command line (--compute), not measured"
        elif args.params and cal.model == run.elements:
            compute, how = cal.compute_s, f"measured: the calibration's ({args.params}, a run of this model)"
        else:
            print(f"dblp.sim predict: error: {model}: the calibration {'is of a ' + format(cal.model, ',') + '-float model' if args.params else 'is missing'}, "
                  f"not {model} ({run.elements:,} floats): give --compute, {model}'s compute per iteration "
                  f"(e.g. measured on the GPU: python -m dblp.train.computetime)", file=sys.stderr)
            status = 2
            continue
        print(f"\n== {model}: the paper's run simulated ({run.iterations} iterations, 70% bursts at "
              f"{list(run.bursts)}, P_low {run.p_low:g}, P_high {run.p_high:g}, {args.fidelity} level)")
        print(f"  network: {'the calibration ' + str(args.params) if args.params else 'simulator defaults (no --params)'}: "
              f"{cal.workers} workers, {cal.bandwidth_bps / 1e6:g} Mbit/s links, {cal.queue_bytes:,}-byte queues, "
              f"worker {cal.send_pps:,.0f} / server {cal.server_pps:,.0f} datagrams/s, pacing "
              f"{cal.send_rate_bps / 1e6:g} Mbit/s, reduce {cal.reduce_s * 1e3:.2f} ms"
              + (f"; calibrated from {meta.get('source')}" if meta.get("source") else ""))
        print(f"  compute per iteration: {compute * 1e3:.2f} ms, {how}")
        print("  gradient norms: the simulator's synthetic ones (CLR jumps every "
              f"{cal.critical_every} iterations), not a measured training run's")
        r = predict(cal, model, compute_s=compute, out=out, fidelity=args.fidelity, calm=not args.no_calm)
        print(f"\n{r['table']} (predicted) with the paper's figures, send latency in seconds:")
        print(format_table(r["table_ii"]))
        print("\nTable V (predicted): training time normalised to DBLP, beside the paper's")
        print(format_table(r["table_v"], ".2f"))
        errs = [(s - p) / p for s, p in zip(r["speedups"], r["paper_speedups"]) if p and math.isfinite(s)]
        print(f"  speedups: predicted {', '.join(f'{s:.2f}x' for s in r['speedups'])}; paper "
              f"{', '.join(f'{p:.2f}x' for p in r['paper_speedups'])}; relative error "
              f"{', '.join(f'{e:+.0%}' for e in errs)}")
    if out is not None:
        print(f"\nwrote {out}/ (<model>-table_ii.csv, -table_v.csv, -prediction.json, -latency.png, records)")
    return status


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="the paper's full-length microburst runs from a calibration (Tables II/III, V)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--params", default=None,
                   help="a calibration (python -m dblp.sim calibrate, or a crosscheck's calibration.json) of a run "
                        "on the machine to predict for; default: the simulator's defaults")
    p.add_argument("--models", default="efficientnet_b0,resnet50", help="the paper's runs to predict (comma list)")
    p.add_argument("--compute", type=duration_arg(), default=None,
                   help="per-iteration compute time of a worker (e.g. 45ms; a bare number is seconds); default: the "
                        "calibration's, when it was made on a run of the same model")
    p.add_argument("--compute-source", default=None,
                   help="where --compute comes from, printed beside it (default: 'stated on the command line')")
    p.add_argument("--fidelity", choices=["round", "packet"], default="round", help="simulator level")
    p.add_argument("--no-calm", action="store_true", help="skip the runs without bursts (Table V's second condition)")
    p.add_argument("--out", default=None, help="folder for the tables (CSV), records (JSONL) and plots (PNG)")
    p.set_defaults(func=cmd_predict)
    return p
