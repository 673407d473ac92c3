"""The training loop over the real DBLP transport on loopback (server + 2 workers, threads)."""

import threading

import pytest
import torch

from dblp.protocol.policy import DblpPolicy, ReliablePolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.train import AllreduceExchange, TrainConfig, get_workload, train
from dblp.transport.worker import Worker


def _run(policy, iters: int = 12) -> tuple[list, dict]:
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=2, policy=policy, peer_timeout=30))
    served: dict = {}

    def serve():
        try:
            served["rounds"] = srv.serve()
        except Exception as exc:  # noqa: BLE001 - reported below
            served["error"] = exc

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    results: list = [None, None]
    errors: list = []

    def worker(rank: int) -> None:
        try:
            wl = get_workload("small_cnn", seed=0)  # same seed: identical initial replicas
            n = sum(p.numel() for p in wl.model.parameters())
            with Worker("127.0.0.1", srv.port, elements=n, worker_id=rank, peer_timeout=30) as w:
                cfg = TrainConfig.for_workload(
                    wl, epochs=1, rank=rank, world_size=2, max_iters_per_epoch=iters, device="cpu"
                )
                s = train(wl, AllreduceExchange(w), cfg)
            results[rank] = (s, torch.cat([p.detach().reshape(-1) for p in wl.model.parameters()]))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    th.join(timeout=30)
    assert not errors, errors
    assert "error" not in served, served
    return results, served


@pytest.mark.timeout(180)
def test_reliable_dblp_exchange_keeps_replicas_identical():
    results, served = _run(ReliablePolicy())
    (s0, p0), (s1, p1) = results
    assert s0.iterations == s1.iterations == 12
    assert torch.equal(p0, p1)  # every chunk delivered: the same averaged gradient on both
    rec = s0.iteration_records[-1]
    assert rec["tolerance_up"] == 0.0 and rec["round"] == 11 and rec["down_received"] == rec["chunks"]


@pytest.mark.timeout(180)
def test_dblp_policy_records_reach_the_training_log():
    results, _ = _run(DblpPolicy(p_low=0.008, p_high=0.408, freq=5))
    s0, _ = results[0]
    recs = s0.iteration_records
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)
    assert recs[0]["tolerance_up"] == 0.008 and recs[0]["clr"] is True  # training starts critical
    assert {"round_latency_s", "up_latency_s", "exchange_latency_s"} <= set(recs[0])
    assert 0.008 <= s0.epoch_records[-1]["tolerance_mean"] <= 0.408
