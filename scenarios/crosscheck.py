"""Cross-check: the simulator against Mininet on the same scenario (and against real hosts).

    sudo python scenarios/crosscheck.py                              # default scenario, ~2-3 minutes
    sudo python scenarios/crosscheck.py --bw 300 --bursts 25,45,70 --burst-loss 0.5     # an unseen one
    sudo python scenarios/crosscheck.py --bw 300 ... --params results/crosscheck-A/calibration.json
    python scenarios/crosscheck.py --from-run results/crosscheck-B --params results/crosscheck-A/calibration.json
                                                                     # re-analyse a run (no Mininet, no root)

1. **Mininet**: the microburst scenario (``scenarios/microburst.py``'s
   ``run_policy``: the real server and workers in Mininet hosts on TBF-shaped
   links, 70% UDP loss on the server's link at the burst iterations) for
   ``baseline`` (fixed p = P_low) and ``dblp`` on one burst schedule.
2. **Calibration**: ``dblp.sim.calibrate`` on one of those runs (default
   the baseline's: host send rates, compute and reduce time, the gradient
   norms the server saw, the applied burst schedule; link rate and buffer
   from the scenario) - or, with ``--params``, a calibration made on another
   run, with only this scenario's own settings (link rate, buffer, pacing,
   bursts, model, iterations, seed) put in. The second form is the real test
   of the model: nothing of this run is fitted.
   Each policy's simulation gets the gradient norms its own run's server saw
   (the CLR detector's input; with ``--params``: the synthetic norms of the
   seed, which the workers replay).
3. **Simulation** of every policy with the same configuration and seed.
4. **Report**, side by side with the relative error (sim - mininet) / mininet
   of each term: median, p99, max and mean round latency (the slowest
   worker's whole exchange per iteration), send latency (Table II's metric),
   latency at each burst, DBLP-vs-baseline speedups (at each burst, p99,
   mean), received fractions (mean, at each burst), retransmission passes at
   the bursts, and the two-sample Kolmogorov-Smirnov statistic of the
   latency distributions (``scipy.stats.ks_2samp``; a numpy version when
   scipy is missing). The issue's bounds are marked: median and p99 round
   latency within 15%, the speedup at the bursts within 20%. Nothing is
   tuned to meet them: a term outside its bound is reported as such.

Writes ``crosscheck.csv``, ``crosscheck.json``, ``crosscheck.png`` (latency
series and CDFs of both views overlaid), ``calibration.json`` (this run's
calibration, a ``dblp.sim`` params file for ``--params``), ``sim/params.json``
(what was simulated) and ``sim/<policy>.jsonl`` beside the Mininet run
folders ``<policy>/`` - with ``--params``, all but calibration.json in
``transferred/`` under the run folder instead.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dblp import analysis
from dblp.records import RoundRecord

DEFAULTS = ["--iterations", "80", "--bursts", "30,60", "--policies", "baseline,dblp", "--quiet"]
BOUNDS = {"round p50": 0.15, "round p99": 0.15, "speedup @burst": 0.20}
#: scenario settings that replace a transferred calibration's (--params); the rest are host constants
SCENARIO_KEYS = ("model", "workers", "rounds", "bandwidth_bps", "server_bandwidth_bps", "queue_bytes",
                 "send_rate_bps", "loss", "seed", "eta", "freq", "mtu")


# ============================================================================ statistics
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
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    d = float(np.max(np.abs(np.searchsorted(a, x, "right") / a.size - np.searchsorted(b, x, "right") / b.size)))
    en = math.sqrt(a.size * b.size / (a.size + b.size))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, float(min(1.0, max(0.0, p)))


def rel_err(sim: float, real: float) -> float:
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


# ============================================================================ simulation
def policy_config(cal, policy: str, p_low: float, p_high: float):
    """The calibrated configuration under one of the scenario's policies."""
    if policy == "reliable":
        return cal.with_(policy="reliable", p=0.0, p_low=None, p_high=None)
    if policy == "baseline":
        return cal.with_(policy="fixed", p=p_low, p_low=None, p_high=None)
    return cal.with_(policy="dblp", p=p_low, p_low=p_low, p_high=p_high)


def own_norms(run: Path, policies: Sequence[str]) -> dict[str, list[float]]:
    """Each policy run's gradient-norm sequence as its server saw it (zero-fill effect divided out,
    as ``dblp.sim.calibrate`` does). A training run's norms differ between the policies' runs, and
    the CLR detector of each must see its own; synthetic runs replay one sequence (same seed)."""
    from dblp.sim.calibrate import calibrate

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


def simulate_policies(cal, policies: Sequence[str], p_low: float, p_high: float, out: Path,
                      fidelity: str = "round", norms: dict[str, list[float]] | None = None
                      ) -> dict[str, list[RoundRecord]]:
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


