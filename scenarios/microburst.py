"""Microbursts against DBLP and its baselines in emulated hosts (paper section V-B, Table II).

    sudo python scenarios/microburst.py            # defaults: a few minutes on 2 cores
    sudo python scenarios/microburst.py --config docs/experiments/efficientnet_b0.toml   # the paper's run (GPU)

The real DBLP server and three real workers run as processes in emulated
hosts on a star of TBF-shaped links (Linux bridges, no controller): Mininet
hosts, or plain network namespaces where Mininet is missing (``--hosts``,
:mod:`emulation.hostnet`; the same scenario code on either). Training workers
compute on the GPU when there is one (``--device``; several share it). A burst
of 70% loss on the server's link, UDP only (the control channel stays
reliable), hits chosen iterations. The same schedule is run for:

* ``reliable``: p = 0, what a fully reliable transport pays;
* ``baseline``: fixed p = P_low (MLT's bounded loss, paper Table I);
* ``dblp``: P_low in the critical learning regime, P_high outside it.

It prints the paper's Table II for this run (latency at each burst, tail,
p99, average, DBLP's speedup over the baseline), the retransmission passes
each side needed at each burst next to the tolerance arithmetic, and writes
rounds.jsonl/CSV, a latency-per-iteration plot and a CDF as PNG into
``results/microburst-<time>/``. With a training workload (the default) it
also prints Tables IV and V: the final accuracy, and the training time to the
last iteration beside the time to each ``--target-accuracy`` (tested every
``--eval-every`` iterations), normalised to DBLP. ``--seeds N`` runs every
policy N times, interleaved, into ``seed<s>/`` and prints every figure as a
median with its 95% interval, and whether DBLP's difference to the baseline
is larger than the spread (docs/time-to-accuracy.md).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import csv
import json
import os
import sys
from pathlib import Path

from dblp.results import analysis
from dblp.protocol.compensation import Compensation
from dblp.protocol.control import DEFAULT_PORT
from dblp.cli.args import (add_burst_args, add_compensation_args, add_configs_arg, add_hosts_arg, add_run_args,
                          add_seeds_arg, add_workload_args, check_compensation_args, check_configs_arg,
                          check_scenario_args, parser)
from dblp.protocol.policy import passes_needed
from dblp.protocol.policy import run_policy as named_policy
from dblp.cli.provenance import config_record
from dblp.protocol.records import merge_runs
from dblp.protocol.wire import TAG_SIZE, ChunkLayout

PORT = DEFAULT_PORT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    a = ap.parse_args(argv)
    check_args(ap, a)
    return a


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Every flag's check after parsing: a run's, a dry run's and ``--print-config``'s alike."""
    check_scenario_args(ap, a)
    check_compensation_args(ap, a)
    check_configs_arg(ap, a)
    from emulation.hostnet import resolve_hosts

    try:
        a.hosts_kind, a.hosts_why = resolve_hosts(a.hosts)
    except ValueError as exc:
        ap.error(str(exc))


def build_parser() -> argparse.ArgumentParser:
    """The flags (dblp.cli.args: the emulation scenarios' shared vocabulary, plus bursts)."""
    ap = parser(description="Microburst experiment (paper V-B): reliable vs baseline (fixed p) vs DBLP in emulated "
                            "hosts (Mininet or network namespaces).")
    add_run_args(ap, iterations=150, policies="reliable,baseline,dblp", results=_bootstrap.ROOT / "results")
    add_hosts_arg(ap)
    add_workload_args(ap, default="digits_mlp")
    ap.add_argument("--consistency", choices=["none", "intersect"], default="none",
                    help="the server's replica consistency mode (none: the paper's; intersect: every worker "
                         "applies only the chunks all received, identical replicas)")
    add_burst_args(ap)
    add_compensation_args(ap)
    add_configs_arg(ap)
    ap.add_argument("--dry-run", action="store_true",
                    help="check every flag (and --config file), build the workload, print the run it would make "
                         "(and a JSON line of it), start nothing; needs no root")
    add_seeds_arg(ap)
    ap.add_argument("--no-calm", action="store_true",
                    help="training runs: skip the extra runs of baseline and dblp without bursts (Table V's rows "
                         "without bursts)")
    ap.print_checks = (check_args,)  # --print-config checks the values it prints (dblp.cli.configfile)
    return ap


