"""DDP with its gradient buckets carried by the real DBLP transport.

Two DDP ranks (a gloo process group for DDP's own bookkeeping) register
``exchange_hook`` with a :class:`dblp.transport.worker.Worker`; a real DBLP server
(``python -m dblp server``) averages. With the reliable policy the mean is
(g0 + g1) * 0.5 - exactly DDP's (g0 + g1) / 2 - so the losses must equal
plain DDP's bit for bit; with a 30% tolerance the loss must still fall.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
STEPS = 80


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(rank: int, world: int, dblp_port: int | None) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dblp.train.ddp import ExchangeHookState, exchange_hook
    from dblp.train.exchange import AllreduceExchange
    from dblp.train.models import get_workload
    from dblp.transport.worker import Worker

    wl = get_workload("small_cnn", seed=0)
    shard = wl.train_set.shard(rank, world)
    model = DDP(wl.model, bucket_cap_mb=0.05)
    worker = None
    if dblp_port is not None:
        n = sum(p.numel() for p in wl.model.parameters())
        worker = Worker("127.0.0.1", dblp_port, elements=n, worker_id=rank).connect()
        model.register_comm_hook(ExchangeHookState(AllreduceExchange(worker)), exchange_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for it in range(STEPS):
        j = it % (len(shard) // 16)
        x, y = shard.x[j * 16 : (j + 1) * 16], shard.y[j * 16 : (j + 1) * 16]
        opt.zero_grad()
        loss = wl.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if worker is not None:
        worker.close()
    return losses


def _rank(rank: int, world: int, pg_port: int, dblp_ports: dict, out: dict) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(pg_port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out[("plain", rank)] = _train(rank, world, None)
        for name, port in dblp_ports.items():
            out[(name, rank)] = _train(rank, world, port)
    finally:
        dist.destroy_process_group()


def _server(port: int, *policy: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "2", "--iterations", str(STEPS), *policy],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(300)
def test_ddp_over_dblp_matches_plain_ddp_and_learns_under_loss():
    ports = {"reliable": _free_port(), "lossy": _free_port()}
    servers = [_server(ports["reliable"], "--policy", "reliable"),
               _server(ports["lossy"], "--policy", "fixed", "--p", "0.3")]
    try:
        with mp.Manager() as mgr:
            shared = mgr.dict()
            mp.spawn(_rank, args=(2, _free_port(), ports, shared), nprocs=2, join=True)
            out = dict(shared)
        for s in servers:
            s.wait(timeout=30)
            assert s.returncode == 0, s.stderr.read()
    finally:
        for s in servers:
            s.kill()
    for rank in (0, 1):
        assert out[("reliable", rank)] == out[("plain", rank)]  # bit for bit
    # under a 30% tolerance the loss falls at least half as far as plain DDP's
    plain, lossy = out[("plain", 0)], out[("lossy", 0)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    drop_plain = mean(plain[:10]) - mean(plain[-10:])
    drop_lossy = mean(lossy[:10]) - mean(lossy[-10:])
    assert drop_plain > 0.5 and drop_lossy > 0.5 * drop_plain, (plain, lossy)
