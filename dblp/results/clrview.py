"""The critical-regime detector examined on a run: gradient norm, each check's decision, accuracy.

Why: DBLP's whole saving rests on its detector (Algorithm 3: every ``freq``
iterations, the critical learning regime holds while the averaged gradient's
norm changed by at least ``eta`` relative to the previous iteration's). When it
leaves the regime too early the run trains at P_high while the accuracy is
still climbing, and can finish its iterations sooner yet reach a target
accuracy later. This module puts the three things side by side for one run:

* the averaged gradient's L2 norm per iteration (the server's records,
  ``grad_norm``), with the iterations the server spent in the critical regime
  (``clr``) shaded;
* at every check, the relative change the detector saw and its decision
  (in / out of the regime), against the threshold ``eta``;
* the test metric (mean of the workers, :func:`dblp.results.trainreport.run_curve`).

:func:`replay` feeds a run's recorded norms to :class:`dblp.protocol.policy.DblpPolicy`
(the one home of the rule) with other ``eta``/``freq``: what those settings
would have decided on the same norms - an approximation, since a setting that
keeps P_low longer also changes the norms it sees; the emulated sweep
(``scenarios/clr_sweep.py``) measures the real effect.

``python -m dblp.results.clrview RUN_FOLDER`` (a policy's folder of a training run, e.g.
``results/microburst-<time>/dblp``) prints the checks and the replay grid and
writes ``clr.png`` beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DblpPolicy, default_p_high
from dblp.protocol.records import RoundRecord

__all__ = ["norm_trace", "checks", "replay", "plot_detector", "variant_label", "sweep_table", "plot_sweep", "main"]


def norm_trace(records: Sequence[RoundRecord]) -> tuple[list[float], list[bool]]:
    """Per round (0, 1, ...): the averaged gradient's norm and the server's CLR state, from the
    server's records (one per worker and round; they agree)."""
    by: dict[int, RoundRecord] = {}
    for r in records:
        if r.role == "server":
            by.setdefault(r.round, r)
    rounds = sorted(by)
    return [float(by[k].grad_norm) for k in rounds], [bool(by[k].clr) for k in rounds]


def checks(norms: Sequence[float], eta: float = DEFAULT_ETA, freq: int = DEFAULT_FREQ) -> list[dict[str, Any]]:
    """Every check of the detector on ``norms``: ``step``, ``change`` (|prev - curr| / prev, the
    quantity compared with ``eta``) and ``clr`` (the decision, from :class:`DblpPolicy`)."""
    pol = DblpPolicy(eta=eta, freq=freq)
    out = []
    for k, n in enumerate(norms):
        pol.update(k, n)
        if k > 0 and k % freq == 0:
            prev = norms[k - 1]
            change = abs(prev - n) / prev if prev and math.isfinite(prev) and math.isfinite(n) else math.nan
            out.append({"step": k, "change": change, "clr": pol.clr})
    return out


def replay(norms: Sequence[float], etas: Sequence[float], freqs: Sequence[int]) -> list[dict[str, Any]]:
    """Per (eta, freq): the share of iterations the detector would have kept at P_low on these norms,
    its first exit (the first iteration at P_high; None: never left) and how many checks re-entered."""
    rows = []
    for eta in etas:
        for freq in freqs:
            pol = DblpPolicy(eta=eta, freq=freq)
            low, first_exit, reentries, was = 0, None, 0, True
            for k, n in enumerate(norms):
                pol.update(k, n)
                low += pol.clr
                if not pol.clr and first_exit is None:
                    first_exit = k
                if pol.clr and not was:
                    reentries += 1
                was = pol.clr
            rows.append({"eta": eta, "freq": freq, "clr_share": low / len(norms) if norms else math.nan,
                         "first_exit": first_exit, "reentries": reentries})
    return rows


