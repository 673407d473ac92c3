#!/usr/bin/env python3
"""Speed of the simulator, measured side by side in one run (a benchmark, not a test).

Prints, for the same machine and moment:

0. round level against the worker count (1M floats): the default star, and a
   server link provisioned at workers x 10 Gbit/s (the cost per simulated
   datagram, without the incast's extra passes);
1. round level: simulated iterations per second of a 25M-parameter model
   (ResNet50, 69,061 datagrams per direction), 3 workers, random 70% bursts,
   for DBLP and the baseline, at ``--groups`` (1 = every datagram; >1 the
   documented approximation of ``SimConfig.group``) - with the error of each
   group against group 1 on mean/p99 round latency and time-to-train;
2. packet level: datagram events per second and iterations per second on a
   smaller model, beside the round level on the same configuration (speed
   ratio and agreement of the mean round latency);
3. a sweep: ``--sweep-configs`` configurations of the 25M model on
   ``--jobs`` processes, wall time against the 5-minute target.

Times are wall clock and CPU (``time.process_time``: on a shared machine the
CPU time is the one to compare with targets "on one core").

    python scenarios/bench_sim.py                  # about 2-4 minutes on 2 cores
    python scenarios/bench_sim.py --quick          # a smoke run, ~20 s
    python scenarios/bench_sim.py --sweep-configs 500 --sweep-iterations 1000 --groups 1,16
    python scenarios/bench_sim.py --only-workers --workers 64 --workers-provisioned 1024 --workers-iterations 100
    python scenarios/bench_sim.py --only-workers --topology leafspine --workers 64 --workers-provisioned 256
    python scenarios/bench_sim.py --only-sweep --sweep-configs 500 --sweep-iterations 300 --sweep-model 1000000 --sweep-group 1
    python scenarios/bench_sim.py --only-incast --incast-workers 64,128,256   # the incast: walk vs flow level
    python scenarios/bench_sim.py --only-fabric --fabric-workers 16,32,64     # leaf-spine: round vs class level
    python scenarios/bench_sim.py --only-targets --targets leafspine10k      # 10,000 workers at class level
    python scenarios/bench_sim.py --only-targets --targets whatif10k         # ... ResNet-50 under bursts (the what-if)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import _bootstrap  # noqa: E402,F401  (re-exec into the project's .venv; repo root on sys.path)

from dblp.cli.provenance import config_record, provenance  # noqa: E402
from dblp.sim import SimConfig, simulate  # noqa: E402
from dblp.cli.args import parser  # noqa: E402
from traces.argtypes import count_arg, float_arg, int_list_arg, name_list_arg  # noqa: E402
from dblp.sim.options import baseline_of  # noqa: E402
from dblp.sim.studies.sweep import run_config  # noqa: E402
from dblp.sim.network.topology import TOPOLOGIES  # noqa: E402

BURSTS = [{"kind": "random_bursts", "rate": 0.01, "loss": 0.7}]


def timed(cfg: SimConfig):
    w, c = time.perf_counter(), time.process_time()
    res = simulate(cfg)
    return res, time.perf_counter() - w, time.process_time() - c


def bench_round(iterations: int, groups: list[int]) -> list[dict]:
    print(f"\n== round level: resnet50 (25M parameters), 3 workers, 70% bursts at rate 0.01/iteration, "
          f"{iterations} iterations")
    print(f"{'policy':>8} {'group':>5} {'wall s':>8} {'cpu s':>8} {'it/s (cpu)':>11} {'ms/it':>7}  "
          f"{'mean round':>11} {'p99 round':>10} {'ttt':>9}  error vs group 1 (mean / p99 / ttt)")
    rows = []
    for policy in ("dblp", "baseline"):
        base = SimConfig(model="resnet50", rounds=iterations, loss=BURSTS)
        base = baseline_of(base) if policy == "baseline" else base
        ref = None
        for g in groups:
            res, wall, cpu = timed(base.with_(group=g))
            s = res.summary()
            if ref is None:
                ref = s
            err = [s[k] / ref[k] - 1 for k in ("mean_round_s", "p99_round_s", "time_to_train_s")]
            rows.append({"policy": policy, "group": g, "wall_s": wall, "cpu_s": cpu, **s})
            print(f"{policy:>8} {g:>5} {wall:8.2f} {cpu:8.2f} {iterations / cpu:11.0f} {cpu / iterations * 1e3:7.2f}  "
                  f"{s['mean_round_s'] * 1e3:9.1f}ms {s['p99_round_s'] * 1e3:8.1f}ms {s['time_to_train_s']:8.1f}s  "
                  + " / ".join(f"{e * 100:+.2f}%" for e in err))
    target = [r for r in rows if r["group"] == groups[-1] and r["policy"] == "dblp"][0]
    print(f"target: {iterations} iterations in < 2 s on one core -> group {groups[-1]}: "
          f"{target['cpu_s']:.2f} s CPU ({target['cpu_s'] / iterations * 1000:.2f} s per 1,000)")
    return rows


def bench_packet(model: int, iterations: int) -> dict:
    print(f"\n== packet level vs round level: {model:,} parameters, 3 workers, bursts + 1% Bernoulli, "
          f"{iterations} iterations")
    cfg = SimConfig(model=model, rounds=iterations, freq=5,
                    loss=[{"kind": "iteration_bursts", "at": list(range(3, iterations, 7)), "loss": 0.7},
                          {"kind": "bernoulli", "p": 0.01}])
    pk, pw, pc = timed(cfg.with_(fidelity="packet"))
    rl, rw, rc = timed(cfg.with_(fidelity="round"))
    a, b = pk.summary(), rl.summary()
    print(f"packet: {pk.datagrams:,} datagrams, {pk.events:,} datagram events in {pw:.2f} s wall / {pc:.2f} s CPU: "
          f"{pk.events / pc:,.0f} events/s, {pk.datagrams / pc:,.0f} datagrams/s, {iterations / pc:.2f} iterations/s")
    print(f"round:  {rl.datagrams:,} datagrams in {rw:.3f} s wall / {rc:.3f} s CPU: {iterations / rc:.1f} iterations/s "
          f"-> round level x{pc / rc:.0f} faster")
    print(f"agreement: mean round {a['mean_round_s'] * 1e3:.3f} ms (packet) vs {b['mean_round_s'] * 1e3:.3f} ms (round), "
          f"{(b['mean_round_s'] / a['mean_round_s'] - 1) * 100:+.2f}%; lost up {a['lost_up']:.4f} vs {b['lost_up']:.4f}")
    return {"packet_events_per_s": pk.events / pc, "packet_datagrams_per_s": pk.datagrams / pc,
            "packet_it_per_s": iterations / pc, "round_it_per_s": iterations / rc,
            "mean_round_rel_diff": b["mean_round_s"] / a["mean_round_s"] - 1}


def bench_workers(workers: list[int], iterations: int, provisioned: bool, topology: str = "star") -> list[dict]:
    """Round level against the worker count: 1M floats (2,763 datagrams per direction).

    ``provisioned``: the server's link is workers x the worker link, so the
    upstream incast does not overflow and every worker sends each chunk
    once - the cost per simulated datagram. Otherwise the default star (one
    10 Gbit/s server link): the incast drops most of each pass, passes grow
    with the worker count, and so do the datagrams to simulate (printed).
    ``topology``: the network (dblp.sim.network.topology, its default parameters).
    """
    kind = "server link = workers x 10 Gbit/s" if provisioned else "one 10 Gbit/s server link"
    print(f"\n== round level vs workers: 1M floats, {iterations} iterations, {topology}, {kind}")
    print(f"{'workers':>7} {'wall s':>8} {'cpu s':>8} {'s/iter':>8} {'dgrams/worker/iter':>19} {'us/dgram':>9} "
          f"{'up passes':>9} {'mean round':>11}")
    rows = []
    for n in workers:
        cfg = SimConfig(model=1_000_000, workers=n, rounds=iterations, topology=topology,
                        server_bandwidth_bps=(n * 10e9 if provisioned else None))
        res, wall, cpu = timed(cfg)
        s = res.summary()
        per = res.datagrams / iterations / n
        rows.append({"workers": n, "iterations": iterations, "provisioned": provisioned, "topology": topology,
                     "wall_s": wall, "cpu_s": cpu,
                     "datagrams": res.datagrams, **s})
        print(f"{n:7d} {wall:8.2f} {cpu:8.2f} {cpu / iterations:8.3f} {per:19,.0f} {cpu / res.datagrams * 1e6:9.3f} "
              f"{s['up_passes']:9.1f} {s['mean_round_s'] * 1e3:9.1f}ms")
    return rows


# The simulator's speed targets for the round level at 1M floats and 100 iterations: workers -> seconds
WORKER_TARGETS_S = {64: 2.0, 1024: 60.0}


def print_worker_targets(rows: list[dict]) -> None:
    """The scaling runs of the targets' sizes (1M floats, 100 iterations) against their limits."""
    for r in rows:
        limit = WORKER_TARGETS_S.get(r["workers"])
        if limit is None or r["iterations"] != 100:
            continue
        kind = "provisioned" if r["provisioned"] else "default"
        print(f"target: {r['workers']} workers x 100 iterations ({r['topology']}, {kind}) under {limit:.0f} s: "
              f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU -> "
              f"{'met' if r['cpu_s'] < limit else 'not met'} on CPU time")


