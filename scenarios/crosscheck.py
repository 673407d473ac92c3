"""Cross-check: the simulator against Mininet (or namespace hosts, ``--hosts``) on the same scenario (and
against real hosts).

    sudo python scenarios/crosscheck.py                              # default scenario, ~2-3 minutes
    sudo python scenarios/crosscheck.py --bandwidth 300 --bursts 25,45,70 --burst-loss 0.5     # an unseen one
    sudo python scenarios/crosscheck.py --bandwidth 300 ... --params results/crosscheck-A/calibration.json
    python scenarios/crosscheck.py --from-run results/crosscheck-B --params results/crosscheck-A/calibration.json
                                                                     # re-analyse a run (no Mininet, no root)

1. **Mininet**: the microburst scenario (``scenarios/microburst.py``'s
   ``run_policy``: the real server and workers in Mininet hosts on TBF-shaped
   links, 70% UDP loss on the server's link at the burst iterations) for
   ``baseline`` (fixed p = P_low) and ``dblp`` on one burst schedule.
2. **Calibration**: ``dblp.sim.studies.calibrate`` on one of those runs (default
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
4. **Report** (:mod:`dblp.sim.studies.crosscheck`: the comparison, the KS test, the report files), side by
   side with the relative error (sim - mininet) / mininet
   of each term: median, p99, max and mean round latency (the slowest
   worker's whole exchange per iteration), send latency (Table II's metric),
   latency at each burst, DBLP-vs-baseline speedups (at each burst, p99,
   mean), received fractions (mean, at each burst), retransmission passes at
   the bursts, and the two-sample Kolmogorov-Smirnov statistic of the
   latency distributions (``scipy.stats.ks_2samp``; a numpy version when
   scipy is missing). The crosscheck's bounds are marked: median and p99 round
   latency within 15%, the speedup at the bursts within 20%. Nothing is
   tuned to meet them: a term outside its bound is reported as such.

Writes ``crosscheck.csv``, ``crosscheck.json``, ``crosscheck.png`` (latency
series and CDFs of both views overlaid), ``calibration.json`` (this run's
calibration, a ``dblp.sim`` params file for ``--params``), ``sim/params.json``
(what was simulated) and ``sim/<policy>.jsonl`` beside the Mininet run
folders ``<policy>/`` - with ``--params``, all but calibration.json in
``transferred/`` under the run folder instead. A re-analysis (``--from-run``)
never writes over a report already there: without ``--params`` it goes into a
new ``reanalysis-<UTC time>/`` beside the run's own report, with ``--params``
into ``transferred/`` if that is still free, else ``transferred-<UTC time>/``.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dblp.results import analysis
from dblp.cli.args import add_burst_args, add_hosts_arg, add_run_args, check_scenario_args, pace_rate, parser
from traces.argtypes import count_arg
from traces.units import rate_arg
from dblp.sim.studies.crosscheck import compare, own_norms, simulate_policies, transfer, write_report
from dblp.cli.provenance import config_record, run_values
from dblp.protocol.wire import ParameterError


# ============================================================================ scenario
def build_parser() -> argparse.ArgumentParser:
    """The microburst scenario's flags (dblp.cli.args), this scenario's defaults, and its own."""
    ap = parser(description=__doc__.split("\n\n")[0])
    add_run_args(ap, iterations=80, policies="baseline,dblp", results=_bootstrap.ROOT / "results")
    ap.set_defaults(pace_share=0.9)  # the simulator models fixed rates only (not dblp.protocol.pacing.AutoPacer): both sides hand-paced
    add_burst_args(ap, bursts="30,60")
    add_hosts_arg(ap)
    ap.set_defaults(quiet=True)
    ap.add_argument("--params", default=None,
                    help="use this dblp.sim params file (a calibration from another run) instead of calibrating on this run")
    ap.add_argument("--calibrate-from", default="baseline", help="the policy run the calibration reads")
    ap.add_argument("--fidelity", choices=["round", "packet"], default="round", help="simulator level")
    ap.add_argument("--from-run", default=None, help="re-analyse an existing crosscheck folder (no Mininet)")
    ap.add_argument("--topology", choices=["star", "leafspine", "twosites"], default="star",
                    help="the network: the paper's star, leaf-spine (topologies/leafspine.py: srv in rack 1, "
                         "workers from rack 2 on, one spine) or two sites (topologies/twosites.py: srv and "
                         "--local-workers in site 1, the other workers behind one WAN link)")
    ap.add_argument("--racks", type=count_arg(1), default=2, help="leaf-spine racks (one leaf switch each)")
    ap.add_argument("--uplink-bandwidth", type=rate_arg(), default=None,
                    help="leaf-spine leaf-to-spine link rate, e.g. 250M; a bare number is Mbit/s "
                         "(default: --bandwidth)")
    ap.add_argument("--local-workers", type=count_arg(0), default=1,
                    help="two sites: workers in the server's site (count); the others cross the WAN")
    ap.add_argument("--wan-bandwidth", type=rate_arg(), default=None,
                    help="two sites: the WAN link's rate, e.g. 300M; a bare number is Mbit/s (default: --bandwidth); "
                         "no WAN delay (this kernel has no netem)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    a = ap.parse_args(argv)
    check_scenario_args(ap, a)
    if a.burst_kind != "drop":
        ap.error("--burst-kind congestion: the simulator models no cross-traffic; use drop bursts")
    if a.params and not Path(a.params).is_file():
        ap.error(f"argument --params: no file {a.params!r}")
    if a.from_run and not Path(a.from_run, "config.json").is_file():
        ap.error(f"argument --from-run: {a.from_run!r} is not a crosscheck run folder (no config.json)")
    if not a.from_run:
        from emulation.hostnet import resolve_hosts

        try:
            a.hosts_kind, a.hosts_why = resolve_hosts(a.hosts)
        except ValueError as exc:
            ap.error(str(exc))
        if a.topology != "star" and a.hosts_kind != "mininet":
            ap.error(f"--topology {a.topology}: Mininet hosts only ({a.hosts_why}); namespace hosts make the star")
    if a.topology == "twosites" and a.local_workers > a.workers:
        ap.error(f"argument --local-workers: {a.local_workers} is more than the {a.workers} workers")
    if not a.params and not a.from_run and a.calibrate_from not in a.policy_list:
        ap.error(f"argument --calibrate-from: {a.calibrate_from!r} is not one of the runs of --policies "
                 f"({', '.join(a.policy_list)})")
    return a


def scenario_settings(a: argparse.Namespace) -> dict:
    """The SimConfig keys this scenario fixes (and a calibration must not change)."""
    return {"model": a.elements, "workers": a.workers, "rounds": a.iterations, "bandwidth_bps": a.bandwidth,
            "queue_bytes": a.queue, "send_rate_bps": pace_rate(a),
            "loss": [{"kind": "iteration_bursts", "at": list(a.bursts_list), "loss": a.burst_loss}],
            "seed": a.seed, "eta": a.eta, "freq": a.freq, "wire": 1 if a.insecure else 2, "mtu": a.mtu,
            **_fabric_settings(a)}


def _fabric_settings(a: argparse.Namespace) -> dict:
    """The SimConfig keys of a fabric other than the star (a run folder from before a flag: its default)."""
    topology = getattr(a, "topology", "star")
    if topology == "leafspine":
        return {"topology": "leafspine", "racks": a.racks, "spines": 1,
                "uplink_bandwidth_bps": a.uplink_bandwidth or a.bandwidth}
    if topology == "twosites":  # no netem here: the WAN has no delay, as the Mininet fabric
        return {"topology": "twosites", "local_workers": getattr(a, "local_workers", 1),
                "wan_bandwidth_bps": getattr(a, "wan_bandwidth", None) or a.bandwidth, "wan_delay_s": 0.0}
    return {}


def fabric_title(a: argparse.Namespace) -> str:
    """The network in words, for the report's title."""
    topology = getattr(a, "topology", "star")
    if topology == "leafspine":
        return f"leaf-spine, {a.racks} racks, uplink {(a.uplink_bandwidth or a.bandwidth) / 1e6:g} Mbit/s"
    if topology == "twosites":
        f = _fabric_settings(a)
        return f"two sites, {f['local_workers']} local worker(s), WAN {f['wan_bandwidth_bps'] / 1e6:g} Mbit/s"
    return "star"


