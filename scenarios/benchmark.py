#!/usr/bin/env python3
"""DBLP against gloo all-reduce and iperf3, side by side in one run, on namespace hosts.

Setup (:mod:`emulation.nshosts`): one server host ``srv`` (10.77.0.1) and
three worker hosts ``w1..w3`` (10.77.0.2-4), network namespaces on one Linux
bridge, links optionally TBF-shaped (``--bandwidth``). For each tensor size
(``--models``, float32 elements) it measures:

* **DBLP**: the real ``python -m dblp server`` / ``python -m dblp worker``
  CLI, fixed tolerance ``--p``, for each data path (``--gso``: UDP GSO/GRO
  where the kernel has them, super-packets whole from socket to socket;
  ``--gso-seg``: the same sockets on *segmented links*, the emulation's
  per-datagram-loss path (``emulation.loss.segment_links``: every host's
  device cuts its GSO sends, the loss rules sit on the bridge end of the
  server's link, loaded at 0% through the lossless rounds, and GRO merges
  again at the receiver); ``--plain``: no GSO/GRO, one datagram per
  message in sendmmsg/recvmmsg batches (per-datagram calls without the C
  helper; the emulation's path before segmented links); default all three,
  and the segmented path's round over the GSO round is printed against its
  target, 1.5x). The lossless round is the span from the first worker's
  start of a round to the last worker's averaged result (per-round worker
  records, ``dblp/protocol/records.py``), median over ``--iterations`` rounds after
  ``--warmup``. Goodput per worker = tensor bytes / ``up_latency_s``.
* **gloo**: ``torch.distributed`` all-reduce (sum, then divide: the mean)
  of a tensor of the same size among three ranks in the worker hosts
  (``scenarios/gloo_allreduce.py``, TCP init at w1's address), every rank
  starting at the same wall-clock instant; time = start to the last rank done.
* **One sender**: the same DBLP run with w1 as the only worker (skip with
  ``--no-solo``): its goodput (tensor bytes / ``up_latency_s``) is the one
  compared with iperf3's single flow on the same link, since with three
  workers the server's receive, not a sender, sets the pace.
* **iperf3**: TCP throughput w1 -> srv (one flow), and w1,w2,w3 -> srv at
  once (three flows, summed: what the server's link takes from three senders).
* **Burst**: after the lossless rounds, *calibration* rounds at
  ``--calib-loss`` (default 30%, 50% and 60%) and one *burst* round at ``--burst-loss``
  (default 70%), interleaved and repeated ``--burst-repeats`` times (medians
  reported; the fit below uses every calibration round): an nftables rule ``meta l4proto udp numgen random mod 10000
  < N drop`` in the server namespace (netdev ingress and egress hooks of its
  eth0, so each datagram of either direction sees the loss once, as on a
  lossy link; UDP only, DBLP's TCP control channel is spared; on the GSO path
  these hooks see whole super-packets, so its loss falls on runs of up to 64
  datagrams; on the segmented path the rule is the emulation's, on the bridge
  end of the link, per datagram), added after every worker finished the round
  before and removed after every worker finished the round (workers pause
  ``--gap`` between rounds, so the rule is in place for exactly that
  round; the benchmark checks this from the records' timestamps).
  The prediction from the tolerance arithmetic (:mod:`dblp.results.passcost`):
  passes ``k = min{k : L^k <= p}``; datagrams sent ``n (1-p)/(1-L)`` (the
  receiver stops at ``ceil((1-p) n)`` and each datagram arrives with
  probability ``1-L``); time ``= S0 + a [U0 (f_up - 1) + D0 (f_down - 1)] +
  (k_up - 1 + k_down - 1) o`` with ``S0, U0, D0`` the lossless round, up
  and down times, ``f = sent(L) / sent(0)``, ``o`` the per-pass overhead
  (probe -> bitmap -> next pass) and ``a`` the sender's share of the cost of
  a datagram (a lost datagram costs its sender, not its receiver: a round
  on CPU-bound hosts is neither purely sender- nor receiver-bound). ``a``
  and ``o`` are *measured*: fitted (least squares) to the calibration
  rounds with their actual pass counts; with one calibration round ``a`` is
  taken as 1 (sender-bound). A second prediction (``pred2``) is the
  receiver-bound extreme (``a = 0``): the receiver handles about ``(1-p) n``
  datagrams per direction whatever the loss, so only the extra passes cost:
  ``S0 + (k_up - 1 + k_down - 1) o2`` with ``o2`` fitted the same way.
  The senders also *record* their time between a PROBE and the next pass
  (or STOP), R8 backoff included (``up_wait_reply_s`` / ``down_wait_reply_s``
  in the records' extras); "wait/pass" is that time per extra pass over the
  lossless rounds', a direct measurement to read beside the fitted ``o``
  (it also holds the receiver's catching up before it answers a probe).
  gloo gets the same 70% rule on TCP (netdev ingress
  of each worker's eth0: every ring segment crosses it once) for as long as
  DBLP's burst round lasted, then the rule goes; its time is the all-reduce's
  start to the last rank done.

Output: a table with the ratios (DBLP round / gloo all-reduce, DBLP goodput
/ iperf3), ``benchmark.csv`` (one row per size and path), ``benchmark.json``
(everything, per round), and the raw records and logs, under ``--out``.

Run as root::

    python scenarios/benchmark.py                      # 5M, 25M, 61M; GSO, segmented GSO and plain
    python scenarios/benchmark.py --models 25M --no-gloo --iperf-duration 0 --no-solo --burst-loss 0 \
        --paths gso,gso-seg,plain                      # the per-datagram-loss path against GSO only
    python scenarios/benchmark.py --models 200000 --iterations 3 --iperf-duration 1s   # smoke test
    python scenarios/benchmark.py --models 25M --plain --bandwidth 10G
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv; the repository on sys.path)

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = _bootstrap.ROOT

from dblp.cli.args import add_quiet, parser  # noqa: E402
from dblp.runs.gradients import MODEL_HELP, model_elements  # noqa: E402
from dblp.runs.glooref import GlooError, loopback_median_s  # noqa: E402
from dblp.results.passcost import median, summarize_run  # noqa: E402
from dblp.cli.progress import Stamped  # noqa: E402
from dblp.cli.provenance import write_config  # noqa: E402
from dblp.transport.server import ServerConfig  # noqa: E402
from dblp.results.targets import TargetRow, as_rows, format_table, machine_class, summarize  # noqa: E402
from dblp.results.targets import plot as plot_targets  # noqa: E402
from dblp.protocol.wire import MAX_MTU, MIN_MTU, ParameterError  # noqa: E402
from traces.argtypes import count_arg, int_arg  # noqa: E402
from traces.units import duration_arg, fmt_size, queue_arg, rate_arg  # noqa: E402
from emulation.bench import (CRC_ONLY, DEFAULT_PATHS, PATHS, SEGMENTED, SHARDED_CRC, SHARDED_PATHS,  # noqa: E402
                             BenchError, bench_env, gso_probe, run_dblp, run_gloo, run_iperf, veth_target_rows)
from emulation.nshosts import NsNet, Shape  # noqa: E402

WORKERS = 3  # default of --workers
#: timed rounds a repeat of --targets: over repeats, the veth row's ratio of medians of 5 rounds spreads
#: more than twice as wide as that of medians of 15 (docs/benchmark.md)
TARGET_ROUNDS = 15
#: the authenticated GSO round over the CRC-only one (the authentication target)
AUTH_TARGET = 1.10
#: the segmented path's lossless round over the GSO path's (the segmented path's target)
SEGMENTED_TARGET = 1.5
#: the comparison's other targets: the fastest mode's lossless round over gloo's, the paper's single
#: server's, one sender's goodput over iperf3's single flow, a burst round's error against its prediction
FASTEST_TARGET, SINGLE_SERVER_TARGET, SOLO_TARGET, BURST_ERR_TARGET = 1.2, 1.6, 0.9, 0.15

CSV_COLUMNS = [
    "elements", "tensor_mb", "path", "aggregation", "gso_active", "workers", "p", "rounds", "mtu",
    "dblp_round_s", "dblp_round_min_s", "dblp_up_s", "dblp_down_s",
    "dblp_up_passes", "dblp_up_sent_ratio", "dblp_down_sent_ratio", "udp_rcvbuf_errors",
    "gloo_allreduce_s", "gloo_allreduce_min_s", "ratio_dblp_vs_gloo",
    "dblp_goodput_gbps", "dblp_aggregate_goodput_gbps", "iperf3_gbps", "iperf3_3flows_gbps",
    "ratio_goodput_vs_iperf3", "ratio_aggregate_vs_iperf3_3flows",
    "dblp_solo_goodput_gbps", "dblp_solo_round_s", "ratio_solo_goodput_vs_iperf3",
    "calib_loss", "calib_round_s", "calib_passes_up", "calib_passes_down", "overhead_per_pass_s",
    "sender_share", "wait_per_pass_s",
    "burst_loss", "burst_round_s", "burst_pred_s", "burst_err", "overhead_per_pass_recv_s",
    "burst_pred_recv_s", "burst_err_recv", "burst_passes_up", "burst_passes_down",
    "burst_pred_passes", "burst_timing_ok", "burst_dropped_pkts",
    "gloo_burst_s", "gloo_burst_hold_s", "gloo_burst_timed_out", "ratio_vs_gso_round",
]


def gloo_loopback(elements: int, workers: int, args, outdir: Path, say: Stamped) -> float:
    """Median of ``--iterations`` gloo all-reduces (after ``--warmup``) among ``workers`` local ranks."""
    m = loopback_median_s(elements, workers, rounds=args.rounds, warmup=args.warmup, timeout=args.gloo_timeout,
                          logdir=outdir, env=bench_env(), cwd=REPO)
    say(f"gloo {fmt_size(elements)} x {workers} on loopback: {m * 1e3:.1f} ms")
    return m


def loopback_target_rows(args, say: Stamped, rep: int) -> list[TargetRow]:
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
            g = gloo_loopback(e, w, args, args.out / f"rep{rep}" / f"gloo-loopback-{w}", say)
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


def ddp_target_rows(args, say: Stamped, rep: int) -> list[TargetRow]:
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


# Where further target rows plug in: name -> function(args, say, repeat) returning TargetRow-s
# (or rows with the attributes or keys target, measured, threshold, met: dblp.results.targets.as_rows). The
# self-pacing rows need root and namespace links for minutes: they run by themselves (--pacing).
TARGET_SOURCES: dict = {
    "loopback": loopback_target_rows,
    "veth": veth_target_rows,
    "ddp": ddp_target_rows,
}


def run_targets(args) -> int:
    """Every target this machine can measure (docs/benchmark.md), side by side, ``--repeats`` times; the
    table (and targets.csv/json) is rewritten after every repeat, so a stopped run keeps its rows."""
    say = Stamped(args.quiet)
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out, args)
    per_repeat: list[list[TargetRow]] = []
    try:
        for rep in range(args.repeats):
            rows: list[TargetRow] = []
            for name in args.target_sets:
                say(f"repeat {rep + 1}/{args.repeats}: {name} targets")
                try:
                    rows += as_rows(TARGET_SOURCES[name](args, say, rep))
                except (BenchError, RuntimeError, TimeoutError) as exc:  # the other groups still run
                    say(f"{name} targets: not measured in this repeat: {exc}")
                    rows.append(TargetRow(f"{name} targets", float("nan"), "", {}, detail=str(exc)[-300:]))
            per_repeat.append(rows)
            table = _write_targets(args, per_repeat)
    except KeyboardInterrupt:
        print("benchmark: interrupted; namespaces and processes removed", file=sys.stderr)
        return 130
    print()
    print(table)
    print(f"\nCSV: {args.out / 'targets.csv'}")
    return 0


def _write_targets(args, per_repeat: list[list[TargetRow]]) -> str:
    """targets.csv and targets.json of the repeats so far; returns the printed table with its header."""
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


# -- main ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = parser(
        prog="scenarios/benchmark.py",
        description="DBLP lossless round vs gloo all-reduce vs iperf3, and a 70%% loss burst, "
                    "side by side on network-namespace hosts (1 server, 3 workers). Needs root.")
    ap.add_argument("--models", dest="sizes", nargs="+", default=["5M", "25M", "61M"],
                    help="gradient sizes, each " + MODEL_HELP + " (e.g. 200000 5M 25M, or 5M,25M)")
    ap.add_argument("--iterations", dest="rounds", type=count_arg(1), default=None,
                    help="timed iterations: lossless DBLP rounds / gloo all-reduces (default: 5; with --targets "
                         f"{TARGET_ROUNDS}: medians of 5 rounds make a noisy ratio)")
    ap.add_argument("--warmup", type=count_arg(1), default=1, help="untimed iterations first")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gso", dest="paths", action="store_const", const=["gso"], help="DBLP with UDP GSO/GRO only")
    g.add_argument("--gso-seg", dest="paths", action="store_const", const=[SEGMENTED],
                   help="DBLP with GSO/GRO on segmented links only (the emulation's per-datagram-loss path)")
    g.add_argument("--plain", dest="paths", action="store_const", const=["plain"],
                   help="DBLP without GSO/GRO only (one datagram per message)")
    g.add_argument("--both", dest="paths", action="store_const", const=["gso", "plain"],
                   help="the GSO and plain paths")
    g.add_argument("--paths", dest="paths", type=lambda v: v.split(","), metavar="P[,P...]",
                   help=f"DBLP data paths, comma-separated, of {', '.join(PATHS)} (default: {','.join(DEFAULT_PATHS)}; "
                        f"{CRC_ONLY}: GSO on the CRC-only wire, its round beside the authenticated GSO round's; "
                        f"{SHARDED_CRC}: the sharded mode on the CRC-only wire)")
    ap.set_defaults(paths=list(DEFAULT_PATHS))
    ap.add_argument("--workers", type=count_arg(2), default=WORKERS,
                    help="worker hosts (and gloo ranks); the issue's scaling check compares 3 and 6")
    ap.add_argument("--p", type=float, default=0.008, help="the fixed policy's tolerance (0 = reliable)")
    ap.add_argument("--burst-loss", type=float, default=0.7, help="loss of the burst round (0: no burst)")
    ap.add_argument("--calib-loss", default="0.3,0.5,0.6",
                    help="losses of the calibration rounds that measure the per-pass overhead and the sender's "
                         "share of a datagram's cost, comma-separated (0: none)")
    ap.add_argument("--burst-repeats", type=count_arg(1), default=3,
                    help="times the calibration rounds and the burst round are run (interleaved; medians reported)")
    ap.add_argument("--gap", type=duration_arg(), default="300ms",
                    help="workers' pause between rounds (room to add/remove the loss rule); a bare number is seconds")
    ap.add_argument("--iperf-duration", dest="iperf_seconds", type=duration_arg(), default="3s",
                    help="duration of each iperf3 test; a bare number is seconds (0: skip)")
    ap.add_argument("--no-gloo", action="store_true", help="skip the gloo all-reduce")
    ap.add_argument("--no-solo", dest="solo", action="store_false",
                    help="skip the one-worker DBLP run (its goodput is the one compared with iperf3's single flow)")
    ap.add_argument("--server-threads", type=int_arg(0, 64), default=ServerConfig.threads,
                    help="the DBLP server's event-loop threads (dblp server --threads; each shard server's in "
                         "the sharded mode; 0: by the host's cores)")
    ap.add_argument("--mtu", type=int, default=1500,
                    help="MTU of every host link (9000: jumbo frames); DBLP fills one MTU per datagram, "
                         "gloo and iperf3 run over the same links")
    ap.add_argument("--bandwidth", type=rate_arg(allow_zero=False), default=None,
                    help="TBF-shape every host link at this rate, e.g. 1G; a bare number is Mbit/s "
                         "(default: unshaped veth)")
    ap.add_argument("--queue", type=queue_arg(), default="1MiB", help="TBF queue: bytes or <n>pkt (with --bandwidth)")
    ap.add_argument("--timeout", type=duration_arg(allow_zero=False), default="60s",
                    help="time a DBLP round may take before failing")
    ap.add_argument("--gloo-timeout", type=duration_arg(allow_zero=False), default="60s",
                    help="time a gloo all-reduce may take")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of this run's files (default: results/benchmark/<timestamp>)")
    t = ap.add_argument_group("the transport's speed targets (--targets)")
    t.add_argument("--targets", action="store_true",
                   help="print every speed target this machine can measure, as ratios measured side by "
                        "side (loopback DBLP vs gloo, veth sharded vs gloo, DDP small-model step), met or not; "
                        "the bounds of the 16-core machine apply from 16 cores on")
    t.add_argument("--repeats", type=count_arg(1), default=1,
                   help="repeats of every target measurement (median and range printed)")
    t.add_argument("--target-sets", default=",".join(TARGET_SOURCES),
                   help=f"comma-separated target groups to measure, of: {', '.join(TARGET_SOURCES)}")
    t.add_argument("--target-model", default="25M", help="tensor of the throughput targets, " + MODEL_HELP)
    t.add_argument("--target-workers", default="3,8",
                   help="comma-separated worker counts of the loopback targets (count)")
    t.add_argument("--ddp-steps", type=count_arg(1), default=200,
                   help="timed DDP steps per arm (plain, DBLP) of the small-model target")
    ap.add_argument("--pacing", choices=["none", "quick", "all"], default="none",
                    help="instead of the comparison, measure the pacing targets on namespace hosts and "
                         "print them (emulation.pacecheck): quick = 1 Gbit/s rate rows, 2 pass rows and the burst "
                         "row (~3 min); all = the whole grid (~15-25 min on 2 cores)")
    add_quiet(ap)
    ap.add_argument("--dry-run", action="store_true",
                    help="print the parsed settings and the CSV columns as JSON and exit (no root needed)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = TARGET_ROUNDS if args.targets else 5
    try:
        args.sizes = [model_elements(x) for s in args.sizes for x in s.split(",") if x.strip()]
    except ParameterError as exc:
        ap.error(f"--models: {exc}")
    if not MIN_MTU <= args.mtu <= MAX_MTU:
        ap.error(f"--mtu must be in [{MIN_MTU}, {MAX_MTU}] bytes, got {args.mtu}")
    try:
        args.calib_loss = [float(x) for x in str(args.calib_loss).split(",") if x.strip()]
    except ValueError:
        ap.error(f"--calib-loss must be comma-separated numbers, got {args.calib_loss!r}")
    args.calib_loss = [x for x in args.calib_loss if x != 0]
    bad = [x for x in args.paths if x not in PATHS]
    if bad or not args.paths:
        ap.error(f"--paths: {','.join(bad) or 'none given'}: each must be one of {', '.join(PATHS)}")
    for name, vals in (("p", [args.p]), ("burst_loss", [args.burst_loss]), ("calib_loss", args.calib_loss)):
        for v in vals:
            if not 0 <= v < 1:
                ap.error(f"--{name.replace('_', '-')} must be in [0, 1), got {v}")
    if args.burst_loss > 0 and args.p == 0:
        ap.error("a burst needs --p > 0: with p = 0 the round waits for the last chunk and the prediction "
                 "is a tail bound, not the tolerance arithmetic")
    if args.out is None:
        args.out = REPO / "results" / "benchmark" / time.strftime("%Y%m%d-%H%M%S")
    args.target_sets = [x.strip() for x in args.target_sets.split(",") if x.strip()]
    bad = [x for x in args.target_sets if x not in TARGET_SOURCES]
    if bad or not args.target_sets:
        ap.error(f"--target-sets: {','.join(bad) or 'none given'}: each must be one of {', '.join(TARGET_SOURCES)}")
    try:
        args.target_model = model_elements(args.target_model)
        args.target_workers = [int(x) for x in args.target_workers.split(",") if x.strip()]
    except (ParameterError, ValueError) as exc:
        ap.error(f"--target-model / --target-workers: {exc}")
    if not args.target_workers or min(args.target_workers) < 2:
        ap.error(f"--target-workers: each count must be at least 2 (the sharded mode), got {args.target_workers}")
    return args


def fmt(v, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, spec)


def print_table(rows: list[dict]) -> None:
    cols = [("size", lambda r: fmt_size(r["elements"])), ("path", lambda r: r["path"]),
            ("DBLP s", lambda r: fmt(r["dblp_round_s"])), ("gloo s", lambda r: fmt(r["gloo_allreduce_s"])),
            ("DBLP/gloo", lambda r: fmt(r["ratio_dblp_vs_gloo"], ".2f")),
            ("good Gb/s", lambda r: fmt(r["dblp_goodput_gbps"], ".2f")),
            ("iperf Gb/s", lambda r: fmt(r["iperf3_gbps"], ".2f")),
            ("good/iperf", lambda r: fmt(r["ratio_goodput_vs_iperf3"], ".2f")),
            ("agg/iperf3x", lambda r: fmt(r["ratio_aggregate_vs_iperf3_3flows"], ".2f")),
            ("1 snd/iperf", lambda r: fmt(r.get("ratio_solo_goodput_vs_iperf3", float("nan")), ".2f")),
            ("o/pass ms", lambda r: fmt(r.get("overhead_per_pass_s", float("nan")) * 1e3, ".1f")),
            ("snd share", lambda r: fmt(r.get("sender_share", float("nan")), ".2f")),
            ("wait/pass ms", lambda r: fmt(r.get("wait_per_pass_s", float("nan")) * 1e3, ".1f")),
            ("burst s", lambda r: fmt(r.get("burst_round_s"))),
            ("pred s", lambda r: fmt(r.get("burst_pred_s"))),
            ("err", lambda r: fmt(r.get("burst_err"), "+.1%")),
            ("pred2 s", lambda r: fmt(r.get("burst_pred_recv_s"))),
            ("err2", lambda r: fmt(r.get("burst_err_recv"), "+.1%")),
            ("gloo burst s", lambda r: ("timeout" if r.get("gloo_burst_timed_out") is True else fmt(r.get("gloo_burst_s"))))]
    cells = [[h for h, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    for j, line in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    seg = [r for r in rows if r["path"] != "gso" and not math.isnan(r.get("ratio_vs_gso_round", float("nan")))]
    if seg:
        print("\nlossless round against the GSO round of the same size, same run "
              f"(target for {SEGMENTED}, the emulation's per-datagram-loss path: <= {SEGMENTED_TARGET:g}x):")
        for r in seg:
            ok = ("  meets target" if r["ratio_vs_gso_round"] <= SEGMENTED_TARGET else "  misses target") \
                if r["path"] == SEGMENTED else ""
            print(f"  {fmt_size(r['elements']):>5} {r['path']:>8}: {r['dblp_round_s'] * 1e3:8.1f} ms / "
                  f"{r['dblp_round_s'] / r['ratio_vs_gso_round'] * 1e3:8.1f} ms = {r['ratio_vs_gso_round']:.2f}x{ok}")
    print_targets(rows)
    for r in rows:
        if r["path"] == CRC_ONLY and not math.isnan(r.get("ratio_vs_gso_round", float("nan"))):
            cost = 1 / r["ratio_vs_gso_round"]
            print(f"  {fmt_size(r['elements']):>5} authentication: authenticated GSO round / CRC-only GSO round = "
                  f"{cost:.3f}x  ({'meets' if cost <= AUTH_TARGET else 'misses'} the {AUTH_TARGET:g}x target)")


def print_targets(rows: list[dict]) -> None:
    """The comparison's targets that one run can judge, per tensor size (6 workers against 3 takes two runs:
    compare their DBLP/gloo columns)."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def num(r: dict | None, key: str) -> float:
        v = None if r is None else r.get(key)
        return float("nan") if v is None else float(v)

    for elements in sorted({r["elements"] for r in rows}):
        mine = [r for r in rows if r["elements"] == elements]
        vs_gloo = [r for r in mine if not math.isnan(num(r, "ratio_dblp_vs_gloo"))]
        if not vs_gloo:
            continue
        w, mtu = mine[0].get("workers"), mine[0].get("mtu")
        print(f"\nthe throughput targets, {fmt_size(elements)}, {w} workers, MTU {mtu} (this run):")
        best = min(vs_gloo, key=lambda r: r["ratio_dblp_vs_gloo"])
        print(f"  fastest mode ({best['path']}) / gloo = {best['ratio_dblp_vs_gloo']:.2f}x: "
              f"{verdict(best['ratio_dblp_vs_gloo'] <= FASTEST_TARGET)} (<= {FASTEST_TARGET:g}x; "
              f"stretch, faster than gloo: {verdict(best['ratio_dblp_vs_gloo'] < 1)})")
        gso = next((r for r in mine if r["path"] == "gso"), None)
        if not math.isnan(num(gso, "ratio_dblp_vs_gloo")):
            print(f"  the paper's single server (gso) / gloo = {gso['ratio_dblp_vs_gloo']:.2f}x: "
                  f"{verdict(gso['ratio_dblp_vs_gloo'] <= SINGLE_SERVER_TARGET)} (<= {SINGLE_SERVER_TARGET:g}x)")
        if not math.isnan(num(gso, "ratio_solo_goodput_vs_iperf3")):
            print(f"  one worker's push / iperf3's single flow = {gso['ratio_solo_goodput_vs_iperf3']:.2f}: "
                  f"{verdict(gso['ratio_solo_goodput_vs_iperf3'] >= SOLO_TARGET)} (>= {SOLO_TARGET:g})")
        for r in mine:
            if not math.isnan(num(r, "burst_err")):
                print(f"  {r['path']} {r['burst_loss']:.0%} burst round against its prediction: {r['burst_err']:+.1%}: "
                      f"{verdict(abs(r['burst_err']) <= BURST_ERR_TARGET)} (within {BURST_ERR_TARGET:.0%})")


