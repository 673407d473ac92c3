"""Loss traces from captures: DBLP's own datagrams, or a TCP flow's retransmissions.

DBLP datagrams (header in ``dblp/wire.py``) carry ``(run_id, sender, round,
seq)``. With a capture at the sender and one at the receiver, every
transmission the sender made is either found at the receiver or lost:

* ``match="count"`` (default, needs no common clock): for each key sent s
  times and received r times, the first s - r transmissions are the lost
  ones. DBLP only retransmits a chunk the receiver's bitmap reported
  missing, so an earlier copy is the one that was lost.
* ``match="time"`` (both captures on one clock, e.g. Mininet hosts of one
  machine): each received copy is matched to the latest copy sent before it.

With only the receiver's capture, the expected set is every ``seq`` in
``0..expected_chunks-1`` of each round seen; the result is the drop pattern
of first-pass chunks in (round, sender, seq) order, not a time sequence
(DBLP sends a round's chunks in a seeded permutation).

TCP: from a capture taken at the sender, a data segment starting below the
highest sequence number already sent is a retransmission, and the
transmission it repeats is counted as lost. Spurious retransmissions
(a timeout that fires although nothing was lost) are counted as losses too:
a capture cannot tell them apart, so the result is an upper bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dblp.wire import HEADER_DTYPE, HEADER_SIZE, KIND_DATA, MAGIC, VERSION, parse_headers

from .errors import TraceError
from .meta import TraceMeta
from .model import PacketTrace, SegmentTrace, segments_from_events
from .pcap import IPPROTO_TCP, IPPROTO_UDP, Capture, format_addr, read_capture

KEY_FIELDS = ("run_id", "sender", "round", "seq")
KEY_DTYPE = np.dtype([("run_id", "<u4"), ("sender", "<u2"), ("round", "<u4"), ("seq", "<u4")])


@dataclass
class CaptureImport:
    """A per-packet trace recovered from capture(s), with what it was made from.

    ``times_us`` are the send times (relative to the first packet) of the
    packets of ``packets``, or None when the order is not a time order.
    ``stats`` counts what was read, matched and skipped.
    """

    packets: PacketTrace
    times_us: np.ndarray | None
    stats: dict[str, Any] = field(default_factory=dict)
    keys: np.ndarray | None = None  # DBLP: (run_id, sender, round, seq) of each packet

    @property
    def drops(self) -> np.ndarray:
        return self.packets.drops

    def segments(self, bin_us: int) -> SegmentTrace:
        """Loss fraction per ``bin_us`` window of send time."""
        if self.times_us is None:
            raise TraceError("this import has no send times (receiver-only capture); use the packets form")
        meta = self.packets.meta.with_(form="segments", packet_interval_us=None)
        return segments_from_events(self.times_us, self.packets.drops, int(bin_us), meta)


# -- DBLP ----------------------------------------------------------------------------
def dblp_datagrams(
    cap: Capture, *, port: int | None = None, run_id: int | None = None, sender: int | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Rows of ``cap`` holding DBLP data datagrams, their (n,) HEADER_DTYPE headers, and skip counts.

    A datagram counts when its UDP payload starts with the DBLP magic,
    version and data kind and its length field agrees with the UDP length.
    """
    udp = np.flatnonzero(
        (cap.proto == IPPROTO_UDP)
        & (cap.payload_len >= HEADER_SIZE)
        & (cap.payload_off + HEADER_SIZE <= np.minimum(cap.caplen, cap.head.shape[1]))
    )
    if port is not None:
        udp = udp[cap.dport[udp] == port]
    raw = np.ascontiguousarray(cap.payload_bytes(udp, HEADER_SIZE))
    hdr = parse_headers(raw) if udp.size else np.zeros(0, HEADER_DTYPE)
    ok = (hdr["magic"] == MAGIC) & (hdr["version"] == VERSION) & (hdr["kind"] == KIND_DATA)
    consistent = hdr["length"].astype(np.int64) == cap.payload_len[udp] - HEADER_SIZE
    keep = ok & consistent
    if run_id is not None:
        keep &= hdr["run_id"] == run_id
    if sender is not None:
        keep &= hdr["sender"] == sender
    counts = {
        "packets": len(cap),
        "dblp": int(keep.sum()),
        "not_dblp": int(len(cap) - ok.sum()),
        "bad_length": int((ok & ~consistent).sum()),
    }
    return udp[keep], hdr[keep], counts


