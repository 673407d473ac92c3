"""Round-trips of both trace forms, and refusal of every malformed-trace case."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import (
    PacketTrace,
    SegmentTrace,
    TraceFormatError,
    TraceMeta,
    dumps,
    loads,
    read_trace,
    write_trace,
)

GEN = {"name": "test", "params": {"a": 1}}


def seg_meta(**kw) -> TraceMeta:
    return TraceMeta(form="segments", provenance="generated", source="test", description="d", seed=3, generator=GEN, **kw)


def pkt_meta(**kw) -> TraceMeta:
    return TraceMeta(form="packets", provenance="generated", source="test", description="d", seed=3, generator=GEN, **kw)


def same_segments(a: SegmentTrace, b: SegmentTrace) -> None:
    assert np.array_equal(a.start_us, b.start_us)
    assert np.array_equal(a.loss, b.loss)
    assert a.duration_us == b.duration_us
    for x, y in ((a.rate_bps, b.rate_bps), (a.queue_pkts, b.queue_pkts)):
        assert (x is None) == (y is None)
        if x is not None:
            assert np.array_equal(x, y, equal_nan=True)
    assert a.meta == b.meta


# -- round trips -----------------------------------------------------------------
def test_segments_round_trip_loss_only(tmp_path):
    tr = SegmentTrace(np.array([0, 10, 250]), np.array([0.0, 0.7, 1 / 3]), 1000, meta=seg_meta(loop=True, link="s1-eth2"))
    p = write_trace(tr, tmp_path / "a.loss.csv")
    same_segments(tr, read_trace(p))
    same_segments(tr, loads(dumps(tr)))


def test_segments_round_trip_rate_queue_with_defaults(tmp_path):
    tr = SegmentTrace(
        np.array([0, 5, 9]),
        np.array([0.1, 0.0, 1.0]),
        12,
        rate_bps=np.array([1e9, np.nan, 2.5e8]),
        queue_pkts=np.array([np.nan, 100, 7]),
        meta=TraceMeta(form="segments", provenance="measured", source="cap.pcap", description="", extra={"k": [1, 2]}),
    )
    text = dumps(tr)
    assert "start_us,loss,rate_bps,queue_pkts" in text
    assert "\n5,0.0,,100\n" in text  # empty cell = link default
    same_segments(tr, loads(text))
    p = write_trace(tr, tmp_path / "a.loss.csv.gz")
    same_segments(tr, read_trace(p))


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000])
def test_packets_round_trip(tmp_path, n):
    rng = np.random.default_rng(n)
    tr = PacketTrace(rng.random(n) < 0.3, pkt_meta(packet_interval_us=1.2))
    back = read_trace(write_trace(tr, tmp_path / "a.pkts"))
    assert isinstance(back, PacketTrace)
    assert np.array_equal(back.drops, tr.drops)
    assert back.meta == tr.meta


def test_packets_reader_accepts_any_line_length_and_comments():
    head = json.dumps(pkt_meta().to_header(packets=7))
    tr = loads(f"# {head}\n010\n# a comment\n1\n100\n")
    assert tr.drops.tolist() == [False, True, False, True, True, False, False]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 10**9), min_size=0, max_size=30, unique=True),
    st.data(),
)
def test_segments_round_trip_property(gaps, data):
    starts = np.concatenate(([0], np.cumsum(sorted(gaps)))).astype(np.int64)
    loss = np.array(data.draw(st.lists(st.floats(0, 1), min_size=starts.size, max_size=starts.size)))
    dur = int(starts[-1]) + data.draw(st.integers(1, 10**6))
    tr = SegmentTrace(starts, loss, dur, meta=seg_meta())
    same_segments(tr, loads(dumps(tr)))


# -- refusals ----------------------------------------------------------------------
def seg_text(rows: list[str], *, columns: str = "start_us,loss", meta: dict | None = None, duration=1000, nrows=None) -> str:
    m = seg_meta().to_header(duration_us=duration, rows=len(rows) if nrows is None else nrows)
    if meta is not None:
        m.update(meta)
        m = {k: v for k, v in m.items() if v is not _DEL}
    return "# " + json.dumps(m) + "\n" + columns + "\n" + "\n".join(rows) + "\n"


_DEL = object()

BAD_SEGMENTS = [
    # (name, text, line, reason fragment)
    ("unsorted times", seg_text(["0,0.1", "500,0.2", "300,0.3"]), 5, "times must increase"),
    ("repeated time", seg_text(["0,0.1", "500,0.2", "500,0.3"]), 5, "times must increase"),
    ("loss above 1", seg_text(["0,0.1", "10,1.2"]), 4, "outside [0, 1]"),
    ("loss below 0", seg_text(["0,-0.01"]), 3, "outside [0, 1]"),
    ("loss nan", seg_text(["0,nan"]), 3, "not a finite number"),
    ("loss not a number", seg_text(["0,0.1", "10,abc"]), 4, "not a number"),
    ("loss empty", seg_text(["0,0.1", "10,"]), 4, "empty loss"),
    ("missing field", seg_text(["0,0.1", "10"]), 4, "expected 2 fields"),
    ("extra field", seg_text(["0,0.1", "10,0.2,5"]), 4, "expected 2 fields"),
    ("start not integer", seg_text(["0,0.1", "1.5,0.2"]), 4, "not an integer"),
    ("first start not 0", seg_text(["5,0.1"]), 3, "must start at 0"),
    ("start past duration", seg_text(["0,0.1", "1000,0.2"]), 4, "not before duration_us"),
    ("unknown column", seg_text(["0,0.1,3"], columns="start_us,loss,jitter_us"), 2, "unknown column 'jitter_us'"),
    ("missing loss column", seg_text(["0"], columns="start_us"), 2, "missing required column 'loss'"),
    ("duplicate column", seg_text(["0,0.1,0.2"], columns="start_us,loss,loss"), 2, "duplicate column"),
    ("bad rate", seg_text(["0,0.1,-5"], columns="start_us,loss,rate_bps"), 3, "rate_bps -5 must be positive"),
    ("bad queue", seg_text(["0,0.1,0"], columns="start_us,loss,queue_pkts"), 3, "queue_pkts 0 must be a positive"),
    ("fractional queue", seg_text(["0,0.1,1.5"], columns="start_us,loss,queue_pkts"), 3, "not an integer"),
    ("fewer rows than stated", seg_text(["0,0.1", "10,0.2"], nrows=3), 4, "metadata says 3 rows"),
    ("blank line", seg_text(["0,0.1", "", "10,0.2"]), 4, "blank line"),
    ("no header line", "# " + json.dumps(seg_meta().to_header(duration_us=10, rows=1)) + "\n", 2, "column header"),
    ("no rows", seg_text([], nrows=1).replace("\n\n", "\n"), 2, "no segment rows"),
]


@pytest.mark.parametrize("name,text,line,reason", BAD_SEGMENTS, ids=[b[0] for b in BAD_SEGMENTS])
def test_malformed_segments_refused(name, text, line, reason):
    with pytest.raises(TraceFormatError) as ei:
        loads(text, path="x.loss.csv")
    e = ei.value
    assert e.line == line, str(e)
    assert reason in str(e)
    assert f"x.loss.csv: line {line}: " in str(e)


def test_truncated_mid_line_refused():
    text = seg_text(["0,0.1", "10,0.25"])
    cut = text[:-3]  # "10,0." - the copy stopped inside the last number
    with pytest.raises(TraceFormatError) as ei:
        loads(cut)
    assert ei.value.line == 4
    assert "does not end with a newline" in str(ei.value)


def test_truncated_whole_lines_refused(tmp_path):
    tr = SegmentTrace(np.arange(0, 100, 10), np.linspace(0, 1, 10), 100, meta=seg_meta())
    text = dumps(tr)
    p = tmp_path / "t.loss.csv"
    p.write_text("\n".join(text.split("\n")[:8]) + "\n")
    with pytest.raises(TraceFormatError, match="metadata says 10 rows, the file has 6"):
        read_trace(p)


META_CASES = [
    ("not a comment", lambda h: json.dumps(h), "line 1 must be"),
    ("not json", lambda h: "# {oops", "not valid JSON"),
    ("not object", lambda h: "# [1, 2]", "must be a JSON object"),
    ("missing source", lambda h: "# " + json.dumps({k: v for k, v in h.items() if k != "source"}), "missing required field(s): source"),
    ("unknown key", lambda h: "# " + json.dumps({**h, "colour": "red"}), "unknown field(s): colour"),
    ("wrong format", lambda h: "# " + json.dumps({**h, "format": "pcap"}), '"format" must be'),
    ("future version", lambda h: "# " + json.dumps({**h, "version": 2}), "unsupported format version 2"),
    ("bad form", lambda h: "# " + json.dumps({**h, "form": "blocks"}), '"form" must be one of'),
    ("bad provenance", lambda h: "# " + json.dumps({**h, "provenance": "guessed"}), '"provenance" must be one of'),
    ("generated without generator", lambda h: "# " + json.dumps({k: v for k, v in h.items() if k != "generator"}), "must have a \"generator\""),
    ("bad generator", lambda h: "# " + json.dumps({**h, "generator": "onoff"}), '"generator" must be an object'),
    ("ms units", lambda h: "# " + json.dumps({**h, "units": {"time": "ms", "loss": "probability"}}), 'units.time" must be \'us\''),
    ("percent units", lambda h: "# " + json.dumps({**h, "units": {"time": "us", "loss": "percent"}}), "units.loss"),
    ("units without time", lambda h: "# " + json.dumps({**h, "units": {"loss": "probability"}}), 'must state "time"'),
    ("seed string", lambda h: "# " + json.dumps({**h, "seed": "1"}), '"seed" must be an integer'),
    ("loop string", lambda h: "# " + json.dumps({**h, "loop": "yes"}), '"loop" must be true or false'),
    ("no duration", lambda h: "# " + json.dumps({k: v for k, v in h.items() if k != "duration_us"}), 'must have "duration_us"'),
    ("no rows", lambda h: "# " + json.dumps({k: v for k, v in h.items() if k != "rows"}), 'must have "rows"'),
    ("zero duration", lambda h: "# " + json.dumps({**h, "duration_us": 0}), '"duration_us" must be a positive integer'),
    ("packets key in segments", lambda h: "# " + json.dumps({**h, "packets": 3}), '"packets" belongs to the packets form'),
    ("extra not object", lambda h: "# " + json.dumps({**h, "extra": 3}), '"extra" must be an object'),
]


@pytest.mark.parametrize("name,make,reason", META_CASES, ids=[c[0] for c in META_CASES])
def test_bad_metadata_refused(name, make, reason):
    head = seg_meta().to_header(duration_us=100, rows=1)
    text = make(head) + "\nstart_us,loss\n0,0.5\n"
    with pytest.raises(TraceFormatError) as ei:
        loads(text, path="m.csv")
    assert ei.value.line == 1
    assert reason in str(ei.value), str(ei.value)
    assert "m.csv: line 1: " in str(ei.value)


def pkt_text(body: str, n: int | None = None, **extra) -> str:
    h = pkt_meta().to_header(packets=n if n is not None else sum(c in "01" for c in body))
    h.update(extra)
    return "# " + json.dumps(h) + "\n" + body


BAD_PACKETS = [
    ("bad character", pkt_text("0101\n0120\n"), 3, "character '2' at column 3"),
    ("space", pkt_text("0101\n01 0\n", n=8), 3, "character ' ' at column 3"),
    ("too few packets", pkt_text("0101\n01\n", n=9), 3, "metadata says 9 packets, the file has 6"),
    ("no trailing newline", pkt_text("0101\n01", n=6), 3, "does not end with a newline"),
    ("blank line", pkt_text("0101\n\n01\n", n=6), 3, "blank line"),
    ("empty body", pkt_text("", n=3), 1, "no packet lines"),
    ("duration in packets meta", pkt_text("01\n", duration_us=5), 1, '"duration_us" belongs to the segments form'),
    ("non-ascii", pkt_text("01\n0\u00e91\n", n=4), 3, "only the characters 0 and 1"),
]


@pytest.mark.parametrize("name,text,line,reason", BAD_PACKETS, ids=[b[0] for b in BAD_PACKETS])
def test_malformed_packets_refused(name, text, line, reason):
    with pytest.raises(TraceFormatError) as ei:
        loads(text, path="p.pkts")
    assert ei.value.line == line, str(ei.value)
    assert reason in str(ei.value)


def test_packets_meta_requires_count():
    h = pkt_meta().to_header()
    with pytest.raises(TraceFormatError, match='must have "packets"'):
        loads("# " + json.dumps(h) + "\n01\n")


def test_empty_and_binary_files(tmp_path):
    with pytest.raises(TraceFormatError, match="empty file"):
        loads("")
    p = tmp_path / "bin"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceFormatError, match="not UTF-8"):
        read_trace(p)
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_trace(tmp_path / "missing.csv")
