"""The one accept loop: a listening socket driving the sans-I/O login (:mod:`dblp.protocol.login`).

:class:`AcceptLoop` takes connections, moves their bytes into a :class:`~dblp.protocol.login.LoginGate`
and carries out its actions (send, refuse with a BYE, hand a large HELLO to a forked parser, admit)
until the gate has its logins; what the login rules are is the gate's, what a listener does with a
login and how it speaks of a refusal is its subclass's. Two listeners use it: the parameter
server's control port (:class:`ServerLogin`, a base of :class:`dblp.transport.server.ParameterServer`:
every shard server is one) and the norm hub (:class:`dblp.transport.shard.NormExchange`).

Here too are the limits' defaults (the server's flags start from them) and what only a socket has:
the listen backlog, the accept batch, surviving EMFILE, the forked parse of a large HELLO.
:mod:`dblp.transport.server` re-exports :class:`ServerError`.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import stat
import time
from typing import Hashable

from dblp.protocol import control as ctl
from dblp.protocol.login import (Action, Drop, LoginGate, Parse, Refuse, Send, ShardVerified, WorkerGate,
                                 WorkerVerified)
from dblp.transport.forkparse import ForkParsers, ParseFailed
from dblp.transport.hostlocal import LocalSlot, LocalSlotError
from dblp.transport.udp import family_of

log = logging.getLogger("dblp.transport.server")

# -- the defaults of the limits before login (dblp.protocol.login L1) and what a listening socket needs ------
MAX_PENDING = 64  # connections in their login at once; one more lets the oldest go
LOGGED_REFUSALS = 20  # refusals logged one by one (per kind); the rest are counted: a flood is no log flood
LISTEN_BACKLOG = 1024  # connections the kernel queues before accept (a flood must not drop a worker's SYN)
ACCEPT_BATCH = 16  # connections taken per wake, so the accepted ones are read before more are taken
_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
FD_PAUSE_S = 0.05  # out of descriptors with no login to let go: the listener is ignored this long
# A HELLO larger than this is parsed in a child forked for it (dblp.transport.forkparse: no main module re-imported, as
# spawn would). A model's HELLO is far smaller (ResNet-50's 161 tensors: ~10 KB), so a training process
# that runs the server never forks for its own workers; an attacker's HELLO below it costs the loop
# ~0.2 s at most (0.7 us per byte, measured at load 8 on 2 cores).
_INLINE_HELLO_BYTES = 256 * 1024


class ServerError(RuntimeError):
    """The server cannot go on: too few workers logged in, or a round failed."""


def listen(addr: tuple[str, int]) -> socket.socket:
    """A listening TCP socket on ``addr`` (port 0: any free one), its backlog deep enough that a
    flood does not drop a worker's SYN."""
    return socket.create_server(addr, family=family_of(addr[0]), backlog=LISTEN_BACKLOG)


def _parse_hello(body: bytes) -> tuple[ctl.Message, bytes | None]:
    """A HELLO frame's message and canonical bytes (a forked child's work, dblp.transport.forkparse: up to ~0.5 s for a
    4 MiB HELLO of the most tensors, which would otherwise stall every other login)."""
    msg = ctl.decode_frame(1, body)
    return msg, ctl.canonical_hello(msg) if isinstance(msg, ctl.Hello) else None


