"""Does a workload have a late phase, and does the CLR detector see two regimes on it?

    python -m dblp.train.phasecheck --workload mnist1d_cnn --seeds 3 --plot docs/workload-mnist1d_cnn.png

Why: a phase-aware protocol can only earn time where training has a long
phase after its critical start, and only if DBLP's detector (eq. (1),
:class:`dblp.protocol.policy.DblpPolicy`) spends real parts of the run in each regime.
This trains a workload's 3 workers in one process (``sim_workers``) twice per
seed, without sockets: ``reliable`` through :class:`~dblp.train.exchange.LocalExchange`
(the lossless mean) and ``dblp`` through
:class:`~dblp.train.exchange.TolerancePolicyExchange` (the protocol's sessions
over an in-memory link, each direction losing exactly what the tolerance in
force allows, CLR detected on the zero-filled mean's norm with the project's
P_low, P_high, eta and freq). It prints per run the iterations to the test
accuracy's plateau (:func:`plateau_iteration`), the accuracy there and at the
end, and the share of iterations in each regime; for the reliable run, the
share the detector *would* have kept critical on its lossless norms
(:func:`dblp.results.clrview.replay`). ``--plot`` draws the first seed's norm curves,
the detector's checks and both accuracy curves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dblp.results.stats import median_range

__all__ = ["plateau_iteration", "run_once", "plot_phase", "main"]


def plateau_iteration(evals: Sequence[tuple[int, float]], *, window: int = 5, tol: float = 0.01) -> tuple[int, float]:
    """``(iteration, smoothed accuracy)`` of the first evaluation whose trailing mean over ``window``
    evaluations is within ``tol`` of the last such mean: where the curve stops climbing, read
    through its evaluation-to-evaluation noise (a single test of 2,400 signals moves by ~1 point)."""
    if not evals:
        raise ValueError("no evaluations")
    acc = np.array([a for _, a in evals], dtype=float)
    smooth = np.array([acc[max(0, i - window + 1):i + 1].mean() for i in range(len(acc))])
    final = smooth[-1]
    i = int(np.flatnonzero(smooth >= final - tol)[0])
    return int(evals[i][0]), float(smooth[i])


def run_once(workload: str, policy: str, seed: int, *, epochs: int | None, eval_every: int, workers: int = 3,
             out_dir: str | None = None) -> dict[str, Any]:
    """Train ``workload`` once under ``policy`` (``reliable`` or ``dblp``); returns its evaluations,
    per-iteration norms (what the server's detector is fed) and CLR states."""
    from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_P_LOW, default_p_high
    from dblp.train.exchange import LocalExchange, TolerancePolicyExchange
    from dblp.train.loop import TrainConfig, train
    from dblp.train.models import get_workload

    wl = get_workload(workload, seed=seed)
    ex: Any = (LocalExchange() if policy == "reliable" else
               TolerancePolicyExchange.dblp(DEFAULT_P_LOW, default_p_high(DEFAULT_P_LOW), eta=DEFAULT_ETA,
                                            freq=DEFAULT_FREQ, seed=seed))
    over: dict[str, Any] = {"sim_workers": workers, "seed": seed, "eval_every": eval_every, "threads": 1}
    if epochs is not None:
        over["epochs"] = epochs
    folder = Path(out_dir) if out_dir else None
    if folder is None:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix=f"phasecheck-{workload}-{policy}-"))
    cfg = TrainConfig.for_workload(wl, out_dir=str(folder), **over)
    t0 = time.perf_counter()
    s = train(wl, ex, cfg)
    wall = time.perf_counter() - t0
    with open(folder / "evals.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    evals = [(int(r["iteration"]), float(r[wl.metric])) for r in rows]
    its = s.iteration_records
    norms = [float(r.get("server_grad_norm", r["grad_norm"])) for r in its]
    clr = [bool(r.get("clr", False)) for r in its]
    return {"workload": wl.name, "policy": policy, "seed": seed, "iterations": s.iterations, "wall_s": wall,
            "parameters": s.parameters, "evals": evals, "norms": norms, "clr": clr,
            "final": s.final_metric, "out_dir": str(folder)}


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    from dblp.results.clrview import replay
    from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ

    it, acc = plateau_iteration(r["evals"])
    out = {"policy": r["policy"], "seed": r["seed"], "iterations": r["iterations"], "plateau_iter": it,
           "plateau_acc": acc, "final_acc": r["final"], "max_acc": max(a for _, a in r["evals"]),
           "wall_s": r["wall_s"]}
    if r["policy"] == "dblp":
        out["clr_share"] = float(np.mean(r["clr"]))
    else:  # what the detector would have decided on this lossless run's norms
        out["clr_share"] = replay(r["norms"], [DEFAULT_ETA], [DEFAULT_FREQ])[0]["clr_share"]
    return out


def plot_phase(reliable: dict[str, Any], dblp: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Three panels on one iteration axis: the gradient norm the detector is fed (dblp's, CLR
    iterations shaded; reliable's in grey), the relative change at each check against eta, and
    both test-accuracy curves with their plateaus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ

    fig, ax = plt.subplots(3, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2, 3]})
    n = np.array(dblp["norms"])
    clr = np.array(dblp["clr"])
    it = np.arange(len(n))
    ax[0].plot(np.arange(len(reliable["norms"])), reliable["norms"], color="0.7", lw=0.6,
               label="reliable (lossless mean)")
    ax[0].plot(it, n, color="k", lw=0.6, label="dblp (zero-filled mean the detector sees)")
    for k in np.flatnonzero(clr):
        ax[0].axvspan(k - 0.5, k + 0.5, color="tab:blue", alpha=0.25, lw=0)
    ax[0].set_yscale("log")
    ax[0].set_ylabel("|averaged gradient|")
    ax[0].plot([], [], color="tab:blue", alpha=0.25, lw=6, label=f"critical regime (P_low): {clr.mean():.0%} of dblp's iterations")
    ax[0].legend(loc="upper left", fontsize=8)
    steps = np.arange(DEFAULT_FREQ, len(n), DEFAULT_FREQ)
    change = np.abs(n[steps - 1] - n[steps]) / n[steps - 1]
    crit = change >= DEFAULT_ETA
    ax[1].scatter(steps[crit], change[crit], s=10, color="tab:blue", label="check: critical (P_low)")
    ax[1].scatter(steps[~crit], change[~crit], s=10, facecolors="none", edgecolors="tab:orange",
                  label="check: not critical (P_high)")
    ax[1].axhline(DEFAULT_ETA, color="tab:red", ls="--", lw=1, label=f"eta = {DEFAULT_ETA}")
    ax[1].set_yscale("symlog", linthresh=0.1)
    ax[1].set_ylim(bottom=0)
    ax[1].set_ylabel(f"|change| / previous\n(every {DEFAULT_FREQ} iterations)")
    ax[1].legend(loc="upper left", fontsize=8, ncol=3)
    for r, color in ((reliable, "tab:green"), (dblp, "tab:blue")):
        x, y = zip(*r["evals"])
        p_it, p_acc = plateau_iteration(r["evals"])
        ax[2].plot(x, y, color=color, lw=1, label=f"{r['policy']}: plateau at iteration {p_it} ({p_acc:.3f})")
        ax[2].axvline(p_it, color=color, ls=":", lw=1)
    ax[2].set_ylabel("test accuracy")
    ax[2].set_xlabel("iteration")
    ax[2].legend(loc="lower right", fontsize=8)
    ax[2].grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dblp.train.phasecheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mnist1d_cnn", help="a dblp.train workload (default mnist1d_cnn)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1, each trained reliable and dblp")
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default: the workload's)")
    ap.add_argument("--eval-every", type=int, default=20, help="test every N iterations (default 20)")
    ap.add_argument("--plot", default=None, help="write the first seed's figure here (PNG)")
    ap.add_argument("--json", default=None, help="write every run's summary (and seed 0's curves, for --from-json) here")
    ap.add_argument("--from-json", default=None, help="redraw --plot from a file --json wrote, training nothing")
    a = ap.parse_args(argv)
    from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_P_LOW, default_p_high

    rows: list[dict[str, Any]] = []
    first: dict[str, dict[str, Any]] = {}
    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text(encoding="utf-8"))
        rows, first = saved["rows"], saved["seed0"]
    t0 = time.perf_counter()
    for seed in range(0 if a.from_json else a.seeds):
        for policy in ("reliable", "dblp"):
            r = run_once(a.workload, policy, seed, epochs=a.epochs, eval_every=a.eval_every)
            rows.append(_summary(r))
            if seed == 0:
                first[policy] = r
            s = rows[-1]
            print(f"{a.workload} seed {seed} {policy:8s}: {s['iterations']} iterations, plateau at {s['plateau_iter']} "
                  f"(accuracy {s['plateau_acc']:.3f}), final {s['final_acc']:.3f}, max {s['max_acc']:.3f}, "
                  f"CLR {s['clr_share']:.3f}{' (replayed on the lossless norms)' if policy == 'reliable' else ''}, "
                  f"{s['wall_s']:.0f} s", flush=True)
    if not a.from_json:
        print(f"total {time.perf_counter() - t0:.0f} s")
    for policy in ("reliable", "dblp"):
        mine = [r for r in rows if r["policy"] == policy]
        if mine:
            def span(k: str, f: str) -> str:
                return median_range([r[k] for r in mine], f)
            print(f"{policy:8s} over {len(mine)} seeds, median [min-max]: plateau at {span('plateau_iter', '.0f')}, "
                  f"accuracy there {span('plateau_acc', '.3f')}, final {span('final_acc', '.3f')}, "
                  f"CLR share {span('clr_share', '.3f')}")
    if a.json and not a.from_json:
        Path(a.json).write_text(json.dumps({"rows": rows, "seed0": first}) + "\n", encoding="utf-8")
    if a.plot:
        r = first["dblp"]
        title = (f"{a.workload}: {r['parameters']:,} parameters, 3 workers in memory, seed 0\n"
                 f"dblp = TolerancePolicyExchange (P_low {DEFAULT_P_LOW}, P_high {default_p_high(DEFAULT_P_LOW)}, "
                 f"eta {DEFAULT_ETA}, freq {DEFAULT_FREQ}); reliable = LocalExchange")
        print(f"wrote {plot_phase(first['reliable'], r, a.plot, title=title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
