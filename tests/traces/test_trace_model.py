"""Replay queries: loss_at, change schedules, resampling, drop sampling, cursors."""

from __future__ import annotations

import numpy as np
import pytest

from traces import Change, PacketTrace, SegmentTrace, TraceError, TraceMeta

META = TraceMeta(form="segments", provenance="measured", source="t")


def tr3(loop: bool = False) -> SegmentTrace:
    return SegmentTrace(np.array([0, 100, 300]), np.array([0.0, 0.5, 0.1]), 1000, meta=META.with_(loop=loop))


def test_loss_at_scalar_and_array():
    t = tr3()
    assert t.loss_at(0) == 0.0
    assert t.loss_at(99.9) == 0.0
    assert t.loss_at(100) == 0.5
    assert isinstance(t.loss_at(150), float)
    got = t.loss_at(np.array([-1, 0, 100, 299, 300, 999, 1000, 5000]))
    assert got.tolist() == [0.0, 0.0, 0.5, 0.5, 0.1, 0.1, 0.0, 0.0]  # 0 outside the trace


def test_loss_at_loops():
    t = tr3(loop=True)
    assert t.loss_at(np.array([1000, 1100, 2350])).tolist() == [0.0, 0.5, 0.1]


def test_mean_loss_time_weighted():
    assert tr3().mean_loss() == pytest.approx((0.5 * 200 + 0.1 * 700) / 1000)


def test_changes_merge_and_end_marker():
    t = SegmentTrace(np.array([0, 10, 20, 30]), np.array([0.2, 0.2, 0.7, 0.0]), 50, meta=META)
    assert list(t.changes()) == [Change(0, 0.2), Change(20, 0.7), Change(30, 0.0), Change(50, 0.0)]
    assert list(t.changes(until_us=25)) == [Change(0, 0.2), Change(20, 0.7)]


def test_changes_loop_until_and_wraparound():
    t = SegmentTrace(np.array([0, 10]), np.array([0.3, 0.0]), 20, meta=META.with_(loop=True))
    with pytest.raises(TraceError):
        next(t.changes())
    assert [(c.t_us, c.loss) for c in t.changes(until_us=45)] == [(0, 0.3), (10, 0.0), (20, 0.3), (30, 0.0), (40, 0.3)]
    same = SegmentTrace(np.array([0, 10]), np.array([0.3, 0.0]), 20, meta=META.with_(loop=True))
    # a trace ending in the state it starts in does not emit a redundant change at the wrap
    ends_like_start = SegmentTrace(np.array([0, 5, 10]), np.array([0.3, 0.0, 0.3]), 20, meta=META.with_(loop=True))
    assert [c.t_us for c in ends_like_start.changes(until_us=30)] == [0, 5, 10, 25]
    assert same.loop


def test_changes_carry_rate_and_queue():
    t = SegmentTrace(
        np.array([0, 10]), np.array([0.0, 0.0]), 20, rate_bps=np.array([1e9, np.nan]), queue_pkts=np.array([np.nan, 50]), meta=META
    )
    assert list(t.changes()) == [Change(0, 0.0, 1e9, None), Change(10, 0.0, None, 50), Change(20, 0.0, None, None)]
    assert np.isnan(t.rate_at(15))
    assert t.queue_at(np.array([15])).tolist() == [50.0]


def test_resample_keeps_mean():
    rng = np.random.default_rng(0)
    starts = np.concatenate(([0], np.cumsum(rng.integers(1, 50, 400))))
    t = SegmentTrace(starts, rng.random(starts.size), int(starts[-1]) + 7, meta=META)
    r = t.resample(1000)
    assert r.mean_loss() == pytest.approx(t.mean_loss(), rel=1e-12)
    assert np.all(np.diff(r.start_us) % 1000 == 0)


def test_sample_drops_follow_loss():
    t = tr3()
    rng = np.random.default_rng(1)
    times = np.repeat(np.array([50.0, 200.0, 500.0]), 20000)
    d = t.sample_drops(times, rng).reshape(3, -1).mean(axis=1)
    assert d[0] == 0.0
    assert d[1] == pytest.approx(0.5, abs=0.02)
    assert d[2] == pytest.approx(0.1, abs=0.01)
    proc = t.drop_process(np.random.default_rng(2))
    assert proc.drops(np.array([0.0, 10.0])).tolist() == [False, False]
    assert proc.drop(50.0) is False


def test_segment_to_packets_and_back():
    t = SegmentTrace(np.array([0, 1000]), np.array([0.0, 1.0]), 2000, meta=META)
    p = t.to_packets(10.0, np.random.default_rng(0))
    assert len(p) == 200 and p.drops[:100].sum() == 0 and p.drops[100:].all()
    s = p.to_segments(500)
    assert s.loss_at(np.array([0, 1500])).tolist() == [0.0, 1.0]


def test_packet_cursor_and_wrap():
    p = PacketTrace(np.array([1, 0, 0, 1], dtype=bool), TraceMeta(form="packets", provenance="measured"))
    c = p.cursor()
    assert c.next(3).tolist() == [True, False, False]
    assert c.next1() is True
    assert c.next(2).tolist() == [False, False]  # past the end: delivered
    looped = PacketTrace(p.drops, p.meta.with_(loop=True))
    assert looped.drops_for(3, 3).tolist() == [True, True, False]
    assert looped.drop_process().drops(np.zeros(5)).tolist() == [True, False, False, True, True]


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(start_us=[5], loss=[0.1], duration_us=10), "must start at 0"),
        (dict(start_us=[0, 0], loss=[0.1, 0.2], duration_us=10), "not after"),
        (dict(start_us=[0], loss=[1.5], duration_us=10), "outside"),
        (dict(start_us=[0, 10], loss=[0.1, 0.2], duration_us=10), "must exceed"),
    ],
)
def test_segment_trace_validates_in_code(kw, msg):
    with pytest.raises(TraceError, match=msg):
        SegmentTrace(np.asarray(kw["start_us"]), np.asarray(kw["loss"]), kw["duration_us"], meta=META)


def test_generated_meta_needs_generator():
    with pytest.raises(ValueError, match="generator"):
        SegmentTrace(np.array([0]), np.array([0.1]), 5, meta=TraceMeta(provenance="generated"))


def test_segments_structured_view_and_code_meta():
    t = SegmentTrace(np.array([0, 10]), np.array([0.1, 0.2]), 30, rate_bps=np.array([np.nan, 5e6]))
    s = t.segments
    assert s["start_us"].tolist() == [0, 10] and s["end_us"].tolist() == [10, 30]
    assert np.isnan(s["rate_bps"][0]) and s["rate_bps"][1] == 5e6 and np.isnan(s["queue_pkts"]).all()
    assert t.meta.provenance == "generated"  # a trace built in code never claims to be measured


def test_from_schedule_records_achieved_changes():
    # rules applied a little late, one twice on the same microsecond
    t = SegmentTrace.from_schedule(
        np.array([20.4, 105.2, 105.4, 300.0]), np.array([0.5, 0.1, 0.2, 0.0]), 400,
        rate_bps=np.array([1e9, 1e9, 1e9, np.nan]),
        meta=TraceMeta(form="segments", provenance="measured", source="replayer log"),
    )
    assert t.start_us.tolist() == [0, 20, 105, 300]
    assert t.loss.tolist() == [0.0, 0.5, 0.2, 0.0]
    assert np.isnan(t.rate_bps[0]) and t.rate_bps[1] == 1e9
    with pytest.raises(TraceError):
        SegmentTrace.from_schedule(np.array([-1.0]), np.array([0.1]), 10)