def run_mininet(a: argparse.Namespace) -> Path:
    from emulation.bursts import bursts_from_spec
    from emulation.launch import run_scenario_policy
    from emulation.hostnet import star_net
    from emulation.loss import LossController
    from emulation.recorder import RunRecorder

    config = config_record(a)  # the flags as given (--config reruns the run) and, apart, what it derived
    rec = RunRecorder("crosscheck", config, root=a.results, out=a.out)
    out = rec.path
    print(f"crosscheck: {a.topology}, {a.elements:,} float32 gradient, {a.workers} workers, {a.bw_mbps:g} Mbit/s links, "
          f"{a.queue:,}-byte queues, {a.iterations} iterations, {a.burst_loss:.0%} bursts at {a.bursts_list}, "
          f"policies {', '.join(a.policy_list)}\n  hosts: {a.hosts_kind} ({a.hosts_why})\n  results: {out}", flush=True)
    (spec,) = scenario_settings(a)["loss"]  # the simulator's loss spec, injected as it is
    schedule = bursts_from_spec(spec, rounds=a.iterations, seed=a.seed)

    def topo():  # the Mininet topology (topologies import Mininet: only when it is the host kind)
        if a.topology == "leafspine":
            from topologies.leafspine import LeafSpineTopo

            return LeafSpineTopo(racks=a.racks, spines=1, n=a.workers, bw=a.bw_mbps, buffer_bytes=a.queue,
                                 uplink_bw=(a.uplink_bandwidth or a.bandwidth) / 1e6)
        if a.topology == "twosites":
            from topologies.twosites import TwoSitesTopo

            return TwoSitesTopo(n=a.workers, local_workers=a.local_workers, lan_bw=a.bw_mbps,
                                wan_bw=(a.wan_bandwidth or a.bandwidth) / 1e6, buffer_bytes=a.queue)
        from topologies.star import StarTopo

        return StarTopo(n=a.workers, bw=a.bw_mbps, buffer_bytes=a.queue, cross_hosts=0)

    net = star_net(a.hosts_kind, workers=a.workers, bw_mbps=a.bw_mbps, queue_bytes=a.queue, mtu=a.mtu,
                   name="crosscheck", topo=topo)
    with net, LossController(net) as lc:
        rec.snapshot("start", net=net, loss=lc)
        for name in a.policy_list:
            t = time.time()
            d = run_scenario_policy(name, a, net, lc, out, schedule, env={"PYTHONPATH": str(_bootstrap.ROOT)})
            # the calibration reads the scenario (link rate, buffer, workers...) from the run folder
            (d / "config.json").write_text(json.dumps({**config, "policy_run": name}, indent=1, default=str))
            print(f"  {a.hosts_kind} {name:9s}: {a.iterations} iterations in {time.time() - t:.0f} s", flush=True)
        rec.finish(net=net, loss=lc)
    return out


