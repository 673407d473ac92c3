"""The login of every listener, sans-I/O: a worker's at a parameter server (every shard server is
one) and a shard server's at the norm hub.

Events go in - a connection accepted, its bytes, its end, a HELLO parsed elsewhere - and actions
come out: bytes to send, a refusal with its reason, a login verified, a HELLO to parse in another
process. There are no sockets here and no clock: every call that starts or ends a deadline is
given ``now``, so a test (or a simulator) decides what time it is. :mod:`dblp.transport.login`
drives it over a listening socket. Why one machine: the server, every shard server and the norm
hub apply the same limits before login, so a flood is met the same way at every port.

The rules, each stated once here (the refusal's kind in parentheses; kinds count refusals, so a
flood need not log a line per connection):

L1  Limits before login. At most ``max_pending`` logins at once: one more lets the oldest go -
    the oldest that has not passed its HELLO (and is not being parsed), else the oldest (``shed``).
    Each login has ``timeout`` seconds from its accept, paused while its HELLO is parsed
    (``timeout``). A worker's first frame may have at most :data:`~dblp.protocol.control.MAX_HELLO`
    bytes, refused on its 5-byte header before its body is buffered (``malformed``); the bytes
    buffered over all logins may not pass ``max_buffered``: the login holding the most goes
    (``shed``). All logins must be in ``accept_timeout`` seconds (:meth:`LoginGate.overdue`).
L2  The HELLO. A worker's first frame is a HELLO (``hello``), checked in this order: its kind,
    its version (:data:`~dblp.protocol.control.PROTOCOL_VERSION`), its tensor (the run's size once
    fixed; before, the memory the server would need for it: ``(workers + 2) * elements * 4`` bytes
    within ``memory_limit``), its worker id (in range, not taken). A malformed frame is
    ``malformed``; one more frame while the HELLO is being parsed, too.
L3  The wire. A server without a secret (``--insecure``) admits a HELLO without a nonce and
    refuses one with; a server with a secret refuses a HELLO without a nonce (``auth``).
L4  The proofs. A HELLO with a nonce is answered by a CHALLENGE: the server's nonce and its proof
    (:func:`dblp.protocol.auth.proof`, role "server"); the next frame must be an AUTH whose proof
    (role "worker") verifies (``auth``). Both proofs are bound to the HELLO's canonical bytes, and
    so are the connection's control keys (:func:`dblp.protocol.auth.control_keys`).
L5  Admission. A verified HELLO is checked again when it is verified (another worker may have
    taken its id meanwhile); the driver may still refuse it for its own reason (a host-local slot
    it cannot open) before it calls :meth:`LoginGate.admit`. The first admitted fixes the run's
    tensor unless the server was given one. Ids: :func:`assign_ids`.
L6  The norm hub. A shard server's connection is sent a fresh nonce on accept and introduces
    itself with one norm message of round 0 tagged under it (:func:`encode_norm`,
    :func:`dblp.protocol.auth.norm_tag`), as a shard in 1..k-1 not yet taken (``auth``, ``hello``).
L7  Every refusal names its reason. A worker is told it in a BYE "refused: <reason>", tagged under
    the server's control key once AUTH passed; a shard server's connection is closed. A login
    that closes is ``closed``; logins still waiting when the listener stops are ``late``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, Hashable, Union

from dblp.protocol import auth
from dblp.protocol import control as ctl

READ_BYTES = 1 << 16  # a worker's login takes its bytes in pieces of at most this


# -- the norm exchange's message (its first is a shard server's introduction, L6) -------------------
_NORM = struct.Struct("!IHd")  # round, shard, squared norm (peer -> hub) or total (hub -> peer)
#: one message of the norm exchange on the wire (the simulator prices its control frames by it)
NORM_MESSAGE_BYTES = _NORM.size + auth.TAG_BYTES


class NormMessageError(ValueError):
    """A norm message that is not this run's, of this round, or a non-negative number; says which."""


