"""The worker training loop: forward, backward, one flat gradient exchange, step.

Why one flat buffer: DBLP chunks a single float32 tensor into MTU-sized
datagrams (paper IV-B), so the loop concatenates every parameter's ``.grad``
(in ``model.parameters()`` order, missing grads as zeros) into one vector,
hands it to an :class:`~dblp.train.exchange.Exchange`, and writes the averaged
vector back before the optimizer step (paper Alg. 4).  The exchange is the
only thing that differs between a local run, the DBLP transport, a
torch.distributed baseline and the tests.

Workers, two ways:

* one process per worker (real hosts, Mininet hosts, loopback): every process
  runs :func:`train` with its ``rank``/``world_size``, trains on its disjoint
  shard and exchanges through the transport;
* ``sim_workers=N`` in one process: N shards, N forward/backward passes per
  iteration on one shared model replica, and the N gradients go to the
  exchange together (:func:`~dblp.train.exchange.exchange_group`) - a quick,
  exact stand-in for synchronous data parallelism.

Records (``out_dir``): ``iterations.jsonl`` (streamed, one line per
iteration), ``epochs.jsonl`` (streamed), their CSV twins written at the end,
``grad_norms.csv`` (see :func:`export_grad_norms`) and ``summary.json``.
Per iteration: ``iteration, epoch, loss, grad_norm, grad_norm_exchanged,
exchange_latency_s, compute_s, iteration_s`` plus every key of the exchange's
``last_info()`` (a key that collides with the loop's gets an ``exchange_``
prefix).  Per epoch: ``train_loss``, the test metric (``accuracy`` or
``perplexity``), ``test_loss``, ``epoch_wall_s`` (training only),
``eval_s``, ``elapsed_s`` and exchange totals.

``evals.jsonl`` (streamed): one row per test evaluation, at every epoch end and,
with ``eval_every = N``, after every N-th iteration: ``iteration`` (iterations
done), ``train_s`` (time in the training loop so far, evaluations excluded: the
clock of Table V and of time to accuracy, so the evaluation cadence does not
move it), ``elapsed_s`` and the test metric. Time to a target accuracy is read
from these rows (:func:`dblp.results.trainreport.time_to_targets`); an iteration that
is also an epoch end is evaluated once.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn

from dblp.cli.progress import eta_text
from dblp.protocol.records import json_safe
from dblp.train.data import iterate_batches
from dblp.train.exchange import Exchange, LocalExchange, exchange_group, last_info
from dblp.train.models import Workload

__all__ = [
    "TrainConfig",
    "TrainSummary",
    "train",
    "resolve_device",
    "iterations_per_epoch",
    "epoch_iterations",
    "flatten_grads",
    "assign_flat_grad",
    "export_grad_norms",
    "read_grad_norms",
    "GRAD_NORM_HEADER",
]

GRAD_NORM_HEADER = ("iteration", "grad_norm")


@dataclass
class TrainConfig:
    """Hyper-parameters and run options; :meth:`for_workload` starts from a workload's defaults."""

    epochs: int = 5
    batch_size: int = 32  # per worker
    lr: float = 0.05
    optimizer: str = "sgd"  # "sgd" (with momentum) | "adamw"
    momentum: float = 0.9
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None  # applied to the exchanged gradient
    warmup_iters: int = 0  # linear learning-rate warm-up over the first iterations (transformers)
    seed: int = 0  # data order and augmentation (the model is seeded by get_workload)
    sim_workers: int = 1  # workers simulated sequentially in this process
    rank: int = 0  # this process's worker index when each worker is a process
    world_size: int = 1
    device: str | None = None  # None: "cuda" when available, else "cpu"
    max_iters_per_epoch: int | None = None
    augment: bool = True
    eval_batch_size: int = 256
    eval_max_batches: int | None = None  # None: the whole test set (a number limits it, for smoke runs)
    eval_at_start: bool = False  # also record the metric before any training (epoch 0)
    eval_every: int = 0  # also test every this many iterations (0: at epoch ends only); rows in evals.jsonl
    out_dir: str | None = None
    save_weights: bool = False  # write out_dir/weights/epochNNN.npy (flat float32) after every epoch
    progress: bool = False  # one line per epoch on stderr
    threads: int | None = None  # torch.set_num_threads, for shared CPUs

    @classmethod
    def for_workload(cls, wl: Workload, **overrides: Any) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        bad = [k for k in overrides if k not in names]
        if bad:
            raise TypeError(f"unknown TrainConfig field(s): {', '.join(bad)}")
        merged = {k: v for k, v in wl.defaults.items() if k in names}
        merged.update(overrides)
        return cls(**merged)