def plot_detector(norms: Sequence[float], clr: Sequence[bool], curve: Sequence[tuple[int, float, float]],
                  path: str | Path, *, eta: float, freq: int, metric: str = "accuracy", title: str = "",
                  targets: Sequence[float] = ()) -> Path:
    """Three panels on one iteration axis: the norm (CLR shaded), each check's relative change
    against ``eta`` (filled: stayed in the regime; open: left it), and the test metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ks = list(range(len(norms)))
    for ax in (a1, a2, a3):
        start = None
        for k, on in enumerate([*clr, False]):
            if on and start is None:
                start = k
            elif not on and start is not None:
                ax.axvspan(start - 0.5, k - 0.5, color="#1f77b4", alpha=0.12, lw=0,
                           label="critical regime (P_low)" if ax is a1 and start == next(
                               i for i, c in enumerate(clr) if c) else None)
                start = None
        ax.grid(alpha=0.3)
    a1.plot(ks, norms, color="black", lw=1)
    a1.set_yscale("log")
    a1.set_ylabel("|averaged gradient|")
    a1.legend(fontsize=8, loc="upper right")
    cs = checks(norms, eta, freq)
    every = [abs(norms[k - 1] - norms[k]) / norms[k - 1] if norms[k - 1] else math.nan for k in ks[1:]]
    a2.plot(ks[1:], every, color="grey", lw=0.8, alpha=0.7, label="change at every iteration")
    a2.axhline(eta, color="#d62728", ls="--", lw=1, label=f"eta = {eta:g}")
    for c in cs:
        a2.scatter([c["step"]], [c["change"]], s=30, color="#1f77b4",
                   facecolors="#1f77b4" if c["clr"] else "none", zorder=3)
    a2.scatter([], [], s=30, color="#1f77b4", label="check: stays critical")
    a2.scatter([], [], s=30, facecolors="none", edgecolors="#1f77b4", label="check: leaves (P_high)")
    a2.set_ylabel(f"|change| / previous\n(every {freq} iterations)")
    shown = [v for v in every + [eta] if math.isfinite(v)]
    a2.set_ylim(0, min(max(shown), 3 * max(eta, 0.1)) * 1.1)
    a2.legend(fontsize=8, loc="upper right")
    a3.plot([p[0] for p in curve], [p[2] for p in curve], marker="o", ms=3, color="#1f77b4")
    for t in targets:
        a3.axhline(t, color="black", ls=":", lw=0.8)
    a3.set_ylabel(f"test {metric}\n(mean of workers)")
    a3.set_xlabel("iteration")
    fig.suptitle(title or "CLR detector", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def variant_label(eta: float, freq: int) -> str:
    """The folder name of a sweep's DBLP run with ``eta`` and ``freq``."""
    return f"dblp-eta{eta:g}-freq{freq}"


