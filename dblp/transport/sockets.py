"""Drives the sans-I/O core with real sockets: UDP for data, TCP for control.

A :class:`Peer` bundles what one side keeps per remote peer: the TCP control
connection, the UDP socket and the peer's UDP address, the persistent
:class:`~dblp.protocol.core.Receiver` and the :class:`~dblp.protocol.core.RoundSender` of the
round in flight. :func:`pump` is the whole event loop: it moves datagrams
and control messages between sockets and the core objects of any number of
peers until a condition holds. It adds no protocol rule of its own; it only
enforces liveness (a peer that closes or stays silent too long raises
:class:`PeerError` naming the peer).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import Receiver, RoundSender
from dblp.protocol.pacing import WAKE_S, ControlCork
from dblp.transport.udp import DataSocket, addr_key

log = logging.getLogger("dblp.transport.sockets")

DEFAULT_PEER_TIMEOUT_S = 120.0  # silence allowed while peers compute; dead hosts: TCP keepalive below
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 5, 2, 4  # a vanished host fails recv in ~13 s
UNACKED_TIMEOUT_MS = 15_000  # TCP_USER_TIMEOUT: control data unacknowledged this long fails the connection
SEND_SLICE = 16  # batches sent per peer before looking at the sockets again
RECV_ROWS = 2048  # datagrams taken from a socket per core call
SELECT_RESOLUTION_S = 0.001  # epoll waits in whole milliseconds, rounded up (selectors.EpollSelector)


class PeerError(RuntimeError):
    """The peer closed, failed or went silent; the message names it."""

    def __init__(self, message: str, peer: "Peer | None" = None) -> None:
        super().__init__(message)
        self.peer = peer


#: The words every tamper message carries: the other side, told by a failure BYE, can tell it from a crash.
TAMPERED = "failed authentication"


class TamperError(PeerError):
    """An authenticated control stream carried a frame that is not the peer's (refused: forged,
    replayed, out of order) or bytes that are no frame at all. TCP hands over the peer's bytes
    whole and in order, so either means someone on the path wrote into the stream; waiting for
    the real frames is hopeless (TCP took the injected bytes in their place), so the connection
    ends at once, under this name, instead of after the peer timeout as "peer dead"."""


def tamper_message(name: str, decoder: ctl.ControlDecoder, error: ctl.ControlError | None = None) -> str:
    """The one-line reason a tampered control stream ends: what was refused, by kind, and what the
    last refused frame said (or why the bytes are no frame)."""
    r = decoder.refused
    kinds = [f"{r['forged']} forged"] if r["forged"] else []
    kinds += [f"{r['replayed']} replayed"] if r["replayed"] else []
    kinds += [f"{r['reordered']} out of order"] if r["reordered"] else []
    what = ", ".join(kinds)
    if error is not None:
        what = f"{what + '; ' if what else ''}bytes that are no frame ({error})"
    first = decoder.first_refused
    said = f"; the first refused said {first!r}" if first is not None else ""
    return (f"control stream of {name} {TAMPERED}: {what}; ending the run (an on-path "
            f"attacker wrote into the stream: nothing it sent was applied){said}")


class Peer:
    def __init__(
        self,
        name: str,
        tcp: socket.socket,
        udp: DataSocket,
        *,
        on_message: Callable[["Peer", ctl.Message], None],
    ) -> None:
        self.name = name
        self.tcp = tcp
        self.udp = udp
        self.udp_addr: tuple[str, int] | None = None
        self.receiver: Receiver | None = None
        self.sender: RoundSender | None = None
        self.on_message = on_message
        self.decoder = ctl.ControlDecoder()
        # The authenticated control channel (dblp.protocol.auth.control_keys): set once the handshake's
        # proofs are checked; None on the --insecure wire and during the handshake.
        self.mac_out: ctl.ControlMac | None = None
        self._send_lock = threading.Lock()  # a frame's sequence number and its bytes leave together
        self._rows = np.empty((0, 0), np.uint8)
        self._lengths = np.zeros(RECV_ROWS, np.int64)
        self._srcs = np.zeros(RECV_ROWS, np.int64)  # source address keys (udp.addr_key)
        self._aims = np.zeros(RECV_ROWS, np.int64)  # where recv_place put each payload (-1: in its row)
        self._crcs = np.zeros(RECV_ROWS, np.uint32)  # CRC-32C of placed datagrams, taken in recv_place
        self.placed = 0  # datagrams received in place (core rule R10), over the connection's life
        self._peer_key: tuple[object, int] = (None, -1)
        self.last_heard = time.monotonic()
        self.closed = False
        self.bye: str | None = None  # the reason of an orderly BYE
        # The host-local data path (dblp.transport.hostlocal): (the slot array this side sends from, the one
        # it receives from); None = datagrams over UDP.
        self.local: tuple[np.ndarray, np.ndarray] | None = None
        self._every_chunk = np.zeros(0, np.int64)
        # Session S3b: while a broadcast is under way before its ROUND(down), the sender's PROBE
        # waits here (in the sender) so it follows the ROUND - else a receiver holding every chunk
        # but no tolerance would answer BITMAPs back and forth until the ROUND came.
        self.hold_probes = False
        # pump's selector over this peer (first) and the others of its last call, kept between calls
        self.loop: tuple[tuple, selectors.BaseSelector] | None = None
        # control messages sent to this peer, by type (RoundStart, Probe, Stop...): what a round
        # costs in control round trips, counted (tests/test_control_cost.py)
        self.control_sent: dict[str, int] = {}
        # Corked (:meth:`cork`, R13): control frames are encoded (numbered, tagged) at once but held, and
        # written together - one write, one wakeup of the peer - by :meth:`release`; the cork decides
        # what is held and when it is due (dblp.protocol.pacing.ControlCork), this peer writes.
        self._cork = ControlCork()
        self.control_writes = 0  # TCP writes of control frames (a write wakes the peer; counted like control_sent)
        self.control_reads = 0  # reads that brought control bytes (about one per write the peer made)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A peer whose process dies closes the connection at once; a peer whose
        # host vanishes is found by TCP keepalive, so a long compute step of
        # the other side (silence) is never mistaken for a dead host.
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Keepalive covers an idle connection; TCP_USER_TIMEOUT one with a probe
        # or bitmap in flight, which TCP would otherwise retransmit for ~15 min.
        for opt, val in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                         ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", UNACKED_TIMEOUT_MS)):
            if hasattr(socket, opt):
                tcp.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)

    def drop_loop(self) -> None:
        """Close the selector :func:`pump` kept on this peer (the peer closes, or its peers change)."""
        if self.loop is not None:
            self.loop[1].close()
            self.loop = None

    def authenticate(self, key_in: bytes, key_out: bytes) -> None:
        """From now on every control frame either way is tagged and numbered (dblp.protocol.control)."""
        self.decoder.key(ctl.ControlMac(key_in))
        self.mac_out = ctl.ControlMac(key_out)

    def send_control(self, msg: ctl.Message) -> None:
        """Send ``msg`` now, or, while corked, hold it for :meth:`release` (in order either way)."""
        name = type(msg).__name__
        try:
            with self._send_lock:
                self.control_sent[name] = self.control_sent.get(name, 0) + 1
                frame = ctl.encode(msg, self.mac_out)
                if self._cork.hold(frame, isinstance(msg, ctl.Stop)):
                    return
                self.control_writes += 1
                self.tcp.sendall(frame)
        except OSError as exc:
            raise PeerError(f"{self.name}: control connection failed while sending: {exc}", self) from exc

    # -- corking (pacing rule R13: dblp.protocol.pacing.ControlCork decides, the peer writes) ------
    def cork(self) -> None:
        """Hold control frames from now on until :meth:`release` writes them in one piece.

        Why: every write on the control connection wakes the peer's event loop, and on a host
        with fewer cores than processes a woken peer preempts the writer (docs/benchmark.md). A
        small model's round is all control: the server's ROUND(down) and PROBE(down) of the
        broadcast, and the last worker's STOP(up) before them, go as one write. :func:`pump`
        releases every peer's due frames before it waits for input (a frame never waits on its
        own reply), so the one who corks need only :meth:`uncork` at the end."""
        with self._send_lock:
            self._cork.cork()

    @property
    def corked(self) -> bool:
        return self._cork.corked

    @property
    def hold_stops(self) -> bool:
        """Corked and holding STOPs: a STOP stays held while the loop waits, until :meth:`release` -
        set by the server for passes too small to tell a pacer anything by their STOP's timing
        (:func:`dblp.protocol.pacing.stops_tell_nothing`). Any other frame clears it (a BITMAP,
        say, is awaited: it and what is held before it go before the wait)."""
        return self._cork.hold_stops

    @hold_stops.setter
    def hold_stops(self, hold: bool) -> None:
        self._cork.hold_stops = hold

    def release(self) -> None:
        """Write the frames held so far in one write (nothing to write: nothing done); stay corked."""
        if not self._cork.due_before_data():
            return
        try:
            with self._send_lock:
                data = self._cork.take()
                self.control_writes += 1
                self.tcp.sendall(data)
        except OSError as exc:
            raise PeerError(f"{self.name}: control connection failed while sending: {exc}", self) from exc

    def release_before_wait(self) -> None:
        """Write what is held unless only STOPs the cork keeps across waits are (R13)."""
        if self._cork.due_before_wait():
            self.release()

    def uncork(self) -> None:
        """Release what is held and send every later frame at once again."""
        try:
            self.release()
        finally:
            with self._send_lock:
                self._cork.uncork()

    def flush(self) -> None:
        if self.receiver is not None:
            for m in self.receiver.control_to_send():
                self.send_control(m)
        if self.sender is not None and not self.hold_probes:
            for m in self.sender.control_to_send():
                self.send_control(m)

    def read_control(self, now: float) -> None:
        try:
            data = self.tcp.recv(1 << 20)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError as exc:
            raise PeerError(f"{self.name}: control connection failed: {exc}", self) from exc
        if not data:
            if self.closed:  # after its BYE: an orderly close
                return
            self.closed = True
            said = self.decoder.last_refused
            unauth = (f"; its last message was refused as unauthenticated: {said!r}"
                      if self.decoder.refused_total and said is not None else "")
            raise PeerError(f"{self.name}: closed the control connection (process died or exited mid-round)"
                            f"{unauth}", self)
        self.last_heard = time.monotonic()
        self.control_reads += 1
        refused = self.decoder.refused_total
        try:
            msgs = self.decoder.feed(data)
        except ctl.ControlError as exc:
            if self.decoder.mac is not None:  # after the handshake: the framing was broken on the path
                raise TamperError(tamper_message(self.name, self.decoder, exc), self) from exc
            raise PeerError(f"{self.name}: protocol error on the control channel: {exc}", self) from exc
        if self.decoder.refused_total != refused:
            said = self.decoder.last_refused
            if self.decoder.mac is not None and self.decoder.mac.seq == 0 and isinstance(said, ctl.Bye) \
                    and self.decoder.refused_total == self.decoder.refused["forged"]:
                # Nothing authenticated yet, and an untagged BYE: the server's refusal of this login
                # sent before it held the keys (a timeout, its own failure), or an injected one.
                self.closed = True
                raise PeerError(f"{self.name}: ended the login with an unauthenticated BYE (its own "
                                f"refusal before the keys, or injected on the path): {said.reason}", self)
            raise TamperError(tamper_message(self.name, self.decoder), self)
        for m in msgs:
            self.dispatch(m, now)

    def dispatch(self, m: ctl.Message, now: float) -> None:
        if isinstance(m, ctl.Probe):
            if self.receiver is not None:
                # Datagrams sent before the probe are queued by now: take them
                # in first, so the bitmap does not ask for them again.
                self.read_data(now)
                self.receiver.handle_control(m, now)
        elif isinstance(m, (ctl.Stop, ctl.Bitmap)):
            if self.sender is not None:
                self.sender.handle_control(m, now)
        elif isinstance(m, ctl.Local):
            self._receive_local(m, now)
        elif isinstance(m, ctl.Bye):
            self.closed = True
            self.bye = m.reason
            self.on_message(self, m)
        else:
            self.on_message(self, m)

    def read_data(self, now: float, clock: Callable[[], float] | None = None) -> None:
        """Drain the data socket into the receiver, a row matrix at a time. With ``clock`` each
        batch is stamped when it was read, not with the loop turn's ``now``: a turn that served
        other peers first, or a thread the host descheduled, would stamp a flood's last chunks
        early, and pacing rule R15 reads the flood's rate from those stamps (a stale end made a
        100 Mbit/s link look 1.6x faster)."""
        width = self.receiver.layout.datagram_size if self.receiver is not None else 2048
        if self._rows.shape[1] != width:
            self._rows = np.empty((RECV_ROWS, width), np.uint8)
        while True:
            plan = self.receiver.placement() if self.receiver is not None and self.udp.can_place else None
            if plan is not None:
                k, placed = self.udp.recv_place(self._rows, self._lengths, self._srcs, self._aims, self._crcs, plan)
                self.placed += placed
            else:
                k = self.udp.recv_rows(self._rows, self._lengths, self._srcs)
            if k == 0:
                break
            if clock is not None:
                now = max(now, clock())
            if self.receiver is not None:
                foreign = None
                peer = self.receiver.peer_addr
                if peer is not None:
                    if self._peer_key[0] != peer:
                        self._peer_key = (peer, addr_key(peer))
                    bad = self._srcs[:k] != self._peer_key[1]
                    foreign = bad if bad.any() else None
                if plan is not None:
                    self.receiver.receive_placed(self._rows[:k], self._lengths[:k], self._aims[:k], now, foreign,
                                                 crcs=self._crcs[:k])
                else:
                    self.receiver.receive_batch(self._rows[:k], self._lengths[:k], now, foreign)
            if k < self._rows.shape[0] // 2:
                break
        if self.receiver is not None:
            for m in self.receiver.control_to_send():
                self.send_control(m)

    def _receive_local(self, m: ctl.Local, now: float) -> None:
        """A pass in the host-local slot: the whole tensor, copied into the open round's buffer and
        taken at once. Of another round (or none open) it is counted stale by the core, uncopied."""
        r = self.receiver
        if self.local is None or r is None:
            raise PeerError(f"{self.name}: sent LOCAL without a host-local slot (protocol error)", self)
        if m.direction != r.direction:
            raise PeerError(f"{self.name}: LOCAL of direction {m.direction} toward direction {r.direction}", self)
        n = r.layout.chunks
        if self._every_chunk.size != n:
            self._every_chunk = np.arange(n, dtype=np.int64)
        if r.active and not r.complete and m.round == r.round_no and r.out is not None \
                and not _same_memory(r.out, self.local[1]):  # (a server receives in the slot itself)
            np.copyto(r.out, self.local[1])
        r.receive_chunks(m.round, self._every_chunk, now)
        for msg in r.control_to_send():
            self.send_control(msg)

    def _send_local(self, now: float) -> bool:
        """A pass over the host-local slot: its values copied in once per round, then one LOCAL."""
        s = self.sender
        assert s is not None and self.local is not None
        corked = self.corked
        if not corked:  # R13: the LOCAL and the PROBE after it are one write
            self.cork()
        try:
            b = s.datagrams_to_send(now, limit=max(1, s.pass_remaining), headers=False)
            if b is not None:
                if s.stats.passes == 1 and b.values is not None and not _same_memory(self.local[0], b.values):
                    np.copyto(self.local[0], b.values)  # (a server's mean may be reduced into the slot itself)
                self.send_control(ctl.Local(s.round_no, s.direction))
            if not self.hold_probes:
                for m in s.control_to_send():
                    self.send_control(m)
        finally:
            if not corked:
                self.uncork()
        return s.ready(now)

    def send_data(self, now: float) -> bool:
        """Send a slice of the current pass; True if more is ready right away."""
        s = self.sender
        if s is None or s.done:
            return False
        if self.local is not None:
            return self._send_local(now)
        if self.udp_addr is None:
            return False
        for _ in range(SEND_SLICE):
            b = s.datagrams_to_send(now)
            if b is None:
                break
            if self._cork.due_before_data():  # R13: what was held (the ROUND announcing these datagrams) goes first
                self.release()
            self.udp.send_chunks(b.headers, b.values, b.seqs, b.lengths, b.layout, self.udp_addr)
        if not self.hold_probes:
            for m in s.control_to_send():
                self.send_control(m)
        return s.ready(now)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are the same floats (one a view of the other's whole memory): then a
    host-local pass has nothing to copy."""
    return a.size == b.size and a.ctypes.data == b.ctypes.data


