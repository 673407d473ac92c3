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
3       ROUND      round u32, direction u8, clr u8, tolerance f64[, grant f64]
4       PROBE      round u32, direction u8, pass u32[, rate f64]
5       BITMAP     round u32, direction u8, received u32, packed bits
6       STOP       round u32, direction u8, received u32
7       BYE        UTF-8 reason
8       HELD       round u32, packed bits: the broadcast chunks a worker kept
9       COMMON     round u32, packed bits: the chunks every worker kept
10      CHALLENGE  server nonce (16 bytes), server proof (32 bytes)
11      AUTH       worker proof (32 bytes)
12      LOCAL      round u32, direction u8: a pass of the whole tensor is in the
                   host-local slot (:mod:`dblp.transport.hostlocal`, the sharded mode)
13      BITMAP+    round u32, direction u8, received u32, rate f64, packed bits:
                   a BITMAP that states the rate the first pass arrived at
                   (pacing rule R15; sent as type 5 when there is no rate)
======  =========  ==========================================================

CHALLENGE and AUTH are the authenticated handshake (:mod:`dblp.protocol.auth`): the
HELLO carries the worker's nonce (``nonce``, 32 hex digits; absent on the
``--insecure`` wire), the server answers CHALLENGE, the worker AUTH, and
only then does the server count the worker and send META.

After the handshake every frame, both ways, is authenticated (unless the run
is ``--insecure``): ``u32 length | u8 type | body | u64 seq | tag[16]``,
where ``seq`` counts the frames of that direction from 0 and ``tag`` is the
first 16 bytes of HMAC-SHA256(key, seq | type | body) under the connection's
key of that direction (:func:`dblp.protocol.auth.control_keys`). A frame whose tag
does not verify (``forged``), whose sequence number was used (``replayed``)
or skips ahead (``reordered``) is refused - dropped and counted by the
:class:`ControlDecoder`, never acted on; the decoder reads on with the next
frame, and the transport ends the connection as tampered with
(:class:`dblp.transport.sockets.TamperError`). Before login a frame's length is checked against the decoder's limit
(``max_frame``) as soon as its 5-byte header is in, before its body is buffered.

HELD and COMMON exist only in the ``intersect`` consistency mode
(:mod:`dblp.protocol.session`, rule S7), beyond the paper.

``direction`` is 0 for worker-to-server ("up") and 1 for the broadcast
("down"). ROUND announces a round and its loss tolerance; the server always
decides the tolerance (Algorithm 3), whichever side receives.

The bracketed trailing fields are pacing rule R12's (:mod:`dblp.protocol.pacing`, beyond the
paper): a self-pacing sender's PROBE states the rate its pass was sent at
(bit/s), and the server's ROUND(up) grants the rate every self-pacing worker
starts its upload from. Each is sent only when non-zero, so a frame without
it is the old frame, byte for byte: old peers' frames decode (the field reads
0, "not stated"), and a run that does not self-pace sends what it always did.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np

#: where host-local slots live (:mod:`dblp.transport.hostlocal` makes them) and the only names a HELLO may give one
LOCAL_DIR = Path("/dev/shm")
LOCAL_PREFIX = "dblp-local-"
LOCAL_PATH_RE = re.compile(re.escape(f"{LOCAL_DIR}/{LOCAL_PREFIX}") + r"(\d{1,10})-[0-9a-f]{32}")

UP = 0
DOWN = 1
MAX_FRAME = 64 * 1024 * 1024  # a bitmap of 500M chunks; anything larger is garbage
PROTOCOL_VERSION = 1
# The server's TCP control port (its UDP data port has the same number) unless told otherwise:
# away from torch.distributed's 29500, so a torchrun job and its DBLP server can share a host.
DEFAULT_PORT = 29600
MAX_HELLO = 4 * 1024 * 1024  # tensor names and shapes of the largest models fit in far less
# A HELLO's tensor list: the largest models have a few thousand parameter tensors. The bound keeps
# the check of a 4 MiB HELLO to a fraction of a second (a million 1-element shapes took seconds).
MAX_TENSORS = 65536
MAX_DIMS = 16
MAX_ELEMENTS = (1 << 32) * 362  # the wire's u32 chunk index at the largest payload
TAG_BYTES = 16  # an authenticated frame's truncated HMAC-SHA256
CHALLENGE_TYPE, AUTH_TYPE = 10, 11  # the handshake's last frame of each direction before the keys
REFUSALS = ("forged", "replayed", "reordered")  # why an authenticated frame is refused


