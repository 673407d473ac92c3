"""Analysis and plots of per-round records, shared by every view.

Loopback, Mininet emulation, the simulator and real hosts all write
:class:`dblp.protocol.records.RoundRecord` JSONL; everything here reads that and
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
from typing import Sequence

import numpy as np

from dblp.protocol.records import RoundRecord
from dblp.results.runfolder import load, load_run, run_config  # noqa: F401  (analysis.load: the scenarios' name)


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
    # a round none of whose records carries the field is NaN (numpy would warn on the all-NaN slice)
    vals = np.array([f(v) if not np.isnan(v := np.asarray(by[k])).all() else math.nan for k in rounds])
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


def table_ii(base: LatencySummary, dblp: LatencySummary, bursts: Sequence[int]) -> list[list]:
    """Rows of the paper's Table II for this run: DBLP, baseline, speedup (baseline / DBLP).

    Cells are numbers (seconds; the speedup a plain ratio) so a CSV of these rows is numeric;
    :func:`format_table` formats them for printing."""
    head = ["Latency (s)"] + [f"Burst {i + 1} (iter {b})" for i, b in enumerate(bursts)] + ["Tail (max)", "p99", "Average"]
    d = dblp.at_bursts + [dblp.tail_max, dblp.p99, dblp.mean]
    b = base.at_bursts + [base.tail_max, base.p99, base.mean]
    sp = [bb / dd if dd and dd > 0 else math.nan for bb, dd in zip(b, d)]
    return [head, ["DBLP"] + d, ["Baseline"] + b, ["Speedup (x)"] + sp]


def bursts_text(bursts: Sequence[int]) -> str:
    """The iterations a burst hits, as a table or a title says them: a short list as it is, an evenly
    spaced long one as its step and span (``every 25 from 25 to 1175 (47)``), so a label fits a line."""
    b = [int(x) for x in bursts]
    steps = {y - x for x, y in zip(b, b[1:])}
    if len(b) >= 5 and len(steps) == 1 and steps.pop() > 0:
        return f"every {b[1] - b[0]} from {b[0]} to {b[-1]} ({len(b)})"
    return ",".join(map(str, b))


def format_cell(v: object, spec: str = ".4f") -> str:
    """A table cell as text: strings as they are, numbers with ``spec``, NaN/None as ``-``."""
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (bool, int, np.integer)):
        return str(v)
    return format(float(v), spec)


#: one colour per run in every figure of the project (tab10 colours)
RUN_COLORS: dict[str, str] = {"dblp": "#1f77b4", "baseline": "#d62728", "reliable": "#7f7f7f", "fixed": "#d62728"}
#: the burst markers' colour: one no run uses (tab10 orange), so a marker never reads as a run's line
BURST_COLOR = "#ff7f0e"


def run_style(label: str) -> dict[str, object]:
    """Line colour and style of a labelled run: colour by its policy (:data:`RUN_COLORS`), and in a
    comparison (labels ``A:dblp``, ``B:dblp``) run A solid, run B dashed, so each policy keeps its
    colour in every view."""
    side, _, run = label.rpartition(":")
    return {"color": RUN_COLORS.get(run), "ls": "--" if side == "B" else "-"}


def format_table(rows: Sequence[Sequence[object]], spec: str = ".4f") -> str:
    """Aligned text of ``rows`` (the first is the header); numeric cells formatted with ``spec``."""
    rows = [[format_cell(c, spec) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def replicate_table(tables: Sequence[Sequence[Sequence[object]]], label_cols: int = 1,
                     compare: tuple[str, str] | None = ("dblp", "baseline")) -> tuple[list[list[object]], list]:
    """Replicates of one table (same rows and columns, one table per seed) summed up.

    Returns the printed table (each numeric cell: ``median [95% interval of the mean]``, "not
    reached" when the median is infinite, with how many seeds reached it) and the long rows
    ``[row label, column, n, median, mean, lo, hi, min, max, <compare> diff, half-width, beyond
    spread]`` for a CSV. ``compare``: the two row labels (first label column, e.g. "dblp" and
    "baseline") whose per-seed difference is tested for every column."""
    from dblp.results.stats import paired_ci95, spread

    head = list(tables[0][0])
    out: list[list[object]] = [head]
    long: list[list[object]] = [["row", "column", "n", "median", "mean", "ci95_lo", "ci95_hi", "min", "max",
                                 "paired_diff", "paired_halfwidth", "beyond_spread"]]
    label = lambda row: " ".join(str(c) for c in row[:label_cols])  # noqa: E731
    keys = [label(r) for r in tables[0][1:]]

    def values(key: str, j: int) -> list[float]:
        vals = []
        for t in tables:
            row = next((r for r in t[1:] if label(r) == key), None)
            v = row[j] if row is not None else math.nan
            vals.append(float(v) if isinstance(v, (int, float, np.floating, np.integer)) else math.nan)
        return vals

    for key, row0 in zip(keys, tables[0][1:]):
        line: list[object] = list(row0[:label_cols])
        for j in range(label_cols, len(head)):
            vals = values(key, j)
            sp = spread(vals)
            txt = sp.text(".4g")
            fin = sum(math.isfinite(v) for v in vals)
            if math.isinf(sp.median) or (fin < sp.n and not math.isnan(sp.median)):
                txt += f" ({fin}/{sp.n} reached)"
            line.append(txt)
            diff = [math.nan, math.nan, ""]
            parts = key.split(" ")
            if compare is not None and parts[-1] == compare[0]:
                other = " ".join(parts[:-1] + [compare[1]])
                if other in keys:
                    d, h, beyond = paired_ci95(vals, values(other, j))
                    diff = [d, h, beyond]
            long.append([key, head[j], sp.n, sp.median, sp.mean, sp.lo, sp.hi, sp.min, sp.max, *diff])
        out.append(line)
    return out, long


def verdicts(long: Sequence[Sequence[object]], columns: Sequence[str], compare: tuple[str, str]) -> list[str]:
    """One line per tested figure: DBLP minus the baseline, its interval, and whether it exceeds the spread."""
    lines = []
    for r in long[1:]:
        if r[1] in columns and r[11] != "":
            d, h = float(r[9]), float(r[10])
            if math.isnan(d):  # neither side has a number in a common seed (e.g. neither reached a target)
                continue
            hw = f" +- {h:.3g}" if math.isfinite(h) else ""
            say = "larger than the spread" if r[11] else "within the spread"
            lines.append(f"  {r[0]:<28} {r[1]:<18} {compare[0]} - {compare[1]} = {d:+.4g}{hw}: {say}")
    return lines


def plain_log_ticks(axis) -> None:
    """Log axis with plain numbers at 1-1.5-2-3-5-7 steps (100, 150, 200, 300 ms), so every run's level
    can be read off the axis, instead of powers of ten with unlabelled minor ticks."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(NullFormatter())


def _clr_spans(recs: Sequence[RoundRecord]) -> list[tuple[int, int]]:
    """Runs of rounds in which the server's CLR state was on (the critical phase: tolerance P_low)."""
    on = sorted({r.round for r in recs if r.clr})
    spans: list[tuple[int, int]] = []
    for k in on:
        if spans and k == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], k)
        else:
            spans.append((k, k))
    return spans


