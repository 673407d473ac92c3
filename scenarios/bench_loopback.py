#!/usr/bin/env python3
"""DBLP's loopback round against gloo's all-reduce on the same loopback, side by side, alternating.

A benchmark, not a test; no root needed. Each repeat runs ``--iterations``
gloo all-reduces (``scenarios/gloo_allreduce.py``: three ranks, every rank
starting at one instant) and then, for each case, a
``python -m dblp loopback`` run of the same size and world
(:mod:`dblp.runs.loopback`: separate server and worker processes lined up at a
common start once each holds its gradient, the median round from that start
to the last worker's result); the ratio
is that repeat's DBLP median over that repeat's gloo median, so a shared
machine's load moves both sides of one ratio alike. With ``--baseline DIR``
(another checkout of the project, e.g. ``git worktree add /tmp/base main``)
every mode also runs from that tree in the same repeat: before and after
a change, alternating, in one run.

    python scenarios/bench_loopback.py                                 # 25M x 3, sharded and single
    python scenarios/bench_loopback.py --repeats 5 --baseline /tmp/base --modes sharded
    python scenarios/bench_loopback.py --modes sharded --mtus 1500,9000,16384,32768,65535  # chunk sizes

Each DBLP run's CPU (user + system of its processes, start-up included) is printed beside its
time: on a loaded machine it moves less than the wall time, so cases of one tree (``--mtus``)
compare by it too.

Writes ``bench_loopback.csv`` (one row per repeat and case), ``summary.json``
(median and range of every ratio, the load, the core count) and
``bench_loopback.png`` (every repeat's ratio, per case) to ``--out``.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv; the repository on sys.path)

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dblp.cli.provenance import write_config  # noqa: E402
from dblp.cli.args import mtu_arg, parser
from dblp.runs.glooref import GlooRanks, LocalHost
from dblp.runs.gradients import MODEL_HELP, model_elements
from dblp.transport.shard import AGGREGATIONS
from dblp.protocol.wire import ParameterError
from traces.argtypes import count_arg

REPO = Path(__file__).resolve().parent.parent


def dblp_loopback(tree: Path, mode: str, elements: int, workers: int, iterations: int,
                  mtu: str | None = None, extra: list[str] | None = None) -> dict:
    """``python -m dblp loopback --json`` run from checkout ``tree`` (its result: ``median_s``, and
    from a tree that reports them ``mtu``, ``passes``, ``chunks``); ``mtu`` None: the tree's default."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    argv = [sys.executable, "-m", "dblp", "loopback", "--model", str(elements), "--workers", str(workers),
            "--iterations", str(iterations), "--aggregation", mode, "--json"] + (["--mtu", mtu] if mtu else []) \
        + list(extra or [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"dblp loopback ({tree}, {mode}) failed: {out.stderr.strip()[-500:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # CPU of the run's processes (server(s) and workers are its children, reaped before it returns):
    # less moved by a shared machine's load than wall time; start-up and the warm-up round included
    res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def build_parser():
    ap = parser(prog="scenarios/bench_loopback.py",
                description="DBLP's loopback round against gloo's all-reduce of the same size and world, "
                            "side by side and alternating (optionally a second checkout: before/after).")
    ap.add_argument("--model", default="25M", help="gradient size, " + MODEL_HELP)
    ap.add_argument("--workers", type=count_arg(2), default=3, help="DBLP workers and gloo ranks")
    ap.add_argument("--repeats", type=count_arg(1), default=3, help="alternating repeats (median and range)")
    ap.add_argument("--iterations", type=count_arg(2), default=10,
                    help="timed iterations per run: DBLP rounds / gloo all-reduces (each run's median is used)")
    ap.add_argument("--modes", default="sharded,server",
                    help=f"DBLP aggregations, comma-separated, of {', '.join(AGGREGATIONS)}")
    ap.add_argument("--mtus", default="",
                    help="DBLP's --mtu values to compare, comma-separated: bytes or auto (each a case per mode; "
                         "default: none given, each tree's own loopback default)")
    ap.add_argument("--configs", default="",
                    help="compensation labels (dblp.protocol.compensation: unbiased, fill-local, ef-upload, ef-broadcast, "
                         "ef-both, stop-once, '+'-joined), each a case per mode beside the paper's, with its round "
                         "time over the paper's in the same repeat (default: none)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout of the project, run beside this one in every repeat (default: none)")
    ap.add_argument("--port", type=count_arg(1), default=29781, help="gloo's rendezvous TCP port on 127.0.0.1")
    ap.add_argument("--timeout", type=count_arg(1), default=300, help="seconds a gloo all-reduce may take")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of this run's files (default: results/bench_loopback/<timestamp>)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        elements = model_elements(args.model)
    except ParameterError as exc:
        ap.error(f"--model: {exc}")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in AGGREGATIONS]
    if bad or not modes:
        ap.error(f"--modes: {','.join(bad) or 'none given'}: each must be one of {', '.join(AGGREGATIONS)}")
    if args.baseline is not None and not (args.baseline / "dblp" / "__init__.py").is_file():
        ap.error(f"--baseline: {args.baseline} is not a checkout of this project (no dblp/__init__.py)")
    try:
        mtus = [mtu_arg(x) for x in args.mtus.split(",") if x] or [None]
    except argparse.ArgumentTypeError as exc:
        ap.error(f"--mtus: {exc}")
    from dblp.protocol.compensation import Compensation

    try:
        comps = [Compensation.from_label(x.strip()) for x in args.configs.split(",") if x.strip()]
    except ParameterError as exc:
        ap.error(f"--configs: {exc}")
    cases = [(f"{m}" + (f" MTU {u}" if u else ""), REPO, m, u, []) for m in modes for u in mtus]
    if args.baseline is not None:
        cases = [c for m in modes for u in mtus
                 for c in ((f"{m}" + (f" MTU {u}" if u else "") + " (baseline)", args.baseline.resolve(), m, u, []),
                           (f"{m}" + (f" MTU {u}" if u else ""), REPO, m, u, []))]
    paper_of: dict[str, str] = {}  # a compensation case -> the paper's case it is timed against
    for m in modes:
        for u in mtus:
            base = f"{m}" + (f" MTU {u}" if u else "")
            for c in comps:
                cases.append((f"{base} {c.label()}", REPO, m, u, c.flags()))
                paper_of[f"{base} {c.label()}"] = base
    out = args.out or REPO / "results" / "bench_loopback" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, args)  # the flags as given, with provenance: --config out/config.json reruns it
    print(f"bench_loopback: {elements:,} floats x {args.workers} workers, {args.repeats} repeats of "
          f"{args.iterations} rounds, {os.cpu_count()} cores; results in {out}", flush=True)
    rows: list[dict] = []
    # gloo's ranks on 127.0.0.1, in this process's session and environment
    gloo = GlooRanks([LocalHost(new_session=False)] * args.workers, args.port, args.timeout, iface="lo")
    try:
        gloo.collect("ready", None, args.timeout)
        gloo.allreduce_s(elements, "warmup", args.timeout + 10)
        for r in range(args.repeats):
            load = os.getloadavg()[0]
            g = statistics.median(gloo.allreduce_s(elements, f"{r}.{i}", args.timeout + 10)
                                  for i in range(args.iterations))
            line = [f"repeat {r + 1}/{args.repeats} (load {load:.1f}): gloo {g * 1e3:.0f} ms"]
            for name, tree, mode, mtu, flags in cases:
                res = dblp_loopback(tree, mode, elements, args.workers, args.iterations,
                                    None if mtu is None else str(mtu), flags)
                d = float(res["median_s"])
                passes = max(res.get("passes") or [0])  # 0: a tree that does not report them
                rows.append({"repeat": r, "load": round(load, 2), "case": name, "tree": str(tree), "mode": mode,
                             "mtu": res.get("mtu", mtu or ""), "chunks": res.get("chunks", ""),
                             "max_passes": passes, "cpu_s": round(res["cpu_s"], 3), "dblp_s": d, "gloo_s": g,
                             "ratio": d / g})
                line.append(f"{name} {d * 1e3:.0f} ms ({d / g:.2f}x, CPU {res['cpu_s']:.1f} s" + (f", {passes} pass" if passes > 1 else "")
                            + ")")
            print("; ".join(line), flush=True)
    finally:
        gloo.close()
    with open(out / "bench_loopback.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = {"elements": elements, "workers": args.workers, "repeats": args.repeats, "iterations": args.iterations,
               "cores": os.cpu_count(), "load_end": os.getloadavg()[0], "cases": {}}
    print(f"\n{elements:,} floats x {args.workers}: DBLP / gloo, median (range) of {args.repeats} repeats")
    for name, *_ in cases:
        rs = [x["ratio"] for x in rows if x["case"] == name]
        summary["cases"][name] = {"ratio_median": statistics.median(rs), "ratio_min": min(rs), "ratio_max": max(rs),
                                  "dblp_median_s": statistics.median(x["dblp_s"] for x in rows if x["case"] == name),
                                  "max_passes": max(x["max_passes"] for x in rows if x["case"] == name),
                                  "cpu_s": [x["cpu_s"] for x in rows if x["case"] == name]}
        passes, cpu = summary["cases"][name]["max_passes"], summary["cases"][name]["cpu_s"]
        print(f"  {name:22s} {statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f}); CPU of a run "
              f"{statistics.median(cpu):.1f} s ({min(cpu):.1f}-{max(cpu):.1f})"
              + (f", up to {passes} passes a round" if passes > 1 else ""))
    if paper_of:
        print(f"\nCompensation cost: round time over the paper's zero-fill in the same repeat, median (range)")
    for name, base in paper_of.items():
        rs = [a["dblp_s"] / b["dblp_s"] for a in rows if a["case"] == name
              for b in rows if b["case"] == base and b["repeat"] == a["repeat"]]
        summary["cases"][name]["over_paper_median"] = statistics.median(rs)
        summary["cases"][name]["over_paper_range"] = [min(rs), max(rs)]
        print(f"  {name:34s} {statistics.median(rs):.3f}x ({min(rs):.3f}-{max(rs):.3f})")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(rows, [c[0] for c in cases], out / "bench_loopback.png", elements, args.workers)
    return 0


def _plot(rows: list[dict], names: list[str], path: Path, elements: int, workers: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 3.6))
    for i, name in enumerate(names):
        rs = [x["ratio"] for x in rows if x["case"] == name]
        ax.scatter([i] * len(rs), rs, color="tab:blue", alpha=0.6, zorder=3)
        ax.hlines(statistics.median(rs), i - 0.25, i + 0.25, color="black", zorder=4)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.text(len(names) - 0.5, 1.0, "gloo ", va="bottom", ha="right", color="grey", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("DBLP round / gloo all-reduce")
    ax.set_ylim(bottom=0)
    ax.set_title(f"loopback, {elements / 1e6:g}M floats x {workers}: each repeat (dots), median (bar)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
