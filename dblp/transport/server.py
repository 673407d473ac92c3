"""The DBLP parameter server (paper Algorithm 3) over sockets.

The round logic is :class:`dblp.protocol.session.ServerSession`'s and the workers' login
:class:`dblp.transport.login.ServerLogin`'s (a base class); this module sets up the run from
the logins and moves the session's messages and datagrams. Per step: receive every worker's gradient with DBLP_RECV under the round's
tolerance, reduce by mean, feed the mean's L2 norm to the tolerance policy
(CLR detection), and broadcast the mean with DBLP_SEND under the new
tolerance. One thread serves all workers through :func:`dblp.transport.sockets.pump`
(the paper's thread per worker is a GIL-bound detail; the selector loop
gives the same concurrency without it).
"""

from __future__ import annotations

import logging
import math
import secrets
import socket
import threading
import time
import os
from dataclasses import dataclass, field, replace

import numpy as np

from dblp.protocol import auth
from dblp.protocol import control as ctl
from dblp.protocol.core import DEFAULT_ORDER
from dblp.transport.hostlocal import LocalSlot
from dblp.protocol.pacing import corks_upstream, stops_tell_nothing
from dblp.protocol.policy import Policy, ReliablePolicy
from dblp.protocol.records import RecordWriter, RoundRecord
from dblp.protocol.compensation import PAPER, Compensation
from dblp.protocol.reduce import DEFAULT_MAX_NORM, MODES, guarded_mean_norm
from dblp.transport.shard import NormExchange
from dblp.protocol.session import (CONSISTENCY, ControlToSend, Phase, RecordContext, RecordWritten, RoundEnded, RoundOpening,
                      SenderStarted, ServerSession)
from dblp.transport.watch import RoundHookClient
from dblp.protocol.login import assign_ids
from dblp.transport.login import (_INLINE_HELLO_BYTES, MAX_PENDING, ServerError, ServerLogin,  # noqa: F401
                                  listen)  # (_INLINE_HELLO_BYTES and ServerError re-exported)
from dblp.transport.sockets import (DEFAULT_PEER_TIMEOUT_S, Peer, PeerError, TAMPERED, TamperError,
                        pump, pump_parallel)
from dblp.transport.udp import DataSocket, layout_mtu, resolve_mtu
from dblp.protocol.wire import DEFAULT_MTU, ChunkLayout, ParameterError

