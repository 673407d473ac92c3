"""Control messages of the reliable (TCP) channel, and their framing.

Every frame is ``u32 length | u8 type | body`` (big-endian), where length
counts the type byte and the body. The decoder is sans-I/O: feed it bytes as
they arrive, take whole messages out. A frame that cannot be decoded is a
protocol error on a connection from the registered peer, so it raises
:class:`ControlError` and the transport closes the connection with a message.

Message types (paper section III-A: probe, bitmap, stop; section IV-A: the
one-time metadata exchange):

======  =========  ==========================================================
type    name       body
======  =========  ==========================================================
1       HELLO      UTF-8 JSON: worker, udp_port, version, tensor spec
2       META       UTF-8 JSON object (run id, layout, tensor names/shapes...)
3       ROUND      round u32, direction u8, clr u8, tolerance f64
4       PROBE      round u32, direction u8, pass u32
5       BITMAP     round u32, direction u8, received u32, packed bits
6       STOP       round u32, direction u8, received u32
7       BYE        UTF-8 reason
8       HELD       round u32, packed bits: the broadcast chunks a worker kept
9       COMMON     round u32, packed bits: the chunks every worker kept
10      CHALLENGE  server nonce (16 bytes), server proof (32 bytes)
11      AUTH       worker proof (32 bytes)
12      LOCAL      round u32, direction u8: a pass of the whole tensor is in the
                   host-local slot (:mod:`dblp.hostlocal`, the sharded mode)
======  =========  ==========================================================

CHALLENGE and AUTH are the authenticated handshake (:mod:`dblp.auth`): the
HELLO carries the worker's nonce (``nonce``, 32 hex digits; absent on the
``--insecure`` wire), the server answers CHALLENGE, the worker AUTH, and
only then does the server count the worker and send META.

HELD and COMMON exist only in the ``intersect`` consistency mode
(:mod:`dblp.session`, rule S7), beyond the paper.

``direction`` is 0 for worker-to-server ("up") and 1 for the broadcast
("down"). ROUND announces a round and its loss tolerance; the server always
decides the tolerance (Algorithm 3), whichever side receives.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Union

import numpy as np

from .hostlocal import PATH_RE as LOCAL_PATH_RE

UP = 0
DOWN = 1
MAX_FRAME = 64 * 1024 * 1024  # a bitmap of 500M chunks; anything larger is garbage
PROTOCOL_VERSION = 1
# The server's TCP control port (its UDP data port has the same number) unless told otherwise:
# away from torch.distributed's 29500, so a torchrun job and its DBLP server can share a host.
DEFAULT_PORT = 29600
MAX_HELLO = 4 * 1024 * 1024  # tensor names and shapes of the largest models fit in far less
MAX_ELEMENTS = (1 << 32) * 362  # the wire's u32 chunk index at the largest payload


class ControlError(Exception):
    """The control stream carried something that is not a valid frame."""


@dataclass(frozen=True)
class Hello:
    worker: int  # requested id, or -1 to let the server assign one
    udp_port: int
    spec: dict  # {"names": [...], "shapes": [[...], ...], "elements": n}
    version: int = PROTOCOL_VERSION
    nonce: str = ""  # the worker's challenge to the server (32 hex digits); "" on the insecure wire
    local: str = ""  # the host-local slot's path (dblp.hostlocal): the data path to a server on this host


@dataclass(frozen=True)
class Meta:
    info: dict


@dataclass(frozen=True)
class RoundStart:
    round: int
    direction: int
    tolerance: float
    clr: bool = False


@dataclass(frozen=True)
class Probe:
    round: int
    direction: int
    pass_no: int


@dataclass(frozen=True)
class Bitmap:
    round: int
    direction: int
    received: int
    bits: bytes  # np.packbits of the received-chunk mask

    def mask(self, chunks: int) -> np.ndarray:
        return _unpack(self.bits, chunks)


@dataclass(frozen=True)
class Stop:
    round: int
    direction: int
    received: int


@dataclass(frozen=True)
class Bye:
    reason: str


@dataclass(frozen=True)
class Challenge:
    """Server -> worker: the server's nonce, and its proof of the secret (:func:`dblp.auth.proof`)."""

    nonce: bytes
    proof: bytes