def _drop_inherited_sockets() -> None:
    """A parse child (forked from the server) closes the sockets it inherited: a connection the
    server closes must close, and the listening port must go with the server."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                os.close(int(name))
        except OSError:
            pass


class AcceptLoop:
    """Drives ``gate`` over ``listener`` until the gate has its logins (:meth:`run`).

    A subclass says what a verified login becomes (:meth:`check`, :meth:`admitted`), how a refusal
    is counted and logged (:meth:`count`, :meth:`summary`), what ends the wait (:meth:`overdue`)
    and what the logins still waiting are told (:meth:`ending`). ``parse_large``: HELLOs the gate
    hands out (:class:`~dblp.protocol.login.Parse`) are parsed in forked children."""

    def __init__(self, listener: socket.socket, gate: LoginGate, *, parse_large: bool = False) -> None:
        self.listener, self.gate, self.parse_large = listener, gate, parse_large
        self._sel: selectors.BaseSelector | None = None
        self._parsers: ForkParsers | None = None
        self._open: set[socket.socket] = set()

    def run(self) -> None:
        gate, listener = self.gate, self.listener
        sel = self._sel = selectors.DefaultSelector()
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ)
        if self.parse_large:
            self._parsers = ForkParsers(sel, _parse_hello, in_child=_drop_inherited_sockets)
        paused_until = 0.0
        failure: BaseException | None = None
        try:
            while not gate.done:
                now = time.monotonic()
                self._do(gate.expire(now))
                why = gate.overdue(now)
                if why is not None:
                    raise self.overdue(why)
                if paused_until and now >= paused_until:
                    sel.register(listener, selectors.EVENT_READ)
                    paused_until = 0.0
                wake = min(gate.wake(), paused_until or float("inf"))
                events = sel.select(max(0.0, wake - now))
                # the logins first: a worker whose HELLO is in is served before more are accepted
                for key, _ in sorted(events, key=lambda e: e[0].fileobj is listener):
                    if gate.done:
                        break
                    obj = key.fileobj
                    if self._parsers is not None and self._parsers.owns(obj):
                        answered = self._parsers.on_ready(obj)  # type: ignore[arg-type]
                        if answered is not None:
                            self._parsed(*answered)
                    elif obj is listener:
                        if self._accept():
                            self.out_of_fds()
                            sel.unregister(listener)
                            paused_until = time.monotonic() + FD_PAUSE_S
                    elif obj in self._open:  # (not refused or admitted earlier in this batch)
                        self._read(obj)  # type: ignore[arg-type]
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if self._parsers is not None:  # the parses still queued or running are of logins that no longer
                self._parsers.close()  # matter (first: refusing them one by one would start each queued parse)
                self._parsers = None
            self._do(gate.close(self.ending(failure)))
            sel.close()
            self.summary()
            listener.setblocking(True)

    # -- what a listener decides ------------------------------------------------------------------
    def check(self, conn: socket.socket, event: WorkerVerified | ShardVerified) -> tuple[str, str] | None:
        """The listener's own refusal of a verified login, (reason, kind), or None to admit it."""
        return None

    def admitted(self, conn: socket.socket, event: WorkerVerified | ShardVerified) -> None:
        raise NotImplementedError

    def count(self, refusal: Refuse) -> None:
        raise NotImplementedError

    def summary(self) -> None:
        """Said once the loop ends (a flood's count)."""

    def overdue(self, why: str) -> BaseException:
        raise NotImplementedError

    def ending(self, failure: BaseException | None) -> str:
        raise NotImplementedError

    def out_of_fds(self) -> None:
        """The listener is paused for want of descriptors, with no login to let go."""

    # -- the socket side ----------------------------------------------------------------------------
    def _accept(self) -> bool:
        """Take up to :data:`ACCEPT_BATCH` new connections. When an accept fails for want of
        descriptors (EMFILE, ENFILE: a flood under the usual 1024 limit) the gate lets its oldest
        login go; True when there is none to let go: the listener is left alone for
        :data:`FD_PAUSE_S` (the kernel keeps the connection queued, and retrying at once would spin)."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                break
            except OSError as exc:
                if exc.errno not in _FD_ERRNOS:
                    raise
                shed = self.gate.shed(f"the server ran out of file descriptors ({exc.strerror}) and let the "
                                      f"oldest waiting login go")
                if not shed:
                    return True
                self._do(shed)
                continue
            conn.setblocking(False)
            self._open.add(conn)
            assert self._sel is not None
            self._sel.register(conn, selectors.EVENT_READ)
            self._do(self.gate.connect(conn, addr, time.monotonic()))
        return False

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(self.gate.wants(conn))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._do(self.gate.failed(conn, str(exc)))
            return
        self._do(self.gate.receive(conn, data))

    def _parsed(self, conn: Hashable, answer: tuple[ctl.Message, bytes | None] | ParseFailed) -> None:
        """A HELLO parsed in a forked child: on with its login (if it is still here)."""
        gate = self.gate
        assert isinstance(gate, WorkerGate)
        if isinstance(answer, ParseFailed):  # ControlError, or whatever the parse raised there
            self._do(gate.unparsed(conn, str(answer)))
        else:
            self._do(gate.parsed(conn, *answer))

    def _do(self, actions: list[Action]) -> None:
        for a in actions:
            conn = a.key
            assert isinstance(conn, socket.socket)
            if isinstance(a, Send):
                try:
                    conn.sendall(a.data)
                except OSError as exc:
                    self._do(self.gate.unsent(conn, str(exc)))
            elif isinstance(a, Refuse):
                if a.parsing and self._parsers is not None:  # its HELLO's parse, queued or running, is for nothing
                    self._parsers.cancel(conn)
                self.count(a)
                if a.farewell:
                    try:
                        conn.send(a.farewell)
                    except OSError:
                        pass
                self._close(conn)
            elif isinstance(a, Drop):
                self._close(conn)
            elif isinstance(a, Parse):
                assert self._parsers is not None
                self._parsers.submit(conn, a.body)  # a process, not a thread: it holds no lock the loop needs
            else:  # verified
                refusal = self.check(conn, a)
                if refusal is not None:
                    self._do(self.gate.refuse(conn, *refusal))
                    continue
                self.gate.admit(conn)
                assert self._sel is not None
                self._sel.unregister(conn)
                self._open.discard(conn)
                conn.setblocking(True)
                self.admitted(conn, a)

    def _close(self, conn: socket.socket) -> None:
        if conn in self._open:
            self._open.discard(conn)
            assert self._sel is not None
            self._sel.unregister(conn)
        conn.close()


class _WorkerDoor(AcceptLoop):
    """The parameter server's control port: its refusals counted by kind in ``server.refused``."""

    def __init__(self, server: "ServerLogin", gate: WorkerGate) -> None:
        super().__init__(server.listener, gate, parse_large=True)
        self.server = server
        self.pending: list[tuple[socket.socket, ctl.Hello, tuple[bytes, bytes] | None]] = []
        self.local: dict[socket.socket, LocalSlot] = {}

    def check(self, conn: socket.socket, event: WorkerVerified | ShardVerified) -> tuple[str, str] | None:
        assert isinstance(event, WorkerVerified)
        if event.hello.local:  # a worker on this host: its data path is the slot it made (dblp.transport.hostlocal)
            try:
                self.local[conn] = LocalSlot.open(event.hello.local, int(event.hello.spec["elements"]))
            except LocalSlotError as exc:
                return f"host-local slot: {exc}", "hello"
            self.server._local_slots.append(self.local[conn])  # closed by close(), whatever happens next
        return None

    def admitted(self, conn: socket.socket, event: WorkerVerified | ShardVerified) -> None:
        assert isinstance(event, WorkerVerified)
        self.pending.append((conn, event.hello, event.keys))
        self.server.logged_in.append(event.hello.worker)

    def count(self, refusal: Refuse) -> None:
        refused = self.server.refused
        refused[refusal.kind] = refused.get(refusal.kind, 0) + 1
        if refused[refusal.kind] <= LOGGED_REFUSALS:  # a flood is counted, not logged line by line
            log.warning("connection from %s:%s refused: %s%s", refusal.addr[0], refusal.addr[1], refusal.why,
                        f" (further {refusal.kind!r} refusals are counted, not logged)"
                        if refused[refusal.kind] == LOGGED_REFUSALS else "")

    def summary(self) -> None:
        refused = self.server.refused
        if sum(refused.values()) > LOGGED_REFUSALS:
            log.warning("refused %d connections before login: %s", sum(refused.values()),
                        ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))

    def overdue(self, why: str) -> BaseException:
        return ServerError(why)

    def ending(self, failure: BaseException | None) -> str:
        if failure is None:
            return "the server has its workers"
        return f"the server stopped before this login completed ({type(failure).__name__}: {failure})"

    def out_of_fds(self) -> None:
        if not self.server._fd_warned:
            log.warning("out of file descriptors with no login to let go: accepting again in %g s", FD_PAUSE_S)
            self.server._fd_warned = True


