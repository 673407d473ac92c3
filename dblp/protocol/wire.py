"""DBLP data-datagram wire format, encoded and decoded a whole batch at a time.

Every UDP datagram of the data channel carries one chunk of a flat float32
tensor behind a fixed 24-byte header (all integers big-endian)::

    offset size field
    0      2    magic      0xDB1F
    2      1    version    1
    3      1    kind       1 = data chunk
    4      4    crc32c     CRC-32C (Castagnoli) of every byte after this field (8..end)
    8      4    run_id     random per run, chosen by the server, sent in META
    12     2    sender     worker id (0..N-1), or 0xFFFF for the server
    14     2    length     payload bytes (a multiple of 4; only the last chunk is short)
    16     4    round      per-round counter: rejects stale datagrams (paper III-A)
    20     4    seq        chunk index within the round
    24     ...  payload    little-endian float32 values

The CRC covers one contiguous span (header fields and payload), so checking
it is one CRC call per datagram; magic, version and kind are checked by
value.

Version 2, the authenticated wire (the default; :mod:`dblp.protocol.auth`): the same
24 bytes with version 2 and the crc field zero, then a 16-byte AES-128-GMAC
tag at bytes 24..40 over bytes 8..24 and the payload (nonce: sender, round,
seq; key per run), then the payload at byte 40. The tag replaces the CRC
(it detects corruption too). A :class:`ChunkLayout` with a ``key`` is a
version-2 layout: 1500 - 28 - 40 = 1432 payload bytes, 358 floats a chunk.

With the default MTU of 1500, 1500 - 20 (IPv4) - 8 (UDP) - 24 = 1448 payload
bytes, i.e. 362 float32 values per chunk, so each datagram fills one MTU.

Headers are built and parsed with numpy structured arrays over a whole batch
so that neither encoding nor validation loops over datagrams in Python; the
one exception is the CRC, computed per datagram in C (a table CRC vectorised
across rows in numpy is ~50x slower). CRC-32C rather than zlib's CRC-32: the
``crc32c`` package uses the CPU's CRC instruction (SSE 4.2 / ARMv8), 0.32 us
per 1448-byte datagram against zlib's 0.68 us here, and the polynomial is the
one iSCSI, SCTP and ext4 chose for its error detection.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from crc32c import crc32c as _crc32c

try:  # the optional C helper (dblp/_fastpath_c/crc32c.c, wire.c); DBLP_NO_C=1 forces the numpy fallback
    from dblp._fastpath import BEST as C_CRC
    from dblp._fastpath import crc_placed as _c_crc_placed
    from dblp._fastpath import crc_rows as _c_crc_rows
    from dblp._fastpath import encode_headers as _c_encode_headers
    from dblp._fastpath import encode_rows as _c_encode_rows
    from dblp._fastpath import mac_rows as _c_mac_rows
    from dblp._fastpath import scatter_rows as _c_scatter_rows
except ImportError:  # not built (no compiler at install time)
    _c_crc_rows = _c_encode_rows = _c_encode_headers = _c_scatter_rows = _c_crc_placed = _c_mac_rows = C_CRC = None
if os.environ.get("DBLP_NO_C"):
    _c_crc_rows = _c_encode_rows = _c_encode_headers = _c_scatter_rows = _c_crc_placed = _c_mac_rows = C_CRC = None

MAGIC = 0xDB1F
VERSION = 1  # the paper's CRC-only wire (--insecure)
VERSION_AUTH = 2  # the authenticated wire: a 16-byte tag after the 24 bytes
KIND_DATA = 1
SERVER_ID = 0xFFFF
HEADER_SIZE = 24  # the fields both versions share; a version-2 header adds TAG_SIZE
TAG_SIZE = 16
IP_UDP_OVERHEAD = 28  # IPv4 (20) + UDP (8)
FLOAT_BYTES = 4
#: link MTUs in bytes: IPv4's smallest datagram every host must take (the emulation's and the
#: benchmark's links go no lower), and IPv4's largest datagram (no layout goes higher)
MIN_MTU, MAX_MTU = 576, 65535
AUTO_MTU = "auto"  # --mtu auto: the MTU of the link the server's address sits on (dblp.transport.udp.auto_mtu)
DEFAULT_MTU = 1500  # Ethernet's standard MTU: the default where nothing better is known

HEADER_DTYPE = np.dtype(
    [
        ("magic", ">u2"),
        ("version", "u1"),
        ("kind", "u1"),
        ("crc", ">u4"),
        ("run_id", ">u4"),
        ("sender", ">u2"),
        ("length", ">u2"),
        ("round", ">u4"),
        ("seq", ">u4"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_SIZE


class ParameterError(ValueError):
    """A configuration value is out of range; the message names the parameter."""


@dataclass(frozen=True)
class ChunkLayout:
    """How a flat tensor of ``elements`` float32 values is cut into datagrams,
    and on which wire: version 1 (no ``key``) or the authenticated version 2
    (``key``: the run's 16-byte data key, :func:`dblp.protocol.auth.data_key`)."""

    elements: int
    mtu: int = 1500
    key: bytes | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.elements <= 0:
            raise ParameterError(f"elements must be positive, got {self.elements}")
        if self.key is not None and len(self.key) != TAG_SIZE:
            raise ParameterError(f"the data key must be {TAG_SIZE} bytes, got {len(self.key)}")
        min_mtu = IP_UDP_OVERHEAD + self.header_size + FLOAT_BYTES
        if self.mtu < min_mtu:
            raise ParameterError(
                f"mtu={self.mtu} is too small for the {self.header_size}-byte DBLP header "
                f"plus IP/UDP headers and one value (minimum {min_mtu})"
            )
        if self.mtu > MAX_MTU:
            raise ParameterError(f"mtu={self.mtu} exceeds the IPv4 datagram limit {MAX_MTU}")
        if self.chunks > 2**32:  # the header's seq field
            raise ParameterError(f"elements={self.elements} needs {self.chunks} chunks at mtu={self.mtu}; "
                                 f"the 32-bit sequence number allows {2**32}")

    @cached_property  # derived from frozen fields: computed once (hot in the simulator)
    def header_size(self) -> int:
        """Bytes before the payload: 24, or 40 on the authenticated wire."""
        return HEADER_SIZE + (TAG_SIZE if self.key is not None else 0)

    @property
    def version(self) -> int:
        return VERSION if self.key is None else VERSION_AUTH

    @property
    def key_bytes(self) -> bytes:
        """The key as the C helper takes it: empty for version 1."""
        return b"" if self.key is None else self.key

    @cached_property
    def chunk_floats(self) -> int:
        return (self.mtu - IP_UDP_OVERHEAD - self.header_size) // FLOAT_BYTES

    @cached_property
    def chunk_bytes(self) -> int:
        return self.chunk_floats * FLOAT_BYTES

    @cached_property
    def datagram_size(self) -> int:
        """Size of a full (not last) datagram, header included."""
        return self.header_size + self.chunk_bytes

    @cached_property
    def chunks(self) -> int:
        return math.ceil(self.elements / self.chunk_floats)

    @cached_property
    def last_chunk_floats(self) -> int:
        return self.elements - (self.chunks - 1) * self.chunk_floats

    def payload_lengths(self, seqs: np.ndarray) -> np.ndarray:
        """Expected payload bytes of each chunk index in ``seqs``."""
        out = np.full(seqs.shape, self.chunk_bytes, dtype=np.int64)
        out[seqs == self.chunks - 1] = self.last_chunk_floats * FLOAT_BYTES
        return out


CRC_START = 8  # the CRC covers bytes CRC_START..end


def crc_rows(rows: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """CRC-32C of each datagram from byte 8 (after the crc field) to its end.

    ``rows`` is a (k, size) uint8 array of datagrams; ``lengths`` the datagram
    lengths when some rows are padded. With the C helper one call covers the
    batch (GIL released); without it, one crc32c call per row over slices of
    one flat memoryview (see module doc).
    """
    k, size = rows.shape
    if k == 0:
        return np.empty(0, np.uint32)
    rows = np.ascontiguousarray(rows)
    if _c_crc_rows is not None:
        out = np.empty(k, np.uint32)
        lens = None if lengths is None else np.ascontiguousarray(lengths, dtype=np.int64)
        _c_crc_rows(rows, lens, out, CRC_START)
        return out
    mv = memoryview(rows.reshape(-1))
    crc = _crc32c
    if lengths is None:
        out = [crc(mv[o + CRC_START : o + size]) for o in range(0, k * size, size)]
    else:
        out = [crc(mv[o + CRC_START : o + int(n)]) for o, n in zip(range(0, k * size, size), lengths.tolist())]
    return np.array(out, dtype=np.uint32)


def crc_placed(headers: np.ndarray, out: np.ndarray, seqs: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """Integrity checks of datagrams whose payload was received in place: header
    ``headers[i]`` and the (full) payload slot of chunk ``seqs[i]`` in the
    float32 tensor ``out``. Version 1: the CRC-32C of header bytes 8..24 and
    the slot - the value the sender put in the header's crc field; version 2:
    1 where the header's tag is valid, else 0 (as ``recv_place`` reports them)."""
    headers = np.ascontiguousarray(headers)
    seqs = np.ascontiguousarray(seqs, dtype=np.int64)
    res = np.zeros(seqs.size, np.uint32)
    raw = out.reshape(-1).view(np.uint8)
    cb = layout.chunk_bytes
    if _c_crc_placed is not None:
        _c_crc_placed(headers, raw, seqs, cb, res, layout.key_bytes)
        return res
    for i, s in enumerate(seqs.tolist()):
        slot = raw[s * cb : (s + 1) * cb]
        if layout.key is not None:
            res[i] = _tag_ok(layout.key, headers[i], slot)
        else:
            res[i] = _crc32c(slot, _crc32c(headers[i, CRC_START:HEADER_SIZE].tobytes()))
    return res


def placed_ok(headers: np.ndarray, checks: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """R4's integrity verdict on placed datagrams from their :func:`crc_placed` values."""
    if layout.key is not None:
        return checks == 1
    return checks == parse_headers(headers)["crc"]


def rows_ok(rows: np.ndarray, layout: ChunkLayout, lengths: np.ndarray | None = None) -> np.ndarray:
    """R4's integrity verdict on whole datagrams ``rows[i, :lengths[i]]``: the CRC
    matches (version 1), or the tag is valid under the run's key (version 2)."""
    if layout.key is None:
        return crc_rows(rows, lengths) == parse_headers(rows)["crc"]
    k = rows.shape[0]
    rows = np.ascontiguousarray(rows)
    if _c_mac_rows is not None:
        res = np.empty(k, np.uint32)
        _c_mac_rows(rows, None if lengths is None else np.ascontiguousarray(lengths, np.int64), res, layout.key)
        return res == 1
    lens = [rows.shape[1]] * k if lengths is None else np.asarray(lengths).tolist()
    hs = layout.header_size
    return np.array([n >= hs and _tag_ok(layout.key, rows[i], rows[i, hs:n]) for i, n in enumerate(lens)], bool)


def _tag_ok(key: bytes, header: np.ndarray, payload: np.ndarray) -> bool:
    """One version-2 tag checked in Python (the fallback without the C helper)."""
    from dblp.protocol.auth import datagram_tag  # the cryptography package: only this fallback needs it here
    import hmac
    return hmac.compare_digest(datagram_tag(key, header[:HEADER_SIZE].tobytes(), payload.tobytes()),
                               header[HEADER_SIZE:HEADER_SIZE + TAG_SIZE].tobytes())


def _seal_rows(rows: np.ndarray, lengths: np.ndarray, layout: ChunkLayout) -> None:
    """Fill the integrity field of encoded rows in Python: CRC (v1) or tag (v2)."""
    hdr = rows[:, :HEADER_SIZE].view(HEADER_DTYPE).reshape(rows.shape[0])
    if layout.key is None:
        hdr["crc"] = crc_rows(rows, lengths)
        return
    from dblp.protocol.auth import datagram_tag
    hs = layout.header_size
    hdr["crc"] = 0
    for i, n in enumerate(np.asarray(lengths).tolist()):
        rows[i, HEADER_SIZE:hs] = np.frombuffer(
            datagram_tag(layout.key, rows[i, :HEADER_SIZE].tobytes(), rows[i, hs:n].tobytes()), np.uint8)


def _encode_target(values: np.ndarray, layout: ChunkLayout, seqs: np.ndarray, out: np.ndarray | None,
                   width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What both encoders write from and into, checked once: the tensor as flat little-endian float32,
    the chunk indices, and one C-contiguous ``width``-byte uint8 row per index (``out`` if given)."""
    flat = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    if flat.size != layout.elements:
        raise ValueError(f"tensor has {flat.size} elements, layout expects {layout.elements}")
    seqs = np.ascontiguousarray(seqs, dtype=np.int64)
    shape = (seqs.size, width)
    rows = np.empty(shape, np.uint8) if out is None else out
    if rows.shape != shape or rows.dtype != np.uint8 or not rows.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {shape}")
    return flat, seqs, rows


def encode_chunks(
    values: np.ndarray,
    layout: ChunkLayout,
    seqs: np.ndarray,
    *,
    run_id: int,
    sender: int,
    round_no: int,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Encode the chunks ``seqs`` of ``values`` as datagrams.

    Returns ``(rows, lengths)``: a (k, datagram_size) uint8 array (``out``
    if given, a C-contiguous one of that shape) and each datagram's true
    length (only the tensor's last chunk is shorter; its row is zero-padded).
    """
    flat, seqs, rows = _encode_target(values, layout, seqs, out, layout.datagram_size)
    k = seqs.size
    plen = layout.payload_lengths(seqs)
    hs = layout.header_size
    if _c_encode_rows is not None and flat.dtype == np.dtype("<f4"):
        _c_encode_rows(flat, seqs, rows, run_id, sender, round_no, layout.chunk_floats, layout.key_bytes)
        return rows, plen + hs
    hdr = rows[:, :HEADER_SIZE].view(HEADER_DTYPE).reshape(k)
    hdr["magic"] = MAGIC
    hdr["version"] = layout.version
    hdr["kind"] = KIND_DATA
    hdr["run_id"] = run_id
    hdr["sender"] = sender
    hdr["length"] = plen
    hdr["round"] = round_no
    hdr["seq"] = seqs
    _fill_payloads(rows, flat, seqs, plen, layout)
    lengths = plen + hs
    _seal_rows(rows, lengths, layout)
    return rows, lengths


def encode_headers(
    values: np.ndarray,
    layout: ChunkLayout,
    seqs: np.ndarray,
    *,
    run_id: int,
    sender: int,
    round_no: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Only the headers (24 bytes, CRC included; 40 with the tag on the
    authenticated wire) of the datagrams of ``seqs``.

    The payload stays in ``values``: a sender that hands the kernel header
    and payload as two pieces (``DataSocket.send_chunks``) never copies it.
    Same bytes as ``encode_chunks(...)[0][:, :layout.header_size]``.
    """
    hs = layout.header_size
    flat, seqs, hdr = _encode_target(values, layout, seqs, out, hs)
    if _c_encode_headers is not None:
        _c_encode_headers(flat, seqs, hdr, run_id, sender, round_no, layout.chunk_floats, layout.key_bytes)
    else:
        rows, _ = encode_chunks(flat, layout, seqs, run_id=run_id, sender=sender, round_no=round_no)
        hdr[:] = rows[:, :hs]
    return hdr


def assemble_rows(headers: np.ndarray, values: np.ndarray, seqs: np.ndarray,
                  layout: ChunkLayout) -> tuple[np.ndarray, np.ndarray]:
    """Whole datagrams from headers and the tensor: ``(rows, lengths)`` as
    :func:`encode_chunks` returns them (for senders without the C path)."""
    seqs = np.asarray(seqs, dtype=np.int64)
    rows = np.empty((seqs.size, layout.datagram_size), np.uint8)
    rows[:, : layout.header_size] = headers
    plen = layout.payload_lengths(seqs)
    _fill_payloads(rows, np.asarray(values, dtype="<f4").reshape(-1), seqs, plen, layout)
    return rows, plen + layout.header_size


def _fill_payloads(rows: np.ndarray, flat: np.ndarray, seqs: np.ndarray, plen: np.ndarray,
                   layout: ChunkLayout) -> None:
    """Chunk ``seqs[i]`` of ``flat`` into the payload of ``rows[i]``; the short tail row is zero-padded."""
    payload = rows[:, layout.header_size :].view("<f4")
    full = plen == layout.chunk_bytes
    if full.all():
        payload[:] = flat_padded_view(flat, layout)[seqs]
        return
    payload[full] = flat_padded_view(flat, layout)[seqs[full]]
    for i in np.flatnonzero(~full):  # at most one row: the tensor's tail
        n = int(plen[i]) // FLOAT_BYTES
        payload[i, :n] = flat[(layout.chunks - 1) * layout.chunk_floats :]
        payload[i, n:] = 0.0


def scatter_payloads(rows: np.ndarray, seqs: np.ndarray, out: np.ndarray, layout: ChunkLayout) -> None:
    """Write the payloads of full-size datagrams ``rows`` to their chunks ``seqs`` of ``out``."""
    hs = layout.header_size
    if _c_scatter_rows is not None and rows.flags.c_contiguous and out.flags.c_contiguous:
        _c_scatter_rows(rows, np.ascontiguousarray(seqs, dtype=np.int64), out, layout.chunk_bytes, layout.chunk_bytes,
                        hs)
        return
    flat_padded_view(out, layout)[seqs] = rows[:, hs : hs + layout.chunk_bytes].view("<f4")


def flat_padded_view(flat: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """(chunks-1, chunk_floats) view of all full chunks, without copying."""
    full = layout.chunks - 1 if layout.last_chunk_floats != layout.chunk_floats else layout.chunks
    return flat[: full * layout.chunk_floats].reshape(full, layout.chunk_floats)


def zero_chunks(flat: np.ndarray, layout: ChunkLayout, chunks: np.ndarray) -> None:
    """Set the values of the given chunks (sorted indices) of a flat tensor to zero, in place."""
    if chunks.size == 0:
        return
    last = layout.chunks - 1
    short = layout.last_chunk_floats != layout.chunk_floats
    flat_padded_view(flat, layout)[chunks[chunks < last] if short else chunks] = 0.0
    if short and chunks[-1] == last:
        flat[last * layout.chunk_floats :] = 0.0


def parse_headers(rows: np.ndarray) -> np.ndarray:
    """Structured header view of a (k, size>=24) uint8 batch."""
    return rows[:, :HEADER_SIZE].view(HEADER_DTYPE).reshape(rows.shape[0])
