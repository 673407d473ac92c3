"""The DBLP parameter server (paper Algorithm 3).

Per step: receive every worker's gradient with DBLP_RECV under the round's
tolerance, reduce by mean, feed the mean's L2 norm to the tolerance policy
(CLR detection), and broadcast the mean with DBLP_SEND under the new
tolerance. One thread serves all workers through :func:`dblp.transport.pump`
(the paper's thread per worker is a GIL-bound detail; the selector loop
gives the same concurrency without it).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from dataclasses import dataclass, field

import numpy as np

from . import control as ctl
from .core import DEFAULT_ORDER, DOWN_STREAM, EncodedRound, Receiver, RoundSender, send_order
from .pacing import TokenBucket
from .policy import Policy, ReliablePolicy
from .records import RecordWriter, RoundRecord
from .reduce import MODES, reduce_mean_norm
from .transport import DEFAULT_PEER_TIMEOUT_S, Peer, PeerError, pump
from .udp import DataSocket
from .wire import SERVER_ID, ChunkLayout, ParameterError

log = logging.getLogger("dblp.server")


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 29500
    workers: int = 3
    policy: Policy = field(default_factory=ReliablePolicy)
    mtu: int = 1500
    order: str = DEFAULT_ORDER
    seed: int = 0
    reduce: str = "zero"
    send_rate_bps: float = 0.0
    rounds: int | None = None  # stop after this many rounds (None: until the workers leave)
    peer_timeout: float = DEFAULT_PEER_TIMEOUT_S
    accept_timeout: float = 120.0
    on_worker_loss: str = "exit"  # "exit" | "continue"
    records: str | None = None
    source: str = "loopback"
    fast: bool | None = None  # GSO/GRO: None = when available

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ParameterError(f"workers must be >= 1, got {self.workers}")
        if self.reduce not in MODES:
            raise ParameterError(f"reduce must be one of {MODES}, got {self.reduce!r}")
        if self.on_worker_loss not in ("exit", "continue"):
            raise ParameterError(f"on_worker_loss must be exit or continue, got {self.on_worker_loss!r}")
        if self.peer_timeout <= 0:
            raise ParameterError(f"peer_timeout must be positive, got {self.peer_timeout}")
        ChunkLayout(1, self.mtu)  # validates mtu


class ServerError(RuntimeError):
    pass


@dataclass
class _WorkerState:
    wid: int
    peer: Peer
    buf: np.ndarray
    up_tolerance: float = 0.0
    down_sent_at: float = 0.0


class ParameterServer:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.run_id = secrets.randbits(32)
        self.listener = socket.create_server((cfg.host, cfg.port), reuse_port=False)
        self.listener.settimeout(cfg.accept_timeout)
        self.port = self.listener.getsockname()[1]
        self.layout: ChunkLayout | None = None
        self.workers: list[_WorkerState] = []
        self.round = 0
        self.mean: np.ndarray | None = None
        self.norms: list[float] = []
        self._writer = RecordWriter(cfg.records)
        self._down_headers: np.ndarray | None = None

    # -- setup -------------------------------------------------------------------
    def accept_workers(self) -> None:
        spec: dict | None = None
        pending: list[tuple[socket.socket, ctl.Hello]] = []
        deadline = time.monotonic() + self.cfg.accept_timeout
        while len(pending) < self.cfg.workers:
            try:
                conn, addr = self.listener.accept()
            except socket.timeout:
                raise ServerError(
                    f"only {len(pending)} of {self.cfg.workers} workers connected within {self.cfg.accept_timeout:.0f} s"
                ) from None
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                hello = _read_one(conn, ctl.Hello)
            except (OSError, ctl.ControlError, ServerError) as exc:
                log.warning("connection from %s refused: %s", addr, exc)
                conn.close()
                continue
            if spec is None:
                spec = hello.spec
            elif int(hello.spec.get("elements", -1)) != int(spec.get("elements", -2)):
                conn.sendall(ctl.encode(ctl.Bye(f"tensor spec {hello.spec} differs from the first worker's {spec}")))
                conn.close()
                continue
            pending.append((conn, hello))
        assert spec is not None
        elements = int(spec["elements"])
        self.layout = ChunkLayout(elements, self.cfg.mtu)
        ids = _assign_ids([h.worker for _, h in pending], self.cfg.workers)
        for (conn, hello), wid in zip(pending, ids):
            conn.settimeout(self.cfg.peer_timeout)
            local_ip = conn.getsockname()[0]
            udp = DataSocket(local_ip, 0, fast=self.cfg.fast)
            peer = Peer(f"worker {wid}", conn, udp, on_message=self._on_message)
            peer.udp_addr = (conn.getpeername()[0], hello.udp_port)
            peer.receiver = Receiver(
                self.layout, run_id=self.run_id, expected_sender=wid, direction=ctl.UP, peer_addr=peer.udp_addr
            )
            self.workers.append(_WorkerState(wid, peer, np.zeros(elements, np.float32)))
            peer.send_control(
                ctl.Meta(
                    {
                        "run_id": self.run_id,
                        "worker": wid,
                        "workers": self.cfg.workers,
                        "elements": elements,
                        "mtu": self.cfg.mtu,
                        "chunk_floats": self.layout.chunk_floats,
                        "chunks": self.layout.chunks,
                        "server_udp_port": udp.port,
                        "names": spec.get("names", []),
                        "shapes": spec.get("shapes", []),
                        "order": self.cfg.order,
                        "seed": self.cfg.seed,
                        "policy": self.cfg.policy.name,
                        "gso": udp.gso,
                    }
                )
            )
        self.mean = np.zeros(elements, np.float32)
        log.info("%d workers connected; %d elements in %d chunks of %d floats",
                 len(self.workers), elements, self.layout.chunks, self.layout.chunk_floats)

    def _on_message(self, peer: Peer, msg: ctl.Message) -> None:
        if isinstance(msg, ctl.Bye):
            log.info("%s left: %s", peer.name, msg.reason)

    # -- rounds ------------------------------------------------------------------
    def _open_upstream(self, w: _WorkerState, round_no: int, now: float) -> None:
        p, clr = self.cfg.policy.tolerance, self.cfg.policy.clr
        w.up_tolerance = p
        assert w.peer.receiver is not None
        w.peer.receiver.begin_round(round_no, w.buf, now, tolerance=p)
        # the worker's R3 order, so its datagrams can be received in place (R10)
        w.peer.receiver.expect_order(send_order(self.layout.chunks, self.cfg.order, self.cfg.seed, round_no, 1 + w.wid))
        if w.peer.closed:
            return
        try:
            w.peer.send_control(ctl.RoundStart(round_no, ctl.UP, p, clr))
        except PeerError:
            w.peer.closed = True  # judged at the next round: orderly only if its BYE arrived

    def _drop_worker(self, exc: PeerError) -> None:
        w = next((w for w in self.workers if w.peer is exc.peer), None)
        if self.cfg.on_worker_loss == "exit" or w is None:
            raise ServerError(f"round {self.round}: {exc}") from exc
        log.error("round %d: %s; continuing with the remaining workers", self.round, exc)
        self.workers.remove(w)
        _close_peer(w.peer)
        if not self.workers:
            raise ServerError(f"round {self.round}: all workers lost") from exc

    def _pump(self, until) -> None:
        while True:
            live = [w.peer for w in self.workers]
            try:
                pump(live, until, timeout=self.cfg.peer_timeout)
            except PeerError as exc:
                self._drop_worker(exc)
                continue
            return

    def serve_round(self) -> bool:
        """One step of Algorithm 3. Returns False once every worker has left."""
        assert self.layout is not None and self.mean is not None
        t0 = time.monotonic()
        # 1. DBLP_RECV from every worker (their receivers were opened at the end of the last round).
        while True:
            self._pump(lambda: all(w.peer.receiver.complete or w.peer.closed for w in self.workers))
            gone = [w for w in self.workers if w.peer.closed]
            if not gone:
                break
            for w in gone:
                if w.peer.bye is None or w.peer.receiver.received:  # died, or left mid-round
                    why = "left in the middle of" if w.peer.bye is not None else "connection lost before"
                    self._drop_worker(PeerError(f"{w.peer.name}: {why} round {self.round}", w.peer))
                else:
                    self.workers.remove(w)
                    _close_peer(w.peer)
            if not self.workers:
                return False
        t_up = time.monotonic()
        for w in self.workers:
            w.peer.receiver.finish_round()
        if len(self.workers) < self.cfg.workers:
            log.warning("round %d: reducing over %d of %d workers", self.round, len(self.workers), self.cfg.workers)
        # 2. Reduce by mean; 3. tolerance policy on the mean's norm.
        norm = reduce_mean_norm([w.buf for w in self.workers], [w.peer.receiver.mask for w in self.workers],
                                self.layout, self.mean, self.cfg.reduce)
        self.norms.append(norm)
        p_down = self.cfg.policy.update(self.round, norm)
        clr = self.cfg.policy.clr
        # 4. DBLP_SEND of the mean to every worker, encoded once.
        now = time.monotonic()
        # Every worker gets the same chunk order, so their first passes are
        # slices of one encoded buffer (reused from round to round).
        order = send_order(self.layout.chunks, self.cfg.order, self.cfg.seed, self.round, DOWN_STREAM)
        enc = EncodedRound(self.mean, self.layout, round_no=self.round, run_id=self.run_id, sender=SERVER_ID,
                           order=order, buffer=self._down_headers)
        self._down_headers = enc.headers
        for w in self.workers:
            w.peer.send_control(ctl.RoundStart(self.round, ctl.DOWN, p_down, clr))
            w.peer.sender = RoundSender(
                enc, direction=ctl.DOWN, now=now, order=self.cfg.order, seed=self.cfg.seed,
                stream=DOWN_STREAM, pacer=TokenBucket(self.cfg.send_rate_bps),
            )
            w.down_sent_at = now
        opened: set[int] = set()
        finished = self.round

        def all_sent() -> bool:
            t = time.monotonic()
            for w in self.workers:
                if w.peer.sender.done and w.wid not in opened:
                    opened.add(w.wid)
                    self._write_record(w, finished, t0, t_up, t, p_down, clr, norm)
                    self._open_upstream(w, finished + 1, t)  # the next round's upstream, at once
            return all(w.peer.sender.done or w.peer.closed for w in self.workers)

        self._pump(all_sent)
        self.round = finished + 1
        return True

    def _write_record(self, w: _WorkerState, rnd: int, t0: float, t_up: float, t_done: float,
                      p_down: float, clr: bool, norm: float) -> None:
        r, s = w.peer.receiver, w.peer.sender
        d = r.stats.drops
        self._writer.write(
            RoundRecord(
                source=self.cfg.source, role="server", worker=w.wid, round=rnd, t_start=time.time() - (time.monotonic() - t0),
                policy=self.cfg.policy.name, tolerance_up=w.up_tolerance, tolerance_down=p_down, clr=clr,
                grad_norm=norm, chunks=self.layout.chunks,
                up_latency_s=r.stats.t_done - r.stats.t_first, down_latency_s=s.stats.t_done - s.stats.t_start,
                round_latency_s=t_done - t0, up_received=r.received, down_sent=s.stats.sent,
                down_passes=s.stats.passes, down_received=s.stats.received, early_stop_down=s.stats.early_stop,
                send_rate_bps=self.cfg.send_rate_bps, order=self.cfg.order,
                stale=d.stale, duplicate=d.duplicate, corrupt=d.corrupt, foreign=d.foreign,
                malformed=d.malformed, out_of_range=d.out_of_range, wrong_length=d.wrong_length,
                extra={"reduce": self.cfg.reduce, "wait_others_s": t_up - t0, "down_wait_reply_s": s.stats.wait_s},
            )
        )

    def serve(self) -> int:
        """Accept the workers and serve rounds until they leave; returns rounds served."""
        if not self.workers:
            self.accept_workers()
        now = time.monotonic()
        for w in self.workers:
            self._open_upstream(w, self.round, now)
        served = 0
        try:
            while self.cfg.rounds is None or served < self.cfg.rounds:
                if not self.serve_round():
                    break
                served += 1
        finally:
            self.close()
        return served

    def close(self) -> None:
        for w in self.workers:
            _close_peer(w.peer, "server shutting down")
        self.workers = []
        self.listener.close()
        self._writer.close()


def _close_peer(peer: Peer, reason: str | None = None) -> None:
    if reason and not peer.closed:
        try:
            peer.tcp.sendall(ctl.encode(ctl.Bye(reason)))
        except OSError:
            pass
    for s in (peer.tcp, peer.udp):
        try:
            s.close()
        except OSError:
            pass


def _assign_ids(requested: list[int], n: int) -> list[int]:
    taken: set[int] = set()
    out: list[int] = []
    for r in requested:
        if 0 <= r < n and r not in taken:
            out.append(r)
            taken.add(r)
        else:
            out.append(-1)
    free = iter(i for i in range(n) if i not in taken)
    return [o if o >= 0 else next(free) for o in out]


def _read_one(conn: socket.socket, kind: type) -> ctl.Message:
    dec = ctl.ControlDecoder()
    while True:
        data = conn.recv(1 << 16)
        if not data:
            raise ServerError("connection closed before its first message")
        msgs = dec.feed(data)
        if msgs:
            if not isinstance(msgs[0], kind):
                raise ServerError(f"expected {kind.__name__}, got {type(msgs[0]).__name__}")
            return msgs[0]