def _keys(hdr: np.ndarray) -> np.ndarray:
    k = np.empty(hdr.size, KEY_DTYPE)
    for f in KEY_FIELDS:
        k[f] = hdr[f]
    return k


def match_transmissions(
    sent_keys: np.ndarray,
    sent_t: np.ndarray,
    recv_keys: np.ndarray,
    recv_t: np.ndarray,
    match: str = "count",
) -> tuple[np.ndarray, dict[str, int]]:
    """Per sent transmission: True when lost (see the module doc for ``match``)."""
    ns = sent_keys.size
    _, inv = np.unique(np.concatenate([sent_keys, recv_keys]), return_inverse=True)
    inv = inv.reshape(-1)
    ks, kr = inv[:ns], inv[ns:]
    nk = int(inv.max()) + 1 if inv.size else 0
    sent_count = np.bincount(ks, minlength=nk)
    recv_count = np.bincount(kr, minlength=nk)
    foreign = int(np.sum(sent_count[kr] == 0))
    stats = {"received_not_sent": foreign, "duplicates": int(np.maximum(recv_count - sent_count, 0)[sent_count > 0].sum())}
    if match == "count":
        order = np.lexsort((sent_t, ks))
        sk = ks[order]
        rank = np.arange(ns) - np.searchsorted(sk, sk, side="left")
        n_lost = sent_count - np.minimum(recv_count, sent_count)
        lost = np.empty(ns, dtype=bool)
        lost[order] = rank < n_lost[sk]
        return lost, stats
    if match != "time":
        raise TraceError(f"match must be 'count' or 'time', got {match!r}")
    ev_k = np.concatenate([ks, kr])
    ev_t = np.concatenate([sent_t, recv_t])
    ev_r = np.concatenate([np.zeros(ns, bool), np.ones(kr.size, bool)])
    order = np.lexsort((ev_r, ev_t, ev_k))
    is_sent = ~ev_r[order]
    pos = np.arange(order.size)
    last_sent = np.maximum.accumulate(np.where(is_sent, pos, -1))
    rpos = np.flatnonzero(~is_sent)
    ls = last_sent[rpos]
    k_sorted = ev_k[order]
    valid = (ls >= 0) & (k_sorted[np.maximum(ls, 0)] == k_sorted[rpos])
    delivered = np.zeros(ns, dtype=bool)
    delivered[order[ls[valid]]] = True
    # a copy "received before it was sent" means the clocks differ: credit the key's first send
    early = rpos[~valid]
    early_k = k_sorted[early]
    early_k = early_k[sent_count[early_k] > 0]
    if early_k.size:
        first_sent = np.full(nk, -1)
        so = np.lexsort((sent_t, ks))
        first_sent[ks[so][::-1]] = so[::-1]
        delivered[first_sent[early_k]] = True
    stats["received_before_sent"] = int(early_k.size)
    return ~delivered, stats


