"""``python -m dblp.train worker ...``: one training worker over the real DBLP transport.

Runs :func:`dblp.train.loop.train` on this worker's shard of the data, with
every gradient exchanged through :class:`dblp.transport.worker.Worker` (the server is
``python -m dblp server``). Used on loopback, in Mininet hosts and on real
hosts alike; prints the run's summary as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import sys

from dblp.protocol.auth import AuthError
from dblp.cli.args import PACE_HELP, add_auth_args, add_local_shard_arg, add_verbosity, hostports, pace_arg, parser, worker_secret
from dblp.transport.shard import NormExchangeError, ShardedWorker
from dblp.transport.worker import Worker, WorkerError
from traces.argtypes import count_arg, float_arg, int_arg, unresolvable
from traces.units import HelpFormatter, duration_arg


def build_parser() -> argparse.ArgumentParser:
    ap = parser("python -m dblp.train", __doc__.splitlines()[0], config=False)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="train one worker over DBLP", formatter_class=HelpFormatter,
                       description="Train one worker's shard, exchanging gradients with a DBLP server.")
    w.add_argument("--server", type=hostports, required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="server HOST:PORT; several, comma-separated: the shard servers of the sharded mode "
                        "(dblp.transport.shard), shard 0 first")
    add_local_shard_arg(w)
    w.add_argument("--id", type=int_arg(0), required=True, help="worker index (data shard)")
    w.add_argument("--workers", type=count_arg(1), required=True, help="number of workers (shards)")
    w.add_argument("--workload", default="small_cnn",
                   help="small_cnn|small_transformer|digits_mlp|mnist1d_cnn|efficientnet_b0|resnet50|alexnet|gpt2_s")
    w.add_argument("--data-root", default=None, help="folder with the data set (CIFAR/WikiText-2)")
    w.add_argument("--data", choices=["real", "teacher"], default="real",
                   help="real: the workload's data set; teacher: a learnable synthetic image set of CIFAR's shape "
                        "labelled by a fixed random teacher network (efficientnet_b0, resnet50, alexnet)")
    w.add_argument("--data-size", type=count_arg(1), default=None,
                   help="--data teacher: training images (default 35,712: 93 iterations per epoch of 3 workers)")
    w.add_argument("--epochs", type=count_arg(1), default=10, help="training epochs")
    w.add_argument("--lr", type=float_arg(0.0, lo_open=True), default=None, help="learning rate (default: the workload's)")
    w.add_argument("--batch-size", type=count_arg(1), default=None, help="per-worker mini-batch (default: the workload's)")
    w.add_argument("--max-iters-per-epoch", type=count_arg(1), default=None, help="cap on iterations per epoch (default: all)")
    w.add_argument("--seed", type=int_arg(0), default=0, help="model init and data order (same on every worker)")
    w.add_argument("--device", default=None, help="cpu|cuda|cuda:N (default: cuda when present; several workers "
                                                   "of one host may share one GPU)")
    w.add_argument("--threads", type=count_arg(1), default=1, help="torch CPU threads")
    w.add_argument("--out", required=True, help="folder for iterations/epochs records and summary.json")
    w.add_argument("--records", default=None, help="JSONL file for the transport's per-round records")
    w.add_argument("--source", default="loopback", help="record source tag (loopback, emulation, hosts)")
    w.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    add_auth_args(w, "worker")
    w.add_argument("--pace", type=pace_arg, default="auto", help="of this worker's sends: " + PACE_HELP)
    w.add_argument("--peer-timeout", type=duration_arg(allow_zero=False), default="60s",
                   help="silence before the server is declared dead")
    add_verbosity(w, progress_alias=True)  # -v (or the older --progress): one line per iteration
    w.add_argument("--eval-every", type=int_arg(0), default=0,
                   help="also take the test metric every this many iterations (0: at epoch ends only); rows in "
                        "OUT/evals.jsonl, the time-to-accuracy curve")
    w.add_argument("--save-weights", action="store_true",
                   help="write the flat weights after every epoch to OUT/weights/ (replica divergence)")
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.id >= a.workers:
        ap.error(f"argument --id: {a.id} is not a worker index of --workers {a.workers} (0..{a.workers - 1})")
    for host, _ in a.server:
        why = unresolvable(host)
        if why:
            ap.error(f"argument --server: {host}: {why}")

    from dblp.train import AllreduceExchange, TrainConfig, get_workload, train
    from dblp.train.data import DatasetMissingError

    try:
        secret = worker_secret(a)
    except AuthError as exc:
        print(f"dblp.train worker: error: {exc}", file=sys.stderr)
        return 2
    try:
        wl = get_workload(a.workload, a.data_root, seed=a.seed, data=a.data, data_size=a.data_size)
    except (DatasetMissingError, KeyError, ValueError, ImportError) as exc:  # ImportError: an optional dependency
        print(f"dblp.train worker: error: {exc}", file=sys.stderr)
        return 2
    params = [p for p in wl.model.parameters() if p.requires_grad]
    elements = sum(p.numel() for p in params)
    over = {k: v for k, v in {"lr": a.lr, "batch_size": a.batch_size,
                               "max_iters_per_epoch": a.max_iters_per_epoch}.items() if v is not None}
    cfg = TrainConfig.for_workload(wl, epochs=a.epochs, rank=a.id, world_size=a.workers, seed=a.seed,
                                   out_dir=a.out, device=a.device, threads=a.threads, progress=a.verbose >= 1,
                                   save_weights=a.save_weights, eval_every=a.eval_every, **over)
    try:
        kw = dict(elements=elements, worker_id=a.id, records=a.records, source=a.source,
                  fast=False if a.plain else None, peer_timeout=a.peer_timeout, send_rate_bps=a.pace,
                  secret=secret, insecure=a.insecure)
        exchange = (ShardedWorker(a.server, local_shard=a.local_shard, **kw) if len(a.server) > 1
                    else Worker(*a.server[0], **kw))
        with exchange as wk:
            summary = train(wl, AllreduceExchange(wk), cfg)
    except (WorkerError, NormExchangeError) as exc:
        print(f"dblp.train worker {a.id}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
