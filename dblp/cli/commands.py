"""Command line: ``python -m dblp server|worker|loopback ...``.

The worker command replays synthetic gradients of a chosen model size (see
:mod:`dblp.runs.gradients`); training workers use :class:`dblp.transport.worker.Worker`
from Python (``dblp.train``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


from traces.argtypes import count_arg, float_arg, int_arg, port_arg, unresolvable
from traces.units import HelpFormatter, duration_arg, size_arg

from dblp.protocol.auth import AuthError, new_secret
from dblp.cli.args import (MTU_HELP, PACE_HELP, pace_arg, add_auth_args, add_compensation_args, add_local_shard_arg, add_policy_args, hostport_any, hostports, listen_arg, model_arg, mtu_arg, parser, policy_error,
                      add_verbosity, log_level, verbosity,
                      server_secret, tolerance_arg, worker_secret)
from dblp.protocol.compensation import Compensation
from dblp.protocol.control import DEFAULT_PORT, MAX_HELLO
from dblp.protocol.core import ORDERS
from dblp.runs.gradients import MODEL_HELP, ReplayGradients, model_elements, read_norms, synthetic_norms
from dblp.protocol.policy import make_policy
from dblp.protocol.records import RecordsError
from dblp.protocol.reduce import DEFAULT_MAX_NORM
from dblp.transport.login import MAX_PENDING
from dblp.transport.server import ParameterServer, ServerConfig, ServerError
from dblp.transport.shard import AGGREGATIONS, NormExchangeError, ShardedWorker, shard_bounds, shard_hub_port
from dblp.runs.startline import StartLine
from dblp.protocol.wire import AUTO_MTU, DEFAULT_MTU, ParameterError
from dblp.transport.worker import Worker, WorkerError


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m dblp`` (the real-host launcher is ``python -m emulation.hosts``).
    Flags follow :data:`dblp.cli.args.VOCABULARY`."""
    ap = parser("dblp", "DBLP bounded-loss gradient transport", config=False)
    sub = ap.add_subparsers(dest="cmd", required=True)
    order_help = ("chunk send order: a fresh permutation of 64-chunk runs (blocks) or of single chunks "
                  "(perm) each round, or index order")

    s = sub.add_parser("server", help="run the parameter server", formatter_class=HelpFormatter,
                       description="Run the DBLP parameter server (Algorithm 3).")
    s.add_argument("--host", type=listen_arg, default="127.0.0.1",
                   help="address, host name or interface name (e.g. eth0) to listen on; 0.0.0.0 = every interface")
    s.add_argument("--port", type=port_arg(allow_any=True), default=DEFAULT_PORT,
                   help="TCP control port (0 = any free port). UDP data does not use it: each worker's data "
                        "runs between a UDP port the server opens for that worker (told in META) and the "
                        "worker's own (told in HELLO), both picked by the kernel from net.ipv4.ip_local_port_range; "
                        "a firewall must pass UDP on that range")
    s.add_argument("--workers", type=count_arg(1), default=3, help="number of workers to wait for")
    s.add_argument("--iterations", type=count_arg(1), default=None,
                   help="stop after this many iterations (rounds) (default: until the workers leave)")
    s.add_argument("--mtu", type=mtu_arg, default=DEFAULT_MTU,
                   help=MTU_HELP + ". Not auto by default: a server's workers are on other hosts, whose paths "
                        "may carry less than the server's own link (a worker whose route does says so; set the "
                        "smallest MTU of the workers' paths here)")
    s.add_argument("--order", choices=list(ORDERS), default="blocks", help=order_help)
    s.add_argument("--seed", type=int_arg(0), default=0, help="seed of the send orders")
    add_compensation_args(s)
    s.add_argument("--pace", type=pace_arg, default="auto", help="of the broadcast: " + PACE_HELP)
    s.add_argument("--peer-timeout", type=duration_arg(allow_zero=False), default="120s",
                   help="silence before a peer is declared dead (a vanished host is caught "
                        "by TCP keepalive in ~13 s whatever this is)")
    s.add_argument("--on-worker-loss", choices=["exit", "continue"], default="exit",
                   help="what a dead worker does to the run: end it, or continue with the others")
    s.add_argument("--records", default=None, help="JSONL file for per-round records")
    s.add_argument("--source", default="loopback", help="record source tag (loopback, emulation, hosts)")
    s.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    s.add_argument("--model", type=model_arg, default=None,
                   help="the tensor this server serves: " + MODEL_HELP + "; workers with another size are "
                        "refused (default: the first valid worker's, bounded by half the free memory)")
    s.add_argument("--handshake-timeout", type=duration_arg(allow_zero=False), default="10s",
                   help="a connection that has not logged in (HELLO, and AUTH) within this time is closed; "
                        "also the shard hub's limit for a shard server's introduction")
    s.add_argument("--max-pending", type=count_arg(1), default=MAX_PENDING,
                   help="connections logging in at once; one more lets the oldest go (as does running out of "
                        "file descriptors), so a flood cannot fill the server")
    s.add_argument("--login-buffer", type=size_arg(), default="16MiB",
                   help="bytes buffered over all logins in progress, e.g. 16MiB; beyond, the connection holding "
                        f"the most is let go (a first message may have at most {MAX_HELLO >> 20} MiB, checked on "
                        f"its header)")
    s.add_argument("--max-grad-norm", type=float_arg(0.0, lo_open=True), default=DEFAULT_MAX_NORM,
                   help="the aggregation guard: a worker's gradient whose L2 norm is above this, or not finite "
                        "(NaN, inf), is left out of that round's mean, logged and recorded")
    s.add_argument("--clip-norm", type=float_arg(0.0, lo_open=True), default=None,
                   help="robust aggregation: scale each worker's gradient down to this L2 norm before "
                        "averaging (default: off)")
    s.add_argument("--consistency", choices=["none", "intersect"], default="none",
                   help="none: each worker applies what it received (the paper; replicas drift); intersect: "
                        "every worker applies only the chunks all received (identical replicas, one more "
                        "control round trip)")
    s.add_argument("--round-hook", default=None, metavar="PATH",
                   help="Unix socket told each round's number before the round opens; the server waits for "
                        "its answer (the emulation's burst clock, dblp.transport.watch.RoundHookServer)")
    s.add_argument("--shards", type=count_arg(1), default=1,
                   help="the sharded mode (beyond the paper, dblp.transport.shard): this server averages one of this "
                        "many shards of --model (without --model: of the size the first worker's HELLO gives); "
                        "1 = the paper's single server")
    s.add_argument("--shard", type=int_arg(0), default=0, help="which shard this server averages (0 .. --shards - 1)")
    s.add_argument("--shard-hub", type=hostport_any, default=None, metavar="HOST:PORT",
                   help="the shard servers' norm exchange: where shard 0 listens (port 0: any free one) and the "
                        "others connect (default: --host, the control port + 1)")
    s.add_argument("--threads", type=int_arg(0, 64), default=ServerConfig.threads,
                   help="event loops over the workers, one thread each with its share of them: the receive and "
                        "send loops run in C without the GIL, so more than one core moves data (consistency "
                        "none only; intersect keeps one); 0 = one per worker up to half the host's cores "
                        "(at least 2)")
    add_policy_args(s)
    add_auth_args(s, "server")

    sec = sub.add_parser("secret", help="print a new shared secret", formatter_class=HelpFormatter,
                         description="Print a new secret (64 hex digits) for $DBLP_SECRET or a --secret-file "
                                     "(write it with umask 077: the file must be readable by its owner only).")
    del sec

    lb = sub.add_parser("loopback", help="time lossless rounds on 127.0.0.1 (no root)",
                        formatter_class=HelpFormatter,
                        description="Start a server and N workers as processes on 127.0.0.1, run lossless rounds "
                                    "of synthetic gradients and print each round's time (dblp.runs.loopback).")
    lb.add_argument("--model", type=model_arg, default="25M", help="gradient size: " + MODEL_HELP)
    lb.add_argument("--workers", type=count_arg(1), default=3, help="number of workers")
    lb.add_argument("--iterations", type=count_arg(1), default=5, help="timed iterations (rounds)")
    lb.add_argument("--warmup", type=int_arg(0), default=1, help="untimed iterations first")
    lb.add_argument("--p", type=tolerance_arg, default=0.0, help="the fixed policy's tolerance (0: reliable)")
    lb.add_argument("--mtu", type=mtu_arg, default=AUTO_MTU,
                    help=MTU_HELP + " (default auto: the path is 127.0.0.1's lo; 1500 measures the "
                         "Ethernet-sized datagrams of real hosts)")
    lb.add_argument("--order", choices=list(ORDERS), default="blocks", help=order_help)
    lb.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    lb.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_compensation_args(lb)
    lb.add_argument("--aggregation", choices=list(AGGREGATIONS), default="server",
                    help="server: the paper's single parameter server; sharded: one shard server per worker "
                         "(reduce-scatter, then all-gather)")
    lb.add_argument("--insecure", action="store_true",
                    help="the paper's CRC-only wire (default: the authenticated wire, a fresh secret per run)")

    w = sub.add_parser("worker", help="run a worker replaying synthetic gradients",
                       formatter_class=HelpFormatter,
                       description="Run a DBLP worker that exchanges synthetic gradients of a model's size.")
    w.add_argument("--server", type=hostports, required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="server HOST:PORT; several, comma-separated: the shard servers of the sharded mode, "
                        "shard 0 first")
    add_local_shard_arg(w)
    w.add_argument("--id", type=int_arg(-1), default=-1, help="worker id (-1: assigned by the server)")
    w.add_argument("--model", type=model_arg, default="efficientnet_b0", help="gradient size: " + MODEL_HELP)
    w.add_argument("--iterations", type=count_arg(1), default=100, help="iterations (rounds) to run")
    w.add_argument("--norms", default=None, help="CSV iteration,grad_norm to replay (default: synthetic)")
    w.add_argument("--seed", type=int_arg(0), default=0, help="seed of the synthetic gradients and norms")
    w.add_argument("--pace", type=pace_arg, default="auto", help=PACE_HELP)
    w.add_argument("--compute", type=duration_arg(), default="0",
                   help="simulated compute time per iteration, e.g. 5ms; a bare number is seconds")
    w.add_argument("--peer-timeout", type=duration_arg(allow_zero=False), default="120s",
                   help="silence before the server is declared dead")
    w.add_argument("--records", default=None, help="JSONL file for per-round records")
    w.add_argument("--source", default="loopback", help="record source tag (loopback, emulation, hosts)")
    w.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    w.add_argument("--start-together", default=None, metavar="DIR",
                   help="before each round, wait until every worker of the run has its gradient ready (a file "
                        "per worker and round in DIR, a folder all workers share): rounds are timed from a "
                        "common start, as the gloo harness times its all-reduce (dblp.runs.startline; benchmarks) "
                        "(default: off, each worker starts as soon as its gradient is made)")
    add_verbosity(w, progress_alias=True)  # -v (or the older --progress): one line per round
    add_auth_args(w, "worker")
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["hosts"]:  # moved above dblp (it drives the emulation): say where
        print("dblp: the real-host launcher is `python -m emulation.hosts` (docs/hosts.md)", file=sys.stderr)
        return 2
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad value refused by name (status 2): main() returns the status
        return int(exc.code or 0)
    policy = None
    if args.cmd == "server" and args.shards > 1:
        why = "--shard must be below --shards" if args.shard >= args.shards else None
        if why:
            print(f"dblp server: error: --shard {args.shard} --shards {args.shards}: {why}", file=sys.stderr)
            return 2
    if args.cmd == "server":  # the policy objects' own checks (P_high >= P_low...), by flag, before any socket
        try:
            policy = make_policy(args.policy, p=args.p, p_low=args.p_low, p_high=args.p_high, eta=args.eta,
                                 freq=args.freq)
        except ParameterError as exc:
            print(f"dblp server: error: {policy_error(exc)}", file=sys.stderr)
            return 2
        try:  # the compensation options against --consistency (C6), by flag
            compensation = Compensation.from_args(args)
            compensation.check_consistency(args.consistency)
        except ParameterError as exc:
            print(f"dblp server: error: {exc}", file=sys.stderr)
            return 2
    if args.cmd == "secret":
        print(new_secret())
        return 0
    records = getattr(args, "records", None)
    if args.cmd in ("server", "worker") and records and not os.path.lexists(os.path.dirname(records) or "."):
        # a typo in a records path makes no folders (the launchers make theirs before they start us)
        print(f"dblp {args.cmd}: error: --records {records}: the folder {os.path.dirname(records)} does not exist "
              f"(make it first)", file=sys.stderr)
        return 2
    secret: bytes | None = None
    try:
        if args.cmd == "server":
            secret, where = server_secret(args)
        elif args.cmd == "worker":
            secret = worker_secret(args)
    except (AuthError, OSError) as exc:
        print(f"dblp {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level(args),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.cmd == "loopback":
            from dblp.runs.loopback import loopback_rounds

            elements = model_elements(args.model)
            res = loopback_rounds(elements, workers=args.workers, rounds=args.iterations, warmup=args.warmup, p=args.p,
                                  mtu=args.mtu, order=args.order, fast=False if args.plain else None,
                                  insecure=args.insecure, aggregation=args.aggregation,
                                  compensation=Compensation.from_args(args))
            if args.json:
                print(json.dumps(res.to_dict()))
            else:
                print(f"{elements} float32 elements, {args.workers} workers, {args.iterations} rounds on 127.0.0.1 "
                      f"at MTU {res.mtu}: "
                      f"median {res.median_s * 1e3:.1f} ms per round")
                for i, (r, u, d) in enumerate(zip(res.round_s, res.up_s, res.down_s)):
                    print(f"  round {i}: {r * 1e3:8.1f} ms  (up {u * 1e3:.1f} ms, down {d * 1e3:.1f} ms)")
        elif args.cmd == "server":
            elements = model_elements(args.model) if args.model else None
            hub = None
            if args.shards > 1:
                if elements is not None:  # else the first worker's HELLO says the shard's size
                    a, b = shard_bounds(elements, args.shards)[args.shard]
                    elements = b - a
                hub = args.shard_hub or (args.host, shard_hub_port(args.port))
            cfg = ServerConfig(host=args.host, port=args.port, workers=args.workers, policy=policy, mtu=args.mtu,
                               order=args.order, seed=args.seed, compensation=compensation,
                               send_rate_bps=args.pace,
                               rounds=args.iterations, peer_timeout=args.peer_timeout,
                               on_worker_loss=args.on_worker_loss, records=args.records, source=args.source,
                               fast=False if args.plain else None, handshake_timeout=args.handshake_timeout,
                               max_pending=args.max_pending, max_login_bytes=args.login_buffer,
                               max_grad_norm=args.max_grad_norm, clip_norm=args.clip_norm,
                               elements=elements, consistency=args.consistency, round_hook=args.round_hook,
                               secret=secret, insecure=args.insecure, shard=args.shard, shards=args.shards,
                               shard_hub=hub, threads=args.threads)
            try:
                srv = ParameterServer(cfg)
            except OSError as exc:  # a busy port, an address of no interface here, a name that does not resolve
                if exc.filename is not None or isinstance(exc, RecordsError):  # --records
                    raise
                print(f"dblp server: error: cannot listen on --host {args.host} --port {args.port}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return 2
            print(f"dblp server listening on {args.host}:{srv.port} for {args.workers} workers; {where}; "
                  f"MTU {cfg.mtu_source}", flush=True)
            x = srv.norm_exchange
            if x is not None:
                print(f"dblp server: shard {args.shard} of {args.shards}, {elements or 'HELLO-sized'} elements; "
                      + (f"shard hub on {args.host}:{x.port}" if args.shard == 0 else
                         f"shard hub at {hub[0]}:{hub[1]}"), flush=True)
            n = srv.serve()
            print(f"dblp server: served {n} rounds", flush=True)
        else:
            for host, _ in args.server:
                why = unresolvable(host)
                if why:
                    print(f"dblp worker: error: --server {host}: {why}", file=sys.stderr)
                    return 2
            elements = model_elements(args.model)
            norms = read_norms(args.norms) if args.norms else synthetic_norms(max(args.iterations, 1), args.seed)
            kw = dict(elements=elements, worker_id=args.id, send_rate_bps=args.pace, peer_timeout=args.peer_timeout,
                      records=args.records, source=args.source, fast=False if args.plain else None, secret=secret,
                      insecure=args.insecure)
            if len(args.server) > 1:
                shard_bounds(elements, len(args.server))  # refuses a tensor too small to cut, by name
                wk_cm: Worker | ShardedWorker = ShardedWorker(args.server, local_shard=args.local_shard, **kw)
            else:
                wk_cm = Worker(args.server[0][0], args.server[0][1], **kw)
            with wk_cm as wk:
                grads = ReplayGradients(elements, wk.worker_id, norms, args.seed)
                line = None
                if args.start_together:
                    meta = (wk.shards[0] if isinstance(wk, ShardedWorker) else wk).meta
                    line = StartLine(args.start_together, int(meta["workers"]), wk.worker_id, args.peer_timeout)
                for r in range(args.iterations):
                    g = grads(r)  # made first: --compute alone stands for the compute time
                    if args.compute:
                        time.sleep(args.compute)
                    if line is not None:
                        line.wait(r)
                    wk.allreduce(g)
                    rec = wk.last_record
                    if verbosity(args) >= 1 and rec is not None:
                        print(f"worker {wk.worker_id} round {r}: up {rec.up_latency_s * 1e3:.1f} ms "
                              f"({rec.up_passes} passes, {rec.up_frac:.3f} recv, p={rec.tolerance_up:g}) "
                              f"round {rec.round_latency_s * 1e3:.1f} ms", flush=True)
    except (ParameterError, ServerError, WorkerError, NormExchangeError, RuntimeError, TimeoutError) as exc:
        print(f"dblp {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file of --records or --norms that cannot be opened
        print(f"dblp {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dblp {args.cmd}: interrupted", file=sys.stderr)
        return 130
    return 0
