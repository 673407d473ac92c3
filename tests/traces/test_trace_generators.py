"""Generator statistics over long runs: mean loss and mean burst length within 10%."""

from __future__ import annotations

import numpy as np
import pytest

from traces import (
    TraceError,
    bernoulli_packets,
    bernoulli_segments,
    dumps,
    gilbert_elliott_mean_loss,
    gilbert_elliott_packets,
    gilbert_elliott_segments,
    iteration_burst_segments,
    onoff_mean_loss,
    onoff_segments,
    packet_bursts,
    segment_bursts,
)

REL = 0.10


def mean_burst_packets(drops: np.ndarray) -> float:
    return float(packet_bursts(drops)[1].mean())


@pytest.mark.parametrize("p", [0.01, 0.05, 0.3])
def test_bernoulli_packets(p):
    tr = bernoulli_packets(p, 400_000, seed=1)
    assert tr.mean_loss() == pytest.approx(p, rel=REL)
    assert mean_burst_packets(tr.drops) == pytest.approx(1 / (1 - p), rel=REL)


def test_bernoulli_segments_is_constant():
    tr = bernoulli_segments(0.02, 1_000_000)
    assert len(tr) == 1 and tr.mean_loss() == 0.02


@pytest.mark.parametrize("p,r", [(0.01, 0.25), (0.002, 0.1), (0.05, 0.5)])
def test_gilbert_simple(p, r):
    """1-h = 1, 1-k = 0: loss = p/(p+r), mean loss run = 1/r packets."""
    tr = gilbert_elliott_packets(p, r, n_packets=1_000_000, seed=2)
    assert tr.mean_loss() == pytest.approx(p / (p + r), rel=REL)
    assert mean_burst_packets(tr.drops) == pytest.approx(1 / r, rel=REL)


def test_gilbert_elliott_general():
    p, r, bad, good = 0.02, 0.2, 0.7, 0.01
    tr = gilbert_elliott_packets(p, r, bad, good, n_packets=1_000_000, seed=3)
    assert tr.mean_loss() == pytest.approx(gilbert_elliott_mean_loss(p, r, bad, good), rel=REL)


def test_gilbert_default_r_matches_iproute2():
    tr = gilbert_elliott_packets(0.1, n_packets=200_000, seed=4)
    assert tr.meta.generator["params"]["r"] == pytest.approx(0.9)
    assert tr.mean_loss() == pytest.approx(0.1, rel=REL)  # r = 1-p makes it Bernoulli(p)


def test_gilbert_segments_in_time():
    p, r, iv = 0.01, 0.25, 1.2
    tr = gilbert_elliott_segments(p, r, duration_us=2_000_000, packet_interval_us=iv, seed=5)
    assert tr.mean_loss() == pytest.approx(p / (p + r), rel=REL)
    _, dur, _ = segment_bursts(tr)
    assert dur.mean() == pytest.approx(iv / r, rel=REL)


@pytest.mark.parametrize(
    "dist,kw",
    [("lognormal", {"sigma": 1.0}), ("pareto", {"alpha": 2.5}), ("exponential", {})],
)
def test_onoff_statistics(dist, kw):
    on, off, lon = 150.0, 5_000.0, 0.7
    tr = onoff_segments(duration_us=300_000_000, on_mean_us=on, off_mean_us=off, on_loss=lon, dist=dist, seed=6, **kw)
    assert tr.mean_loss() == pytest.approx(onoff_mean_loss(on, off, lon), rel=REL)
    _, dur, level = segment_bursts(tr)
    assert dur.mean() == pytest.approx(on, rel=REL)
    assert np.allclose(level, lon)


def test_onoff_heavy_tail_is_heavier_than_exponential():
    kw = dict(duration_us=100_000_000, on_mean_us=100.0, off_mean_us=5_000.0, seed=7)
    ln = segment_bursts(onoff_segments(dist="lognormal", sigma=1.5, **kw))[1]
    ex = segment_bursts(onoff_segments(dist="exponential", **kw))[1]
    assert np.percentile(ln, 99.9) / ln.mean() > np.percentile(ex, 99.9) / ex.mean()


