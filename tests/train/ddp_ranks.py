"""What the two-process DDP tests share: a spawned process as a rank of a gloo group, and one
training run of small_cnn on the rank's shard.

Each test compares plain DDP with DDP whose buckets go through an exchange hook, so both arms
must see the same model, batches and optimiser; they are written once here, and a test states
only what differs (the bucket size and the exchange).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from dblp.train.ddp import ExchangeHookState
    from dblp.train.exchange import Exchange

BATCH = 16


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    """This process as rank ``rank`` of a gloo group of ``world`` meeting at 127.0.0.1:``port``,
    on one torch thread (the machine's cores are shared); the group is destroyed on leaving."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


@dataclass
class Trained:
    """A run's DDP model after its last step, the loss of each step and the hook's state (None
    without a hook)."""

    model: torch.nn.Module
    losses: list[float]
    state: ExchangeHookState | None


def train_small_cnn(rank: int, world: int, steps: int, *, bucket_cap_mb: float,
                    exchange: Callable[[torch.nn.Module], Exchange] | None = None) -> Trained:
    """``steps`` SGD steps (lr 0.05, momentum 0.9) of small_cnn (seed 0) under DDP, on batches of
    16 taken in turn from this rank's shard. With ``exchange`` (called with the model, it gives
    the :class:`dblp.train.exchange.Exchange`) DDP's buckets go through ``exchange_hook`` to it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dblp.train.ddp import ExchangeHookState, exchange_hook
    from dblp.train.models import get_workload

    wl = get_workload("small_cnn", seed=0)
    shard = wl.train_set.shard(rank, world)
    model = DDP(wl.model, bucket_cap_mb=bucket_cap_mb)
    state = None
    if exchange is not None:
        state = ExchangeHookState(exchange(wl.model))
        model.register_comm_hook(state, exchange_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    per_pass = len(shard) // BATCH
    for it in range(steps):
        j = it % per_pass
        x, y = shard.x[j * BATCH : (j + 1) * BATCH], shard.y[j * BATCH : (j + 1) * BATCH]
        opt.zero_grad()
        loss = wl.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return Trained(model, losses, state)
