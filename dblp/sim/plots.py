"""PNG plots of simulator runs and sweeps (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dblp.results.analysis import BURST_COLOR, RUN_COLORS
from dblp.protocol.records import RoundRecord


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors():
    import matplotlib.colors

    return matplotlib.colors


def _per_round(recs: list[RoundRecord], attr: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean over workers of a worker-record attribute, per round."""
    by: dict[int, list[float]] = {}
    for r in recs:
        if r.role == "worker":
            by.setdefault(r.round, []).append(getattr(r, attr))
    rounds = np.array(sorted(by))
    return rounds, np.array([np.mean(by[k]) for k in rounds])


def plot_run(runs: dict[str, list[RoundRecord]], out: Path) -> None:
    """latency.png (send and round latency per iteration) and cdf.png (round latency CDF)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for label, recs in runs.items():
        for ax, attr, name in ((axes[0], "up_latency_s", "send (upstream) latency"),
                               (axes[1], "round_latency_s", "round latency")):
            x, y = _per_round(recs, attr)
            ax.plot(x, y * 1e3, lw=0.8, label=label, color=RUN_COLORS.get(label))
            ax.set_ylabel(f"{name} (ms)")
        bursts = sorted({r.round for r in recs if r.role == "worker" and r.extra.get("burst")})
        for b in bursts:
            for ax in axes:
                ax.axvline(b, color=BURST_COLOR, alpha=0.25, lw=3)
    axes[0].legend()
    axes[1].set_xlabel("iteration (orange: burst)")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, recs in runs.items():
        v = np.sort([r.round_latency_s for r in recs if r.role == "worker"]) * 1e3
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label, color=RUN_COLORS.get(label))
    ax.set_xlabel("round latency (ms)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "cdf.png", dpi=120)
    plt.close(fig)


def plot_time_to_accuracy(runs: dict[str, tuple[Sequence[float], dict]], bursts: Sequence[int], target: float,
                          out: Path, title: str = "") -> Path:
    """time.png: each run's simulated time at the end of every iteration, and where it reaches ``target``
    accuracy (the convergence model's ``iterations_to_accuracy`` / ``time_to_accuracy_s`` of its summary; a
    dashed line where that lies past the simulated iterations and was extrapolated). Why beside latency.png:
    a policy that shortens rounds by letting gradient go needs more iterations, and only this view shows
    both at once."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, (ends, s) in runs.items():
        color = RUN_COLORS.get(label)
        x = np.arange(1, len(ends) + 1)
        ax.plot(x, ends, lw=1.2, color=color, label=f"{label}: simulated")
        it, tta = s.get("iterations_to_accuracy", math.nan), s.get("time_to_accuracy_s", math.nan)
        if math.isfinite(it) and math.isfinite(tta):
            if it > len(ends):
                ax.plot([len(ends), it], [ends[-1], tta], ls="--", lw=1.0, color=color)
            ax.plot([it], [tta], marker="*", ms=12, color=color, ls="none",
                    label=f"{label}: {target:.0%} accuracy at iteration {it:.0f}, {tta:,.0f} s"
                    + (" (extrapolated)" if it > len(ends) else ""))
    for b in bursts:
        ax.axvline(b + 1, color=BURST_COLOR, alpha=0.3, lw=2)
    ax.set_xlabel("iterations done (orange: the end of a burst iteration)")
    ax.set_ylabel("simulated time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = out / "time.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def heatmap(grid: np.ndarray, xs: list, ys: list, xlabel: str, ylabel: str, title: str, ax, fmt: str = "{:.3g}",
            cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None, norm=None,
            cbar_label: str = "", ci: np.ndarray | None = None) -> None:
    """One annotated heatmap; ``vmin``/``vmax`` (or ``norm``) let panels share a colour scale.

    ``ci``: 95% half-widths, written under each cell's value ("+-h") so the reader sees which differences
    the seeds support. Non-finite cells (a target never reached) are blank and labelled "never" when
    infinite."""
    for i, j in zip(*np.nonzero(np.isinf(grid))):
        ax.text(j, i, "never", ha="center", va="center", fontsize=7, color="black")
    grid = np.where(np.isfinite(grid), grid, np.nan)
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap=cmap, norm=norm,
                   **({} if norm is not None else {"vmin": vmin, "vmax": vmax}))
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isfinite(grid[i, j]):
                r, g, b, _ = im.cmap(im.norm(grid[i, j]))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # text colour by the cell's own luminance
                text = fmt.format(grid[i, j])
                if ci is not None and np.isfinite(ci[i, j]):
                    text += "\n\u00b1" + fmt.format(ci[i, j])
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if norm is not None:  # a log colour scale labelled in plain numbers (0.8, 1, 1.25), not powers of ten
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        cb.ax.yaxis.set_major_formatter(ScalarFormatter())
        cb.ax.yaxis.set_minor_formatter(NullFormatter())
        cb.set_ticks([t for t in (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0) if norm.vmin <= t <= norm.vmax])
    if cbar_label:
        cb.set_label(cbar_label, fontsize=8)


