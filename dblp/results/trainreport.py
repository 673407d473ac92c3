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
  unless the run used the ``intersect`` consistency mode (dblp.protocol.session S7);
* :func:`table_iv` / :func:`table_v`: the paper's Tables IV (final test
  metric per policy, mean and per worker) and V (training time normalised to
  DBLP's, beside the time to each target accuracy, also normalised to DBLP's);
* :func:`run_curve` / :func:`time_to_targets`: a run's test metric against its
  training clock (``evals.jsonl``: every N iterations and at epoch ends), and the
  iteration and time at which it first reaches each target - with DBLP a run
  can finish its iterations sooner and still reach 94% later;
* :func:`report` with ``seeds``: ``--seeds N`` runs of every policy summed up
  (:func:`dblp.results.analysis.replicate_table`): medians with 95% intervals of every
  Table IV/V figure and whether DBLP's difference to the baseline exceeds the
  spread;
* :func:`write_curves`: the runs as the convergence model's curve file
  (:func:`dblp.sim.convergence.runs.load_curves` reads it);
* :func:`plot_training_time` (Fig. 5) and :func:`plot_curves` (Fig. 6: the
  metric against epoch and against training time), every replicate drawn.

Time to a target (:func:`time_to_targets`): the metric of a run at an
evaluation is the mean over its workers (their replicas may differ), its time
the slowest worker's training clock (``train_s``: time in the training loop,
evaluations excluded, the clock of Table V); the target is reached at the
first evaluation at or above it (at or below for perplexity), so the
resolution is the evaluation cadence; never reached: ``inf``, printed "not
reached".
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

from dblp.results.analysis import RUN_COLORS

__all__ = ["load_training", "replica_divergence", "table_iv", "table_v", "plot_training_time", "plot_curves",
           "report", "run_curve", "curve_band", "first_reach", "time_to_targets", "replicate_dir", "write_curves",
           "higher_is_better"]


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
    return {"summaries": sums, "epochs": epochs, "metric": sums[0]["metric"],
            "evals": [_evals(d / f"w{i}", ep) for i, ep in enumerate(epochs)]}


