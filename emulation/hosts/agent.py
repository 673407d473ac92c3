"""The program the launcher starts on each worker host: a DBLP worker that writes what the run gathers.

``python -m emulation.hosts worker ...`` (under ``torchrun`` for training):
a :class:`dblp.worker.Worker` replaying synthetic gradients, or training a
:mod:`dblp.train` workload through it, writing ``records.jsonl``,
``compute.csv`` and ``device.json`` into ``--out``. ``python -m
emulation.hosts facts`` prints what a host is (preflight). Only
:mod:`dblp` is used on the host: nothing here starts networks.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from traces.argtypes import count_arg, float_arg, int_arg
from traces.units import duration_arg, rate_arg

from dblp.cliargs import add_auth_args, worker_secret

from .inventory import MODES


def host_facts(with_torch: bool = False) -> dict:
    """What a host is: name, python, CPU, GPUs (nvidia-smi; torch.cuda with ``with_torch``)."""
    f: dict[str, Any] = {"hostname": socket.gethostname(), "python": sys.version.split()[0],
                         "executable": sys.executable, "platform": platform.platform(),
                         "cpus": os.cpu_count(), "cpu": _cpu_model(), "gpus": [], "cuda_available": False}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20)
            f["gpus"] = [x.strip() for x in r.stdout.splitlines() if x.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if with_torch:
        try:
            import torch

            f["torch"] = torch.__version__
            f["cuda_available"] = bool(torch.cuda.is_available())
            if f["cuda_available"]:
                f["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                f["cuda"] = torch.version.cuda
        except Exception as exc:  # noqa: BLE001
            f["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import dblp

        f["dblp"] = str(Path(dblp.__file__).resolve().parent)
    except Exception:  # noqa: BLE001
        pass
    return f


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _device_name(dev: Any) -> str:
    if getattr(dev, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(dev)
    return f"cpu ({_cpu_model()})"


def worker_main(a: argparse.Namespace) -> int:
    """The worker program on a host: a :class:`dblp.worker.Worker` replaying synthetic gradients or
    training a :mod:`dblp.train` workload; writes records.jsonl, compute.csv and device.json in ``--out``."""
    from dblp.records import RecordWriter
    from dblp.worker import Worker

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    host = os.environ.get("DBLP_HOSTS_HOST", socket.gethostname())
    rank = a.id
    if rank < 0 and "RANK" in os.environ:  # under torchrun
        rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    server_host, _, server_port = a.server.rpartition(":")
    comp = open(out / "compute.csv", "w", newline="", encoding="utf-8")
    cw = csv.DictWriter(comp, ["worker", "round", "compute_s", "exchange_s", "iteration_s", "device"])
    cw.writeheader()
    writer = RecordWriter(out / "records.jsonl")
    info: dict[str, Any] = {"host": host, "rank": rank, "local_rank": local_rank, "mode": a.mode,
                            "pid": os.getpid(), "torchrun": "TORCHELASTIC_RUN_ID" in os.environ}
    try:
        if a.mode == "synthetic":
            from dblp.gradients import ReplayGradients, model_elements, synthetic_norms

            elements = model_elements(a.model)
            device = f"cpu ({_cpu_model()})"
            info.update(device=device, elements=elements)
            (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
            norms = synthetic_norms(max(a.iterations, 1), a.seed)
            with Worker(server_host, int(server_port), elements=elements, worker_id=rank,
                        send_rate_bps=a.pace, peer_timeout=a.peer_timeout, source="hosts",
                        fast=False if a.plain else None, secret=worker_secret(a), insecure=a.insecure) as wk:
                grads = ReplayGradients(elements, wk.worker_id, norms, a.seed)
                for k in range(a.iterations):
                    t0 = time.perf_counter()
                    if a.compute:
                        time.sleep(a.compute)
                    g = grads(k)
                    t1 = time.perf_counter()
                    wk.allreduce(g)
                    t2 = time.perf_counter()
                    rec = wk.last_record
                    assert rec is not None
                    rec.extra.update(host=host, device=device, compute_s=t1 - t0)
                    writer.write(rec)
                    cw.writerow({"worker": wk.worker_id, "round": k, "compute_s": t1 - t0, "exchange_s": t2 - t1,
                                 "iteration_s": t2 - t0, "device": device})
                    comp.flush()
            return 0
        # -- training ------------------------------------------------------------------
        import torch

        from dblp.train.exchange import AllreduceExchange
        from dblp.train.loop import TrainConfig, iterations_per_epoch, resolve_device, train
        from dblp.train.models import WORKLOAD_DEFAULTS, get_workload, workload_key

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        else:
            device = resolve_device("cpu")
        batch = a.batch_size or int(WORKLOAD_DEFAULTS[workload_key(a.workload)]["batch_size"])
        # synthetic data: exactly as many random samples as the run's batches need (the default 64 would not)
        wl = get_workload(a.workload, a.data_root or None, synthetic=a.synthetic_data, seed=a.seed,
                          synthetic_size=max(64, a.world_size * a.train_iterations * batch))
        over: dict[str, Any] = dict(epochs=a.epochs, max_iters_per_epoch=a.train_iterations, rank=rank,
                                    world_size=a.world_size, device=str(device), out_dir=str(out / "train"),
                                    seed=a.seed, eval_max_batches=a.eval_batches or None)
        if a.batch_size:
            over["batch_size"] = a.batch_size
        if a.lr:
            over["lr"] = a.lr
        if a.threads:
            over["threads"] = a.threads
        cfg = TrainConfig.for_workload(wl, **over)
        iters = iterations_per_epoch(wl, cfg)
        if iters != a.train_iterations:
            raise SystemExit(f"emulation.hosts worker {rank}: only {iters} iterations of batch {cfg.batch_size} fit this "
                             f"worker's shard, the run needs train.iterations = {a.train_iterations} (lower it)")
        name = _device_name(device)
        n_params = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
        info.update(device=name, device_index=str(device), workload=wl.name, parameters=n_params,
                    cuda_available=torch.cuda.is_available(), torch=torch.__version__)
        (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
        with Worker(server_host, int(server_port), elements=n_params, worker_id=rank,
                    send_rate_bps=a.pace, peer_timeout=a.peer_timeout, source="hosts",
                    fast=False if a.plain else None, secret=worker_secret(a), insecure=a.insecure) as wk:
            def on_iteration(it: dict) -> None:
                rec = wk.last_record
                if rec is not None:
                    rec.extra.update(host=host, device=name, compute_s=it["compute_s"], loss=it.get("loss"))
                    writer.write(rec)
                cw.writerow({"worker": wk.worker_id, "round": it["iteration"], "compute_s": it["compute_s"],
                             "exchange_s": it["exchange_latency_s"], "iteration_s": it["iteration_s"],
                             "device": name})
                comp.flush()

            s = train(wl, AllreduceExchange(wk), cfg, on_iteration=on_iteration)
            (out / "train_summary.json").write_text(json.dumps(s.to_dict(), indent=1, default=str) + "\n")
        return 0
    finally:
        writer.close()
        comp.close()



def add_worker_args(w: argparse.ArgumentParser) -> None:
    """The agent's flags (written by :func:`emulation.hosts.commands.worker_argv`)."""
    w.add_argument("--server", required=True, help="the server's HOST:PORT")
    w.add_argument("--id", type=int_arg(-1), default=-1, help="worker id (-1: $RANK under torchrun)")
    w.add_argument("--out", required=True, help="folder for records.jsonl, compute.csv, device.json")
    w.add_argument("--mode", choices=MODES, default="synthetic", help="synthetic gradients or training")
    w.add_argument("--iterations", type=count_arg(1), default=100, help="iterations (rounds) of the run")
    w.add_argument("--model", default="1e6", help="synthetic gradient size: a model name or an element count")
    w.add_argument("--compute", type=duration_arg(), default="0",
                   help="simulated compute per iteration (synthetic), e.g. 5ms; a bare number is seconds")
    w.add_argument("--seed", type=int_arg(0), default=0, help="seed of the synthetic gradients and the training")
    w.add_argument("--pace", type=rate_arg(), default="0", help="pacing rate, e.g. 900M; a bare number is Mbit/s")
    w.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    add_auth_args(w, "worker")
    w.add_argument("--peer-timeout", type=duration_arg(allow_zero=False), default="60s",
                   help="silence before the server is declared dead")
    w.add_argument("--source", default="hosts", help="record source tag")
    w.add_argument("--workload", default="small_cnn", help="training workload (dblp.train.models)")
    w.add_argument("--epochs", type=count_arg(1), default=1, help="training epochs")
    w.add_argument("--train-iterations", type=count_arg(1), default=20, help="training iterations per epoch")
    w.add_argument("--world-size", type=count_arg(1), default=1, help="workers in the training")
    w.add_argument("--batch-size", type=count_arg(1), default=None, help="training batch size (default: the workload's)")
    w.add_argument("--lr", type=float_arg(0.0, lo_open=True), default=None, help="learning rate (default: the workload's)")
    w.add_argument("--threads", type=count_arg(1), default=None, help="torch CPU threads (default: torch's)")
    w.add_argument("--data-root", default="", help="dataset folder (default: the workload's)")
    w.add_argument("--synthetic-data", action="store_true", help="random data of the dataset's shape")
    w.add_argument("--eval-batches", type=int, default=0,
                   help="test batches per evaluation (default 0: the whole test set)")
