"""Each of the paper's four models runs one real training step end to end over DBLP.

The gradient of the step goes through a real DBLP server and worker on
loopback (UDP data, TCP control) with a 40% tolerance, as outside the
critical regime.

With ``DBLP_DATA_ROOT`` pointing at CIFAR/WikiText-2 the real data is used;
otherwise random tensors of the right shape (CIFAR 3x32x32, GPT-2 tokens with
a tiny context) stand in - the step itself is the same code path.
"""

import math
import os

import pytest
import torch

import threading

from dblp.protocol.policy import FixedPolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.train import AllreduceExchange, TrainConfig, get_workload, train
from dblp.transport.worker import Worker

HAVE_DATA = bool(os.environ.get("DBLP_DATA_ROOT"))


@pytest.mark.parametrize(
    "name, expect_params",
    [("efficientnet_b0", 4.0e6), ("resnet50", 23.7e6), ("alexnet", 57.4e6), ("gpt2_s", 85e6)],
)
def test_paper_model_one_training_step(name, expect_params):
    kw = {"seq_len": 8} if name == "gpt2_s" else {}
    if not HAVE_DATA:
        kw.update(synthetic=True, synthetic_size=8)
        if name == "gpt2_s":
            kw["vocab_size"] = 512
    wl = get_workload(name, **kw)
    n_params = sum(p.numel() for p in wl.model.parameters())
    assert n_params == pytest.approx(expect_params, rel=0.05)
    before = [p.detach().clone() for p in wl.model.parameters()]
    # batch 4: BatchNorm needs > 1 value per channel at the 1x1 end of the CIFAR nets
    cfg = TrainConfig.for_workload(
        wl, epochs=1, batch_size=4, max_iters_per_epoch=1, device="cpu", eval_batch_size=4, eval_max_batches=1
    )
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=1, policy=FixedPolicy(0.4), rounds=1))
    th = threading.Thread(target=srv.serve, daemon=True)
    th.start()
    with Worker("127.0.0.1", srv.port, elements=n_params, peer_timeout=60) as w:
        s = train(wl, AllreduceExchange(w), cfg)
    th.join(timeout=60)
    rec = s.iteration_records[0]
    assert s.iterations == 1
    assert math.isfinite(rec["loss"]) and math.isfinite(rec["grad_norm"]) and rec["grad_norm"] > 0
    assert rec["tolerance_up"] == 0.4 and rec["chunks"] == -(-n_params // 358)  # the authenticated wire: 358 floats a chunk
    assert 0.6 <= rec["up_frac"] <= 1.0 and 0.6 <= rec["down_frac"] <= 1.0
    changed = sum(not torch.equal(a, b) for a, b in zip(before, wl.model.parameters()))
    assert changed > 0
    assert s.metric in s.final
