"""DDP with exchange_hook trains exactly like plain DDP (2 gloo processes on CPU).

The hook gathers DDP's buckets (tiny ones here, several per iteration) into
one flat exchange per iteration; with a reliable torch.distributed exchange
the sums are the same as DDP's own all-reduce, so losses and parameters must
match plain DDP bit for bit.
"""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(rank: int, world: int, use_hook: bool) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dblp.train.ddp import ExchangeHookState, exchange_hook
    from dblp.train.exchange import TorchDistExchange
    from dblp.train.models import get_workload

    wl = get_workload("small_cnn", seed=0)
    shard = wl.train_set.shard(rank, world)
    model = DDP(wl.model, bucket_cap_mb=0.05 if use_hook else 25.0)
    state = None
    if use_hook:
        state = ExchangeHookState(TorchDistExchange())
        model.register_comm_hook(state, exchange_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    per_pass = len(shard) // 16
    for it in range(80):
        j = it % per_pass
        x, y = shard.x[j * 16 : (j + 1) * 16], shard.y[j * 16 : (j + 1) * 16]
        opt.zero_grad()
        loss = wl.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "buckets": [r["buckets"] for r in state.records] if state else [],
    }


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out[("plain", rank)] = _train(rank, world, False)
        out[("hook", rank)] = _train(rank, world, True)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_ddp_exchange_hook_matches_plain_ddp():
    with mp.Manager() as mgr:
        shared = mgr.dict()
        mp.spawn(_worker, args=(2, _free_port(), shared), nprocs=2, join=True)
        out = dict(shared)
    for rank in (0, 1):
        p, h = out[("plain", rank)], out[("hook", rank)]
        assert h["losses"] == p["losses"]
        assert torch.equal(h["params"], p["params"])
        assert max(h["buckets"]) > 1  # several buckets gathered into one exchange
    assert torch.equal(out[("hook", 0)]["params"], out[("hook", 1)]["params"])  # replicas agree
    losses = out[("hook", 0)]["losses"]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10, losses