@dataclass(frozen=True)
class AuthProof:
    """Worker -> server: the worker's proof of the secret, bound to both nonces and its HELLO."""

    proof: bytes


@dataclass(frozen=True)
class Held:
    """Worker -> server: the chunks of round ``round``'s broadcast this worker received."""

    round: int
    bits: bytes

    def mask(self, chunks: int) -> np.ndarray:
        return _unpack(self.bits, chunks)


@dataclass(frozen=True)
class Common:
    """Server -> workers: the chunks of round ``round``'s broadcast every live worker received."""

    round: int
    bits: bytes

    def mask(self, chunks: int) -> np.ndarray:
        return _unpack(self.bits, chunks)


@dataclass(frozen=True)
class Local:
    """Either side: a pass of round ``round``, direction ``direction``, is in the host-local slot."""

    round: int
    direction: int


def _unpack(bits: bytes, chunks: int) -> np.ndarray:
    b = np.frombuffer(bits, dtype=np.uint8)
    if b.size * 8 < chunks:
        raise ControlError(f"bitmap has {b.size * 8} bits for {chunks} chunks")
    return np.unpackbits(b, count=chunks).view(bool)  # 0/1 bytes: a view, not a copy


Message = Union[Hello, Meta, RoundStart, Probe, Bitmap, Stop, Bye, Held, Common, Challenge, AuthProof, Local]
NONCE_BYTES = 16
PROOF_BYTES = 32

_ROUND = struct.Struct("!IBBd")
_PROBE = struct.Struct("!IBI")
_BITMAP = struct.Struct("!IBI")
_STOP = struct.Struct("!IBI")
_FRAME = struct.Struct("!IB")
_ROUND_NO = struct.Struct("!I")
_LOCAL = struct.Struct("!IB")


def encode(msg: Message) -> bytes:
    if isinstance(msg, Hello):
        d = {"worker": msg.worker, "udp_port": msg.udp_port, "spec": msg.spec, "version": msg.version}
        if msg.nonce:
            d["nonce"] = msg.nonce
        if msg.local:
            d["local"] = msg.local
        t, body = 1, json.dumps(d).encode()
    elif isinstance(msg, Meta):
        t, body = 2, json.dumps(msg.info).encode()
    elif isinstance(msg, RoundStart):
        t, body = 3, _ROUND.pack(msg.round, msg.direction, int(msg.clr), msg.tolerance)
    elif isinstance(msg, Probe):
        t, body = 4, _PROBE.pack(msg.round, msg.direction, msg.pass_no)
    elif isinstance(msg, Bitmap):
        t, body = 5, _BITMAP.pack(msg.round, msg.direction, msg.received) + msg.bits
    elif isinstance(msg, Stop):
        t, body = 6, _STOP.pack(msg.round, msg.direction, msg.received)
    elif isinstance(msg, Bye):
        t, body = 7, msg.reason.encode()
    elif isinstance(msg, Held):
        t, body = 8, _ROUND_NO.pack(msg.round) + msg.bits
    elif isinstance(msg, Common):
        t, body = 9, _ROUND_NO.pack(msg.round) + msg.bits
    elif isinstance(msg, Challenge):
        t, body = 10, msg.nonce + msg.proof
    elif isinstance(msg, AuthProof):
        t, body = 11, msg.proof
    elif isinstance(msg, Local):
        t, body = 12, _LOCAL.pack(msg.round, msg.direction)
    else:  # pragma: no cover - programming error
        raise TypeError(f"not a control message: {msg!r}")
    return _FRAME.pack(len(body) + 1, t) + body


