"""The transport's speed targets (``scenarios/benchmark.py --targets``): each group of target rows, and
one repeat of the groups asked for, and the files of the repeats' summary.

A group is a function ``(args, say, repeat) -> rows`` (:class:`dblp.results.targets.TargetRow`-s, or
rows :func:`dblp.results.targets.as_rows` reads), registered in :data:`TARGET_SOURCES`:

* ``loopback``: DBLP sharded and single server against gloo on this machine's loopback
  (:func:`dblp.runs.loopback.loopback_rounds`, :func:`dblp.runs.glooref.loopback_median_s`);
* ``veth``: DBLP sharded against gloo on namespace hosts (:func:`emulation.bench.veth_target_rows`);
* ``ddp``: a DDP step over DBLP against plain DDP (:func:`dblp.train.ddpbench.ddp_overhead`).

Why here, beside the namespace bench: the veth group needs namespace hosts, so the registry that
holds it sits at the emulation layer, and the groups that need none sit with it, so that one
repeat measures every group one way. ``args`` are the benchmark's settings (``target_model``,
``target_workers``, ``rounds``, ``warmup``, ``timeout``, ``gloo_timeout``, ``ddp_steps``,
``target_sets``, ``out``, ``mtu``, ``workers``, ``p``, ...).
"""

from __future__ import annotations

import csv
import json
import os
import time
from typing import Any, Callable

from dblp.results.targets import TargetRow, as_rows, format_table, machine_class, summarize
from dblp.results.targets import plot as plot_targets
from dblp.runs.glooref import GlooError, loopback_median_s
from traces.units import fmt_size

from .bench import REPO, BenchError, Say, bench_env, veth_target_rows

__all__ = ["TARGET_SOURCES", "ddp_target_rows", "loopback_target_rows", "measure_repeat", "write_targets"]


def _gloo_loopback(elements: int, workers: int, args: Any, rep: int, say: Say) -> float:
    """Median of ``args.rounds`` gloo all-reduces (after ``args.warmup``) among ``workers`` local ranks."""
    m = loopback_median_s(elements, workers, rounds=args.rounds, warmup=args.warmup, timeout=args.gloo_timeout,
                          logdir=args.out / f"rep{rep}" / f"gloo-loopback-{workers}", env=bench_env(), cwd=REPO)
    say(f"gloo {fmt_size(elements)} x {workers} on loopback: {m * 1e3:.1f} ms")
    return m


def loopback_target_rows(args: Any, say: Say, rep: int) -> list[TargetRow]:
    """Loopback, ``--target-model`` x each of ``--target-workers``: DBLP sharded and single server
    against gloo, measured one after the other in this repeat. DBLP runs at the loopback default,
    ``--mtu auto`` (lo's MTU, capped: dblp.transport.udp.auto_mtu), as gloo's TCP uses lo's MTU; one more row,
    without a bound, keeps the sharded mode at Ethernet's 1500 bytes in view."""
    from dblp.runs.loopback import loopback_rounds

    e = args.target_model
    rows = []
    for w in args.target_workers:
        t, mtu = {}, {}
        for key, agg, size in (("sharded", "sharded", "auto"), ("server", "server", "auto"),
                               ("sharded-1500", "sharded", 1500)):
            try:  # --timeout bounds a round: the run's rounds and start-up get that much each
                res = loopback_rounds(e, workers=w, rounds=args.rounds, warmup=args.warmup, aggregation=agg,
                                      mtu=size, timeout=args.timeout * (args.warmup + args.rounds + 1))
                t[key], mtu[key] = res.median_s, res.mtu
                say(f"dblp {fmt_size(e)} x {w} {agg} on loopback at MTU {res.mtu}: {t[key] * 1e3:.1f} ms")
            except RuntimeError as exc:  # the other targets are still measured; this one shows "not measured"
                t[key], mtu[key] = float("nan"), size
                say(f"dblp {fmt_size(e)} x {w} {agg} on loopback: not measured: {exc}")
        try:
            g = _gloo_loopback(e, w, args, rep, say)
        except (BenchError, GlooError, TimeoutError) as exc:
            g = float("nan")
            say(f"gloo {fmt_size(e)} x {w} on loopback: not measured: {exc}")
        sharded_bounds = {"2-core": 1.3, "16-core": 1.0} if w == 3 else {"16-core": 1.2} if w == 8 else {}
        rows.append(TargetRow(f"loopback {fmt_size(e)} x {w}: sharded / gloo", t["sharded"] / g, "x",
                              sharded_bounds, detail=f"{t['sharded'] * 1e3:.0f} / {g * 1e3:.0f} ms, "
                                                     f"MTU {mtu['sharded']}"))
        rows.append(TargetRow(f"loopback {fmt_size(e)} x {w}: single server / gloo", t["server"] / g, "x",
                              {"16-core": 1.6} if w == 3 else {},
                              detail=f"{t['server'] * 1e3:.0f} / {g * 1e3:.0f} ms, MTU {mtu['server']}"))
        rows.append(TargetRow(f"loopback {fmt_size(e)} x {w}: sharded / gloo at MTU 1500", t["sharded-1500"] / g,
                              "x", {}, detail=f"{t['sharded-1500'] * 1e3:.0f} / {g * 1e3:.0f} ms"))
    return rows