def _title(ax, title: str, setup: str, width: int = 100) -> None:
    """The figure's title and, under it, the run's setup (what a reader needs to know which
    experiment this is), wrapped at ``width`` characters so a narrow figure does not cut it."""
    import textwrap

    ax.set_title("\n".join([title, *textwrap.wrap(setup, width)]) if setup else title, fontsize=10)


def _mark_bursts(ax, bursts: Sequence[int] | dict[str, Sequence[int]]) -> None:
    """Dotted vertical lines at the burst iterations in :data:`BURST_COLOR`, named in the legend with
    their iterations; a dict (run side -> iterations, e.g. ``{"A": [16], "B": []}``) marks each side's
    own, B's dashed."""
    sets = bursts if isinstance(bursts, dict) else {"": bursts}
    same = len({tuple(v) for v in sets.values()}) == 1
    for side, its in (list(sets.items())[:1] if same else sets.items()):
        its = list(its)
        for i, b in enumerate(its):
            who = "" if same or not side else f"{side}: "
            label = f"{who}burst{'s' if len(its) > 1 else ''} (iteration {', '.join(map(str, its))})"
            ax.axvline(b, color=BURST_COLOR, ls="--" if side == "B" and not same else ":", lw=1.4,
                       label=label if i == 0 else None)