# The simulator's scale targets (docs/scale.md) as configurations: name -> (what, SimConfig keyword arguments, CPU s limit,
# memory limit in GiB or None). 1M floats (unless a target names its model) = 2,763 datagrams per direction;
# "fair share" paces every sender at the server link's rate over the workers.
SCALE_TARGETS: dict[str, tuple[str, dict, float, float | None]] = {
    "star64": ("64 workers x 100 iterations, default star", dict(workers=64, rounds=100), 2.0, None),
    "quick16": ("16 workers x 5 iterations, default star (a smoke run)", dict(workers=16, rounds=5), 1.0, None),
    "provisioned1024": ("1024 workers x 100 iterations, server link 1024 x 10 Gbit/s",
                        dict(workers=1024, rounds=100, server_bandwidth_bps=1024 * 10e9), 60.0, None),
    "star1024": ("1024 workers x 100 iterations, default star (one 10 Gbit/s server link)",
                 dict(workers=1024, rounds=100), 60.0, None),
    "paced1024": ("1024 workers x 100 iterations, every sender paced at its fair share (10 Gbit/s / 1024)",
                  dict(workers=1024, rounds=100, send_rate_bps=10e9 / 1024), 60.0, None),
    "leafspine10k": ("10,000 workers x 10 iterations, leaf-spine 100 racks x 4 spines, --servers 100, class level "
                     "(dblp.sim.engines.fabric: one representative flow per port class)",
                     dict(workers=10_000, rounds=10, topology="leafspine", racks=100, spines=4, servers=100,
                          fidelity="class"), 300.0, 8.0),
    "whatif10k": ("the 10,000-worker what-if under bursts: leafspine10k with ResNet-50 (707 chunks a shard) x 40 "
                  "iterations, 70% bursts at iterations 5, 20, 35, class level (one policy)",
                  dict(model="resnet50", workers=10_000, rounds=40, topology="leafspine", racks=100, spines=4,
                       servers=100, fidelity="class",
                       loss=[{"kind": "iteration_bursts", "at": [5, 20, 35], "loss": 0.7}]), 300.0, 8.0),
}