def encode_norm(secret: bytes | None, nonce: bytes, round_no: int, shard: int, value: float,
                from_hub: bool) -> bytes:
    """One norm message: round (mod 2^32), shard, value, and its tag under the connection's nonce."""
    body = _NORM.pack(round_no & 0xFFFFFFFF, shard, value)
    return body + auth.norm_tag(secret, nonce, body, from_hub)


def decode_norm(secret: bytes | None, nonce: bytes, data: bytes, round_no: int,
                from_hub: bool) -> tuple[int, float]:
    """(shard, value) of one norm message sent by the hub (``from_hub``) or a peer; refused unless
    tagged by this run, of round ``round_no``, finite and non-negative."""
    body, tag = data[:_NORM.size], data[_NORM.size:]
    if not auth.check_norm_tag(secret, nonce, body, from_hub, tag):
        raise NormMessageError("a norm message without this run's tag (another run, or a forgery)")
    r, shard, value = _NORM.unpack(body)
    if r != round_no & 0xFFFFFFFF:
        raise NormMessageError(f"norm of round {r} while this server is at round {round_no}")
    if not math.isfinite(value) or value < 0:
        raise NormMessageError(f"squared norm {value} is not a non-negative number")
    return shard, value


# -- actions: what a driver does ----------------------------------------------------------------------
@dataclass(frozen=True)
class ConnectionAction:
    """What every action is about: one connection, named by the driver's ``key`` (its socket)."""

    key: Hashable


@dataclass(frozen=True)
class Send(ConnectionAction):
    """Write ``data`` on the connection (a CHALLENGE, the hub's nonce); a failure goes to
    :meth:`LoginGate.unsent`."""

    data: bytes


@dataclass(frozen=True)
class Refuse(ConnectionAction):
    """Write ``farewell`` (at most once, best effort), close the connection, count it under ``kind``."""

    addr: tuple
    why: str
    kind: str
    farewell: bytes = b""
    parsing: bool = False  # its HELLO was handed out to be parsed: that parse is for nothing now


@dataclass(frozen=True)
class Drop(ConnectionAction):
    """Close the connection unsaid and uncounted: it never got far enough to be refused."""


@dataclass(frozen=True)
class Parse(ConnectionAction):
    """Parse this HELLO frame body elsewhere (it is large); answer :meth:`WorkerGate.parsed` or
    :meth:`WorkerGate.unparsed`."""

    body: bytes


@dataclass(frozen=True)
class WorkerVerified(ConnectionAction):
    """A worker passed L2-L5: the driver answers :meth:`LoginGate.admit` or :meth:`LoginGate.refuse`
    before anything else. ``keys``: the control keys (worker->server, server->worker), None insecure."""

    hello: ctl.Hello
    keys: tuple[bytes, bytes] | None


@dataclass(frozen=True)
class ShardVerified(ConnectionAction):
    """A shard server introduced itself (L6); answered as :class:`WorkerVerified` is."""

    shard: int
    nonce: bytes


Action = Union[Send, Refuse, Drop, Parse, WorkerVerified, ShardVerified]


class _Login:
    """One connection on its way in."""

    def __init__(self, addr: tuple, until: float) -> None:
        self.addr, self.until = addr, until
        self.parsing = False  # its HELLO is being parsed elsewhere (its deadline waits)

    @property
    def passed(self) -> bool:
        """Past its first message (L1: shed after those that are not)."""
        return False

    @property
    def buffered(self) -> int:
        return 0


