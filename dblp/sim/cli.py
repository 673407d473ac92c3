"""``python -m dblp.sim run | sweep | calibrate | predict``.

``run`` simulates one configuration (optionally beside its baseline) and
writes the round records (JSONL, the schema of :mod:`dblp.protocol.records`), a
summary (JSON) and plots (latency per iteration, CDF); ``sweep`` runs a grid
in parallel (see :mod:`dblp.sim.studies.sweep`); ``calibrate`` turns an emulation
run's results folder into ``params.json`` (see :mod:`dblp.sim.studies.calibrate`); ``predict`` simulates the
paper's full-length microburst runs from a calibration (see :mod:`dblp.sim.studies.paperscale`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dblp.cli.args import add_config_flags, add_verbosity, parser
from dblp.cli.provenance import write_config
from dblp.protocol.records import GZIP_SUFFIX
from dblp.protocol.wire import ParameterError
from traces.units import HelpFormatter

from dblp.protocol.records import round_trace
from dblp.sim.convergence.curve import add_target_arg, time_to_accuracy
from dblp.sim.convergence.phase import add_convergence_args, model_for, sim_regimes
from dblp.sim.convergence.modes import add_sim_compensation_args, mode_model, paper_of
from dblp.sim.options import add_config_args, baseline_of, config_from_args, name_flags


#: ``run --record-format``: the records file's suffix under --out (gzip by ``.gz``: dblp.protocol.records), or none
RECORD_FORMATS = ("jsonl", "jsonl.gz", "none")
BIG_RECORDS_BYTES = 100_000_000  # a plain records file past this size: say how to keep it smaller


# -- run ------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from dblp.sim.model import simulate

    cfg = config_from_args(args)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        cfg.to_json(out / "params.json")
        write_config(out, args)  # the flags as given, commit and package versions (--config takes it back)
    runs = [("dblp" if cfg.policy == "dblp" else cfg.policy, cfg)]
    if args.baseline:
        runs.append(("baseline", paper_of(baseline_of(cfg))))  # the paper's fixed baseline, uncompensated
    summaries = {}
    results = {}
    traces: dict[str, tuple[list[float], list[float]]] = {}
    model = model_for(args.convergence, args.convergence_workload, args.convergence_weights)  # refused before a run
    for label, c in runs:
        rec = str(out / f"records-{label}.{args.record_format}") if out and args.record_format != "none" else (
            None if out else args.records)
        if rec and Path(rec).exists():
            Path(rec).unlink()  # RecordWriter appends; a rerun replaces
        res = simulate(c, records=rec)
        size = Path(rec).stat().st_size if rec and not rec.endswith(GZIP_SUFFIX) else 0
        if size > BIG_RECORDS_BYTES:
            print(f"{label:>9}: {rec}: {size / 1e6:.0f} MB of records; --record-format jsonl.gz compresses them "
                  "(1/14 to 1/139 in docs/records.md), none skips them", flush=True)
        s = res.summary()
        ends, lost = round_trace(res.records)
        traces[label] = (ends, lost)
        mode, factor, fitted = mode_model(model, c.compensation, args.convergence)  # the mode's charge of a lost fraction
        s.update(time_to_accuracy(ends, lost, args.target_accuracy, mode, sim_regimes(c, len(ends))))
        s.update(compensation=c.compensation.label(), convergence_mode_factor=factor,
                 convergence_mode_fitted=fitted)
        s.update(wall_s=res.wall_s, iterations_per_s=c.rounds / res.wall_s if res.wall_s else float("nan"),
                 datagrams=res.datagrams)
        summaries[label] = s
        results[label] = res
        print(f"{label:>9}: {c.rounds} iterations ({c.fidelity} level) in {res.wall_s:.2f} s: "
              f"round mean {s['mean_round_s'] * 1e3:.2f} ms, p99 {s['p99_round_s'] * 1e3:.2f} ms, "
              f"send mean {s['mean_up_s'] * 1e3:.2f} ms, time-to-train {s['time_to_train_s']:.3f} s, "
              f"time-to-{args.target_accuracy:.0%}-accuracy {s['time_to_accuracy_s']:.3f} s, "
              f"lost up {s['lost_up'] * 100:.2f}% down {s['lost_down'] * 100:.2f}%, "
              f"passes up {s['up_passes']:.2f} down {s['down_passes']:.2f}", flush=True)
        if not c.compensation.paper:
            print(f"{label:>9}: mode {s['compensation']}: a lost fraction charged x{factor:.3f} in time to accuracy"
                  + ("" if fitted else " (no factor fitted for this mode: charged as the paper's; "
                                       "dblp.sim.convergence.modes.MODE_FACTORS)"), flush=True)
        if s["collapse_warning"]:
            print(f"{label:>9}: {s['collapse_warning']}", flush=True)
    if len(summaries) == 2:
        a, b = summaries[runs[0][0]], summaries["baseline"]
        print(f"baseline/{runs[0][0]}: mean round x{b['mean_round_s'] / a['mean_round_s']:.2f}, "
              f"p99 x{b['p99_round_s'] / a['p99_round_s']:.2f}, "
              f"time-to-train x{b['time_to_train_s'] / a['time_to_train_s']:.2f}, "
              f"time-to-accuracy x{b['time_to_accuracy_s'] / a['time_to_accuracy_s']:.2f}")
    if out:
        (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
        from dblp.sim.plots import plot_run

        from dblp.sim.plots import plot_time_to_accuracy

        plot_run({k: r.records for k, r in results.items()}, out)
        bursts = sorted({r.round for r in results[runs[0][0]].records if r.role == "worker" and r.extra.get("burst")})
        plot_time_to_accuracy({k: (traces[k][0], summaries[k]) for k in results}, bursts, args.target_accuracy, out,
                              title=f"{cfg.workers} workers, {cfg.model}, {cfg.topology}, {cfg.fidelity} level")
        _write_rounds(out / "rounds.csv", results, traces)
        recs = "" if args.record_format == "none" else f"records-*.{args.record_format}, "
        print(f"wrote {out}/ (config.json, params.json, {recs}rounds.csv, summary.json, latency.png, cdf.png, time.png)")
    elif args.summary:
        Path(args.summary).write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    return 0


def _write_rounds(path: Path, results: dict, traces: dict) -> None:
    """rounds.csv: per run and iteration, the mean worker's figures and the iteration's end (simulated s) -
    the table behind latency.png and time.png, small where the records are one per worker."""
    import csv

    import numpy as np

    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "iteration", "burst", "end_s", "round_s", "up_s", "down_s", "up_passes", "down_passes",
                    "lost"])
        for label, res in results.items():
            by: dict[int, list] = {}
            for r in res.records:
                if r.role == "worker":
                    by.setdefault(r.round, []).append(r)
            ends, lost = traces[label]
            for i, k in enumerate(sorted(by)):
                rs = by[k]
                w.writerow([label, k, int(any(r.extra.get("burst") for r in rs)), f"{ends[i]:.6g}",
                            *(f"{np.mean([getattr(r, a) for r in rs]):.6g}" for a in
                              ("round_latency_s", "up_latency_s", "down_latency_s", "up_passes", "down_passes")),
                            f"{lost[i]:.6g}"])


def build_parser() -> argparse.ArgumentParser:
    # the testbed's parser (its subcommands are of the same class): --version here, --config on run and sweep
    p = parser(prog="python -m dblp.sim", description=__doc__, config=False)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one configuration", formatter_class=HelpFormatter,
                       description="Simulate one configuration; print its summary and write records/plots.")
    add_config_flags(r)
    add_config_args(r)
    add_target_arg(r)
    add_convergence_args(r)
    add_sim_compensation_args(r)
    r.add_argument("--baseline", action="store_true", help="also run the baseline (fixed p = P_low, the paper's "
                                                           "compensation and stop rule) and compare")
    r.add_argument("--out", default=None, help="folder for params.json, records-*.jsonl, summary.json and plots")
    r.add_argument("--records", default=None,
                   help="JSONL file for the round records (without --out; a name ending .gz is gzip-compressed)")
    r.add_argument("--record-format", choices=RECORD_FORMATS, default="jsonl",
                   help="how --out keeps the round records, one per worker, role and iteration: jsonl, "
                        "jsonl.gz (gzip: 1/14 of the bytes at 64 workers, round level, 1/139 at 10,000 workers, class "
                        "level, where a run writes 0.7 GB of JSONL), or none (rounds.csv, summary.json and the "
                        "plots only)")
    r.add_argument("--summary", default=None, help="JSON file for the summary (without --out)")
    r.set_defaults(func=cmd_run)
    from dblp.sim.studies import calibrate
    from dblp.sim.studies import paperscale
    from dblp.sim.studies import sweep

    sweep.add_parser(sub)
    calibrate.add_parser(sub)
    paperscale.add_parser(sub)
    add_verbosity(p)  # -q/-v on every subcommand
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParameterError as exc:
        print(f"dblp.sim {args.cmd}: error: {name_flags(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out, --records, --summary that cannot be written
        print(f"dblp.sim {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"dblp.sim {args.cmd}: error: out of memory (--model, --workers or --iterations too large "
              "for this machine)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dblp.sim {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
