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
import ipaddress
import os
import socket
import struct
import time

import numpy as np

from dblp.protocol.wire import AUTO_MTU, DEFAULT_MTU, MAX_MTU, MIN_MTU, ChunkLayout, ParameterError, assemble_rows

try:  # the optional C helper (dblp/_fastpath_c/sockets.c, place.c); DBLP_NO_C=1 forces the Python path
    from dblp._fastpath import recv_place as _c_recv_place
    from dblp._fastpath import recv_rows as _c_recv_rows
    from dblp._fastpath import send_chunks as _c_send_chunks
except ImportError:
    _c_send_chunks = _c_recv_rows = _c_recv_place = None
if os.environ.get("DBLP_NO_C"):
    _c_send_chunks = _c_recv_rows = _c_recv_place = None
if os.environ.get("DBLP_NO_PLACE"):  # receive into rows and copy, as before R10 (for A/B comparisons)
    _c_recv_place = None


def place_available() -> bool:
    """Whether receiving straight into the tensor (core rule R10) is available: it needs the C helper."""
    return _c_recv_place is not None


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
        return place_available()

    def recv_place(self, rows: np.ndarray, lengths: np.ndarray, srcs: np.ndarray, aims: np.ndarray,
                   crcs: np.ndarray, plan, max_calls: int = 4096) -> tuple[int, int]:
        """:meth:`recv_rows`, receiving payloads straight into the tensor where
        ``plan`` (a :class:`dblp.protocol.core.Placement`) predicts them (core rule R10).

        Returns ``(k, placed)``. For i < k, ``aims[i] >= 0``: header in
        ``rows[i, :24]``, payload in the slot of chunk ``aims[i]``; ``-1``: the
        whole datagram in ``rows[i, :lengths[i]]``. ``crcs[i]`` (uint32) gets a
        placed datagram's CRC-32C (header from byte 8, then its slot) - on the
        authenticated wire 1 when its tag is valid, else 0 - taken while the
        bytes are in cache. ``rows`` must be header + chunk_bytes wide.
        """
        if not place_available():
            raise RuntimeError("recv_place needs the C helper (dblp._fastpath, off under DBLP_NO_C or "
                               "DBLP_NO_PLACE); check can_place and use recv_rows")
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


# -- the path's MTU (--mtu auto) ---------------------------------------------------------------------
IP_MTU = getattr(socket, "IP_MTU", 14)  # linux/in.h; Python 3.11 does not export it
IPV6_MTU = getattr(socket, "IPV6_MTU", 24)  # linux/in6.h
SIOCGIFCONF = 0x8912
SIOCGIFMTU = 0x8921
WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})

#: ``--mtu auto``'s largest datagram, in link bytes: the largest that still batches. Loopback's MTU
#: is 65,536, but one GSO sendmsg carries at most 65,507 payload bytes, so datagrams up to 32,768
#: bytes still go two (or more) to a send, as one super-packet to a GRO receiver, and larger ones go
#: alone. Measured (docs/benchmark.md, "Path-MTU chunk sizing"; 25M x 3 sharded on lo, alternating,
#: load ~10): 9,000-32,768 bytes all cut the CPU of a run by 14-18% against 1,500 and ran
#: steady rounds (medians 215-231 ms at 32,768); 65,535 cost the least CPU but its first rounds took
#: up to 3.0 s (uploads up to 1.2 s) and its medians 284-423 ms, the widest spread of the sizes.
AUTO_MTU_CAP = 32768


def route_mtu(host: str) -> int | None:
    """The MTU of this host's route to ``host`` (``IP_MTU`` / ``IPV6_MTU`` of a UDP socket connected
    there; nothing is sent), or None when there is no route. Why the worker asks this and the server
    does not: a route to one of this host's own addresses goes through ``lo`` whatever link holds the
    address, so it answers for a sender's path, not for where a server's datagrams arrive."""
    fam = family_of(host)
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            if fam == socket.AF_INET6:
                return s.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU)
            return s.getsockopt(socket.IPPROTO_IP, IP_MTU)
    except OSError:
        return None