#: the sweep table's per-seed comparison column of each metric (dblp.sim.studies.sweep._row): its mean over seeds and
#: its 95% half-width are what the comparison panel shows
_COMPARISON = {"mean_round_s": "speedup_mean", "p99_round_s": "speedup_p99",
               "time_to_train_s": "speedup_time_to_train", "time_to_accuracy_s": "speedup_time_to_accuracy",
               "lost": "lost_extra", "lost_applied": "lost_applied_extra"}


def _cell_grids(rows: list[dict], col: str, x: str, y: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``col`` per (y, x) cell over ``rows``, and its 95% half-width (``col_ci95``) where a cell is one
    grid point (a mean of several points has no one interval: NaN)."""
    g = np.full((len(ys), len(xs)), np.nan)
    h = np.full_like(g, np.nan)
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            cell = [r for r in rows if r[x] == xv and r[y] == yv and col in r]
            if cell:
                g[i, j] = float(np.mean([float(r[col]) for r in cell]))
                if len(cell) == 1 and cell[0].get(f"{col}_ci95") not in (None, ""):
                    h[i, j] = float(cell[0][f"{col}_ci95"])
    return g, h


def plot_sweep(rows: list[dict], x: str, y: str, out: Path, *, z: str | None = None,
               averaged: Sequence[str] = (), target_accuracy: float | None = None,
               convergence: str = "digits_mlp") -> list[Path]:
    """One PNG per metric: DBLP, baseline and their comparison (ratio baseline / DBLP, or difference), as
    small multiples - one row of panels per value of the third axis ``z`` - each cell annotated with its
    mean over seeds and, with ``--seeds`` > 1, its 95% half-width.

    Why small multiples: averaging over a third axis (the burst rate) hides that DBLP's benefit depends on
    it. Axes beyond x, y and z that vary (``averaged``, the caller's: the table does not say which columns
    are axes) are still averaged, and the title says over which. The comparison
    panel shows the sweep's per-seed comparison (mean of the seeds' ratios, with its interval), not the
    ratio of the two means. A cell whose runs never reach the target accuracy is infinite: blank, "never",
    and left out of the colour scale. Returns the PNGs written (heatmap_<metric>.png)."""
    plt = _plt()
    xs = sorted({r[x] for r in rows})
    ys = sorted({r[y] for r in rows})
    zs = sorted({r[z] for r in rows}) if z else [None]
    acc = f"{target_accuracy:.0%}" if target_accuracy is not None else "the target"
    metrics = [
        ("mean_round_s", "mean round latency (s)", "ratio"),
        ("p99_round_s", "p99 round latency (s)", "ratio"),
        ("time_to_train_s", "time to train (s)", "ratio"),
        ("time_to_accuracy_s", f"time to {acc} accuracy (s, {convergence})", "ratio"),
        ("lost_applied", "applied gradient lost (1 - up x down, the model's f)", "diff"),
        ("lost", "fraction of gradient lost (mean of up and down)", "diff"),
    ]
    metrics = [m for m in metrics if f"dblp_{m[0]}" in rows[0]]
    if any(m[0] == "lost_applied" for m in metrics):  # the model's own terms replace the mean of up and down
        metrics = [m for m in metrics if m[0] != "lost"]
    paths = []
    for m, title, mode in metrics:
        per_z = []
        for zv in zs:
            sub = [r for r in rows if z is None or r[z] == zv]
            grids = {who: _cell_grids(sub, f"{who}_{m}", x, y, xs, ys) for who in ("dblp", "base")}
            cmp_col = _COMPARISON[m]
            if cmp_col in rows[0]:
                comp = _cell_grids(sub, cmp_col, x, y, xs, ys)
            else:  # an older table without the per-seed column: the ratio (difference) of the means
                with np.errstate(invalid="ignore", divide="ignore"):
                    g = (grids["base"][0] / grids["dblp"][0] if mode == "ratio"
                         else grids["dblp"][0] - grids["base"][0])
                comp = (g, np.full_like(g, np.nan))
            if mode == "ratio":
                comp[0][np.isinf(grids["base"][0]) & np.isinf(grids["dblp"][0])] = np.nan  # neither reaches it
            per_z.append((zv, grids, comp))
        both = np.concatenate([g[who][0].ravel() for _, g, _ in per_z for who in ("dblp", "base")])
        both = both[np.isfinite(both)]
        lo, hi = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
        base_all = np.concatenate([g["base"][0].ravel() for _, g, _ in per_z])
        flat = bool(np.isfinite(base_all).any()) and np.nanmax(base_all) - np.nanmin(base_all) <= 1e-9 * max(
            1.0, abs(np.nanmax(base_all)))
        comps = np.concatenate([c[0].ravel() for _, _, c in per_z])
        if mode == "ratio":
            span = float(np.nanmax(np.abs(np.log(comps[np.isfinite(comps) & (comps > 0)])), initial=0.05))
        else:
            span = float(np.nanmax(np.abs(comps[np.isfinite(comps)]), initial=1e-3))
        # a baseline that does not depend on the axes is one number, not a third of the figure
        ncol = 2 if flat else 3
        fig, axes = plt.subplots(len(zs), ncol, figsize=(5.4 * ncol, 4.3 * len(zs)), squeeze=False)
        for row_axes, (zv, grids, comp) in zip(axes, per_z):
            at = "" if z is None else f" [{z} = {zv}]"
            base_note = f" (baseline everywhere: {np.nanmax(base_all):.3g})" if flat else ""
            heatmap(grids["dblp"][0], xs, ys, x, y, f"DBLP{at}{base_note}", row_axes[0], vmin=lo, vmax=hi,
                    ci=grids["dblp"][1])
            if not flat:
                heatmap(grids["base"][0], xs, ys, x, y, f"baseline (fixed p = P_low){at}", row_axes[1],
                        vmin=lo, vmax=hi, ci=grids["base"][1])
            if mode == "ratio":
                heatmap(comp[0], xs, ys, x, y, f"baseline / DBLP{at}\n(> 1, red: DBLP better; < 1, blue: worse)",
                        row_axes[-1], fmt="{:.2f}", cmap="RdBu_r", ci=comp[1],
                        norm=_colors().LogNorm(vmin=np.exp(-span), vmax=np.exp(span)), cbar_label="ratio (log scale)")
            else:
                heatmap(comp[0], xs, ys, x, y, f"DBLP - baseline{at}\n(> 0, red: DBLP loses more)", row_axes[-1],
                        fmt="{:.3f}", cmap="RdBu_r", vmin=-span, vmax=span, ci=comp[1])
        seeds = rows[0].get("seeds", 1)
        evidence = (f"cells: mean over {seeds} seeds \u00b1 95% half-width" if int(seeds) > 1
                    else "cells: one seed each (no interval; --seeds N gives them)")
        rest = f"; mean over {', '.join(averaged)}" if averaged else ""
        fig.suptitle(f"{title} over {y} x {x}" + (f", one row per {z}" if z else "") + f" ({evidence}{rest})",
                     fontsize=10)
        fig.tight_layout()
        path = out / f"heatmap_{m}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _measured_band(ax, runs: Sequence, color, *, alpha: float) -> np.ndarray:
    """Measured accuracy of one setting's seeds: min-max band and mean dots, in percent.

    The convergence figure shows every fitted curve against the runs it was fitted or held out on,
    and the spread of the seeds is the evidence a reader weighs the model's error against; returns
    the iterations the runs were evaluated at."""
    x = np.array(runs[0].iterations)
    acc = np.array([c.accuracy for c in runs]) * 100
    ax.fill_between(x, acc.min(0), acc.max(0), color=color, alpha=alpha, lw=0)
    ax.plot(x, acc.mean(0), "o", ms=2.5, color=color)
    return x


def plot_phase_convergence(groups: dict, phase: dict, uniform: dict, path: Path, scatter: dict,
                           shown: Sequence[str] = ("clean", "crit 0.5", "calm 0.5", "const 0.4")) -> Path:
    """The phase-aware convergence model (:mod:`dblp.sim.convergence.phase`) against held-out runs.

    Top row, per workload: measured seed-mean accuracy (dots, band: min-max over seeds) of ``shown``
    schedules with the phase-aware model (solid) and the uniform control (dashed), each seed predicted with
    its own regime labels and averaged. Bottom row: iterations to 80% and 90% predicted against measured for
    every held-out schedule (and emulated runs), both models, with the +-20% band - the error a time to
    accuracy inherits. ``scatter``: workload -> rows of :func:`dblp.sim.convergence.curve.crossings` with ``set``
    (held-out, emulated) and ``kind`` (phase-aware, uniform) added."""
    plt = _plt()
    names = [w for w in groups if w in phase]
    fig, axes = plt.subplots(2, len(names), figsize=(6.2 * len(names), 9.5), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for col, wl in enumerate(names):
        ax = axes[0][col]
        curves = groups[wl]
        for j, name in enumerate(shown):
            runs = [c for c in curves if c.setting == name]
            if not runs:
                continue
            color = "black" if name == "clean" else cmap(0.1 + 0.75 * j / max(1, len(shown) - 1))
            _measured_band(ax, runs, color, alpha=0.12)
            for model, style in ((phase[wl], "-"), (uniform[wl], "--")):
                pred = np.mean([model.curve(c.fractions(), c.critical()) for c in runs], axis=0) * 100
                ax.plot(np.arange(pred.size), pred, style, lw=1.1, color=color,
                        label=f"{name} ({len(runs)} seeds)" if style == "-" else None)
        ax.axhline(80, color="grey", lw=0.6, ls=":")
        ax.axhline(90, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{wl}, held-out schedules (crit / calm: loss only in / outside DBLP's CLR)\n"
                     f"dots: measured mean, band: min-max over seeds; solid: phase-aware model, dashed: uniform",
                     fontsize=8)
        ax.set_xlabel("iteration")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(0, max(c.iterations[-1] for c in curves))
        ax.set_ylim(0, 100)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        ax = axes[1][col]
        hi = 1.0
        rows_all = [r for r in scatter.get(wl, []) if np.isfinite(r["measured"]) and np.isfinite(r["model"])]
        for label, marker in (("held-out", "o"), ("emulated", "s")):
            for mname, color in (("phase-aware", "tab:red"), ("uniform", "tab:blue")):
                rows = [r for r in rows_all if r["set"] == label and r["kind"] == mname]
                for t, fill in ((0.8, "none"), (0.9, color)):
                    pts = [(r["measured"], r["model"]) for r in rows if r["target"] == t]
                    if pts:
                        mx, my = zip(*pts)
                        hi = max(hi, *mx, *my)
                        ax.scatter(mx, my, marker=marker, s=30, edgecolors=color, facecolors=fill,
                                   label=f"{label}, {mname}, to {t:.0%}")
        xs = np.array([0.0, hi * 1.1])
        ax.plot(xs, xs, color="black", lw=0.8)
        ax.fill_between(xs, xs * 0.8, xs * 1.2, color="grey", alpha=0.15, lw=0, label="+-20%")
        ax.set_xlim(0, hi * 1.1)
        ax.set_ylim(0, hi * 1.1)
        ax.set_xlabel("measured iterations to the target (seed-mean curve, at its evaluations)")
        ax.set_ylabel("model's iterations to the target")
        ax.set_title(f"{wl}: iterations to 80% (open) and 90% (filled), model against measured", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle("Phase-aware convergence model (dblp.sim.convergence.phase): 3 workers x batch 32, a fraction of "
                 "each iteration's gradient zeroed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