def bench_incast(workers: list[int]) -> list[dict]:
    """The first iteration's synchronised incast on the default star (1M floats), walked pass by pass
    (``incast="walk"``, the reference) and at flow level (``"flow"``, dblp.sim.engines.incast), side by side:
    CPU seconds, their ratio, and how far the flow level's records are from the walk's."""
    from dblp.sim.engines.incast import compare_first_iteration

    print("\n== the first iteration's incast, default star, 1M floats: walk (reference) vs flow level")
    print(f"{'workers':>7} {'walk CPU':>9} {'flow CPU':>9} {'ratio':>7}   records, flow against walk (relative)")
    rows = []
    for n in workers:
        got = {}
        for mode in ("walk", "flow"):
            got[mode] = timed(SimConfig(model=1_000_000, workers=n, rounds=1, incast=mode))
        diff = compare_first_iteration(got["walk"][0], got["flow"][0])
        cw, cf = got["walk"][2], got["flow"][2]
        print(f"{n:7d} {cw:8.2f}s {cf:8.2f}s {cw / cf:6.1f}x   "
              + ", ".join(f"{k} {v:+.2%}" for k, v in diff.items()) + f"  (load {os.getloadavg()[0]:.1f})",
              flush=True)
        rows.append({"workers": n, "walk_cpu_s": cw, "flow_cpu_s": cf, "ratio": cw / cf, "rel_diff": diff})
    return rows