def ddp_target_rows(args: Any, say: Say, rep: int) -> list[TargetRow]:
    """DDP over DBLP against plain DDP, 3 CPU ranks, a 10,762-parameter model (dblp.train.ddpbench)."""
    from dblp.train.ddpbench import OVERHEAD_TARGET_S, SMALL_MODEL_PARAMS, ddp_overhead

    rows = []
    # DBLPComm as it ships (ranks on the server's host: shared memory, dblp.transport.hostlocal), then over
    # UDP datagrams on loopback (DBLP's own data path, what ranks on other hosts use)
    for local, how in (("auto", ""), ("off", ", UDP datagrams")):
        r = ddp_overhead(3, args.ddp_steps, timeout=args.timeout * 10, local=local)
        say(f"DDP {SMALL_MODEL_PARAMS} parameters x 3 ranks{how}: plain {r.plain_median_s * 1e3:.2f} ms, "
            f"DBLP {r.dblp_median_s * 1e3:.2f} ms a step")
        rows.append(TargetRow(f"DDP {SMALL_MODEL_PARAMS:,}-parameter model x 3 ranks{how}: "
                              "DBLP step - plain DDP step", r.overhead_s * 1e3, "ms", {"any": OVERHEAD_TARGET_S * 1e3},
                              detail=f"{r.dblp_median_s * 1e3:.2f} - {r.plain_median_s * 1e3:.2f} ms"))
    return rows


#: target groups by name. The self-pacing rows need root and namespace links for minutes: they run by
#: themselves (the benchmark's ``--pacing``, :mod:`emulation.pacecheck`).
TARGET_SOURCES: dict[str, Callable[[Any, Say, int], list[Any]]] = {
    "loopback": loopback_target_rows,
    "veth": veth_target_rows,
    "ddp": ddp_target_rows,
}


def measure_repeat(args: Any, say: Say, rep: int, repeats: int) -> list[TargetRow]:
    """One repeat of every group of ``args.target_sets``, in order; a group that fails gives one row
    saying so ("not measured", its error as the detail) and the other groups still run."""
    rows: list[TargetRow] = []
    for name in args.target_sets:
        say(f"repeat {rep + 1}/{repeats}: {name} targets")
        try:
            rows += as_rows(TARGET_SOURCES[name](args, say, rep))
        except (BenchError, RuntimeError, TimeoutError) as exc:
            say(f"{name} targets: not measured in this repeat: {exc}")
            rows.append(TargetRow(f"{name} targets", float("nan"), "", {}, detail=str(exc)[-300:]))
    return rows


def write_targets(args: Any, per_repeat: list[list[TargetRow]]) -> str:
    """``targets.csv``, ``targets.json`` and ``targets.png`` under ``args.out`` of the repeats so far (their
    summary on this machine's cores, :func:`dblp.results.targets.summarize`); returns the table to print,
    with its header (cores, load, time, repeats)."""
    cores = os.cpu_count() or 1
    lines = summarize(per_repeat, cores)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    header = (f"speed targets on this machine: {cores} cores ({machine_class(cores)} targets), load {load}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {len(per_repeat)} repeat(s)"
              + (f", {args.rounds} timed rounds each" if set(args.target_sets) - {"ddp"} else
                 f", {args.ddp_steps} DDP steps each"))
    with open(args.out / "targets.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["target", "unit", "median", "min", "max", "repeats", "bound", "better", "met", "cores"])
        for ln in lines:
            w.writerow([ln["target"], ln["unit"], f"{ln['median']:.6g}", f"{ln['min']:.6g}", f"{ln['max']:.6g}",
                        ln["repeats"], "" if ln["bound"] is None else ln["bound"], ln["better"],
                        "" if ln["met"] is None else ln["met"], cores])
    (args.out / "targets.json").write_text(json.dumps({"header": header, "cores": cores, "targets": lines},
                                                      indent=1, default=str))
    plot_targets(lines, str(args.out / "targets.png"), header)
    return header + "\n" + format_table(lines)