def _decode_body(t: int, body: bytes) -> Message:
    try:
        if t == 1:
            if len(body) > MAX_HELLO:
                raise ControlError(f"HELLO of {len(body)} bytes, more than {MAX_HELLO}")
            return _hello(json.loads(body.decode()))
        if t == 2:
            info = json.loads(body.decode())
            if not isinstance(info, dict):
                raise ControlError("META body is not a JSON object")
            return Meta(info)
        if t == 3:
            r, d, clr, tol = _ROUND.unpack(body)
            return RoundStart(r, d, tol, bool(clr))
        if t == 4:
            return Probe(*_PROBE.unpack(body))
        if t == 5:
            r, d, n = _BITMAP.unpack_from(body)
            return Bitmap(r, d, n, bytes(body[_BITMAP.size :]))
        if t == 6:
            return Stop(*_STOP.unpack(body))
        if t == 7:
            return Bye(body.decode(errors="replace"))
        if t in (8, 9):
            (r,) = _ROUND_NO.unpack_from(body)
            return (Held if t == 8 else Common)(r, bytes(body[_ROUND_NO.size :]))
        if t == 10:
            if len(body) != NONCE_BYTES + PROOF_BYTES:
                raise ControlError(f"CHALLENGE of {len(body)} bytes, expected {NONCE_BYTES + PROOF_BYTES}")
            return Challenge(bytes(body[:NONCE_BYTES]), bytes(body[NONCE_BYTES:]))
        if t == 11:
            if len(body) != PROOF_BYTES:
                raise ControlError(f"AUTH of {len(body)} bytes, expected {PROOF_BYTES}")
            return AuthProof(bytes(body))
        if t == 12:
            return Local(*_LOCAL.unpack(body))
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ControlError(f"malformed control message of type {t}: {exc}") from exc
    raise ControlError(f"unknown control message type {t}")


def _int(d: dict, key: str, lo: int, hi: int, what: str) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:  # bool, float and str are refused, not coerced
        raise ControlError(f"HELLO {what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _hello(d: object) -> Hello:
    """A HELLO with strict types: what a worker claims is checked before the server uses it."""
    if not isinstance(d, dict):
        raise ControlError("HELLO body is not a JSON object")
    spec = d.get("spec")
    if not isinstance(spec, dict):
        raise ControlError(f"HELLO spec must be an object, got {spec!r}")
    elements = _int(spec, "elements", 1, MAX_ELEMENTS, "spec.elements")
    names, shapes = spec.get("names", []), spec.get("shapes", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ControlError("HELLO spec.names must be a list of strings")
    if not isinstance(shapes, list) or not all(
            isinstance(sh, list) and all(type(x) is int and x >= 0 for x in sh) for sh in shapes):
        raise ControlError("HELLO spec.shapes must be a list of lists of non-negative integers")
    if shapes and sum(int(np.prod(sh)) for sh in shapes) != elements:
        raise ControlError(f"HELLO spec.shapes hold {sum(int(np.prod(sh)) for sh in shapes)} elements, "
                           f"spec.elements says {elements}")
    nonce = d.get("nonce", "")
    if not isinstance(nonce, str) or (nonce and (len(nonce) != 2 * NONCE_BYTES
                                                 or any(c not in "0123456789abcdef" for c in nonce))):
        raise ControlError(f"HELLO nonce must be {2 * NONCE_BYTES} lower-case hex digits, got {nonce!r}")
    local = d.get("local", "")
    if not isinstance(local, str) or (local and not LOCAL_PATH_RE.fullmatch(local)):
        raise ControlError(f"HELLO local must be a host-local slot's path, got {local!r}")
    return Hello(_int(d, "worker", -1, 65534, "worker"), _int(d, "udp_port", 1, 65535, "udp_port"),
                 {"elements": elements, "names": names, "shapes": shapes},
                 _int(d, "version", 0, 1 << 16, "version"), nonce, local)


def canonical_hello(hello: Hello) -> bytes:
    """The HELLO's bytes as the server reads it (its spec normalised by the strict parser): what
    both sides bind the handshake's proofs to, whatever key order the worker's JSON had."""
    d = json.loads(encode(hello)[_FRAME.size :].decode())
    return encode(_hello(d))


class ControlDecoder:
    """Accumulates stream bytes and yields whole messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= _FRAME.size:
            length, t = _FRAME.unpack_from(self._buf)
            if length < 1 or length > MAX_FRAME:
                raise ControlError(f"control frame length {length} out of range")
            if len(self._buf) < 4 + length:
                break
            body = bytes(self._buf[_FRAME.size : 4 + length])
            del self._buf[: 4 + length]
            out.append(_decode_body(t, body))
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)
