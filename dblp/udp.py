"""The UDP data socket: batch send and batch receive, with GSO/GRO when the kernel has them.

Fast path: one ``sendmsg`` carries up to 44 MTU-sized datagrams with a
``UDP_SEGMENT`` (GSO) control message and the kernel cuts them; with
``UDP_GRO`` the receiving socket gets runs of same-flow datagrams coalesced
into one buffer plus their segment size. The wire format is identical on
both paths - the kernel segments exactly at datagram boundaries - so a plain
receiver reads a GSO sender and vice versa. Plain path: one datagram per
``sendmsg`` and ``recvmmsg`` batches (or one ``recvfrom_into`` per datagram
without the C helper), chosen automatically where GSO/GRO are missing (or
forced with ``fast=False``). With the C helper (dblp/_fastpath_c/) the
per-datagram loops of both paths run in C without the GIL.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time

import numpy as np

from .wire import ChunkLayout, assemble_rows

try:  # the optional C helper (dblp/_fastpath_c/sockets.c, place.c); DBLP_NO_C=1 forces the Python path
    from ._fastpath import recv_place as _c_recv_place
    from ._fastpath import recv_rows as _c_recv_rows
    from ._fastpath import send_chunks as _c_send_chunks
except ImportError:
    _c_send_chunks = _c_recv_rows = _c_recv_place = None
if os.environ.get("DBLP_NO_C"):
    _c_send_chunks = _c_recv_rows = _c_recv_place = None
if os.environ.get("DBLP_NO_PLACE"):  # receive into rows and copy, as before R10 (for A/B comparisons)
    _c_recv_place = None

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
GSO_MAX_BYTES = 65507  # max UDP payload of one (super-)datagram
GSO_MAX_SEGMENTS = 64
RECV_BUF = 64 * 1024 * 1024


def _set_buffer(sock: socket.socket, opt_force: int, opt: int, size: int) -> None:
    """Ask for a large kernel buffer; root may exceed rmem_max/wmem_max."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, opt_force, size)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass


class DataSocket:
    def __init__(self, host: str = "0.0.0.0", port: int = 0, *, fast: bool | None = None,
                 bufsize: int = RECV_BUF) -> None:
        self.sock = socket.socket(family_of(host), socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        _set_buffer(self.sock, getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF, bufsize)
        _set_buffer(self.sock, getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF, bufsize // 4)
        self.gso = self.gro = False
        if fast is not False:
            try:
                self.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                pass
            self.gso = _probe_gso(self.sock)
        if fast is True and not (self.gso and self.gro):
            raise OSError(errno.EOPNOTSUPP, "UDP GSO/GRO requested but not supported by this kernel")
        self._cmsg_space = socket.CMSG_SPACE(4)
        self.sent_calls = 0
        self.recv_calls = 0
        self.lost_sends = 0

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    # -- send ------------------------------------------------------------------
    def send_chunks(self, headers: np.ndarray, values: np.ndarray, seqs: np.ndarray, lengths: np.ndarray,
                    layout: ChunkLayout, addr: tuple[str, int]) -> None:
        """Send the datagrams ``headers[i]`` + chunk ``seqs[i]`` of ``values``.

        With the C helper, header and payload go to the kernel as two iovec
        pieces (no copy of the payload in user space) and the whole batch is
        one C loop without the GIL; without it, whole rows are assembled
        and sent by :meth:`send_batch`. Same bytes on the wire either way.
        """
        if _c_send_chunks is None:
            rows, lens = assemble_rows(headers, values, seqs, layout)
            self.send_batch(rows, lens, addr)
            return
        seqs = np.ascontiguousarray(seqs, dtype=np.int64)
        headers = np.ascontiguousarray(headers)
        per_call = GSO_MAX_SEGMENTS if self.gso else 1
        done, k = 0, seqs.size
        for attempt in range(1000):
            sent, lost, calls, err = _c_send_chunks(self.sock.fileno(), addr[0], addr[1], headers[done:], values,
                                                    seqs[done:], layout.chunk_floats, per_call, layout.header_size)
            self.sent_calls += calls
            self.lost_sends += lost
            done += sent + lost
            if done >= k:
                return
            # EAGAIN / ENOBUFS: a queue is full for a moment (see _retry)
            os.sched_yield() if attempt < 10 else time.sleep(0.0005)
        raise TimeoutError("UDP send stayed blocked for too long")

    def send_batch(self, rows: np.ndarray, lengths: np.ndarray, addr: tuple[str, int]) -> None:
        """Send ``rows[i, :lengths[i]]`` for every i, as few system calls as the kernel allows."""
        k = rows.shape[0]
        if k == 0:
            return
        seg = rows.shape[1]
        if self.gso and k > 1:
            # Runs of full rows go out GSO_MAX_SEGMENTS-ish per call; a short
            # row (the tensor's last chunk) goes alone.
            per_call = max(1, min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // seg))
            flat = rows.reshape(-1)
            start = 0
            for end in [*np.flatnonzero(lengths != seg).tolist(), k]:
                for a in range(start, end, per_call):
                    n = min(per_call, end - a)
                    self._sendmsg_gso(flat[a * seg : (a + n) * seg], seg, addr)
                if end < k:
                    self._send_one(rows[end, : lengths[end]], addr)
                start = end + 1
            return
        for i in range(k):
            self._send_one(rows[i, : lengths[i]], addr)

    def _sendmsg_gso(self, data: np.ndarray, seg: int, addr: tuple[str, int]) -> None:
        cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("H", seg))] if data.size > seg else []
        self._retry(lambda: self.sock.sendmsg([data], cmsg, 0, addr))

    def _send_one(self, data: np.ndarray, addr: tuple[str, int]) -> None:
        self._retry(lambda: self.sock.sendto(data, addr))

    def _retry(self, fn) -> None:
        # UDP sends only block on a full socket send buffer; ENOBUFS / EAGAIN
        # are transient (a qdisc or the device queue is full): wait a little.
        for attempt in range(1000):
            try:
                fn()
                self.sent_calls += 1
                return
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                # ECONNREFUSED: ICMP about an earlier datagram; EPERM: a local
                # firewall rule (e.g. an nft drop in the output hook) refused
                # this one. Either way the datagram is lost, like on a wire.
                if exc.errno in (errno.ECONNREFUSED, errno.EPERM):
                    self.lost_sends += 1
                    return
                if exc.errno not in (errno.ENOBUFS, errno.EAGAIN):
                    raise
            os.sched_yield() if attempt < 10 else time.sleep(0.0005)
        raise TimeoutError("UDP send stayed blocked for too long")

    # -- receive ---------------------------------------------------------------
    @property
    def can_place(self) -> bool:
        """Whether :meth:`recv_place` is available (it needs the C helper)."""
        return _c_recv_place is not None

    def recv_place(self, rows: np.ndarray, lengths: np.ndarray, srcs: np.ndarray, aims: np.ndarray,
                   crcs: np.ndarray, plan, max_calls: int = 4096) -> tuple[int, int]:
        """:meth:`recv_rows`, receiving payloads straight into the tensor where
        ``plan`` (a :class:`dblp.core.Placement`) predicts them (core rule R10).

        Returns ``(k, placed)``. For i < k, ``aims[i] >= 0``: header in
        ``rows[i, :24]``, payload in the slot of chunk ``aims[i]``; ``-1``: the
        whole datagram in ``rows[i, :lengths[i]]``. ``crcs[i]`` (uint32) gets a
        placed datagram's CRC-32C (header from byte 8, then its slot) - on the
        authenticated wire 1 when its tag is valid, else 0 - taken while the
        bytes are in cache. ``rows`` must be header + chunk_bytes wide.
        """
        k, calls, placed = _c_recv_place(self.sock.fileno(), rows, lengths, srcs, aims, plan.out, plan.mask,
                                         plan.claim, plan.order, plan.pos, plan.cursor, crcs, plan.chunk_bytes,
                                         int(self.gro), max_calls, plan.key)
        self.recv_calls += calls
        return k, placed

    def recv_rows(self, rows: np.ndarray, lengths: np.ndarray, srcs: np.ndarray, max_calls: int = 4096) -> int:
        """Fill ``rows`` ((K, width) uint8) with queued datagrams, without blocking.

        Returns ``k``: datagrams read into ``rows[:k]``, their lengths in
        ``lengths[:k]`` and their sources in ``srcs[:k]`` (int64 keys,
        :func:`addr_key`), one row per datagram. GRO runs of ``width``-byte
        segments land row by row with no copy; a datagram longer than
        ``width`` is truncated and reported with length ``width + 1``, which
        the receiver's exact-length rule (R4) counts as ``wrong_length``. Stops when no datagram is queued, the matrix
        is full, or ``max_calls`` system calls were made. With the C helper
        the loop runs in C (recvmmsg batches on the plain path).
        """
        if _c_recv_rows is not None:
            k, calls = _c_recv_rows(self.sock.fileno(), rows, lengths, srcs, int(self.gro), max_calls)
            self.recv_calls += calls
            return k
        K, width = rows.shape
        flat = memoryview(rows.reshape(-1))
        k = 0
        for _ in range(max_calls):
            room = K - k
            if room <= 0 or (self.gro and room * width < GSO_MAX_BYTES):
                break
            try:
                if self.gro:
                    n, anc, mflags, addr = self.sock.recvmsg_into([flat[k * width :]], self._cmsg_space,
                                                                  socket.MSG_DONTWAIT)
                    seg = n
                    for level, typ, data in anc:
                        if level == SOL_UDP and typ == UDP_GRO:
                            seg = struct.unpack("H" if len(data) == 2 else "i", data[: 2 if len(data) == 2 else 4])[0]
                else:
                    n, _, mflags, addr = self.sock.recvmsg_into([flat[k * width : (k + 1) * width]], 0,
                                                                socket.MSG_DONTWAIT)
                    seg = n
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                continue
            self.recv_calls += 1
            key = addr_key(addr)
            if not self.gro and mflags & socket.MSG_TRUNC:  # longer than any valid datagram: R4 counts it
                lengths[k], srcs[k] = width + 1, key
                k += 1
                continue
            if n <= width or seg == width:
                m = max(1, -(-n // width))
                lengths[k : k + m] = width
                lengths[k + m - 1] = n - (m - 1) * width
                srcs[k : k + m] = key
                k += m
            else:
                # A GRO run of another segment size (not a flow of ours): re-cut it
                # into rows, truncated like a plain receive would.
                buf = np.frombuffer(flat[k * width : k * width + n], np.uint8).copy()
                for off in range(0, n, seg):
                    if k >= K:
                        break
                    piece = buf[off : off + min(seg, width)]
                    rows[k, : piece.size] = piece
                    lengths[k] = piece.size if seg <= width or n - off <= width else width + 1  # truncated
                    srcs[k] = key
                    k += 1
        return k


def family_of(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address (``::1``, ``fe80::...``), else AF_INET."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


_FNV_PRIME = 1099511628211
_MASK64 = (1 << 64) - 1


def addr_key(addr: tuple) -> int:
    """A (host, port) as the int64 key :meth:`DataSocket.recv_rows` reports (``sockets.h``'s
    ``src_key``): (IPv4 address << 16) | port - also for an IPv4-mapped IPv6 address - and for
    IPv6 bit 62 set over 62 bits of FNV-1a of the address and port."""
    host, port = addr[0], int(addr[1])
    if ":" not in host:
        return (int.from_bytes(socket.inet_aton(host), "big") << 16) | port
    b = socket.inet_pton(socket.AF_INET6, host.split("%")[0])
    if b[:12] == b"\0" * 10 + b"\xff\xff":
        return (int.from_bytes(b[12:], "big") << 16) | port
    h = 1469598103934665603
    for x in (*b, port >> 8, port & 0xFF):
        h = ((h ^ x) * _FNV_PRIME) & _MASK64
    return (h & ((1 << 62) - 1)) | (1 << 62)


def _probe_gso(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
        return True
    except OSError:
        return False