def _interface_of(addr: str) -> str | None:
    """The name of the interface holding the address ``addr`` (IPv4: SIOCGIFCONF, aliases such as
    ``eth0:1`` named by their device; IPv6: /proc/net/if_inet6), or None."""
    import array
    import fcntl

    if ":" in addr:
        try:
            want = socket.inet_pton(socket.AF_INET6, addr.split("%")[0]).hex()
            with open("/proc/net/if_inet6", encoding="ascii") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 6 and parts[0] == want:
                        return parts[5]
        except OSError:
            pass
        return None
    try:
        want4 = socket.inet_aton(addr)
        n = 128 * 40  # up to 128 addresses of 40-byte struct ifreq
        buf = array.array("B", bytes(n))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = struct.unpack("iL", fcntl.ioctl(s.fileno(), SIOCGIFCONF,
                                                  struct.pack("iL", n, buf.buffer_info()[0])))[0]
        raw = buf.tobytes()
        for off in range(0, got, 40):
            if raw[off + 20:off + 24] == want4:  # sockaddr_in's address after family and port
                return raw[off:off + 16].split(b"\0", 1)[0].decode().split(":", 1)[0]
    except OSError:
        pass
    return None


def _resolve(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` (an address or a name) as an address; None for a wildcard or a name that does not resolve."""
    if host in WILDCARDS:
        return None
    try:
        addr = socket.getaddrinfo(host, None, family_of(host), socket.SOCK_DGRAM)[0][4][0]
        return ipaddress.ip_address(addr.split("%")[0])
    except (OSError, ValueError):
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or a name of one (localhost)."""
    addr = _resolve(host)
    return addr is not None and addr.is_loopback


def link_mtu(host: str) -> int | None:
    """The MTU of the link a server bound to ``host`` receives its datagrams on: the interface that
    holds the address (``lo`` for 127.0.0.0/8 and ::1), asked with SIOCGIFMTU; None for a
    wildcard, a name that does not resolve or an address of no interface."""
    addr = _resolve(host)
    if addr is None:
        return None
    name = "lo" if addr.is_loopback else _interface_of(str(addr))
    if name is None:
        return None
    import fcntl

    try:  # SIOCGIFMTU: this process's network namespace (a netns without its own /sys mount included)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = fcntl.ioctl(s.fileno(), SIOCGIFMTU, struct.pack("16si20x", name.encode()[:15], 0))
        return struct.unpack("16si20x", req)[1]
    except OSError:
        return None


def auto_mtu(host: str) -> tuple[int, str]:
    """``--mtu auto`` for a server bound to ``host``: the MTU of the link holding that address,
    capped at :data:`AUTO_MTU_CAP` and the IPv4 limit - as TCP sizes its segments from the MSS - and
    a sentence saying where it came from. A wildcard bind cannot know the workers' paths: 1500, the
    Ethernet MTU every path carries (so do addresses that hold no link we can read)."""
    mtu = link_mtu(host)
    if mtu is None:
        why = ("a wildcard bind cannot know its workers' paths" if host in WILDCARDS
               else f"no interface holds {host}")
        return DEFAULT_MTU, f"{DEFAULT_MTU} ({why})"
    got = max(MIN_MTU, min(mtu, AUTO_MTU_CAP, MAX_MTU))
    capped = f", capped at {got}" if got != mtu else ""
    return got, f"{got} (the {mtu}-byte link holding {host}{capped})"


#: IPv6's header is 40 bytes against the 20 of IPv4 that :class:`dblp.protocol.wire.ChunkLayout` counts
IPV6_EXTRA_HEADER = 20


def layout_mtu(link_mtu: int, host: str) -> int:
    """The MTU :class:`dblp.protocol.wire.ChunkLayout` takes (IPv4-sized) for a link of ``link_mtu`` bytes
    carrying ``host``'s address family - the one home of the IPv4/IPv6 header difference."""
    return link_mtu - IPV6_EXTRA_HEADER if family_of(host) == socket.AF_INET6 else link_mtu


def resolve_mtu(mtu: int | str, host: str) -> tuple[int, str]:
    """A ``--mtu`` as given (bytes, or ``auto``: :func:`auto_mtu` for a server bound to ``host``) as
    link bytes and a sentence saying where they came from; any other string is refused by name."""
    if mtu == AUTO_MTU:
        return auto_mtu(host)
    if isinstance(mtu, str):
        raise ParameterError(f"mtu must be a number of bytes or {AUTO_MTU!r}, got {mtu!r}")
    return mtu, f"{mtu} (set)"