def pacing_targets(which: str, out: Path) -> int:
    """The self-pacing targets (emulation.pacecheck) as a table and ``out/pacing.csv``."""
    from emulation import pacecheck

    kw = {} if which == "all" else {"rates": [r for r in pacecheck.RATE_LINKS if r[0] == 1e9],
                                    "passes": [(100e6, 100, 3), (1e9, 1000, 8)]}
    rows = pacecheck.targets(out=out / "pacing", python=sys.executable, **kw)
    print(pacecheck.format_targets(rows))
    with open(out / "pacing.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["target", "measured", "unit", "threshold", "met", "detail"])
        w.writerows([r.target, f"{r.measured:.4g}", r.unit, r.threshold, r.met, r.detail] for r in rows)
    print(f"wrote {out / 'pacing.csv'}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        print(json.dumps({"config": config, "csv_columns": CSV_COLUMNS}))
        return 0
    if args.targets:
        return run_targets(args)
    if os.geteuid() != 0:
        print("benchmark: needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    say = Stamped(args.quiet)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.pacing != "none":
        return pacing_targets(args.pacing, out)
    write_config(out, args)  # the resolved flags, commit and package versions (--config takes it back)
    shape = Shape.tbf(args.bandwidth, queue_bytes=args.queue) if args.bandwidth else None
    rows: list[dict] = []
    detail: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "sizes": []}
    say(f"benchmark: sizes {[fmt_size(s) for s in args.sizes]}, DBLP paths {args.paths}, p={args.p:g}, "
        f"results in {out}")
    try:
        with NsNet(["srv", *[f"w{i + 1}" for i in range(args.workers)]], shape=shape, mtu=args.mtu) as net:
            if not net.ping_all():
                raise BenchError("namespace hosts cannot reach each other")
            gso_ok = gso_probe(net["srv"])
            say(f"hosts up: srv {net['srv'].ip}, workers "
                f"{', '.join(net[f'w{i + 1}'].ip for i in range(args.workers))}; UDP GSO/GRO available: {gso_ok}")
            run_idx = 0
            for si, elements in enumerate(args.sizes):
                sdir = out / f"size-{fmt_size(elements)}"
                sdir.mkdir(parents=True, exist_ok=True)
                ip1 = ip3 = float("nan")
                if args.iperf_seconds > 0:
                    ip1 = run_iperf(net, ["w1"], args.iperf_seconds, sdir)
                    ip3 = run_iperf(net, [f"w{i + 1}" for i in range(args.workers)], args.iperf_seconds, sdir)
                    say(f"iperf3: w1->srv {ip1:.2f} Gbit/s; w1,w2,w3->srv {ip3:.2f} Gbit/s")
                dres = {}
                for path in args.paths:
                    run = run_dblp(net, args, elements, path, run_idx, sdir / f"dblp-{path}", say)
                    run_idx += 1
                    dres[path] = summarize_run(run.rounds, run.server, run.loss_rounds, elements=run.elements,
                                               workers=args.workers, p=args.p, calib_loss=args.calib_loss,
                                               lossless=range(args.warmup, args.warmup + args.rounds),
                                               udp=run.udp)
                    d = dres[path]
                    say(f"dblp {fmt_size(elements)} {path}: round {d['dblp_round_s'] * 1e3:.1f} ms, "
                        f"goodput {d['dblp_goodput_gbps']:.2f} Gbit/s per worker"
                        + (f"; burst {d['burst_round_s'] * 1e3:.1f} ms vs predicted {d['burst_pred_s'] * 1e3:.1f} ms"
                           if "burst_round_s" in d else ""))
                # One sender alone on its link: DBLP's goodput against iperf3's one flow.
                solo = {}
                if args.solo:
                    path0 = "gso" if "gso" in args.paths else args.paths[0]
                    sargs = argparse.Namespace(**{**vars(args), "burst_loss": 0.0, "calib_loss": []})
                    srun = run_dblp(net, sargs, elements, path0, run_idx, sdir / f"dblp-{path0}-1worker", say,
                                    n_workers=1)
                    run_idx += 1
                    lossless = [srun.rounds[r][0] for r in range(args.warmup, args.warmup + args.rounds)]
                    solo = {"path": path0,
                            "goodput_gbps": median([elements * 32 / x["up_latency_s"] / 1e9 for x in lossless]),
                            "round_s": median([x["round_latency_s"] for x in lossless])}
                    say(f"dblp {fmt_size(elements)} {path0}, one worker alone: goodput "
                        f"{solo['goodput_gbps']:.2f} Gbit/s, round {solo['round_s'] * 1e3:.1f} ms")
                # gloo's burst lasts as long as DBLP's shortest burst round of this size
                hold = min((d["burst_round_s"] for d in dres.values() if "burst_round_s" in d), default=float("nan"))
                gres = {}
                if not args.no_gloo:
                    gres = run_gloo(net, args, elements, si, None if math.isnan(hold) else hold,
                                    sdir / "gloo", say)
                for path, d in dres.items():
                    row = {c: float("nan") for c in CSV_COLUMNS}
                    row.update({"elements": elements, "tensor_mb": elements * 4 / 1e6, "path": path,
                                "gso_active": gso_ok and path != "plain", "workers": args.workers, "p": args.p,
                                "aggregation": "sharded" if path in SHARDED_PATHS else "server",
                                "mtu": args.mtu,
                                "rounds": args.rounds, "iperf3_gbps": ip1, "iperf3_3flows_gbps": ip3})
                    row.update({k: v for k, v in d.items() if k in row})
                    row.update({k: v for k, v in gres.items() if k in row})
                    row["ratio_dblp_vs_gloo"] = row["dblp_round_s"] / row["gloo_allreduce_s"]
                    row["ratio_goodput_vs_iperf3"] = row["dblp_goodput_gbps"] / ip1
                    if solo.get("path") == path:
                        row["dblp_solo_goodput_gbps"] = solo["goodput_gbps"]
                        row["dblp_solo_round_s"] = solo["round_s"]
                        row["ratio_solo_goodput_vs_iperf3"] = solo["goodput_gbps"] / ip1
                    row["ratio_aggregate_vs_iperf3_3flows"] = row["dblp_aggregate_goodput_gbps"] / ip3
                    row["burst_timing_ok"] = d.get("burst_timing_ok", "") if "burst_timing_ok" in d else ""
                    if d.get("calib_timing_ok") is False or d.get("burst_timing_ok") is False:
                        say(f"warning: {fmt_size(elements)} {path}: a loss rule was not in place for exactly "
                            f"its round (orchestrator too slow for --gap {args.gap:g} s); burst figures suspect")
                    rows.append(row)
                gso_round = dres["gso"]["dblp_round_s"] if "gso" in dres else float("nan")
                for row in rows[-len(dres):]:
                    row["ratio_vs_gso_round"] = row["dblp_round_s"] / gso_round
                detail["sizes"].append({"elements": elements, "iperf3_gbps": ip1, "iperf3_3flows_gbps": ip3,
                                        "dblp": dres, "dblp_one_worker": solo, "gloo": gres})
                _write(out, rows, detail)
    except KeyboardInterrupt:
        print("benchmark: interrupted; namespaces and rules removed", file=sys.stderr)
        _write(out, rows, detail)
        return 130
    except (BenchError, GlooError) as exc:
        print(f"benchmark: error: {exc}", file=sys.stderr)
        _write(out, rows, detail)
        return 1
    print()
    print_table(rows)
    print(f"\nCSV: {out / 'benchmark.csv'}")
    return 0


def _write(out: Path, rows: list[dict], detail: dict) -> None:
    with open(out / "benchmark.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    (out / "benchmark.json").write_text(json.dumps(detail, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