def test_onoff_microsecond_resolution():
    tr = onoff_segments(duration_us=1_000_000, on_mean_us=30.0, off_mean_us=1000.0, seed=8)
    _, dur, _ = segment_bursts(tr)
    assert dur.min() >= 1 and np.median(dur) < 100  # tens of microseconds, kept as such


def test_iteration_burst_paper_schedule():
    tr = iteration_burst_segments(iteration_us=200_000, iterations=[279, 651], total_iterations=930)
    start, dur, level = segment_bursts(tr)
    assert start.tolist() == [279 * 200_000, 651 * 200_000]
    assert dur.tolist() == [200_000, 200_000]
    assert np.allclose(level, 0.7)
    assert tr.duration_us == 930 * 200_000
    assert tr.mean_loss() == pytest.approx(0.7 * 2 / 930)
    assert tr.meta.generator["params"]["iterations"] == [279, 651]


def test_iteration_burst_random_and_boundaries():
    a = iteration_burst_segments(iteration_us=1000, count=3, total_iterations=1395, seed=11)
    b = iteration_burst_segments(iteration_us=1000, count=3, total_iterations=1395, seed=11)
    assert dumps(a) == dumps(b)
    its = a.meta.generator["params"]["iterations"]
    assert len(set(its)) == 3 and all(0 <= i < 1395 for i in its)
    tr = iteration_burst_segments(boundaries_us=[0, 100, 250, 260, 400], iterations=[1, 2], loss=0.5)
    assert tr.loss_at(np.array([50, 100, 255, 300])).tolist() == [0.0, 0.5, 0.5, 0.0]
    with pytest.raises(TraceError):
        iteration_burst_segments(iteration_us=1000, iterations=[5], total_iterations=3)


def test_seeds_reproduce_and_differ():
    assert dumps(onoff_segments(duration_us=10**6, seed=1)) == dumps(onoff_segments(duration_us=10**6, seed=1))
    assert dumps(onoff_segments(duration_us=10**6, seed=1)) != dumps(onoff_segments(duration_us=10**6, seed=2))
    g1 = gilbert_elliott_packets(0.01, 0.2, n_packets=10_000, seed=9)
    assert np.array_equal(g1.drops, gilbert_elliott_packets(0.01, 0.2, n_packets=10_000, seed=9).drops)


def test_metadata_says_generated_with_parameters():
    tr = onoff_segments(duration_us=10**6, seed=5, dist="pareto", alpha=1.8)
    m = tr.meta
    assert m.provenance == "generated" and m.seed == 5
    assert m.generator["name"] == "onoff"
    assert m.generator["params"]["alpha"] == 1.8 and m.generator["params"]["dist"] == "pareto"


@pytest.mark.parametrize(
    "call",
    [
        lambda: bernoulli_packets(1.5, 10),
        lambda: gilbert_elliott_packets(0.1, -0.1, n_packets=10),
        lambda: onoff_segments(duration_us=10, on_mean_us=0),
        lambda: onoff_segments(duration_us=10, dist="pareto", alpha=1.0),
        lambda: onoff_segments(duration_us=10, dist="weibull"),
        lambda: iteration_burst_segments(iteration_us=10, total_iterations=5),
    ],
)
def test_bad_parameters_refused(call):
    with pytest.raises(TraceError):
        call()


def test_edge_probabilities():
    assert gilbert_elliott_packets(0.0, 0.5, n_packets=1000, seed=1).mean_loss() == 0.0
    stuck = gilbert_elliott_packets(1.0, 0.0, n_packets=1000, seed=1)
    assert stuck.drops[0] == False and stuck.drops[1:].all()  # noqa: E712  (starts good, then bad forever)
