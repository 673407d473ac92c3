"""DBLP loss traces from packet captures: ``python -m dblp.results.traceimport``.

DBLP datagrams (header in :mod:`dblp.protocol.wire`) carry ``(run_id, sender, round,
seq)``. With a capture at the sender and one at the receiver, every
transmission the sender made is either found at the receiver or lost; the
pairing is ``traces``' protocol-blind :func:`traces.import_pcap.match_transmissions`
on that key (``match="count"``: DBLP only retransmits a chunk the receiver's
bitmap reported missing, so an earlier copy is the one that was lost;
``match="time"``: both captures on one clock).

With only the receiver's capture, the expected set is every ``seq`` in
``0..expected_chunks-1`` of each round seen; the result is the drop pattern
of first-pass chunks in (round, sender, seq) order, not a time sequence
(DBLP sends a round's chunks in a seeded permutation).

Why here and not in ``traces``: reading a DBLP header needs the wire format,
and ``traces`` is the layer below ``dblp`` (it must not import it). The
generic parts - the capture reader, the key matching, the trace file - stay
in ``traces``; the command line mirrors ``python -m traces import-tcp``::

    python -m dblp.results.traceimport --sent s.pcap --received r.pcap -o run.pkts
    python -m dblp.results.traceimport --received r.pcap --expected-chunks 13812 -o run.pkts
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import numpy as np

from traces.argtypes import int_arg, port_arg, pos_int
from traces.cli import add_capture_output_args, write_result
from traces.errors import TraceError
from traces.import_pcap import CaptureImport, match_transmissions
from traces.pcap import IPPROTO_UDP, Capture, read_capture

from dblp.protocol.wire import HEADER_DTYPE, HEADER_SIZE, KIND_DATA, MAGIC, VERSION, parse_headers
from traces.argtypes import add_verbosity, add_version

KEY_FIELDS = ("run_id", "sender", "round", "seq")
KEY_DTYPE = np.dtype([("run_id", "<u4"), ("sender", "<u2"), ("round", "<u4"), ("seq", "<u4")])


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
    default = f"DBLP datagrams: {stats['lost']} of {stats['sent']} transmissions lost ({match} matching)"
    return CaptureImport.of_packets(lost, times_us, stats, importer="dblp-pcap", params={**params, "match": match},
                                    source=f"pcap: sent {os.fspath(sent)} / received {os.fspath(received)}",
                                    description=description or default, provenance=provenance,
                                    packet_interval_us=interval, keys=_keys(s_hdr))


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
    default = f"DBLP chunks missing per round ({expected_chunks} expected a round), in (round, sender, seq) order"
    return CaptureImport.of_packets(drops, None, stats, importer="dblp-pcap",
                                    params={**params, "expected_chunks": expected_chunks},
                                    source=f"pcap: received {rcap.path}", description=description or default,
                                    provenance=provenance, keys=keys)


# -- command line ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dblp.results.traceimport",
        description="Loss trace from pcap captures of DBLP data datagrams (sender and receiver side, "
        "or receiver only). Writes a traces/FORMAT.md file for `python -m traces show` and the replayers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_version(ap)  # every entry point answers --version
    ap.add_argument("--received", required=True, help="receiver-side capture (pcap or pcapng)")
    ap.add_argument("--sent", default=None, help="sender-side capture (all transmissions); without it, "
                    "--expected-chunks defines what should have arrived")
    ap.add_argument("--port", type=port_arg(), default=None, help="UDP destination port to select (default: any)")
    ap.add_argument("--run-id", type=int_arg(0), default=None, help="DBLP run_id to select (default: any)")
    ap.add_argument("--sender", type=int_arg(0), default=None, help="DBLP sender id to select (default: any)")
    ap.add_argument("--match", choices=("count", "time"), default="count",
                    help="how copies are matched: count (no common clock needed) or time (one clock)")
    ap.add_argument("--expected-chunks", type=pos_int, default=None, help="chunks per round (receiver-only mode)")
    add_capture_output_args(ap)
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        imp = import_dblp_pcap(a.received, a.sent, port=a.port, run_id=a.run_id, sender=a.sender,
                               match=a.match, expected_chunks=a.expected_chunks,
                               provenance=a.provenance, description=a.description)
        print(json.dumps({k: v for k, v in imp.stats.items() if not isinstance(v, dict)}))
        return write_result(imp.segments(a.bin_us) if a.bin_us else imp.packets, a)
    except TraceError as e:  # unreadable capture, nothing selected, bad options
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
