"""Cross-check of two views of one scenario: round records side by side, with the simulator.

What ``scenarios/crosscheck.py`` (Mininet vs simulator) and
``scenarios/gpu_hosts.py`` (real hosts vs simulator) share: simulate every
policy of a calibrated :class:`~dblp.sim.config.SimConfig`
(:func:`simulate_policies`), compare the two views' records term by term
(:func:`compare`: median, p99, max and mean round and send latency, latency
at each burst, DBLP-vs-baseline speedups, received fractions, passes, and
the two-sample Kolmogorov-Smirnov statistic of the latency distributions),
and write the report (:func:`write_report`: table, CSV, JSON, PNG).

Everything here reads :class:`dblp.protocol.records.RoundRecord` s (and runs the
simulator); nothing launches a network, so it sits in ``dblp`` and the
scenarios only gather runs and pass them in. The KS test uses
``scipy.stats.ks_2samp`` where scipy is installed (the only use of scipy in
the project) and :func:`ks_2samp_numpy` otherwise.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from dblp.results import analysis
from dblp.protocol.policy import run_policy
from dblp.protocol.records import RoundRecord, json_safe

if TYPE_CHECKING:  # the simulator is imported where it runs, not at import time
    from dblp.sim.config import SimConfig

#: the crosscheck's bounds on the relative error of the bounded terms (simulated against emulated)
BOUNDS = {"round p50": 0.15, "round p99": 0.15, "speedup @burst": 0.20}
#: scenario settings that replace a transferred calibration's (--params); the rest are host constants
SCENARIO_KEYS = ("model", "workers", "rounds", "bandwidth_bps", "server_bandwidth_bps", "queue_bytes",
                 "send_rate_bps", "loss", "seed", "eta", "freq", "mtu", "wire",
                 "topology", "racks", "spines", "uplink_bandwidth_bps",  # the network: a scenario setting
                 "local_workers", "wan_bandwidth_bps", "wan_delay_s", "wan_queue_bytes")


# -- statistics ------------------------------------------------------------------------
def ks_2samp(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sample KS statistic and p-value (scipy where installed, else numpy, asymptotic p)."""
    a = np.sort(np.asarray(a, float)[np.isfinite(a)])
    b = np.sort(np.asarray(b, float)[np.isfinite(b)])
    if not a.size or not b.size:
        return math.nan, math.nan
    try:
        from scipy.stats import ks_2samp as _ks

        r = _ks(a, b)
        return float(r.statistic), float(r.pvalue)
    except ImportError:
        return ks_2samp_numpy(a, b)


