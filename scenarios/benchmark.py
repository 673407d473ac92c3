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

The measurements live in the library: :mod:`emulation.bench` (one size of the comparison, the loss
rule per round, gloo and iperf3 on the hosts), :mod:`emulation.speedtargets` (the ``--targets``
groups), :mod:`emulation.pacecheck` (``--pacing``); this script parses the flags and prints the tables.

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
from dblp.cli.progress import Stamped  # noqa: E402
from dblp.cli.provenance import write_config  # noqa: E402
from dblp.protocol.wire import MAX_MTU, MIN_MTU, ParameterError  # noqa: E402
from dblp.results.analysis import format_cell  # noqa: E402
from dblp.results.targets import TargetRow  # noqa: E402
from dblp.runs.glooref import GlooError  # noqa: E402
from dblp.runs.gradients import MODEL_HELP, model_elements  # noqa: E402
from dblp.transport.server import ServerConfig  # noqa: E402
from traces.argtypes import count_arg, int_arg  # noqa: E402
from traces.units import duration_arg, fmt_size, queue_arg, rate_arg  # noqa: E402
from emulation.bench import (CRC_ONLY, CSV_COLUMNS, DEFAULT_PATHS, PATHS, SEGMENTED, SHARDED_CRC,  # noqa: E402
                             BenchError, compare_size, gso_probe, write_results)
from emulation.nshosts import NsNet, Shape  # noqa: E402
from emulation.speedtargets import TARGET_SOURCES, measure_repeat, write_targets  # noqa: E402

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


def run_targets(args) -> int:
    """Every target this machine can measure (docs/benchmark.md), side by side, ``--repeats`` times; the
    table (and targets.csv/json) is rewritten after every repeat, so a stopped run keeps its rows."""
    say = Stamped(args.quiet)
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out, args)
    per_repeat: list[list[TargetRow]] = []
    try:
        for rep in range(args.repeats):
            per_repeat.append(measure_repeat(args, say, rep, args.repeats))
            table = write_targets(args, per_repeat)
    except KeyboardInterrupt:
        print("benchmark: interrupted; namespaces and processes removed", file=sys.stderr)
        return 130
    print()
    print(table)
    print(f"\nCSV: {args.out / 'targets.csv'}")
    return 0


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
                    help="worker hosts (and gloo ranks); the scaling check compares 3 and 6")
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
    """A cell of the comparison's table (:func:`dblp.results.analysis.format_cell`, three decimals)."""
    return format_cell(v, spec)


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
                size_rows, size_detail, run_idx = compare_size(net, args, elements, si, run_idx,
                                                               out / f"size-{fmt_size(elements)}", gso_ok, say)
                rows += size_rows
                detail["sizes"].append(size_detail)
                write_results(out, rows, detail)
    except KeyboardInterrupt:
        print("benchmark: interrupted; namespaces and rules removed", file=sys.stderr)
        write_results(out, rows, detail)
        return 130
    except (BenchError, GlooError) as exc:
        print(f"benchmark: error: {exc}", file=sys.stderr)
        write_results(out, rows, detail)
        return 1
    print()
    print_table(rows)
    print(f"\nCSV: {out / 'benchmark.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
