"""Analyses of round records that scenarios used to hold: exposure windows (trace replay) and
the benchmark's pass-cost summary, on hand-made records with known answers."""

from __future__ import annotations

import math

import pytest

from dblp.results.exposure import (
    direction_windows,
    exposure_by_direction,
    exposure_by_round,
    received_fractions,
    round_windows,
    run_window,
)
from dblp.results.passcost import median, summarize_run
from dblp.protocol.records import RoundRecord


def _rec(role: str, worker: int, rnd: int, t: float, up: float, down: float, **kw) -> RoundRecord:
    return RoundRecord(source="x", role=role, worker=worker, round=rnd, t_start=t, up_latency_s=up,
                       down_latency_s=down, round_latency_s=up + down, chunks=10, **kw)


def test_windows_and_exposure():
    recs = [
        _rec("worker", 0, 0, 10.0, 1.0, 1.0, up_sent=10, up_received=10, down_received=10, up_passes=1),
        _rec("worker", 1, 0, 10.5, 1.0, 1.0, up_sent=30, up_received=10, down_received=8, up_passes=2),
        _rec("server", 0, 0, 10.0, 1.0, 2.0, down_sent=20, up_received=9),
        _rec("worker", 0, 1, 20.0, 2.0, 1.0, up_sent=10, up_received=10, down_received=10, up_passes=1),
        _rec("server", 0, 1, 20.0, 2.0, 1.0, down_sent=10, up_received=7),
    ]
    assert round_windows(recs) == {0: (10.0, 12.5), 1: (20.0, 23.0)}
    assert run_window(recs) == (10.0, 23.0)
    assert run_window([]) == (None, None)
    d = direction_windows(recs)
    assert d["up"] == [(10.0, 11.0, 10), (10.5, 11.5, 30), (20.0, 22.0, 10)]
    assert d["down"] == [(11.0, 13.0, 20), (22.0, 23.0, 10)]

    def mean_over(a: float, b: float) -> float:  # loss 0.5 before t = 15 s, 0.1 after
        return 0.5 if b <= 15 else 0.1

    ex = exposure_by_direction(mean_over, recs)
    assert ex["up"] == pytest.approx((0.5 * 10 + 0.5 * 30 + 0.1 * 10) / 50)  # weighted by datagrams
    assert ex["down"] == pytest.approx((0.5 * 20 + 0.1 * 10) / 30)
    assert exposure_by_round(mean_over, recs) == {0: 0.5, 1: 0.1}
    fr = received_fractions(recs, first_round=0)
    assert fr["up_mean"] == pytest.approx(0.8) and fr["up_min"] == pytest.approx(0.7)
    assert fr["down_min"] == pytest.approx(0.8) and fr["retx_rounds"] == pytest.approx(1 / 3)
    assert math.isnan(received_fractions(recs, first_round=5)["up_mean"])


def _round(t: float, span: float, passes: int, sent: int, workers: int = 3) -> dict[int, dict]:
    return {w: {"round": 0, "worker": w, "t_start": t, "round_latency_s": span, "up_latency_s": span / 2,
                "down_latency_s": span / 2, "up_passes": passes, "up_sent": sent, "chunks": 100,
                "extra": {"up_wait_reply_s": 0.001 * (passes - 1)}} for w in range(workers)}


def test_pass_cost_summary_of_a_synthetic_run():
    """Lossless rounds of 0.1 s; calibration and burst rounds cost 10 ms per extra pass: the fitted
    overhead is that, and the burst is predicted from the tolerance arithmetic."""
    rounds, server, loss_rounds = {}, [], {}
    schedule = [None, None, None, 0.3, 0.5, 0.7]
    p = 0.1
    from dblp.protocol.policy import passes_needed

    for i, loss in enumerate(schedule):
        t = 10.0 * i
        k = 1 if loss is None else passes_needed(loss, p, 100)
        sent = 100 if loss is None else round(100 * (1 - p) / (1 - loss))
        rounds[i] = _round(t, 0.1 + 2 * (k - 1) * 0.01, k, sent)
        server.append({"round": i, "down_passes": k, "down_sent": sent,
                       "extra": {"down_wait_reply_s": 0.001 * (k - 1)}})
        if loss is not None:
            loss_rounds[i] = {"loss": loss, "role": "burst" if loss == 0.7 else "calib",
                              "t_applied": t - 1, "t_removing": t + 5, "dropped": 7}
    out = summarize_run(rounds, server, loss_rounds, elements=1000, workers=3, lossless=range(1, 3), p=p,
                        calib_loss=[0.3, 0.5], udp={"srv": {"RcvbufErrors": 2}})
    assert out["dblp_round_s"] == pytest.approx(0.1)
    assert out["udp_rcvbuf_errors"] == 2
    assert out["calib_loss"] == 0.5 and out["burst_loss"] == 0.7
    assert out["burst_timing_ok"] is True and out["burst_dropped_pkts"] == 7
    assert out["burst_pred_passes"] == passes_needed(0.7, p, 100)
    assert out["overhead_per_pass_recv_s"] == pytest.approx(0.01)
    assert out["wait_per_pass_s"] == pytest.approx(0.001)
    assert out["burst_err_recv"] == pytest.approx(0.0, abs=1e-9)  # the burst follows the receiver-bound model
    assert 0.0 <= out["sender_share"] <= 1.0
    assert median([1.0, float("nan"), None, 3.0]) == 2.0 and math.isnan(median([]))
