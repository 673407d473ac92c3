"""A few training steps of each paper model over the real DBLP transport: the GPU data path, checked.

    python -m dblp.train.gpucheck                      # the four paper models, CUDA when available
    python -m dblp.train.gpucheck --models efficientnet_b0 --device cpu --steps 2

Why: the paper trains on GPUs, and the gradient's way from the device to the
transport and back (:mod:`dblp.transport.staging`: one pinned, non-blocking copy each
way on CUDA; no copy for CPU tensors) is the part a CPU-only test cannot
show. Each model trains ``--steps`` iterations in this process: a
:class:`~dblp.transport.server.ParameterServer` in a thread and ``--workers`` workers in
threads (each its own identically seeded replica, a real
:class:`~dblp.transport.worker.Worker` on loopback UDP/TCP), on synthetic data of the
real input shapes (CIFAR 3x32x32 images with 10/100 classes, GPT-2 token
ids over its 50,257-word vocabulary). Prints, per model: device, parameters,
chunks per round, the first step's time (CUDA start-up) and the mean time and
exchange time of the later steps. ``gpt2_s`` needs Hugging Face
``transformers`` and is skipped with a message without it.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Sequence

import torch

from dblp.protocol.policy import DblpPolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.train.exchange import AllreduceExchange
from dblp.train.loop import TrainConfig, resolve_device, train
from dblp.train.models import PAPER_WORKLOADS, get_workload, workload_key
from dblp.transport.worker import Worker
from traces.argtypes import add_verbosity, add_version

__all__ = ["CheckResult", "check_model", "main"]


@dataclass
class CheckResult:
    """One model's steps: what ran where and how long it took."""

    model: str
    device: str
    parameters: int
    chunks: int
    workers: int
    steps: int
    first_step_s: float  # includes CUDA/cuDNN start-up
    step_s: float  # mean over the later steps (the first when there is only one)
    exchange_s: float  # mean exchange (worker.allreduce) time of the same steps
    pinned: bool  # the worker staged through page-locked host memory (CUDA path)
    finite: bool

    def line(self) -> str:
        return (f"{self.model:16s} {self.device:8s} {self.parameters / 1e6:8.2f}M {self.chunks:8d} "
                f"{self.first_step_s * 1e3:10.1f} {self.step_s * 1e3:9.1f} {self.exchange_s * 1e3:9.1f}  "
                f"{'yes' if self.pinned else 'no':6s} {'ok' if self.finite else 'NOT FINITE'}")


HEADER = (f"{'model':16s} {'device':8s} {'params':>9s} {'chunks':>8s} {'1st (ms)':>10s} {'step (ms)':>9s} "
          f"{'exch (ms)':>9s}  {'pinned':6s} loss")


