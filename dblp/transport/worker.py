"""The DBLP worker API (paper Algorithm 4): one ``allreduce`` call per training step.

``Worker.allreduce(x)`` sends the local gradient with DBLP_SEND, receives the
server's averaged gradient with DBLP_RECV and returns it - zero-filled where
chunks stayed lost within the round's tolerance. ``x`` may be a numpy array,
a torch tensor (any device; the result comes back on the same device and
dtype) or a list of tensors (flattened into one buffer and split back);
:mod:`dblp.transport.staging` makes the host buffer (zero-copy for CPU float32, one
pinned non-blocking copy each way for CUDA).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Sequence

import numpy as np

from dblp.protocol import auth
from dblp.protocol import control as ctl
from dblp.protocol.compensation import Compensation
from dblp.protocol.core import DEFAULT_ORDER
from dblp.transport.hostlocal import LocalSlot, LocalSlotError
from dblp.protocol.pacing import make_pacer
from dblp.protocol.records import RecordWriter, RoundRecord
from dblp.protocol.session import RecordContext, WorkerSession
from dblp.transport.staging import HostStaging, ResultPool
from dblp.transport.sockets import DEFAULT_PEER_TIMEOUT_S, TAMPERED, Peer, PeerError, TamperError, connect_retry, pump
from dblp.transport.udp import DataSocket, route_mtu, layout_mtu as link_layout_mtu
from dblp.protocol.wire import ChunkLayout, ParameterError

log = logging.getLogger("dblp.transport.worker")
_MTU_WARNED: set[tuple[str, int, int]] = set()  # (server, its MTU, our route's): said once per process


def check_path_mtu(host: str, port: int, layout_mtu: int) -> str | None:
    """Warn once (stderr, through logging) when this host's route to the server at ``host`` carries
    less than the MTU the server sized its datagrams for: each of them would then be cut into IP
    fragments (slower, and one lost fragment loses the whole datagram, which the bitmap then counts
    as one lost chunk) - a server whose ``--mtu auto`` saw its own jumbo link, or a ``--mtu`` set
    too high. ``layout_mtu``: META's ``mtu`` (IPv4-sized; an IPv6 server announces its link's - 20).
    Returns the message (None when the path carries the datagrams whole or cannot be read)."""
    route = route_mtu(host)
    carried = None if route is None else link_layout_mtu(route, host)  # IPv4-sized, as META's mtu
    if carried is None or carried >= layout_mtu:
        return None
    link = layout_mtu + (route - carried)  # the server's link MTU, in the route's family
    msg = (f"the server at {host}:{port} sizes its datagrams for a {link}-byte MTU, but this host's route to "
           f"it carries {route} bytes: every datagram will be fragmented (slower, and a lost fragment loses "
           f"the datagram); start the server with --mtu {route} (the smallest MTU of its workers' paths)")
    if (host, link, route) not in _MTU_WARNED:
        _MTU_WARNED.add((host, link, route))
        log.warning("%s", msg)
    return msg


class WorkerError(RuntimeError):
    pass


class Worker:
    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        elements: int | None = None,
        names: Sequence[str] = (),
        shapes: Sequence[Sequence[int]] = (),
        worker_id: int = -1,
        send_rate_bps: float | None = None,
        connect_timeout: float = 60.0,
        peer_timeout: float = DEFAULT_PEER_TIMEOUT_S,
        records: str | None = None,
        source: str = "loopback",
        fast: bool | None = None,
        secret: bytes | None = None,
        insecure: bool = False,
        local: bool = False,
    ) -> None:
        """``secret``: the run's shared secret (:mod:`dblp.protocol.auth`); None reads ``$DBLP_SECRET``.
        ``insecure``: the paper's unauthenticated wire (the server must run ``--insecure`` too).
        ``local``: the server runs on this host; the data moves through a shared-memory slot
        (:mod:`dblp.transport.hostlocal`) instead of UDP - the control protocol is the same."""
        if elements is None:
            elements = int(sum(int(np.prod(s)) for s in shapes)) if shapes else 0
        if elements <= 0:
            raise ParameterError(f"elements must be positive (give elements= or shapes=), got {elements}")
        if max(len(names), len(shapes)) > ctl.MAX_TENSORS or any(len(s) > ctl.MAX_DIMS for s in shapes):
            raise ParameterError(f"a HELLO lists at most {ctl.MAX_TENSORS} tensors of at most {ctl.MAX_DIMS} "
                                 f"dimensions; got {max(len(names), len(shapes))} (flatten into fewer buffers)")
        if peer_timeout <= 0:
            raise ParameterError(f"peer_timeout must be positive, got {peer_timeout}")
        try:
            self.secret = secret if secret is not None or insecure else auth.resolve_secret(None, False)
        except auth.AuthError as exc:
            raise ParameterError(str(exc)) from None
        if self.secret is not None and len(self.secret) < 16:
            raise ParameterError(f"secret must have at least 16 bytes, got {len(self.secret)}")
        self.server = (server_host, server_port)
        self.spec = {"elements": int(elements), "names": list(names), "shapes": [list(s) for s in shapes]}
        self.requested_id = worker_id
        self.pacer = make_pacer(send_rate_bps)  # None: self-pacing (dblp.protocol.pacing.AutoPacer)
        self.connect_timeout = connect_timeout
        self.peer_timeout = peer_timeout
        self.source = source
        self.fast = fast
        self._writer = RecordWriter(records)
        self.peer: Peer | None = None
        self.meta: dict = {}
        self.session: WorkerSession | None = None
        self._early: list[tuple[ctl.RoundStart, float]] = []
        self.last_record: RoundRecord | None = None
        self._bye: str | None = None
        self._challenge: ctl.Challenge | None = None
        self.local = local
        self._slot: LocalSlot | None = None

    # -- connection ----------------------------------------------------------------
    def connect(self) -> "Worker":
        try:
            tcp = connect_retry(self.server, self.connect_timeout, what="the server")
        except OSError as exc:
            raise WorkerError(f"cannot reach the server at {self.server[0]}:{self.server[1]}: {exc}") from exc
        tcp.settimeout(self.peer_timeout)
        udp = DataSocket(tcp.getsockname()[0], 0, fast=self.fast)
        self.peer = Peer("server", tcp, udp, on_message=self._on_message)
        if self.secret is not None:  # nothing after the CHALLENGE is read before the keys are set
            self.peer.decoder = ctl.ControlDecoder(hold_after=ctl.CHALLENGE_TYPE)
        nonce = auth.new_nonce() if self.secret is not None else b""
        if self.local:
            try:
                self._slot = LocalSlot.create(int(self.spec["elements"]))
            except LocalSlotError as exc:  # an optimisation only: the network path carries the same rounds
                log.warning("%s; this worker's data goes over the network instead", exc)
        hello = ctl.Hello(self.requested_id, udp.port, self.spec, nonce=nonce.hex(),
                          local=self._slot.path if self._slot is not None else "")
        self.peer.send_control(hello)
        try:
            if self.secret is not None:
                self._authenticate(hello, nonce)
            self._pump(lambda: bool(self.meta), "metadata")
        finally:
            if self._slot is not None:  # attached by the server now, or never: the name can go
                self._slot.unlink()
        m = self.meta
        if self._slot is not None:
            if not m.get("local"):
                raise WorkerError(f"the server at {self.server[0]}:{self.server[1]} did not take the "
                                  f"host-local data path")
            self.peer.local = (self._slot.up, self._slot.down)
        self.worker_id = int(m["worker"])
        wire = int(m.get("wire", 1))
        if (wire == 2) != (self.secret is not None):
            raise WorkerError(f"the server speaks wire version {wire}; this worker "
                              f"{'is authenticated' if self.secret else 'runs --insecure'}")
        key = None if self.secret is None else auth.data_key(self.secret, int(m["run_id"]))
        self.layout = ChunkLayout(int(m["elements"]), int(m["mtu"]), key=key)
        self.peer.udp_addr = (tcp.getpeername()[0], int(m["server_udp_port"]))
        if self._slot is None:  # the host-local slot sends no datagrams
            check_path_mtu(self.peer.udp_addr[0], self.server[1], self.layout.mtu)
        order = str(m.get("order", DEFAULT_ORDER))
        self.session = WorkerSession(
            self.layout, self.worker_id, run_id=int(m["run_id"]), order=order, seed=int(m.get("seed", 0)),
            pacer=self.pacer, peer_addr=self.peer.udp_addr, consistency=str(m.get("consistency", "none")),
            compensation=Compensation.from_dict(m.get("compensation")),
            context=RecordContext(source=self.source, policy=str(m.get("policy", "")), order=order,
                                  send_rate_bps=self.pacer.rate_bps, clock_offset=time.time() - time.monotonic()),
        )
        for msg, t in self._early:  # ROUND messages that came with the metadata
            self.session.handle_control(msg, t)
        self._early = []
        self.peer.receiver = self.session.receiver
        self._results = ResultPool(self.layout.elements)  # result buffers, reused once the caller lets go
        self.staging = HostStaging(self.layout.elements)  # host buffers of CUDA tensors, reused every round
        log.info("worker %d connected: %d chunks per round", self.worker_id, self.layout.chunks)
        return self

    def _authenticate(self, hello: ctl.Hello, nonce: bytes) -> None:
        """The worker's half of the challenge-response: check the server's proof, send ours."""
        assert self.peer is not None and self.secret is not None
        self._pump(lambda: self._challenge is not None or bool(self.meta), "the server's challenge")
        ch = self._challenge
        if ch is None:
            raise WorkerError("the server sent no challenge: it runs --insecure (start this worker with "
                              "--insecure too) or is not a DBLP server of this version")
        canon = ctl.canonical_hello(hello)
        if not auth.check_proof(self.secret, "server", nonce, ch.nonce, canon, ch.proof):
            raise WorkerError(f"the server at {self.server[0]}:{self.server[1]} does not hold this run's "
                              f"secret (its proof failed): wrong --secret-file / ${auth.SECRET_ENV}, "
                              f"or not our server")
        self.peer.send_control(ctl.AuthProof(auth.proof(self.secret, "worker", nonce, ch.nonce, canon)))
        up, down = auth.control_keys(self.secret, nonce, ch.nonce, canon)
        self.peer.authenticate(key_in=down, key_out=up)  # from META on, every frame is tagged and numbered

    def _on_message(self, peer: Peer, msg: ctl.Message) -> None:
        now = time.monotonic()
        if isinstance(msg, ctl.Challenge):
            self._challenge = msg
        elif isinstance(msg, ctl.Meta):
            self.meta = msg.info
        elif isinstance(msg, (ctl.RoundStart, ctl.Common)):
            if self.session is None:
                self._early.append((msg, now))
            else:
                self.session.handle_control(msg, now)
        elif isinstance(msg, ctl.Bye):
            self._bye = msg.reason

    def _pump(self, until, what: str) -> None:
        assert self.peer is not None
        try:
            pump([self.peer], lambda: until() or self._bye is not None, timeout=self.peer_timeout)
        except PeerError as exc:
            if isinstance(exc, TamperError):
                self._record_failure(str(exc))
            raise WorkerError(f"worker {getattr(self, 'worker_id', '?')}, round {self.round}, waiting for {what}: {exc}") from exc
        if self._bye is not None and not until():
            if TAMPERED in (ctl.failure_of(self._bye) or ""):  # the server found a stream of this run tampered
                self._record_failure(f"the server ended the run: {ctl.failure_of(self._bye)}")
            raise WorkerError(f"server ended the run while worker waited for {what}: {self._bye}")

    def _record_failure(self, why: str) -> None:
        """The round that failed, as a record of its own (``extra["failed"]``, latencies NaN): a run
        ended by tampering says so where its rounds are, with the refusals counted."""
        if self.session is None:
            return
        c = self.session.context
        self._writer.write(RoundRecord(source=c.source, role="worker", worker=self.worker_id, round=self.round,
                                       policy=c.policy, order=c.order, chunks=c.count(self.layout.chunks),
                                       extra={"failed": why, "control_refused": dict(self.peer.decoder.refused)}))

    @property
    def round(self) -> int:
        return self.session.round if self.session is not None else 0

    # -- the step ----------------------------------------------------------------------
    def allreduce(self, x: Any, out: np.ndarray | None = None) -> Any:
        """Send ``x``, return the averaged tensor of this round (Algorithm 4 l.5-6).

        ``out``: a float32 array of this worker's size to receive into (a sharded worker's slice
        of its result, :mod:`dblp.transport.shard`); default a buffer of the worker's own."""
        if self.peer is None:
            self.connect()
        assert self.peer is not None and self.peer.receiver is not None
        staged = self.staging.stage(x)
        s = self.session
        k = s.round
        t0 = time.monotonic()
        self._pump(s.can_send, f"round {k} to start")
        if out is not None and (out.dtype != np.float32 or out.size != self.layout.elements
                                or not out.flags.c_contiguous):
            raise ValueError(f"out must be a contiguous float32 array of {self.layout.elements} elements")
        if out is None:
            out = staged.recv if staged.recv is not None else self._results.take()
        sender = s.begin_round(time.monotonic(), staged.send, out, t_ready=t0)
        self.peer.sender = sender
        recv = s.receiver
        self._pump(lambda: sender.done, f"the server's STOP of round {k}")
        s.sent(time.monotonic())
        self._pump(lambda: recv.complete, f"the averaged gradient of round {k}")
        held = s.held(time.monotonic())
        if held is not None:  # consistency mode: apply only what every worker holds (session S7)
            self.peer.send_control(held)
            self._pump(s.can_finish, f"the common chunks of round {k}")
        refused = self.peer.decoder.refused_total
        rec = s.finish_round(time.monotonic(), extra={"control_refused": dict(self.peer.decoder.refused)}
                             if refused else None)
        self.last_record = rec
        self._writer.write(rec)
        return staged.restore(out)

    def close(self, reason: str = "worker done") -> None:
        if self.peer is not None:
            tcp = self.peer.tcp
            try:
                tcp.sendall(ctl.encode(ctl.Bye(reason), self.peer.mac_out))
                # Half-close and drain until the server closes, so unread
                # control bytes do not turn our close into a reset that could
                # destroy the BYE before the server reads it.
                tcp.shutdown(socket.SHUT_WR)
                tcp.settimeout(2.0)
                while tcp.recv(65536):
                    pass
            except OSError:
                pass
            tcp.close()
            self.peer.drop_loop()
            self.peer.udp.close()
            self.peer = None
        if self._slot is not None:
            self._slot.unlink()
            self._slot.close()
            self._slot = None
        self._writer.close()

    def __enter__(self) -> "Worker":
        return self.connect() if self.peer is None else self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(failed_reason(exc))


def failed_reason(exc: BaseException | None) -> str:
    """The goodbye of a worker leaving with ``exc`` raised: a failure BYE (:data:`dblp.protocol.control.FAILED`)
    for an error, so the server applies ``--on-worker-loss`` instead of taking it for an orderly end;
    "worker done" without one, and for Ctrl-C or an exit (the run is being stopped, not failing)."""
    if exc is None or not isinstance(exc, Exception):
        return "worker done"
    return f"{ctl.FAILED}{exc}" if isinstance(exc, WorkerError) else f"{ctl.FAILED}{type(exc).__name__}: {exc}"

