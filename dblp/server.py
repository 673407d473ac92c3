"""The DBLP parameter server (paper Algorithm 3) over sockets.

The round logic is :class:`dblp.session.ServerSession`'s; this module accepts
the workers and moves the session's messages and datagrams. Per step: receive every worker's gradient with DBLP_RECV under the round's
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
from .core import DEFAULT_ORDER
from .policy import Policy, ReliablePolicy
from .records import RecordWriter
from .reduce import MODES, reduce_mean_norm
from .session import ControlToSend, RecordContext, RecordWritten, SenderStarted, ServerSession
from .transport import DEFAULT_PEER_TIMEOUT_S, Peer, PeerError, pump
from .udp import DataSocket
from .wire import ChunkLayout, ParameterError

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


class ParameterServer:
    """The socket driver of :class:`~dblp.session.ServerSession`: accepts the workers, then
    moves the session's datagrams and control messages over their sockets."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.run_id = secrets.randbits(32)
        self.listener = socket.create_server((cfg.host, cfg.port), reuse_port=False)
        self.listener.settimeout(cfg.accept_timeout)
        self.port = self.listener.getsockname()[1]
        self.layout: ChunkLayout | None = None
        self.workers: list[_WorkerState] = []
        self.session: ServerSession | None = None
        self.mean: np.ndarray | None = None
        self._writer = RecordWriter(cfg.records)

    @property
    def round(self) -> int:
        return self.session.round if self.session is not None else 0

    @property
    def norms(self) -> list[float]:
        return self.session.norms if self.session is not None else []

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
        peers: dict[int, Peer] = {}
        for (conn, hello), wid in zip(pending, ids):
            conn.settimeout(self.cfg.peer_timeout)
            udp = DataSocket(conn.getsockname()[0], 0, fast=self.cfg.fast)
            peer = Peer(f"worker {wid}", conn, udp, on_message=self._on_message)
            peer.udp_addr = (conn.getpeername()[0], hello.udp_port)
            peers[wid] = peer
            self.workers.append(_WorkerState(wid, peer))
        self.session = ServerSession(
            self.layout, peers, policy=self.cfg.policy, run_id=self.run_id, order=self.cfg.order,
            seed=self.cfg.seed, rounds=self.cfg.rounds, peer_addrs={w: p.udp_addr for w, p in peers.items()},
            context=RecordContext(source=self.cfg.source, policy=self.cfg.policy.name, order=self.cfg.order,
                                  send_rate_bps=self.cfg.send_rate_bps,
                                  clock_offset=time.time() - time.monotonic()),
        )
        for w in self.workers:
            w.peer.receiver = self.session.receiver(w.wid)
            w.peer.send_control(
                ctl.Meta(
                    {
                        "run_id": self.run_id,
                        "worker": w.wid,
                        "workers": self.cfg.workers,
                        "elements": elements,
                        "mtu": self.cfg.mtu,
                        "chunk_floats": self.layout.chunk_floats,
                        "chunks": self.layout.chunks,
                        "server_udp_port": w.peer.udp.port,
                        "names": spec.get("names", []),
                        "shapes": spec.get("shapes", []),
                        "order": self.cfg.order,
                        "seed": self.cfg.seed,
                        "policy": self.cfg.policy.name,
                        "gso": w.peer.udp.gso,
                    }
                )
            )
        self.mean = np.zeros(elements, np.float32)
        log.info("%d workers connected; %d elements in %d chunks of %d floats",
                 len(self.workers), elements, self.layout.chunks, self.layout.chunk_floats)

    def _on_message(self, peer: Peer, msg: ctl.Message) -> None:
        if isinstance(msg, ctl.Bye):
            log.info("%s left: %s", peer.name, msg.reason)

    # -- the session's events ------------------------------------------------------
    def _peer(self, wid: int) -> Peer | None:
        return next((w.peer for w in self.workers if w.wid == wid), None)

    def _dispatch(self) -> None:
        """Carry out what the session asks for: control messages, senders, records."""
        assert self.session is not None
        while (ev := self.session.next_event()) is not None:
            if isinstance(ev, ControlToSend):
                peer = self._peer(ev.worker)
                if peer is None or peer.closed:
                    continue
                try:
                    peer.send_control(ev.message)
                except PeerError:
                    peer.closed = True  # judged at the next round: orderly only if its BYE arrived
            elif isinstance(ev, SenderStarted):
                peer = self._peer(ev.worker)
                if peer is not None:
                    peer.sender = ev.sender
            elif isinstance(ev, RecordWritten):
                self._writer.write(ev.record)

    def _remove(self, w: _WorkerState) -> None:
        assert self.session is not None
        self.workers.remove(w)
        self.session.remove(w.wid, time.monotonic())
        _close_peer(w.peer)

    def _drop_worker(self, exc: PeerError) -> None:
        w = next((w for w in self.workers if w.peer is exc.peer), None)
        if self.cfg.on_worker_loss == "exit" or w is None:
            raise ServerError(f"round {self.round}: {exc}") from exc
        log.error("round %d: %s; continuing with the remaining workers", self.round, exc)
        self._remove(w)
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
        s = self.session
        assert self.layout is not None and self.mean is not None and s is not None
        # 1. DBLP_RECV from every worker (their receivers were opened at the end of the last round).
        while True:
            self._pump(lambda: s.wants_poll() or any(w.peer.closed for w in self.workers))
            gone = [w for w in self.workers if w.peer.closed]
            if not gone:
                break
            for w in gone:
                if w.peer.bye is None or w.peer.receiver.received:  # died, or left mid-round
                    why = "left in the middle of" if w.peer.bye is not None else "connection lost before"
                    self._drop_worker(PeerError(f"{w.peer.name}: {why} round {self.round}", w.peer))
                else:
                    self._remove(w)
            if not self.workers:
                return False
        s.poll(time.monotonic())
        if len(self.workers) < self.cfg.workers:
            log.warning("round %d: reducing over %d of %d workers", self.round, len(self.workers), self.cfg.workers)
        # 2. Reduce by mean; 3.-4. the session feeds the policy and starts the broadcast.
        live = s.live
        norm = reduce_mean_norm([s.buffer(w) for w in live], [s.receiver(w).mask for w in live],
                                self.layout, self.mean, self.cfg.reduce)
        s.broadcast(norm, time.monotonic(), self.mean, extra={"reduce": self.cfg.reduce})
        self._dispatch()
        finished = s.round
        while s.round == finished:
            self._pump(lambda: s.wants_poll() or any(w.peer.closed and not s.broadcast_done(w.wid)
                                                     for w in self.workers))
            s.poll(time.monotonic())
            self._dispatch()
            for w in [w for w in self.workers if w.peer.closed and not s.broadcast_done(w.wid)]:
                self._drop_worker(PeerError(f"{w.peer.name}: left in the middle of round {finished}", w.peer))
        return True

    def serve(self) -> int:
        """Accept the workers and serve rounds until they leave; returns rounds served."""
        if not self.workers:
            self.accept_workers()
        assert self.session is not None
        self.session.start(time.monotonic())
        self._dispatch()
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
