"""Gradient exchanges: the one seam between the training loop and any transport.

Why a seam: the loop must run today (no transport yet), in tests (no
sockets), over the real DBLP worker, over torch.distributed, and inside a DDP
communication hook.  All of them reduce to one call::

    averaged = exchange.exchange(flat_grad)   # float32, same shape

The gradient may live on any device; the result is float32 on the CPU or on
the gradient's own device (:class:`AllreduceExchange` answers on the device:
the DBLP worker copies a CUDA gradient once each way through pinned host
memory), so callers move it where they need it (a no-op when it is there).

plus an optional ``last_info() -> dict`` whose keys (tolerance, clr, latency,
chunks received...) the loop copies into its per-iteration record.

When several workers are *simulated* in one process (sequentially, each on its
own data shard), the loop hands all their gradients at once to
:func:`exchange_group`; an exchange may implement ``exchange_group(grads)``
itself (e.g. to drop chunks of each worker's upload separately, as a server
zero-filling missing chunks would) and otherwise gets their mean.

Implementations here:

* :class:`LocalExchange` - identity / plain mean: the lossless reference.
* :class:`DropExchange` - zeroes exactly ``round(f * chunks)`` randomly chosen
  MTU-sized chunks (362 float32 values by default, the payload of one
  1500-byte DBLP datagram), ``f`` fixed or a function of the iteration: the
  paper's Fig. 1 "zero out a fraction of received gradients".
* :class:`TolerancePolicyExchange` - a stand-in for DBLP's bounded-loss
  receivers under *early stop*: each direction of each round loses exactly
  the chunks the tolerance in force allows, the tolerance coming from a
  :mod:`dblp.protocol.policy` policy (P_low inside a critical learning regime, P_high
  outside, CLR detected from the averaged gradient's norm, eq. (1)).  It lets
  accuracy experiments run without sockets; use the real worker
  (:class:`AllreduceExchange`) when comparing wall time.
* :class:`AllreduceExchange` - adapts any object with ``allreduce(tensor)``
  (the DBLP ``Worker``) to this protocol.
* :class:`TorchDistExchange` - reliable mean over a ``torch.distributed``
  process group (gloo), the no-loss baseline for multi-process runs.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

__all__ = [
    "CHUNK_FLOATS",
    "Exchange",
    "LocalExchange",
    "DropExchange",
    "TolerancePolicyExchange",
    "AllreduceExchange",
    "TorchDistExchange",
    "exchange_group",
    "last_info",
    "phase_fraction",
    "num_chunks",
    "zero_chunks",
]


def _default_chunk_floats() -> int:
    """Float32 values per 1500-byte datagram, taken from the wire format when available."""
    try:
        from dblp.protocol.wire import ChunkLayout

        return ChunkLayout(1).chunk_floats
    except Exception:  # pragma: no cover - wire format absent or changed
        return 362


CHUNK_FLOATS: int = _default_chunk_floats()


@runtime_checkable
class Exchange(Protocol):
    """Anything that turns this worker's flat gradient into the averaged one."""

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:  # pragma: no cover - protocol
        """Return the averaged gradient: same shape, float32, on the CPU or on ``flat_grad``'s device."""
        ...


def last_info(ex: object) -> dict[str, Any]:
    """The exchange's report on its last call, or ``{}`` if it keeps none."""
    fn = getattr(ex, "last_info", None)
    if fn is None:
        return {}
    info = fn()
    return dict(info) if info else {}