class ControlError(Exception):
    """The control stream carried something that is not a valid frame."""


@dataclass(frozen=True)
class Hello:
    worker: int  # requested id, or -1 to let the server assign one
    udp_port: int
    spec: dict  # {"names": [...], "shapes": [[...], ...], "elements": n}
    version: int = PROTOCOL_VERSION
    nonce: str = ""  # the worker's challenge to the server (32 hex digits); "" on the insecure wire
    local: str = ""  # the host-local slot's path (dblp.transport.hostlocal): the data path to a server on this host


@dataclass(frozen=True)
class Meta:
    info: dict


@dataclass(frozen=True)
class RoundStart:
    round: int
    direction: int
    tolerance: float
    clr: bool = False
    grant_bps: float = 0.0  # R12: the upload rate granted to a self-pacing worker (bit/s); 0 = none


@dataclass(frozen=True)
class Probe:
    round: int
    direction: int
    pass_no: int
    rate_bps: float = 0.0  # R12: the rate the pass was sent at, stated by a self-pacing sender; 0 = not stated


@dataclass(frozen=True)
class Bitmap:
    round: int
    direction: int
    received: int
    bits: bytes  # np.packbits of the received-chunk mask
    rate_bps: float = 0.0  # R15: the rate the first pass arrived at (bit/s), told a self-pacing sender; 0 = none

    def mask(self, chunks: int) -> np.ndarray:
        return _unpack(self.bits, chunks)


@dataclass(frozen=True)
class Stop:
    round: int
    direction: int
    received: int
    span: int = 0  # R14: a STOP before the first PROBE - the first pass's datagrams up to its last arrival, by
    # the sender's order, when more than EARLY_CLEAN of them are missing (their loss); 0 = not stated


@dataclass(frozen=True)
class Bye:
    reason: str


#: The start of a BYE's reason when its sender failed (an error, a tampered stream), not finished: the
#: other side then treats the connection as lost (the server's ``--on-worker-loss``), not as a goodbye.
FAILED = "failed: "


def failure_of(reason: str | None) -> str | None:
    """What a failed peer's BYE says went wrong; None for an orderly goodbye (or no BYE)."""
    if reason is not None and reason.startswith(FAILED):
        return reason[len(FAILED):]
    return None


@dataclass(frozen=True)
class Challenge:
    """Server -> worker: the server's nonce, and its proof of the secret (:func:`dblp.protocol.auth.proof`)."""

    nonce: bytes
    proof: bytes


@dataclass(frozen=True)
class AuthProof:
    """Worker -> server: the worker's proof of the secret, bound to both nonces and its HELLO."""

    proof: bytes


@dataclass(frozen=True)
class RoundChunks:
    """S7's two messages, one shape: a set of chunks of round ``round``'s broadcast, as packed bits."""

    round: int
    bits: bytes  # np.packbits of the chunk mask

    def mask(self, chunks: int) -> np.ndarray:
        return _unpack(self.bits, chunks)


@dataclass(frozen=True)
class Held(RoundChunks):
    """Worker -> server: the chunks of round ``round``'s broadcast this worker received."""


@dataclass(frozen=True)
class Common(RoundChunks):
    """Server -> workers: the chunks of round ``round``'s broadcast every live worker received."""


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
_RATE = struct.Struct("!d")  # R12's optional trailing field of ROUND and PROBE
_BITMAP = struct.Struct("!IBI")
_STOP = struct.Struct("!IBI")
_SPAN = struct.Struct("!I")  # R14's optional trailing span of a STOP
_FRAME = struct.Struct("!IB")
_ROUND_NO = struct.Struct("!I")
_LOCAL = struct.Struct("!IB")
_SEQ = struct.Struct("!Q")
#: bytes an authenticated frame carries beyond the paper's: its sequence number and tag
MAC_TRAILER = _SEQ.size + TAG_BYTES