class LoginGate:
    """The logins of one listener (L1, L7); :class:`WorkerGate` and :class:`HubGate` add their
    rules. Connections are named by the driver's keys (its sockets), in accept order."""

    def __init__(self, need: int, *, timeout: float, accept_timeout: float, now: float, max_pending: int,
                 max_buffered: int | None = None) -> None:
        self.need, self.timeout, self.accept_timeout = need, timeout, accept_timeout
        self.until = now + accept_timeout
        self.max_pending, self.max_buffered = max_pending, max_buffered
        self.admitted = 0
        self._logins: dict[Hashable, _Login] = {}  # accept order: the first is the oldest
        self._verified: dict[Hashable, _Login] = {}  # waiting for the driver's admit or refuse

    @property
    def pending(self) -> int:
        """Logins in progress."""
        return len(self._logins)

    @property
    def done(self) -> bool:
        return self.admitted >= self.need

    def wake(self) -> float:
        """The next time something is due: a login's deadline (none while parsed), or the gate's."""
        return min([self.until, *(g.until for g in self._logins.values() if not g.parsing)])

    def overdue(self, now: float) -> str | None:
        """Why the listener gives up at ``now``: not all logins in ``accept_timeout`` (L1); else None."""
        return self._overdue() if now >= self.until and not self.done else None

    def wants(self, key: Hashable) -> int:
        """The most bytes the login of ``key`` takes now (a shard server's introduction: exactly
        its rest, so the next message stays in the stream)."""
        return READ_BYTES

    def connect(self, key: Hashable, addr: tuple, now: float) -> list[Action]:
        """A connection accepted at ``now`` (L1: at the cap, the oldest goes first)."""
        out: list[Action] = []
        if len(self._logins) >= self.max_pending:
            out += self.shed(f"{self.max_pending} logins were waiting (the limit) and this was the oldest")
        login = self._open(addr, now + self.timeout)
        self._logins[key] = login
        return out + self._greet(key, login)

    def receive(self, key: Hashable, data: bytes) -> list[Action]:
        """Bytes from the connection; ``b""``: it closed. (No time: a deadline is :meth:`expire`'s.)"""
        login = self._logins.get(key)
        if login is None or self.done:
            return []
        if not data:
            return self.refuse(key, self._closed_why(), "closed")
        return self._take(key, login, data)

    def failed(self, key: Hashable, why: str) -> list[Action]:
        """The connection failed (a receive error, ``why``)."""
        return self.refuse(key, why, "closed") if key in self._logins else []

    def unsent(self, key: Hashable, why: str) -> list[Action]:
        """A :class:`Send` failed (``why``)."""
        raise NotImplementedError

    def expire(self, now: float) -> list[Action]:
        """Refuse the logins whose time is up at ``now`` (L1)."""
        out: list[Action] = []
        for key, login in list(self._logins.items()):
            if now >= login.until and not login.parsing:
                out += self.refuse(key, self._timeout_why(login), "timeout")
        return out

    def shed(self, why: str) -> list[Action]:
        """Let the oldest waiting login go (L1); none to let go: no action."""
        victim = next((k for k, g in self._logins.items() if not g.passed and not g.parsing),
                      next(iter(self._logins), None))
        return [] if victim is None else self.refuse(victim, f"shed: {why}", "shed")

    def refuse(self, key: Hashable, why: str, kind: str) -> list[Action]:
        """Refuse a login in progress or verified (L7)."""
        login = self._logins.pop(key, None) or self._verified.pop(key)
        return [Refuse(key, login.addr, why, kind, self._farewell(login, why), login.parsing)]

    def admit(self, key: Hashable) -> None:
        """The driver takes the verified login of ``key`` (L5)."""
        self._admit(self._verified.pop(key))
        self.admitted += 1

    def close(self, why: str) -> list[Action]:
        """The listener stops: every login still in progress is refused (``late``)."""
        out: list[Action] = []
        for key in list(self._logins):
            out += self.refuse(key, why, "late")
        return out

    def _verify(self, key: Hashable) -> None:
        self._verified[key] = self._logins.pop(key)

    def _budget(self) -> list[Action]:
        """L1: beyond ``max_buffered`` bytes over all logins, the one holding the most goes."""
        if self.max_buffered is None or not self._logins:
            return []
        buffered = sum(g.buffered for g in self._logins.values())
        if buffered <= self.max_buffered:
            return []
        big = max(self._logins, key=lambda k: self._logins[k].buffered)
        return self.refuse(big, f"shed: {buffered} bytes of logins were buffered, more than the limit of "
                                f"{self.max_buffered}, and this connection held the most "
                                f"({self._logins[big].buffered})", "shed")

    # the rules of one kind of login
    def _open(self, addr: tuple, until: float) -> _Login:
        raise NotImplementedError

    def _greet(self, key: Hashable, login: _Login) -> list[Action]:
        return []

    def _take(self, key: Hashable, login: _Login, data: bytes) -> list[Action]:
        raise NotImplementedError

    def _admit(self, login: _Login) -> None:
        raise NotImplementedError

    def _farewell(self, login: _Login, why: str) -> bytes:
        return b""

    def _closed_why(self) -> str:
        raise NotImplementedError

    def _timeout_why(self, login: _Login) -> str:
        raise NotImplementedError

    def _overdue(self) -> str:
        raise NotImplementedError