def exchange_group(ex: Exchange, grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exchange the gradients of several simulated workers; returns their (lossy) average."""
    if len(grads) == 0:
        raise ValueError("no gradients to exchange")
    group = getattr(ex, "exchange_group", None)
    if group is not None:
        return group(list(grads))
    if len(grads) == 1:
        return ex.exchange(grads[0])
    return ex.exchange(torch.stack(list(grads)).mean(dim=0))


# ----------------------------------------------------------------------------- chunk helpers


def num_chunks(elements: int, chunk_floats: int = CHUNK_FLOATS) -> int:
    return math.ceil(elements / chunk_floats)


def zero_chunks(flat: torch.Tensor, chunk_ids: torch.Tensor, chunk_floats: int = CHUNK_FLOATS) -> torch.Tensor:
    """Zero the given chunks of a 1-D tensor in place (vectorised; the last chunk may be short)."""
    n = flat.numel()
    full = n // chunk_floats
    ids = chunk_ids.long()
    in_full = ids[ids < full]
    if in_full.numel():
        flat[: full * chunk_floats].view(full, chunk_floats)[in_full] = 0
    if full * chunk_floats < n and bool((ids == full).any()):
        flat[full * chunk_floats :] = 0
    return flat


def _drop(flat: torch.Tensor, fraction: float, gen: torch.Generator, chunk_floats: int) -> tuple[torch.Tensor, int, int]:
    """Copy of ``flat`` with exactly ``round(fraction * chunks)`` random chunks zeroed."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"drop fraction must be in [0, 1], got {fraction}")
    out = flat.detach().to("cpu", torch.float32).reshape(-1).clone()
    chunks = num_chunks(out.numel(), chunk_floats)
    k = int(round(fraction * chunks))
    if k:
        ids = torch.randperm(chunks, generator=gen)[:k]
        zero_chunks(out, ids, chunk_floats)
    return out.view_as(flat) if flat.dim() != 1 else out, chunks, k


def phase_fraction(
    fraction: float, start_epoch: int, end_epoch: int, iters_per_epoch: int
) -> Callable[[int], float]:
    """Drop ``fraction`` only during epochs ``[start_epoch, end_epoch)`` (0-based), else 0.

    The returned function maps the exchange's call index (= the training
    iteration) to a drop fraction; used by the phase-sensitivity scenario.
    """
    lo, hi = start_epoch * iters_per_epoch, end_epoch * iters_per_epoch
    return lambda step: fraction if lo <= step < hi else 0.0


# ----------------------------------------------------------------------------- exchanges


class LocalExchange:
    """Lossless: a single worker's gradient comes back unchanged; several are averaged."""

    def __init__(self) -> None:
        self._info: dict[str, Any] = {}

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        out = flat_grad.detach().to("cpu", torch.float32)
        self._info = {"workers": 1, "latency_s": time.perf_counter() - t0}
        return out

    def exchange_group(self, grads: list[torch.Tensor]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = torch.stack([g.detach().to("cpu", torch.float32) for g in grads]).mean(dim=0)
        self._info = {"workers": len(grads), "latency_s": time.perf_counter() - t0}
        return out

    def last_info(self) -> dict[str, Any]:
        return dict(self._info)


class DropExchange:
    """Zero a chosen fraction of MTU-sized gradient chunks, like a lossy receiver that stops early.

    ``fraction`` is a constant or ``f(step) -> fraction`` where ``step`` counts
    calls (one per training iteration).  Exactly ``round(fraction * chunks)``
    distinct chunks are zeroed, chosen uniformly by a seeded generator, and
    nothing is rescaled: DBLP leaves unreceived chunks 0-filled (Alg. 2).

    With simulated workers (``exchange_group``) the drop applies to the
    averaged gradient, i.e. to what every worker receives - the paper's
    preliminary experiment zeroed "a fraction of received gradients".
    """

    def __init__(
        self,
        fraction: float | Callable[[int], float] = 0.0,
        *,
        chunk_floats: int = CHUNK_FLOATS,
        seed: int = 0,
    ) -> None:
        if chunk_floats < 1:
            raise ValueError("chunk_floats must be >= 1")
        self.fraction = fraction
        self.chunk_floats = chunk_floats
        self.step = 0
        self._gen = torch.Generator().manual_seed(seed)
        self._info: dict[str, Any] = {}

    def fraction_at(self, step: int) -> float:
        return float(self.fraction(step) if callable(self.fraction) else self.fraction)

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:
        f = self.fraction_at(self.step)
        out, chunks, k = _drop(flat_grad, f, self._gen, self.chunk_floats)
        self._info = {"drop_fraction": f, "chunks": chunks, "chunks_dropped": k, "step": self.step}
        self.step += 1
        return out

    def exchange_group(self, grads: list[torch.Tensor]) -> torch.Tensor:
        mean = torch.stack([g.detach().to("cpu", torch.float32) for g in grads]).mean(dim=0)
        out = self.exchange(mean)
        self._info["workers"] = len(grads)
        return out

    def last_info(self) -> dict[str, Any]:
        return dict(self._info)


class TolerancePolicyExchange:
    """Loss at the tolerance bound in both directions, tolerance set by a DBLP policy.

    A model of DBLP's *accuracy* cost, not of its timing, driving the same
    round logic as the real server and workers (:mod:`dblp.protocol.session`: the
    policy's tolerance per round, CLR detection on the mean's norm, the
    broadcast under ``p_down``) and the core's receivers (their STOP rule,
    R5/R5b), over an in-memory link instead of sockets. Each transfer's chunks
    go in a random order (loss scattered over the stream); ``loss`` (a fraction,
    or ``f(step)``: a burst schedule) of them is lost in flight. Under the
    paper's early stop a receiver takes the first ``needed_chunks(n, p)`` that
    arrive; under ``stop_rule="once"`` it takes every chunk of the first pass and
    the bound applies to the retransmission of the lost ones. The link has no
    network time (a transfer's chunks arrive at one instant), so no pass is late
    and R5b's ``deadline`` is ``once`` here. The server
    reduces by the run's upload estimate and feeds the mean's L2 norm to the
    policy (:mod:`dblp.protocol.policy`: reliable, fixed ``p`` = the MLT baseline, or the
    CLR-switching ``dblp``); the compensation's arithmetic (fill, error feedback
    and its bound) is :mod:`dblp.protocol.compensation`'s, applied here to the model's
    values. Simulated workers share one model replica, so the broadcast applies
    worker 0's received chunks (and C2's fill from worker 0's contribution, C4's
    residual of what worker 0 missed) to all of them: the replica drift of real
    per-worker broadcasts is not modelled, and C3 carries exactly the chunks the
    server did not hold (a real sender knows only those it never handed out).
    """

    def __init__(
        self,
        policy: Any,
        *,
        directions: str = "both",
        chunk_floats: int = CHUNK_FLOATS,
        seed: int = 0,
        compensation: Any = None,
        loss: float | Callable[[int], float] = 0.0,
    ) -> None:
        from dblp.protocol.compensation import Compensation

        if directions not in ("both", "up", "down"):
            raise ValueError("directions must be 'both', 'up' or 'down'")
        if not callable(getattr(policy, "update", None)):
            raise TypeError("policy needs update(step, grad_norm) -> tolerance (see dblp.protocol.policy)")
        self.policy = policy
        self.directions = directions
        self.chunk_floats = chunk_floats
        self.compensation = compensation if isinstance(compensation, Compensation) else \
            Compensation.from_label(compensation) if compensation else Compensation()
        self.loss = loss
        self.step = 0
        self._gen = torch.Generator().manual_seed(seed)
        self._info: dict[str, Any] = {}
        self._server: Any = None
        self._workers: list[Any] = []
        self._layout: Any = None
        self._ufb: list[Any] = []
        self._bfb: Any = None
        self.records: list[Any] = []  # the sessions' RoundRecords of the last step (server and workers)

    @classmethod
    def dblp(cls, p_low: float, p_high: float, *, eta: float = 0.5, freq: int = 10, **kw: Any) -> "TolerancePolicyExchange":
        from dblp.protocol.policy import DblpPolicy

        return cls(DblpPolicy(p_low=p_low, p_high=p_high, eta=eta, freq=freq), **kw)

    @classmethod
    def fixed(cls, p: float, **kw: Any) -> "TolerancePolicyExchange":
        from dblp.protocol.policy import FixedPolicy

        return cls(FixedPolicy(p), **kw)

    def _setup(self, workers: int, elements: int) -> None:
        from dblp.protocol.compensation import BroadcastFeedback, UploadFeedback
        from dblp.protocol.session import RecordContext, ServerSession, WorkerSession
        from dblp.protocol.wire import FLOAT_BYTES, HEADER_SIZE, IP_UDP_OVERHEAD, ChunkLayout

        c = self.compensation
        layout = self._layout = ChunkLayout(elements, self.chunk_floats * FLOAT_BYTES + HEADER_SIZE + IP_UDP_OVERHEAD)
        ctx = RecordContext(source="model", policy=str(getattr(self.policy, "name", "")), order="random")
        self._server = ServerSession(layout, range(workers), policy=self.policy, run_id=0, context=ctx, values=False,
                                     compensation=c)
        self._workers = [WorkerSession(layout, i, run_id=0, context=ctx, compensation=c) for i in range(workers)]
        self._ufb = [UploadFeedback(layout, c.feedback_bound) for _ in range(workers)] if c.upload_feedback else []
        self._bfb = BroadcastFeedback(layout, c.feedback_bound) if c.broadcast_feedback else None
        self._server.start(float(self.step))
        self._dispatch()

    def _dispatch(self) -> dict[int, Any]:
        """Carry the server session's events to the workers; returns the broadcast senders."""
        from dblp.protocol.session import ControlToSend, RecordWritten, SenderStarted

        senders: dict[int, Any] = {}
        while (ev := self._server.next_event()) is not None:
            if isinstance(ev, ControlToSend):
                self._workers[ev.worker].handle_control(ev.message, float(self.step))
            elif isinstance(ev, SenderStarted):
                senders[ev.worker] = ev.sender
            elif isinstance(ev, RecordWritten):
                self.records.append(ev.record)
        return senders

    def loss_at(self, step: int) -> float:
        f = float(self.loss(step) if callable(self.loss) else self.loss)
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"loss must be in [0, 1], got {f} at step {step}")
        return f

    def _transfer(self, sender: Any, receiver: Any, lossy: bool) -> np.ndarray:
        """Deliver one transfer, then hand its STOP to the sender. Returns the chunks the receiver
        does not hold. ``lossy``: this direction loses (``loss``) and stops by the run's rule;
        otherwise every chunk arrives and the receiver takes them all."""
        from dblp.protocol import control as ctl

        n, now = receiver.layout.chunks, float(self.step)
        if not lossy:
            receiver.receive_chunks(sender.round_no, np.arange(n), now)
        else:
            order = torch.randperm(n, generator=self._gen).numpy()
            lost = int(round(self.loss_at(self.step) * n))
            arrived, missed = order[lost:], order[:lost]
            # R5b: with no network time no first pass outlasts its deadline, so deadline takes the pass as once
            first = arrived if self.compensation.stop_rule in ("once", "deadline") else arrived[: receiver.need]
            receiver.receive_chunks(sender.round_no, first, now)
            if not receiver.complete:  # the first pass's PROBE (R5b: once, the bound applies from here)
                receiver.handle_control(ctl.Probe(sender.round_no, sender.direction, 1), now)
            if not receiver.complete:  # retransmission of the lost ones, cut at the bound (R5)
                receiver.receive_chunks(sender.round_no, missed[: max(0, receiver.need - receiver.received)], now)
        for m in receiver.control_to_send():
            sender.handle_control(m, now)
        if not sender.done:
            raise RuntimeError(f"round {sender.round_no}: the receiver did not stop ({receiver.received} of {n})")
        return np.flatnonzero(~receiver.mask)

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:
        return self.exchange_group([flat_grad])

    def exchange_group(self, grads: list[torch.Tensor]) -> torch.Tensor:
        from dblp.protocol.compensation import fill_local
        from dblp.protocol.reduce import reduce_mean_norm
        from dblp.protocol.wire import zero_chunks as zero_np

        if self._server is None:
            self._setup(len(grads), grads[0].numel())
        elif len(grads) != len(self._workers):
            raise ValueError(f"{len(grads)} gradients; this exchange was set up for {len(self._workers)} workers")
        now, s, lay, c = float(self.step), self._server, self._layout, self.compensation
        self.records = []
        clr_up = bool(self.policy.clr)
        ups, masks, sent = [], [], []
        for i, (g, ws) in enumerate(zip(grads, self._workers)):  # S5: each worker's upstream
            vals = g.detach().to("cpu", torch.float32).reshape(-1).numpy()
            contrib = self._ufb[i].contribution(vals) if self._ufb else vals  # C3
            missing = self._transfer(ws.begin_round(now), s.receiver(i), self.directions in ("both", "up"))
            ws.sent(now)
            if self._ufb:
                self._ufb[i].delivered(missing)
            flat = contrib.copy()
            zero_np(flat, lay, missing)  # R7 at the server
            ups.append(flat)
            masks.append(s.receiver(i).mask.copy())
            sent.append(contrib)
        s.poll(now)  # S2
        self._dispatch()
        mean = np.empty(lay.elements, np.float32)
        norm = reduce_mean_norm(ups, masks, lay, mean, c.upload_estimate)  # C1
        residual = self._bfb.add_to(mean) if self._bfb is not None else 0.0  # C4
        s.broadcast(norm, now)  # S3: policy, ROUND(k, down), the broadcast senders
        senders = self._dispatch()
        lost_down = [self._transfer(senders[i], ws.receiver, self.directions in ("both", "down"))
                     for i, ws in enumerate(self._workers)]
        s.poll(now)  # S4: records, next upstream
        self._dispatch()
        held0 = self._workers[0].receiver.mask.copy()
        self.records += [ws.finish_round(now) for ws in self._workers]
        out = mean.copy()
        zero_np(out, lay, lost_down[0])  # R7 at the (shared) replica
        filled = fill_local(out, sent[0], held0, lay) if c.broadcast_fill == "local" else 0  # C2
        if self._bfb is not None:
            self._bfb.round_over(mean, ~held0)
        rec = next(r for r in self.records if r.role == "server")
        self._info = {
            "tolerance": rec.tolerance_up,
            "tolerance_down": rec.tolerance_down,
            "clr": clr_up,
            "clr_down": rec.clr,
            "server_grad_norm": norm,
            "chunks": rec.chunks,
            "up_dropped": int(sum(lay.chunks - int(m.sum()) for m in masks)),
            "down_dropped": int(lost_down[0].size),
            "workers": len(grads),
            "filled": filled,
            "residual_up_norm": float(np.mean([f.added for f in self._ufb])) if self._ufb else 0.0,
            "residual_down_norm": residual,
            "compensation": c.label(),
        }
        self.step += 1
        res = torch.from_numpy(out)
        return res.view_as(grads[0]) if grads[0].dim() != 1 else res

    def last_info(self) -> dict[str, Any]:
        return dict(self._info)


class AllreduceExchange:
    """Adapter for an object with ``allreduce(tensor)``, e.g. :class:`dblp.transport.worker.Worker`.

    ``allreduce`` may return the averaged tensor alone or ``(tensor, info)``
    where ``info`` is a dict, an object with ``to_dict()`` (a ``RoundRecord``)
    or a list of those (the last one is reported); without ``info`` the
    worker's ``last_record`` attribute is used when it has one.  Its keys
    (``tolerance_up``, ``tolerance_down``, ``clr``, ``round_latency_s``,
    ``up_received``...) land in the loop's iteration records.
    """

    def __init__(self, worker: Any) -> None:
        if not callable(getattr(worker, "allreduce", None)):
            raise TypeError(f"{type(worker).__name__} has no allreduce(tensor) method")
        self.worker = worker
        self._info: dict[str, Any] = {}

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        # As is, on its device: the worker stages it (dblp.transport.staging - a view of a CPU tensor,
        # one pinned non-blocking copy each way for a CUDA one) and answers on the same device.
        res = self.worker.allreduce(flat_grad.detach())
        latency = time.perf_counter() - t0
        info: Any = None
        if isinstance(res, tuple):
            res, info = res[0], (res[1] if len(res) > 1 else None)
        if isinstance(info, (list, tuple)):
            info = info[-1] if info else None
        if info is None:  # dblp.transport.worker.Worker keeps its RoundRecord in last_record
            info = getattr(self.worker, "last_record", None)
        if info is not None and hasattr(info, "to_dict"):
            info = info.to_dict()
        self._info = {"latency_s": latency, **(info or {})}
        out = torch.as_tensor(res)
        if out.dtype != torch.float32:
            out = out.to(torch.float32)
        return out.reshape(flat_grad.shape)

    def last_info(self) -> dict[str, Any]:
        return dict(self._info)


class TorchDistExchange:
    """Reliable mean over a ``torch.distributed`` group (gloo, or NCCL on the GPU): the lossless baseline."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_process_group first")
        self._dist = dist
        self.group = group
        self._info: dict[str, Any] = {}

    def exchange(self, flat_grad: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        # NCCL reduces on the GPU where the gradient is; gloo on the CPU
        dev = flat_grad.device if self._dist.get_backend(self.group) == "nccl" else "cpu"
        buf = flat_grad.detach().to(dev, torch.float32).clone()
        self._dist.all_reduce(buf, op=self._dist.ReduceOp.SUM, group=self.group)
        buf /= self._dist.get_world_size(self.group)
        self._info = {"latency_s": time.perf_counter() - t0}
        return buf

    def last_info(self) -> dict[str, Any]:
        return dict(self._info)
