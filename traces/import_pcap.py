"""Loss traces from captures: matching transmissions by key, and a TCP flow's retransmissions.

Whatever carries a per-transmission key (a protocol's own header fields, as
:mod:`dblp.results.traceimport` reads from DBLP datagrams), a capture at the sender
and one at the receiver tell which transmissions were lost:
:func:`match_transmissions` pairs them up, needing no knowledge of the
protocol:

* ``match="count"`` (default, needs no common clock): for each key sent s
  times and received r times, the first s - r transmissions are the lost
  ones (right for a protocol that only resends what the receiver reported
  missing: an earlier copy is the one that was lost).
* ``match="time"`` (both captures on one clock, e.g. Mininet hosts of one
  machine): each received copy is matched to the latest copy sent before it.

TCP: from a capture taken at the sender, a data segment starting below the
highest sequence number already sent is a retransmission, and the
transmission it repeats is counted as lost. Spurious retransmissions
(a timeout that fires although nothing was lost) are counted as losses too:
a capture cannot tell them apart, so the result is an upper bound.

This module knows IP/UDP/TCP and nothing of DBLP: ``traces`` is the lowest
layer (see the README's layout section).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import TraceError
from .meta import TraceMeta
from .model import PacketTrace, SegmentTrace, segments_from_events
from .pcap import IPPROTO_TCP, Capture, format_addr, read_capture


@dataclass
class CaptureImport:
    """A per-packet trace recovered from capture(s), with what it was made from.

    ``times_us`` are the send times (relative to the first packet) of the
    packets of ``packets``, or None when the order is not a time order.
    ``stats`` counts what was read, matched and skipped; ``keys`` is the
    importer's key of each packet where it has one (DBLP: run_id, sender,
    round, seq).
    """

    packets: PacketTrace
    times_us: np.ndarray | None
    stats: dict[str, Any] = field(default_factory=dict)
    keys: np.ndarray | None = None

    @classmethod
    def of_packets(
        cls,
        lost: np.ndarray,
        times_us: np.ndarray | None,
        stats: dict[str, Any],
        *,
        importer: str,
        params: dict[str, Any],
        source: str,
        description: str,
        provenance: str,
        packet_interval_us: float | None = None,
        keys: np.ndarray | None = None,
    ) -> CaptureImport:
        """The import of ``lost`` (one flag per packet) with the metadata every capture importer
        writes: measured or generated, the capture(s) it came from, and under ``extra`` which
        importer made it, with what parameters and what it counted - so any such trace says how
        it was made in the same fields."""
        meta = TraceMeta(
            form="packets",
            provenance=provenance,
            source=source,
            description=description,
            packet_interval_us=packet_interval_us,
            extra={"importer": importer, "params": params, "stats": stats},
        )
        return cls(PacketTrace(lost, meta), times_us, stats, keys)

    @property
    def drops(self) -> np.ndarray:
        return self.packets.drops

    def segments(self, bin_us: int) -> SegmentTrace:
        """Loss fraction per ``bin_us`` window of send time."""
        if self.times_us is None:
            raise TraceError("this import has no send times (receiver-only capture); use the packets form")
        meta = self.packets.meta.with_(form="segments", packet_interval_us=None)
        return segments_from_events(self.times_us, self.packets.drops, int(bin_us), meta)


# -- matching by key -------------------------------------------------------------------
def match_transmissions(
    sent_keys: np.ndarray,
    sent_t: np.ndarray,
    recv_keys: np.ndarray,
    recv_t: np.ndarray,
    match: str = "count",
) -> tuple[np.ndarray, dict[str, int]]:
    """Per sent transmission: True when lost (see the module doc for ``match``).

    Keys are equal-dtype arrays (structured or plain) naming what a copy
    carries; ``*_t`` are capture times in one unit (only compared)."""
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
    return CaptureImport.of_packets(
        lost,
        times_us,
        stats,
        importer="tcp-retransmissions",
        params={"flow": names[pick]},
        source=f"pcap: {os.fspath(capture)} (TCP {names[pick]})",
        description=description or f"TCP retransmissions: {stats['lost']} of {stats['segments']} data segments lost",
        provenance=provenance,
    )