def sweep_table(out: str | Path, seeds: Sequence[int], settings: Sequence[tuple[float, int]], workers: int,
                targets: Sequence[float], reference: str = "baseline") -> tuple[list[list[object]], list[dict]]:
    """The eta x freq sweep's runs summed up: per setting and seed (``long`` rows) the share of
    iterations in the critical regime, the training time, the time to each target and the final
    metric, each also divided by the same seed's ``reference`` run; the printed table gives per
    setting the median [95% interval of the mean] over seeds (:mod:`dblp.results.stats`)."""
    from dblp.results.runfolder import load
    from dblp.results.stats import spread
    from dblp.results.trainreport import final_metrics, load_training, replicate_dir, time_to_targets, training_time

    long: list[dict] = []
    for sd in seeds:
        d = replicate_dir(out, sd, len(seeds))
        ref = load_training(d / reference, workers)
        ref_tt = time_to_targets(ref, targets)
        labels = [(reference, None, None)] + [(variant_label(e, f), e, f) for e, f in settings]
        for label, eta, freq in labels:
            run = ref if label == reference else load_training(d / label, workers)
            _, clr = norm_trace(load(d / label / "records"))
            tt = time_to_targets(run, targets)
            row = {"setting": label, "eta": eta, "freq": freq, "seed": sd,
                   "clr_share": sum(clr) / len(clr) if clr else math.nan,
                   "train_s": training_time(run), "train_vs_ref": training_time(run) / training_time(ref),
                   "final": float(sum(final_metrics(run)) / len(run["summaries"]))}
            for t in targets:
                sec, rsec = tt[t][1], ref_tt[t][1]
                row[f"to_{t:g}_iter"] = tt[t][0]  # iterations: the measure a loaded machine does not move
                row[f"to_{t:g}_s"] = sec
                row[f"to_{t:g}_vs_ref"] = sec / rsec if math.isfinite(sec) and math.isfinite(rsec) else \
                    (math.inf if math.isinf(sec) else math.nan)
            long.append(row)
    metric = load_training(replicate_dir(out, seeds[0], len(seeds)) / reference, workers)["metric"]
    cols = ["clr_share", "train_s", "train_vs_ref"] + \
        [c for t in targets for c in (f"to_{t:g}_iter", f"to_{t:g}_s", f"to_{t:g}_vs_ref")] + ["final"]
    head = ["setting", "P_low share", "train time (s)", f"time / {reference}"] + \
        [c for t in targets for c in (f"to {t:g} (iter)", f"to {t:g} (s)", f"to {t:g} / {reference}")] + \
        [f"final {metric}"]
    rows: list[list[object]] = [head]
    for label in dict.fromkeys(r["setting"] for r in long):
        rs = [r for r in long if r["setting"] == label]
        cells: list[object] = [label]
        for c in cols:
            sp = spread([r[c] for r in rs])
            fin = sum(math.isfinite(r[c]) for r in rs)
            cells.append(sp.text(".3g") + ("" if fin == len(rs) else f" ({fin}/{len(rs)} reached)"))
        rows.append(cells)
    return rows, long


