"""Analysis and plots of per-round records, shared by every view.

Loopback, Mininet emulation, the simulator and real hosts all write
:class:`dblp.records.RoundRecord` JSONL; everything here reads that and
nothing else, so a table or a plot means the same whichever view made it.

The paper's Table II reports the workers' *send latency* (the upstream
DBLP_SEND time): at each burst iteration, its maximum ("tail") and its mean.
We take, per round, the slowest worker's value (a synchronous step waits for
the slowest) and also report p99.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .records import RoundRecord, read_records


def predicted_passes(loss: float, tolerance: float, chunks: int | None = None, max_passes: int = 1000) -> int:
    """Passes a sender needs when every pass loses ``loss`` of what it sends:
    the smallest k with 1 - loss**k >= 1 - tolerance (paper V-B arithmetic:
    at 70% loss, 0.8% needs 14 passes and 40.8% needs 3). With ``chunks``
    given, the chunk count rounds the allowance (p = 0 then needs the
    expected missing count n * loss**k below half a chunk, not zero)."""
    if loss <= 0:
        return 1
    if loss >= 1:
        return max_passes
    if chunks:
        from .policy import needed_chunks

        allowed = chunks - needed_chunks(chunks, tolerance)
        for k in range(1, max_passes + 1):
            if chunks * loss**k <= allowed + 0.5:
                return k
        return max_passes
    for k in range(1, max_passes + 1):
        if 1 - loss**k >= 1 - tolerance - 1e-12:
            return k
    return max_passes


def load(paths: str | Path | Iterable[str | Path]) -> list[RoundRecord]:
    if isinstance(paths, (str, Path)):
        p = Path(paths)
        paths = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    out: list[RoundRecord] = []
    for p in paths:
        out.extend(read_records(p))
    return out


def per_round(records: Sequence[RoundRecord], field: str = "up_latency_s", role: str = "worker",
              agg: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """(rounds, value) with one value per round: the slowest worker's by default."""
    by: dict[int, list[float]] = {}
    for r in records:
        if r.role == role:
            v = getattr(r, field) if hasattr(r, field) else r.extra.get(field, math.nan)
            by.setdefault(r.round, []).append(float(v))
    rounds = np.array(sorted(by))
    f = {"max": np.nanmax, "mean": np.nanmean, "min": np.nanmin}[agg]
    vals = np.array([f(by[k]) for k in rounds]) if rounds.size else np.array([])
    return rounds, vals


@dataclass
class LatencySummary:
    at_bursts: list[float]
    tail_max: float
    p99: float
    p50: float
    mean: float
    passes_at_bursts: list[int]
    recv_frac_min: float

    def as_dict(self) -> dict:
        return dict(vars(self))


def summarize(records: Sequence[RoundRecord], bursts: Sequence[int] = (), field: str = "up_latency_s",
              skip_first: int = 1) -> LatencySummary:
    """Table II's quantities. ``skip_first`` rounds are warm-up (connection, first-touch)."""
    rounds, lat = per_round(records, field)
    keep = rounds >= skip_first
    r_all, l_all = rounds, lat
    rounds, lat = rounds[keep], lat[keep]
    _, passes = per_round(records, "up_passes")
    pass_by = dict(zip(r_all.tolist(), passes.tolist()))
    lat_by = dict(zip(r_all.tolist(), l_all.tolist()))
    _, frac = per_round(records, "up_frac", agg="min")
    return LatencySummary(
        at_bursts=[lat_by.get(b, math.nan) for b in bursts],
        tail_max=float(np.max(lat)) if lat.size else math.nan,
        p99=float(np.percentile(lat, 99)) if lat.size else math.nan,
        p50=float(np.median(lat)) if lat.size else math.nan,
        mean=float(np.mean(lat)) if lat.size else math.nan,
        passes_at_bursts=[int(pass_by.get(b, 0)) for b in bursts],
        recv_frac_min=float(np.nanmin(frac)) if frac.size else math.nan,
    )


def table_ii(base: LatencySummary, dblp: LatencySummary, bursts: Sequence[int]) -> list[list[str]]:
    """Rows of the paper's Table II for this run: DBLP, baseline, speedup."""
    head = ["Latency (s)"] + [f"Burst {i + 1} (iter {b})" for i, b in enumerate(bursts)] + ["Tail (max)", "p99", "Average"]
    d = dblp.at_bursts + [dblp.tail_max, dblp.p99, dblp.mean]
    b = base.at_bursts + [base.tail_max, base.p99, base.mean]
    sp = [bb / dd if dd and dd > 0 else math.nan for bb, dd in zip(b, d)]
    return [head, ["DBLP"] + [f"{x:.4f}" for x in d], ["Baseline"] + [f"{x:.4f}" for x in b],
            ["Speedup"] + [f"{x:.2f}x" for x in sp]]


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_latency(series: dict[str, Sequence[RoundRecord]], path: str | Path, bursts: Sequence[int] = (),
                 title: str = "Send latency per iteration", field: str = "up_latency_s") -> Path:
    """Fig. 2 style: latency per iteration for each labelled run, bursts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for label, recs in series.items():
        r, v = per_round(recs, field)
        ax.plot(r, v * 1e3, lw=1.0, label=label)
    for i, b in enumerate(bursts):
        ax.axvline(b, color="red", ls=":", lw=1, label="burst" if i == 0 else None)
    ax.set_xlabel("iteration")
    ax.set_ylabel("latency (ms, slowest worker)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_cdf(series: dict[str, Sequence[RoundRecord]], path: str | Path, title: str = "CDF of send latency",
             field: str = "up_latency_s") -> Path:
    """Fig. 3 style: the latency distribution and its tail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, recs in series.items():
        _, v = per_round(recs, field)
        v = np.sort(v[np.isfinite(v)])
        if v.size:
            ax.step(v * 1e3, np.arange(1, v.size + 1) / v.size, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, slowest worker)")
    ax.set_ylabel("fraction of iterations")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