def report_folder(run: Path, *, params: bool, reanalysis: bool) -> Path:
    """Where an analysis of ``run`` writes its report, created here.

    A fresh run's own analysis writes into the run folder (``transferred/`` with ``--params``, so both
    analyses can stand side by side). A re-analysis (``--from-run``) must not replace what the run
    reported when it was made: it gets a new folder beside it, ``reanalysis-<UTC time>/`` (or
    ``transferred/`` while that is free, else ``transferred-<UTC time>/``, with ``--params``)."""
    if not reanalysis:
        out = run / "transferred" if params else run
        out.mkdir(exist_ok=True)
        return out
    if params and not (run / "transferred").exists():
        (run / "transferred").mkdir()
        return run / "transferred"
    stem = f"{'transferred' if params else 'reanalysis'}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    for n in range(1, 1000):  # two re-analyses within one second: -2, -3, ...
        out = run / (stem if n == 1 else f"{stem}-{n}")
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
    raise ParameterError(f"{run}: no free folder name {stem}-N for the re-analysis")


def analyse(a: argparse.Namespace, run: Path) -> dict:
    """Calibrate (or transfer ``--params``), simulate, compare; the report goes into :func:`report_folder`."""
    from dblp.sim.studies.calibrate import calibrate

    real = {p: analysis.load(run / p / "records") for p in a.policy_list}
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
    out = report_folder(run, params=bool(a.params), reanalysis=bool(a.from_run))  # once it can calibrate
    if out != run:
        print(f"crosscheck: report -> {out}", flush=True)
    meta = {"_crosscheck": {"how": how, **{k: v for k, v in notes.items() if k != "record_files"}}}
    if not a.params:
        cal.to_json(out / "calibration.json", extra=meta)  # reusable: --params on another scenario
    (out / "sim").mkdir(exist_ok=True)
    cal.to_json(out / "sim" / "params.json", extra=meta)  # what was simulated (policy set per run)
    print(f"\nsimulator: {how}\n  link {cal.bandwidth_bps / 1e6:.0f} Mbit/s, worker {cal.send_pps:.0f} datagrams/s, "
          f"server {cal.server_pps:.0f} datagrams/s, receive {cal.server_recv_cost_s * 1e6:.2f} / "
          f"{cal.recv_cost_s * 1e6:.2f} us a delivered datagram (server / worker), compute {cal.compute_s * 1e3:.2f} ms, "
          f"reduce {cal.reduce_s * 1e3:.2f} ms, loss {cal.loss}", flush=True)
    for who, h in ((k, notes.get("estimates", {}).get("host", {}).get(k)) for k in ("worker", "server")):
        if h:  # a calibration on this run: whether the run showed the host's cost (dblp.sim.studies.calibrate)
            print(f"  {who} host: {h['how']}", flush=True)
            if h.get("receive"):  # its receive part (dblp.sim.studies.calibrate._receive_costs)
                print(f"  {who} host's datagrams, receive part: {h['receive']}", flush=True)
    sim = simulate_policies(cal, a.policy_list, a.p_low, a.p_high, out / "sim", a.fidelity,
                            norms=None if a.params else own_norms(run, a.policy_list))
    kind = getattr(a, "hosts_kind", "mininet")  # a run folder from before --hosts: Mininet's
    cmp = compare(real, sim, a.bursts_list, real_label=kind)
    net = fabric_title(a)
    title = (f"Cross-check: {'Mininet' if kind == 'mininet' else 'namespace hosts'} vs simulator ({a.fidelity} level, {how}); {net}, {a.bw_mbps:g} Mbit/s host links, "
             f"{a.workers} workers, {a.elements:,} elements, bursts {a.bursts_list} at {a.burst_loss:.0%}")
    write_report(cmp, out, title, a.bursts_list,
                 extra={"scenario": scen, "calibration": cal.to_dict() | {"norms": "..." if cal.norms else None},
                        "how": how})
    return cmp


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.from_run:
        out = Path(a.from_run)
        if not (out / "config.json").is_file():
            print(f"crosscheck: {out} is not a run folder (no config.json)", file=sys.stderr)
            return 2
        own = {"params", "calibrate_from", "fidelity", "from_run", "results", "out"}
        values = run_values(json.loads((out / "config.json").read_text()))  # the values it used
        # flags as typed ("p-low") first, then the parsed values (derived, "p_low") over them
        for k, v in sorted(values.items(), key=lambda kv: "-" not in kv[0]):
            k = k.replace("-", "_")  # config.json names a flag as typed: the attribute is its dest
            if not k.startswith("_") and k not in own:
                setattr(a, k, v)  # the run's scenario, whatever the command line says
    else:
        if os.geteuid() != 0:
            print("crosscheck.py needs root for Mininet: run it as `sudo python scenarios/crosscheck.py` "
                  "(or --from-run FOLDER to re-analyse a run)", file=sys.stderr)
            return 2
        out = run_mininet(a)
    try:
        analyse(a, out)
    except ParameterError as exc:  # a run it cannot calibrate (e.g. no lossless rounds): one line, not a traceback
        print(f"crosscheck: cannot calibrate the simulator on {out}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from emulation.runstate import exit_main

    exit_main(main, "crosscheck.py")
