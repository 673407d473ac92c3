#!/usr/bin/env python3
"""Phase sensitivity of gradient loss: the paper's Fig. 1 experiment on a small CNN and digits.

The paper (section II-C) trained for nine epochs split into an early phase
(epochs 1-3) and a middle+final phase (epochs 4-9), zeroed 40% or 80% of the
received gradients in one of the two phases only, and found that loss early
slows convergence far more than loss late.  This scenario repeats that design
on the shipped data set so it runs anywhere in minutes:

* workload: ``small_cnn`` on scikit-learn's digits (1437 train / 360 test);
* loss: :class:`dblp.train.exchange.DropExchange` zeroes exactly
  ``round(f * chunks)`` random 362-float chunks (one 1500-byte DBLP datagram
  each) of the averaged gradient in every iteration of the chosen phase;
* settings: no drop, and each drop fraction in the early phase only or in the
  late (middle+final) phase only; every setting runs ``--seeds`` times with
  the same seeds (model init and data order), so settings differ only in the
  drop;
* metric: test accuracy after every epoch (and before training).

Outputs (``--out``, default ``results/phase_sensitivity``): ``runs.csv`` (one
row per setting, seed and epoch), ``summary.csv`` and ``summary.json`` (per
setting: final accuracy mean/std, mean accuracy over all epochs, accuracy at
the end of the early phase), ``phase_sensitivity.png`` (mean accuracy curves
with a band of one standard deviation), and a table on stdout ending with the
measured early-vs-late verdict.

Hyper-parameters: the small CNN's own defaults (SGD lr 0.05, momentum 0.9,
batch 32), with which a clean run reaches ~98% in 5-9 epochs; they were not
tuned to make either phase look worse.  The verdict compares early and late
drop on two measures, paired by seed: final accuracy (lasting damage) and
mean accuracy over all epochs (slower convergence).  What it measured on
this machine is in ``dblp/train/RESULTS.md``; ``--lr 0.01`` shows a
regime where training is still far from converged at epoch 9.

Usage:  python scenarios/phase_sensitivity.py [--seeds 5] [--drops 0.4 0.8] [--lr 0.05] [--out DIR]
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv; the repository on sys.path)

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _reexec_into_venv() -> None:
    """Run under the project's .venv (it has torch) when started with another Python."""
    venv_py = ROOT / ".venv" / "bin" / "python"
    if venv_py.exists() and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve() and not os.environ.get("DBLP_NO_REEXEC"):
        os.environ["DBLP_NO_REEXEC"] = "1"
        os.execv(str(venv_py), [str(venv_py), *sys.argv])


if __name__ == "__main__":
    _reexec_into_venv()
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402

from traces.argtypes import count_arg, float_arg  # noqa: E402
from dblp.cli.args import parser  # noqa: E402
from dblp.cli.progress import Progress  # noqa: E402
from dblp.cli.provenance import write_config  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class Setting:
    name: str
    phase: str  # "none" | "early" | "late"
    drop: float


def settings_for(drops: list[float]) -> list[Setting]:
    out = [Setting("no drop", "none", 0.0)]
    for phase in ("late", "early"):
        for d in drops:
            out.append(Setting(f"{phase} {round(d * 100)}%", phase, d))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(description="Paper Fig. 1: drop gradient chunks only in the early or only in the late "
                           "training phase and compare test accuracy (small CNN on digits, CPU).")
    p.add_argument("--epochs", type=count_arg(2), default=9, help="total epochs")
    p.add_argument("--early-epochs", type=count_arg(1), default=3, help="length of the early phase; the rest is 'late'")
    p.add_argument("--drops", type=float_arg(0.0, 1.0), nargs="+", default=[0.4, 0.8], help="fractions of chunks zeroed")
    p.add_argument("--seeds", type=count_arg(1), default=5, help="runs per setting (seeds 0..N-1)")
    p.add_argument("--lr", type=float_arg(0.0, lo_open=True), default=0.05, help="SGD learning rate (the small CNN's default)")
    p.add_argument("--momentum", type=float_arg(0.0, 1.0, hi_open=True), default=0.9, help="SGD momentum")
    p.add_argument("--batch-size", type=count_arg(1), default=32, help="per-worker mini-batch")
    p.add_argument("--workers", type=count_arg(1), default=1, help="simulated data-parallel workers")
    p.add_argument("--chunk-floats", type=count_arg(1), default=None,
                   help="floats per chunk (default: one 1500-byte datagram)")
    p.add_argument("--threads", type=count_arg(1), default=1, help="torch CPU threads (1 is fastest for this tiny model on a shared CPU)")
    p.add_argument("--out", default=str(ROOT / "results" / "phase_sensitivity"), help="folder of this run's files")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    a = p.parse_args(argv)
    if not 0 < a.early_epochs < a.epochs:
        p.error(f"argument --early-epochs: {a.early_epochs} must be between 1 and --epochs - 1 ({a.epochs - 1})")
    return a


