"""DBLP on real machines (GPU workers) from an inventory file, then the same cross-check as in Mininet.

    python scenarios/gpu_hosts.py hosts.toml                # run, gather, summarize, cross-check
    python scenarios/gpu_hosts.py hosts.toml --no-crosscheck
    sudo python scenarios/gpu_hosts.py docs/hosts-netns.toml   # namespace "hosts" on this machine

The inventory format and what a run does are in ``docs/hosts.md``; the
launcher is :mod:`emulation.hosts` (ssh to the hosts, ``torchrun`` for training
workers, ``netns``/``local`` stand-ins on one machine). After the run this
prints, per policy, the latency summary (the Mininet scenario's Table II when
both ``baseline`` and ``dblp`` ran), the device each worker used and its
per-iteration compute time, and then - unless ``--no-crosscheck`` - runs the
simulator on the same configuration with the compute term measured on the
hosts and reports the two side by side (:mod:`dblp.sim.studies.crosscheck`, as ``scenarios/crosscheck.py``).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dblp.results import analysis
from dblp.cli.args import pace_arg, parser
from dblp.sim.studies.crosscheck import compare, own_norms, simulate_policies, write_report
from emulation.hosts import launch, load_inventory
from emulation.hosts.cli import STOPS, stopped
from emulation.hosts.gather import policy_comparison
from emulation.hosts.inventory import DBLP_POLICIES
from traces.units import parse_queue, parse_rate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inventory", help="inventory TOML (docs/hosts.md)")
    ap.add_argument("--results", default=str(_bootstrap.ROOT / "results"), help="parent folder of the run folder")
    ap.add_argument("--no-crosscheck", action="store_true", help="skip the simulator cross-check")
    ap.add_argument("--fidelity", choices=["round", "packet"], default="round", help="simulator level")
    return ap.parse_args(argv)


def dblp_policies(inv) -> list[str]:
    """The inventory's policies that ran through a DBLP server (gloo/nccl have no send latency to compare)."""
    return [p for p in inv.run.policies if p in DBLP_POLICIES]


def report(inv, out: Path) -> dict:
    runs = {p: analysis.load(out / p / "records") for p in dblp_policies(inv) if (out / p / "records").is_dir()}
    bursts = inv.burst_starts()
    sums = {k: analysis.summarize(v, bursts) for k, v in runs.items()}
    if "baseline" in sums and "dblp" in sums:
        print("\nTable II (this run): send latency, slowest worker, seconds")
        print(analysis.format_table(analysis.table_ii(sums["baseline"], sums["dblp"], bursts)))
    hdr = ["run", "p50", "p99", "max", "mean"] + [f"@{b}" for b in bursts] + ["min recv frac"]
    rows = [hdr] + [[k, f"{s.p50:.4f}", f"{s.p99:.4f}", f"{s.tail_max:.4f}", f"{s.mean:.4f}"]
                    + [f"{x:.4f}" for x in s.at_bursts] + [f"{s.recv_frac_min:.3f}"] for k, s in sums.items()]
    print("\nSend latency (s, slowest worker per iteration):")
    print(analysis.format_table(rows))
    print("\nEvery policy on the same hosts (exchange: slowest worker per iteration; gloo/nccl: torch's "
          "all-reduce, no loss rules):")
    print(analysis.format_table(policy_comparison(out, inv.run.policies, bursts)))
    for p in dblp_policies(inv):
        hs = out / p / "hook_summary.json"
        if hs.exists():
            h = json.loads(hs.read_text())
            r = h.get("rules_in_place")
            if r:
                print(f"{p}: bursts in place {r['median_ms']:.2f} ms (max {r['max_ms']:.2f}) after their round was due, "
                      f"before its first datagram (round hook over the kept connection; {r['n']} switches)")
    devices = json.loads((out / "devices.json").read_text())
    print("\nDevices:")
    for h, d in devices.items():
        used = d.get("device_used", "-")
        print(f"  {h:10s} {d['role']:7s} gpus={d.get('gpus') or '-'}  used: {used}")
    simc = out / "sim_compute.json"
    if simc.exists():
        c = json.loads(simc.read_text())
        print(f"\nCompute per iteration (workers, first iteration left out): median {c['compute_s'] * 1e3:.2f} ms, "
              f"std {c['compute_jitter_s'] * 1e3:.2f} ms, p90 {c['_p90_s'] * 1e3:.2f} ms over {c['_samples']} "
              f"iterations -> {simc.name} (dblp.sim SimConfig keys)")
    if runs:
        analysis.plot_latency(runs, out / "latency.png", bursts, f"Send latency per iteration ({inv.run.name})")
        analysis.plot_cdf(runs, out / "cdf.png")
    return {k: s.as_dict() for k, s in sums.items()}


def crosscheck_hosts(inv, out: Path, fidelity: str = "round") -> dict | None:
    """The cross-check of ``scenarios/crosscheck.py`` for a :mod:`emulation.hosts` run folder: calibrate on
    its baseline (or first) run, take the compute term from the workers' measured compute times (``sim_compute.json``),
    simulate every policy, report into ``out/crosscheck/``."""
    from dblp.sim.studies.calibrate import calibrate

    pols = [p for p in dblp_policies(inv) if (out / p / "records").is_dir()]
    if not pols:
        print("crosscheck: not run: no DBLP policy's records were gathered (the simulator models DBLP, "
              "not torch's all-reduce)")
        return None
    src = "baseline" if "baseline" in pols else pols[0]
    try:
        cal, notes = calibrate(out / src)
    except ValueError as exc:  # ParameterError: a run it cannot calibrate - one line, not a traceback
        hint = ("; the senders were unpaced ([run].rate = \"0\"): pace them below the link rate "
                "(docs/hosts.md)") if pace_arg(inv.run.rate) == 0 else ""
        print(f"crosscheck: not run: cannot calibrate the simulator on this run: {exc}{hint}")
        return None
    over: dict[str, Any] = {"workers": len(inv.workers), "rounds": inv.rounds, "seed": inv.run.seed,
                            "eta": inv.run.eta, "freq": inv.run.freq}
    if inv.network.bandwidth:
        over["bandwidth_bps"] = parse_rate(inv.network.bandwidth)
        over["queue_bytes"] = parse_queue(f"{inv.network.queue_packets}pkt")
    simc = out / "sim_compute.json"
    how = f"calibrated on the hosts' {src} records"
    if simc.exists():
        c = json.loads(simc.read_text())
        over.update(compute_s=c["compute_s"], compute_jitter_s=c["compute_jitter_s"])
        how += f", compute {c['compute_s'] * 1e3:.2f} ms measured on {', '.join(c['_devices'])}"
    cal = cal.with_(**over)
    (out / "crosscheck").mkdir(exist_ok=True)
    cal.to_json(out / "crosscheck" / "calibration.json", extra={"_crosscheck": {"how": how}})
    bursts = inv.burst_starts()
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
    try:
        inv = load_inventory(a.inventory)
        out = launch(inv, a.results)
    except STOPS as exc:
        return stopped("gpu_hosts", exc)
    sums = report(inv, out)
    (out / "summary_runs.json").write_text(json.dumps(sums, indent=1) + "\n")
    if not a.no_crosscheck:
        crosscheck_hosts(inv, out, fidelity=a.fidelity)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
