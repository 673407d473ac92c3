"""Pacing (dblp.pacing) and self-pacing (core rule R11): the bucket against a sleep's granularity,
the AutoPacer's verdicts, the rule through the core, and refused values."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from dblp import control as ctl
from dblp.cliargs import pace_arg, pace_share_arg, pace_rate
from dblp.core import EncodedRound, Receiver, RoundSender
from dblp.pacing import (AUTO_FLOOR_BPS, MAX_CUT, MIN_BURST_BYTES, PACE_QUANTUM_S, AutoPacer, TokenBucket,
                         make_pacer)
from dblp.wire import ChunkLayout, ParameterError

DGRAM = 1472


def delivered_fraction(bucket: TokenBucket, *, resolution_s: float, late_s: float, span_s: float = 0.5) -> float:
    """A sender loop on a modelled clock: send what the bucket allows, then sleep until its next
    datagram - rounded up to ``resolution_s`` (epoll: 1 ms) and woken ``late_s`` after that. The
    fraction of the rate that left in ``span_s``."""
    now, sent = 0.0, 0
    while now < span_s:
        k = bucket.allowance(now, DGRAM, 64)
        bucket.consume(k * DGRAM)
        sent += k
        wait = bucket.next_time(now, DGRAM) - now
        if resolution_s:
            wait = math.ceil(wait / resolution_s - 1e-9) * resolution_s
        now += wait + late_s
    return sent * DGRAM * 8 / now / bucket.rate_bps


def test_fixed_bucket_behind_1ms_sleeps_delivers_about_half_at_900M():
    """Issue #30's cause: a 64 KiB bucket holds 0.58 ms at 900 Mbit/s; behind epoll's 1 ms waits
    (plus 0.1 ms late) the tokens of the rest of each wait are thrown away."""
    frac = delivered_fraction(TokenBucket(900e6), resolution_s=0.001, late_s=0.0001)
    assert 0.45 < frac < 0.6


@pytest.mark.parametrize("rate", [100e6, 900e6, 2e9])
def test_rate_deep_bucket_delivers_its_rate_behind_1ms_sleeps(rate):
    assert make_pacer(rate).burst_bytes == max(MIN_BURST_BYTES, int(rate / 8 * PACE_QUANTUM_S))
    epoll = delivered_fraction(make_pacer(rate), resolution_s=0.001, late_s=0.0002)
    exact = delivered_fraction(make_pacer(rate), resolution_s=0.0, late_s=0.0001)  # pump's sleeps below 1 ms
    assert 0.97 <= epoll <= 1.02 and 0.97 <= exact <= 1.02  # (+1%: the bucket starts full)


def test_unlimited_and_simulator_buckets_unchanged():
    """The simulator's buckets (TokenBucket(rate), exact timers) keep the 64 KiB depth its pins assume."""
    assert TokenBucket(2e9).burst_bytes == MIN_BURST_BYTES
    b = make_pacer(0)
    assert b.unlimited and not b.auto and b.allowance(0.0, DGRAM, 10) == 10
    assert make_pacer(None).auto and make_pacer(None).unlimited  # self-pacing starts unlimited


def flood(p: AutoPacer, sent: int = 1000, delivered: int = 200, reply_s: float = 0.1, send_s: float = 0.01,
          first: bool = True) -> None:
    p.on_pass(sent, delivered, sent * DGRAM, send_s, reply_s, first)


def test_autopacer_cuts_an_unpaced_flood_to_its_delivery_rate_then_grows():
    p = AutoPacer()
    flood(p)  # 200 of 1000 arrived within 0.1 s: D = 200 * 1472 * 8 / 0.1
    d = 200 * DGRAM * 8 / 0.1
    assert p.rate_bps == pytest.approx(d) and p.cuts == 1
    assert p.ceiling_bps == pytest.approx(1000 * DGRAM * 8 / 0.01)  # the flood's own rate
    flood(p, delivered=1000)  # clean at D: proven; far below the ceiling, the rate doubles
    assert p.good_bps == pytest.approx(d) and p.rate_bps == pytest.approx(2 * d)


def test_autopacer_probes_halfway_to_the_ceiling_and_settles():
    p = AutoPacer()
    p.rate_bps = 100e6
    flood(p, delivered=1000)  # clean at 100M: no ceiling known yet, the rate doubles
    assert p.rate_bps == pytest.approx(200e6)
    flood(p, delivered=970)  # 3% lost above the good rate: congestion, back to the good rate
    assert p.rate_bps == pytest.approx(100e6) and p.ceiling_bps == pytest.approx(200e6)
    flood(p, delivered=1000)  # clean: within FAR of the ceiling, x1.25 at most, halfway at most
    assert p.rate_bps == pytest.approx(125e6)
    flood(p, delivered=990)  # lost at 125M: ceiling 125M, back to 100M
    assert p.rate_bps == pytest.approx(100e6) and p.ceiling_bps == pytest.approx(125e6)
    flood(p, delivered=1000)  # clean: halfway to the (crept) ceiling
    assert p.rate_bps == pytest.approx((100e6 + 125e6 * 1.005) / 2)
    flood(p, delivered=995)  # lost at ~113M: back to 100M; clean: halfway again, ~107M
    flood(p, delivered=1000)
    assert p.rate_bps == pytest.approx((100e6 + (125e6 * 1.005 + 100e6) / 2 * 1.005) / 2)
    flood(p, delivered=995)  # lost at ~107M: the ceiling is within SETTLE (10%) of 100M: it holds there
    flood(p, delivered=1000)
    assert p.rate_bps == pytest.approx(100e6)