class ControlMac:
    """One direction of an authenticated control connection: its key and the next sequence number.

    The sender numbers its frames 0, 1, 2, ...; the receiver accepts exactly the next one
    (TCP delivers in order, so anything else was injected, replayed or reordered on the path)."""

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)  # copied per frame: the key's pads are hashed once
        self.seq = 0

    def tag(self, seq: int, t: int, body: bytes) -> bytes:
        h = self._keyed.copy()  # (half the cost of hmac.digest, which sets the key up per call)
        h.update(_SEQ.pack(seq) + bytes((t,)))
        h.update(body)
        return h.digest()[:TAG_BYTES]


def encode(msg: Message, mac: ControlMac | None = None) -> bytes:
    """The frame of ``msg``; authenticated with ``mac``'s key and next sequence number when given."""
    t, body = _body(msg)
    if mac is None:
        return _FRAME.pack(len(body) + 1, t) + body
    seq = mac.seq
    mac.seq += 1
    return _FRAME.pack(len(body) + 1 + MAC_TRAILER, t) + body + _SEQ.pack(seq) + mac.tag(seq, t, body)


def _body(msg: Message) -> tuple[int, bytes]:
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
        t, body = 3, _ROUND.pack(msg.round, msg.direction, int(msg.clr), msg.tolerance) + _rate(msg.grant_bps)
    elif isinstance(msg, Probe):
        t, body = 4, _PROBE.pack(msg.round, msg.direction, msg.pass_no) + _rate(msg.rate_bps)
    elif isinstance(msg, Bitmap):
        head = _BITMAP.pack(msg.round, msg.direction, msg.received)
        # R15: a rate makes it type 13 (the bits' length is the layout's, so no trailing field fits)
        t, body = (13, head + _RATE.pack(msg.rate_bps) + msg.bits) if msg.rate_bps else (5, head + msg.bits)
    elif isinstance(msg, Stop):
        t, body = 6, _STOP.pack(msg.round, msg.direction, msg.received) + (_SPAN.pack(msg.span) if msg.span else b"")
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
    return t, body


def _rate(bps: float) -> bytes:
    """R12's trailing rate: absent when 0 (the frame stays the old one), else f64 bit/s."""
    return _RATE.pack(bps) if bps else b""


def _tail_rate(body: bytes, head: int, what: str) -> float:
    """The optional trailing rate after a ``head``-byte body: 0 when absent (an old peer's frame)."""
    if len(body) == head:
        return 0.0
    if len(body) != head + _RATE.size:
        raise ControlError(f"{what} body of {len(body)} bytes, expected {head} or {head + _RATE.size}")
    (bps,) = _RATE.unpack_from(body, head)
    if not math.isfinite(bps) or bps < 0:
        raise ControlError(f"{what} rate must be a finite number >= 0 bit/s, got {bps!r}")
    return bps


