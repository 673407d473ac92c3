"""A deterministic loss for transport tests: the same datagrams are lost whatever the timing."""

from __future__ import annotations

import zlib

import numpy as np


class ScriptedLoss:
    """Drops a fixed 35% of first transmissions and 50% of second ones; later ones arrive.

    The verdict is a hash of (direction, worker, round, chunk, attempt), so
    both drivers lose exactly the same datagrams whatever their timing.
    """

    def __init__(self) -> None:
        self.attempts: dict[tuple[int, int, int, int], int] = {}

    def drops(self, direction: int, worker: int, rnd: int, seqs: np.ndarray) -> np.ndarray:
        out = np.zeros(seqs.size, bool)
        for i, s in enumerate(seqs.tolist()):
            key = (direction, worker, rnd, s)
            a = self.attempts[key] = self.attempts.get(key, 0) + 1
            h = zlib.crc32(repr((*key, a)).encode()) % 100
            out[i] = (a == 1 and h < 35) or (a == 2 and h < 50)
        return out


def lossy(udp, loss: ScriptedLoss, direction: int, worker: int, peer) -> None:
    """Make ``udp.send_chunks`` lose what the script says (the datagram never reaches the receiver)."""
    send = udp.send_chunks

    def send_chunks(headers, values, seqs, lengths, layout, addr):
        keep = ~loss.drops(direction, worker, peer.sender.round_no, seqs)
        if keep.any():
            send(headers[keep], values, seqs[keep], lengths[keep], layout, addr)

    udp.send_chunks = send_chunks


def run_on_loopback(cfg, elements: int, rounds: int, grad, *, up_loss: bool = True, fast: bool | None = None):
    """A real server (``cfg``, a :class:`dblp.transport.server.ServerConfig`) and ``cfg.workers`` real workers in
    threads on 127.0.0.1, the script losing both directions (upstream too unless ``up_loss`` is False).
    ``grad(i, k)``: worker i's gradient of round k. Returns (results per worker and round, worker
    records, server records)."""
    import threading

    from dblp.protocol import control as ctl
    from dblp.transport.server import ParameterServer
    from dblp.transport.worker import Worker

    loss = ScriptedLoss()
    srv = ParameterServer(cfg)
    server_records: list = []
    srv._writer.write = server_records.append  # keep the server's records in memory
    outs: list[list[np.ndarray]] = [[] for _ in range(cfg.workers)]
    records: list = []
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            srv.accept_workers()
            for w in srv.workers:
                lossy(w.peer.udp, loss, ctl.DOWN, w.wid, w.peer)
            srv.serve()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def work(i: int) -> None:
        try:
            with Worker(cfg.host, srv.port, elements=elements, worker_id=i, fast=fast, peer_timeout=30,
                        secret=srv.secret, insecure=cfg.insecure) as w:
                if up_loss:
                    lossy(w.peer.udp, loss, ctl.UP, i, w.peer)
                for k in range(rounds):
                    outs[i].append(np.array(w.allreduce(grad(i, k)), copy=True))
                    records.append(w.last_record)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=serve)] + [threading.Thread(target=work, args=(i,)) for i in range(cfg.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return outs, records, server_records