def policy_args(name: str, a: argparse.Namespace) -> list[str]:
    """The server flags of a named run (dblp.protocol.policy.run_policy)."""
    return named_policy(name, a.p_low, a.p_high, a.eta, a.freq).flags()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:  # every flag checked, the workload built: what a run would be, nothing started
        print(describe(a, "(not made: --dry-run)"))
        print(json.dumps(plan(a)))
        return 0
    if os.geteuid() != 0:
        print("microburst.py needs root for the emulated hosts (namespaces, tc, nft): run it as "
              "`sudo python scenarios/microburst.py`", file=sys.stderr)
        return 2
    from emulation.bursts import CongestionBurst, bursts_from_spec
    from emulation.hostnet import star_net
    from emulation.launch import run_replicates
    from emulation.loss import LossController
    from emulation.recorder import RunRecorder

    config = config_record(a)  # the flags as given (--config reruns the run) and, apart, what it derived
    rec = RunRecorder("microburst", config, root=a.results, out=a.out)
    out = rec.path
    print(describe(a, out), flush=True)
    if a.burst_kind == "drop":
        spec = {"kind": "iteration_bursts", "at": a.bursts_list, "loss": a.burst_loss}  # traces.processes
        schedule = bursts_from_spec(spec, rounds=a.iterations, seed=a.seed)
    else:
        schedule = [CongestionBurst(src="x1", dst="srv", rate_mbps=a.bw_mbps * 3, duration_s=1.0, at_iteration=b)
                    for b in a.bursts_list]
    cross = 1 if a.burst_kind == "congestion" else 0  # x1 sends the cross-traffic, on a 10x faster link

    def topo():  # the Mininet star (topologies import Mininet: only when it is the host kind)
        from topologies.star import StarTopo

        return StarTopo(n=a.workers, bw=a.bw_mbps, buffer_bytes=a.queue, cross_hosts=cross, cross_bw=10 * a.bw_mbps)

    seeds = list(range(a.seed, a.seed + a.seeds))
    variants = [(label, comp.to_dict()) for label, comp in a.config_list]  # dblp with other options
    calm = [n for n in ("baseline", "dblp") if n in a.policy_list] + [label for label, _ in variants] \
        if a.train and a.bursts_list and not a.no_calm else []
    net = star_net(a.hosts_kind, workers=a.workers, bw_mbps=a.bw_mbps, queue_bytes=a.queue, mtu=a.mtu,
                   cross_hosts=cross, cross_bw_mbps=10 * a.bw_mbps, name="microburst", topo=topo)
    with net, LossController(net) as lc:
        rec.snapshot("start", net=net, loss=lc)
        for name in a.policy_list:
            print(f"- {name}: {' '.join(policy_args(name, a))}", flush=True)
        for label, comp in a.config_list:
            print(f"- {label}: {' '.join(policy_args('dblp', a) + comp.flags())}", flush=True)
        py = str(_bootstrap.VENV_PY if _bootstrap.VENV_PY.exists() else sys.executable)
        dirs = run_replicates(a, net, lc, out, schedule, policies=a.policy_list, calm=calm, seeds=seeds, python=py,
                              variants=variants, env={"PYTHONPATH": str(_bootstrap.ROOT)})  # Table V's rows without bursts: calm
        rec.finish(net=net, loss=lc)
    names = a.policy_list + [label for label, _ in a.config_list]
    by_seed = {sd: {name: analysis.load(dirs[sd][name] / "records") for name in names} for sd in seeds}
    runs = by_seed[seeds[0]]
    merge_runs(runs, out / "rounds.jsonl")  # each row labelled with its run in "run" (the first seed's)
    report(a, runs, out, by_seed)
    if a.train:
        from dblp.results.trainreport import report as training_report

        from dblp.results.tta import report as answer

        bursts = f"with bursts at {analysis.bursts_text(a.bursts_list)}" if a.bursts_list else "no bursts"
        setup = f"{a.train['workload']}, {a.workers} workers, {a.bw_mbps:g} Mbit/s, consistency {a.consistency}"
        answer(out, names, a.workers, seeds, a.bursts_list, a.train["targets"], calm=calm, condition=bursts,
               setup=f"{setup}, {bursts}")  # before the training report, which removes the weight snapshots
        training_report(out, names, a.workers, setup, bursts, divergence=a.train["save_weights"], calm=calm,
                        targets=a.train["targets"], seeds=seeds)
    return 0


def describe(a: argparse.Namespace, out: Path | str) -> str:
    """The run's header: workload, gradient, network, bursts, host kind, device, data and its limits."""
    lay = ChunkLayout(a.elements, a.mtu, key=None if a.insecure else bytes(TAG_SIZE))  # sizes only: the run's wire
    t = a.train
    what = (f"training {t['workload']} ({t['epochs']} epochs of {t['iterations_per_epoch']} iterations)"
            if t else "replayed synthetic gradient")
    lines = [f"microburst: {what}, {a.elements:,} float32 gradient ({lay.chunks:,} datagrams/worker/direction), "
             f"{a.workers} workers, {a.bw_mbps:g} Mbit/s links, {a.queue:,}-byte queues, {a.iterations} iterations, "
             f"{a.burst_loss:.0%} bursts at {a.bursts_list}, P_low {a.p_low:g}, P_high {a.p_high:g}",
             f"  hosts: {a.hosts_kind} ({a.hosts_why})"]
    if t:
        share = f" (all {a.workers} workers share one GPU)" if t["device"] == "cuda" and a.workers > 1 else ""
        lines.append(f"  workers compute on: {t['device']}{share}")
        if t.get("data_limits"):
            lines.append(f"  data: {t['data_size']:,} teacher-labelled images; {t['data_limits']}")
    lines.append(f"  results: {out}")
    return "\n".join(lines)