def import_dblp_pcap(
    received: str | os.PathLike,
    sent: str | os.PathLike | None = None,
    *,
    port: int | None = None,
    run_id: int | None = None,
    sender: int | None = None,
    match: str = "count",
    expected_chunks: int | None = None,
    provenance: str = "measured",
    description: str = "",
) -> CaptureImport:
    """A per-packet loss trace of DBLP data datagrams from captures.

    ``sent`` is the sender-side capture (every transmission, retransmissions
    included); ``received`` the receiver-side one. Without ``sent``,
    ``expected_chunks`` (chunks per round) defines what should have arrived.
    ``port``, ``run_id`` and ``sender`` narrow the selection.
    """
    rcap = read_capture(received)
    r_rows, r_hdr, r_counts = dblp_datagrams(rcap, port=port, run_id=run_id, sender=sender)
    params: dict[str, Any] = {"port": port, "run_id": run_id, "sender": sender}
    if sent is None:
        return _import_receiver_only(rcap, r_hdr, r_counts, expected_chunks, params, provenance, description)
    scap = read_capture(sent)
    s_rows, s_hdr, s_counts = dblp_datagrams(scap, port=port, run_id=run_id, sender=sender)
    if s_rows.size == 0:
        raise TraceError(f"{sent}: no DBLP data datagrams found (check port/run_id/sender)")
    s_t = scap.time_ns[s_rows]
    order = np.argsort(s_t, kind="stable")
    s_rows, s_hdr, s_t = s_rows[order], s_hdr[order], s_t[order]
    lost, mstats = match_transmissions(_keys(s_hdr), s_t, _keys(r_hdr), rcap.time_ns[r_rows], match)
    times_us = (s_t - s_t[0]) / 1000.0
    span = float(times_us[-1]) if times_us.size > 1 else 0.0
    interval = span / (times_us.size - 1) if times_us.size > 1 and span > 0 else None
    stats = {
        "sent": int(s_rows.size),
        "received": int(r_rows.size),
        "lost": int(lost.sum()),
        **mstats,
        "sent_capture": s_counts,
        "received_capture": r_counts,
    }
    meta = TraceMeta(
        form="packets",
        provenance=provenance,
        source=f"pcap: sent {os.fspath(sent)} / received {os.fspath(received)}",
        description=description
        or f"DBLP datagrams: {stats['lost']} of {stats['sent']} transmissions lost ({match} matching)",
        packet_interval_us=interval,
        extra={"importer": "dblp-pcap", "params": {**params, "match": match}, "stats": stats},
    )
    return CaptureImport(PacketTrace(lost, meta), times_us, stats, _keys(s_hdr))


def _import_receiver_only(
    rcap: Capture,
    r_hdr: np.ndarray,
    r_counts: dict[str, int],
    expected_chunks: int | None,
    params: dict[str, Any],
    provenance: str,
    description: str,
) -> CaptureImport:
    if not expected_chunks or expected_chunks <= 0:
        raise TraceError("without a sender-side capture, expected_chunks (chunks per round) is required")
    if r_hdr.size == 0:
        raise TraceError(f"{rcap.path}: no DBLP data datagrams found (check port/run_id/sender)")
    grp = np.empty(r_hdr.size, [("run_id", "<u4"), ("round", "<u4"), ("sender", "<u2")])
    for f in grp.dtype.names:  # type: ignore[union-attr]
        grp[f] = r_hdr[f]
    groups, gid = np.unique(grp, return_inverse=True)
    gid = gid.reshape(-1)
    seq = r_hdr["seq"].astype(np.int64)
    inside = seq < expected_chunks
    got = np.zeros(groups.size * expected_chunks, dtype=bool)
    got[gid[inside] * expected_chunks + seq[inside]] = True
    drops = ~got
    keys = np.empty(got.size, KEY_DTYPE)
    keys["run_id"] = np.repeat(groups["run_id"], expected_chunks)
    keys["sender"] = np.repeat(groups["sender"], expected_chunks)
    keys["round"] = np.repeat(groups["round"], expected_chunks)
    keys["seq"] = np.tile(np.arange(expected_chunks), groups.size)
    stats = {
        "expected": int(got.size),
        "received": int(r_hdr.size),
        "lost": int(drops.sum()),
        "out_of_range": int((~inside).sum()),
        "rounds": int(groups.size),
        "received_capture": r_counts,
    }
    meta = TraceMeta(
        form="packets",
        provenance=provenance,
        source=f"pcap: received {rcap.path}",
        description=description
        or f"DBLP chunks missing per round ({expected_chunks} expected a round), in (round, sender, seq) order",
        extra={"importer": "dblp-pcap", "params": {**params, "expected_chunks": expected_chunks}, "stats": stats},
    )
    return CaptureImport(PacketTrace(drops, meta), None, stats, keys)