def bench_fabric(workers: list[int], servers: int, iterations: int) -> list[dict]:
    """Leaf-spines (1M floats, 4 racks x 2 spines, ``servers`` servers) at round level (every flow
    walked, the reference) and at class level (``fidelity="class"``, dblp.sim.engines.fabric), side by side:
    CPU seconds, their ratio, and how far the class level's summary is from the round level's."""
    keys = ("mean_round_s", "time_to_train_s", "mean_up_s", "up_passes")
    print(f"\n== leaf-spine 4 racks x 2 spines, {servers} servers, {iterations} iterations, 1M floats: "
          "round level (reference) vs class level")
    print(f"{'workers':>7} {'round CPU':>10} {'class CPU':>10} {'ratio':>8}   class against round (relative): "
          + ", ".join(keys) + ", datagrams")
    rows = []
    for n in workers:
        kw = dict(model=1_000_000, workers=n, rounds=iterations, topology="leafspine", racks=4, spines=2,
                  servers=servers)
        got = {fid: timed(SimConfig(fidelity=fid, **kw)) for fid in ("round", "class")}
        a, b = got["class"][0].summary(), got["round"][0].summary()
        diff = {k: a[k] / b[k] - 1 for k in keys}
        diff["datagrams"] = got["class"][0].datagrams / got["round"][0].datagrams - 1
        cr, cc = got["round"][2], got["class"][2]
        print(f"{n:7d} {cr:9.2f}s {cc:9.3f}s {cr / cc:7.0f}x   " + ", ".join(f"{v:+.1%}" for v in diff.values())
              + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
        rows.append({"workers": n, "round_cpu_s": cr, "class_cpu_s": cc, "ratio": cr / cc, "rel_diff": diff})
    return rows


def _target_child(kw: dict, cap_s: float, mem_gib: float, conn) -> None:
    """One target run in a fresh process: CPU seconds, wall, peak resident memory, the run's summary.
    The kernel stops it past ``cap_s`` CPU seconds (RLIMIT_CPU) or ``mem_gib`` of address space."""
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (int(cap_s) + 1, int(cap_s) + 3))
    lim = int(mem_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    res, wall, cpu = timed(SimConfig(**{"model": 1_000_000, **kw}))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    conn.send({"cpu_s": cpu, "wall_s": wall, "rss_gib": rss, "datagrams": res.datagrams, **res.summary()})


def _target_run(kw: dict, cap_s: float, mem_gib: float) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_target_child, args=(kw, cap_s, mem_gib, b))
    proc.start()
    b.close()
    try:
        got = a.recv()
    except EOFError:  # stopped by its limit (SIGXCPU: the CPU cap) or failed
        got = {"stopped": proc.exitcode}
    proc.join()
    return got