def plot_latency(series: dict[str, Sequence[RoundRecord]], path: str | Path,
                 bursts: Sequence[int] | dict[str, Sequence[int]] = (),
                 title: str = "Send latency per iteration", field: str = "up_latency_s", setup: str = "") -> Path:
    """Fig. 2 style: latency per iteration for each labelled run; bursts marked (:func:`_mark_bursts`),
    and for a run whose server switched its tolerance (DBLP's CLR detection) the rounds in the critical
    phase (P_low) shaded in that run's colour - in a comparison run A's in the upper half, run B's
    hatched in the lower half, so the two never cover each other; ``setup`` (workers, model, link,
    burst) under the title; integer iteration ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    import textwrap

    lines = len(textwrap.wrap(setup, 100)) + title.count("\n")
    fig, ax = plt.subplots(figsize=(9, 4.2 + 0.2 * max(0, lines - 1)))  # a long caption keeps the axes' height
    sides = {label.rpartition(":")[0] for label in series}
    for label, recs in series.items():
        r, v = per_round(recs, field)
        style = run_style(label)
        ax.plot(r, v * 1e3, lw=1.0, label=label, **style)
        spans = _clr_spans(recs)
        if spans and len(spans) < len({x.round for x in recs}):  # switches happened (not "always on")
            side = label.rpartition(":")[0]
            band = {"A": dict(ymin=0.5, ymax=1.0), "B": dict(ymin=0.0, ymax=0.5, hatch="///", fill=False)}
            kw = band.get(side, {}) if len(sides) > 1 else {}
            color = style["color"] or "C0"
            for i, (a, b) in enumerate(spans):
                shade = dict(edgecolor=color, lw=0, alpha=0.35) if kw.get("fill") is False \
                    else dict(color=color, alpha=0.10, lw=0)
                ax.axvspan(a - 0.5, b + 0.5, **shade, **kw,
                           label=f"{label}: critical phase (P_low)" if i == 0 else None)
    _mark_bursts(ax, bursts)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("latency (ms, slowest worker)")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    _title(ax, title, setup)
    ax.grid(alpha=0.3, which="both")
    if len(ax.get_legend_handles_labels()[0]) > 5:  # a comparison's many entries: beside the axes, over no line
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.set_figwidth(11)
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_cdf(series: dict[str, Sequence[RoundRecord]], path: str | Path, title: str = "CDF of send latency",
             field: str = "up_latency_s", setup: str = "") -> Path:
    """Fig. 3 style: the latency distribution (left) and its tail (right: the fraction of iterations
    slower than x, log-scaled down to one iteration, so the few burst iterations that a CDF squeezes
    against 1.0 get the room of the rest). The legend sits under both panels, over no curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    import textwrap

    head = "\n".join([title, *textwrap.wrap(setup, 110)]) if setup else title
    lines = head.count("\n") + 1
    fig, (ax, tail) = plt.subplots(1, 2, figsize=(10, 4.2 + 0.2 * lines))
    least = 1.0
    for label, recs in series.items():
        _, v = per_round(recs, field)
        v = np.sort(v[np.isfinite(v)])
        if v.size:
            frac = np.arange(1, v.size + 1) / v.size
            ax.step(v * 1e3, frac, where="post", label=label, **run_style(label))
            # P(latency > x) at each sample: (n - i) / n for the i-th smallest (1-based), 1/n at the slowest
            tail.step(v * 1e3, (v.size - np.arange(v.size)) / v.size, where="post", **run_style(label))
            least = min(least, 1.0 / v.size)
    for a in (ax, tail):
        a.set_xscale("log")
        plain_log_ticks(a.xaxis)
        a.set_xlabel("latency (ms, slowest worker)")
        a.grid(alpha=0.3, which="both")
    ax.set_ylabel("fraction of iterations (CDF)")
    tail.set_yscale("log")
    tail.set_ylim(least * 0.7, 1.05)
    tail.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    tail.yaxis.set_minor_formatter(NullFormatter())
    tail.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.0%}" if y >= 0.01 else f"{y:.1%}"))
    tail.set_ylabel("fraction of iterations slower (log)")
    tail.set_title("the tail", fontsize=9)
    fig.suptitle(head, fontsize=10)  # over both panels, so they keep the same height
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07 if len(labels) <= 6 else 0.12, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# -- comparing two runs (``python -m dblp.results.analysis compare A B``) ---------------------------------