log = logging.getLogger("dblp.transport.server")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # loopback unless told an address or interface (dblp.cli.commands --host)
    port: int = ctl.DEFAULT_PORT
    workers: int = 3
    policy: Policy = field(default_factory=ReliablePolicy)
    mtu: int | str = DEFAULT_MTU  # link bytes, or "auto": the link holding `host`'s (resolved here, dblp.transport.udp.auto_mtu)
    order: str = DEFAULT_ORDER
    seed: int = 0
    reduce: str = "zero"  # C1's upload estimate; the same as compensation.upload_estimate (either sets it)
    compensation: Compensation = PAPER  # dblp.protocol.compensation C1-C6 and core R5b: the paper's by default
    send_rate_bps: float | None = None  # broadcast pacing: None = self-pacing (dblp.protocol.pacing), 0 = unlimited
    rounds: int | None = None  # stop after this many rounds (None: until the workers leave)
    peer_timeout: float = DEFAULT_PEER_TIMEOUT_S
    accept_timeout: float = 120.0
    handshake_timeout: float = 10.0  # a connection must say HELLO within this many seconds
    max_grad_norm: float = DEFAULT_MAX_NORM  # the aggregation guard: a contribution's norm above it is left out
    clip_norm: float | None = None  # robust aggregation: contributions scaled down to this norm (None: off)
    max_pending: int = MAX_PENDING  # logins in progress at once; one more lets the oldest go
    max_login_bytes: int = 16 << 20  # bytes buffered over all logins; beyond, the largest is let go
    elements: int | None = None  # the tensor size this server serves (None: the first valid HELLO's)
    max_memory_bytes: int | None = None  # a first HELLO may not need more (None: half the available memory)
    consistency: str = "none"  # "none" (the paper) | "intersect" (dblp.protocol.session S7: identical replicas)
    round_hook: str | None = None  # Unix socket told each round before it opens (dblp.transport.watch.RoundHookServer)
    on_worker_loss: str = "exit"  # "exit" | "continue"
    records: str | None = None
    source: str = "loopback"
    fast: bool | None = None  # GSO/GRO: None = when available
    secret: bytes | None = None  # the run's shared secret (dblp.protocol.auth); None: $DBLP_SECRET, else a new one (.secret)
    insecure: bool = False  # the paper's wire: no handshake proofs, CRC-only datagrams (version 1)
    # The sharded mode (dblp.transport.shard): this server averages shard `shard` of `shards`; its policy takes the
    # whole mean's norm from the shard servers' exchange, whose hub (shard 0) listens on `shard_hub`.
    shard: int = 0
    shards: int = 1
    shard_hub: tuple[str, int] | None = None
    # Event loops over the workers, each a thread with its share of them (transport.pump_parallel):
    # the C receive and send loops release the GIL, so a server can use more than one core.
    # 0: as many as the host's cores allow (loop_threads).
    threads: int = 0
    mtu_source: str = field(default="", init=False)  # where mtu came from, for the log ("auto": which link)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ParameterError(f"workers must be >= 1, got {self.workers}")
        if self.reduce not in MODES:
            raise ParameterError(f"reduce must be one of {MODES}, got {self.reduce!r}")
        if self.consistency not in CONSISTENCY:
            raise ParameterError(f"consistency must be one of {CONSISTENCY}, got {self.consistency!r}")
        if self.reduce != "zero" and self.compensation.upload_estimate == "zero":
            self.compensation = replace(self.compensation, upload_estimate=self.reduce)
        self.reduce = self.compensation.upload_estimate
        self.compensation.check_consistency(self.consistency)
        if self.on_worker_loss not in ("exit", "continue"):
            raise ParameterError(f"on_worker_loss must be exit or continue, got {self.on_worker_loss!r}")
        for name in ("peer_timeout", "accept_timeout", "handshake_timeout"):
            if not getattr(self, name) > 0:
                raise ParameterError(f"{name} must be positive, got {getattr(self, name)}")
        if self.elements is not None and not 0 < self.elements <= ctl.MAX_ELEMENTS:
            raise ParameterError(f"elements must be in [1, {ctl.MAX_ELEMENTS}], got {self.elements}")
        if self.rounds is not None and self.rounds < 1:
            raise ParameterError(f"rounds must be >= 1 (or None: until the workers leave), got {self.rounds}")
        self.mtu, self.mtu_source = resolve_mtu(self.mtu, self.host)  # the bind address is known here
        ChunkLayout(1, self.mtu)  # validates mtu
        if self.secret is not None and len(self.secret) < 16:
            raise ParameterError(f"secret must have at least 16 bytes, got {len(self.secret)}")
        if not self.max_grad_norm > 0 or (self.clip_norm is not None and not self.clip_norm > 0):
            raise ParameterError(f"max_grad_norm and clip_norm must be positive, got {self.max_grad_norm}, "
                                 f"{self.clip_norm}")
        if self.max_pending < 1:
            raise ParameterError(f"max_pending must be >= 1, got {self.max_pending}")
        if self.max_login_bytes < ctl.MAX_HELLO + 5:
            raise ParameterError(f"max_login_bytes must be at least one HELLO ({ctl.MAX_HELLO + 5}), "
                                 f"got {self.max_login_bytes}")
        if not 0 <= self.threads <= 64:
            raise ParameterError(f"threads must be in [0, 64] (0: by the host's cores), got {self.threads}")
        if self.threads == 0:
            self.threads = loop_threads(self.workers)
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ParameterError(f"shard must be in [0, shards) with shards >= 1, got {self.shard} of {self.shards}")
        if self.shards > 1 and self.shard_hub is None:
            raise ParameterError("a shard server needs the shard hub's address (shard_hub)")