def connect_retry(addr: tuple[str, int], timeout_s: float, interval_s: float = 0.2,
                  what: str = "peer") -> socket.socket:
    """A TCP connection to ``addr``, retried every ``interval_s`` while the peer is not up yet (a
    launcher starts processes in parallel); after ``timeout_s`` the last ``OSError`` is raised.
    The first failure is said at once (a warning naming ``what``, the error and how long the
    retries go on), so a wrong port is not a silent minute."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            return socket.create_connection(addr, timeout=5.0)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise
            if not said:
                log.warning("%s at %s:%s not reachable yet (%s); retrying every %g s for up to %g s", what,
                            addr[0], addr[1], exc.strerror or exc, interval_s, timeout_s)
                said = True
            time.sleep(interval_s)


def pump(
    peers: list[Peer],
    until: Callable[[], bool],
    *,
    timeout: float = DEFAULT_PEER_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    wake: socket.socket | Sequence[socket.socket] | None = None,
    progress: list[float] | None = None,
) -> None:
    """Run the event loop over ``peers`` until ``until()`` is true.

    Raises :class:`PeerError` if a peer closes its connection, or if nothing
    is heard from any peer for ``timeout`` seconds while waiting (a dead
    host whose TCP connection never closes). ``wake``: a socket (or several) whose
    readability ends a wait (so ``until`` is looked at again at once);
    ``progress``: the last time any loop of a :func:`pump_parallel` saw
    progress, shared, so a group whose peers are done is not taken for silent.
    """
    sel = _selector(peers, wake)
    try:
        last_progress = clock()
        while not until():
            now = clock()
            busy = False
            for p in peers:
                if p.send_data(now):
                    busy = True
            # Wait for input, a timer, or not at all while a pass is under way.
            wait = 0.0 if busy else 0.05
            if not busy:
                for p in peers:
                    t = p.sender.get_timer() if p.sender is not None and not p.sender.done else None
                    if t is not None:
                        wait = min(wait, max(WAKE_S, t - now))
            for p in peers:  # R13: nothing held while we wait (a held frame may be what the peer waits for),
                if p._cork.frames:  # but a STOP the holder releases with its next frame (the cork says which)
                    p.release_before_wait()
            if wait < SELECT_RESOLUTION_S and wait > 0.0:
                # A pacing timer closer than epoll's 1 ms resolution (it rounds a wait up): look at the
                # sockets, then sleep exactly that long (dblp.protocol.pacing: a late wake-up costs the rate).
                events = sel.select(0.0)
                if not events:
                    time.sleep(wait)
            else:
                events = sel.select(wait)
            now = clock()
            # Control first: a ROUND announcement sets the tolerance before that round's
            # datagrams are counted, so STOP comes at the threshold (as in the simulator);
            # a PROBE drains the data socket itself before it is answered (dispatch).
            for key, _ in sorted(events, key=lambda e: e[0].data[0] != "tcp"):
                kind, p = key.data
                if kind == "wake":
                    continue
                if kind == "udp":
                    p.read_data(now, clock)
                else:
                    p.read_control(now)
                    if p.closed:
                        sel.unregister(p.tcp)
                        peers[0].loop = None  # registered for a connection that closed: not reused
            for p in peers:
                p.flush()
            if events or busy:
                last_progress = now
                if progress is not None:
                    progress[0] = now
            elif progress is not None and progress[0] > last_progress:
                last_progress = progress[0]
            elif now - last_progress > timeout:
                names = ", ".join(p.name for p in peers)
                raise PeerError(f"nothing heard for {timeout:.0f} s from {names}: peer dead or path down")
    except BaseException:
        if peers:
            peers[0].drop_loop()
        raise
    finally:
        if not peers or peers[0].loop is None or peers[0].loop[1] is not sel:
            sel.close()


def _selector(peers: list[Peer], wake: "socket.socket | list[socket.socket] | None") -> selectors.BaseSelector:
    """The selector of ``pump`` over ``peers`` (and ``wake``), kept on the first peer for the next
    call with the same peers. Why: a worker pumps three times a round and the server three to
    four times; each new selector is an epoll instance and a registration per socket (~50 us of
    CPU a call) - noticeable beside a small model's round of ~1 ms."""
    key = (tuple(id(p) for p in peers), tuple(p.closed for p in peers), 0 if wake is None else tuple(map(id, [wake] if isinstance(wake, socket.socket) else wake)))
    owner = peers[0] if peers else None
    if owner is not None and owner.loop is not None and owner.loop[0] == key:
        return owner.loop[1]
    if owner is not None:
        owner.drop_loop()
    sel = selectors.DefaultSelector()
    for p in peers:
        sel.register(p.udp.sock, selectors.EVENT_READ, ("udp", p))
        if not p.closed:
            sel.register(p.tcp, selectors.EVENT_READ, ("tcp", p))
    for w in [wake] if isinstance(wake, socket.socket) else wake or ():
        sel.register(w, selectors.EVENT_READ, ("wake", None))
    if wake is None and owner is not None:  # (a parallel pump's wake socket lives for one call)
        owner.loop = (key, sel)
    return sel


