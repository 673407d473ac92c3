"""Read a capture into numpy arrays of IP/UDP/TCP header fields.

scapy reads the file (pcap or pcapng, gzip included) record by record with
its raw reader - no dissection, which would cost ~100 us a packet - and the
link, IP and transport headers are then decoded for all packets at once with
numpy fancy indexing over a padded (packets x bytes) array. Only the first
:data:`HEAD_BYTES` bytes of each packet are kept: enough for an Ethernet +
VLAN + IPv6 + TCP-with-options header and the 24-byte DBLP header.

Supported link types: Ethernet (1), raw IP (12, 101, 228, 229), Linux
cooked v1 (113) and v2 (276), BSD loopback (0). Non-IP frames, non-first IP
fragments and IPv6 extension headers are marked unparsed (``proto`` 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .errors import TraceError

HEAD_BYTES = 160
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = (12, 101, 228, 229)
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
IPPROTO_TCP = 6
IPPROTO_UDP = 17


@dataclass
class Capture:
    """Header fields of every packet of a capture, one array element per packet.

    ``payload_off`` is the offset of the transport payload in ``head``
    (-1 where not parsed); ``payload_len`` its length per the IP header.
    Addresses are 16-byte rows (IPv4 in the IPv4-mapped IPv6 form).
    """

    path: str
    time_ns: np.ndarray  # int64, capture timestamps
    caplen: np.ndarray  # int64, bytes captured
    head: np.ndarray  # (n, HEAD_BYTES) uint8, zero padded
    proto: np.ndarray  # uint8: 6 TCP, 17 UDP, 0 not parsed
    src: np.ndarray  # (n, 16) uint8
    dst: np.ndarray  # (n, 16) uint8
    sport: np.ndarray  # int64
    dport: np.ndarray  # int64
    payload_off: np.ndarray  # int64
    payload_len: np.ndarray  # int64
    tcp_seq: np.ndarray  # int64 (raw 32-bit)
    tcp_flags: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.time_ns.size)

    def payload_bytes(self, rows: np.ndarray, nbytes: int) -> np.ndarray:
        """(len(rows), nbytes) uint8: the first ``nbytes`` of each selected payload."""
        off = self.payload_off[rows][:, None] + np.arange(nbytes)[None, :]
        if off.size and off.max() >= HEAD_BYTES:
            raise TraceError(f"payload header beyond the {HEAD_BYTES} bytes kept per packet")
        return self.head[np.asarray(rows)[:, None], off]


def _be16(h: np.ndarray, rows: np.ndarray, off: np.ndarray) -> np.ndarray:
    return (h[rows, off].astype(np.int64) << 8) | h[rows, off + 1]


def _be32(h: np.ndarray, rows: np.ndarray, off: np.ndarray) -> np.ndarray:
    return (_be16(h, rows, off) << 16) | _be16(h, rows, off + 2)


def read_capture(path: str | os.PathLike) -> Capture:
    """Parse ``path`` (pcap/pcapng) into a :class:`Capture`."""
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapReader

    path = str(path)
    try:
        reader = RawPcapReader(path)
    except (Scapy_Exception, OSError) as e:
        raise TraceError(f"{path}: not a readable pcap/pcapng capture ({e})") from None
    blobs: list[bytes] = []
    times: list[int] = []
    links: list[int] = []
    caplens: list[int] = []
    nano = bool(getattr(reader, "nano", False))
    default_link = getattr(reader, "linktype", LINKTYPE_ETHERNET)
    try:
        for data, md in reader:  # one record at a time; the decoding below is vectorised
            blobs.append(data[:HEAD_BYTES])
            caplens.append(len(data))
            if hasattr(md, "tshigh"):  # pcapng
                ticks = (md.tshigh << 32) | md.tslow
                times.append(int(ticks * 1_000_000_000 // md.tsresol))
                links.append(md.linktype)
            else:
                times.append(md.sec * 1_000_000_000 + md.usec * (1 if nano else 1000))
                links.append(default_link)
    finally:
        reader.close()
    n = len(blobs)
    head = np.zeros((n, HEAD_BYTES), dtype=np.uint8)
    if n:
        flat = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        lens = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=n)
        rows = np.repeat(np.arange(n), lens)
        cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
        head[rows, cols] = flat
    return _decode(path, np.asarray(times, np.int64), np.asarray(caplens, np.int64), head, np.asarray(links, np.int64))


def _decode(path: str, time_ns: np.ndarray, caplen: np.ndarray, head: np.ndarray, link: np.ndarray) -> Capture:
    n = time_ns.size
    idx = np.arange(n)
    l3 = np.full(n, -1, dtype=np.int64)
    ethertype = np.zeros(n, dtype=np.int64)

    eth = link == LINKTYPE_ETHERNET
    et = _be16(head, idx, np.full(n, 12))
    vlan = eth & ((et == 0x8100) | (et == 0x88A8))
    et_inner = _be16(head, idx, np.full(n, 16))
    ethertype = np.where(eth, np.where(vlan, et_inner, et), ethertype)
    l3 = np.where(eth, np.where(vlan, 18, 14), l3)

    sll = link == LINKTYPE_LINUX_SLL
    ethertype = np.where(sll, _be16(head, idx, np.full(n, 14)), ethertype)
    l3 = np.where(sll, 16, l3)
    sll2 = link == LINKTYPE_LINUX_SLL2
    ethertype = np.where(sll2, _be16(head, idx, np.full(n, 0)), ethertype)
    l3 = np.where(sll2, 20, l3)

    raw = np.isin(link, LINKTYPE_RAW) | (link == LINKTYPE_NULL)
    l3 = np.where(link == LINKTYPE_NULL, 4, np.where(raw, 0, l3))
    ver_raw = head[idx, np.clip(l3, 0, HEAD_BYTES - 1)] >> 4
    ethertype = np.where(raw, np.where(ver_raw == 4, 0x0800, np.where(ver_raw == 6, 0x86DD, 0)), ethertype)

    l3c = np.clip(l3, 0, HEAD_BYTES - 60)
    v4 = (l3 >= 0) & (ethertype == 0x0800) & ((head[idx, l3c] >> 4) == 4)
    v6 = (l3 >= 0) & (ethertype == 0x86DD) & ((head[idx, l3c] >> 4) == 6)

    ihl = (head[idx, l3c] & 0x0F).astype(np.int64) * 4
    frag = _be16(head, idx, l3c + 6) & 0x1FFF
    v4 &= (ihl >= 20) & (frag == 0)
    proto = np.where(v4, head[idx, l3c + 9], np.where(v6, head[idx, l3c + 6], 0)).astype(np.int64)
    ip_payload = np.where(v4, _be16(head, idx, l3c + 2) - ihl, np.where(v6, _be16(head, idx, l3c + 4), 0))
    l4 = np.where(v4, l3c + ihl, np.where(v6, l3c + 40, -1))

    src = np.zeros((n, 16), dtype=np.uint8)
    dst = np.zeros((n, 16), dtype=np.uint8)
    r4, r6 = np.flatnonzero(v4), np.flatnonzero(v6)
    if r4.size:
        src[r4, 10:12] = 0xFF
        dst[r4, 10:12] = 0xFF
        src[r4, 12:] = head[r4[:, None], l3c[r4, None] + 12 + np.arange(4)]
        dst[r4, 12:] = head[r4[:, None], l3c[r4, None] + 16 + np.arange(4)]
    if r6.size:
        src[r6] = head[r6[:, None], l3c[r6, None] + 8 + np.arange(16)]
        dst[r6] = head[r6[:, None], l3c[r6, None] + 24 + np.arange(16)]

    ok = (v4 | v6) & ((proto == IPPROTO_TCP) | (proto == IPPROTO_UDP))
    l4c = np.clip(l4, 0, HEAD_BYTES - 20)
    sport = np.where(ok, _be16(head, idx, l4c), 0)
    dport = np.where(ok, _be16(head, idx, l4c + 2), 0)
    tcp = ok & (proto == IPPROTO_TCP)
    udp = ok & (proto == IPPROTO_UDP)
    doff = (head[idx, l4c + 12] >> 4).astype(np.int64) * 4
    payload_off = np.where(tcp, l4c + doff, np.where(udp, l4c + 8, -1))
    payload_len = np.where(tcp, ip_payload - doff, np.where(udp, ip_payload - 8, 0))
    tcp_seq = np.where(tcp, _be32(head, idx, l4c + 4), 0)
    tcp_flags = np.where(tcp, head[idx, l4c + 13], 0).astype(np.int64)
    return Capture(
        path=path,
        time_ns=time_ns,
        caplen=caplen,
        head=head,
        proto=np.where(ok, proto, 0).astype(np.uint8),
        src=src,
        dst=dst,
        sport=sport,
        dport=dport,
        payload_off=payload_off,
        payload_len=np.maximum(payload_len, 0),
        tcp_seq=tcp_seq,
        tcp_flags=tcp_flags,
    )


def format_addr(a: np.ndarray) -> str:
    """Text form of one 16-byte address row."""
    import ipaddress

    b = bytes(a.tolist())
    ip = ipaddress.IPv6Address(b)
    return str(ip.ipv4_mapped) if ip.ipv4_mapped else str(ip)
