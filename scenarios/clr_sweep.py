"""The critical-regime detector's eta x freq swept in Mininet: what each setting costs and saves.

    sudo python scenarios/clr_sweep.py                  # 6 settings x 2 seeds + the baseline: ~25 min on 2 cores

DBLP keeps P_low while the averaged gradient's norm changes by at least
``eta`` (relative) at a check every ``freq`` iterations, and trains at P_high
otherwise (paper Algorithm 3). This runs real training workers on the
microburst star (``scenarios/microburst.py``'s network, a shortened default:
84 iterations = 6 epochs of digits_mlp, one 70% burst at iteration 50) once
with the baseline (fixed p = P_low) and once per (eta, freq) with DBLP, for
each seed (interleaved), and prints per setting the share of iterations in
the critical regime, the training time and the time to each target accuracy,
each divided by the same seed's baseline, and the final accuracy: medians with
95% intervals (dblp.results.stats). Written to ``results/clr_sweep-<time>/``:
``sweep.csv`` (every run), ``sweep_table.csv``, ``sweep.png`` (the
trade-off against eta, a line per freq) and ``clr.png`` (the default
setting's first run: gradient norm, each check's decision, accuracy;
``python -m dblp.results.clrview`` draws it for any run), plus ``curves.csv`` for the
simulator's convergence model.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

from dblp.results import analysis
from dblp.cli.args import (add_burst_args, add_run_args, add_seeds_arg, add_workload_args, check_scenario_args,
                          parser)
from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ
from traces.argtypes import int_list_arg


def float_list(text: str) -> list[float]:
    """``type=`` for ``--etas``: a comma list of non-negative numbers."""
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of numbers, e.g. 0.1,0.25,0.5") from None
    if any(x < 0 or x != x for x in v) or len(set(v)) != len(v):
        raise argparse.ArgumentTypeError(f"{text!r}: thresholds are distinct numbers >= 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    ap = parser(description="Sweep DBLP's CLR detector (eta x freq) with real training in Mininet.")
    add_run_args(ap, iterations=84, policies="baseline", results=_bootstrap.ROOT / "results")
    add_workload_args(ap, default="digits_mlp")
    add_burst_args(ap, bursts="50")
    ap.add_argument("--etas", type=float_list, default="0.1,0.25,0.5",
                    help="CLR thresholds to sweep (relative change of the gradient norm; comma list)")
    ap.add_argument("--freqs", type=int_list_arg(1), default="5,10",
                    help="CLR check periods to sweep, in iterations (comma list)")
    ap.add_argument("--report-only", default=None, metavar="FOLDER",
                    help="no runs: print the tables and redraw the figures of a finished sweep's results folder "
                         "(its config.json gives the settings)")
    add_seeds_arg(ap, default=2)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    a = ap.parse_args(argv)
    check_scenario_args(ap, a)
    if a.train is None:
        ap.error("--workload none: the sweep measures accuracy, it needs a training workload")
    if len(set(a.freqs)) != len(a.freqs):
        ap.error(f"argument --freqs: {','.join(map(str, a.freqs))} names a check period twice")
    if a.policy_list != ["baseline"]:
        ap.error(f"--policies {a.policies}: the sweep's reference run is the baseline alone (--policies baseline)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report_only:
        return report_only(Path(a.report_only))
    if os.geteuid() != 0:
        print("clr_sweep.py needs root for Mininet: run it as `sudo python scenarios/clr_sweep.py`", file=sys.stderr)
        return 2
    from dblp.results.clrview import variant_label
    from emulation.bursts import bursts_from_spec
    from emulation.launch import run_replicates
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from emulation.recorder import RunRecorder
    from topologies.star import StarTopo

    rec = RunRecorder("clr_sweep", dict(vars(a)), root=a.results)
    out = rec.path
    settings = [(e, f) for f in a.freqs for e in a.etas]
    seeds = list(range(a.seed, a.seed + a.seeds))
    t = a.train
    print(f"clr_sweep: {t['workload']} ({t['epochs']} epochs of {t['iterations_per_epoch']} iterations), "
          f"{a.workers} workers, {a.bw_mbps:g} Mbit/s, {a.burst_loss:.0%} bursts at {a.bursts_list}; "
          f"eta {a.etas} x freq {a.freqs}, {len(seeds)} seeds: {len(seeds) * (1 + len(settings))} runs\n"
          f"  results: {out}", flush=True)
    schedule = bursts_from_spec({"kind": "iteration_bursts", "at": a.bursts_list, "loss": a.burst_loss},
                                rounds=a.iterations, seed=a.seed)
    topo = StarTopo(n=a.workers, bw=a.bw_mbps, buffer_bytes=a.queue)
    t0 = time.time()
    with EmuNet(topo, name="clr_sweep", mtu=a.mtu) as net, LossController(net) as lc:
        rec.snapshot("start", net=net, loss=lc)
        py = str(_bootstrap.VENV_PY if _bootstrap.VENV_PY.exists() else sys.executable)
        run_replicates(a, net, lc, out, schedule, policies=["baseline"], seeds=seeds, python=py,
                       variants=[(variant_label(e, f), {"eta": e, "freq": f}) for e, f in settings],
                       env={"PYTHONPATH": str(_bootstrap.ROOT)})
        rec.finish(net=net, loss=lc)
    report(a, out, seeds, settings, f"{time.time() - t0:.0f} s")
    return 0


def report_only(out: Path) -> int:
    """Tables and figures of a finished sweep from its folder (``config.json``: the flags it ran with)."""
    try:
        cfg = json.loads((out / "config.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"clr_sweep.py: error: --report-only {out}: no readable config.json of a sweep ({exc})", file=sys.stderr)
        return 2
    a = argparse.Namespace(**cfg)
    seeds = list(range(a.seed, a.seed + a.seeds))
    report(a, out, seeds, [(e, f) for f in a.freqs for e in a.etas], "report only")
    return 0


def report(a: argparse.Namespace, out: Path, seeds: list[int], settings: list[tuple[float, int]], took: str) -> None:
    """Print the sweep's table; write sweep.csv, sweep_table.csv, sweep.png, clr.png and curves.csv."""
    from dblp.results.clrview import norm_trace, plot_detector, plot_sweep, sweep_table, variant_label
    from dblp.results.trainreport import load_training, replicate_dir, run_curve, write_curves

    t = a.train
    rows, long = sweep_table(out, seeds, settings, a.workers, t["targets"])
    print(f"\nCLR sweep ({len(seeds)} seeds; median [95% interval of the mean]; ratios to the same seed's baseline; "
          f"{took}):")
    print(analysis.format_table(rows))
    with open(out / "sweep_table.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(long[0]))
        w.writeheader()
        w.writerows(long)
    bursts = f"{a.burst_loss:.0%} bursts at {','.join(map(str, a.bursts_list))}" if a.bursts_list else "no bursts"
    setup = f"{t['workload']}, {a.workers} workers, {a.iterations} iterations, {bursts}, {len(seeds)} seeds"
    plot_sweep(long, out / "sweep.png", t["targets"], f"DBLP's CLR detector swept ({setup})", metric=t["metric"])
    d0 = replicate_dir(out, seeds[0], len(seeds))
    show = variant_label(DEFAULT_ETA, DEFAULT_FREQ) if (DEFAULT_ETA, DEFAULT_FREQ) in settings \
        else variant_label(*settings[0])
    eta, freq = next((e, f) for e, f in settings if variant_label(e, f) == show)
    norms, clr = norm_trace(analysis.load(d0 / show / "records"))
    plot_detector(norms, clr, run_curve(load_training(d0 / show, a.workers)), out / "clr.png", eta=eta, freq=freq,
                  metric=t["metric"], targets=t["targets"], title=f"CLR detector, {show}, seed {seeds[0]} ({setup})")
    write_curves(out / "curves.csv", [(label, sd, replicate_dir(out, sd, len(seeds)) / label,
                                       load_training(replicate_dir(out, sd, len(seeds)) / label, a.workers))
                                      for sd in seeds for label in ["baseline"] + [variant_label(*s) for s in settings]])
    print(f"\nwrote {out}/sweep.csv, sweep_table.csv, sweep.png, clr.png, curves.csv")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\nclr_sweep.py: interrupted; the emulated network was torn down (partial results stay in the run "
              "folder)", file=sys.stderr)
        sys.exit(130)