#: (column, what it is) of the comparison table, per run label and role.
COMPARE_METRICS: tuple[tuple[str, str], ...] = (
    ("rounds", "rounds with a record of this role"),
    ("round p50 (s)", "whole exchange, slowest of the role per round"),
    ("round p99 (s)", ""),
    ("round mean (s)", ""),
    ("send p50 (s)", "up_latency_s (worker: DBLP_SEND; server: DBLP_RECV), slowest per round"),
    ("send p99 (s)", ""),
    ("send mean (s)", ""),
    ("passes mean", "worker: up_passes; server: down_passes"),
    ("passes max", ""),
    ("recv frac mean", "worker: down_frac (broadcast it received); server: up_frac"),
    ("recv frac min", ""),
    ("drops", "datagrams this side's receiver dropped (stale, duplicate, corrupt...), all rounds"),
)
_DROP_FIELDS = ("stale", "duplicate", "corrupt", "foreign", "malformed", "out_of_range", "wrong_length",
                "unauthenticated")


def group_runs(records: Sequence[RoundRecord]) -> dict[tuple[str, str], list[RoundRecord]]:
    """Records by (run label, role); the label falls back to the policy name."""
    out: dict[tuple[str, str], list[RoundRecord]] = {}
    for r in records:
        out.setdefault((r.run or r.policy or "?", r.role), []).append(r)
    return out


def compare_stats(records: Sequence[RoundRecord], role: str, skip_first: int = 1) -> dict[str, float]:
    """The :data:`COMPARE_METRICS` of one role's records (rounds below ``skip_first`` left out)."""
    recs = [r for r in records if r.role == role and r.round >= skip_first]

    def pct(field: str) -> tuple[float, float, float]:
        _, v = per_round(recs, field, role=role)
        v = v[np.isfinite(v)] if v.size else v
        if not v.size:
            return math.nan, math.nan, math.nan
        return float(np.median(v)), float(np.percentile(v, 99)), float(np.mean(v))

    passes = np.array([r.up_passes if role == "worker" else r.down_passes for r in recs], dtype=float)
    frac = np.array([r.down_frac if role == "worker" else r.up_frac for r in recs], dtype=float)
    frac = frac[np.isfinite(frac)]
    rnd, snd = pct("round_latency_s"), pct("up_latency_s")
    return {
        "rounds": len({r.round for r in recs}),
        "round p50 (s)": rnd[0], "round p99 (s)": rnd[1], "round mean (s)": rnd[2],
        "send p50 (s)": snd[0], "send p99 (s)": snd[1], "send mean (s)": snd[2],
        "passes mean": float(passes.mean()) if passes.size else math.nan,
        "passes max": float(passes.max()) if passes.size else math.nan,
        "recv frac mean": float(frac.mean()) if frac.size else math.nan,
        "recv frac min": float(frac.min()) if frac.size else math.nan,
        "drops": sum(getattr(r, f) for r in recs for f in _DROP_FIELDS),
    }


def compare_rows(a: Sequence[RoundRecord], b: Sequence[RoundRecord], names: tuple[str, str] = ("A", "B"),
                 skip_first: int = 1) -> list[dict]:
    """One row per (run label, role, metric) present in either run: the two values and B/A.

    Labels pair up by name (``dblp`` with ``dblp``); two single-label runs pair whatever
    their labels (a ``dblp`` file against a ``baseline`` file: ``dblp|baseline``)."""
    ga, gb = group_runs(a), group_runs(b)
    la, lb = {k[0] for k in ga}, {k[0] for k in gb}
    if len(la) == 1 and len(lb) == 1 and la != lb:
        pair = f"{next(iter(la))}|{next(iter(lb))}"
        ga = {(pair, role): v for (_, role), v in ga.items()}
        gb = {(pair, role): v for (_, role), v in gb.items()}
    rows = []
    for key in sorted(set(ga) | set(gb), key=lambda k: (k[0], k[1] != "worker", k[1])):
        sa = compare_stats(ga.get(key, []), key[1], skip_first) if key in ga else {}
        sb = compare_stats(gb.get(key, []), key[1], skip_first) if key in gb else {}
        for m, _ in COMPARE_METRICS:
            va, vb = sa.get(m, math.nan), sb.get(m, math.nan)
            ratio = vb / va if va and math.isfinite(va) and math.isfinite(vb) else math.nan
            rows.append({"run": key[0], "role": key[1], "metric": m, names[0]: va, names[1]: vb, "B/A": ratio})
    return rows


