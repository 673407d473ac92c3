"""dblp._fastpath: the per-datagram loops of the fast path in C, the GIL released.

Built by setup.py from dblp/_fastpath_c/ (one file per purpose: crc32c.c,
wire.c, sockets.c, place.c, reduce.c; module.c holds the method table).
Optional: without it dblp/protocol/wire.py, dblp/transport/udp.py and dblp/protocol/reduce.py run their
numpy / crc32c paths, byte-identical on the wire. Every function takes its
arguments by position only. Buffers are C-contiguous (numpy arrays);
"int64"/"uint32" name the element type the C side reads or writes, and
shapes and lengths are checked (ValueError naming what is wrong).
"""

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

from _typeshed import ReadableBuffer, WriteableBuffer
from numpy.typing import NDArray

# numpy arrays are buffers, but numpy's own stubs say so only for Python >= 3.12 (__buffer__)
_In: TypeAlias = NDArray[Any] | ReadableBuffer
_Out: TypeAlias = NDArray[Any] | WriteableBuffer

BEST: Final[str]
"""The CRC-32C implementation chosen at import: "sse4.2", "slicing-by-8" or "bytewise"."""
MAC: Final[str]
"""The AES-GMAC implementation chosen at import: "ipsec-mb" (Intel's, where built with it and the CPU has AES-NI) or "openssl"."""

# crc32c.c

def crc_rows(rows: _In, lengths: _In | None, out: _Out, start: int, /) -> None:
    """out[i] (uint32) = CRC-32C of rows[i, start:lengths[i]] for a (k, stride) uint8 matrix; lengths int64 or None (full rows)."""

def use(name: str, /) -> str:
    """Switch the CRC implementation ("sse4.2", "slicing-by-8", "bytewise"), for tests; returns the previous name."""

# mac.c

def use_mac(name: str, /) -> str:
    """Switch the AES-GMAC implementation ("ipsec-mb", "openssl"): same tags; returns the previous name."""

# wire.c

def encode_rows(
    values: _In, seqs: _In, rows: _Out,
    run_id: int, sender: int, round_no: int, chunk_floats: int, key: bytes, /,
) -> None:
    """Datagrams (header, payload, zero padding, CRC - or the v2 tag when key is 16 bytes) of chunks seqs (int64) of float32 values into rows, as wire.encode_chunks."""

def encode_headers(
    values: _In, seqs: _In, headers: _Out,
    run_id: int, sender: int, round_no: int, chunk_floats: int, key: bytes, /,
) -> None:
    """Only the headers (24 bytes with the CRC; 40 with the tag when key is 16 bytes) of chunks seqs, payloads read in place."""

def scatter_rows(rows: _In, seqs: _In, out: _Out, nbytes: int, chunk_bytes: int, offset: int, /) -> None:
    """Copy rows[i, offset:offset + nbytes] to byte seqs[i] * chunk_bytes of out: accepted payloads into the tensor."""

# sockets.c

def send_chunks(
    fd: int, host: str, port: int, headers: _In, values: _In, seqs: _In,
    chunk_floats: int, per_call: int, header_bytes: int, /,
) -> tuple[int, int, int, int]:
    """Send header i + chunk seqs[i] pairs (GSO runs of per_call, sendmmsg when per_call <= 1); (sent, lost, calls, errno)."""

def recv_rows(
    fd: int, rows: _Out, lengths: _Out, srcs: _Out, gro: int, max_calls: int, /,
) -> tuple[int, int]:
    """Queued datagrams into rows without blocking (GRO runs or recvmmsg), lengths and (addr << 16) | port in srcs; (k, calls)."""

# place.c

def recv_place(
    fd: int, rows: _Out, lengths: _Out, srcs: _Out, aims: _Out,
    out: _Out, mask: _In, claim: _Out, order: _In, pos: _In,
    cursor: _Out, crcs: _Out, chunk_bytes: int, gro: int, max_calls: int, key: bytes, /,
) -> tuple[int, int, int]:
    """recv_rows with predicted payloads received straight into their tensor slots (R10); (k, calls, placed). With a 16-byte key crcs[i] is 1 for a valid v2 tag, else 0."""

def crc_placed(rows: _In, out: _In, aims: _In, chunk_bytes: int, res: _Out, key: bytes, /) -> None:
    """res[i] = CRC-32C of rows[i, 8:24] then out's slot of chunk aims[i], for each aims[i] >= 0 (placed datagrams); with a 16-byte key, 1 when rows[i, 24:40] is their valid tag, else 0."""

# mac.c

def mac_rows(rows: _In, lengths: _In | None, out: _Out, key: bytes, /) -> None:
    """out[i] (uint32) = 1 when rows[i, :lengths[i]] (a v2 datagram) carries a valid AES-GMAC tag under key, else 0."""

# reduce.c

def mean_into(out: _Out, bufs: Sequence[_In], scale: float, threads: int, sumsq: _Out | None = None, /) -> float:
    """out = (bufs[0] + bufs[1] + ...) * scale in float32 in one threaded pass (bit-identical to numpy); returns sum(out**2); sumsq (float64, len(bufs)) receives each buffer's own sum of squares."""

# fluid.c

def fluid_outcome(bt: _In, ba: _In, bq: _In, cap: float, qcap: float, ser: float, arr: _In, u: _In, wait: _Out,
                  ovf: _Out, /) -> int:
    """dblp.sim.network.net.FluidQueue.outcome's waits (wait) and drops (ovf, bool) of slots reaching a port at arr; bit 1: a wait, bit 2: a drop."""

def fluid_profile(ent: _In, t0: float, q_ref: float, cap: float, qcap: float, bt: _Out, ba: _Out, bq: _Out,
                  /) -> tuple[int, bool]:
    """dblp.sim.network.net.FluidQueue._rebuild's breakpoints, offered rates and queue from t0 of the passes ent ((lo, hi, rate) triples) into bt, ba, bq (room for 2 * passes + 1); (breakpoints, congested)."""

def fluid_arrivals(leave: _In, b: int, limit: int, c: float, lossdrop: _In | None, ovf: _In | None, wait: _In | None,
                   floor: float, idx: _Out, t: _Out, /) -> int:
    """dblp.sim.engines.fast.RoundFlow.port_refresh's arrivals: slots b..limit-1 not lost nor dropped into idx, at leave + c (+ wait), kept in order and >= floor, into t; their count."""

def pcg64_seed(entropy: _In, /) -> tuple[int, int]:
    """The (state, inc) 128-bit integers of np.random.PCG64(np.random.SeedSequence(entropy)) for uint32 entropy words (dblp.sim.engines.fast._uniforms: a pass's stream without building numpy's SeedSequence)."""
