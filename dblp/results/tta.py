"""Which configuration reaches the target first: one table and one plot over seeds and conditions.

A faster round is not faster training, and one run is not evidence. This module reads the run
folders an emulation scenario wrote (:func:`dblp.results.trainreport.replicate_dir` per seed, a folder per
run, ``calm/`` for the runs without bursts) and puts, for every condition and run, the figures that
answer the question side by side, each as the median and the range over the seeds: retransmission
passes and send latency at the bursts, training time to the last iteration, time and iterations to
each target, final accuracy and the replicas' divergence. A run is *sooner than the baseline* on a
target only when its slowest seed reaches it before the baseline's fastest (the ranges do not
overlap); otherwise the table says the difference is inside the spread.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dblp.results.trainreport import (_target_label, final_metrics, load_training, replica_divergence, replicate_dir,
                          time_to_targets, training_time)
from dblp.results.stats import median_range

__all__ = ["collect", "answer_rows", "verdict_lines", "write_answer", "plot_answer"]

BASELINE = "baseline"


def collect(out: str | Path, names: Sequence[str], workers: int, seeds: Sequence[int], bursts: Sequence[int],
            targets: Sequence[float], calm: Sequence[str] = (), condition: str = "bursts") -> list[dict[str, Any]]:
    """One row per (condition, run, seed) with every figure of the answer (long form, JSON-safe).
    Reads the replicas' weight snapshots without removing them (the training report removes them)."""
    from dblp.results.analysis import summarize
    from dblp.results.runfolder import load

    out = Path(out)
    rows: list[dict[str, Any]] = []
    written = _written_divergence(out)  # a run reported before: its snapshots are gone, the CSV stays
    for sd in seeds:
        base = replicate_dir(out, sd, len(seeds))
        for cond, where, which, bs in ((condition, base, names, bursts), ("no bursts", base / "calm", calm, ())):
            for name in which:
                d = where / name
                run = load_training(d, workers)
                recs = load(d / "records")
                s = summarize(recs, list(bs))
                div = replica_divergence(d, workers, remove=False)
                row: dict[str, Any] = {
                    "condition": cond, "run": name, "seed": sd, "metric": run["metric"],
                    "passes_at_bursts": float(np.mean(s.passes_at_bursts)) if bs else math.nan,
                    "burst_round_s": float(np.nanmean(s.at_bursts)) if bs else math.nan,
                    "round_mean_s": s.mean, "train_s": training_time(run),
                    "final": float(np.mean(final_metrics(run))),
                    "divergence": div[-1]["divergence"] if div else
                    written.get((str(sd), name), math.nan) if cond == condition else math.nan,
                }
                for t, (it, sec) in time_to_targets(run, targets).items():
                    row[f"to_{t:g}_s"], row[f"to_{t:g}_iter"] = sec, it
                rows.append(row)
    return rows


