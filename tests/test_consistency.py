"""Replica consistency (dblp.protocol.session S7): with ``intersect`` every worker applies the same chunks.

Real server and workers on loopback, with the deterministic scripted loss
of the parity test, so each worker's bounded-loss broadcast loses its own
chunks. Without the mode the workers' results differ (the paper's
behaviour: replicas drift); with it they are bit-identical every round,
and each is exactly the server's mean where the common mask holds and zero
elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.policy import FixedPolicy
from dblp.transport.server import ServerConfig
from procs import free_port
from scripted_loss import run_on_loopback

from dblp.protocol.wire import ChunkLayout

ELEMENTS = 362 * 120 + 17  # a short last chunk
WORKERS = 3
ROUNDS = 4


def run(consistency: str) -> tuple[list[list[np.ndarray]], list, list]:
    cfg = ServerConfig(host="127.0.0.1", port=free_port(), workers=WORKERS, policy=FixedPolicy(0.2), rounds=ROUNDS,
                       consistency=consistency, accept_timeout=30, peer_timeout=30)
    grads = {i: np.random.default_rng(i).integers(-50, 50, (ROUNDS, ELEMENTS)).astype(np.float32)
             for i in range(WORKERS)}
    return run_on_loopback(cfg, ELEMENTS, ROUNDS, lambda i, k: grads[i][k], up_loss=False)


def test_without_consistency_the_replicas_differ():
    outs, records, _ = run("none")
    assert any(not np.array_equal(outs[0][k], outs[i][k]) for k in range(ROUNDS) for i in range(1, WORKERS))
    assert all("common" not in r.extra for r in records)


def test_intersect_makes_every_worker_apply_the_same_chunks():
    outs, records, _ = run("intersect")
    chunks = records[0].chunks
    cf = ChunkLayout(ELEMENTS, key=bytes(16)).chunk_floats  # the authenticated wire's chunk (358 floats)
    assert chunks == ChunkLayout(ELEMENTS, key=bytes(16)).chunks
    pad = np.zeros(chunks * cf, np.float32)
    for k in range(ROUNDS):
        for i in range(1, WORKERS):
            assert np.array_equal(outs[0][k], outs[i][k]), f"round {k}: worker {i} differs from worker 0"
        common = {r.extra["common"] for r in records if r.round == k}
        assert len(common) == 1  # every worker applied the same number of chunks
        (n_common,) = common
        assert n_common <= min(r.down_received for r in records if r.round == k) and n_common < chunks
        pad[: ELEMENTS] = outs[0][k]
        carrying = int(np.count_nonzero(pad.reshape(chunks, cf).any(axis=1)))
        # only common chunks carry values (a common chunk is zero where no upload of it reached the server)
        assert n_common - 5 <= carrying <= n_common
    assert all(r.extra["wait_common_s"] >= 0 for r in records)


def test_server_ignores_held_messages_outside_the_mode_and_for_other_rounds():
    from dblp.protocol.session import RecordContext, ServerSession
    from dblp.protocol.wire import ChunkLayout

    lay = ChunkLayout(362 * 8)
    ctx = RecordContext(source="test", policy="fixed", order="blocks")
    s = ServerSession(lay, range(2), policy=FixedPolicy(0.0), run_id=1, context=ctx, consistency="intersect")
    s.start(0.0)
    s.events()
    bits = np.packbits(np.ones(lay.chunks, bool)).tobytes()
    s.handle_control(0, ctl.Held(5, bits), 0.0)  # a round not in flight
    s.handle_control(7, ctl.Held(0, bits), 0.0)  # not a worker of this run
    s.handle_control(0, ctl.Held(0, bits), 0.0)
    assert s.events() == []  # worker 1 has not reported: nothing announced
    half = np.zeros(lay.chunks, bool)
    half[::2] = True
    s.handle_control(1, ctl.Held(0, np.packbits(half).tobytes()), 0.0)
    ev = s.events()
    assert len(ev) == 2 and all(isinstance(e.message, ctl.Common) for e in ev)
    assert np.array_equal(ev[0].message.mask(lay.chunks), half) and s.common[0] == 4
    with pytest.raises(Exception, match="consistency must be one of"):
        ServerSession(lay, range(2), policy=FixedPolicy(0.0), run_id=1, context=ctx, consistency="always")