def transfer(params: Path, scenario: dict) -> Any:
    """A calibration made on another run, with this scenario's own settings put in."""
    from dblp.sim import SimConfig

    d = SimConfig.from_json(params).to_dict()
    d.update({k: v for k, v in scenario.items() if k in SCENARIO_KEYS})
    d["norms"] = None  # the synthetic norms of this run's seed, as its workers replay them
    return SimConfig.from_dict(d)


# ============================================================================ report
def fmt(x: Any, term: str = "") -> str:
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
    (out / "crosscheck.json").write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    plot(cmp, out / "crosscheck.png", title, bursts)
    print(f"\nwrote {out}/crosscheck.csv, crosscheck.json, crosscheck.png")
    return out


def plot(cmp: dict, path: Path, title: str, bursts: Sequence[int]) -> None:
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
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ============================================================================ scenario
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import microburst

    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Every scenarios/microburst.py flag is accepted too "
        f"(defaults here: {' '.join(DEFAULTS)}); see `python scenarios/microburst.py --help`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--params", default=None,
                    help="use this dblp.sim params file (a calibration from another run) instead of calibrating on this run")
    ap.add_argument("--calibrate-from", default="baseline", help="the policy run the calibration reads")
    ap.add_argument("--fidelity", choices=["round", "packet"], default="round", help="simulator level")
    ap.add_argument("--from-run", default=None, help="re-analyse an existing crosscheck folder (no Mininet)")
    own, rest = ap.parse_known_args(argv)
    if any(x in ("-h", "--help") for x in rest):
        ap.print_help()
        raise SystemExit(0)
    a = microburst.parse_args(DEFAULTS + rest)
    for k, v in vars(own).items():
        setattr(a, k, v)
    if a.burst_kind != "drop":
        ap.error("--burst-kind congestion: the simulator models no cross-traffic; use drop bursts")
    return a


def scenario_settings(a: argparse.Namespace) -> dict:
    """The SimConfig keys this scenario fixes (and a calibration must not change)."""
    wire = 1500 + 14  # TBF buffer counted in full frames, as topologies/star does
    share = a.bw * 1e6 / a.workers
    return {"model": a.elements, "workers": a.workers, "rounds": a.iterations, "bandwidth_bps": a.bw * 1e6,
            "queue_bytes": a.buffer * wire, "send_rate_bps": a.pace * share if a.pace > 0 else 0.0,
            "loss": [{"kind": "iteration_bursts", "at": list(a.bursts_list), "loss": a.burst_loss}],
            "seed": a.seed, "eta": a.eta, "freq": a.freq}


def run_mininet(a: argparse.Namespace) -> Path:
    from emulation.bursts import IterationBurst
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from emulation.recorder import RunRecorder
    from topologies.star import StarTopo

    import microburst

    config = {k: v for k, v in vars(a).items() if not k.startswith("_")}
    rec = RunRecorder("crosscheck", config, root=a.results)
    out = rec.path
    print(f"crosscheck: {a.elements:,} float32 gradient, {a.workers} workers, {a.bw:g} Mbit/s links, "
          f"{a.buffer}-packet buffers, {a.iterations} iterations, {a.burst_loss:.0%} bursts at {a.bursts_list}, "
          f"policies {', '.join(a.policy_list)}\n  results: {out}", flush=True)
    schedule = [IterationBurst(b, a.burst_loss, 1) for b in a.bursts_list]
    topo = StarTopo(n=a.workers, bw=a.bw, buffer_pkts=a.buffer, cross_hosts=0)
    with EmuNet(topo, name="crosscheck") as net, LossController(net) as lc:
        rec.snapshot("start", net=net, loss=lc)
        for name in a.policy_list:
            t = time.time()
            d = microburst.run_policy(name, a, net, lc, out, schedule)
            # the calibration reads the scenario (link rate, buffer, workers...) from the run folder
            (d / "config.json").write_text(json.dumps({**config, "policy_run": name}, indent=1, default=str))
            print(f"  mininet {name:9s}: {a.iterations} iterations in {time.time() - t:.0f} s", flush=True)
        rec.finish(net=net, loss=lc)
    return out


