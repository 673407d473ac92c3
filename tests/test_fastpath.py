"""The optional C helper (dblp._fastpath, built from dblp/_fastpath_c/) against
the crc32c package and the numpy paths, and the send-order encoding that lets
a first pass go out without copies.

The helper is optional where there is no C compiler (the numpy / crc32c paths
run, and every test here that needs it skips); where there is one, a helper
that did not build is a failure, not a skip
(test_helper_builds_where_a_compiler_is)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
from crc32c import crc32c

from core_harness import RUN_ID, run_round
from dblp.protocol import control as ctl
from dblp.protocol import wire
from dblp.protocol.core import ENCODE_SLAB, EncodedRound, RoundSender, send_order
from dblp.protocol.wire import CRC_START, ChunkLayout, encode_chunks

try:
    from dblp import _fastpath as fast
except ImportError as e:  # not built: the numpy / crc32c paths run
    fast, _NOT_BUILT = None, e

COMPILER = shutil.which("gcc") or shutil.which("cc")
needs_helper = pytest.mark.skipif(fast is None, reason="C helper not built (no compiler at install)")


def _reference(rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return np.array([crc32c(rows[i, CRC_START : lengths[i]].tobytes()) for i in range(rows.shape[0])], np.uint32)


@needs_helper
@pytest.mark.parametrize("impl", ["sse4.2", "slicing-by-8", "bytewise"])
def test_every_c_implementation_matches_crc32c(impl):
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 256, (700, 1472), dtype=np.uint8)
    lengths = rng.integers(CRC_START, 1473, 700)
    lengths[:40] = np.arange(CRC_START, CRC_START + 40)  # every tail length 0..39 bytes
    try:
        prev = fast.use(impl)
    except ValueError:
        pytest.skip(f"{impl} not available on this CPU")
    try:
        got = np.empty(700, np.uint32)
        fast.crc_rows(rows, lengths.astype(np.int64), got, CRC_START)
        assert np.array_equal(got, _reference(rows, lengths))
        full = np.empty(700, np.uint32)
        fast.crc_rows(rows, None, full, CRC_START)
        assert np.array_equal(full, _reference(rows, np.full(700, 1472)))
    finally:
        fast.use(prev)


@needs_helper
def test_wire_crc_rows_same_with_and_without_the_helper(monkeypatch):
    rng = np.random.default_rng(6)
    rows = rng.integers(0, 256, (300, 1472), dtype=np.uint8)
    lengths = rng.integers(CRC_START, 1473, 300)
    with_c = wire.crc_rows(rows, lengths)
    monkeypatch.setattr(wire, "_c_crc_rows", None)
    assert np.array_equal(wire.crc_rows(rows, lengths), with_c)
    assert np.array_equal(with_c, _reference(rows, lengths))


@needs_helper
def test_bad_arguments_are_refused_by_name():
    rows = np.zeros((4, 100), np.uint8)
    out = np.empty(4, np.uint32)
    with pytest.raises(ValueError, match="out holds fewer"):
        fast.crc_rows(rows, None, np.empty(3, np.uint32), 8)
    with pytest.raises(ValueError, match="lengths holds fewer"):
        fast.crc_rows(rows, np.full(2, 100, np.int64), out, 8)
    with pytest.raises(ValueError, match="longer than the row"):
        fast.crc_rows(rows, np.array([100, 100, 101, 100], np.int64), out, 8)
    with pytest.raises(ValueError, match="shorter than start"):
        fast.crc_rows(rows, np.array([100, 7, 100, 100], np.int64), out, 8)
    with pytest.raises(ValueError, match="2-D uint8"):
        fast.crc_rows(np.zeros(400, np.uint8), None, out, 8)
    with pytest.raises(ValueError, match="unknown"):
        fast.use("crc64")


@needs_helper
def test_first_pass_is_slices_of_the_send_ordered_buffer():
    lay = ChunkLayout(362 * (ENCODE_SLAB + 900) + 17)  # more than one slab, short tail chunk
    v = np.random.default_rng(1).standard_normal(lay.elements).astype(np.float32)
    order = send_order(lay.chunks, "perm", 3, 5, 2)
    enc = EncodedRound(v, lay, round_no=5, run_id=RUN_ID, sender=2, order=order)
    snd = RoundSender(enc, direction=ctl.UP, now=0.0, order=enc.order, max_batch=300)
    ref_rows, ref_len = encode_chunks(v, lay, np.arange(lay.chunks), run_id=RUN_ID, sender=2, round_no=5)
    sent = 0
    while (b := snd.datagrams_to_send(0.0)) is not None:
        assert np.shares_memory(b.headers, enc.headers)  # a view: no gather, no copy
        assert np.shares_memory(b.values, v)  # payloads are read from the tensor itself
        assert np.array_equal(b.lengths, ref_len[b.seqs])
        for i in range(len(b)):
            n = b.lengths[i]
            assert np.array_equal(b.rows[i, :n], ref_rows[b.seqs[i], :n])
        sent += len(b)
    assert sent == lay.chunks
    # a retransmission pass takes headers by chunk index (a copy), same bytes
    hdr, lengths = enc.take(np.array([lay.chunks - 1, 0, 7]))
    assert not np.shares_memory(hdr, enc.headers)
    for h, s in zip(hdr, [lay.chunks - 1, 0, 7]):
        assert np.array_equal(h, ref_rows[s, :24])


@needs_helper
def test_a_sender_with_another_order_falls_back_to_copies():
    lay = ChunkLayout(362 * 50)
    v = np.arange(lay.elements, dtype=np.float32)
    enc = EncodedRound(v, lay, round_no=0, run_id=RUN_ID, sender=1, order=send_order(lay.chunks, "perm", 1, 0, 0))
    snd = RoundSender(enc, direction=ctl.UP, now=0.0, order="perm", seed=2, stream=0)
    b = snd.datagrams_to_send(0.0)
    assert not np.shares_memory(b.headers, enc.headers)
    ref_rows, _ = encode_chunks(v, lay, b.seqs, run_id=RUN_ID, sender=1, round_no=0)
    assert np.array_equal(b.rows, ref_rows)


@needs_helper
def test_reused_buffer_gives_the_same_round():
    lay = ChunkLayout(362 * 40 + 5)
    v = np.random.default_rng(2).standard_normal(lay.elements).astype(np.float32)
    out1, *_ = run_round(v, 0.0)
    buf = np.full((lay.chunks, 24), 0xAB, np.uint8)  # stale bytes of an earlier round
    enc = EncodedRound(v, lay, round_no=0, run_id=RUN_ID, sender=1, buffer=buf)
    assert enc.headers is buf
    hdr, lengths = enc.take(np.arange(lay.chunks))
    ref, _ = encode_chunks(v, lay, np.arange(lay.chunks), run_id=RUN_ID, sender=1, round_no=0)
    assert np.array_equal(hdr, ref[:, :24])
    assert np.array_equal(wire.assemble_rows(hdr, v, np.arange(lay.chunks), lay)[0], ref)  # padding zeroed
    assert np.array_equal(out1, v)


@needs_helper
def test_c_encode_and_scatter_equal_the_numpy_path(monkeypatch):
    lay = ChunkLayout(362 * 300 + 101, 1500)
    v = np.random.default_rng(3).standard_normal(lay.elements).astype(np.float32)
    seqs = np.random.default_rng(4).permutation(lay.chunks)
    c_rows, c_len = encode_chunks(v, lay, seqs, run_id=0xDEADBEEF, sender=0xFFFF, round_no=2**32 - 1)
    c_out = np.full(lay.elements, np.nan, np.float32)
    full = seqs != lay.chunks - 1
    wire.scatter_payloads(c_rows[full], seqs[full], c_out, lay)
    for name in ("_c_encode_rows", "_c_scatter_rows", "_c_crc_rows"):
        monkeypatch.setattr(wire, name, None)
    py_rows, py_len = encode_chunks(v, lay, seqs, run_id=0xDEADBEEF, sender=0xFFFF, round_no=2**32 - 1)
    assert np.array_equal(c_rows, py_rows) and np.array_equal(c_len, py_len)
    py_out = np.full(lay.elements, np.nan, np.float32)
    wire.scatter_payloads(py_rows[full], seqs[full], py_out, lay)
    assert np.array_equal(c_out, py_out, equal_nan=True)
    body = (lay.chunks - 1) * lay.chunk_floats
    assert np.array_equal(c_out[:body], v[:body])


@needs_helper
def test_c_encode_and_scatter_refuse_out_of_range_indices():
    lay = ChunkLayout(362 * 10)
    v = np.zeros(lay.elements, np.float32)
    rows = np.empty((1, lay.datagram_size), np.uint8)
    with pytest.raises(ValueError, match="outside the tensor"):
        fast.encode_rows(v, np.array([10], np.int64), rows, 1, 1, 1, lay.chunk_floats, b"")
    with pytest.raises(ValueError, match="rows width must be the header"):
        fast.encode_rows(v, np.array([0], np.int64), rows, 1, 1, 1, lay.chunk_floats + 1, b"")
    with pytest.raises(ValueError, match="outside the output"):
        fast.scatter_rows(rows, np.array([10], np.int64), v, lay.chunk_bytes, lay.chunk_bytes, 24)
    with pytest.raises(ValueError, match="outside the output"):
        fast.scatter_rows(rows, np.array([-1], np.int64), v, lay.chunk_bytes, lay.chunk_bytes, 24)


def _receive_all(sock, count: int, width: int) -> tuple[list[bytes], set[int]]:
    import select

    got, keys = [], set()
    rows = np.empty((4096, width), np.uint8)
    lens = np.zeros(4096, np.int64)
    srcs = np.zeros(4096, np.int64)
    while len(got) < count and select.select([sock.sock], [], [], 2.0)[0]:
        k = sock.recv_rows(rows, lens, srcs)
        got.extend(rows[i, : lens[i]].tobytes() for i in range(k))
        keys.update(srcs[:k].tolist())
    return got, keys


@needs_helper
@pytest.mark.parametrize("c_send, c_recv", [(True, True), (False, False), (True, False), (False, True)])
@pytest.mark.parametrize("fast", [None, False])
def test_send_chunks_puts_the_same_bytes_on_the_wire(monkeypatch, c_send, c_recv, fast):
    """Header + payload as two iovec pieces (C, GSO or one per call) or whole
    rows (Python), received by the C loop (GRO runs / recvmmsg) or Python's:
    the receiver reads exactly the datagrams encode_chunks makes, and their source."""
    from dblp.transport import udp

    if not c_send:
        monkeypatch.setattr(udp, "_c_send_chunks", None)
    if not c_recv:
        monkeypatch.setattr(udp, "_c_recv_rows", None)
    lay = ChunkLayout(362 * 500 + 77)
    v = np.random.default_rng(8).standard_normal(lay.elements).astype(np.float32)
    seqs = np.random.default_rng(9).permutation(lay.chunks)
    hdr = wire.encode_headers(v, lay, seqs, run_id=5, sender=2, round_no=3)
    ref, ref_len = encode_chunks(v, lay, seqs, run_id=5, sender=2, round_no=3)
    assert np.array_equal(hdr, ref[:, :24])
    rx, tx = udp.DataSocket("127.0.0.1", 0, fast=fast), udp.DataSocket("127.0.0.1", 0, fast=fast)
    try:
        tx.send_chunks(hdr, v, seqs, ref_len, lay, ("127.0.0.1", rx.port))
        got, keys = _receive_all(rx, lay.chunks, lay.datagram_size)
        tx_port = tx.port
    finally:
        rx.close()
        tx.close()
    assert got == [ref[i, : ref_len[i]].tobytes() for i in range(lay.chunks)]
    assert keys == {udp.addr_key(("127.0.0.1", tx_port))}
    if c_send and tx.gso:
        assert tx.sent_calls < lay.chunks / 20  # GSO: many datagrams per system call


@needs_helper
def test_send_chunks_counts_refused_datagrams_as_lost():
    from dblp.transport import udp

    lay = ChunkLayout(362 * 50)
    v = np.zeros(lay.elements, np.float32)
    seqs = np.arange(lay.chunks)
    hdr = wire.encode_headers(v, lay, seqs, run_id=1, sender=0, round_no=0)
    probe = udp.DataSocket("127.0.0.1", 0)
    port = probe.port
    probe.close()  # nobody listens: ICMP port unreachable -> ECONNREFUSED on later sends
    tx = udp.DataSocket("127.0.0.1", 0, fast=False)
    tx.sock.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_RECVERR", 11), 1)  # report ICMP errors
    try:
        for _ in range(3):
            tx.send_chunks(hdr, v, seqs, lay.payload_lengths(seqs) + 24, lay, ("127.0.0.1", port))
    finally:
        tx.close()
    assert tx.lost_sends > 0  # refused ones are lost, as on a wire, and nothing raised


@needs_helper
@pytest.mark.parametrize("c_recv", [True, False])
def test_odd_sized_and_oversized_datagrams_are_cut_into_rows(monkeypatch, c_recv):
    """A GRO run of another flow's segment size is re-cut row by row; a datagram
    longer than a row is truncated (its CRC will then fail); both keep their source."""
    from dblp.transport import udp

    if not c_recv:
        monkeypatch.setattr(udp, "_c_recv_rows", None)
    rx = udp.DataSocket("127.0.0.1", 0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(30):
            tx.sendto(bytes([i]) * 100, ("127.0.0.1", rx.port))
        tx.sendto(b"\xee" * 3000, ("127.0.0.1", rx.port))
        import time

        time.sleep(0.2)
        got, keys = _receive_all(rx, 31, 1472)
        tx_addr = ("127.0.0.1", tx.getsockname()[1])
    finally:
        rx.close()
        tx.close()
    assert got[:30] == [bytes([i]) * 100 for i in range(30)]
    assert got[30] == b"\xee" * 1472
    assert keys == {udp.addr_key(tx_addr)}


@needs_helper
@pytest.mark.parametrize("n,k,threads", [(25_000_000, 3, 2), (300_001, 5, 4), (4097, 1, 1), (1000, 2, 8)])
def test_fused_mean_is_bit_identical_to_numpy_and_gives_the_norm(monkeypatch, n, k, threads):
    from dblp.protocol import reduce as red

    if red._c_mean_into is None:
        pytest.skip("C helper not built")
    rng = np.random.default_rng(n)
    bufs = [rng.standard_normal(n).astype(np.float32) for _ in range(k)]
    lay = ChunkLayout(n, 1500)
    masks = [np.ones(lay.chunks, bool)] * k
    want = np.empty(n, np.float32)
    red._mean_numpy(bufs, masks, lay, want, "zero")
    got = np.full(n, np.nan, np.float32)
    monkeypatch.setattr(red, "REDUCE_THREADS", threads)
    norm = red.reduce_mean_norm(bufs, masks, lay, got, "zero")
    assert np.array_equal(got, want)  # same float32 sums, same order, every thread's share
    exact = float(np.sqrt(np.sum(want.astype(np.float64) ** 2)))
    assert norm == pytest.approx(exact, rel=1e-12)
    monkeypatch.setattr(red, "_c_mean_into", None)  # the numpy fallback: same mean, float32 norm
    again = np.empty(n, np.float32)
    assert red.reduce_mean_norm(bufs, masks, lay, again, "zero") == pytest.approx(exact, rel=2e-4)  # float32 sdot
    assert np.array_equal(again, want)


@needs_helper
def test_fused_mean_refuses_mismatched_buffers():
    from dblp._fastpath import mean_into

    out = np.zeros(100, np.float32)
    with pytest.raises(ValueError, match="buffer 1"):
        mean_into(out, [np.zeros(100, np.float32), np.zeros(99, np.float32)], 0.5, 1)
    with pytest.raises(ValueError, match="buffer 0"):
        mean_into(out, [np.zeros(100, np.float64)], 1.0, 1)
    with pytest.raises(ValueError, match="float32"):
        mean_into(np.zeros(100, np.float64), [out], 1.0, 1)
    with pytest.raises(ValueError, match="buffers"):
        mean_into(out, [], 1.0, 1)


SOURCES = Path(__file__).resolve().parents[1] / "dblp" / "_fastpath_c"
STUB = Path(__file__).resolve().parents[1] / "dblp" / "_fastpath.pyi"


def test_helper_builds_where_a_compiler_is():
    """Fails, not skips: with a compiler on PATH the helper must import, or every C test above is skipped
    and the fast path silently runs in numpy (the fallback is for machines without one)."""
    if fast is None and COMPILER:
        pytest.fail(f"a C compiler is on PATH ({COMPILER}) but dblp._fastpath does not import ({_NOT_BUILT}). "
                    "Rebuild it: .venv/bin/python -m pip install -e '.[dev]' and read the build output "
                    "(no Python.h: install python3-dev; scripts/setup.sh installs both)")
    if fast is None:
        pytest.skip("no C compiler on PATH: the numpy / crc32c fallback runs")
    assert fast.BEST in ("sse4.2", "slicing-by-8", "bytewise")


@needs_helper
def test_helper_is_not_older_than_its_sources():
    """A helper built in place before its C sources last changed tests the old code: rebuild."""
    built = Path(fast.__file__)
    if built.parent != SOURCES.parent:
        pytest.skip("helper installed away from its sources (not an in-place build)")
    stale = [p.name for p in sorted(SOURCES.iterdir()) if p.stat().st_mtime > built.stat().st_mtime]
    assert not stale, f"{built.name} is older than {stale}: rebuild with .venv/bin/python -m pip install -e '.[dev]'"


def _stub_functions() -> dict[str, int]:
    """Name -> positional parameter count of each function in dblp/_fastpath.pyi."""
    tree = ast.parse(STUB.read_text())
    return {n.name: len(n.args.posonlyargs) + len(n.args.args) for n in tree.body if isinstance(n, ast.FunctionDef)}


@needs_helper
def test_stub_lists_every_export_with_its_arity():
    """dblp/_fastpath.pyi is the helper's typed surface: the same names as the module, and each function
    taking the number of arguments its C side parses (read from PyArg_ParseTuple's TypeError)."""
    stub = _stub_functions()
    exported = {n for n in dir(fast) if not n.startswith("_")}
    assert exported == set(stub) | {"BEST", "MAC"}
    assert "BEST" in STUB.read_text() and "MAC" in STUB.read_text()
    for name, count in stub.items():
        with pytest.raises(TypeError) as err:
            getattr(fast, name)(*([None] * (count + 1)))
        takes = re.search(r"takes (?:exactly|at most) (\d+) argument", str(err.value))  # (at most: optionals)
        assert takes and int(takes.group(1)) == count, f"{name}: stub has {count} arguments, C says {err.value}"
    for name in stub:  # one-line docstrings everywhere
        node = next(n for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name)
        doc = ast.get_docstring(node)
        assert doc and "\n" not in doc, f"{name}: the stub wants a one-line docstring"


@needs_helper
def test_gmac_is_ipsec_mb_where_installed(monkeypatch):
    """setup.sh installs Intel's ipsec-mb; a build that found it tags datagrams with it (4x cheaper than
    OpenSSL 3.0's GCM on this project's machines), and the fallback stays selectable."""
    if not Path("/usr/include/intel-ipsec-mb.h").exists():
        pytest.skip("libipsec-mb-dev not installed: OpenSSL's GCM is the only implementation")
    if " aes " not in Path("/proc/cpuinfo").read_text().replace("\n", " "):
        pytest.skip("no AES-NI: ipsec-mb does not run")
    if os.environ.get("DBLP_GMAC") == "openssl":
        pytest.skip("$DBLP_GMAC=openssl selects the fallback")
    assert fast.MAC == "ipsec-mb"
    assert fast.use_mac("openssl") == "ipsec-mb"
    assert fast.use_mac("ipsec-mb") == "openssl"
    with pytest.raises(ValueError, match="unknown or unavailable GMAC implementation rot13"):
        fast.use_mac("rot13")