def config_diff(a: dict | None, b: dict | None) -> list[str]:
    """What differs between two runs' flags (:func:`run_config`), one ``key: A -> B`` per flag both
    record (provenance, output folders and derived objects left out), then one line naming the flags
    only one of them records (a run made before the flag existed); a note when a run has no
    ``config.json``."""
    if a is None or b is None:
        missing = " and ".join(s for s, c in (("A", a), ("B", b)) if c is None)
        return [f"no config.json with {missing}: what differs is not recorded"]

    def show(v: object) -> str:
        return "(none)" if v in (None, "", []) else ",".join(map(str, v)) if isinstance(v, list) else str(v)

    fa, fb = a.get("_flags", []), b.get("_flags", [])
    both = [k for k in fa if k in fb and not isinstance(a.get(k), dict)]
    out = [f"{k}: {show(a.get(k))} -> {show(b.get(k))}" for k in both if a.get(k) != b.get(k)]
    for side, mine, other in (("A", fa, fb), ("B", fb, fa)):
        only = [k for k in mine if k not in other and not isinstance((a if side == "A" else b).get(k), dict)]
        if only:
            out.append(f"only {side} records {', '.join(only)}")
    return out


def run_bursts(config: dict | None) -> list[int]:
    """The burst iterations a run's config records (``bursts_list``, or ``bursts`` as given); none
    when unknown."""
    if not config:
        return []
    v = config.get("bursts_list", config.get("bursts"))
    if isinstance(v, str):
        v = [x for x in v.replace(" ", "").split(",") if x.isdigit()]
    try:
        return [int(x) for x in v] if isinstance(v, (list, tuple)) else []
    except (TypeError, ValueError):
        return []


def compare(a_path: str | Path, b_path: str | Path, out: str | Path | None, skip_first: int = 1,
            plot: bool = True) -> list[dict]:
    """Print the side-by-side tables of two runs; write ``compare.csv`` and overlay plots into ``out``."""
    import csv

    names = (Path(a_path).name or str(a_path), Path(b_path).name or str(b_path))
    if names[0] == names[1]:
        names = (f"A:{names[0]}", f"B:{names[1]}")
    a, b = load_run(a_path), load_run(b_path)
    rows = compare_rows(a, b, names, skip_first)
    ca, cb = run_config(a_path), run_config(b_path)
    diff = config_diff(ca, cb)
    print(f"A = {a_path} ({len(a)} records)\nB = {b_path} ({len(b)} records)")
    print("differs (A -> B): " + ("; ".join(diff) if diff else "no flag (same configuration)"))
    for key in dict.fromkeys((r["run"], r["role"]) for r in rows):
        block = [r for r in rows if (r["run"], r["role"]) == key]
        print(f"\n{key[0]} / {key[1]}")
        print(format_table([["metric", "A", "B", "B/A"]] + [[r["metric"], r[names[0]], r[names[1]], r["B/A"]]
                                                          for r in block]))
    if out is None:
        return rows
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "compare.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["run", "role", "metric"])
        w.writeheader()
        w.writerows(rows)
    written = ["compare.csv"]
    if plot:
        series: dict[str, list[RoundRecord]] = {}  # every role: the workers' latency, the server's CLR state
        for tag, recs in (("A", a), ("B", b)):
            for (run, role), rr in group_runs(recs).items():
                series.setdefault(f"{tag}:{run}", []).extend(rr)
        which = f"A = {names[0]} (solid)\nB = {names[1]} (dashed)"
        shown = diff[:5] + ([f"{len(diff) - 5} more (printed)"] if len(diff) > 5 else [])
        differs = "differs: " + ("; ".join(shown) if diff else "no flag (same configuration)")
        bursts = {"A": run_bursts(ca), "B": run_bursts(cb)}
        for field, what in (("up_latency_s", "send"), ("round_latency_s", "round")):
            plot_latency(series, out / f"latency_{what}.png", bursts, field=field,
                         title=f"{what.capitalize()} latency per iteration\n{which}", setup=differs)
            plot_cdf(series, out / f"cdf_{what}.png", title=f"CDF of {what} latency\n{which}", field=field,
                     setup=differs)
            written += [f"latency_{what}.png", f"cdf_{what}.png"]
    print(f"\nwrote {out}/: {', '.join(written)}")
    return rows