def ks_2samp_numpy(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample KS statistic and its asymptotic p-value, without scipy (checked against scipy in the tests)."""
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    d = float(np.max(np.abs(np.searchsorted(a, x, "right") / a.size - np.searchsorted(b, x, "right") / b.size)))
    en = math.sqrt(a.size * b.size / (a.size + b.size))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, float(min(1.0, max(0.0, p)))


def rel_err(sim: float, real: float) -> float:
    """(sim - real) / real; NaN where either is missing or real is 0."""
    if real is None or sim is None or not (math.isfinite(real) and math.isfinite(sim)) or real == 0:
        return math.nan
    return (sim - real) / real


def view_stats(recs: Sequence[RoundRecord], bursts: Sequence[int], skip_first: int = 1) -> dict[str, Any]:
    """The compared quantities of one view of one policy (slowest worker per iteration)."""
    out: dict[str, Any] = {}
    for field, tag in (("round_latency_s", "round"), ("up_latency_s", "send")):
        r, v = analysis.per_round(recs, field)
        by = dict(zip(r.tolist(), v.tolist()))
        keep = v[r >= skip_first]
        out[f"{tag} series"] = (r.tolist(), v.tolist())
        out[f"{tag} p50"] = float(np.median(keep)) if keep.size else math.nan
        out[f"{tag} p99"] = float(np.percentile(keep, 99)) if keep.size else math.nan
        out[f"{tag} max"] = float(np.max(keep)) if keep.size else math.nan
        out[f"{tag} mean"] = float(np.mean(keep)) if keep.size else math.nan
        for b in bursts:
            out[f"{tag} @{b}"] = by.get(b, math.nan)
    _, fr = analysis.per_round(recs, "up_frac", agg="min")
    rr, frm = analysis.per_round(recs, "up_frac", agg="mean")
    out["recv frac mean"] = float(np.mean(frm)) if frm.size else math.nan
    fby = dict(zip(rr.tolist(), fr.tolist()))
    rd, dn = analysis.per_round(recs, "down_frac", agg="min")
    dby = dict(zip(rd.tolist(), dn.tolist()))
    rp, ps = analysis.per_round(recs, "up_passes")
    pby = dict(zip(rp.tolist(), ps.tolist()))
    for b in bursts:
        out[f"recv frac @{b}"] = fby.get(b, math.nan)
        out[f"down frac @{b}"] = dby.get(b, math.nan)
        out[f"passes @{b}"] = pby.get(b, math.nan)
    return out


SCALAR_ORDER = ["round p50", "round p99", "round max", "round mean", "send p50", "send p99", "send max", "send mean"]


def compare(real: dict[str, list[RoundRecord]], sim: dict[str, list[RoundRecord]], bursts: Sequence[int],
            real_label: str = "mininet") -> dict[str, Any]:
    """Rows (term, policy, real, sim, relative error, bound, within) and KS statistics."""
    rows: list[dict[str, Any]] = []
    stats = {k: (view_stats(real[k], bursts), view_stats(sim[k], bursts)) for k in real if k in sim}

    def add(term: str, policy: str, a: float, b: float, bound_key: str | None = None) -> None:
        e = rel_err(b, a)
        bound = BOUNDS.get(bound_key) if bound_key else None
        rows.append({"term": term, "policy": policy, real_label: a, "sim": b, "rel_err": e,
                     "bound": bound, "within": (abs(e) <= bound) if bound is not None and math.isfinite(e) else None})

    for pol, (a, b) in stats.items():
        for t in SCALAR_ORDER:
            add(t, pol, a[t], b[t], t if t in BOUNDS else None)
        for bu in bursts:
            add(f"round @{bu}", pol, a[f"round @{bu}"], b[f"round @{bu}"])
            add(f"send @{bu}", pol, a[f"send @{bu}"], b[f"send @{bu}"])
        add("recv frac mean", pol, a["recv frac mean"], b["recv frac mean"])
        for bu in bursts:
            add(f"recv frac @{bu}", pol, a[f"recv frac @{bu}"], b[f"recv frac @{bu}"])
            add(f"down frac @{bu}", pol, a[f"down frac @{bu}"], b[f"down frac @{bu}"])
            add(f"passes @{bu}", pol, a[f"passes @{bu}"], b[f"passes @{bu}"])
    ks = {}
    for pol, (a, b) in stats.items():
        for tag in ("round", "send"):
            d, p = ks_2samp(a[f"{tag} series"][1][1:], b[f"{tag} series"][1][1:])
            ks[f"{pol} {tag}"] = {"statistic": d, "pvalue": p, f"n_{real_label}": len(a[f"{tag} series"][1]) - 1,
                                  "n_sim": len(b[f"{tag} series"][1]) - 1}
    if "baseline" in stats and "dblp" in stats:
        (ba, bs), (da, ds) = stats["baseline"], stats["dblp"]
        for tag in ("round", "send"):
            for bu in bursts:
                add(f"speedup {tag} @{bu}", "baseline/dblp", _ratio(ba[f"{tag} @{bu}"], da[f"{tag} @{bu}"]),
                    _ratio(bs[f"{tag} @{bu}"], ds[f"{tag} @{bu}"]), "speedup @burst")
            for q in ("p99", "mean"):
                add(f"speedup {tag} {q}", "baseline/dblp", _ratio(ba[f"{tag} {q}"], da[f"{tag} {q}"]),
                    _ratio(bs[f"{tag} {q}"], ds[f"{tag} {q}"]))
    series = {pol: {real_label: a["round series"], "sim": b["round series"]} for pol, (a, b) in stats.items()}
    return {"rows": rows, "ks": ks, "series": series, "real_label": real_label}


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


# -- simulation ------------------------------------------------------------------------
def policy_config(cal: SimConfig, policy: str, p_low: float, p_high: float) -> SimConfig:
    """The calibrated configuration under one of the scenario's named runs (dblp.protocol.policy.run_policy)."""
    return cal.with_(**run_policy(policy, p_low, p_high, cal.eta, cal.freq).config())


def own_norms(run: Path, policies: Sequence[str]) -> dict[str, list[float]]:
    """Each policy run's gradient-norm sequence as its server saw it (zero-fill effect divided out,
    as ``dblp.sim.studies.calibrate`` does). A training run's norms differ between the policies' runs, and
    the CLR detector of each must see its own; synthetic runs replay one sequence (same seed)."""
    from dblp.sim.studies.calibrate import calibrate

    out = {}
    for pol in policies:
        if (run / pol / "records").is_dir():
            try:
                cfg, _ = calibrate(run / pol, refine=False)
            except Exception:  # noqa: BLE001 - then the calibration's norms serve
                continue
            if isinstance(cfg.norms, list):
                out[pol] = cfg.norms
    return out


def simulate_policies(cal: SimConfig, policies: Sequence[str], p_low: float, p_high: float, out: Path,
                      fidelity: str = "round", norms: dict[str, list[float]] | None = None
                      ) -> dict[str, list[RoundRecord]]:
    """Simulate ``cal`` under each policy (same seed: common random numbers), each with its own
    gradient norms where ``norms`` has them; records to ``out/<policy>.jsonl``."""
    from dblp.sim import simulate

    out.mkdir(parents=True, exist_ok=True)
    res = {}
    for pol in policies:
        cfg = policy_config(cal, pol, p_low, p_high).with_(fidelity=fidelity)
        if norms and pol in norms:
            cfg = cfg.with_(norms=norms[pol])
        path = out / f"{pol}.jsonl"
        if path.exists():
            path.unlink()
        t = time.time()
        r = simulate(cfg, records=str(path))
        print(f"  sim {pol:9s}: {cfg.rounds} iterations ({fidelity} level) in {time.time() - t:.1f} s", flush=True)
        res[pol] = r.records
    return res


def transfer(params: Path, scenario: dict) -> SimConfig:
    """A calibration made on another run, with this scenario's own settings put in."""
    from dblp.sim import SimConfig

    d = SimConfig.from_json(params).to_dict()
    d.update({k: v for k, v in scenario.items() if k in SCENARIO_KEYS})
    d["norms"] = None  # the synthetic norms of this run's seed, as its workers replay them
    return SimConfig.from_dict(d)


# -- report ----------------------------------------------------------------------------
def fmt(x: Any, term: str = "") -> str:
    """A table cell: latencies in ms, fractions to 3 places, speedups and passes to 2."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        if "frac" in term:
            return f"{x:.3f}"
        if "speedup" in term or "passes" in term:
            return f"{x:.2f}"
        return f"{x * 1e3:.1f}"
    return str(x)


def write_report(cmp: dict, out: Path, title: str, bursts: Sequence[int], extra: dict | None = None) -> Path:
    """Print the side-by-side table; write crosscheck.csv/.json/.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    lab = cmp["real_label"]
    rows = cmp["rows"]
    table = [["term", "policy", lab, "sim", "rel err", "bound"]]
    for r in rows:
        bound = "" if r["bound"] is None else f"{r['bound']:.0%} " + ("ok" if r["within"] else "OUT")
        table.append([r["term"], r["policy"], fmt(r[lab], r["term"]), fmt(r["sim"], r["term"]),
                      f"{r['rel_err']:+.1%}" if math.isfinite(r["rel_err"]) else "-", bound])
    print(f"\n{title}\n(latencies in ms, slowest worker per iteration; first iteration left out)")
    print(analysis.format_table(table))
    print("\nTwo-sample KS statistic of the per-iteration latency distributions:")
    kt = [["policy / latency", "KS D", "p-value", f"n {lab}", "n sim"]]
    for k, v in cmp["ks"].items():
        kt.append([k, f"{v['statistic']:.3f}", f"{v['pvalue']:.3g}", str(v[f"n_{lab}"]), str(v["n_sim"])])
    print(analysis.format_table(kt))
    bounded = [r for r in rows if r["bound"] is not None]
    outside = [r for r in bounded if not r["within"]]
    if outside:
        print("\nOutside the bounds: " + "; ".join(
            f"{r['term']} ({r['policy']}) {r['rel_err']:+.1%} vs +-{r['bound']:.0%}" for r in outside))
    else:
        print(f"\nAll {len(bounded)} bounded terms within their bounds.")
    with open(out / "crosscheck.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, ["term", "policy", lab, "sim", "rel_err", "bound", "within"])
        w.writeheader()
        w.writerows(rows)
    doc = {"title": title, "bursts": list(bursts), "rows": rows, "ks": cmp["ks"],
           "outside_bounds": [f"{r['term']} ({r['policy']})" for r in outside], **(extra or {})}
    (out / "crosscheck.json").write_text(json.dumps(json_safe(doc), indent=1, allow_nan=False) + "\n")  # NaN -> null
    plot(cmp, out / "crosscheck.png", title, bursts)
    print(f"\nwrote {out}/crosscheck.csv, crosscheck.json, crosscheck.png")
    return out


def plot(cmp: dict, path: Path, title: str, bursts: Sequence[int]) -> None:
    """Latency per iteration and its CDF, both views of every policy overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lab = cmp["real_label"]
    pols = list(cmp["series"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, pol in enumerate(pols):
        c = colors[i % len(colors)]
        for view, ls in ((lab, "-"), ("sim", "--")):
            r, v = cmp["series"][pol][view]
            v = np.asarray(v) * 1e3
            axes[0].plot(r, v, ls, color=c, lw=1.0, label=f"{pol} {view}")
            s = np.sort(v[1:][np.isfinite(v[1:])])
            if s.size:
                axes[1].step(s, np.arange(1, s.size + 1) / s.size, ls, color=c, where="post", label=f"{pol} {view}")
    for j, b in enumerate(bursts):
        axes[0].axvline(b, color="red", ls=":", lw=1, label="burst" if j == 0 else None)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("round latency (ms, slowest worker)")
    axes[0].grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("round latency (ms)")
    axes[1].set_ylabel("fraction of iterations")
    axes[1].grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=10)  # a leaf-spine's title runs long
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