def loop_threads(workers: int, cores: int | None = None) -> int:
    """The server's event loops by default: one per worker, up to half the host's cores (at least
    2) - a loop's send and receive run in C without the GIL, so each loop can keep a core busy,
    and the other half is left to the reduce's threads and, on a host that also runs a worker
    (the sharded mode), to that worker's shard threads. 2 cores: 2 loops, 16 cores: up to 8."""
    cores = cores or os.cpu_count() or 2
    return max(1, min(workers, max(2, cores // 2), 64))


#: the fewest datagrams a direction of a round (chunks x workers) for which the server spreads its
#: workers over ``threads`` event loops. Below it one loop serves every worker: a parallel pump starts
#: a thread, a socket pair and a selector per call (3-4 calls a round), ~0.1-0.2 ms of CPU each,
#: which a 3 x 30-chunk round (a 10k-parameter model under DDP: its datagrams take ~0.1 ms) pays
#: for nothing; from ~2k datagrams (~2 ms of receive work) a second loop saves more than it costs.
PARALLEL_MIN_DATAGRAMS = 2048

@dataclass
class _WorkerState:
    wid: int
    peer: Peer


class ParameterServer(ServerLogin):
    """The socket driver of :class:`~dblp.protocol.session.ServerSession`: accepts the workers, then
    moves the session's datagrams and control messages over their sockets."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.run_id = secrets.randbits(32)
        self.secret: bytes | None = None if cfg.insecure else (cfg.secret or _env_secret() or
                                                               bytes.fromhex(auth.new_secret()))
        self.refused: dict[str, int] = {}  # refused connections by reason kind (hostile-client accounting)
        self.excluded: list[tuple[int, dict[str, str]]] = []  # (round, worker -> why) left out of a mean
        # the ids the workers asked for (-1: any), in the order their logins completed: another thread
        # (a test, a launcher's progress) can see a login through without waiting for the whole run's
        self.logged_in: list[int] = []
        self.listener = listen((cfg.host, cfg.port))
        self._fd_warned = False
        self.listener.settimeout(cfg.accept_timeout)
        self.port = self.listener.getsockname()[1]
        self.layout: ChunkLayout | None = None
        self.workers: list[_WorkerState] = []
        self.session: ServerSession | None = None
        self.mean: np.ndarray | None = None
        self._writer = RecordWriter(cfg.records)
        self._hook = RoundHookClient(cfg.round_hook) if cfg.round_hook else None
        self._bursts: dict[int, bool] = {}  # round -> the hook said a burst is active
        self.norm_exchange: NormExchange | None = None
        self._local_slots: list[LocalSlot] = []  # host-local workers' slots (dblp.transport.hostlocal)
        self._session_lock = threading.Lock()
        if cfg.shards > 1:
            assert cfg.shard_hub is not None
            try:
                self.norm_exchange = NormExchange(cfg.shard, cfg.shards, cfg.shard_hub, self.secret,
                                                  timeout=cfg.peer_timeout, connect_timeout=cfg.accept_timeout,
                                                  login_timeout=cfg.handshake_timeout)
            except OSError:
                self.listener.close()
                raise

    @property
    def round(self) -> int:
        return self.session.round if self.session is not None else 0

    @property
    def norms(self) -> list[float]:
        return self.session.norms if self.session is not None else []

    # -- setup -------------------------------------------------------------------
    def accept_workers(self) -> None:
        """Take ``cfg.workers`` HELLOs; every handshake runs at once, each under its own deadline.

        A client that connects and says nothing, or something malformed, or
        asks for a tensor this server will not serve, or an id that is taken
        or out of range, is refused with a BYE naming the reason and closed,
        without delaying the others. The tensor size is the server's
        (``cfg.elements``) when configured, else the first valid HELLO's -
        bounded by the memory the server would need for it.

        Before login a connection is bounded (the pre-login limits, :mod:`dblp.protocol.login` L1):
        at most ``cfg.max_pending`` logins at once (one more lets the oldest go, as does a
        want of file descriptors), a first frame of at most :data:`dblp.protocol.control.MAX_HELLO`
        bytes (refused on its 5-byte header, before its body is buffered), at most
        ``cfg.max_login_bytes`` buffered over all logins (the largest is let go), and
        ``cfg.handshake_timeout`` seconds each. A large HELLO is parsed in a process of its
        own, so the loop keeps answering the others meanwhile.
        """
        pending, spec, local = self._login()
        assert spec is not None
        spec = {**pending[0][1].spec, **spec}  # names and shapes from the workers
        elements = int(spec["elements"])
        key = None if self.secret is None else auth.data_key(self.secret, self.run_id)
        self.layout = ChunkLayout(elements, layout_mtu(self.cfg.mtu, self.cfg.host), key=key)  # cfg.mtu: the link's
        ids = assign_ids([h.worker for _, h, _ in pending], self.cfg.workers)
        peers: dict[int, Peer] = {}
        for (conn, hello, keys), wid in zip(pending, ids):
            conn.settimeout(self.cfg.peer_timeout)
            udp = DataSocket(conn.getsockname()[0], 0, fast=self.cfg.fast)
            peer = Peer(f"worker {wid}", conn, udp, on_message=self._on_message)
            if keys is not None:  # every control frame from now on is tagged and numbered, both ways
                peer.authenticate(key_in=keys[0], key_out=keys[1])
            peer.udp_addr = (conn.getpeername()[0], hello.udp_port)
            if conn in local:
                peer.local = (local[conn].down, local[conn].up)
            peers[wid] = peer
            self.workers.append(_WorkerState(wid, peer))
        self.session = ServerSession(
            self.layout, peers, policy=self.cfg.policy, run_id=self.run_id, order=self.cfg.order,
            seed=self.cfg.seed, rounds=self.cfg.rounds, peer_addrs={w: p.udp_addr for w, p in peers.items()},
            consistency=self.cfg.consistency, compensation=self.cfg.compensation,
            context=RecordContext(source=self.cfg.source, policy=self.cfg.policy.name, order=self.cfg.order,
                                  send_rate_bps=self.cfg.send_rate_bps,
                                  clock_offset=time.time() - time.monotonic()),
        )
        locals_ = [w for w in self.workers if w.peer.local is not None]
        for w in locals_:  # a host-local worker's values are received where they already are: its slot
            self.session.receive_into(w.wid, w.peer.local[1])
        for w in self.workers:
            w.peer.receiver = self.session.receiver(w.wid)
            w.peer.send_control(
                ctl.Meta(
                    {
                        "run_id": self.run_id,
                        "worker": w.wid,
                        "workers": self.cfg.workers,
                        "elements": elements,
                        "mtu": self.layout.mtu,
                        "chunk_floats": self.layout.chunk_floats,
                        "chunks": self.layout.chunks,
                        "server_udp_port": w.peer.udp.port,
                        "names": spec.get("names", []),
                        "shapes": spec.get("shapes", []),
                        "order": self.cfg.order,
                        "seed": self.cfg.seed,
                        "policy": self.cfg.policy.name,
                        "gso": w.peer.udp.gso,
                        "consistency": self.cfg.consistency,
                        "compensation": self.cfg.compensation.to_dict(),
                        "wire": self.layout.version,
                        "local": w.peer.local is not None,
                    }
                )
            )
        # With one host-local worker (the sharded mode's own shard) the mean is reduced straight into
        # its slot, so its pass copies nothing; the next round's reduce comes after that worker has
        # sent its next values, hence after it took this mean out. (A member of the run, as the
        # slot's owner is, can set the mean at will anyway: its own gradient enters it.)
        self.mean = locals_[0].peer.local[0] if len(locals_) == 1 else np.zeros(elements, np.float32)
        log.info("%d workers connected; %d elements in %d chunks of %d floats; MTU %s",
                 len(self.workers), elements, self.layout.chunks, self.layout.chunk_floats, self.cfg.mtu_source)

    def _on_message(self, peer: Peer, msg: ctl.Message) -> None:
        """A worker's message for the session (not PROBE/BITMAP/STOP, which its own receiver and
        sender take): one at a time, since with ``threads`` > 1 several loops deliver them."""
        with self._session_lock:
            self._on_message_locked(peer, msg)

    def _on_message_locked(self, peer: Peer, msg: ctl.Message) -> None:
        if isinstance(msg, ctl.Bye):
            if ctl.failure_of(msg.reason) is not None:  # judged as a loss by the round (--on-worker-loss)
                log.warning("%s left, failing: %s", peer.name, ctl.failure_of(msg.reason))
            else:
                log.info("%s left: %s", peer.name, msg.reason)
        elif self.session is not None:
            w = next((w.wid for w in self.workers if w.peer is peer), None)
            if w is not None:
                self.session.handle_control(w, msg, time.monotonic())
                self._dispatch()

    def control_refused(self) -> dict[str, int]:
        """Control frames refused so far on the workers' connections, by why (dblp.protocol.control):
        a forged, replayed or reordered frame is dropped and counted, never acted on."""
        out: dict[str, int] = {}
        for w in self.workers:
            for why, n in w.peer.decoder.refused.items():
                if n:
                    out[why] = out.get(why, 0) + n
        return out

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
            elif isinstance(ev, RoundEnded) and self._hook is not None:
                try:
                    self._hook.ended(ev.round)
                except OSError as exc:
                    raise ServerError(str(exc)) from None
            elif isinstance(ev, RoundOpening) and self._hook is not None:
                try:  # nothing of this round leaves before the hook answered
                    self._bursts[ev.round] = self._hook.opening(ev.round)
                except OSError as exc:
                    raise ServerError(str(exc)) from None

    def _remove(self, w: _WorkerState) -> None:
        assert self.session is not None
        self.workers.remove(w)
        self.session.remove(w.wid, time.monotonic())
        _close_peer(w.peer)

    def _drop_worker(self, exc: PeerError) -> None:
        """A peer failed (``exc.peer``) or went silent (``exc.peer`` None): exit, or go on without it."""
        assert self.session is not None
        if exc.peer is None:  # silence: name the workers the round is waiting for
            waiting = set(self.session.waiting_on())
            lost = [w for w in self.workers if w.wid in waiting]
            names = ", ".join(w.peer.name for w in lost) or "every peer"
            exc = PeerError(f"nothing heard for {self.cfg.peer_timeout:g} s while waiting for {names} "
                            f"(process stopped, host down or path cut)")
        else:
            lost = [w for w in self.workers if w.peer is exc.peer]
        if isinstance(exc, TamperError) or (exc.peer is not None and TAMPERED in (ctl.failure_of(exc.peer.bye) or "")):
            # a tampered stream (found here, or by the worker): the failed round as a record, with the reason
            for w in lost:
                c = self.session.context
                self._writer.write(RoundRecord(source=c.source, role="server", worker=w.wid, round=self.round,
                                               policy=c.policy, order=c.order,
                                               extra={"failed": str(exc),
                                                      "control_refused": dict(w.peer.decoder.refused)}))
        if self.cfg.on_worker_loss == "exit" or not lost:
            raise ServerError(f"round {self.round}: {exc}") from exc
        for w in lost:
            self._remove(w)
        if not self.workers:
            raise ServerError(f"round {self.round}: all workers lost ({exc})") from exc
        log.error("round %d: %s; continuing with %d of %d workers", self.round, exc, len(self.workers),
                  self.cfg.workers)

    def _pump(self, until, wake: socket.socket | None = None) -> None:
        while True:
            live = [w.peer for w in self.workers]
            try:
                if (self.cfg.threads > 1 and self.cfg.consistency == "none"  # (S7's HELD reaches the session)
                        and self.layout is not None
                        and self.layout.chunks * len(live) >= PARALLEL_MIN_DATAGRAMS):
                    pump_parallel(live, until, threads=self.cfg.threads, timeout=self.cfg.peer_timeout, wake=wake)
                else:
                    pump(live, until, timeout=self.cfg.peer_timeout, wake=wake)
            except PeerError as exc:
                self._drop_worker(exc)
                continue
            return

    def serve_round(self) -> bool:
        """One step of Algorithm 3. Returns False once every worker has left."""
        try:
            return self._serve_round()
        finally:
            self._uncork()

    def _cork(self) -> None:
        """Core rule R13: hold every worker's control frames until the loop waits or sends it data."""
        for w in self.workers:
            w.peer.cork()

    def _uncork(self) -> None:
        for w in self.workers:
            try:
                w.peer.uncork()
            except PeerError:
                w.peer.closed = True  # judged at the next round, as a send failure in _dispatch is

    def _serve_round(self) -> bool:
        s = self.session
        assert self.layout is not None and self.mean is not None and s is not None
        if corks_upstream(self.layout.chunks, s.max_batch):
            # R13: a pass of one batch is on the wire before its STOP can come (nothing for R6 to cut),
            # so the STOP(up) may wait for the end of the loop's turn - and the last worker's for the
            # broadcast, whose ROUND(down) it then joins: one write, one wakeup of that worker.
            self._cork()
            if stops_tell_nothing(self.layout.chunks):
                # R13: STOP(up)s of passes whose reply time no pacer reads (R11) wait for the broadcast
                for w in self.workers:
                    w.peer.hold_stops = True
        # 1. DBLP_RECV from every worker (their receivers were opened at the end of the last round).
        # The upstream may be complete already: a worker lost as the last round ended leaves the
        # session to end that round, and the poll after it may find every other upstream in.
        while s.phase is Phase.UPSTREAM:
            self._pump(lambda: s.wants_poll() or any(w.peer.closed for w in self.workers))
            for w in [w for w in self.workers if w.peer.closed]:
                failed = ctl.failure_of(w.peer.bye)
                if failed is not None:  # its goodbye says it failed: a loss, not an orderly end
                    self._drop_worker(PeerError(f"{w.peer.name} failed: {failed}", w.peer))
                elif w.peer.bye is None or w.peer.receiver.received:  # died, or left mid-round
                    why = "left in the middle of" if w.peer.bye is not None else "connection lost before"
                    self._drop_worker(PeerError(f"{w.peer.name}: {why} round {self.round}", w.peer))
                else:
                    self._remove(w)
            if not self.workers:
                return False
            s.poll(time.monotonic())
        # 2. Reduce by mean; 3.-4. the session feeds the policy and starts the broadcast.
        live = s.live
        g = guarded_mean_norm([s.buffer(w) for w in live], [s.receiver(w).mask for w in live],
                              self.layout, self.mean, self.cfg.reduce, self.cfg.max_grad_norm, self.cfg.clip_norm)
        norm = g.norm
        self._cork()  # R13: each worker's ROUND(down) goes with its datagrams, its PROBE(down) after them
        for w in self.workers:
            w.peer.hold_stops = False
        if self.norm_exchange is not None:  # the sharded mode: the policy sees the whole mean's norm
            for w in self.workers:  # S3b: PROBEs follow the ROUND(down) (dblp.transport.sockets.Peer.hold_probes)
                w.peer.hold_probes = True
            s.begin_broadcast(time.monotonic(), self.mean)  # S3b: the mean leaves while the shards exchange
            self._dispatch()
            norm = math.sqrt(self._exchange_norm(s.round, norm * norm))
        extra: dict = {"reduce": self.cfg.compensation.upload_estimate}
        if g.excluded:  # the aggregation guard (dblp.protocol.reduce G2-G3): left out of this round's mean
            extra["excluded"] = {str(live[i]): why for i, why in g.excluded.items()}
            self.excluded.append((s.round, extra["excluded"]))
            for i, why in g.excluded.items():
                log.warning("round %d: worker %d left out of the mean: %s; %d of %d contributions averaged",
                            s.round, live[i], why, len(live) - len(g.excluded), len(live))
        if g.clipped:
            extra["clipped"] = [live[i] for i in g.clipped]
        refused = self.control_refused()
        if refused:  # control frames injected, replayed or reordered on the path: dropped, counted
            extra["control_refused"] = refused
        if self._hook is not None:
            extra["burst"] = self._bursts.pop(s.round, False)
        s.broadcast(norm, time.monotonic(), self.mean, extra=extra)
        self._dispatch()
        for w in self.workers:  # the ROUND(down) is out: a pass's PROBE held meanwhile follows it
            if w.peer.hold_probes:
                w.peer.hold_probes = False
                try:
                    w.peer.flush()
                except PeerError:
                    w.peer.closed = True  # judged below, as a send failure in _dispatch is
        finished = s.round
        while s.round == finished:
            self._pump(lambda: s.round != finished or s.wants_poll()
                       or any(w.peer.closed and not s.broadcast_done(w.wid) for w in self.workers))
            s.poll(time.monotonic())
            self._dispatch()
            for w in [w for w in self.workers if w.peer.closed and not s.broadcast_done(w.wid)]:
                failed = ctl.failure_of(w.peer.bye)
                why = f" failed: {failed}" if failed is not None else ":"
                self._drop_worker(PeerError(f"{w.peer.name}{why} left in the middle of round {finished}"
                                            if failed is None else f"{w.peer.name}{why}", w.peer))
        return True

    def _exchange_norm(self, round_no: int, sq_norm: float) -> float:
        """The shard servers' norm exchange (:class:`dblp.transport.shard.NormExchange`, blocking) on a helper
        thread, while this one keeps the broadcast begun at the reduce moving (session S3b): the
        exchange waits for the slowest shard's reduce, and the datagrams need not."""
        assert self.norm_exchange is not None
        exchange = self.norm_exchange
        box: list = []
        rd, wr = socket.socketpair()

        def run() -> None:
            try:
                box.append(exchange.total(round_no, sq_norm))
            except BaseException as exc:  # noqa: BLE001 - raised below, on the server's thread
                box.append(exc)
            finally:
                try:
                    wr.send(b"x")
                except OSError:
                    pass

        helper = threading.Thread(target=run, name="dblp-norm-exchange", daemon=True)
        helper.start()
        try:
            self._pump(lambda: bool(box), wake=rd)
            helper.join()
        finally:
            rd.close()
            wr.close()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def serve(self) -> int:
        """Accept the workers and serve rounds until they leave; returns rounds served."""
        if not self.workers:
            self.accept_workers()
        assert self.session is not None
        self.session.start(time.monotonic())
        self._dispatch()
        served = 0
        ending = "server shutting down"
        try:
            while self.cfg.rounds is None or served < self.cfg.rounds:
                if not self.serve_round():
                    break
                served += 1
        except Exception as exc:  # the workers are told why, in a failure BYE (not "shutting down")
            ending = f"{ctl.FAILED}{exc}"
            raise
        finally:
            self.close(ending)
        return served

    def close(self, reason: str = "server shutting down") -> None:
        for w in self.workers:
            _close_peer(w.peer, reason)
        self.workers = []
        self.listener.close()
        self._writer.close()
        if self._hook is not None:
            self._hook.close()
        if self.norm_exchange is not None:
            self.norm_exchange.close()
        for slot in self._local_slots:
            slot.close()
        self._local_slots = []


def _close_peer(peer: Peer, reason: str | None = None) -> None:
    if reason and not peer.closed:
        try:
            peer.send_control(ctl.Bye(reason))
        except PeerError:
            pass
    peer.drop_loop()
    for s in (peer.tcp, peer.udp):
        try:
            s.close()
        except OSError:
            pass


def _env_secret() -> bytes | None:
    """``$DBLP_SECRET`` when set (how launchers hand a run its secret), else None."""
    text = os.environ.get(auth.SECRET_ENV)
    if not text:
        return None
    try:
        return auth.parse_secret(text, f"${auth.SECRET_ENV}")
    except auth.AuthError as exc:
        raise ParameterError(str(exc)) from None
