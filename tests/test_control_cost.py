"""What a lossless round costs in control messages, counted on real sockets (small models).

A small model's round is a few datagrams each way; its time is the control
round trips and the wakeups they cause. A lossless one-pass round needs,
per worker: ROUND(up), the data, PROBE, STOP(up); ROUND(down), the mean,
PROBE, STOP(down) - and no second STOP answering a PROBE that crossed the
first (core rule R5: the control channel is reliable and ordered). These
tests count them on 127.0.0.1 (server in a thread, workers in threads).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dblp.protocol.core import ORDER_BLOCK, index_order, send_order
from dblp.protocol.policy import FixedPolicy
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.worker import Worker

ELEMENTS = 10_762  # the DDP target's small model: 30 chunks at MTU 1500
ROUNDS = 12
WORKERS = 3


def _run(elements: int, rounds: int, workers: int, p: float = 0.0, pause: float = 0.0,
         counts: dict | None = None, local: bool = False) -> tuple[ParameterServer, list[Worker], list]:
    """``pause``: seconds each worker waits between its rounds (a training step's compute);
    ``counts`` gets the server's control writes and each worker's control reads and writes (login
    included); ``local``: the workers' data through host-local slots (dblp.transport.hostlocal), not UDP."""
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=workers, policy=FixedPolicy(p),
                                       rounds=rounds, peer_timeout=30))
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("rounds", srv.serve()), daemon=True)
    th.start()
    ws = [Worker("127.0.0.1", srv.port, elements=elements, worker_id=i, local=local) for i in range(workers)]
    outs: list[list[np.ndarray]] = [[] for _ in range(workers)]
    grads = [[np.full(elements, float(i + r), np.float32) for r in range(rounds)] for i in range(workers)]
    errors: list[BaseException] = []

    server_peers: list = []

    def work(i: int) -> None:
        try:
            ws[i].connect()
            if i == 0:  # the server's peers, while it has them (it lets its list go when it closes)
                server_peers.extend(w.peer for w in srv.workers)
            for r in range(rounds):
                outs[i].append(np.array(ws[i].allreduce(grads[i][r]), copy=True))
                if pause:
                    time.sleep(pause)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    sent_by_workers = [dict(w.peer.control_sent) for w in ws]
    reads = [w.peer.control_reads for w in ws]  # (before their close reads the server's goodbye)
    writes = [w.peer.control_writes for w in ws]
    for w in ws:
        w.close()
    th.join(30)
    # read once the server is done: its last PROBE may still be leaving when the workers finish
    assert len(server_peers) == workers
    sent_by_server = [dict(p.control_sent) for p in server_peers]
    if counts is not None:  # (the server's BYE at its close, if it came before the workers', not counted)
        counts["server_writes"] = [p.control_writes - p.control_sent.get("Bye", 0) for p in server_peers]
        counts["worker_reads"] = reads
        counts["worker_writes"] = writes
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
    from dblp.transport import server as server_mod

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


def test_lossless_small_round_costs_three_server_writes_and_two_worker_wakeups():
    """Core rule R13 (coalesced control), a 10,762-element round (30 chunks, under the pacer's
    32-datagram sample) with a 5 ms step between rounds as in training: per worker and round the
    server writes [STOP(up) + ROUND(down)] just before the datagrams, PROBE(down), and ROUND(up) of
    the next round - three writes carrying the same four messages (four writes before R13) - and a
    worker's event loop reads control about twice a round: the first write with the broadcast, the
    other two at the start of its next round (STOP(up), ROUND(down) and the datagrams each woke it
    before). Measured at load 7 on the 2-core machine: 37-41 writes and 27-31 reads per worker in
    12 rounds; the code before R13: 49 writes and 42-47 reads."""
    counts: dict = {}
    _, by_workers, by_server = _run(ELEMENTS, ROUNDS, WORKERS, pause=0.005, counts=counts)
    for sent in by_server:  # the same messages as without R13
        assert sent.get("Probe") == ROUNDS and sent.get("Stop") == ROUNDS and sent.get("RoundStart") == 2 * ROUNDS
    # META, ROUND(0, up), then 3 a round, less the ROUND(up) after the last one: 3 x 12 + 1 = 37
    # (a worker that starts a round before the server saw the others' STOP(down) gets its STOP(up)
    # alone: +1 each time, under load; 4 x 12 + 1 = 49 without R13)
    for w in counts["server_writes"]:
        assert 3 * ROUNDS + 1 <= w <= 3 * ROUNDS + 6, counts
    # the login's CHALLENGE and META, then about 2 a round (42 or more without R13)
    for r in counts["worker_reads"]:
        assert r <= 3 * ROUNDS, counts


def test_held_stop_of_a_small_lossy_round_still_comes():
    """R13 holds a small pass's STOP(up) until the broadcast, never a BITMAP: with a third of the
    first transmissions lost both ways (tests/scripted_loss.py), 20-chunk rounds complete with
    retransmission passes and the exact mean."""
    from dblp.transport.server import ServerConfig
    from procs import free_port
    from scripted_loss import run_on_loopback

    elements = 20 * 362 - 100  # 20 chunks on the --insecure wire (362 floats), the last one short
    cfg = ServerConfig(host="127.0.0.1", port=free_port(), workers=WORKERS, policy=FixedPolicy(0.0), rounds=4,
                       accept_timeout=30, peer_timeout=30, insecure=True)
    outs, records, _ = run_on_loopback(cfg, elements, 4, lambda i, k: np.full(elements, float(i + k), np.float32))
    for i in range(WORKERS):
        for k in range(4):
            assert np.array_equal(outs[i][k], np.full(elements, k + (WORKERS - 1) / 2, np.float32))
    assert all(r.up_passes >= 2 and r.up_received == 20 for r in records), [(r.up_passes, r.up_received)
                                                                          for r in records]


def test_lossless_small_round_over_host_local_slots_costs_two_writes_each_way():
    """Workers on the server's host (dblp.transport.hostlocal: a pass is a copy into shared memory and a LOCAL
    message, as DBLPComm's ranks on rank 0's host do): with R13 a round is two control writes each
    way per worker - the worker's [LOCAL + PROBE(up)] and STOP(down), the server's [STOP(up) +
    ROUND(down) + LOCAL + PROBE(down)] and the next ROUND(up) - so the broadcast wakes a worker
    once. Measured: 25 server writes, 26 worker writes (with HELLO and AUTH) in 12 rounds."""
    counts: dict = {}
    _, by_workers, by_server = _run(ELEMENTS, ROUNDS, WORKERS, pause=0.005, counts=counts, local=True)
    for sent in by_workers:
        assert sent.get("Local") == ROUNDS and sent.get("Probe") == ROUNDS and sent.get("Stop") == ROUNDS, sent
    for sent in by_server:
        assert sent.get("Local") == ROUNDS and sent.get("RoundStart") == 2 * ROUNDS, sent
    # META, ROUND(0, up), then 2 a round, less the ROUND(up) after the last one: 2 x 12 + 1 = 25
    for w in counts["server_writes"]:
        assert 2 * ROUNDS + 1 <= w <= 2 * ROUNDS + 6, counts
    # HELLO, AUTH, then exactly 2 a round: 26
    assert counts["worker_writes"] == [2 * ROUNDS + 2] * WORKERS, counts
