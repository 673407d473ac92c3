"""Command line: ``python -m dblp server|worker|loopback|hosts ...``.

The worker command replays synthetic gradients of a chosen model size (see
:mod:`dblp.gradients`); training workers use :class:`dblp.worker.Worker`
from Python (``dblp.train``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time


from .gradients import ReplayGradients, model_elements, read_norms, synthetic_norms
from .policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_K, DEFAULT_P_LOW, make_policy
from .server import ParameterServer, ServerConfig, ServerError
from .wire import ParameterError
from .worker import Worker, WorkerError


def _hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


def _rate(s: str) -> float:
    """'100M' -> 1e8 bit/s; '0' -> unlimited."""
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}
    s = s.strip().lower().removesuffix("bit").removesuffix("bps")
    try:
        return float(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad rate {s!r}: use e.g. 0, 500M, 1.5G") from None


def policy_flags(name: str, p_low: float, p_high: float, eta: float, freq: int) -> list[str]:
    """Server flags of a scenario's named run: ``reliable`` (p = 0), ``baseline``
    (fixed p = P_low, MLT) or ``dblp`` (CLR switching between P_low and P_high)."""
    if name == "reliable":
        return ["--policy", "reliable"]
    if name == "baseline":
        return ["--policy", "fixed", "--p", f"{p_low:g}"]
    if name == "dblp":
        return ["--policy", "dblp", "--p-low", f"{p_low:g}", "--p-high", f"{p_high:g}", "--eta", f"{eta:g}",
                "--freq", str(freq)]
    raise ParameterError(f"run must be reliable, baseline or dblp, got {name!r}")


def add_policy_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tolerance policy")
    g.add_argument("--policy", choices=["reliable", "fixed", "dblp"], default="dblp")
    g.add_argument("--p", type=float, default=DEFAULT_P_LOW, help="fixed tolerance, and P_low's default (%(default)s)")
    g.add_argument("--p-low", type=float, default=None, help="DBLP's tolerance in the CLR (default: --p)")
    g.add_argument("--p-high", type=float, default=None, help=f"DBLP's tolerance outside the CLR (default: P_low + {DEFAULT_K})")
    g.add_argument("--eta", type=float, default=DEFAULT_ETA, help="CLR detection threshold (%(default)s)")
    g.add_argument("--freq", type=int, default=DEFAULT_FREQ, help="CLR check period in steps (%(default)s)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="log progress")
    ap = argparse.ArgumentParser(prog="dblp", description="DBLP bounded-loss gradient transport")
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("server", parents=[common], help="run the parameter server",
                       description="Run the DBLP parameter server (Algorithm 3).")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=29500)
    s.add_argument("--workers", type=int, default=3)
    s.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (default: until workers leave)")
    s.add_argument("--mtu", type=int, default=1500)
    s.add_argument("--order", choices=["blocks", "perm", "inorder"], default="blocks",
                   help="chunk send order: a fresh permutation of 64-chunk runs (blocks) or of single chunks "
                        "(perm) each round, or index order (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--reduce", choices=["zero", "unbiased"], default="zero", help="missing-chunk rule (%(default)s)")
    s.add_argument("--rate", type=_rate, default=0.0, help="pacing rate of the broadcast, e.g. 900M (0 = unlimited)")
    s.add_argument("--peer-timeout", type=float, default=120.0,
                   help="seconds of silence before a peer is declared dead (a vanished host is caught "
                        "by TCP keepalive in ~13 s whatever this is)")
    s.add_argument("--on-worker-loss", choices=["exit", "continue"], default="exit")
    s.add_argument("--records", default=None, help="JSONL file for per-round records")
    s.add_argument("--source", default="loopback", help="record source tag (loopback, emulation, hosts)")
    s.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    add_policy_args(s)

    lb = sub.add_parser("loopback", parents=[common], help="time lossless rounds on 127.0.0.1 (no root)",
                        description="Start a server and N workers as processes on 127.0.0.1, run lossless rounds "
                                    "of synthetic gradients and print each round's time (dblp.loopback).")
    lb.add_argument("--elements", default="25M", help="tensor size: a count (25M, 5e6) or a model name (%(default)s)")
    lb.add_argument("--workers", type=int, default=3)
    lb.add_argument("--rounds", type=int, default=5, help="timed rounds (%(default)s)")
    lb.add_argument("--warmup", type=int, default=1, help="untimed rounds first (%(default)s)")
    lb.add_argument("--p", type=float, default=0.0, help="fixed tolerance (0: reliable, the default)")
    lb.add_argument("--mtu", type=int, default=1500)
    lb.add_argument("--order", choices=["blocks", "perm", "inorder"], default="blocks")
    lb.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    lb.add_argument("--json", action="store_true", help="print the result as one JSON object")

    sub.add_parser("hosts", help="run server and workers on an inventory's machines (python -m dblp hosts --help)",
                   add_help=False)
    w = sub.add_parser("worker", parents=[common], help="run a worker replaying synthetic gradients",
                       description="Run a DBLP worker that exchanges synthetic gradients of a model's size.")
    w.add_argument("--server", type=_hostport, required=True, help="server HOST:PORT")
    w.add_argument("--id", type=int, default=-1, help="worker id (default: assigned by the server)")
    w.add_argument("--model", default="efficientnetb0", help="efficientnetb0|resnet50|alexnet|gpt2s or an element count")
    w.add_argument("--rounds", type=int, default=100)
    w.add_argument("--norms", default=None, help="CSV iteration,grad_norm to replay (default: synthetic)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--rate", type=_rate, default=0.0, help="pacing rate, e.g. 900M (0 = unlimited)")
    w.add_argument("--compute-ms", type=float, default=0.0, help="simulated compute time per step")
    w.add_argument("--peer-timeout", type=float, default=120.0,
                   help="seconds of silence before the server is declared dead")
    w.add_argument("--records", default=None, help="JSONL file for per-round records")
    w.add_argument("--source", default="loopback")
    w.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    w.add_argument("--progress", action="store_true", help="print one line per round")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["hosts"]:  # the real-host launcher has its own parser
        from .hosts import main as hosts_main

        return hosts_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.cmd == "loopback":
            from .loopback import loopback_rounds

            elements = model_elements(args.elements)
            res = loopback_rounds(elements, workers=args.workers, rounds=args.rounds, warmup=args.warmup, p=args.p,
                                  mtu=args.mtu, order=args.order, fast=False if args.plain else None)
            if args.json:
                print(json.dumps(res.to_dict()))
            else:
                print(f"{elements} float32 elements, {args.workers} workers, {args.rounds} rounds on 127.0.0.1: "
                      f"median {res.median_s * 1e3:.1f} ms per round")
                for i, (r, u, d) in enumerate(zip(res.round_s, res.up_s, res.down_s)):
                    print(f"  round {i}: {r * 1e3:8.1f} ms  (up {u * 1e3:.1f} ms, down {d * 1e3:.1f} ms)")
        elif args.cmd == "server":
            policy = make_policy(args.policy, p=args.p, p_low=args.p_low, p_high=args.p_high, eta=args.eta, freq=args.freq)
            cfg = ServerConfig(host=args.host, port=args.port, workers=args.workers, policy=policy, mtu=args.mtu,
                               order=args.order, seed=args.seed, reduce=args.reduce, send_rate_bps=args.rate,
                               rounds=args.rounds, peer_timeout=args.peer_timeout,
                               on_worker_loss=args.on_worker_loss, records=args.records, source=args.source,
                               fast=False if args.plain else None)
            srv = ParameterServer(cfg)
            print(f"dblp server listening on {args.host}:{srv.port} for {args.workers} workers", flush=True)
            n = srv.serve()
            print(f"dblp server: served {n} rounds", flush=True)
        else:
            elements = model_elements(args.model)
            norms = read_norms(args.norms) if args.norms else synthetic_norms(max(args.rounds, 1), args.seed)
            with Worker(args.server[0], args.server[1], elements=elements, worker_id=args.id,
                        send_rate_bps=args.rate, peer_timeout=args.peer_timeout, records=args.records,
                        source=args.source, fast=False if args.plain else None) as wk:
                grads = ReplayGradients(elements, wk.worker_id, norms, args.seed)
                for r in range(args.rounds):
                    g = grads(r)  # made first: --compute-ms alone stands for the compute time
                    if args.compute_ms:
                        time.sleep(args.compute_ms / 1000)
                    wk.allreduce(g)
                    rec = wk.last_record
                    if args.progress and rec is not None:
                        print(f"worker {wk.worker_id} round {r}: up {rec.up_latency_s * 1e3:.1f} ms "
                              f"({rec.up_passes} passes, {rec.up_frac:.3f} recv, p={rec.tolerance_up:g}) "
                              f"round {rec.round_latency_s * 1e3:.1f} ms", flush=True)
    except (ParameterError, ServerError, WorkerError, RuntimeError, TimeoutError) as exc:
        print(f"dblp {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dblp {args.cmd}: interrupted", file=sys.stderr)
        return 130
    return 0
