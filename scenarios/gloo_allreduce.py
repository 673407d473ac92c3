"""One rank of a torch.distributed gloo all-reduce, driven line by line from stdin.

The yardstick DBLP is compared with (``scenarios/benchmark.py`` starts one
rank in each worker namespace). Each rank joins the process group over TCP
(``--init tcp://HOST:PORT``, the first worker's address), prints a ``ready``
line, then obeys JSON commands on stdin, one per line:

``{"cmd": "run", "tag": "r3", "elements": 25000000, "start": 1767000000.25}``
    wait until wall-clock time ``start`` (all ranks share the host's clock,
    so every rank starts at the same instant), all-reduce a float32 tensor
    of ``elements`` values (sum, then divide by the world size: the mean,
    as DBLP's server computes it) and print
    ``{"event": "done", "tag", "rank", "elapsed_s", "t_start", "t_end"}``;
    ``elapsed_s`` counts from ``start``. The tensor is refilled from a fixed
    random source before each run, outside the timed part.
``{"cmd": "quit"}``
    leave the process group and exit 0.

Any failure (a collective that exceeds ``--timeout``, a lost peer) prints
``{"event": "error", "tag", "rank", "error"}`` and exits 1: a gloo process
group cannot be used after a failed collective.

Standalone use on one machine, e.g. three ranks on loopback::

    for r in 0 1 2; do
      (echo '{"cmd":"run","tag":"a","elements":25000000,"start":0}'; echo '{"cmd":"quit"}') |
        python scenarios/gloo_allreduce.py --rank $r --world-size 3 --init tcp://127.0.0.1:29600 --iface lo &
    done; wait
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv; the repository on sys.path)

import argparse
import json
import os
import sys
import time
from datetime import timedelta

from dblp.cli.args import hostport
from traces.argtypes import add_verbosity, add_version, count_arg, int_arg
from traces.units import HelpFormatter, duration_arg


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def wait_until(t: float) -> None:
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(left - 0.002 if left > 0.003 else 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One gloo all-reduce rank, commanded by JSON lines on stdin.",
                                 formatter_class=HelpFormatter)
    add_version(ap)  # every entry point answers --version
    add_verbosity(ap)
    ap.add_argument("--rank", type=int_arg(0), required=True, help="this process's rank, 0..world-size-1")
    ap.add_argument("--world-size", type=count_arg(1), required=True, help="number of ranks")
    ap.add_argument("--init", required=True, help="tcp://HOST:PORT of rank 0")
    ap.add_argument("--iface", default=None, help="network interface gloo binds to (sets GLOO_SOCKET_IFNAME)")
    ap.add_argument("--timeout", type=duration_arg(allow_zero=False), default="120s",
                    help="time before a collective fails; a bare number is seconds")
    ap.add_argument("--threads", type=count_arg(1), default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int_arg(0), default=0, help="seed of the tensors")
    args = ap.parse_args(argv)
    if args.rank >= args.world_size:
        ap.error(f"argument --rank: {args.rank} is not a rank of --world-size {args.world_size}")
    if not args.init.startswith("tcp://"):
        ap.error(f"argument --init: expected tcp://HOST:PORT, got {args.init!r}")
    try:
        hostport(args.init[len("tcp://"):])
    except argparse.ArgumentTypeError as exc:
        ap.error(f"argument --init: {exc}")
    if args.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface

    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world_size,
                            timeout=timedelta(seconds=args.timeout))
    emit(event="ready", rank=args.rank, pid=os.getpid())

    src = buf = None
    tag = None
    try:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            msg = json.loads(line)
            if msg.get("cmd") == "quit":
                break
            if msg.get("cmd") != "run":
                emit(event="error", rank=args.rank, tag=msg.get("tag"), error=f"unknown command {msg!r}")
                continue
            tag = msg.get("tag")
            n = int(msg["elements"])
            if src is None or src.numel() != n:
                g = torch.Generator().manual_seed(args.seed * 1000 + args.rank)
                src = torch.randn(n, generator=g, dtype=torch.float32)
                buf = torch.empty_like(src)
            buf.copy_(src)
            start = float(msg.get("start", 0.0))
            wait_until(start)
            t_start = time.time()
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.div_(args.world_size)
            t_end = time.time()
            emit(event="done", rank=args.rank, tag=tag, elements=n, t_start=t_start, t_end=t_end,
                 elapsed_s=t_end - max(start, 0.0) if start > 0 else t_end - t_start)
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, then exit
        emit(event="error", rank=args.rank, tag=tag, error=f"{type(exc).__name__}: {exc}")
        os._exit(1)  # a failed gloo group can hang in its destructor
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