def bench_targets(names: list[str], repeats: int, cap_factor: float, mem_gib: float) -> list[dict]:
    """Each target ``repeats`` times, each run in a fresh process: median [range] of CPU seconds
    (``time.process_time``, which a shared machine's load affects less than wall time), and the
    peak resident memory; a run past ``cap_factor`` x its limit is stopped and counts as not met
    (and is not repeated: the verdict stands)."""
    print(f"\n== the speed targets: {repeats} runs each, each in a fresh process (1M floats)")
    rows = []
    for name in names:
        what, kw, limit, mem_limit = SCALE_TARGETS[name]
        cap = limit * cap_factor
        runs = []
        for i in range(repeats):
            r = _target_run(kw, cap, mem_gib)
            runs.append(r)
            if "stopped" in r:
                print(f"  {name} run {i + 1}: stopped at {cap:.0f} s CPU or {mem_gib:g} GiB (exit {r['stopped']})")
                break
            print(f"  {name} run {i + 1}: {r['cpu_s']:.2f} s CPU, {r['wall_s']:.1f} s wall, {r['rss_gib']:.2f} GiB peak, "
                  f"mean round {r['mean_round_s'] * 1e3:.1f} ms, {r['up_passes']:.1f} up passes, load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            if r["cpu_s"] > 2 * limit:
                break  # far over: more runs would not change the verdict
        done = [r for r in runs if "stopped" not in r]
        if done:
            cpu = sorted(r["cpu_s"] for r in done)
            med = cpu[len(cpu) // 2] if len(cpu) % 2 else 0.5 * (cpu[len(cpu) // 2 - 1] + cpu[len(cpu) // 2])
            rss = max(r["rss_gib"] for r in done)
            met = med < limit and len(done) == len(runs) and (mem_limit is None or rss < mem_limit)
            mem = f", < {mem_limit:g} GiB: {rss:.2f} GiB peak" if mem_limit else f", {rss:.2f} GiB peak"
            verdict = f"{med:.2f} s CPU [{cpu[0]:.2f}-{cpu[-1]:.2f}] of {len(done)} run(s){mem}"
        else:
            med, rss, met = math.inf, math.nan, False
            verdict = f"stopped past {cap:.0f} s CPU or {mem_gib:g} GiB"
        print(f"target: {what} under {limit:g} s: {verdict} -> {'met' if met else 'not met'}", flush=True)
        rows.append({"target": name, "what": what, "limit_s": limit, "mem_limit_gib": mem_limit, "runs": runs,
                     "median_cpu_s": med, "peak_gib": rss, "met": met})
    return rows


def bench_sweep(n: int, iterations: int, group: int, jobs: int, model: str = "resnet50") -> dict:
    from concurrent.futures import ProcessPoolExecutor

    print(f"\n== sweep: {n} configurations x {iterations} iterations of {model} (group {group}) on {jobs} processes")
    cfgs = []
    for i in range(n):  # a grid-like spread of P_high, eta, burst rates, seeds
        cfgs.append(SimConfig(model=model, rounds=iterations, group=group, p_high=0.1 + 0.1 * (i % 5),
                              eta=(0.3, 0.5, 0.7)[i % 3], seed=i,
                              loss=[{"kind": "random_bursts", "rate": (0.005, 0.01, 0.02)[i % 3], "loss": 0.7}]).to_dict())
    t = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        out = list(ex.map(run_config, cfgs, chunksize=4))
    wall = time.perf_counter() - t
    cpu = sum(o["_cpu_s"] for o in out)
    ideal = cpu / jobs  # the wall time on `jobs` otherwise idle cores
    print(f"{n} runs in {wall:.1f} s wall, {cpu:.1f} s CPU ({cpu / n:.2f} s per run): {ideal:.1f} s on {jobs} idle "
          f"cores; 500 runs: ~{ideal * 500 / n:.0f} s ({'within' if ideal * 500 / n < 300 else 'over'} the 5-minute "
          f"target), ~{wall * 500 / n:.0f} s at this machine's present load")
    return {"configs": n, "iterations": iterations, "group": group, "jobs": jobs, "wall_s": wall, "cpu_s": cpu}


def main() -> int:
    p = parser(description=__doc__)
    p.add_argument("--iterations", type=count_arg(1), default=1000, help="round-level iterations")
    p.add_argument("--groups", type=int_list_arg(1), default="1,16", help="round-level group sizes to compare")
    p.add_argument("--packet-model", type=count_arg(1), default=1_000_000, help="packet-level gradient size in elements")
    p.add_argument("--packet-iterations", type=count_arg(1), default=12, help="packet-level iterations")
    p.add_argument("--sweep-configs", type=count_arg(1), default=40, help="sweep size (the target is 500)")
    p.add_argument("--sweep-iterations", type=count_arg(1), default=1000, help="iterations per sweep run")
    p.add_argument("--sweep-group", type=count_arg(1), default=None,
                   help="group of the sweep runs (default: the last of --groups)")
    p.add_argument("--sweep-model", default="resnet50",
                   help="gradient of the sweep runs: a model name or element count (the speed target's: 1M)")
    p.add_argument("--jobs", type=count_arg(1), default=os.cpu_count() or 1, help="sweep processes")
    p.add_argument("--workers", type=int_list_arg(1), default="16,32,64",
                   help="worker counts of the scaling runs on the default star (1M floats)")
    p.add_argument("--workers-provisioned", type=int_list_arg(1), default="64,256,1024",
                   help="worker counts of the scaling runs with a server link of workers x 10 Gbit/s")
    p.add_argument("--workers-iterations", type=count_arg(1), default=3, help="iterations of the scaling runs")
    p.add_argument("--topology", choices=TOPOLOGIES, default="star",
                   help="network of the scaling runs (dblp.sim.network.topology, default parameters)")
    p.add_argument("--only-workers", action="store_true", help="only the scaling runs (the speed targets': "
                   "--workers 64 --workers-provisioned 1024 --workers-iterations 100)")
    p.add_argument("--only-sweep", action="store_true", help="only the sweep (the speed target's: --sweep-configs 500 "
                   "--sweep-iterations 300 --sweep-model 1000000 --sweep-group 1)")
    p.add_argument("--only-targets", action="store_true",
                   help="only the scale targets (the default star, paced senders and 10,000 workers at "
                        "1M floats), each run in a fresh process, median and range of --target-runs")
    p.add_argument("--targets", type=name_list_arg(SCALE_TARGETS), default="star64,provisioned1024,star1024,paced1024,leafspine10k,whatif10k",
                   help="which targets --only-targets runs (comma-separated names)")
    p.add_argument("--target-runs", type=count_arg(1), default=3, help="runs of each target")
    p.add_argument("--target-cap", type=float_arg(1.0), default=3.0,
                   help="stop a target run past this many times its CPU-seconds limit (a factor, no unit)")
    p.add_argument("--target-memory", type=float_arg(0.5), default=12.0,
                   help="address space a target run may take, GiB (the kernel refuses more)")
    p.add_argument("--only-incast", action="store_true",
                   help="only the first iteration's incast, walked and at flow level, side by side (--incast-workers)")
    p.add_argument("--incast-workers", type=int_list_arg(1), default="64,128,256",
                   help="worker counts of --only-incast (the walk of 256 takes ~15-40 s of CPU)")
    p.add_argument("--only-fabric", action="store_true",
                   help="only leaf-spines at round level and at class level (--fidelity class), side by side "
                        "(--fabric-workers)")
    p.add_argument("--fabric-workers", type=int_list_arg(2), default="16,32,64",
                   help="worker counts of --only-fabric (the round level of 64 takes ~10 s of CPU)")
    p.add_argument("--fabric-servers", type=count_arg(1), default=4, help="parameter servers of --only-fabric")
    p.add_argument("--fabric-iterations", type=count_arg(1), default=3, help="iterations of --only-fabric")
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    p.add_argument("-o", "--output", default=None, help="also write the numbers as JSON to this file")
    a = p.parse_args()
    if a.quick:
        a.iterations, a.packet_model, a.packet_iterations = 100, 200_000, 8
        a.sweep_configs, a.sweep_iterations = 8, 100
        a.workers, a.workers_provisioned, a.workers_iterations = [8, 16], [64], 2
    groups = a.groups
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if a.only_incast:
        _write(a, {"incast": bench_incast(a.incast_workers)})
        return 0
    if a.only_fabric:
        _write(a, {"fabric": bench_fabric(a.fabric_workers, a.fabric_servers, a.fabric_iterations)})
        return 0
    if a.only_targets:
        res = {"targets": bench_targets(a.targets, a.target_runs, a.target_cap, a.target_memory)}
        if a.output:
            Path(a.output).write_text(json.dumps(res, indent=2, default=float) + "\n")
        return 0
    if a.only_sweep:
        res = {"sweep": bench_sweep(a.sweep_configs, a.sweep_iterations, a.sweep_group or groups[-1], a.jobs,
                                    a.sweep_model)}
        _write(a, res)
        return 0
    wk, wp = a.workers, a.workers_provisioned
    scale = (bench_workers(wk, a.workers_iterations, False, a.topology)
             + bench_workers(wp, a.workers_iterations, True, a.topology))
    print_worker_targets(scale)
    if a.only_workers:
        _write(a, {"workers": scale})
        return 0
    res = {"workers": scale, "round": bench_round(a.iterations, groups),
           "packet": bench_packet(a.packet_model, a.packet_iterations),
           "sweep": bench_sweep(a.sweep_configs, a.sweep_iterations, a.sweep_group or groups[-1], a.jobs,
                                a.sweep_model)}
    _write(a, res)
    return 0


def _write(a, res: dict) -> None:
    """``--output``: the numbers, with the flags and the provenance that made them."""
    if a.output:
        body = {**res, "config": config_record(a), "_run": provenance()}
        Path(a.output).write_text(json.dumps(body, indent=2, default=float) + "\n")


if __name__ == "__main__":
    sys.exit(main())
