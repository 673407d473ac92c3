"""A DistributedDataParallel communication hook that routes gradients through any Exchange.

Usage (torchrun-launched, a gloo/nccl process group for DDP's bookkeeping)::

    ddp = DistributedDataParallel(model)
    state = ExchangeHookState(AllreduceExchange(dblp_worker))   # or any Exchange
    ddp.register_comm_hook(state, exchange_hook)

Why one exchange per iteration instead of one per bucket: DDP hands its hook
gradient *buckets* (25 MB by default, several per iteration, and their
layout changes once after the first iteration when DDP rebuilds buckets).  A
DBLP worker is set up for one fixed tensor size, and the paper exchanges the
whole gradient as one flat buffer per round.  So the hook only queues each
bucket and returns an unfinished future; when DDP hands over the last bucket
of the iteration (``bucket.is_last()``), it concatenates all queued buckets
(always every gradient - the total size never changes), makes a single
``exchange`` call, and completes every bucket's future with its slice of the
averaged result.  DDP waits for the futures only after all buckets were
launched, so completing the earlier ones late is safe.

The exchange must return the *mean* over workers (as ``Exchange`` does);
DDP's own all-reduce hook divides by the world size for the same reason.
Not supported: ``find_unused_parameters=True`` with parameters that really go
unused (their buckets shrink the buffer) - the hook raises if the size changes.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's
# annotations at register time and needs them as real objects.
import time
from typing import Any

import torch
import torch.distributed as dist

from dblp.train.exchange import Exchange, last_info

__all__ = ["ExchangeHookState", "exchange_hook"]


class ExchangeHookState:
    """The hook's state: the exchange, the buckets queued this iteration, per-round records."""

    def __init__(self, exchange: Exchange, *, keep_records: bool = True) -> None:
        self.exchange = exchange
        self.keep_records = keep_records
        self.records: list[dict[str, Any]] = []
        self.round = 0
        self.elements: int | None = None
        self._pending: list[tuple[torch.futures.Future, torch.Tensor]] = []

    def __getstate__(self) -> dict[str, Any]:  # DDP may pickle hook state; queued buckets stay behind
        d = dict(self.__dict__)
        d["_pending"] = []
        return d

    def flush(self) -> None:
        """Exchange every queued bucket as one flat buffer and complete their futures."""
        pending, self._pending = self._pending, []
        # Concatenated where the buckets are (a CUDA device under NCCL): the exchange makes the
        # one device->host copy of the round itself (dblp.transport.staging: pinned, non-blocking).
        flat = torch.cat([b.detach().reshape(-1) for _, b in pending])
        if flat.dtype != torch.float32:
            flat = flat.to(torch.float32)
        if self.elements is None:
            self.elements = flat.numel()
        elif flat.numel() != self.elements:
            err = RuntimeError(
                f"DDP handed {flat.numel()} gradient values this iteration, {self.elements} before; "
                "unused parameters are not supported by exchange_hook"
            )
            for fut, _ in pending:
                fut.set_exception(err)
            raise err
        t0 = time.perf_counter()
        avg = self.exchange.exchange(flat)
        latency = time.perf_counter() - t0
        off = 0
        for fut, b in pending:
            n = b.numel()
            # A fresh tensor per bucket, not a view into ``avg``: with views of one shared
            # buffer, DDP (torch 2.14, rebuilt buckets) applied wrong values to some
            # parameters from the second iteration on - measured, see the DDP hook test.
            fut.set_result(avg[off : off + n].to(b.device, b.dtype, copy=True).view_as(b))
            off += n
        if self.keep_records:
            self.records.append({
                "round": self.round, "buckets": len(pending), "elements": flat.numel(),
                "grad_norm": float(flat.norm()), "exchange_latency_s": latency, **last_info(self.exchange),
            })
        self.round += 1


def exchange_hook(state: ExchangeHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: queue the bucket; on the iteration's last bucket, exchange all of them."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    state._pending.append((fut, bucket.buffer()))
    if bucket.is_last():
        state.flush()
    return fut