def analyse(a: argparse.Namespace, run: Path) -> dict:
    """Calibrate (or transfer ``--params``), simulate, compare; the report goes into the run folder
    (``transferred/`` under it with ``--params``, so both analyses of one run can stand side by side)."""
    from dblp.sim.calibrate import calibrate

    real = {p: analysis.load(run / p / "records") for p in a.policy_list}
    out = run / "transferred" if a.params else run
    out.mkdir(exist_ok=True)
    scen = scenario_settings(a)
    if a.params:
        cal = transfer(Path(a.params), scen)
        how = f"transferred from {a.params} (host constants), this scenario's settings put in"
        notes: dict = {"params": str(a.params)}
    else:
        src = a.calibrate_from if a.calibrate_from in a.policy_list else a.policy_list[0]
        cal, notes = calibrate(run / src)
        cal = cal.with_(**{k: v for k, v in scen.items() if k != "loss"})  # the scenario as set, not as estimated
        how = f"calibrated on this run's {src} records"
    meta = {"_crosscheck": {"how": how, **{k: v for k, v in notes.items() if k != "record_files"}}}
    if not a.params:
        cal.to_json(out / "calibration.json", extra=meta)  # reusable: --params on another scenario
    (out / "sim").mkdir(exist_ok=True)
    cal.to_json(out / "sim" / "params.json", extra=meta)  # what was simulated (policy set per run)
    print(f"\nsimulator: {how}\n  link {cal.bandwidth_bps / 1e6:.0f} Mbit/s, worker {cal.send_pps:.0f} datagrams/s, "
          f"server {cal.server_pps:.0f} datagrams/s, compute {cal.compute_s * 1e3:.2f} ms, "
          f"reduce {cal.reduce_s * 1e3:.2f} ms, loss {cal.loss}", flush=True)
    sim = simulate_policies(cal, a.policy_list, a.p_low, a.p_high, out / "sim", a.fidelity,
                            norms=None if a.params else own_norms(run, a.policy_list))
    cmp = compare(real, sim, a.bursts_list)
    title = (f"Cross-check: Mininet vs simulator ({a.fidelity} level, {how}); {a.bw:g} Mbit/s, "
             f"{a.elements:,} elements, bursts {a.bursts_list} at {a.burst_loss:.0%}")
    write_report(cmp, out, title, a.bursts_list,
                 extra={"scenario": scen, "calibration": cal.to_dict() | {"norms": "..." if cal.norms else None},
                        "how": how})
    return cmp


def crosscheck_hosts(inv, out: Path, fidelity: str = "round") -> dict | None:
    """The same cross-check for a :mod:`dblp.hosts` run folder: calibrate on its baseline (or first)
    run, take the compute term from the workers' measured compute times (``sim_compute.json``),
    simulate every policy, report into ``out/crosscheck/``."""
    from dblp.hosts import _rate_bps
    from dblp.sim.calibrate import calibrate

    pols = [p for p in inv.run.policies if (out / p / "records").is_dir()]
    if not pols:
        print("crosscheck: no gathered records", file=sys.stderr)
        return None
    src = "baseline" if "baseline" in pols else pols[0]
    cal, notes = calibrate(out / src)
    over: dict[str, Any] = {"workers": len(inv.workers), "rounds": inv.rounds, "seed": inv.run.seed,
                            "eta": inv.run.eta, "freq": inv.run.freq}
    if inv.network.bandwidth:
        over["bandwidth_bps"] = _rate_bps(inv.network.bandwidth)
        over["queue_bytes"] = inv.network.queue_packets * 1514
    simc = out / "sim_compute.json"
    how = f"calibrated on the hosts' {src} records"
    if simc.exists():
        c = json.loads(simc.read_text())
        over.update(compute_s=c["compute_s"], compute_jitter_s=c["compute_jitter_s"])
        how += f", compute {c['compute_s'] * 1e3:.2f} ms measured on {', '.join(c['_devices'])}"
    cal = cal.with_(**over)
    (out / "crosscheck").mkdir(exist_ok=True)
    cal.to_json(out / "crosscheck" / "calibration.json", extra={"_crosscheck": {"how": how}})
    bursts = sorted({k for h in inv.hosts for r in h.loss for k in r.rounds})
    p_high = inv.run.p_high if inv.run.p_high is not None else inv.run.p_low + 0.4
    sim = simulate_policies(cal, pols, inv.run.p_low, p_high, out / "crosscheck" / "sim", fidelity,
                            norms=own_norms(out, pols))
    real = {p: analysis.load(out / p / "records") for p in pols}
    cmp = compare(real, sim, bursts, real_label="hosts")
    write_report(cmp, out / "crosscheck", f"Cross-check: hosts ({inv.run.transport}) vs simulator ({how})", bursts,
                 extra={"how": how})
    return cmp


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.from_run:
        out = Path(a.from_run)
        if not (out / "config.json").is_file():
            print(f"crosscheck: {out} is not a run folder (no config.json)", file=sys.stderr)
            return 2
        own = {"params", "calibrate_from", "fidelity", "from_run"}
        for k, v in json.loads((out / "config.json").read_text()).items():
            if not k.startswith("_") and k not in own:
                setattr(a, k, v)  # the run's scenario, whatever the command line says
    else:
        if os.geteuid() != 0:
            print("crosscheck.py needs root for Mininet: run it as `sudo python scenarios/crosscheck.py` "
                  "(or --from-run FOLDER to re-analyse a run)", file=sys.stderr)
            return 2
        out = run_mininet(a)
    analyse(a, out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ncrosscheck.py: interrupted; what the run made was removed (partial results stay in the run folder)",
              file=sys.stderr)
        sys.exit(130)
