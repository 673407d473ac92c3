"""DDP with exchange_hook trains exactly like plain DDP (2 gloo processes on CPU).

The hook gathers DDP's buckets (tiny ones here, several per iteration) into
one flat exchange per iteration; with a reliable torch.distributed exchange
the sums are the same as DDP's own all-reduce, so losses and parameters must
match plain DDP bit for bit.
"""

import pytest
import torch
import torch.multiprocessing as mp
from ddp_ranks import gloo_group, train_small_cnn
from procs import free_port


def _train(rank: int, world: int, use_hook: bool) -> dict:
    from dblp.train.exchange import TorchDistExchange

    run = train_small_cnn(rank, world, 80, bucket_cap_mb=0.05 if use_hook else 25.0,
                          exchange=(lambda model: TorchDistExchange()) if use_hook else None)
    return {
        "losses": run.losses,
        "params": torch.cat([p.detach().reshape(-1) for p in run.model.parameters()]),
        "buckets": [r["buckets"] for r in run.state.records] if run.state else [],
    }


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    with gloo_group(rank, world, port):
        out[("plain", rank)] = _train(rank, world, False)
        out[("hook", rank)] = _train(rank, world, True)


@pytest.mark.timeout(240)
def test_ddp_exchange_hook_matches_plain_ddp():
    with mp.Manager() as mgr:
        shared = mgr.dict()
        mp.spawn(_worker, args=(2, free_port(), shared), nprocs=2, join=True)
        out = dict(shared)
    for rank in (0, 1):
        p, h = out[("plain", rank)], out[("hook", rank)]
        assert h["losses"] == p["losses"]
        assert torch.equal(h["params"], p["params"])
        assert max(h["buckets"]) > 1  # several buckets gathered into one exchange
    assert torch.equal(out[("hook", 0)]["params"], out[("hook", 1)]["params"])  # replicas agree
    losses = out[("hook", 0)]["losses"]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10, losses