def plan(a: argparse.Namespace) -> dict:
    """The resolved run as one JSON object (``--dry-run``; tests and the GPU check read it)."""
    return {"iterations": a.iterations, "bursts": a.bursts_list, "burst_loss": a.burst_loss, "p_low": a.p_low,
            "p_high": a.p_high, "workers": a.workers, "policies": a.policy_list, "elements": a.elements,
            "bandwidth_bps": a.bandwidth, "queue_bytes": a.queue, "hosts": a.hosts_kind, "train": a.train,
            "compensation": Compensation.from_args(a).to_dict(),
            "configs": {label: comp.to_dict() for label, comp in a.config_list}}


def report(a: argparse.Namespace, runs: dict[str, list], out: Path, by_seed: dict[int, dict[str, list]]) -> None:
    bursts = a.bursts_list
    sums = {k: analysis.summarize(v, bursts) for k, v in runs.items()}
    print()
    if "baseline" in sums and "dblp" in sums:
        rows = analysis.table_ii(sums["baseline"], sums["dblp"], bursts)
        if len(by_seed) > 1:  # replicates: medians [95% intervals] over the seeds (dblp.results.analysis.replicate_table)
            rows, long = analysis.replicate_table([analysis.table_ii(analysis.summarize(r["baseline"], bursts),
                                                                     analysis.summarize(r["dblp"], bursts), bursts)
                                                   for r in by_seed.values()], compare=("DBLP", "Baseline"))
            with open(out / "table_ii_replicates.csv", "w", newline="") as fh:
                csv.writer(fh).writerows(long)
        print(f"Table II ({'this run' if len(by_seed) == 1 else f'median over {len(by_seed)} seeds [95% interval of the mean]'}):"
              " send latency, slowest worker, seconds")
        print(analysis.format_table(rows))
        if len(by_seed) > 1:
            print("\n".join(analysis.verdicts(long, rows[0][1:], ("DBLP", "Baseline"))))
        with open(out / "table_ii.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    print(f"\nAll runs{' (the first seed)' if len(by_seed) > 1 else ''}:")
    hdr = ["run", "p50", "p99", "max", "mean"] + [f"@{b}" for b in bursts] + ["min recv frac"]
    rows = [hdr] + [[k, s.p50, s.p99, s.tail_max, s.mean] + list(s.at_bursts) + [s.recv_frac_min]
                    for k, s in sums.items()]  # numbers: summary.csv stays numeric
    print(analysis.format_table(rows))
    congestion = a.burst_kind == "congestion"
    how = ("congestion: loss from the full bottleneck queue, no fixed rate to predict from" if congestion
           else f"{a.burst_loss:.0%} loss; predicted from 1 - loss^k >= 1 - p")
    print(f"\nRetransmission passes at the bursts ({how}):")
    prow = [["run", "tolerance"] + [f"@{b} measured" for b in bursts] + ["predicted"]]
    for k, recs in runs.items():
        tol = {r.round: r.tolerance_up for r in recs if r.role == "worker"}
        for_b = [tol.get(b, float("nan")) for b in bursts]
        chunks = next((r.chunks for r in recs if r.chunks), None)
        pred = ["-" if congestion else passes_needed(a.burst_loss, t, chunks) for t in for_b]
        prow.append([k, "/".join(f"{t:.3f}" for t in for_b)] + [str(x) for x in sums[k].passes_at_bursts]
                    + ["/".join(map(str, pred))])
    print(analysis.format_table(prow))
    with open(out / "summary.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    (out / "summary_runs.json").write_text(json.dumps({k: s.as_dict() for k, s in sums.items()}, indent=1))
    what = a.train["workload"] if a.train else f"{a.elements:,} floats"
    setup = (f"{what}, {a.workers} workers, {a.bw_mbps:g} Mbit/s star, {a.queue:,}-byte queues, "
             f"{'congestion' if congestion else f'{a.burst_loss:.0%} loss'} bursts at {','.join(map(str, bursts))}, consistency {a.consistency}")
    analysis.plot_latency(runs, out / "latency.png", bursts, "Send latency per iteration under microbursts", setup=setup)
    analysis.plot_cdf(runs, out / "cdf.png", setup=setup)
    written = [n for n in ("table_ii.csv", "table_ii_replicates.csv") if (out / n).exists()]  # (baseline and dblp)
    print(f"\nwrote {out}/{', '.join(written + ['summary.csv', 'summary_runs.json', 'rounds.jsonl', 'latency.png', 'cdf.png'])}")


if __name__ == "__main__":
    from emulation.runstate import exit_main

    exit_main(main, "microburst.py")