def decode_frame(t: int, body: bytes) -> Message:
    """The message of one frame's type and body (:meth:`ControlDecoder.frames`)."""
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
            r, d, clr, tol = _ROUND.unpack_from(body)
            return RoundStart(r, d, tol, bool(clr), _tail_rate(body, _ROUND.size, "ROUND"))
        if t == 4:
            return Probe(*_PROBE.unpack_from(body), _tail_rate(body, _PROBE.size, "PROBE"))
        if t == 5:
            r, d, n = _BITMAP.unpack_from(body)
            return Bitmap(r, d, n, bytes(body[_BITMAP.size :]))
        if t == 13:
            r, d, n = _BITMAP.unpack_from(body)
            bps = _tail_rate(body[: _BITMAP.size + _RATE.size], _BITMAP.size, "BITMAP")
            if not bps > 0:
                raise ControlError("BITMAP+ rate must be > 0 bit/s (0 is type 5)")
            return Bitmap(r, d, n, bytes(body[_BITMAP.size + _RATE.size :]), bps)
        if t == 6:
            if len(body) == _STOP.size:  # (an old peer's STOP, and every STOP without R14's span)
                return Stop(*_STOP.unpack(body))
            if len(body) != _STOP.size + _SPAN.size:
                raise ControlError(f"STOP body of {len(body)} bytes, expected {_STOP.size} or {_STOP.size + _SPAN.size}")
            r, d, n = _STOP.unpack_from(body)
            (span,) = _SPAN.unpack_from(body, _STOP.size)
            if not n <= span:
                raise ControlError(f"STOP span {span} is below its count {n}")
            return Stop(r, d, n, span)
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
    for what, v in (("names", names), ("shapes", shapes)):  # counted before their items are checked
        if isinstance(v, list) and len(v) > MAX_TENSORS:
            raise ControlError(f"HELLO spec.{what} lists {len(v)} tensors, more than {MAX_TENSORS}")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ControlError("HELLO spec.names must be a list of strings")
    if not isinstance(shapes, list) or not all(
            isinstance(sh, list) and len(sh) <= MAX_DIMS and all(type(x) is int and x >= 0 for x in sh)
            for sh in shapes):
        raise ControlError(f"HELLO spec.shapes must be a list of lists of at most {MAX_DIMS} "
                           f"non-negative integers")
    held = sum(map(math.prod, shapes))  # (math.prod, not np.prod: a 4 MiB HELLO of 1-element shapes
    if shapes and held != elements:     # took 2.8 s of the login loop with np.prod, 0.1 s now)
        raise ControlError(f"HELLO spec.shapes hold {held} elements, spec.elements says {elements}")
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
    """Accumulates stream bytes and yields whole messages.

    ``max_frame``: the longest frame accepted, checked on its header before its body is
    buffered (a login's decoder allows a HELLO, :data:`MAX_HELLO`; a peer's, a bitmap).
    ``hold_after``: a frame type after which decoding pauses until :meth:`key` is called -
    the handshake's last unauthenticated frame, so a frame injected right behind it is
    never taken unauthenticated. Once keyed, every frame must carry the next sequence number
    and a valid tag (:class:`ControlMac`); others are refused and counted in :attr:`refused`."""

    def __init__(self, max_frame: int = MAX_FRAME, hold_after: int | None = None) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame
        self.hold_after = hold_after
        self.mac: ControlMac | None = None
        self._held = False
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self.last_refused: Message | None = None  # what the last refused frame said, if it decodes
        self.first_refused: Message | None = None  # and the first: where the stream stopped being the peer's

    def key(self, mac: ControlMac) -> None:
        """From now on every frame must be authenticated under ``mac`` (held bytes included)."""
        self.mac = mac
        self._held = False

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())

    def feed(self, data: bytes) -> list[Message]:
        return [decode_frame(t, body) for t, body in self.frames(data)]

    def frames(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames (type, body) in the stream so far, authenticated ones verified and
        stripped of their trailer; for a caller that decodes elsewhere (a login's large HELLO)."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while not self._held and len(self._buf) >= _FRAME.size:
            length, t = _FRAME.unpack_from(self._buf)
            if length < 1 or length > self.max_frame:
                raise ControlError(f"control frame length {length} out of range (limit {self.max_frame} bytes)")
            if len(self._buf) < 4 + length:
                break
            body = bytes(self._buf[_FRAME.size : 4 + length])
            del self._buf[: 4 + length]
            if self.mac is not None:
                inner = self._verify(t, body)
                if inner is None:
                    continue
                body = inner
            out.append((t, body))
            if t == self.hold_after and self.mac is None:
                self._held = True
        return out

    def _verify(self, t: int, body: bytes) -> bytes | None:
        """The frame's body if its tag verifies under the next sequence number; None (counted) if not."""
        mac = self.mac
        assert mac is not None
        inner, trailer = body[:-MAC_TRAILER], body[-MAC_TRAILER:]
        why = "forged"
        if len(body) >= MAC_TRAILER:
            (seq,) = _SEQ.unpack_from(trailer)
            if hmac.compare_digest(trailer[_SEQ.size:], mac.tag(seq, t, inner)):
                if seq == mac.seq:
                    mac.seq += 1
                    return inner
                why = "replayed" if seq < mac.seq else "reordered"
        self.refused[why] += 1
        self.last_refused = None  # what it said, for the message of an error that follows
        for candidate in ((body, inner) if why == "forged" else (inner,)):  # (a BYE the peer could not tag)
            try:
                self.last_refused = decode_frame(t, candidate)
                break
            except ControlError:
                pass
        if self.refused_total == 1:
            self.first_refused = self.last_refused
        return None

    @property
    def pending(self) -> int:
        return len(self._buf)
