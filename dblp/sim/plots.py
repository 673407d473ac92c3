"""PNG plots of simulator runs and sweeps (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..records import RoundRecord


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
            ax.plot(x, y * 1e3, lw=0.8, label=label)
            ax.set_ylabel(f"{name} (ms)")
        bursts = sorted({r.round for r in recs if r.role == "worker" and r.extra.get("burst")})
        for b in bursts:
            for ax in axes:
                ax.axvline(b, color="red", alpha=0.15, lw=3)
    axes[0].legend()
    axes[1].set_xlabel("iteration (red: burst)")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, recs in runs.items():
        v = np.sort([r.round_latency_s for r in recs if r.role == "worker"]) * 1e3
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
    ax.set_xlabel("round latency (ms)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "cdf.png", dpi=120)
    plt.close(fig)


def heatmap(grid: np.ndarray, xs: list, ys: list, xlabel: str, ylabel: str, title: str, ax, fmt: str = "{:.3g}",
            cmap: str = "viridis") -> None:
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap=cmap)
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    lo, hi = np.nanmin(grid) if np.isfinite(grid).any() else 0, np.nanmax(grid) if np.isfinite(grid).any() else 1
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isfinite(grid[i, j]):
                bright = (grid[i, j] - lo) / (hi - lo) > 0.6 if hi > lo else False
                ax.text(j, i, fmt.format(grid[i, j]), ha="center", va="center", fontsize=7,
                        color="black" if bright else "white")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def plot_sweep(rows: list[dict], x: str, y: str, out: Path) -> list[Path]:
    """One PNG per metric: DBLP, baseline, and their ratio (or difference), averaged over the other axes."""
    plt = _plt()
    xs = sorted({r[x] for r in rows})
    ys = sorted({r[y] for r in rows})
    metrics = [
        ("mean_round_s", "mean round latency (s)", "ratio"),
        ("p99_round_s", "p99 round latency (s)", "ratio"),
        ("time_to_train_s", "time to train (s)", "ratio"),
        ("lost", "fraction of gradient lost", "diff"),
    ]
    paths = []
    for m, title, mode in metrics:
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
        grids = {}
        for who in ("dblp", "base"):
            g = np.full((len(ys), len(xs)), np.nan)
            for i, yv in enumerate(ys):
                for j, xv in enumerate(xs):
                    v = [r[f"{who}_{m}"] for r in rows if r[x] == xv and r[y] == yv]
                    if v:
                        g[i, j] = float(np.mean(v))
            grids[who] = g
        heatmap(grids["dblp"], xs, ys, x, y, f"DBLP: {title}", axes[0])
        heatmap(grids["base"], xs, ys, x, y, f"baseline (fixed p = P_low): {title}", axes[1])
        if mode == "ratio":
            heatmap(grids["base"] / grids["dblp"], xs, ys, x, y, f"baseline / DBLP: {title}", axes[2],
                    fmt="{:.2f}", cmap="magma")
        else:
            heatmap(grids["dblp"] - grids["base"], xs, ys, x, y, f"DBLP - baseline: {title}", axes[2],
                    fmt="{:.3f}", cmap="magma")
        fig.suptitle(f"{title} over {y} x {x} (mean over the other axes)", fontsize=10)
        fig.tight_layout()
        path = out / f"heatmap_{m}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