class ServerLogin:
    """The server's side of login; :class:`~dblp.transport.server.ParameterServer` holds the state it reads
    and writes (``cfg``, ``listener``, ``secret``, ``refused``, ``logged_in``, ``_local_slots``,
    ``_fd_warned``)."""

    def _login(self) -> tuple[list[tuple[socket.socket, ctl.Hello, tuple[bytes, bytes] | None]], dict | None,
                              dict[socket.socket, LocalSlot]]:
        """The accept loop of :meth:`~dblp.transport.server.ParameterServer.accept_workers`: ``cfg.workers``
        logins, in the order they completed, as (connection, HELLO, control keys or None); the run's
        tensor spec; and the host-local workers' slots by connection."""
        cfg = self.cfg  # type: ignore[attr-defined]
        memory = cfg.max_memory_bytes or (_memory_limit() if not cfg.elements else 0)
        gate = WorkerGate(cfg.workers, self.secret, timeout=cfg.handshake_timeout,  # type: ignore[attr-defined]
                          accept_timeout=cfg.accept_timeout, now=time.monotonic(), max_pending=cfg.max_pending,
                          max_buffered=cfg.max_login_bytes, elements=cfg.elements, memory_limit=memory,
                          parse_above=_INLINE_HELLO_BYTES)
        door = _WorkerDoor(self, gate)
        door.run()
        return door.pending, gate.spec, door.local


def _memory_limit() -> int:
    """Half of the memory available now: a HELLO may not make the server take more."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 8 << 30
