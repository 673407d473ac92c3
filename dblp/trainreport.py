"""What real training runs under a network scenario tell: accuracy, training time, replica drift.

Reads what ``python -m dblp.train worker`` writes into each worker's folder
(``summary.json``, ``epochs.jsonl``, and with ``--save-weights`` the flat
weights after every epoch) - nothing here runs a network or a model, so the
emulation scenarios, real-host runs and tests share it:

* :func:`load_training`: one run's per-worker summaries and epoch rows;
* :func:`replica_divergence`: per epoch, the largest distance between two
  workers' weights relative to the mean weights' norm (exact, from the
  snapshots), and whether all replicas are bit-identical - with bounded-loss
  broadcasts each worker zero-fills its own lost chunks, so replicas drift
  unless the run used the ``intersect`` consistency mode (dblp.session S7);
* :func:`table_iv` / :func:`table_v`: the paper's Tables IV (final test
  metric per policy, mean and per worker) and V (training time normalised to
  DBLP's);
* :func:`plot_training_time` (Fig. 5) and :func:`plot_curves` (Fig. 6: the
  metric against epoch and against wall time).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .analysis import RUN_COLORS

__all__ = ["load_training", "replica_divergence", "table_iv", "table_v", "plot_training_time", "plot_curves",
           "report"]


def load_training(d: str | Path, workers: int) -> dict[str, Any]:
    """The run in ``d`` (workers' folders ``d/w<i>``): summaries, epoch rows, the metric's name."""
    d = Path(d)
    sums, epochs = [], []
    for i in range(workers):
        w = d / f"w{i}"
        try:
            sums.append(json.loads((w / "summary.json").read_text()))
            epochs.append([json.loads(line) for line in open(w / "epochs.jsonl") if line.strip()])
        except (OSError, ValueError) as exc:
            raise ValueError(f"{w}: no complete training result ({exc})") from None
    return {"summaries": sums, "epochs": epochs, "metric": sums[0]["metric"]}


def replica_divergence(d: str | Path, workers: int, *, remove: bool = True) -> list[dict[str, Any]]:
    """Per epoch: ``divergence`` = max over worker pairs of ||w_i - w_j|| / ||mean w||, ``identical``
    (every replica bit-equal), and each worker's test metric. ``remove``: delete the snapshots
    afterwards (about 4 bytes per parameter, per worker and epoch)."""
    d = Path(d)
    files = sorted((d / "w0" / "weights").glob("epoch*.npy"))
    run = load_training(d, workers)
    rows = []
    for f in files:
        e = int(f.stem.removeprefix("epoch"))
        ws = [np.load(d / f"w{i}" / "weights" / f.name).astype(np.float64) for i in range(workers)]
        ref = float(np.linalg.norm(np.mean(ws, axis=0))) or 1.0
        div = max((float(np.linalg.norm(a - b)) / ref for a, b in itertools.combinations(ws, 2)), default=0.0)
        same = all(np.array_equal(ws[0], w) for w in ws[1:])
        metric = [next((r.get(run["metric"]) for r in run["epochs"][i] if r.get("epoch") == e), None)
                  for i in range(workers)]
        rows.append({"epoch": e, "divergence": div, "identical": same, "metric": metric})
    if remove:
        for i in range(workers):
            shutil.rmtree(d / f"w{i}" / "weights", ignore_errors=True)
    return rows


def _final(run: dict[str, Any]) -> list[float]:
    return [float(s["final_metric"]) if s.get("final_metric") is not None else math.nan for s in run["summaries"]]


def table_iv(runs: dict[str, dict[str, Any]]) -> list[list[object]]:
    """Rows of Table IV: final test metric per run (mean of the workers, and each worker)."""
    workers = max(len(r["summaries"]) for r in runs.values())
    metric = next(iter(runs.values()))["metric"]
    rows: list[list[object]] = [["run", f"{metric} (mean)"] + [f"worker {i}" for i in range(workers)]]
    for name, r in runs.items():
        f = _final(r)
        rows.append([name, float(np.mean(f))] + f)
    return rows


def training_time(run: dict[str, Any]) -> float:
    """A run's training time: the slowest worker's time in its training loops (evaluation excluded)."""
    return max(float(s["train_s"]) for s in run["summaries"])


def table_v(runs: dict[str, dict[str, Any]], label: str = "") -> list[list[object]]:
    """Rows of Table V: training time and exchange time per run, normalised to ``dblp``'s
    (``label`` is appended to each run's name)."""
    ref = training_time(runs["dblp"]) if "dblp" in runs else math.nan
    rows: list[list[object]] = [["run", "train time (s)", "exchange (s)", "time / dblp"]]
    for name, r in runs.items():
        t = training_time(r)
        ex = max(float(s.get("exchange_s", math.nan)) for s in r["summaries"])
        rows.append([f"{name}{label}", t, ex, t / ref])
    return rows


def plot_training_time(conditions: dict[str, dict[str, dict[str, Any]]], path: str | Path, title: str) -> Path:
    """Fig. 5: training time per run, normalised to DBLP's under the same condition (``conditions``:
    e.g. {"with bursts": runs, "no bursts": runs}), the seconds written on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(n for runs in conditions.values() for n in runs))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    top = 1.0
    for j, n in enumerate(names):
        xs, ys, secs = [], [], []
        for i, runs in enumerate(conditions.values()):
            if n not in runs:
                continue
            ref = training_time(runs["dblp"]) if "dblp" in runs else 1.0
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            secs.append(training_time(runs[n]))
            ys.append(secs[-1] / ref)
        bars = ax.bar(xs, ys, width * 0.95, color=RUN_COLORS.get(n, "grey"), label=n)
        for b, sec in zip(bars, secs):
            ax.annotate(f"{sec:.0f} s", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
        top = max([top, *ys])
    ax.set_xticks(range(len(conditions)), list(conditions))
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_ylabel("training time / DBLP's")
    ax.set_ylim(0, top * 1.2)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_curves(runs: dict[str, dict[str, Any]], path: str | Path, title: str,
                bursts_s: Sequence[float] = ()) -> Path:
    """Fig. 6: worker 0's test metric against epoch (left) and against wall time (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = next(iter(runs.values()))["metric"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for name, r in runs.items():
        ep = [row for row in r["epochs"][0] if row.get(metric) is not None]
        c = RUN_COLORS.get(name, None)
        a1.plot([row["epoch"] for row in ep], [row[metric] for row in ep], marker="o", ms=3, color=c, label=name)
        a2.plot([row["elapsed_s"] for row in ep], [row[metric] for row in ep], marker="o", ms=3, color=c, label=name)
    from matplotlib.ticker import MaxNLocator

    a1.xaxis.set_major_locator(MaxNLocator(integer=True))
    a1.set_xlabel("epoch")
    a2.set_xlabel("wall time since the start of training (s)")
    a1.set_ylabel(f"test {metric} (worker 0)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a1.legend(loc="lower right" if metric == "accuracy" else "upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def report(out: str | Path, policies: Sequence[str], workers: int, setup: str, condition: str, *,
           divergence: bool = True, calm: Sequence[str] = ()) -> None:
    """Print Tables IV and V and the replica divergence of the training runs ``out/<policy>/``,
    write them as CSV and Figs. 5 and 6 as PNG into ``out``. ``condition``: e.g. "with bursts at
    50,110" (the rows of Table V); ``calm``: policies also run without bursts into
    ``out/calm/<policy>/`` (Table V's rows without bursts)."""
    from .analysis import format_table

    out = Path(out)
    runs = {name: load_training(out / name, workers) for name in policies}
    conditions = {condition: runs}
    if calm:
        conditions["no bursts"] = {name: load_training(out / "calm" / name, workers) for name in calm}
    metric = runs[policies[0]]["metric"]
    t4 = table_iv(runs)
    t5 = [["condition"] + table_v(runs)[0]] + [[c] + row for c, rs in conditions.items() for row in table_v(rs)[1:]]
    print(f"\nTable IV (this run, {condition}): final test {metric}")
    print(format_table(t4))
    print("\nTable V (this run): training time, normalised to DBLP under the same condition")
    print(format_table(t5, ".2f"))
    div_rows: list[list[object]] = [["run", "epoch", "divergence", "identical"]
                                    + [f"worker {i}" for i in range(workers)]]
    if divergence:
        for name in policies:
            for r in replica_divergence(out / name, workers):
                div_rows.append([name, r["epoch"], r["divergence"], r["identical"]] + r["metric"])
        for name in calm:
            replica_divergence(out / "calm" / name, workers)  # only to remove the snapshots
        last = {row[0]: row for row in div_rows[1:]}
        print(f"\nReplica divergence after the last epoch (max over worker pairs of |w_i - w_j| / |w|; "
              f"per-worker {metric}):")
        print(format_table([div_rows[0]] + list(last.values()), ".3g"))
    for fname, rows in (("table_iv.csv", t4), ("table_v.csv", t5), ("divergence.csv", div_rows)):
        with open(out / fname, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    plot_training_time(conditions, out / "training_time.png", f"Training time, normalised to DBLP\n{setup}")
    plot_curves(runs, out / "accuracy.png", f"Test {metric} ({setup}, {condition})")
    print(f"\nwrote {out}/table_iv.csv, table_v.csv, divergence.csv, training_time.png, accuracy.png")