_LOOP_THREADS = 64  # helper loops kept at most (a server's --threads is at most 64)
_loops: ThreadPoolExecutor | None = None
_loops_lock = threading.Lock()


def _loop_pool() -> ThreadPoolExecutor:
    """The helper threads of :func:`pump_parallel`, kept for the process's life: a server pumps a
    few times per round (upstream, broadcast, the sharded norm exchange), and starting its loops'
    threads anew each time cost a thread's start and first stack touch per loop and call."""
    global _loops
    with _loops_lock:
        if _loops is None:
            _loops = ThreadPoolExecutor(_LOOP_THREADS, thread_name_prefix="dblp-pump")
        return _loops


def pump_parallel(
    peers: list[Peer],
    until: Callable[[], bool],
    *,
    threads: int,
    timeout: float = DEFAULT_PEER_TIMEOUT_S,
    wake: socket.socket | None = None,
) -> None:
    """:func:`pump` over ``threads`` disjoint groups of ``peers`` at once, one thread each
    (``wake``: as :func:`pump`'s, heard by every loop).

    Why: a server's receive and send loops are C without the GIL, so one
    thread per group of workers uses more than one core. Every object a loop
    touches for data - a peer's sockets, its receiver, its sender - belongs
    to one peer and so to one thread; the broadcast encoding the senders
    share is made under its own lock (:class:`dblp.protocol.core.EncodedRound`). What several peers share (the driver's session,
    reached through ``on_message`` for HELLO-era and BYE messages) is the
    caller's to lock. Each loop stops when ``until()`` holds or another loop
    stopped (it wakes the others); the first error is raised here.
    """
    groups = [peers[i::threads] for i in range(min(threads, len(peers)))]
    if len(groups) <= 1:
        pump(peers, until, timeout=timeout, wake=wake)
        return
    rd, wr = socket.socketpair()
    rd.setblocking(False)
    wr.setblocking(False)
    stop = threading.Event()
    errors: list[BaseException] = []
    progress = [time.monotonic()]

    def done() -> bool:
        return stop.is_set() or until()

    def run(group: list[Peer]) -> None:
        try:
            pump(group, done, timeout=timeout, wake=[rd] if wake is None else [rd, wake], progress=progress)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)
        finally:
            stop.set()
            try:
                wr.send(b"x")
            except OSError:
                pass

    try:
        helpers = [_loop_pool().submit(run, g) for g in groups[1:]]
        run(groups[0])
        for f in helpers:
            f.result()
    finally:
        rd.close()
        wr.close()
    if errors:  # Ctrl-C first, whatever a loop raised as the others stopped
        raise next((e for e in errors if isinstance(e, KeyboardInterrupt)), errors[0])
