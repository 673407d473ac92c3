"""The gloo reference (dblp.runs.glooref): local ranks started, lined up at one instant and timed, as the
benchmarks time them."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from dblp.runs.glooref import GlooRanks, LocalHost, free_port, loopback_median_s  # noqa: E402


def test_two_local_ranks_all_reduce_and_are_timed_from_their_common_start(tmp_path):
    ranks = GlooRanks([LocalHost()] * 2, free_port(), 60.0, tmp_path, iface="lo")
    try:
        assert set(ranks.collect("ready", None, 120)) == {0, 1}
        start, _ = ranks.run("a", 1000)
        done = ranks.collect("done", "a", 60)
        assert set(done) == {0, 1} and all(m["t_end"] >= start for m in done.values())
        assert 0 < ranks.allreduce_s(1000, "b", 60) < 60
    finally:
        ranks.close()
    assert (tmp_path / "gloo-rank0.log").exists() and (tmp_path / "gloo-rank1.log").exists()


def test_loopback_median_over_the_timed_rounds(tmp_path):
    m = loopback_median_s(1000, 2, rounds=2, warmup=1, timeout=60.0, logdir=tmp_path / "gloo")
    assert math.isfinite(m) and 0 < m < 60