def compare(early: list[float], late: list[float]) -> dict:
    """Late minus early (positive: the early-phase drop did more harm), with its standard error.

    Runs with the same seed share model init and data order, so the gap is
    taken per seed (paired) and its standard error from the paired differences.
    """
    diffs = [lt - et for et, lt in zip(early, late)]
    gap = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    clear = len(diffs) > 1 and abs(gap) > 2 * se
    worse = "early" if gap > 0 else "late"
    if gap == 0:
        verdict = "no difference"
    elif clear:
        verdict = f"{worse}-phase drop hurts more (clear: > 2 s.e.)"
    else:
        verdict = f"no significant difference (within 2 s.e.; {worse} worse by the mean)"
    return {"late_minus_early": gap, "std_error": se, "clear": clear, "early_hurts_more": gap > 0, "verdict": verdict}


def run(args: argparse.Namespace) -> dict:
    import torch

    from dblp.train import DropExchange, TrainConfig, get_workload, iterations_per_epoch, phase_fraction, train
    from dblp.train.exchange import CHUNK_FLOATS

    torch.set_num_threads(args.threads)
    chunk = args.chunk_floats or CHUNK_FLOATS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, args)  # the resolved flags, commit and package versions (--config takes it back)
    settings = settings_for(args.drops)
    rows: list[dict] = []
    curves: dict[str, list[list[float]]] = {s.name: [] for s in settings}
    total = len(settings) * args.seeds
    t0 = time.perf_counter()
    progress = Progress(total, what="run", unit="run", out=(lambda _line: None) if args.quiet else None)  # -q
    n = 0
    for seed in range(args.seeds):
        for s in settings:
            wl = get_workload("small_cnn", seed=seed)
            cfg = TrainConfig.for_workload(
                wl, epochs=args.epochs, lr=args.lr, momentum=args.momentum, batch_size=args.batch_size,
                sim_workers=args.workers, seed=seed, eval_at_start=True, device="cpu",
            )
            ipe = iterations_per_epoch(wl, cfg)
            if s.phase == "early":
                frac = phase_fraction(s.drop, 0, args.early_epochs, ipe)
            elif s.phase == "late":
                frac = phase_fraction(s.drop, args.early_epochs, args.epochs, ipe)
            else:
                frac = 0.0
            ex = DropExchange(frac, chunk_floats=chunk, seed=10_000 + seed)
            summary = train(wl, ex, cfg)
            dropped = sum(r["chunks_dropped"] for r in summary.iteration_records)
            chunks = summary.iteration_records[0]["chunks"] * summary.iterations
            accs = [e["accuracy"] for e in summary.epoch_records]
            curves[s.name].append(accs)
            for e in summary.epoch_records:
                rows.append({
                    "setting": s.name, "phase": s.phase, "drop": s.drop, "seed": seed, "epoch": e["epoch"],
                    "accuracy": e["accuracy"], "test_loss": e["test_loss"], "train_loss": e["train_loss"],
                })
            n += 1
            print(f"  seed {seed} {s.name:<9} final acc {accs[-1]:.4f} (dropped {dropped}/{chunks} chunks, "
                  f"{summary.wall_s:.1f} s)", flush=True)
            progress.update(n, force=True)

    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    summary_rows = []
    for s in settings:
        c = curves[s.name]
        finals = [r[-1] for r in c]
        aucs = [statistics.fmean(r[1:]) for r in c]  # mean accuracy over epochs 1..E
        ends = [r[args.early_epochs] for r in c]
        summary_rows.append({
            "setting": s.name, "phase": s.phase, "drop": s.drop, "runs": len(c),
            "final_acc_mean": statistics.fmean(finals),
            "final_acc_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "mean_acc_over_epochs": statistics.fmean(aucs),
            f"acc_after_epoch_{args.early_epochs}": statistics.fmean(ends),
            "final_accs": finals,
            "mean_accs": aucs,
        })
    with open(out / "summary.csv", "w", newline="") as fh:
        skip = ("final_accs", "mean_accs")
        w = csv.DictWriter(fh, fieldnames=[k for k in summary_rows[0] if k not in skip])
        w.writeheader()
        for r in summary_rows:
            w.writerow({k: v for k, v in r.items() if k not in skip})

    verdicts = []
    by = {(r["phase"], r["drop"]): r for r in summary_rows}
    for d in args.drops:
        e, l = by[("early", d)], by[("late", d)]
        verdicts.append({
            "drop": d,
            "final_accuracy": compare(e["final_accs"], l["final_accs"]),
            "mean_accuracy_over_epochs": compare(e["mean_accs"], l["mean_accs"]),
        })
    result = {
        "config": {k: v for k, v in vars(args).items()},
        "chunk_floats": chunk,
        "settings": summary_rows,
        "verdicts": verdicts,
        "wall_s": time.perf_counter() - t0,
    }
    with open(out / "summary.json", "w") as fh:
        json.dump(result, fh, indent=2)
    if not args.no_plot:
        plot(curves, settings, args, out / "phase_sensitivity.png")
    return result


