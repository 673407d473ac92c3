"""Performance targets as rows: measured values held against bounds that depend on the machine.

Why a module: the targets are stated per machine class (a 2-core machine
and a 16-core GPU machine, docs/benchmark.md), and one command prints all of
them, met or not, from one run (``scenarios/benchmark.py --targets``). Several parts
produce rows (the loopback and veth ratios against gloo, the DDP step, the
pacing checks of :mod:`emulation`); they share this row type, and the
summary - median and range over ``--repeats``, the bound of this machine's
class, the verdict - is computed once, here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["BIG_MACHINE_CORES", "TargetRow", "machine_class", "as_rows", "summarize", "format_table", "plot"]

#: from this many cores on, the bounds stated for the 16-core GPU machine apply; below, the 2-core machine's
BIG_MACHINE_CORES = 16


@dataclass
class TargetRow:
    """One measurement of one target in one repeat.

    ``bounds``: the bound per machine class (``"2-core"``, ``"16-core"``, or ``"any"`` for every
    machine); a class without one shows the row for information. ``better``: ``"<="`` (the value
    must not exceed the bound) or ``">="``. ``met``: set by a row that judges itself; otherwise the
    median over the repeats is held against the bound."""

    name: str
    value: float
    unit: str = "x"
    bounds: dict[str, float] = field(default_factory=dict)
    better: str = "<="
    detail: str = ""
    met: bool | None = None

    def __post_init__(self) -> None:
        if self.better not in ("<=", ">="):
            raise ValueError(f"target {self.name!r}: better must be '<=' or '>=', got {self.better!r}")


def machine_class(cores: int) -> str:
    """The class whose bounds apply on a machine of ``cores`` cores."""
    return "16-core" if cores >= BIG_MACHINE_CORES else "2-core"


def as_rows(rows: Iterable[Any]) -> list[TargetRow]:
    """Rows as :class:`TargetRow`: their own, or any row naming ``target``, ``measured``,
    ``threshold`` and ``met`` (attributes or keys; ``unit``, ``better``, ``detail`` optional),
    which judges itself."""
    out = []
    for r in rows:
        if isinstance(r, TargetRow):
            out.append(r)
            continue
        get = r.get if isinstance(r, dict) else (lambda k, d=None, r=r: getattr(r, k, d))
        missing = [k for k in ("target", "measured", "threshold", "met") if get(k) is None]
        if missing:
            raise ValueError(f"a target row without {', '.join(missing)}: {r!r}")
        out.append(TargetRow(str(get("target")), float(get("measured")), str(get("unit", "") or ""),
                             {"any": float(get("threshold"))}, str(get("better", "<=") or "<="),
                             str(get("detail", "") or ""), bool(get("met"))))
    return out


def summarize(per_repeat: Iterable[Iterable[TargetRow]], cores: int) -> list[dict[str, Any]]:
    """One line per target, in first-seen order: median, min and max over the repeats, the bound
    of this machine's class, and whether it is met (None: no bound for this class). A repeat whose
    value is NaN (not measured) is left out; ``repeats`` counts the others."""
    cls = machine_class(cores)
    by_name: dict[str, list[TargetRow]] = {}
    for rows in per_repeat:
        for r in rows:
            by_name.setdefault(r.name, []).append(r)
    out = []
    for name, rs in by_name.items():
        vals = [r.value for r in rs if not math.isnan(r.value)]  # a repeat that failed is left out
        first = rs[0]
        bound = first.bounds.get(cls, first.bounds.get("any"))
        med = statistics.median(vals) if vals else float("nan")
        met: bool | None
        if first.met is not None:
            met = all(bool(r.met) for r in rs)
        elif bound is None or math.isnan(med):
            met = None
        else:
            met = med <= bound if first.better == "<=" else med >= bound
        elsewhere = {k: v for k, v in first.bounds.items() if k not in (cls, "any")}
        out.append({"target": name, "unit": first.unit, "median": med, "min": min(vals, default=med),
                    "max": max(vals, default=med), "repeats": len(vals), "values": vals, "bound": bound, "better": first.better, "met": met,
                    "elsewhere": elsewhere, "detail": [r.detail for r in rs]})
    return out


def _num(v: float, unit: str) -> str:
    return f"{v:+.2f} {unit}" if unit == "ms" else f"{v:.2f}{unit}"


def format_table(lines: list[dict[str, Any]]) -> str:
    """The summary as a plain-text table: target, median, range, bound, verdict."""
    cells = [["target", "median", "range", "bound", "verdict"]]
    for ln in lines:
        u = ln["unit"]
        bound = "-" if ln["bound"] is None else f"{ln['better']} {_num(ln['bound'], u)}"
        verdict = {True: "met", False: "NOT met", None: "no target here"}[ln["met"]]
        if ln["repeats"] == 0:
            verdict = "not measured (see the log)"
        elif ln["met"] is None and ln["elsewhere"]:
            verdict += " (" + ", ".join(f"{k}: {ln['better']} {_num(v, u)}" for k, v in ln["elsewhere"].items()) + ")"
        rng = f"{_num(ln['min'], u)} .. {_num(ln['max'], u)}" if ln["repeats"] > 1 else "-"
        if ln["repeats"] < len(ln["detail"]):  # some repeats failed
            rng += f" ({ln['repeats']} of {len(ln['detail'])})"
        cells.append([ln["target"], _num(ln["median"], u), rng, bound, verdict])
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i in (0, 4) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def plot(lines: list[dict[str, Any]], path: str, title: str) -> None:
    """A PNG of the summary: each target's median over its bound (range as a whisker), so every
    target reads on one axis - left of 1 is met for a "<=" bound; targets without a bound here are
    left out (they have no scale). Matplotlib is imported here, with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    shown = [ln for ln in lines if ln["bound"] and ln["repeats"] and ln["unit"] != "ms"]
    shown += [ln for ln in lines if ln["bound"] and ln["repeats"] and ln["unit"] == "ms"]
    fig, ax = plt.subplots(figsize=(10, 0.55 * max(2, len(shown)) + 1.6))
    xs = [1.0]
    for i, ln in enumerate(shown):
        b = ln["bound"]
        med, lo, hi = ln["median"] / b, ln["min"] / b, ln["max"] / b
        xs += [lo, hi]
        color = "tab:green" if ln["met"] else "tab:red"
        ax.errorbar(med, i, xerr=[[med - lo], [hi - med]], fmt="o", color=color, ecolor="black", capsize=4)
        # in the right margin, one column: beside a whisker the text crossed the dashed line
        ax.annotate(f"{_num(ln['median'], ln['unit'])}  (bound {ln['better']} {_num(b, ln['unit'])})",
                    (1.0, i), xycoords=("axes fraction", "data"), xytext=(8, 0), textcoords="offset points",
                    va="center", ha="left", fontsize=8, color=color)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    if min(xs) > 0:
        ax.set_xscale("log")  # ratios of 0.9 and a 10x miss on one axis
        ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
    else:  # a difference below zero (DBLP's step faster than plain DDP's) has no logarithm
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(min(xs) * 1.5, max(xs) * 1.5)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_yticks(range(len(shown)), [ln["target"] for ln in shown], fontsize=8)
    ax.set_xlabel(f"median / bound, {'log' if min(xs) > 0 else 'symmetric log'} scale\n(whisker: range over the repeats; left of the dashed line "
                  "meets a '<=' bound)", fontsize=8)
    ax.set_title(title.replace(", load", ",\nload", 1), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the annotations right of the whiskers included
    plt.close(fig)