def check_model(name: str, *, device: str | None = None, workers: int = 2, steps: int = 3, batch: int = 4,
                seq_len: int = 128, timeout_s: float = 600.0) -> CheckResult:
    """Train ``name`` for ``steps`` iterations over a loopback DBLP server with ``workers`` workers."""
    key = workload_key(name)
    dev = resolve_device(device)
    kw: dict = {"synthetic": True, "synthetic_size": workers * batch * steps}
    if key == "gpt2_s":
        kw["seq_len"] = seq_len
    wls = [get_workload(key, seed=0, **kw) for _ in range(workers)]  # same seed: identical replicas
    n_params = sum(p.numel() for p in wls[0].model.parameters() if p.requires_grad)
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=workers, rounds=steps,
                                       policy=DblpPolicy(p_low=0.008, p_high=0.408), peer_timeout=timeout_s))
    served: dict = {}

    def serve() -> None:
        try:
            served["rounds"] = srv.serve()
        except Exception as exc:  # noqa: BLE001 - reported below
            served["error"] = exc

    th = threading.Thread(target=serve, name=f"gpucheck-server-{key}", daemon=True)
    th.start()
    results: list = [None] * workers
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            wl = wls[rank]
            cfg = TrainConfig.for_workload(wl, epochs=1, batch_size=batch, max_iters_per_epoch=steps, rank=rank,
                                           world_size=workers, device=str(dev), eval_batch_size=batch,
                                           eval_max_batches=1, warmup_iters=0)
            with Worker("127.0.0.1", srv.port, elements=n_params, worker_id=rank, peer_timeout=timeout_s,
                        secret=srv.secret) as w:
                s = train(wl, AllreduceExchange(w), cfg)
                results[rank] = (s, w.layout.chunks, w.staging.pinned)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(r,), name=f"gpucheck-worker{r}") for r in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout_s)
    th.join(30)
    if errors:
        raise errors[0]
    if "error" in served:
        raise served["error"]
    if any(r is None for r in results):
        raise RuntimeError(f"{key}: a worker did not finish within {timeout_s:.0f} s")
    s, chunks, pinned = results[0]
    recs = s.iteration_records
    later = recs[1:] or recs
    return CheckResult(
        model=key, device=str(dev), parameters=n_params, chunks=chunks, workers=workers, steps=len(recs),
        first_step_s=recs[0]["iteration_s"],
        step_s=sum(r["iteration_s"] for r in later) / len(later),
        exchange_s=sum(r["exchange_latency_s"] for r in later) / len(later),
        pinned=pinned, finite=all(math.isfinite(r["loss"]) for r in recs) and s.nonfinite_iterations == 0,
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dblp.train.gpucheck", description=__doc__.split("\n\n")[0])
    add_version(ap)  # every entry point answers --version
    ap.add_argument("--models", default=",".join(PAPER_WORKLOADS), help="comma-separated workloads (default: the paper's four)")
    ap.add_argument("--device", default=None, help="cuda | cpu | cuda:N (default: cuda when available)")
    ap.add_argument("--workers", type=int, default=None, help="workers (threads; default 2 on CUDA, 1 on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per model (default 5 on CUDA, 2 on CPU)")
    ap.add_argument("--batch", type=int, default=None, help="batch per worker (default 32 on CUDA, 8 on CPU)")
    ap.add_argument("--seq-len", type=int, default=None, help="gpt2_s context (default 128 on CUDA, 16 on CPU)")
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        dev = resolve_device(a.device)
    except RuntimeError as exc:
        ap.error(f"argument --device: {exc}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"argument --device: {a.device!r} asked for CUDA, but torch.cuda.is_available() is False here")
    cuda = dev.type == "cuda"
    workers = a.workers if a.workers is not None else (2 if cuda else 1)
    steps = a.steps if a.steps is not None else (5 if cuda else 2)
    # 8, not 2, on CPU: with 2 samples a BatchNorm over 1x1 maps divides by a near-zero variance, and
    # efficientnet_b0's first gradient norm then ranged 6e7 to 9e10 between runs, now and then inf
    batch = a.batch if a.batch is not None else (32 if cuda else 8)
    seq_len = a.seq_len if a.seq_len is not None else (128 if cuda else 16)
    for flag, v in (("--workers", workers), ("--steps", steps), ("--batch", batch), ("--seq-len", seq_len)):
        if v < 1:
            ap.error(f"argument {flag}: must be >= 1, got {v}")
    if batch < 2:
        ap.error("argument --batch: must be >= 2 (BatchNorm needs more than one value per channel)")
    models = []
    for m in (x.strip() for x in a.models.split(",") if x.strip()):
        try:
            models.append(workload_key(m))
        except KeyError as exc:
            ap.error(f"argument --models: {exc.args[0]}")
    where = torch.cuda.get_device_name(dev) if cuda else "CPU"
    print(f"gpucheck: device {dev} ({where}), torch {torch.__version__}, {workers} worker(s), {steps} steps, "
          f"batch {batch}, DBLP over loopback (P_low 0.008 / P_high 0.408)", flush=True)
    print(HEADER, flush=True)
    failed = 0
    for m in models:
        if m == "gpt2_s" and find_spec("transformers") is None:
            print(f"{m:16s} skipped: needs Hugging Face transformers (pip install transformers)", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            r = check_model(m, device=str(dev), workers=workers, steps=steps, batch=batch, seq_len=seq_len)
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the others still run
            failed += 1
            print(f"{m:16s} FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        failed += not r.finite or (cuda and not r.pinned)
        print(f"{r.line()}   ({time.perf_counter() - t0:.1f} s in all)", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
