"""pcap import: captures the test writes itself, with a known injected drop pattern."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import CookedLinux, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap, wrpcapng

from dblp.protocol.wire import ChunkLayout, encode_chunks
from traces import PacketTrace, SegmentTrace, TraceError, read_trace, write_trace
from dblp.results.traceimport import import_dblp_pcap
from traces.import_pcap import (
    import_tcp_retransmissions,
    retransmission_losses,
    unwrap_seq,
)
from traces.pcap import read_capture

PORT = 47000
RUN_ID = 0xC0FFEE


def dblp_run(rounds=3, senders=(0, 1), chunks=40, loss=0.15, seed=0):
    """Transmissions of a DBLP-like run with retransmission passes.

    Returns (datagrams, send times, dropped flags) in send order: every round,
    each sender sends its chunks in a permutation; missing chunks are resent
    in later passes until all arrive. ``dropped`` is the injected pattern.
    """
    rng = np.random.default_rng(seed)
    layout = ChunkLayout(elements=chunks * 20 - 7, mtu=20 * 4 + 52)  # 20 floats per chunk, short tail
    values = rng.standard_normal(layout.elements).astype(np.float32)
    dgrams, times, dropped, srcs = [], [], [], []
    t = 1_700_000_000.0
    for rnd in range(rounds):
        for s in senders:
            missing = rng.permutation(layout.chunks)
            while missing.size:
                rows, lengths = encode_chunks(values, layout, missing, run_id=RUN_ID, sender=s, round_no=rnd)
                lost = rng.random(missing.size) < loss
                for i in range(missing.size):
                    dgrams.append(bytes(rows[i, : lengths[i]]))
                    times.append(t)
                    dropped.append(bool(lost[i]))
                    srcs.append(s)
                    t += 12e-6
                missing = missing[lost]
                t += 200e-6  # probe / bitmap round trip
    return dgrams, np.array(times), np.array(dropped), np.array(srcs), layout


def udp_frame(payload: bytes, sender: int, dport=PORT):
    return Ether() / IP(src=f"10.0.0.{sender + 1}", dst="10.0.0.100") / UDP(sport=40000 + sender, dport=dport) / Raw(payload)


def write_pair(tmp_path, dgrams, times, dropped, srcs, *, skew=0.0):
    sent = [udp_frame(d, s) for d, s in zip(dgrams, srcs)]
    for p, t in zip(sent, times):
        p.time = t
    noise = Ether() / IP() / UDP(dport=53) / Raw(b"not dblp at all, just dns-ish bytes")
    noise.time = times[0]
    recv = []
    for p, t, d in zip(sent, times, dropped):
        if not d:
            q = p.copy()
            q.time = t + 50e-6 + skew
            recv.append(q)
    sp, rp = tmp_path / "sent.pcap", tmp_path / "recv.pcap"
    wrpcap(str(sp), [noise] + sent)
    wrpcap(str(rp), recv + [noise])
    return sp, rp


@pytest.fixture(scope="module")
def run():
    return dblp_run()


@pytest.mark.parametrize("match", ["count", "time"])
def test_dblp_two_captures_recover_injected_drops(tmp_path, run, match):
    dgrams, times, dropped, srcs, _ = run
    sp, rp = write_pair(tmp_path, dgrams, times, dropped, srcs)
    imp = import_dblp_pcap(rp, sp, match=match)
    assert isinstance(imp.packets, PacketTrace)
    assert np.array_equal(imp.drops, dropped)  # exactly the injected pattern, in send order
    assert imp.stats["sent"] == len(dgrams) and imp.stats["lost"] == int(dropped.sum())
    assert imp.stats["sent_capture"]["not_dblp"] == 1
    assert imp.packets.meta.provenance == "measured"
    assert dropped.sum() > 20 and (~dropped).sum() > 100


def test_dblp_count_matching_survives_clock_skew(tmp_path, run):
    dgrams, times, dropped, srcs, _ = run
    sp, rp = write_pair(tmp_path, dgrams, times, dropped, srcs, skew=-3600.0)
    assert np.array_equal(import_dblp_pcap(rp, sp, match="count").drops, dropped)


def test_dblp_filters_and_segments(tmp_path, run):
    dgrams, times, dropped, srcs, _ = run
    sp, rp = write_pair(tmp_path, dgrams, times, dropped, srcs)
    one = import_dblp_pcap(rp, sp, sender=1)
    assert np.array_equal(one.drops, dropped[srcs == 1])
    assert np.array_equal(import_dblp_pcap(rp, sp, run_id=RUN_ID, port=PORT).drops, dropped)
    for kw in ({"port": PORT + 1}, {"run_id": RUN_ID + 1}):
        with pytest.raises(TraceError, match="no DBLP data datagrams"):
            import_dblp_pcap(rp, sp, **kw)
    seg = import_dblp_pcap(rp, sp).segments(500)
    assert isinstance(seg, SegmentTrace) and 0 < seg.mean_loss() < 1
    back = read_trace(write_trace(seg, tmp_path / "x.loss.csv"))
    assert back.meta.extra["importer"] == "dblp-pcap"


def test_dblp_receiver_only(tmp_path, run):
    dgrams, times, dropped, srcs, layout = run
    sp, rp = write_pair(tmp_path, dgrams, times, dropped, srcs)
    imp = import_dblp_pcap(rp, expected_chunks=layout.chunks)
    # every chunk is eventually delivered in this run, so nothing is missing ...
    assert imp.stats["expected"] == 3 * 2 * layout.chunks and imp.drops.sum() == 0
    # ... unless the receiver capture stops after the first pass: drop the retransmissions
    first_pass_keys = set()
    keep = []
    from dblp.protocol.wire import parse_headers

    for i, d in enumerate(dgrams):
        h = parse_headers(np.frombuffer(d, np.uint8)[None, :])[0]
        k = (int(h["sender"]), int(h["round"]), int(h["seq"]))
        first = k not in first_pass_keys
        first_pass_keys.add(k)
        keep.append(first)
    keep = np.array(keep)
    sp2, rp2 = write_pair(tmp_path, [d for d, k in zip(dgrams, keep) if k], times[keep], dropped[keep], srcs[keep])
    imp2 = import_dblp_pcap(rp2, expected_chunks=layout.chunks)
    assert imp2.drops.sum() == dropped[keep].sum()
    with pytest.raises(TraceError, match="expected_chunks"):
        import_dblp_pcap(rp2)


def test_dblp_pcapng_and_cooked_linux(tmp_path, run):
    dgrams, times, dropped, srcs, _ = run
    n = 60
    sent = [CookedLinux() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(dport=PORT) / Raw(d) for d in dgrams[:n]]
    recv6 = [Ether() / IPv6() / UDP(dport=PORT) / Raw(d) for d, x in zip(dgrams[:n], dropped[:n]) if not x]
    for p, t in zip(sent, times):
        p.time = t
    wrpcap(str(tmp_path / "s.pcap"), sent)
    wrpcapng(str(tmp_path / "r.pcapng"), recv6)
    imp = import_dblp_pcap(tmp_path / "r.pcapng", tmp_path / "s.pcap")
    assert np.array_equal(imp.drops, dropped[:n])


def test_capture_reader_fields(tmp_path):
    pkts = [
        Ether() / IP(src="1.2.3.4", dst="5.6.7.8", ihl=6, options=b"\x01\x01\x01\x01") / UDP(sport=1, dport=2) / Raw(b"x" * 30),
        Ether() / IP() / TCP(sport=3, dport=4, seq=123456, flags="PA", options=[("NOP", None)] * 4) / Raw(b"y" * 10),
        Ether(type=0x0806) / Raw(b"\x00" * 28),
    ]
    wrpcap(str(tmp_path / "c.pcap"), pkts)
    cap = read_capture(tmp_path / "c.pcap")
    assert cap.proto.tolist() == [17, 6, 0]
    assert cap.payload_len.tolist()[:2] == [30, 10]
    assert cap.tcp_seq[1] == 123456 and cap.sport[1] == 3 and cap.dport[1] == 4
    assert bytes(cap.payload_bytes(np.array([0]), 3)[0]) == b"xxx"
    with pytest.raises(TraceError, match="not a readable"):
        (tmp_path / "junk.pcap").write_bytes(b"hello world, not a pcap")
        read_capture(tmp_path / "junk.pcap")


# -- TCP -----------------------------------------------------------------------------
def tcp_capture(tmp_path, start_seq=(1 << 32) - 2500):
    """A sender capture: 12 x 1000-byte segments across the 32-bit wrap, with losses.

    Segments 3 and 7 are retransmitted whole; segment 10 is retransmitted as
    two halves (new boundaries); the first retransmission of 7 is lost again.
    """
    A, B = "10.0.0.1", "10.0.0.2"
    seg = 1000

    def data(i, off=0, ln=seg, t=0.0):
        p = Ether() / IP(src=A, dst=B) / TCP(sport=5001, dport=80, flags="PA", seq=(start_seq + i * seg + off) % (1 << 32)) / Raw(b"d" * ln)
        p.time = t
        return p

    def ack(t):
        p = Ether() / IP(src=B, dst=A) / TCP(sport=80, dport=5001, flags="A", seq=1)
        p.time = t
        return p

    other = Ether() / IP(src="10.0.0.9", dst=B) / TCP(sport=7, dport=9, flags="PA", seq=5) / Raw(b"z" * 20)
    other.time = 0.5
    pkts, expected = [], []
    t = 1.0
    for i in range(12):
        pkts.append(data(i, t=t)); expected.append(i in (3, 7, 10)); t += 0.001
        pkts.append(ack(t)); t += 0.001
    pkts.append(data(3, t=t)); expected.append(False); t += 0.01
    pkts.append(data(7, t=t)); expected.append(True); t += 0.01    # lost again
    pkts.append(data(10, 0, 500, t=t)); expected.append(False); t += 0.01
    pkts.append(data(10, 500, 500, t=t)); expected.append(False); t += 0.01
    pkts.append(data(7, t=t)); expected.append(False); t += 0.01
    pkts.insert(0, other)
    path = tmp_path / "tcp.pcap"
    wrpcap(str(path), pkts)
    return path, np.array(expected)


def test_tcp_retransmissions_recover_losses(tmp_path):
    path, expected = tcp_capture(tmp_path)
    imp = import_tcp_retransmissions(path)
    assert imp.stats["flow"] == "10.0.0.1:5001>10.0.0.2:80"
    assert imp.stats["retransmissions"] == 5
    assert np.array_equal(imp.drops, expected)
    assert imp.segments(5000).mean_loss() > 0
    only = import_tcp_retransmissions(path, flow="10.0.0.9:7>10.0.0.2:9")
    assert only.drops.tolist() == [False]
    with pytest.raises(TraceError, match="not in the capture"):
        import_tcp_retransmissions(path, flow="1.1.1.1:1>2.2.2.2:2")


def test_tcp_without_wraparound(tmp_path):
    path, expected = tcp_capture(tmp_path, start_seq=1000)
    assert np.array_equal(import_tcp_retransmissions(path).drops, expected)


def test_unwrap_and_loss_rule_vectorised():
    assert unwrap_seq(np.array([(1 << 32) - 10, 5, 20])).tolist() == [(1 << 32) - 10, (1 << 32) + 5, (1 << 32) + 20]
    seq = np.array([0, 100, 200, 100, 300, 0])
    ln = np.array([100, 100, 100, 100, 100, 100])
    lost, retx = retransmission_losses(seq, ln)
    assert retx.tolist() == [False, False, False, True, False, True]
    assert lost.tolist() == [True, True, False, False, False, False]
