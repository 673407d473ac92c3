"""DDP with its gradient buckets carried by the real DBLP transport.

Two DDP ranks (a gloo process group for DDP's own bookkeeping) register
``exchange_hook`` with a :class:`dblp.transport.worker.Worker`; a real DBLP server
(``python -m dblp server``) averages. With the reliable policy the mean is
(g0 + g1) * 0.5 - exactly DDP's (g0 + g1) / 2 - so the losses must equal
plain DDP's bit for bit; with a 30% tolerance the loss must still fall.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from ddp_ranks import gloo_group, train_small_cnn
from procs import free_port

ROOT = Path(__file__).resolve().parents[2]
STEPS = 80


def _train(rank: int, world: int, dblp_port: int | None) -> list[float]:
    from dblp.train.exchange import AllreduceExchange
    from dblp.transport.worker import Worker

    workers = []

    def over_dblp(model: torch.nn.Module) -> AllreduceExchange:
        n = sum(p.numel() for p in model.parameters())
        workers.append(Worker("127.0.0.1", dblp_port, elements=n, worker_id=rank).connect())
        return AllreduceExchange(workers[0])

    losses = train_small_cnn(rank, world, STEPS, bucket_cap_mb=0.05,
                             exchange=over_dblp if dblp_port is not None else None).losses
    for w in workers:
        w.close()
    return losses


def _rank(rank: int, world: int, pg_port: int, dblp_ports: dict, out: dict) -> None:
    with gloo_group(rank, world, pg_port):
        out[("plain", rank)] = _train(rank, world, None)
        for name, port in dblp_ports.items():
            out[(name, rank)] = _train(rank, world, port)


def _server(port: int, *policy: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "2", "--iterations", str(STEPS), *policy],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(300)
def test_ddp_over_dblp_matches_plain_ddp_and_learns_under_loss():
    ports = {"reliable": free_port(), "lossy": free_port()}
    servers = [_server(ports["reliable"], "--policy", "reliable"),
               _server(ports["lossy"], "--policy", "fixed", "--p", "0.3")]
    try:
        with mp.Manager() as mgr:
            shared = mgr.dict()
            mp.spawn(_rank, args=(2, free_port(), ports, shared), nprocs=2, join=True)
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