def tolerance_mismatches(records: Sequence[RoundRecord]) -> list[dict]:
    """The rounds where a worker's record and the server's disagree on a tolerance.

    Why: the server decides every round's tolerance (Algorithm 3) and announces it with
    ROUND; a worker that recorded another one applied something the server never sent
    (a forged announcement on the ``--insecure`` wire, whose control messages carry no
    tag, or a bug). One row per (run, worker, round, server record) that differs."""
    server: dict[tuple[str, int, int], list[RoundRecord]] = {}
    for r in records:
        if r.role == "server":
            server.setdefault((r.run, r.worker, r.round), []).append(r)
    out = []
    for r in records:
        if r.role != "worker":
            continue
        for s in server.get((r.run, r.worker, r.round), []):
            if (s.tolerance_up, s.tolerance_down) != (r.tolerance_up, r.tolerance_down):
                out.append({"run": r.run, "worker": r.worker, "round": r.round,
                            "server_up": s.tolerance_up, "worker_up": r.tolerance_up,
                            "server_down": s.tolerance_down, "worker_down": r.tolerance_down})
    return out


def check(path: str | Path) -> list[dict]:
    """Print the rounds whose server and worker records disagree on the tolerance (none: one line)."""
    recs = load_run(path)
    bad = tolerance_mismatches(recs)
    if not bad:
        print(f"{path}: {len(recs)} records; server and workers agree on every round's tolerance")
        return bad
    print(f"{path}: {len(bad)} worker round(s) whose tolerance differs from the server's "
          f"(a forged ROUND on an --insecure run?)")
    print(format_table([["run", "worker", "round", "server up", "worker up", "server down", "worker down"]]
                       + [[b["run"] or "-", b["worker"], b["round"], b["server_up"], b["worker_up"],
                           b["server_down"], b["worker_down"]] for b in bad]))
    return bad


def build_parser() -> "argparse.ArgumentParser":
    import argparse

    from dblp.cli.args import add_verbosity, parser

    ap = parser("python -m dblp.results.analysis", description="Tables and plots of round records.", config=False)
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("compare", formatter_class=ap.formatter_class,
                       help="two runs side by side: latency, passes, received fraction, drops; overlay plots",
                       description="Compare two runs (each a results folder or a records JSONL file): per run "
                                   "label and role, p50/p99/mean round and send latency, passes, received "
                                   "fraction and drops of A and B and their ratio; overlay plots of latency "
                                   "per iteration and its CDF.")
    c.add_argument("run_a", metavar="RUN_A", help="results folder or records JSONL (the reference)")
    c.add_argument("run_b", metavar="RUN_B", help="results folder or records JSONL")
    c.add_argument("--out", default="compare", help="folder for compare.csv and the plots")
    c.add_argument("--skip", type=int, default=1, help="leave out rounds below this (warm-up)")
    c.add_argument("--no-plot", action="store_true", help="write compare.csv only")
    k = sub.add_parser("check", formatter_class=ap.formatter_class,
                       help="flag rounds whose server and worker records disagree on the tolerance",
                       description="Flag every worker round whose tolerance (up or down) differs from the "
                                   "server's record of that round; exit status 1 if there is one.")
    k.add_argument("run", metavar="RUN", help="results folder or records JSONL holding server and worker records")
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    ap = build_parser()
    a = ap.parse_args(argv)
    if a.cmd is None:
        ap.print_help(sys.stderr)
        return 2
    if a.cmd == "compare" and a.skip < 0:
        ap.error(f"--skip must be >= 0, got {a.skip}")
    try:
        if a.cmd == "check":
            return 1 if check(a.run) else 0
        compare(a.run_a, a.run_b, a.out, a.skip, plot=not a.no_plot)
        from dblp.cli.provenance import write_config

        write_config(a.out, a)  # which runs were compared, with the commit and package versions
    except ValueError as exc:  # a run that cannot be read: one line naming it
        print(f"python -m dblp.results.analysis {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