def test_autopacer_keeps_its_rate_through_a_burst():
    """Heavy loss (a 70% burst) at a proven rate is not the rate's doing: no slow-down, pass after pass."""
    p = AutoPacer()
    p.rate_bps = 30e6
    flood(p, delivered=1000)  # proven at 30M (and grown); a settled sender is back at a proven rate
    p.rate_bps = r = 30e6
    for i in range(10):  # one burst round: 10 passes losing 70%
        flood(p, sent=1000 if i == 0 else 300, delivered=300 if i == 0 else 90, first=i == 0)
    assert p.rate_bps == r and p.cuts == 0


def test_autopacer_restores_a_cut_that_did_not_help():
    """Loss that stays as high at half the rate was not congestion: the old rate comes back, proven."""
    p = AutoPacer()
    flood(p, delivered=300)  # unpaced, 70% lost: cut to D
    assert p.rate_bps > 0
    flood(p, delivered=300)  # 70% again at the cut rate
    assert p.rate_bps == 0.0 and p.restores == 1 and p.good_bps == math.inf
    flood(p, delivered=300)  # and the random loss is left alone from now on
    assert p.rate_bps == 0.0 and p.cuts == 1


def test_autopacer_light_loss_at_a_proven_rate_is_congestion_cut_at_most_by_half():
    p = AutoPacer()
    p.rate_bps = 200e6
    flood(p, delivered=1000)  # proven at 200M, now 250M
    p.rate_bps = 200e6
    flood(p, delivered=950, reply_s=1.0)  # 5% lost at the proven rate: others share the path now
    assert p.good_bps == 0.0 and p.rate_bps == pytest.approx(max(MAX_CUT * 200e6, 950 * DGRAM * 8 / 1.0))


def test_autopacer_ignores_small_passes_and_outages():
    p = AutoPacer()
    flood(p, sent=10, delivered=1)
    flood(p, delivered=0)
    assert p.rate_bps == 0.0 and p.cuts == 0
    p.rate_bps = 1e3
    flood(p, delivered=100, reply_s=100.0)
    assert p.rate_bps >= AUTO_FLOOR_BPS or p.rate_bps == 1e3


def test_rule_r11_through_the_core():
    """A sender's first pass loses 60% (scripted): its BITMAP hands the pass to the pacer, which
    cuts; the retransmission pass is then paced."""
    layout = ChunkLayout(200_000, 1500)
    values = np.arange(layout.elements, dtype=np.float32)
    enc = EncodedRound(values, layout, round_no=0, run_id=7, sender=1)
    pacer = AutoPacer()
    snd = RoundSender(enc, direction=ctl.UP, now=0.0, order="inorder", pacer=pacer)
    rcv = Receiver(layout, run_id=7, expected_sender=1, direction=ctl.UP)
    rcv.begin_round(0, np.zeros(layout.elements, np.float32), now=0.0, tolerance=0.0)
    now = 0.0
    while snd.pass_remaining and snd.state.name == "SENDING":
        b = snd.datagrams_to_send(now)
        keep = b.seqs % 5 < 2  # 40% arrive
        rows = b.rows[keep]
        rcv.receive_batch(rows, b.lengths[keep], now + 0.001)
        now += 0.0001
    for m in snd.control_to_send():
        rcv.handle_control(m, now + 0.01)
    for m in rcv.control_to_send():
        snd.handle_control(m, now + 0.02)
    assert pacer.cuts == 1 and not pacer.unlimited
    sent = layout.chunks
    assert pacer.rate_bps == pytest.approx(int(sent * 0.4) * (enc.lengths.sum() / sent) * 8 / (now + 0.02), rel=0.05)
    assert snd.stats.passes == 2 and snd.get_timer() is not None  # the retransmission pass is paced


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "fast"])
def test_bad_rates_refused(bad):
    with pytest.raises(ParameterError, match="send rate"):
        TokenBucket(bad)


@pytest.mark.parametrize("text,want", [("auto", None), ("AUTO", None), ("0", 0.0), ("900M", 900e6), ("150", 150e6)])
def test_pace_flag_values(text, want):
    assert pace_arg(text) == want


@pytest.mark.parametrize("text", ["fast", "-1", "", "1x"])
def test_pace_flag_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        pace_arg(text)
    if text != "1x":
        with pytest.raises(argparse.ArgumentTypeError):
            pace_share_arg(text)


def test_pace_share_is_an_override():
    a = argparse.Namespace(bandwidth=100e6, workers=4, pace_share=None)
    assert pace_rate(a) is None
    a.pace_share = 0.9
    assert pace_rate(a) == pytest.approx(22.5e6)
    a.pace_share = 0.0
    assert pace_rate(a) == 0.0
