"""The parameter server's login: every worker's HELLO, CHALLENGE and AUTH, under the pre-login limits.

:class:`ServerLogin` is a base of :class:`dblp.transport.server.ParameterServer`: its accept loop takes
``cfg.workers`` logins, every handshake at once under its own deadline, refuses a connection that
says nothing, something malformed, or asks for what this server will not serve with a BYE naming
the reason, and hands the logged-in connections to the server, which builds the run's layout and
session from them. :mod:`dblp.transport.server` re-exports :class:`ServerError`.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import stat
import time
from dataclasses import dataclass

from dblp.protocol import auth
from dblp.protocol import control as ctl
from dblp.transport.forkparse import ForkParsers, ParseFailed
from dblp.transport.hostlocal import LocalSlot, LocalSlotError
from dblp.transport.sockets import FD_PAUSE_S, LOGGED_REFUSALS, accept_logins

log = logging.getLogger("dblp.transport.server")


class ServerError(RuntimeError):
    """The server cannot go on: too few workers logged in, or a round failed."""


@dataclass
class _Handshake:
    """One connection on its way in: its HELLO, then (authenticated) its AUTH, under one deadline."""

    addr: tuple
    decoder: ctl.ControlDecoder
    until: float
    hello: ctl.Hello | None = None  # set once the HELLO passed its checks
    nonce: bytes = b""  # the server's nonce of the CHALLENGE sent
    canon: bytes = b""  # the HELLO's canonical bytes, which the proofs and keys are bound to
    keys: tuple[bytes, bytes] | None = None  # the control keys (worker->server, server->worker), after AUTH
    parsing: bool = False  # a large HELLO being parsed (or waiting to be) in a forked child


_LOGGED_REFUSALS = LOGGED_REFUSALS  # refusals of one kind logged one by one; the rest are counted (ParameterServer.refused)
# A HELLO larger than this is parsed in a child forked for it (dblp.transport.forkparse: no main module re-imported, as
# spawn would). A model's HELLO is far smaller (ResNet-50's 161 tensors: ~10 KB), so a training process
# that runs the server never forks for its own workers; an attacker's HELLO below it costs the loop
# ~0.2 s at most (0.7 us per byte, measured at load 8 on 2 cores).
_INLINE_HELLO_BYTES = 256 * 1024


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


class ServerLogin:
    """The server's side of login; :class:`~dblp.transport.server.ParameterServer` holds the state it reads
    and writes (``cfg``, ``listener``, ``secret``, ``refused``, ``logged_in``, ``_local_slots``,
    ``_fd_warned``)."""

    def _login(self) -> tuple[list[tuple[socket.socket, ctl.Hello, tuple[bytes, bytes] | None]], dict | None,
                              dict[socket.socket, LocalSlot]]:
        """The accept loop of :meth:`~dblp.transport.server.ParameterServer.accept_workers`: ``cfg.workers``
        logins, in the order they completed, as (connection, HELLO, control keys or None); the run's
        tensor spec; and the host-local workers' slots by connection."""
        spec: dict | None = {"elements": self.cfg.elements} if self.cfg.elements else None
        taken: set[int] = set()
        pending: list[tuple[socket.socket, ctl.Hello, tuple[bytes, bytes] | None]] = []
        shaking: dict[socket.socket, _Handshake] = {}  # in accept order: the first is the oldest
        local: dict[socket.socket, LocalSlot] = {}
        deadline = time.monotonic() + self.cfg.accept_timeout
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ)
        parsers = ForkParsers(sel, _parse_hello, in_child=_drop_inherited_sockets)  # large HELLOs
        listener_paused_until = 0.0

        def refuse(conn: socket.socket, why: str, kind: str) -> None:
            hs = shaking.pop(conn)
            if hs.parsing:  # its HELLO's parse, queued or running, is for nothing now
                parsers.cancel(conn)
            self.refused[kind] = self.refused.get(kind, 0) + 1
            if self.refused[kind] <= _LOGGED_REFUSALS:  # a flood is counted, not logged line by line
                log.warning("connection from %s:%s refused: %s%s", hs.addr[0], hs.addr[1], why,
                            f" (further {kind!r} refusals are counted, not logged)"
                            if self.refused[kind] == _LOGGED_REFUSALS else "")
            try:  # (after AUTH the worker expects tagged frames: this one is)
                conn.send(ctl.encode(ctl.Bye(f"refused: {why}"),
                                     ctl.ControlMac(hs.keys[1]) if hs.keys else None))
            except OSError:
                pass
            sel.unregister(conn)
            conn.close()

        def shed(why: str) -> bool:
            """Let the oldest waiting login go: one that has not passed its HELLO, else any."""
            victim = next((c for c, h in shaking.items() if h.hello is None and not h.parsing),
                          next(iter(shaking), None))
            if victim is None:
                return False
            refuse(victim, f"shed: {why}", "shed")
            return True

        def take(conn: socket.socket, addr: tuple) -> None:
            shaking[conn] = _Handshake(addr, ctl.ControlDecoder(max_frame=ctl.MAX_HELLO + 1),
                                       time.monotonic() + self.cfg.handshake_timeout)
            sel.register(conn, selectors.EVENT_READ)

        def admit(conn: socket.socket, hello: ctl.Hello) -> None:
            nonlocal spec
            why = self._check_hello(hello, spec, taken)  # again: another worker may have won the id meanwhile
            if why:
                refuse(conn, why, "hello")
                return
            if hello.local:  # a worker on this host: its data path is the slot it made (dblp.transport.hostlocal)
                try:
                    local[conn] = LocalSlot.open(hello.local, int(hello.spec["elements"]))
                    self._local_slots.append(local[conn])  # closed by close(), whatever happens next
                except LocalSlotError as exc:
                    refuse(conn, f"host-local slot: {exc}", "hello")
                    return
            spec = spec or hello.spec  # only an authenticated worker fixes the tensor size
            if hello.worker >= 0:
                taken.add(hello.worker)
            keys = shaking.pop(conn).keys
            sel.unregister(conn)
            conn.setblocking(True)
            pending.append((conn, hello, keys))
            self.logged_in.append(hello.worker)

        def on_message(conn: socket.socket, msg: ctl.Message, canon: bytes | None = None) -> None:
            hs = shaking[conn]
            if hs.hello is None:  # expecting the HELLO
                why = self._check_hello(msg, spec, taken)
                if why:
                    refuse(conn, why, "hello")
                    return
                assert isinstance(msg, ctl.Hello)
                if self.secret is None:
                    if msg.nonce:
                        refuse(conn, "this server runs --insecure (the paper's unauthenticated wire); "
                                     "start the worker with --insecure too", "auth")
                    else:
                        admit(conn, msg)
                    return
                if not msg.nonce:
                    refuse(conn, "this server requires authentication: give the worker the run's secret "
                                 f"(--secret-file or ${auth.SECRET_ENV}), or run both with --insecure", "auth")
                    return
                hs.hello, hs.nonce = msg, auth.new_nonce()
                hs.canon = canon if canon is not None else ctl.canonical_hello(msg)
                proof = auth.proof(self.secret, "server", bytes.fromhex(msg.nonce), hs.nonce, hs.canon)
                try:
                    conn.sendall(ctl.encode(ctl.Challenge(hs.nonce, proof)))
                except OSError as exc:
                    refuse(conn, f"cannot send the challenge: {exc}", "hello")
                return
            if not isinstance(msg, ctl.AuthProof):  # expecting AUTH
                refuse(conn, f"expected AUTH, got {type(msg).__name__}", "auth")
                return
            assert self.secret is not None
            nonce_w = bytes.fromhex(hs.hello.nonce)
            if not auth.check_proof(self.secret, "worker", nonce_w, hs.nonce, hs.canon, msg.proof):
                refuse(conn, "authentication failed: the worker does not hold this run's secret", "auth")
                return
            hs.keys = auth.control_keys(self.secret, nonce_w, hs.nonce, hs.canon)
            admit(conn, hs.hello)

        def parsed(conn: socket.socket, answer: tuple[ctl.Message, bytes | None] | ParseFailed) -> None:
            """A HELLO parsed in a forked child: on with its handshake (if the login is still here)."""
            if conn not in shaking:  # refused meanwhile (shed, or the loop is over)
                return
            shaking[conn].parsing = False
            if isinstance(answer, ParseFailed):  # ControlError, or whatever the parse raised there
                refuse(conn, str(answer), "malformed")
                return
            on_message(conn, *answer)

        def read(conn: socket.socket) -> None:
            hs = shaking[conn]
            try:
                data = conn.recv(1 << 16)
                frames = hs.decoder.frames(data) if data else []
            except (BlockingIOError, InterruptedError):
                return
            except ctl.ControlError as exc:
                refuse(conn, f"{exc}: a first message may have at most {ctl.MAX_HELLO} bytes", "malformed")
                return
            except OSError as exc:
                refuse(conn, str(exc), "closed")
                return
            if not data:
                refuse(conn, "closed during its handshake", "closed")
                return
            for t, body in frames:
                if conn not in shaking or len(pending) >= self.cfg.workers:
                    return
                if hs.parsing:
                    refuse(conn, "sent another message before its HELLO was answered", "malformed")
                    return
                if t == 1 and len(body) > _INLINE_HELLO_BYTES and hs.hello is None:
                    hs.parsing = True  # a process, not a thread: a parse holds no lock the loop needs (the GIL)
                    parsers.submit(conn, body)
                    continue
                try:
                    msg = ctl.decode_frame(t, body)
                except ctl.ControlError as exc:
                    refuse(conn, str(exc), "malformed")
                    return
                on_message(conn, msg)
            buffered = sum(h.decoder.pending for h in shaking.values())
            if buffered > self.cfg.max_login_bytes:
                big = max(shaking, key=lambda c: shaking[c].decoder.pending)
                refuse(big, f"shed: {buffered} bytes of logins were buffered, more than the limit of "
                            f"{self.cfg.max_login_bytes}, and this connection held the most "
                            f"({shaking[big].decoder.pending})", "shed")

        ending = "the server has its workers"
        try:
            while len(pending) < self.cfg.workers:
                now = time.monotonic()
                for conn, hs in list(shaking.items()):
                    if now >= hs.until and not hs.parsing:
                        refuse(conn, f"no {'HELLO' if hs.hello is None else 'AUTH'} within "
                                     f"{self.cfg.handshake_timeout:g} s", "timeout")
                if now >= deadline:
                    raise ServerError(f"only {len(pending)} of {self.cfg.workers} workers connected "
                                      f"within {self.cfg.accept_timeout:.0f} s")
                if listener_paused_until and now >= listener_paused_until:
                    sel.register(self.listener, selectors.EVENT_READ)
                    listener_paused_until = 0.0
                wake = min([deadline, *(hs.until for hs in shaking.values()),
                            *([listener_paused_until] if listener_paused_until else [])])
                events = sel.select(max(0.0, wake - now))
                # the logins first: a worker whose HELLO is in is served before more are accepted
                for key, _ in sorted(events, key=lambda e: e[0].fileobj is self.listener):
                    if len(pending) >= self.cfg.workers:
                        break
                    if parsers.owns(key.fileobj):
                        answered = parsers.on_ready(key.fileobj)  # type: ignore[arg-type]
                        if answered is not None:
                            parsed(*answered)  # type: ignore[arg-type]
                    elif key.fileobj is self.listener:
                        if accept_logins(self.listener, lambda: len(shaking), self.cfg.max_pending, take, shed):
                            if not self._fd_warned:
                                log.warning("out of file descriptors with no login to let go: accepting "
                                            "again in %g s", FD_PAUSE_S)
                                self._fd_warned = True
                            sel.unregister(self.listener)
                            listener_paused_until = time.monotonic() + FD_PAUSE_S
                    elif key.fileobj in shaking:  # (not refused or admitted earlier in this batch)
                        read(key.fileobj)
        except BaseException as exc:
            ending = f"the server stopped before this login completed ({type(exc).__name__}: {exc})"
            raise
        finally:
            parsers.close()  # the parses still queued or running are of logins that no longer matter (first:
            for conn in list(shaking):  # refusing them one by one would start each queued parse to kill it)
                refuse(conn, ending, "late")
            sel.close()
            if sum(self.refused.values()) > _LOGGED_REFUSALS:
                log.warning("refused %d connections before login: %s", sum(self.refused.values()),
                            ", ".join(f"{k} {v}" for k, v in sorted(self.refused.items())))
            self.listener.setblocking(True)
        return pending, spec, local

    def _check_hello(self, hello: ctl.Message, spec: dict | None, taken: set[int]) -> str | None:
        """Why this HELLO is refused, or None."""
        if not isinstance(hello, ctl.Hello):
            return f"expected HELLO, got {type(hello).__name__}"
        if hello.version != ctl.PROTOCOL_VERSION:
            return f"protocol version {hello.version}, this server speaks {ctl.PROTOCOL_VERSION}"
        n = hello.spec["elements"]
        if spec is not None and n != spec["elements"]:
            return f"tensor of {n:,} elements; this run's tensor has {spec['elements']:,}"
        if spec is None:
            need = (self.cfg.workers + 2) * n * 4  # a receive buffer per worker, the mean, its encoding
            limit = self.cfg.max_memory_bytes or _memory_limit()
            if need > limit:
                return (f"a tensor of {n:,} elements needs {need / 2**30:.1f} GiB on the server, more than its "
                        f"limit of {limit / 2**30:.1f} GiB (give the server the tensor size, or a larger limit)")
        w = hello.worker
        if w >= self.cfg.workers:
            return f"worker id {w} is out of range: this run has workers 0..{self.cfg.workers - 1}"
        if w in taken:
            return f"worker id {w} is taken by another worker"
        return None


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