def plot_sweep(long: Sequence[dict], path: str | Path, targets: Sequence[float], title: str,
               reference: str = "baseline", metric: str = "accuracy") -> Path:
    """Per target: time to it divided by the same seed's ``reference`` run's, against eta, one line
    per freq through the medians, a dot per seed ("not reached" drawn on the dotted top line); the
    training time to the last iteration likewise; and the final metric (the reference's band: its
    seeds' range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sw = [r for r in long if r["eta"] is not None]
    panels = [("train_vs_ref", "time to the last iteration")] + \
        [(f"to_{t:g}_vs_ref", f"time to {t:g}") for t in targets] + [("final", f"final {metric}")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.9))
    axes = np.atleast_1d(axes)
    etas = sorted({r["eta"] for r in sw})
    freqs = sorted({r["freq"] for r in sw})
    cmap = plt.get_cmap("viridis")
    finite = [r[c] for r in sw for c, _ in panels[:-1] if math.isfinite(r[c])]
    top = max(finite + [1.0]) * 1.15
    span = (max(etas) - min(etas)) or 1.0
    for ax, (col, what) in zip(axes, panels):
        ratio = col != "final"
        for j, f in enumerate(freqs):
            c = cmap(j / max(1, len(freqs) - 1) * 0.85)
            xs, med = [], []
            for e in etas:
                vals = [r[col] for r in sw if r["eta"] == e and r["freq"] == f]
                if not vals:
                    continue
                shown = [v if math.isfinite(v) else top for v in vals]
                x = e + 0.015 * span * (j - (len(freqs) - 1) / 2)
                ax.scatter([x] * len(shown), shown, s=14, color=c, alpha=0.7)
                xs.append(x)
                med.append(float(np.median(shown)))
            ax.plot(xs, med, color=c, marker="o", ms=5, label=f"freq {f}")
        if ratio:
            ax.axhline(1.0, color="#d62728", ls="--", lw=1, label=reference)
            ax.axhline(top, color="grey", ls=":", lw=0.8)
            ax.annotate("not reached", (0.02, top), xycoords=("axes fraction", "data"), va="bottom", fontsize=7,
                        color="grey")
            ax.set_ylim(0, top * 1.08)
        else:
            ref = [r[col] for r in long if r["eta"] is None]
            ax.axhspan(min(ref), max(ref), color="#d62728", alpha=0.15, label=f"{reference} (range)")
            ax.axhline(float(np.median(ref)), color="#d62728", ls="--", lw=1)
        ax.set_xticks(etas, [f"{e:g}" for e in etas])
        ax.set_xlabel("eta (CLR threshold)")
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"time / {reference}'s (same seed)\nline: median; dot: one seed")
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _run_config(d: Path) -> dict[str, Any]:
    """The scenario's config.json of the run folder ``d`` (searched upwards, two levels): eta, freq,
    workers, targets."""
    for p in (d.parent / "config.json", d.parent.parent / "config.json", d.parent.parent.parent / "config.json"):
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            continue
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    from dblp.results.analysis import format_table
    from dblp.results.runfolder import load
    from dblp.cli.args import parser
    from dblp.results.trainreport import load_training, run_curve

    ap = parser("python -m dblp.results.clrview", __doc__.splitlines()[0], config=False)
    ap.add_argument("run", help="a policy's folder of a training run (records/ and w0/, w1/, ...)")
    ap.add_argument("--eta", type=float, default=None, help="CLR detection threshold (default: the run's config)")
    ap.add_argument("--freq", type=int, default=None, help="CLR check period in iterations (default: the run's)")
    ap.add_argument("--output", default=None, help="PNG file to write (default: RUN/clr.png)")
    a = ap.parse_args(argv)
    d = Path(a.run)
    if not (d / "records").is_dir():
        ap.error(f"{d}: no records/ folder here (give a policy's folder, e.g. results/microburst-<time>/dblp)")
    cfg = _run_config(d)
    eta = a.eta if a.eta is not None else float(cfg.get("eta", DEFAULT_ETA))
    freq = a.freq if a.freq is not None else int(cfg.get("freq", DEFAULT_FREQ))
    if eta < 0 or freq < 1:
        ap.error(f"--eta {eta} / --freq {freq}: eta must be >= 0 and freq >= 1")
    norms, clr = norm_trace(load(d / "records"))
    if not norms:
        ap.error(f"{d}/records: no server records (a run of the DBLP server writes one per worker and round)")
    workers = len(list(d.glob("w[0-9]*")))
    run = load_training(d, workers) if workers else None
    curve = run_curve(run) if run else []
    print(f"{d}: {len(norms)} iterations, in the critical regime for {sum(clr)} of them (server records)")
    rows = [["check at", "|change|/prev", "decision"]] + [
        [c["step"], c["change"], "critical (P_low)" if c["clr"] else "leaves (P_high)"] for c in checks(norms, eta, freq)]
    print(f"\nDetector checks (eta {eta:g}, freq {freq}):")
    print(format_table(rows, ".3f"))
    grid = replay(norms, (0.05, 0.1, 0.2, 0.3, 0.5), (2, 5, 10, 20))
    print("\nThe same norms replayed with other settings (share of iterations at P_low; first iteration at P_high):")
    print(format_table([["eta", "freq", "P_low share", "first exit", "re-entries"]]
                       + [[g["eta"], g["freq"], g["clr_share"], "never" if g["first_exit"] is None else g["first_exit"],
                           g["reentries"]] for g in grid], ".2f"))
    targets = [float(t) for t in (cfg.get("target_accuracy") or "0.9,0.94").split(",")] \
        if run and run["metric"] == "accuracy" else []
    p = plot_detector(norms, clr, curve, a.output or d / "clr.png", eta=eta, freq=freq,
                      metric=run["metric"] if run else "accuracy", targets=targets,
                      title=f"CLR detector on {d} (eta {eta:g}, freq {freq})")
    print(f"\nwrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