# -- a worker's login at a parameter server (L2-L5) -------------------------------------------------
class _WorkerLogin(_Login):
    def __init__(self, addr: tuple, until: float) -> None:
        super().__init__(addr, until)
        self.decoder = ctl.ControlDecoder(max_frame=ctl.MAX_HELLO + 1)
        self.hello: ctl.Hello | None = None  # set once the HELLO passed its checks
        self.nonce = b""  # the server's nonce of the CHALLENGE sent
        self.canon = b""  # the HELLO's canonical bytes, which the proofs and keys are bound to
        self.keys: tuple[bytes, bytes] | None = None  # (worker->server, server->worker), after AUTH

    @property
    def passed(self) -> bool:
        return self.hello is not None

    @property
    def buffered(self) -> int:
        return self.decoder.pending


class WorkerGate(LoginGate):
    """The workers' logins at a parameter server (L1-L5, L7).

    ``workers``: the run's size; ``secret``: the run's (None: ``--insecure``); ``elements``: the
    tensor size the server serves (None: the first admitted HELLO's); ``memory_limit``: what a
    first HELLO may make the server take, in bytes; ``parse_above``: a HELLO frame larger than
    this is handed out to be parsed (:class:`Parse`), None: none is; ``new_nonce``: the CHALLENGE's
    nonces (a test makes them known)."""

    def __init__(self, workers: int, secret: bytes | None, *, timeout: float, accept_timeout: float, now: float,
                 max_pending: int, max_buffered: int | None = None, elements: int | None = None,
                 memory_limit: int = 8 << 30, parse_above: int | None = None,
                 new_nonce: Callable[[], bytes] = auth.new_nonce) -> None:
        super().__init__(workers, timeout=timeout, accept_timeout=accept_timeout, now=now,
                         max_pending=max_pending, max_buffered=max_buffered)
        self.secret, self.memory_limit, self.parse_above = secret, memory_limit, parse_above
        self.spec: dict | None = {"elements": elements} if elements else None
        self.taken: set[int] = set()
        self._new_nonce = new_nonce

    def check_hello(self, hello: ctl.Message) -> str | None:
        """Why this HELLO is refused now (L2), or None."""
        if not isinstance(hello, ctl.Hello):
            return f"expected HELLO, got {type(hello).__name__}"
        if hello.version != ctl.PROTOCOL_VERSION:
            return f"protocol version {hello.version}, this server speaks {ctl.PROTOCOL_VERSION}"
        n = hello.spec["elements"]
        if self.spec is not None and n != self.spec["elements"]:
            return f"tensor of {n:,} elements; this run's tensor has {self.spec['elements']:,}"
        if self.spec is None:
            need = (self.need + 2) * n * 4  # a receive buffer per worker, the mean, its encoding
            if need > self.memory_limit:
                return (f"a tensor of {n:,} elements needs {need / 2**30:.1f} GiB on the server, more than its "
                        f"limit of {self.memory_limit / 2**30:.1f} GiB (give the server the tensor size, or a "
                        f"larger limit)")
        w = hello.worker
        if w >= self.need:
            return f"worker id {w} is out of range: this run has workers 0..{self.need - 1}"
        if w in self.taken:
            return f"worker id {w} is taken by another worker"
        return None

    def parsed(self, key: Hashable, msg: ctl.Message, canon: bytes | None) -> list[Action]:
        """The answer of a :class:`Parse`: the frame's message and, for a HELLO, its canonical bytes."""
        login = self._logins.get(key)
        if login is None:  # refused meanwhile (shed, or the listener stopped)
            return []
        login.parsing = False
        return self._on_message(key, login, msg, canon)

    def unparsed(self, key: Hashable, why: str) -> list[Action]:
        """A :class:`Parse` failed: ``why`` (the parse's error)."""
        login = self._logins.get(key)
        if login is None:
            return []
        login.parsing = False
        return self.refuse(key, why, "malformed")

    def unsent(self, key: Hashable, why: str) -> list[Action]:
        return self.refuse(key, f"cannot send the challenge: {why}", "hello") if key in self._logins else []

    def _open(self, addr: tuple, until: float) -> _WorkerLogin:
        return _WorkerLogin(addr, until)

    def _take(self, key: Hashable, login: _Login, data: bytes) -> list[Action]:
        assert isinstance(login, _WorkerLogin)
        try:
            frames = login.decoder.frames(data)
        except ctl.ControlError as exc:
            return self.refuse(key, f"{exc}: a first message may have at most {ctl.MAX_HELLO} bytes", "malformed")
        out: list[Action] = []
        for t, body in frames:
            if key not in self._logins:  # refused, or verified, by an earlier frame
                break
            if login.parsing:
                return out + self.refuse(key, "sent another message before its HELLO was answered", "malformed")
            if t == 1 and login.hello is None and self.parse_above is not None and len(body) > self.parse_above:
                login.parsing = True
                out.append(Parse(key, body))
                continue
            try:
                msg = ctl.decode_frame(t, body)
            except ctl.ControlError as exc:
                return out + self.refuse(key, str(exc), "malformed")
            out += self._on_message(key, login, msg, None)
        return out + self._budget()

    def _on_message(self, key: Hashable, login: _WorkerLogin, msg: ctl.Message,
                    canon: bytes | None) -> list[Action]:
        if login.hello is None:  # expecting the HELLO (L2, L3)
            why = self.check_hello(msg)
            if why:
                return self.refuse(key, why, "hello")
            assert isinstance(msg, ctl.Hello)
            if self.secret is None:
                if msg.nonce:
                    return self.refuse(key, "this server runs --insecure (the paper's unauthenticated wire); "
                                            "start the worker with --insecure too", "auth")
                return self._verified_hello(key, login, msg)
            if not msg.nonce:
                return self.refuse(key, "this server requires authentication: give the worker the run's secret "
                                        f"(--secret-file or ${auth.SECRET_ENV}), or run both with --insecure", "auth")
            login.hello, login.nonce = msg, self._new_nonce()
            login.canon = canon if canon is not None else ctl.canonical_hello(msg)
            proof = auth.proof(self.secret, "server", bytes.fromhex(msg.nonce), login.nonce, login.canon)
            return [Send(key, ctl.encode(ctl.Challenge(login.nonce, proof)))]
        if not isinstance(msg, ctl.AuthProof):  # expecting AUTH (L4)
            return self.refuse(key, f"expected AUTH, got {type(msg).__name__}", "auth")
        assert self.secret is not None
        nonce_w = bytes.fromhex(login.hello.nonce)
        if not auth.check_proof(self.secret, "worker", nonce_w, login.nonce, login.canon, msg.proof):
            return self.refuse(key, "authentication failed: the worker does not hold this run's secret", "auth")
        login.keys = auth.control_keys(self.secret, nonce_w, login.nonce, login.canon)
        return self._verified_hello(key, login, login.hello)

    def _verified_hello(self, key: Hashable, login: _WorkerLogin, hello: ctl.Hello) -> list[Action]:
        why = self.check_hello(hello)  # again (L5): another worker may have won the id meanwhile
        if why:
            return self.refuse(key, why, "hello")
        login.hello = hello
        self._verify(key)
        return [WorkerVerified(key, hello, login.keys)]

    def _admit(self, login: _Login) -> None:
        assert isinstance(login, _WorkerLogin) and login.hello is not None
        self.spec = self.spec or login.hello.spec  # only an authenticated worker fixes the tensor size
        if login.hello.worker >= 0:
            self.taken.add(login.hello.worker)

    def _farewell(self, login: _Login, why: str) -> bytes:
        assert isinstance(login, _WorkerLogin)  # after AUTH the worker expects tagged frames: this one is
        return ctl.encode(ctl.Bye(f"refused: {why}"), ctl.ControlMac(login.keys[1]) if login.keys else None)

    def _closed_why(self) -> str:
        return "closed during its handshake"

    def _timeout_why(self, login: _Login) -> str:
        assert isinstance(login, _WorkerLogin)
        return f"no {'HELLO' if login.hello is None else 'AUTH'} within {self.timeout:g} s"

    def _overdue(self) -> str:
        return f"only {self.admitted} of {self.need} workers connected within {self.accept_timeout:.0f} s"