@dataclass
class TrainSummary:
    """What a run returns (``iteration_records``/``epoch_records`` stay out of summary.json)."""

    workload: str
    metric: str
    final: dict[str, float]
    epochs: int
    iterations: int
    wall_s: float
    train_s: float
    exchange_s: float
    device: str
    parameters: int
    workers: int
    nonfinite_iterations: int
    out_dir: str | None = None
    epoch_records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    iteration_records: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def final_metric(self) -> float:
        return float(self.final.get(self.metric, float("nan")))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("iteration_records")
        d["final_metric"] = self.final_metric
        return d


# ----------------------------------------------------------------------------- helpers


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when present (or when asked), CPU otherwise."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def flatten_grads(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """All gradients as one flat vector, in ``params`` order; a missing grad counts as zeros."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def assign_flat_grad(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Inverse of :func:`flatten_grads`: copy ``flat`` back into every ``.grad``."""
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"exchanged gradient has {flat.numel()} values, the model has {total}")
    offset = 0
    for p in params:
        n = p.numel()
        src = flat[offset : offset + n].view_as(p).to(p.device, p.dtype)
        if p.grad is None:
            p.grad = src.clone()
        else:
            p.grad.copy_(src)
        offset += n


def epoch_iterations(samples: int, batch_size: int, world_size: int = 1, sim_workers: int = 1) -> int:
    """Full batches per epoch of one worker: its equal shard of ``samples`` (remainder rows unused)."""
    return samples // world_size // sim_workers // batch_size


def iterations_per_epoch(workload: Workload, cfg: TrainConfig) -> int:
    """Iterations (= exchange rounds) per epoch that :func:`train` will run for ``cfg``."""
    iters = epoch_iterations(len(workload.train_set), cfg.batch_size, cfg.world_size, cfg.sim_workers)
    if cfg.max_iters_per_epoch is not None:
        iters = min(iters, cfg.max_iters_per_epoch)
    return iters


