"""What a lossless round costs in control messages, counted on real sockets (issue 30, small models).

A small model's round is a few datagrams each way; its time is the control
round trips and the wakeups they cause. A lossless one-pass round needs,
per worker: ROUND(up), the data, PROBE, STOP(up); ROUND(down), the mean,
PROBE, STOP(down) - and no second STOP answering a PROBE that crossed the
first (core rule R5: the control channel is reliable and ordered). These
tests count them on 127.0.0.1 (server in a thread, workers in threads).
"""

from __future__ import annotations

import threading

import numpy as np

from dblp.core import ORDER_BLOCK, index_order, send_order
from dblp.policy import FixedPolicy
from dblp.server import ParameterServer, ServerConfig
from dblp.worker import Worker

ELEMENTS = 10_762  # the model: 30 chunks at MTU 1500
ROUNDS = 12
WORKERS = 3


def _run(elements: int, rounds: int, workers: int, p: float = 0.0) -> tuple[ParameterServer, list[Worker], list]:
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=workers, policy=FixedPolicy(p),
                                       rounds=rounds, peer_timeout=30))
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("rounds", srv.serve()), daemon=True)
    th.start()
    ws = [Worker("127.0.0.1", srv.port, elements=elements, worker_id=i) for i in range(workers)]
    outs: list[list[np.ndarray]] = [[] for _ in range(workers)]
    grads = [[np.full(elements, float(i + r), np.float32) for r in range(rounds)] for i in range(workers)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            ws[i].connect()
            for r in range(rounds):
                outs[i].append(np.array(ws[i].allreduce(grads[i][r]), copy=True))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    sent_by_workers = [dict(w.peer.control_sent) for w in ws]
    server_peers = [w.peer for w in srv.workers]  # (the server lets its list go when it closes)
    for w in ws:
        w.close()
    th.join(30)
    # read once the server is done: its last PROBE may still be leaving when the workers finish
    sent_by_server = [dict(p.control_sent) for p in server_peers]
    assert not errors, errors
    assert result.get("rounds") == rounds
    for i in range(workers):  # the exchange is right: the exact mean every round
        for r in range(rounds):
            assert np.array_equal(outs[i][r], np.full(elements, r + (workers - 1) / 2, np.float32))
    return srv, sent_by_workers, sent_by_server


def test_lossless_round_costs_four_control_messages_each_way_per_worker():
    """Per worker and lossless round: the worker sends PROBE(up) and STOP(down); the server
    ROUND(up), STOP(up), ROUND(down) and PROBE(down) - no BITMAP, no repeated STOP."""
    _, by_workers, by_server = _run(ELEMENTS, ROUNDS, WORKERS)
    for sent in by_workers:
        # (the HELLO/AUTH of the login went before the counting peer existed or is one message)
        assert sent.get("Probe") == ROUNDS and sent.get("Stop") == ROUNDS, sent
        assert "Bitmap" not in sent, sent
    for sent in by_server:
        assert sent.get("Probe") == ROUNDS and sent.get("Stop") == ROUNDS, sent
        # ROUND(up) of every round and ROUND(down) of every round
        assert sent.get("RoundStart") == 2 * ROUNDS, sent
        assert "Bitmap" not in sent, sent


def test_small_tensor_uses_one_server_loop_and_one_block_order():
    """A 30-chunk tensor: the blocks order is index order (one block: no seeded generator a
    round), and the server keeps one event loop (no thread started per pump call)."""
    from dblp import server as server_mod

    chunks = -(-ELEMENTS // 362)
    assert chunks == 30 and chunks <= ORDER_BLOCK
    assert send_order(chunks, "blocks", 7, 3, 2) is index_order(chunks)
    assert chunks * WORKERS < server_mod.PARALLEL_MIN_DATAGRAMS
    before = threading.active_count()
    seen: list[int] = []
    orig = server_mod.pump_parallel

    def spy(*a, **kw):  # pragma: no cover - must not run for this size
        seen.append(1)
        return orig(*a, **kw)

    server_mod.pump_parallel = spy
    try:
        _run(ELEMENTS, 3, WORKERS)
    finally:
        server_mod.pump_parallel = orig
    assert seen == [] and threading.active_count() <= before + 1