def assign_ids(requested: list[int], n: int) -> list[int]:
    """The ids of the admitted workers, in their order (L5): a requested id in range and not yet
    given is kept; the others get the lowest free ids, in order."""
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


# -- a shard server's login at the norm hub (L6) ---------------------------------------------------
class _ShardLogin(_Login):
    def __init__(self, addr: tuple, until: float, nonce: bytes) -> None:
        super().__init__(addr, until)
        self.nonce = nonce
        self.buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self.buf)


class HubGate(LoginGate):
    """The shard servers' logins at the norm hub (shard 0) of ``shards`` (L1, L6, L7); ``taken``:
    the shards already in (from an earlier wait)."""

    def __init__(self, shards: int, secret: bytes | None, *, timeout: float, accept_timeout: float, now: float,
                 max_pending: int, taken: set[int] | None = None,
                 new_nonce: Callable[[], bytes] = auth.new_nonce) -> None:
        self.taken = set(taken or ())
        super().__init__(shards - 1 - len(self.taken), timeout=timeout, accept_timeout=accept_timeout, now=now,
                         max_pending=max_pending)
        self.shards, self.secret = shards, secret
        self._new_nonce = new_nonce

    def wants(self, key: Hashable) -> int:
        login = self._logins[key]
        assert isinstance(login, _ShardLogin)
        return NORM_MESSAGE_BYTES - len(login.buf)

    def unsent(self, key: Hashable, why: str) -> list[Action]:
        self._logins.pop(key, None)
        return [Drop(key)]

    def _open(self, addr: tuple, until: float) -> _ShardLogin:
        return _ShardLogin(addr, until, self._new_nonce())

    def _greet(self, key: Hashable, login: _Login) -> list[Action]:
        assert isinstance(login, _ShardLogin)
        return [Send(key, login.nonce)]

    def _take(self, key: Hashable, login: _Login, data: bytes) -> list[Action]:
        assert isinstance(login, _ShardLogin)
        login.buf += data
        if len(login.buf) < NORM_MESSAGE_BYTES:
            return []
        try:
            shard, _ = decode_norm(self.secret, login.nonce, bytes(login.buf), 0, from_hub=False)
        except NormMessageError as exc:
            return self.refuse(key, f"shard peer {login.addr[0]}:{login.addr[1]}: {exc}", "auth")
        if not 0 < shard < self.shards or shard in self.taken:
            return self.refuse(key, f"introduced itself as shard {shard}, which is not a free shard of "
                                    f"{self.shards}", "hello")
        self._verify(key)
        return [ShardVerified(key, shard, login.nonce)]

    def _admit(self, login: _Login) -> None:
        assert isinstance(login, _ShardLogin)
        self.taken.add(_NORM.unpack_from(login.buf)[1])

    def _closed_why(self) -> str:
        return "closed before its introduction"

    def _timeout_why(self, login: _Login) -> str:
        return f"no introduction within {self.timeout:g} s"

    def _overdue(self) -> str:
        missing = sorted(set(range(1, self.shards)) - self.taken)
        return f"shard server(s) {missing} did not connect within {self.accept_timeout:g} s"