def _make_optimizer(params: Sequence[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {cfg.optimizer!r}")


def _plain(v: Any) -> Any:
    """JSON-friendly value (tensors and numpy scalars become Python numbers)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})


class _Jsonl:
    def __init__(self, path: Path | None) -> None:
        self.fh = open(path, "w", encoding="utf-8") if path else None

    def write(self, rec: Mapping[str, Any]) -> None:
        if self.fh:
            self.fh.write(json.dumps(json_safe(_plain(rec)), allow_nan=False) + "\n")  # NaN -> null
            self.fh.flush()

    def close(self) -> None:
        if self.fh:
            self.fh.close()


# ----------------------------------------------------------------------------- gradient-norm export


def export_grad_norms(
    source: TrainSummary | Iterable[Mapping[str, Any]] | str | os.PathLike,
    path: str | os.PathLike,
    *,
    column: str = "grad_norm",
) -> Path:
    """Write a run's per-iteration gradient-norm sequence for the simulator.

    Format: CSV, UTF-8, header line ``iteration,grad_norm``, then one row per
    training iteration in order: ``iteration`` is the global 0-based
    iteration index (one exchange round each), ``grad_norm`` the L2 norm as a
    decimal float (``nan`` if the gradient was not finite).  By default
    ``grad_norm`` is the norm of the gradient *before* the exchange - with
    simulated workers the norm of their mean, i.e. what a lossless server
    would feed its CLR detector; pass ``column`` to export another recorded
    column (e.g. ``"grad_norm_exchanged"``).

    ``source``: a :class:`TrainSummary`, iteration records, or the path of an
    ``iterations.jsonl`` file.
    """
    if isinstance(source, TrainSummary):
        rows: Iterable[Mapping[str, Any]] = source.iteration_records
    elif isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    else:
        rows = source
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(GRAD_NORM_HEADER)
        for i, r in enumerate(rows):
            if column not in r:
                raise KeyError(f"iteration record {i} has no {column!r} column")
            v = r[column]
            w.writerow([int(r.get("iteration", i)), repr(float("nan") if v is None else float(v))])  # null = NaN
    return out


def read_grad_norms(path: str | os.PathLike) -> list[float]:
    """Read a file written by :func:`export_grad_norms` (checks the header)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rd = csv.reader(fh)
        header = next(rd, None)
        if tuple(header or ()) != GRAD_NORM_HEADER:
            raise ValueError(f"{path}: expected header {','.join(GRAD_NORM_HEADER)}, got {header}")
        return [float(row[1]) for row in rd if row]


# ----------------------------------------------------------------------------- the loop


def train(
    workload: Workload,
    exchange: Exchange | None = None,
    config: TrainConfig | None = None,
    *,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> TrainSummary:
    """Train ``workload.model`` in place through ``exchange`` (default :class:`LocalExchange`).

    Returns a :class:`TrainSummary` with the final test metric and every
    record; writes the record files when ``config.out_dir`` is set.
    ``on_iteration``/``on_epoch`` receive each record as it is made (progress
    bars, early stopping by raising).
    """
    cfg = config or TrainConfig.for_workload(workload)
    ex: Exchange = exchange if exchange is not None else LocalExchange()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.sim_workers < 1 or cfg.world_size < 1:
        raise ValueError("sim_workers and world_size must be >= 1")
    if cfg.world_size > 1 and cfg.sim_workers > 1:
        raise ValueError("use either world_size (one process per worker) or sim_workers, not both")

    device = resolve_device(cfg.device)
    model = workload.model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt = _make_optimizer(params, cfg)
    sched = None
    if cfg.warmup_iters > 0:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / cfg.warmup_iters))

    train_set = workload.train_set
    if cfg.world_size > 1:
        train_set = train_set.shard(cfg.rank, cfg.world_size)
    shards = [train_set.shard(i, cfg.sim_workers) for i in range(cfg.sim_workers)]
    iters = iterations_per_epoch(workload, cfg)
    if iters < 1:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than a worker's shard ({min(len(s) for s in shards)} samples)"
        )

    out = Path(cfg.out_dir) if cfg.out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    it_log = _Jsonl(out / "iterations.jsonl" if out else None)
    ep_log = _Jsonl(out / "epochs.jsonl" if out else None)
    ev_log = _Jsonl(out / "evals.jsonl" if out else None)
    it_records: list[dict[str, Any]] = []
    ep_records: list[dict[str, Any]] = []
    aug_gen = torch.Generator().manual_seed(cfg.seed * 7919 + cfg.rank + 1)
    t_run = time.perf_counter()
    train_s = exchange_s = 0.0
    nonfinite = 0
    step = 0

    def evaluate() -> tuple[dict[str, float], float]:
        t0 = time.perf_counter()
        m = workload.evaluate(model, device, batch_size=cfg.eval_batch_size, max_batches=cfg.eval_max_batches)
        return m, time.perf_counter() - t0

    def eval_row(m: Mapping[str, float], ev_s: float, train_so_far: float) -> None:
        ev_log.write({"iteration": step, "epoch": step / iters, "train_s": train_so_far,
                      "elapsed_s": time.perf_counter() - t_run, "eval_s": ev_s, **m})

    def log(msg: str) -> None:
        if cfg.progress:
            print(f"[{workload.name} rank {cfg.rank}] {msg}", file=sys.stderr, flush=True)

    try:
        if cfg.eval_at_start:
            m, ev_s = evaluate()
            rec = {"epoch": 0, "iterations": 0, "train_loss": float("nan"), **m, "epoch_wall_s": 0.0,
                   "eval_s": ev_s, "elapsed_s": time.perf_counter() - t_run, "exchange_s": 0.0}
            ep_records.append(rec)
            ep_log.write(rec)
            if on_epoch:
                on_epoch(rec)
        for epoch in range(cfg.epochs):
            t_ep = time.perf_counter()
            batches = [
                iterate_batches(
                    s, cfg.batch_size,
                    generator=torch.Generator().manual_seed(
                        (cfg.seed * 1_000_003 + epoch) * 4099 + cfg.rank * 257 + w
                    ),
                )
                for w, s in enumerate(shards)
            ]
            ep_loss, ep_ex, ep_info_tol, ep_clr = 0.0, 0.0, [], []
            mid_eval_s = 0.0  # evaluations inside the epoch (eval_every), kept out of its training time
            for _ in range(iters):
                t_it = time.perf_counter()
                grads, losses = [], []
                for w in range(cfg.sim_workers):
                    xb, yb = next(batches[w])
                    if cfg.augment and workload.augment is not None:
                        xb = workload.augment(xb, aug_gen)
                    x = workload.prepare(xb, device)
                    y = yb.to(device, non_blocking=True)
                    opt.zero_grad(set_to_none=False)
                    loss = workload.loss(model(x), y)
                    loss.backward()
                    # stays on the model's device: the exchange decides how it reaches the host
                    # (the DBLP worker: one pinned non-blocking copy each way, dblp.transport.staging)
                    grads.append(flatten_grads(params).detach().to(torch.float32))
                    losses.append(float(loss.detach()))
                local = grads[0] if len(grads) == 1 else torch.stack(grads).mean(dim=0)
                g_norm = float(local.norm())
                t_ex = time.perf_counter()
                avg = exchange_group(ex, grads)
                ex_lat = time.perf_counter() - t_ex
                if avg.numel() != n_params:
                    raise ValueError(f"exchange returned {avg.numel()} values for {n_params} parameters")
                assign_flat_grad(params, avg.reshape(-1))
                if cfg.clip_grad_norm:
                    torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad_norm)
                lr_used = opt.param_groups[0]["lr"]
                opt.step()
                if sched is not None:
                    sched.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                it_s = time.perf_counter() - t_it
                mean_loss = sum(losses) / len(losses)
                if not math.isfinite(mean_loss) or not math.isfinite(g_norm):
                    nonfinite += 1
                rec: dict[str, Any] = {
                    "iteration": step,
                    "epoch": epoch,
                    "loss": mean_loss,
                    "grad_norm": g_norm,
                    "grad_norm_exchanged": float(avg.norm()),
                    "exchange_latency_s": ex_lat,
                    "compute_s": it_s - ex_lat,
                    "iteration_s": it_s,
                    "lr": lr_used,
                }
                for k, v in last_info(ex).items():
                    rec[f"exchange_{k}" if k in rec else k] = _plain(v)
                it_records.append(rec)
                it_log.write(rec)
                if on_iteration:
                    on_iteration(rec)
                ep_loss += mean_loss
                ep_ex += ex_lat
                tol = rec.get("tolerance", rec.get("tolerance_up"))  # stand-in / DBLP worker record
                if tol is not None:
                    ep_info_tol.append(float(tol))
                if "clr" in rec:
                    ep_clr.append(bool(rec["clr"]))
                step += 1
                if cfg.eval_every and step % cfg.eval_every == 0 and step % iters:  # epoch ends: below
                    t_ev = time.perf_counter()
                    m, ev_s = evaluate()
                    eval_row(m, ev_s, train_s + (t_ev - t_ep) - mid_eval_s)
                    mid_eval_s += time.perf_counter() - t_ev
            ep_wall = time.perf_counter() - t_ep - mid_eval_s
            train_s += ep_wall
            exchange_s += ep_ex
            m, ev_s = evaluate()
            eval_row(m, ev_s, train_s)
            erec: dict[str, Any] = {
                "epoch": epoch + 1,
                "iterations": step,
                "train_loss": ep_loss / iters,
                **m,
                "epoch_wall_s": ep_wall,
                "eval_s": ev_s,
                "elapsed_s": time.perf_counter() - t_run,
                "exchange_s": ep_ex,
            }
            if ep_info_tol:
                erec["tolerance_mean"] = sum(ep_info_tol) / len(ep_info_tol)
            if ep_clr:
                erec["clr_fraction"] = sum(ep_clr) / len(ep_clr)
            ep_records.append(erec)
            ep_log.write(erec)
            if cfg.save_weights and out:  # replica divergence is measured from these (exact, after the run)
                (out / "weights").mkdir(exist_ok=True)
                flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])
                np.save(out / "weights" / f"epoch{epoch + 1:03d}.npy", flat.numpy())
            if on_epoch:
                on_epoch(erec)
            log(
                f"epoch {epoch + 1}/{cfg.epochs}: train_loss {erec['train_loss']:.4f} "
                f"{workload.metric} {m[workload.metric]:.4f} ({ep_wall:.1f}s train, {ev_s:.1f}s eval; "
                f"{eta_text(epoch + 1, cfg.epochs, time.perf_counter() - t_run, 'epoch')})"
            )
    finally:
        it_log.close()
        ep_log.close()
        ev_log.close()

    final = {k: v for k, v in ep_records[-1].items() if k in (workload.metric, "test_loss")} if ep_records else {}
    summary = TrainSummary(
        workload=workload.name,
        metric=workload.metric,
        final=final,
        epochs=cfg.epochs,
        iterations=step,
        wall_s=time.perf_counter() - t_run,
        train_s=train_s,
        exchange_s=exchange_s,
        device=str(device),
        parameters=n_params,
        workers=cfg.sim_workers if cfg.world_size == 1 else cfg.world_size,
        nonfinite_iterations=nonfinite,
        out_dir=str(out) if out else None,
        epoch_records=ep_records,
        iteration_records=it_records,
    )
    if out:
        _write_csv(out / "iterations.csv", it_records)
        _write_csv(out / "epochs.csv", ep_records)
        export_grad_norms(it_records, out / "grad_norms.csv")
        with open(out / "summary.json", "w", encoding="utf-8") as fh:
            json.dump(json_safe(_plain({**summary.to_dict(), "config": asdict(cfg)})), fh, indent=2, allow_nan=False)
    return summary