def _evals(w: Path, epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A worker's evaluations (``evals.jsonl``); a run from before that file: its epoch ends, the
    training clock summed from ``epoch_wall_s``."""
    try:
        return [json.loads(line) for line in open(w / "evals.jsonl") if line.strip()]
    except OSError:
        clock, out = 0.0, []
        for e in epochs:
            clock += float(e.get("epoch_wall_s", 0.0))
            if e.get("iterations"):
                out.append({**e, "iteration": e["iterations"], "train_s": clock})
        return out


def higher_is_better(metric: str) -> bool:
    """Accuracy rises, perplexity falls."""
    return metric != "perplexity"


def run_curve(run: dict[str, Any]) -> list[tuple[int, float, float]]:
    """``(iteration, train_s, metric)`` at every iteration all workers evaluated: the mean of their
    metrics and the slowest worker's training clock."""
    metric = run["metric"]
    by: list[dict[int, dict[str, Any]]] = [{int(r["iteration"]): r for r in ev if r.get(metric) is not None}
                                           for ev in run["evals"]]
    common = sorted(set.intersection(*(set(b) for b in by))) if by else []
    return [(k, max(float(b[k]["train_s"]) for b in by), float(np.mean([float(b[k][metric]) for b in by])))
            for k in common]


def first_reach(curve: Sequence[tuple[int, float, float]], target: float, higher: bool = True) -> tuple[float, float]:
    """``(iteration, seconds)`` of the first point of ``curve`` at or beyond ``target`` (``higher``:
    at or above); ``(inf, inf)`` when no point is."""
    for k, t, v in curve:
        if (v >= target) if higher else (v <= target):
            return float(k), t
    return math.inf, math.inf


def time_to_targets(run: dict[str, Any], targets: Sequence[float]) -> dict[float, tuple[float, float]]:
    """target -> ``(iteration, seconds)`` of :func:`first_reach` on :func:`run_curve`."""
    curve, up = run_curve(run), higher_is_better(run["metric"])
    return {t: first_reach(curve, t, up) for t in targets}


def _target_label(t: float, metric: str) -> str:
    return f"{t:.0%}" if metric == "accuracy" and round(t * 100, 6) == round(t * 100) else f"{t:g}"


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


def final_metrics(run: dict[str, Any]) -> list[float]:
    """Each worker's test metric after the last epoch (nan where missing)."""
    return [float(s["final_metric"]) if s.get("final_metric") is not None else math.nan for s in run["summaries"]]


def table_iv(runs: dict[str, dict[str, Any]]) -> list[list[object]]:
    """Rows of Table IV: final test metric per run (mean of the workers, and each worker)."""
    workers = max(len(r["summaries"]) for r in runs.values())
    metric = next(iter(runs.values()))["metric"]
    rows: list[list[object]] = [["run", f"{metric} (mean)"] + [f"worker {i}" for i in range(workers)]]
    for name, r in runs.items():
        f = final_metrics(r)
        rows.append([name, float(np.mean(f))] + f)
    return rows


def training_time(run: dict[str, Any]) -> float:
    """A run's training time: the slowest worker's time in its training loops (evaluation excluded)."""
    return max(float(s["train_s"]) for s in run["summaries"])


def table_v(runs: dict[str, dict[str, Any]], label: str = "", targets: Sequence[float] = ()) -> list[list[object]]:
    """Rows of Table V: training time (to the last iteration) and exchange time per run, normalised
    to ``dblp``'s (``label`` is appended to each run's name), then per target the time to reach it,
    normalised to DBLP's time to it, and its iteration (``inf``: not reached; a ratio with a side
    that never reached it: nan)."""
    ref = training_time(runs["dblp"]) if "dblp" in runs else math.nan
    metric = next(iter(runs.values()))["metric"]
    head: list[object] = ["run", "train time (s)", "exchange (s)", "time / dblp"]
    for t in targets:
        lab = _target_label(t, metric)
        head += [f"to {lab} (s)", f"to {lab} / dblp", f"to {lab} (iter)"]
    rows: list[list[object]] = [head]
    tt = {name: time_to_targets(r, targets) for name, r in runs.items()}
    for name, r in runs.items():
        t = training_time(r)
        ex = max(float(s.get("exchange_s", math.nan)) for s in r["summaries"])
        row: list[object] = [f"{name}{label}", t, ex, t / ref]
        for tg in targets:
            it, sec = tt[name][tg]
            dref = tt["dblp"][tg][1] if "dblp" in tt else math.nan
            ratio = sec / dref if math.isfinite(sec) and math.isfinite(dref) and dref > 0 else math.nan
            row += [sec, ratio, int(it) if math.isfinite(it) else it]
        rows.append(row)
    return rows


def print_table(rows: Sequence[Sequence[object]], spec: str = ".2f") -> str:
    """:func:`dblp.results.analysis.format_table` with an infinite time or iteration written "not reached"."""
    from dblp.results.analysis import format_table

    return format_table([[("not reached" if isinstance(c, float) and math.isinf(c) else c) for c in r]
                         for r in rows], spec)


def replicate_dir(out: str | Path, seed: int, n_seeds: int) -> Path:
    """Where seed ``seed``'s runs go: ``out`` itself with one seed (the layout of a plain run),
    ``out/seed<seed>/`` with replicates."""
    return Path(out) if n_seeds <= 1 else Path(out) / f"seed{seed}"


def _as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def _bar_positions(conditions: dict[str, dict[str, Any]], width: float) -> dict[tuple[int, str], float]:
    """x of each (condition index, run name) bar: the runs present under a condition, centred on its
    tick - a run absent there (e.g. ``reliable`` has no no-bursts run) leaves no empty slot."""
    pos: dict[tuple[int, str], float] = {}
    for i, runs in enumerate(conditions.values()):
        names = list(runs)
        for j, n in enumerate(names):
            pos[(i, n)] = i + (j - (len(names) - 1) / 2) * width
    return pos


def plot_training_time(conditions: dict[str, dict[str, Any]], path: str | Path, title: str) -> Path:
    """Fig. 5: training time per run, normalised to DBLP's under the same condition and seed
    (``conditions``: e.g. {"with bursts": runs, "no bursts": runs}, a run or a list of its
    replicates per name): a bar at the median, a dot per replicate, the median seconds at each bar's foot.
    Each condition's bars are centred on its tick (:func:`_bar_positions`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(n for runs in conditions.values() for n in runs))
    width = 0.8 / max(1, max(len(runs) for runs in conditions.values()))
    pos = _bar_positions(conditions, width)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    top = 1.0
    many = False
    for n in names:
        xs, ys, secs = [], [], []
        for i, runs in enumerate(conditions.values()):
            if n not in runs:
                continue
            reps = _as_list(runs[n])
            refs = _as_list(runs["dblp"]) if "dblp" in runs else [None] * len(reps)
            norm = [training_time(r) / (training_time(d) if d is not None else 1.0) for r, d in zip(reps, refs)]
            x = pos[(i, n)]
            xs.append(x)
            secs.append(float(np.median([training_time(r) for r in reps])))
            ys.append(float(np.median(norm)))
            if len(reps) > 1:
                many = True
                ax.scatter([x] * len(norm), norm, s=12, color="black", zorder=3)
                top = max([top, *norm])
        bars = ax.bar(xs, ys, width * 0.95, color=RUN_COLORS.get(n, "grey"), label=n)
        for b, sec in zip(bars, secs):
            ax.annotate(f"{sec:.0f} s", (b.get_x() + b.get_width() / 2, 0), ha="center", va="bottom",
                        fontsize=8, color="white", xytext=(0, 3), textcoords="offset points")  # clear of the dots
        top = max([top, *ys])
    ax.set_xticks(range(len(conditions)), list(conditions))
    ax.set_xlim(-0.5, len(conditions) - 0.5)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_ylabel("training time / DBLP's" + (" (bar: median,\ndot: one seed)" if many else ""))
    ax.set_ylim(0, top * 1.2)
    import textwrap

    ax.set_title("\n".join(w for line in title.splitlines() for w in textwrap.wrap(line, 90)), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def curve_band(reps: Sequence[dict[str, Any]]) -> list[tuple[int, float, float, float, float]]:
    """``(iteration, train_s, mean, lo, hi)`` of a run's replicates at the iterations all of them
    evaluated: ``mean`` the median over replicates of :func:`run_curve`'s mean of the workers (one
    replicate: that mean; Table IV's figure), ``train_s`` their median clock, ``lo``/``hi`` the
    lowest and highest single worker's metric over every replicate - the spread of the replicas
    (which drift apart with bounded loss, dblp.protocol.session S7) and of the seeds."""
    per: list[dict[int, tuple[float, float, float, float]]] = []
    for r in reps:
        metric = r["metric"]
        by = [{int(e["iteration"]): e for e in ev if e.get(metric) is not None} for ev in r["evals"]]
        common = set.intersection(*(set(b) for b in by)) if by else set()
        per.append({k: (max(float(b[k]["train_s"]) for b in by),
                        float(np.mean([float(b[k][metric]) for b in by])),
                        min(float(b[k][metric]) for b in by), max(float(b[k][metric]) for b in by))
                    for k in common})
    keys = sorted(set.intersection(*(set(p) for p in per))) if per else []
    return [(k, float(np.median([p[k][0] for p in per])), float(np.median([p[k][1] for p in per])),
             min(p[k][2] for p in per), max(p[k][3] for p in per)) for k in keys]


def plot_curves(runs: dict[str, Any], path: str | Path, title: str, targets: Sequence[float] = ()) -> Path:
    """Fig. 6: the test metric against iteration (left) and against the training clock (right): per
    run the mean over workers (what Table IV reports), the workers' range as a band
    (:func:`curve_band`); with several replicates (a list per name) one thin line per seed, the
    median of the seeds' means bold and the band over all seeds' workers; targets dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = _as_list(next(iter(runs.values())))[0]["metric"]
    n = max(len(_as_list(v)) for v in runs.values())
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.0), sharey=True)
    for name, reps in runs.items():
        reps = _as_list(reps)
        c = RUN_COLORS.get(name, None)
        band = curve_band(reps)
        if len(reps) > 1:
            for r in reps:
                cur = run_curve(r)
                for ax, x in ((a1, 0), (a2, 1)):
                    ax.plot([p[x] for p in cur], [p[2] for p in cur], color=c, lw=0.6, alpha=0.45)
        what = "mean of workers" + (f", median of {len(reps)} seeds" if len(reps) > 1 else "")
        spread = "range of workers" + (" and seeds" if len(reps) > 1 else "")
        for ax, x in ((a1, 0), (a2, 1)):
            xs = [p[x] for p in band]
            ax.fill_between(xs, [p[3] for p in band], [p[4] for p in band], color=c, alpha=0.18, lw=0,
                            label=f"{name}: {spread}" if ax is a1 else None)
            ax.plot(xs, [p[2] for p in band], color=c, lw=1.4, marker="o", ms=2,
                    label=f"{name} ({what})" if ax is a1 else None)
    for t in targets:
        for ax in (a1, a2):
            ax.axhline(t, color="black", lw=0.7, ls=":")
        a2.annotate(f"target {_target_label(t, metric)}", (1.0, t), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=7)
    a1.set_xlabel("iteration")
    a2.set_xlabel("training time (s; slowest worker, evaluations excluded)")
    a1.set_ylabel(f"test {metric}: mean of workers, band = range" + (f"\n{n} seeds, thin line: one seed" if n > 1 else ""))
    from matplotlib.ticker import MaxNLocator

    a1.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a1.legend(loc="lower right" if higher_is_better(metric) else "upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def report(out: str | Path, policies: Sequence[str], workers: int, setup: str, condition: str, *,
           divergence: bool = True, calm: Sequence[str] = (), targets: Sequence[float] = (),
           seeds: Sequence[int] = (0,)) -> None:
    """Print Tables IV and V (with time to each of ``targets``) and the replica divergence of the
    training runs ``out/<policy>/``, write them as CSV and Figs. 5 and 6 as PNG into ``out``.
    ``condition``: e.g. "with bursts at 50,110" (the rows of Table V); ``calm``: policies also run
    without bursts into ``out/calm/<policy>/`` (Table V's rows without bursts). With several
    ``seeds`` the runs of seed s are under ``out/seed<s>/`` (:func:`replicate_dir`): each seed's
    tables are written there, and the printed tables are medians with 95% intervals over the seeds."""
    from dblp.results.analysis import format_table, replicate_table, verdicts

    out = Path(out)
    n = len(seeds)
    per_seed: list[dict[str, dict[str, dict[str, Any]]]] = []
    for sd in seeds:
        d = replicate_dir(out, sd, n)
        conds = {condition: {name: load_training(d / name, workers) for name in policies}}
        if calm:
            conds["no bursts"] = {name: load_training(d / "calm" / name, workers) for name in calm}
        per_seed.append(conds)
    metric = per_seed[0][condition][policies[0]]["metric"]
    t4s, t5s = [], []
    for sd, conds in zip(seeds, per_seed):
        t4 = table_iv(conds[condition])
        t5 = [["condition"] + table_v(conds[condition], targets=targets)[0]] + \
             [[c] + row for c, rs in conds.items() for row in table_v(rs, targets=targets)[1:]]
        t4s.append(t4)
        t5s.append(t5)
        d = replicate_dir(out, sd, n)
        for fname, rows in (("table_iv.csv", t4), ("table_v.csv", t5)):
            with open(d / fname, "w", newline="") as fh:
                csv.writer(fh).writerows(rows)
    reached = f"; time to a target: first evaluation at or {'above' if higher_is_better(metric) else 'below'} it" \
        if targets else ""
    if n == 1:
        print(f"\nTable IV (this run, {condition}): final test {metric}")
        print(format_table(t4s[0]))
        print(f"\nTable V (this run): training time to the last iteration and to each target, normalised to DBLP "
              f"under the same condition{reached}")
        print(print_table(t5s[0], ".2f"))
    else:
        what = (f"median over {n} seeds [95% interval of the mean, Student t]; "
                f"paired differences per seed (interleaved runs)")
        t4r, t4l = replicate_table([[r[:2] for r in t] for t in t4s])
        t5r, t5l = replicate_table([[[" ".join(map(str, r[:2]))] + r[2:] for r in t] for t in t5s])
        print(f"\nTable IV ({n} seeds, {condition}): final test {metric} (mean of the workers), {what}")
        print(format_table(t4r))
        print("\n".join(verdicts(t4l, [t4r[0][1]], ("dblp", "baseline"))))
        print(f"\nTable V ({n} seeds): training time to the last iteration and to each target, normalised to DBLP "
              f"under the same condition and seed{reached}; {what}")
        print(format_table(t5r))
        cols = [c for c in t5r[0][1:] if c != "exchange (s)"]  # iterations too: the clock-free measure
        print("\n".join(verdicts(t5l, cols, ("dblp", "baseline"))))
        for fname, rows in (("table_iv_replicates.csv", t4l), ("table_v_replicates.csv", t5l)):
            with open(out / fname, "w", newline="") as fh:
                csv.writer(fh).writerows(rows)
        for fname, rows in (("table_iv.csv", t4r), ("table_v.csv", t5r)):
            with open(out / fname, "w", newline="") as fh:
                csv.writer(fh).writerows(rows)
    div_rows: list[list[object]] = [["seed", "run", "epoch", "divergence", "identical"]
                                    + [f"worker {i}" for i in range(workers)]]
    if divergence:
        for sd in seeds:
            d = replicate_dir(out, sd, n)
            for name in policies:
                for r in replica_divergence(d / name, workers):
                    div_rows.append([sd, name, r["epoch"], r["divergence"], r["identical"]] + r["metric"])
            for name in calm:
                replica_divergence(d / "calm" / name, workers)  # only to remove the snapshots
        last = {(row[0], row[1]): row for row in div_rows[1:]}
        print(f"\nReplica divergence after the last epoch (max over worker pairs of |w_i - w_j| / |w|; "
              f"per-worker {metric}):")
        print(format_table([div_rows[0]] + list(last.values()), ".3g"))
    if n == 1:
        div_rows = [r[1:] for r in div_rows]  # one seed: the columns of a plain run
    with open(out / "divergence.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(div_rows)
    conditions = {c: {name: [ps[c][name] for ps in per_seed] for name in per_seed[0][c]} for c in per_seed[0]}
    plot_training_time(conditions, out / "training_time.png", f"Training time, normalised to DBLP\n{setup}")
    plot_curves(conditions[condition], out / "accuracy.png", f"Test {metric} ({setup}, {condition})", targets)
    write_curves(out / "curves.csv", [(f"{c} {name}", sd, replicate_dir(out, sd, n) / ("" if c == condition
                                                                                       else "calm") / name, r)
                                      for sd, ps in zip(seeds, per_seed) for c, runs in ps.items()
                                      for name, r in runs.items()])
    print(f"\nwrote {out}/table_iv.csv, table_v.csv, divergence.csv, curves.csv, training_time.png, accuracy.png")


def write_curves(path: str | Path, runs: Sequence[tuple[str, int, Path, dict[str, Any]]]) -> Path:
    """The runs as the convergence model's curve file (:func:`dblp.sim.convergence.runs.load_curves`):
    one row per run and iteration, ``setting, seed, workers, batch_size, iteration, lost_fraction,
    train_s, accuracy``. ``lost_fraction`` of row ``i`` is the fraction of iteration ``i``'s averaged
    gradient that did not reach the workers (``1 - up * down`` over the workers, from the run's
    records: :func:`dblp.protocol.records.round_trace`), ``accuracy`` (the run's metric, mean of the
    workers) and ``train_s`` are filled where the run was evaluated after ``iteration`` iterations.
    ``runs``: (setting label, seed, run folder, :func:`load_training` result); the round records are
    read from the folder's ``records/`` (the emulation scenarios) or, without one, from the folder
    itself (``scenarios/train.py``'s loopback runs)."""
    from dblp.results.runfolder import load
    from dblp.protocol.records import round_trace

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["setting", "seed", "workers", "batch_size", "iteration", "lost_fraction", "train_s", "accuracy"])
        for setting, seed, d, run in runs:
            rdir = Path(d) / "records"
            _, lost = round_trace(load(rdir if rdir.is_dir() else Path(d)))
            evals = {k: (t, v) for k, t, v in run_curve(run)}
            batch = run["summaries"][0].get("config", {}).get("batch_size", "")
            for i in range(max(len(lost), max(evals, default=0) + 1)):
                t, v = evals.get(i, ("", ""))
                w.writerow([setting, seed, len(run["summaries"]), batch, i,
                            f"{lost[i]:.6f}" if i < len(lost) else "", t, v])
    return Path(path)