def _written_divergence(out: Path) -> dict[tuple[str, str], float]:
    """(seed, run) -> the last epoch's divergence in a training report's ``divergence.csv`` (none: {})."""
    try:
        with open(out / "divergence.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return {}
    last: dict[tuple[str, str], float] = {}
    for r in rows:  # epochs in order: the last one stays
        last[(r.get("seed", "0"), r["run"])] = float(r["divergence"])
    return last


COLUMNS = (("passes_at_bursts", "passes @bursts", ".1f"), ("burst_round_s", "burst round (s)", ".3f"),
           ("round_mean_s", "mean round (s)", ".3f"), ("train_s", "to last iter (s)", ".1f"),
           ("final", "final", ".4f"), ("divergence", "divergence", ".3g"))


def answer_rows(rows: list[dict[str, Any]], targets: Sequence[float]) -> list[list[object]]:
    """The printed table: one line per condition and run, every figure a median [range] over seeds."""
    metric = rows[0]["metric"] if rows else "accuracy"
    head: list[object] = ["condition", "run", "seeds"] + [c[1] for c in COLUMNS[:4]]
    for t in targets:
        lab = _target_label(t, metric)
        head += [f"to {lab} (s)", f"to {lab} (iter)"]
    head += [c[1] for c in COLUMNS[4:]]
    table: list[list[object]] = [head]
    for cond, run in dict.fromkeys((r["condition"], r["run"]) for r in rows):
        rs = [r for r in rows if r["condition"] == cond and r["run"] == run]
        line: list[object] = [cond, run, len(rs)]
        line += [median_range([r[k] for r in rs], spec) for k, _, spec in COLUMNS[:4]]
        for t in targets:
            line += [median_range([r[f"to_{t:g}_s"] for r in rs], ".1f"),
                     median_range([r[f"to_{t:g}_iter"] for r in rs], ".0f")]
        line += [median_range([r[k] for r in rs], spec) for k, _, spec in COLUMNS[4:]]
        table.append(line)
    return table


def verdict_lines(rows: list[dict[str, Any]], targets: Sequence[float]) -> list[str]:
    """Per condition, target and run against the baseline: sooner or later beyond the seed spread
    (the ranges do not overlap), or inside it; with the median ratio of the times."""
    out = []
    for cond in dict.fromkeys(r["condition"] for r in rows):
        base = [r for r in rows if r["condition"] == cond and r["run"] == BASELINE]
        if not base:
            continue
        for t in targets:
            key = f"to_{t:g}_s"
            b = [r[key] for r in base]
            for run in dict.fromkeys(r["run"] for r in rows if r["condition"] == cond and r["run"] != BASELINE):
                v = [r[key] for r in rows if r["condition"] == cond and r["run"] == run]
                mb, mv = float(np.median(b)), float(np.median(v))
                ratio = mb / mv if math.isfinite(mb) and math.isfinite(mv) and mv > 0 else math.nan
                if max(v) < min(b):
                    word = "SOONER than the baseline beyond the seed spread"
                elif min(v) > max(b):
                    word = "LATER than the baseline beyond the seed spread"
                else:
                    word = "inside the seed spread of the baseline"
                speed = f"{ratio:.2f}x the baseline's speed" if math.isfinite(ratio) else "a side never reached it"
                out.append(f"  {cond}, to {_target_label(t, rows[0]['metric'])}: {run} {word} ({speed}, medians)")
    return out


def write_answer(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """The long-form rows as CSV (one line per condition, run and seed)."""
    path = Path(path)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return path


def plot_answer(path: str | Path, rows: list[dict[str, Any]], target: float, title: str) -> Path:
    """Time to ``target`` per run and condition: each seed a dot, the median a bar, the final metric
    written beside it; a run that never reached the target is drawn at the right edge as 'never'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = f"to_{target:g}_s"
    conds = list(dict.fromkeys(r["condition"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    finite = [r[key] for r in rows if math.isfinite(r[key])] or [1.0]
    edge = max(finite) * 1.15
    fig, axes = plt.subplots(1, len(conds), figsize=(max(8.0, 5.2 * len(conds)), 0.55 * len(runs) + 2.0),
                             squeeze=False, sharey=True)
    for ax, cond in zip(axes[0], conds):
        for y, run in enumerate(runs):
            rs = [r for r in rows if r["condition"] == cond and r["run"] == run]
            if not rs:
                continue
            xs = [r[key] if math.isfinite(r[key]) else edge for r in rs]
            med = float(np.median([r[key] for r in rs]))
            color = "tab:gray" if run == BASELINE else "tab:blue"
            ax.barh(y, min(med, edge), color=color, alpha=0.35, height=0.6)
            ax.plot(xs, [y] * len(xs), "o", color=color, ms=5)
            fin = float(np.median([r["final"] for r in rs]))
            ax.text(edge * 1.01, y, f"final {fin:.3f}", va="center", fontsize=8)
        b = [r[key] for r in rows if r["condition"] == cond and r["run"] == BASELINE]
        if b and all(math.isfinite(x) for x in b):
            ax.axvspan(min(b), max(b), color="tab:gray", alpha=0.12, label="baseline's seed range")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xlim(0, edge * 1.25)
        ax.axvline(edge, color="k", lw=0.5, ls=":")
        ax.set_title(cond, fontsize=10)
        ax.set_xlabel(f"training time to {_target_label(target, rows[0]['metric'])} (s; dotted line: never)")
        ax.set_yticks(range(len(runs)), runs, fontsize=8)
        ax.invert_yaxis()
    import textwrap

    fig.suptitle("\n".join(textwrap.fill(line, 90) for line in title.split("\n")), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def report(out: str | Path, names: Sequence[str], workers: int, seeds: Sequence[int], bursts: Sequence[int],
           targets: Sequence[float], *, calm: Sequence[str] = (), condition: str = "bursts",
           setup: str = "") -> list[dict[str, Any]]:
    """Print the answer table and its verdicts; write ``answer.csv`` and ``answer.png`` into ``out``."""
    from dblp.results.analysis import format_table

    out = Path(out)
    rows = collect(out, names, workers, seeds, bursts, targets, calm=calm, condition=condition)
    n = len(seeds)
    print(f"\nWhich configuration reaches the target first ({n} seed{'s' * (n > 1)}; median [min-max] over seeds; "
          f"times are training time, evaluation excluded):")
    print(format_table(answer_rows(rows, targets)))
    if n > 1:
        print("\n".join(verdict_lines(rows, targets)))
    write_answer(out / "answer.csv", rows)
    if targets:
        plot_answer(out / "answer.png", rows, max(targets), f"Time to the target per configuration\n{setup}")
    print(f"wrote {out}/answer.csv{', answer.png' if targets else ''}")
    return rows


def report_folder(out: str | Path) -> list[dict[str, Any]]:
    """:func:`report` for a finished microburst or trace-replay run folder, from its ``config.json``."""
    import json

    out = Path(out)
    try:
        cfg = json.loads((out / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{out}: not a run folder with a readable config.json ({exc})") from None
    der = cfg.get("derived", {})
    train = der.get("train")
    if not train:
        raise ValueError(f"{out}: not a training run (no workload): no accuracy to reach")
    policies = list(der.get("policy_list", []))
    labels = [c[0] for c in der.get("config_list", [])]
    bursts = list(der.get("bursts_list", []))
    seeds = list(range(int(cfg.get("seed", 0)), int(cfg.get("seed", 0)) + int(cfg.get("seeds", 1))))
    calm = [n for n in ("baseline", "dblp") if n in policies] + labels \
        if bursts and not cfg.get("no-calm") and (out / "calm").exists() or \
        (out / f"seed{seeds[0]}" / "calm").exists() and not cfg.get("no-calm") else []
    from dblp.results.analysis import bursts_text

    cond = f"bursts at {bursts_text(bursts)}" if bursts else "replayed trace"
    setup = f"{train['workload']}, {cfg.get('workers')} workers, {cond}"
    return report(out, policies + labels, int(cfg.get("workers", 3)), seeds, bursts, train.get("targets", []),
                  calm=calm, condition=cond, setup=setup)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dblp.results.tta RUN_FOLDER...``: the answer table of finished run folders."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m dblp.results.tta",
                                 description="Which configuration reaches the target accuracy first: the table "
                                             "(median [min-max] over seeds) and answer.csv/answer.png of finished "
                                             "microburst or trace_replay run folders.")
    ap.add_argument("folders", nargs="+", help="run folders (results/microburst-...) with config.json")
    a = ap.parse_args(argv)
    for f in a.folders:
        try:
            report_folder(f)
        except ValueError as exc:
            print(f"python -m dblp.results.tta: error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