# -- TCP retransmissions ---------------------------------------------------------------
def _flow_ids(cap: Capture, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rec = np.empty(rows.size, [("src", "V16"), ("dst", "V16"), ("sport", "<i8"), ("dport", "<i8")])
    rec["src"] = np.ascontiguousarray(cap.src[rows]).view("V16").reshape(-1)
    rec["dst"] = np.ascontiguousarray(cap.dst[rows]).view("V16").reshape(-1)
    rec["sport"] = cap.sport[rows]
    rec["dport"] = cap.dport[rows]
    flows, inv = np.unique(rec, return_inverse=True)
    return flows, inv.reshape(-1)


def _flow_name(cap: Capture, row: int) -> str:
    return f"{format_addr(cap.src[row])}:{cap.sport[row]}>{format_addr(cap.dst[row])}:{cap.dport[row]}"


def unwrap_seq(seq: np.ndarray) -> np.ndarray:
    """32-bit TCP sequence numbers made monotone-comparable across wrap-around."""
    s = np.asarray(seq, dtype=np.int64)
    if s.size == 0:
        return s
    d = np.diff(s) % (1 << 32)
    d = np.where(d >= (1 << 31), d - (1 << 32), d)
    return s[0] + np.concatenate(([0], np.cumsum(d)))


def retransmission_losses(seq: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lost, retransmission) flags for data segments in send order.

    A segment is a retransmission when it starts below the highest sequence
    number sent before it. The transmission it repeats - the latest earlier
    one with the same start, else the first transmission covering its start -
    is marked lost.
    """
    s = unwrap_seq(seq)
    end = s + np.asarray(length, dtype=np.int64)
    n = s.size
    prev_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]))
    retx = s < prev_max
    lost = np.zeros(n, dtype=bool)
    order = np.lexsort((np.arange(n), s))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    ri = np.flatnonzero(retx)
    p = pos[ri]
    prev = order[np.maximum(p - 1, 0)]
    exact = (p > 0) & (s[prev] == s[ri])
    lost[prev[exact]] = True
    rest = ri[~exact]
    if rest.size:
        orig = np.flatnonzero(~retx)
        j = orig[np.maximum(np.searchsorted(s[orig], s[rest], side="right") - 1, 0)]
        covers = (s[j] <= s[rest]) & (s[rest] < end[j])
        lost[j[covers]] = True
    return lost, retx


def import_tcp_retransmissions(
    capture: str | os.PathLike,
    *,
    flow: str | None = None,
    provenance: str = "measured",
    description: str = "",
) -> CaptureImport:
    """Per-packet loss trace of one TCP flow's data segments from a sender-side capture.

    ``flow`` is ``"SRC:SPORT>DST:DPORT"``; by default the direction carrying
    the most payload bytes.
    """
    cap = read_capture(capture)
    rows = np.flatnonzero((cap.proto == IPPROTO_TCP) & (cap.payload_len > 0))
    if rows.size == 0:
        raise TraceError(f"{capture}: no TCP data segments")
    flows, fid = _flow_ids(cap, rows)
    names = [_flow_name(cap, int(rows[np.flatnonzero(fid == i)[0]])) for i in range(flows.size)]
    if flow is None:
        pick = int(np.argmax(np.bincount(fid, weights=cap.payload_len[rows])))
    else:
        want = flow.replace(" ", "")
        if want not in names:
            raise TraceError(f"flow {flow!r} not in the capture; flows with data: {', '.join(names)}")
        pick = names.index(want)
    sel = rows[fid == pick]
    sel = sel[np.argsort(cap.time_ns[sel], kind="stable")]
    lost, retx = retransmission_losses(cap.tcp_seq[sel], cap.payload_len[sel])
    t = cap.time_ns[sel]
    times_us = (t - t[0]) / 1000.0
    stats = {
        "segments": int(sel.size),
        "retransmissions": int(retx.sum()),
        "lost": int(lost.sum()),
        "flow": names[pick],
        "flows": len(names),
    }
    meta = TraceMeta(
        form="packets",
        provenance=provenance,
        source=f"pcap: {os.fspath(capture)} (TCP {names[pick]})",
        description=description
        or f"TCP retransmissions: {stats['lost']} of {stats['segments']} data segments lost",
        extra={"importer": "tcp-retransmissions", "params": {"flow": names[pick]}, "stats": stats},
    )
    return CaptureImport(PacketTrace(lost, meta), times_us, stats)