def plot(curves: dict[str, list[list[float]]], settings: list[Setting], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"none": "black", "early": "tab:red", "late": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    idx = {"early": 0, "late": 0}
    for s in settings:
        a = np.array(curves[s.name]) * 100
        x = np.arange(a.shape[1])
        ls = "-" if s.phase == "none" else styles[idx[s.phase] % len(styles)]
        if s.phase != "none":
            idx[s.phase] += 1
        m, sd = a.mean(0), a.std(0)
        ax.plot(x, m, ls, color=colors[s.phase], label=s.name, marker="o", ms=3)
        ax.fill_between(x, m - sd, m + sd, color=colors[s.phase], alpha=0.08)
        late = x >= max(args.early_epochs, args.epochs - 3)
        zoom.errorbar(x[late] + 0.04 * (settings.index(s) - 2), m[late], yerr=sd[late], fmt=ls, color=colors[s.phase],
                      marker="o", ms=3, capsize=2, label=s.name)
    ax.axvspan(0, args.early_epochs, color="tab:red", alpha=0.05)
    ax.axvline(args.early_epochs, color="grey", lw=0.8)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Gradient-chunk drop in early (epochs 1-{args.early_epochs}) vs late phase\n"
                 f"small CNN on digits, {args.seeds} seeds, mean ± std")
    ax.set_ylim(bottom=max(0, ax.get_ylim()[0]))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    zoom.set_title(f"zoom: epochs {max(args.early_epochs, args.epochs - 3)}-{args.epochs} (mean ± std)")
    zoom.set_xlabel("epoch")
    zoom.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    zoom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(result: dict, args: argparse.Namespace) -> None:
    e = args.early_epochs
    print()
    print(f"{'setting':<10} {'final acc % (mean ± std)':>25} {'mean acc % ep 1-' + str(args.epochs):>18} {'acc % after ep ' + str(e):>18}")
    for r in result["settings"]:
        print(
            f"{r['setting']:<10} {r['final_acc_mean'] * 100:>17.2f} ± {r['final_acc_std'] * 100:<5.2f}"
            f" {r['mean_acc_over_epochs'] * 100:>18.2f} {r[f'acc_after_epoch_{e}'] * 100:>18.2f}"
        )
    print()
    for v in result["verdicts"]:
        for key, label in (("final_accuracy", "final accuracy"), ("mean_accuracy_over_epochs", "mean accuracy over epochs")):
            c = v[key]
            print(
                f"drop {round(v['drop'] * 100)}%, {label:<26}: late - early = {c['late_minus_early'] * 100:+6.2f} points "
                f"(paired s.e. {c['std_error'] * 100:.2f}) -> {c['verdict']}"
            )
    print(f"\nwall time {result['wall_s']:.0f}s; results in {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
