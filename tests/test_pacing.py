"""Pacing (dblp.protocol.pacing) and self-pacing (rule R11): the bucket against a sleep's granularity,
the AutoPacer's verdicts, the rule through the core, and refused values."""

from __future__ import annotations

import argparse
import math
import struct

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.cli.args import pace_arg, pace_share_arg, pace_rate
from dblp.protocol.core import EncodedRound, Receiver, RoundSender, send_order
from dblp.protocol.pacing import (AUTO_FLOOR_BPS, MAX_CUT, MIN_BURST_BYTES, PACE_QUANTUM_S, SENDER_MIN_BURST, AutoPacer, PacerGroup,
                         TokenBucket, UploadGrant, make_pacer)
from dblp.protocol.wire import ChunkLayout, ParameterError, assemble_rows

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
    """Why a fixed 64 KiB bucket cannot pace 900 Mbit/s: it holds 0.58 ms; behind epoll's 1 ms waits
    (plus 0.1 ms late) the tokens of the rest of each wait are thrown away."""
    frac = delivered_fraction(TokenBucket(900e6), resolution_s=0.001, late_s=0.0001)
    assert 0.45 < frac < 0.6


@pytest.mark.parametrize("rate", [100e6, 900e6, 2e9])
def test_rate_deep_bucket_delivers_its_rate_behind_1ms_sleeps(rate):
    assert make_pacer(rate).burst_bytes == max(SENDER_MIN_BURST, int(rate / 8 * PACE_QUANTUM_S))
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
          first: bool = True, rate_bps: float | None = None) -> None:
    p.on_pass(sent, delivered, sent * DGRAM, send_s, reply_s, first, rate_bps)


def test_autopacer_cuts_an_unpaced_flood_between_its_two_bounds_then_doubles():
    p = AutoPacer()
    flood(p)  # 200 of 1000 arrived: 0.01 s of sending, the reply after 0.1 s
    lo, hi = 200 * DGRAM * 8 / 0.1, 0.2 * 1000 * DGRAM * 8 / 0.01  # delivery rate; what got through while sending
    assert p.rate_bps == pytest.approx(math.sqrt(lo * hi)) and p.cuts == 1 and p.ceiling_bps == math.inf
    r = p.rate_bps
    flood(p, delivered=1000, reply_s=0.05)  # clean, delivered at 235 Mbit/s: no ceiling yet, the rate doubles
    assert p.rate_bps == pytest.approx(2 * r) and p.good_bps == pytest.approx(r)


def test_autopacer_additive_increase_multiplicative_decrease_holding_below_the_loss():
    p = AutoPacer()
    p.rate_bps = 100e6
    flood(p, delivered=1000, reply_s=0.05)  # clean: doubles (the delivery rate, 235M x 1.25, allows it)
    assert p.rate_bps == pytest.approx(200e6)
    flood(p, delivered=970)  # 3% lost in the doubling: back to the last clean rate; the ceiling is known
    assert p.rate_bps == pytest.approx(100e6) and p.ceiling_bps == pytest.approx(200e6)
    flood(p, delivered=1000, reply_s=0.05)  # clean: +4% (the ceiling creeps 0.2%)
    assert p.rate_bps == pytest.approx(104e6) and p.ceiling_bps == pytest.approx(200e6 * 1.002)
    flood(p, delivered=970)  # loss above the good rate: cut by max(2 x 3%, 20%)
    assert p.rate_bps == pytest.approx(104e6 * 0.8) and p.ceiling_bps == pytest.approx(104e6)
    p.rate_bps = 90e6
    flood(p, delivered=1000, reply_s=0.05)  # +4% but at most 0.9 x the (crept) ceiling
    assert p.rate_bps == pytest.approx(min(93.6e6, 0.9 * 104e6 * 1.002))
    p.rate_bps = 98.8e6
    flood(p, delivered=1000, reply_s=0.05)  # above 0.9 x ceiling already: held, never lowered by a clean pass
    assert p.rate_bps == pytest.approx(98.8e6)


def test_autopacer_a_queue_that_swallows_a_pass_does_not_hide_the_bottleneck():
    """A clean first pass delivered at 80 Mbit/s (the reply waited for a queue to drain) leaves the
    rate at 1.25 x 80M, not doubled - and not below half of what it was."""
    p = AutoPacer()
    p.rate_bps = 200e6
    flood(p, delivered=1000, reply_s=1000 * DGRAM * 8 / 80e6)
    assert p.rate_bps == pytest.approx(100e6)
    p.rate_bps = 400e6
    flood(p, delivered=1000, reply_s=1000 * DGRAM * 8 / 80e6)
    assert p.rate_bps == pytest.approx(200e6)  # halved at most


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


def test_autopacer_light_loss_at_a_proven_rate_is_congestion():
    p = AutoPacer()
    p.rate_bps = 200e6
    flood(p, delivered=1000, reply_s=0.05)  # proven at 200M
    p.rate_bps = 200e6
    flood(p, delivered=950)  # 5% lost at the proven rate: others share the path now
    assert p.good_bps == 0.0 and p.ceiling_bps == 200e6 and p.rate_bps == pytest.approx(200e6 * 0.8)
    assert MAX_CUT == 0.5


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
    now = last = 0.0
    while snd.pass_remaining and snd.state.name == "SENDING":
        b = snd.datagrams_to_send(now)
        keep = b.seqs % 5 < 2  # 40% arrive
        rows = b.rows[keep]
        rcv.receive_batch(rows, b.lengths[keep], now + 0.001)
        last = now
        now += 0.0001
    for m in snd.control_to_send():
        rcv.handle_control(m, now + 0.01)
    for m in rcv.control_to_send():
        snd.handle_control(m, now + 0.02)
    assert pacer.cuts == 1 and not pacer.unlimited
    n, nbytes = layout.chunks, int(enc.lengths.sum())
    got = rcv.received
    lo, hi = got * nbytes / n * 8 / (now + 0.02), got / n * nbytes * 8 / last  # the two bounds of the flood's share
    assert got == pytest.approx(0.4 * n, abs=1) and pacer.rate_bps == pytest.approx(math.sqrt(lo * hi))
    assert snd.stats.passes == 2 and snd.get_timer() is not None  # the retransmission pass is paced
    assert snd.first_loss == pytest.approx(1 - got / n) and snd.first_rate_bps == 0.0  # R14: kept, sent unpaced


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


def test_a_broadcast_group_moves_its_rate_once_per_round():
    """The server's N broadcast streams share one rate: the first lossy report cuts it for all, the
    others' reports of the same (unpaced) round are stale and ignored."""
    g = PacerGroup()
    a, b = g.member(), g.member()
    assert a.auto and a.unlimited and b.unlimited
    a.on_pass(1000, 200, 1000 * DGRAM, 0.01, 0.1, True, 0.0)
    r = g.brain.rate_bps
    assert r > 0 and a.rate_bps == b.rate_bps == r and not b.unlimited
    b.on_pass(1000, 300, 1000 * DGRAM, 0.01, 0.1, True, 0.0)  # sent unpaced too: news of a rate left behind
    assert g.brain.rate_bps == r and g.brain.cuts == 1
    b.on_pass(1000, 1000, 1000 * DGRAM, 0.01, 0.05, True, r)  # clean at the group's rate: all double
    assert a.rate_bps == b.rate_bps == pytest.approx(2 * r)


def test_r13_the_broadcast_group_moves_once_a_round_by_every_streams_first_pass():
    """Round 0's flood: the brain's start from the first lossy report, nothing stated for the rule yet.
    Round 1 at that rate: the rule seeds from it and judges every stream's first pass (one of three
    lost 5%: congestion, cut 20%); from then on the members' own reports move nothing within a round,
    and a clean round steps +4% up to 0.9 x the rate that lost."""
    g = PacerGroup()
    a, b, c = g.member(), g.member(), g.member()
    a.on_pass(1000, 200, 1000 * DGRAM, 0.01, 0.1, True, 0.0)
    r0 = g.brain.rate_bps
    assert r0 > 0 and g.round_done([0.0] * 3, [0.8, 0.9, 0.85]) == 0.0 and not g.granted
    b.on_pass(1000, 1000, 1000 * DGRAM, 0.01, 0.1, True, r0)  # round 1, before the rule: the brain still acts
    r1 = g.brain.rate_bps
    assert r1 > r0
    assert g.round_done([r1] * 3, [0.0, 0.05, 0.0]) == pytest.approx(0.8 * r1) and g.granted
    assert a.rate_bps == b.rate_bps == c.rate_bps == pytest.approx(0.8 * r1)
    for m, got in ((a, 1000), (b, 700), (c, 990)):  # within the round: no report moves the group
        m.on_pass(1000, got, 1000 * DGRAM, 0.01, 0.1, True, 0.8 * r1)
    assert c.rate_bps == pytest.approx(0.8 * r1)
    assert g.round_done([0.8 * r1] * 3, [0.0] * 3) == pytest.approx(min(0.8 * r1 * 1.04, 0.9 * r1 * 1.002))


def broadcast_rounds(rule: bool, rounds: int = 40, capacity: float = 100e6, streams: int = 3) -> list[int]:
    """A server's broadcast through one drop-tail link, a round at a time: every stream sends a whole
    tensor's first pass at the group's rate; over the link's rate the queue drops unevenly - stream 0
    gets through (its STOP is the round's first reply, early) and the others lose twice the excess.
    Returns which rounds lost (1) or not (0), the group moved by its brain alone (the old way: the
    first reply wins, the rest are about a rate already left) or by R14's rule."""
    g = PacerGroup()
    ms = [g.member() for _ in range(streams)]
    g.brain.rate_bps, g.brain.good_bps = 20e6, 20e6  # a clean start below the share (33 Mbit/s)
    lossy = []
    for _ in range(rounds):
        r = g.brain.rate_bps
        excess = max(0.0, 1.0 - capacity / (streams * r))
        losses = [0.0] + [min(0.9, 2 * excess)] * (streams - 1)
        lossy.append(int(excess > 0))
        for m, loss in zip(ms, losses):  # the replies in arrival order: the clean STOP first
            got = round(1400 * (1 - loss))
            m.on_pass(1400, got, 1400 * DGRAM, 0.3, 1400 * DGRAM * 8 / min(r, capacity / streams) + 0.01, True, r)
        if rule:
            g.round_done([r] * streams, losses)
    return lossy


def test_r13_the_rule_stops_the_broadcast_probing_past_its_link():
    """The old group (the brain alone) hears the clean stream first and steps up while the others lose:
    most rounds past the start lose. R14's rule sees every stream: a few probes, then it holds."""
    old, new = broadcast_rounds(False), broadcast_rounds(True)
    assert sum(old[10:]) >= 20 and sum(new[10:]) <= 3, (old, new)


# -- R12: the server's rate grant ------------------------------------------------------------------


def test_r12_fields_are_optional_on_the_wire():
    """A grant and a stated rate travel as a trailing f64; without them (0) the frame is the old one,
    byte for byte, and an old peer's frame decodes with 0 ("not stated")."""
    old_round, old_probe = ctl.RoundStart(3, ctl.UP, 0.1, True), ctl.Probe(3, ctl.UP, 2)
    assert len(ctl.encode(old_round)) == 5 + 14 and len(ctl.encode(old_probe)) == 5 + 9
    for msg in (old_round, old_probe, ctl.RoundStart(3, ctl.UP, 0.1, True, 33.3e6), ctl.Probe(3, ctl.UP, 2, 21.5e6)):
        frame = ctl.encode(msg)
        assert ctl.ControlDecoder().feed(frame) == [msg]
    assert len(ctl.encode(ctl.Probe(3, ctl.UP, 2, 21.5e6))) == 5 + 9 + 8
    for t, body in ((3, ctl.encode(old_round)[5:] + b"\x00" * 3), (4, ctl.encode(old_probe)[5:] + b"\x00" * 9),
                    (4, ctl.encode(old_probe)[5:] + struct.pack("!d", -1.0)),
                    (3, ctl.encode(old_round)[5:] + struct.pack("!d", math.nan))):
        with pytest.raises(ctl.ControlError):
            ctl.decode_frame(t, body)


def test_r12_a_grant_sets_the_rate_and_where_it_holds():
    """A worker settled at 20 Mbit/s (its ceiling 28M) is granted 33.3M: it starts there, holds there
    (ceiling = grant / HOLD), and a 70% burst at the grant is not taken for congestion; a hand-set rate
    ignores the grant."""
    p = AutoPacer()
    p.rate_bps, p.ceiling_bps, p.good_bps = 20e6, 28e6, 20e6
    p.grant(100e6 / 3)
    assert p.rate_bps == pytest.approx(100e6 / 3) and p.ceiling_bps == pytest.approx(100e6 / 3 / 0.9)
    assert p.grants == 1
    flood(p, delivered=300, rate_bps=p.rate_bps)  # a 70% burst at the granted rate: no cut
    assert p.rate_bps == pytest.approx(100e6 / 3) and p.cuts == 0
    flood(p, delivered=1000, reply_s=1000 * DGRAM * 8 / 33e6, rate_bps=p.rate_bps)  # clean: held (creep 0.2%)
    assert p.rate_bps == pytest.approx(100e6 / 3 * 1.002)
    fixed = make_pacer(30e6)
    fixed.grant(50e6)
    assert fixed.rate_bps == 30e6  # a hand-set rate is the user's


def test_r12_upload_grant_verdicts():
    """The server's rule on a round's first passes: the seed from the rates stated (their mean), then
    +4% per clean round to 0.9 x the grant that lost, a cut of max(2 x loss, 20%) on congestion, and
    no change for one burst round (70% at a clean grant); nothing stated, nothing lost: no grant."""
    u = UploadGrant()
    assert u.round_done([0.0, 0.0, 0.0], [0.5, 0.6, 0.4]) == 0.0  # the unpaced flood: nothing stated yet
    g = u.round_done([60e6, 20e6, 20e6], [0.05, 0.0, 0.0])  # seeded at 33.3M, which lost 1.7%: congestion
    assert g == pytest.approx(100e6 / 3 * 0.8) and u.ceiling_bps == pytest.approx(100e6 / 3) and u.cuts == 1
    g2 = u.round_done([0.0] * 3, [0.0] * 3)  # clean: +4%, at most 0.9 x the (crept) ceiling
    assert g2 == pytest.approx(min(g * 1.04, 0.9 * 100e6 / 3 * 1.002))
    assert u.round_done([0.0] * 3, [0.7, 0.7, 0.7]) == g2  # one burst round at a clean grant: unchanged
    assert u.round_done([0.0] * 3, [0.7, 0.7, 0.7]) == pytest.approx(g2 * 0.5)  # the second in a row: congestion
    t = UploadGrant()
    g = t.round_done([30e6] * 3, [0.0] * 3)  # seeded and clean: doubling
    assert g == 60e6 and t.round_done([0.0] * 3, [0.1] * 3) == 30e6  # the doubling overshot: back, ceiling 60M
    assert t.round_done([0.0] * 3, [0.7] * 3) == 30e6  # a burst at the clean grant
    assert t.round_done([0.0] * 3, [0.02, 0.0, 0.01]) == 30e6  # light loss just after it: the burst's tail
    assert t.round_done([0.0] * 3, [0.02, 0.0, 0.01]) == pytest.approx(30e6 * 0.8)  # once more: congestion
    r = UploadGrant()  # 25% random loss every round (a lossy path): each cut is undone the next round
    grants = [r.round_done([40e6] * 3, [0.25] * 3)] + [r.round_done([0.0] * 3, [0.25] * 3) for _ in range(20)]
    assert min(grants) == 20e6 and r.restores == r.cuts == 7 and sum(grants) / len(grants) > 33e6  # never below half
    v = UploadGrant()
    # seeded clean: the start rises, but to at most 1.25 x the rate the clean uploads arrived at (not 2x)
    assert v.round_done([0.0] * 3, [0.0] * 3, arrival_bps=14e6) == pytest.approx(1.25 * 14e6)
    assert v.round_done([0.0] * 3, [0.1, 0.0, 0.05]) == pytest.approx(14e6)  # the doubling overshot: back
    assert UploadGrant().round_done([0.0], [0.0]) == 0.0


def test_r12_a_seed_stated_after_an_unpaced_flood_is_not_judged_by_it():
    """Round 0: the first passes flood unpaced (60-90% lost), the workers' later passes state their own
    estimates; the seed is their mean, and the flood's loss is no verdict on it (a seed judged by it was
    cut, and a run climbed +4% a round from 17 to 28 Mbit/s). Paced first passes are judged."""
    u = UploadGrant()
    assert u.round_done([20e6, 16e6, 15e6], [0.8, 0.7, 0.9], paced=False) == pytest.approx(17e6) and u.cuts == 0
    v = UploadGrant()
    assert v.round_done([20e6, 16e6, 15e6], [0.8, 0.7, 0.9]) == pytest.approx(8.5e6) and v.cuts == 1


def test_r12_a_burst_during_the_start_is_not_taken_for_congestion():
    """The start rises 1.25x a round (the clean arrival rate's headroom); a 70% burst at a step of it is
    more than a 1.25x load can lose (20%), so it is a burst: the grant stays (the pacecheck burst row
    had cut 27 -> 17 Mbit/s at round 5 and paced its bursts at 19-20 against 30 by hand)."""
    u = UploadGrant()
    g = u.round_done([13e6] * 3, [0.0] * 3, arrival_bps=13e6)  # seeded and clean: 1.25x
    g = u.round_done([0.0] * 3, [0.0] * 3, arrival_bps=g)
    assert g == pytest.approx(13e6 * 1.25 ** 2)
    assert u.round_done([0.0] * 3, [0.7] * 3) == g and u.cuts == 0  # the burst: unchanged
    # 15% after it: congestion, the start's step overshot - back to the last clean grant
    assert u.round_done([0.0] * 3, [0.15] * 3) == pytest.approx(13e6 * 1.25) and u.cuts == 1


def test_r13_a_burst_over_two_broadcasts_does_not_cut_the_group():
    """A burst that begins while a broadcast is under way hits two broadcasts: with its head light
    (a cut, then the burst: the cut is undone) or heavy (two heavy rounds: the group's rule takes
    three in a row for congestion, the uploads' two) - the group's rate leaves the burst where it
    entered it, where the pacecheck burst row had ratcheted it 31 -> 25 -> 22 Mbit/s."""
    g = PacerGroup()
    g.round_done([30e6] * 3, [0.05] * 3)  # seeded, light loss: cut to 24M, proven
    r = g.round_done([0.0] * 3, [0.0] * 3)
    assert r == pytest.approx(24e6 * 1.04)
    for head in (0.05, 0.6):
        assert g.round_done([0.0] * 3, [head] * 3) <= r  # the burst's head
        assert g.round_done([0.0] * 3, [0.7] * 3) == pytest.approx(r)  # the burst: back where it entered
        assert g.round_done([0.0] * 3, [0.0] * 3) == pytest.approx(r)  # clean after it: held (never down)
        assert g.brain.rate_bps == pytest.approx(r)
    u = UploadGrant()  # the uploads' rule: two heavy rounds in a row are congestion
    u.round_done([30e6] * 3, [0.05] * 3)
    r = u.round_done([0.0] * 3, [0.0] * 3)
    assert u.round_done([0.0] * 3, [0.6] * 3) == pytest.approx(r)
    assert u.round_done([0.0] * 3, [0.7] * 3) == pytest.approx(r * 0.5)


def shared_link_rounds(grants: bool, rounds: int = 30, capacity: float = 100e6, chunks: int = 1400,
                       start: tuple[float, ...] = (60e6, 20e6, 20e6)) -> tuple[list[float], list[float]]:
    """Senders of one drop-tail bottleneck, a round at a time on a modelled clock: each sends a whole
    tensor's first pass at its rate; when their sum exceeds ``capacity`` every sender loses the excess
    share (1 - capacity / sum), else none. Returns each round's max/min rate ratio and its first-pass
    time (the slowest sender's), with or without R12's grant between rounds (its seed: the rates the
    senders stated in round 0)."""
    ps = []
    for r in start:
        p = AutoPacer()
        p.rate_bps, p.ceiling_bps, p.good_bps = r, r / 0.9, r  # settled, each 10% below where it last lost
        ps.append(p)
    u = UploadGrant()
    ratios, times = [], []
    for _ in range(rounds):
        rates = [p.rate_bps for p in ps]
        total = sum(rates)
        loss = max(0.0, 1.0 - capacity / total)
        times.append(max(chunks * DGRAM * 8 / r for r in rates))
        ratios.append(max(rates) / min(rates))
        for p, r in zip(ps, rates):
            got = round(chunks * (1.0 - loss))
            p.on_pass(chunks, got, chunks * DGRAM, chunks * DGRAM * 8 / r, chunks * DGRAM * 8 / min(r, capacity / 3),
                      True, r)
        if grants:
            g = u.round_done(rates, [loss] * len(rates))
            for p in ps:
                p.grant(g)
    return ratios, times


def test_r12_senders_of_one_bottleneck_converge_on_equal_shares():
    """Without grants the senders' 2:1 ratio holds round after round (both steps multiplicative) and each
    round waits for the slow sender; with them the rates are equal from the first grant on and the
    first pass (a 2 MB tensor on a 100 Mbit/s link) ends near the fair share's pace."""
    alone, t_alone = shared_link_rounds(False)
    granted, t_granted = shared_link_rounds(True)
    assert min(alone[5:]) > 1.9  # (the first pass's delivery-rate cap trims 3:1 to 2:1, no further)
    assert granted[0] == pytest.approx(3.0) and max(granted[1:]) == pytest.approx(1.0)
    fair = 1400 * DGRAM * 8 / (100e6 / 3)
    med_alone, med_granted = float(np.median(t_alone[5:])), float(np.median(t_granted[5:]))
    assert med_alone > 1.5 * fair and fair < med_granted < 1.2 * fair
    print(f"first pass, median of rounds 5-29: alone {med_alone:.3f} s, granted {med_granted:.3f} s, "
          f"fair share {fair:.3f} s")


# -- R12 at an early STOP: the loss a grant above the bottleneck causes at a high tolerance -------------


def _first_pass(rcv: Receiver, order: np.ndarray, lost: np.ndarray, now: float = 0.0) -> None:
    """The chunks of ``order`` in order, those where ``lost`` is set missing, until the receiver STOPs."""
    for i in range(0, order.size, 64):
        keep = order[i:i + 64][~lost[i:i + 64]]
        if keep.size:
            rcv.receive_chunks(0, np.sort(keep), now)  # (one batch; the receiver reads only the set)
        if rcv.complete:
            return


def test_r12_a_stop_before_the_probe_reports_the_first_pass_loss_from_the_order():
    """At P_high (40.8%) the threshold falls mid-pass and STOP comes before the PROBE; a grant whose
    uploads overflow the server link's queue must still show as loss (docs/pacing.md: 205 Mbit/s each
    into 500 Mbit/s). With the sender's order known the loss is that of the chunks sent before the
    last arrival; without it, no verdict."""
    layout = ChunkLayout(200_000, 1500)
    n = layout.chunks
    order = np.random.default_rng(3).permutation(n)
    pos = np.arange(n)
    queue_full = (pos >= 100) & (pos % 4 == 0)  # the queue fills after 100 datagrams, then drops one in four
    rcv = Receiver(layout, run_id=7, expected_sender=1, direction=ctl.UP)
    rcv.begin_round(0, None, now=0.0, tolerance=0.408)
    rcv.expect_order(order)
    _first_pass(rcv, order, queue_full)
    assert rcv.complete and rcv.stats.probes == 0
    held = rcv.mask[order]
    sent = int(np.flatnonzero(held)[-1]) + 1
    assert rcv.first_loss == pytest.approx(1 - rcv.received / sent)
    assert rcv.first_loss == pytest.approx(0.25 * (sent - 100) / sent, abs=0.01)  # about 21% of this pass
    # lossless, or a few datagrams missing (at most EARLY_CLEAN, as R11 takes a STOP: a loaded host's
    # late wake-ups meeting in the queue, which ratcheted the grant down): 0; without the order
    # (index order assumed, which it is not): no verdict, as before
    few = (pos > 100) & (pos % 97 == 0)  # about 1% of the pass
    for known, lost, want in ((True, np.zeros(n, bool), 0.0), (True, few, 0.0), (False, queue_full, 0.0)):
        rcv.begin_round(0, None, now=0.0, tolerance=0.408)
        if known:
            rcv.expect_order(order)
        _first_pass(rcv, order, lost)
        assert rcv.complete and rcv.first_loss == want
    # the PROBE's loss still wins when it comes first (a tolerance the first pass cannot meet)
    rcv.begin_round(0, None, now=0.0, tolerance=0.008)
    rcv.expect_order(order)
    _first_pass(rcv, order, queue_full)
    rcv.handle_control(ctl.Probe(0, ctl.UP, 1, 30e6), 0.1)
    assert not rcv.complete and rcv.first_loss == pytest.approx(1 - rcv.received / n)


def test_r12_the_server_grants_from_a_stop_first_round_loss():
    """Through the round logic: a self-pacing server with no value buffers (where it did not tell
    its receivers the order) learns each worker's early-STOP loss; light loss at the grant is
    congestion, and the grant is cut (it had risen +4% a round while overflowing)."""
    from dblp.protocol.policy import FixedPolicy
    from dblp.protocol.session import RecordContext, ServerSession, up_stream

    layout = ChunkLayout(200_000, 1500)
    n = layout.chunks
    ctx = RecordContext(source="test", policy="fixed", order="blocks")
    srv = ServerSession(layout, range(3), policy=FixedPolicy(0.408), run_id=7, context=ctx, rounds=3, values=False)
    srv.rates.uploads.rate_bps = srv.rates.uploads.good_bps = 205e6  # a proven grant, as after the run's start
    srv.rates.uploads.ceiling_bps = 228e6
    srv.start(0.0)
    srv.events()
    pos = np.arange(n)
    for w in range(3):
        order = send_order(n, "blocks", 0, 0, up_stream(w))
        _first_pass(srv.receiver(w), order, (pos >= 100) & (pos % 4 == 0))
    losses = [srv.receiver(w).first_loss for w in range(3)]
    assert all(0.15 < x < 0.2 for x in losses)  # light: the queue's overflow, not a burst
    srv.poll(0.5)
    loss = sum(losses) / 3
    # congestion: the ceiling becomes the grant, cut by 2 x the loss (taken for clean, it would rise to 205.6M)
    assert srv.rates.grant_bps == pytest.approx(205e6 * (1 - 2 * loss)) and srv.rates.uploads.ceiling_bps == 205e6


def test_r14_a_stop_first_broadcast_stream_reports_its_loss_in_the_stop():
    """The broadcast's streams STOP first at P_high too, and R14 must not take them for clean
    (docs/pacing.md: a group rate of 3 x 260 Mbit/s into a 500 Mbit/s link). The receiver counts the
    loss (R12's rule) and states its span in the STOP - only when the loss counts, so a lossless
    STOP is the plain frame byte for byte - and the sender takes its loss."""
    old = ctl.Stop(3, ctl.DOWN, 1644)
    assert len(ctl.encode(old)) == 5 + 9 and ctl.ControlDecoder().feed(ctl.encode(old)) == [old]
    new = ctl.Stop(3, ctl.DOWN, 1644, 2000)
    assert len(ctl.encode(new)) == 5 + 9 + 4 and ctl.ControlDecoder().feed(ctl.encode(new)) == [new]
    for body in (ctl.encode(old)[5:] + b"\x00" * 2, ctl.encode(old)[5:] + struct.pack("!I", 1000)):
        with pytest.raises(ctl.ControlError):  # a stray length; a span below the count
            ctl.decode_frame(6, body)
    layout = ChunkLayout(200_000, 1500)
    n = layout.chunks
    values = np.arange(layout.elements, dtype=np.float32)
    for lost_every, want_span in ((4, True), (None, False)):
        order = send_order(n, "perm", 5, 0, 0)
        enc = EncodedRound(values, layout, round_no=0, run_id=7, sender=0, order=order)
        snd = RoundSender(enc, direction=ctl.DOWN, now=0.0, order=order, pacer=AutoPacer())
        rcv = Receiver(layout, run_id=7, expected_sender=0, direction=ctl.DOWN)
        rcv.begin_round(0, np.zeros(layout.elements, np.float32), now=0.0, tolerance=0.408)
        rcv.expect_order(order)
        sent = 0
        while not rcv.complete:
            b = snd.datagrams_to_send(0.0)
            pos = sent + np.arange(b.seqs.size)
            keep = np.ones(b.seqs.size, bool) if lost_every is None else ~((pos >= 100) & (pos % lost_every == 0))
            sent += b.seqs.size
            rows, lengths = assemble_rows(b.headers, b.values, b.seqs, b.layout)
            rcv.receive_batch(rows[keep], lengths[keep], 0.001)
        (stop,) = rcv.control_to_send()
        assert isinstance(stop, ctl.Stop) and (stop.span > 0) == want_span
        snd.handle_control(stop, 0.01)
        assert snd.done and snd.first_loss == pytest.approx(rcv.first_loss)
        assert (0.15 < snd.first_loss < 0.25) if want_span else snd.first_loss == 0.0


# -- R15: the flood's dispersion ---------------------------------------------------------------------


def test_r15_a_seed_holds_at_the_share_and_is_judged_unproven():
    """The seed from a measured share: 0.9 of it, the share its ceiling, so a clean round holds (the
    ceiling's creep only) instead of doubling past the share; one seed per run; loss at the seed is
    congestion (a cut), also heavy loss (the seed is not proven)."""
    u = UploadGrant()
    assert u.seed(30e6) == pytest.approx(27e6) and u.ceiling_bps == 30e6
    assert u.seed(50e6) == 0.0 and u.rate_bps == pytest.approx(27e6)  # a grant exists: no second seed
    # clean: the soft ceiling rises 4% (not 0.2%), the grant to 0.9 of it; light loss then cuts it and
    # makes the ceiling firm (0.2% a clean round from then on)
    assert u.round_done([0.0] * 3, [0.0] * 3, arrival_bps=27e6) == pytest.approx(0.9 * 30e6 * 1.04)
    assert u.round_done([0.0] * 3, [0.05] * 3) == pytest.approx(0.9 * 30e6 * 1.04 * 0.8) and u.cuts == 1
    g = u.round_done([0.0] * 3, [0.0] * 3)
    assert u.ceiling_bps == pytest.approx(0.9 * 30e6 * 1.04 * 1.002)
    v = UploadGrant()
    v.seed(30e6)
    assert v.round_done([0.0] * 3, [0.7] * 3) == pytest.approx(27e6 * 0.5) and v.cuts == 1
    assert UploadGrant().seed(math.nan) == 0.0 and UploadGrant().seed(0.0) == 0.0
    g = PacerGroup()
    a, b = g.member(), g.member()
    assert g.seed(40e6) == pytest.approx(36e6) and g.granted
    assert a.rate_bps == b.rate_bps == pytest.approx(36e6)
    a.on_pass(1000, 100, 1000 * DGRAM, 0.01, 0.1, True, 36e6)  # the members' reports no longer move it
    assert b.rate_bps == pytest.approx(36e6)


def test_r15_the_receiver_keeps_the_first_pass_span_not_the_probe_time():
    """A flood's 400 datagrams arrive over 0.05 s (the link's pace), its PROBE 0.25 s after the first (a
    full queue dropped it; TCP resent it): the first pass is 400 chunks over 0.05 s; the retransmission's
    chunks after the BITMAP do not move it."""
    layout = ChunkLayout(362 * 1000)
    rcv = Receiver(layout, run_id=1, expected_sender=0, direction=ctl.UP)
    rcv.begin_round(0, None, now=0.0, tolerance=0.0)
    seqs = np.arange(0, 1000, 2)[:400]
    for i in range(0, 400, 40):
        rcv.receive_chunks(0, seqs[i:i + 40], 0.01 + 0.05 * (i + 40) / 400)
    rcv.handle_control(ctl.Probe(0, ctl.UP, 1), 0.26)
    assert [type(m) for m in rcv.control_to_send()] == [ctl.Bitmap]
    rcv.receive_chunks(0, np.setdiff1d(np.arange(1000), seqs), 0.5)
    assert rcv.complete and rcv.first_loss == pytest.approx(0.6)
    # the first read's 40 chunks arrived at times it did not see: left out (a lower bound: 360 over 0.045 s)
    assert rcv.lead == 40 and rcv.first_received == 360 and rcv.first_span_s == pytest.approx(0.05 - 0.005)
    rcv.begin_round(1, None, now=1.0, tolerance=0.0)
    assert rcv.first_received == rcv.lead == 0 and rcv.first_span_s == 0.0 and math.isnan(rcv.t_last)
    # a receiver that read late: 300 chunks waiting at its first read (one ``now``), 100 more over 0.01 s -
    # with the backlog counted in, 400 over 0.01 s would say 4x the rate the 100 arrived at
    rcv.receive_chunks(1, np.arange(150), 1.2)
    rcv.receive_chunks(1, np.arange(150, 300), 1.2)
    rcv.receive_chunks(1, np.arange(300, 400), 1.21)
    rcv.handle_control(ctl.Probe(1, ctl.UP, 1), 1.3)
    assert rcv.lead == 300 and rcv.first_received == 100 and rcv.first_span_s == pytest.approx(0.01)


def _flood_round(srv, chunks: int, link_bps: float, kept: float, t0: float = 0.0) -> float:
    """Round 0's uploads through one bottleneck: every worker floods unpaced, ``kept`` of each pass
    gets through, the survivors interleaved at ``link_bps``; the PROBEs come 0.25 s later, the
    retransmissions (everything else) after that. Returns when the last upload ended."""
    workers = list(srv.live)
    dsize = srv.layout.datagram_size
    keep = np.flatnonzero(np.arange(chunks) % 10 < round(kept * 10))
    t, step = t0, dsize * 8 / link_bps
    for i in range(0, keep.size, 16):  # 16 datagrams of each worker in turn: the queue's interleaving
        for w in workers:
            t += step * keep[i:i + 16].size
            srv.receiver(w).receive_chunks(0, keep[i:i + 16], t)
    t_probe = t0 + 0.25
    for w in workers:
        srv.receiver(w).handle_control(ctl.Probe(0, ctl.UP, 1), t_probe)
        srv.receiver(w).control_to_send()
    rest = np.setdiff1d(np.arange(chunks), keep)
    for w in workers:
        srv.receiver(w).receive_chunks(0, rest, t_probe + 1.0)
    return t_probe + 1.0


def test_r15_a_lossy_unpaced_flood_seeds_the_grant_and_floors_the_broadcast_start():
    """Three workers flood a 100 Mbit/s bottleneck, 30% gets through: the server measures 100 Mbit/s
    from the flood's span (not the PROBEs' 0.25 s, which would say a fifth of it) and grants 0.9 x
    100/3 Mbit/s in round 1's ROUND(up). Round 0's broadcast still floods; its first lossy reply (a
    PROBE answered 0.25 s late again) would start the group at a few Mbit/s: the uploads' share is
    its floor, so every stream goes on at 0.9 x the share, and the group's rule does not judge that
    seed by the unpaced broadcast's loss. Before R15: no grant in round 1 (nothing stated), and the
    group at the brain's estimate."""
    from dblp.protocol.policy import FixedPolicy
    from dblp.protocol.session import ControlToSend, RecordContext, ReduceRequested, SenderStarted, ServerSession

    layout = ChunkLayout(362 * 1400)
    ctx = RecordContext(source="test", policy="fixed", order="inorder", send_rate_bps=None)
    srv = ServerSession(layout, range(3), policy=FixedPolicy(0.0), run_id=1, context=ctx, values=False, rounds=3)
    srv.start(0.0)
    srv.events()
    now = _flood_round(srv, layout.chunks, 100e6, kept=0.3)
    srv.poll(now)
    assert [type(e) for e in srv.events()] == [ReduceRequested]
    share = 100e6 / 3
    srv.broadcast(1.0, now)
    started = [e.sender for e in srv.events() if isinstance(e, SenderStarted)]
    assert len(started) == 3 and all(s.pacer.unlimited for s in started)  # round 0's broadcast: unpaced
    first = started[0]
    while first.datagrams_to_send(now) is not None:
        pass
    assert [type(m) for m in first.control_to_send()] == [ctl.Probe]
    mask = np.arange(layout.chunks) % 10 < 2  # 20% arrived; the reply 0.25 s late
    first.handle_control(ctl.Bitmap(0, ctl.DOWN, int(mask.sum()), np.packbits(mask).tobytes()), now + 0.25)
    for s in started:
        assert s.pacer.rate_bps == pytest.approx(0.9 * share, rel=0.05)  # (each first read left out: 97%)
    for s in started[1:]:
        s.handle_control(ctl.Stop(0, ctl.DOWN, layout.chunks), now + 0.5)
    first.handle_control(ctl.Stop(0, ctl.DOWN, layout.chunks), now + 0.6)
    srv.poll(now + 0.6)
    grants = [e.message.grant_bps for e in srv.events()
              if isinstance(e, ControlToSend) and isinstance(e.message, ctl.RoundStart) and e.message.round == 1]
    assert len(grants) == 3 and grants[0] == pytest.approx(0.9 * share, rel=0.05) and len(set(grants)) == 1
    light = ServerSession(layout, range(3), policy=FixedPolicy(0.0), run_id=1, context=ctx, values=False, rounds=3)
    light.start(0.0)
    light.events()
    light.poll(_flood_round(light, layout.chunks, 100e6, kept=0.8))  # 20% lost: under FLOOD_LOSS, no measure
    assert [type(e) for e in light.events()] == [ReduceRequested]
    light.broadcast(1.0, 2.0)
    assert all(e.sender.pacer.unlimited for e in light.events() if isinstance(e, SenderStarted))
    g = PacerGroup()  # the rule's first verdict after such a seed: the unpaced broadcast's loss is none
    g.floor_bps = share
    m = g.member()
    m.on_pass(1400, 280, 1400 * DGRAM, 0.1, 0.25, True, 0.0)  # the brain: 21 Mbit/s
    assert g.granted and m.rate_bps == pytest.approx(0.9 * share)
    assert g.round_done([0.0] * 3, [0.8] * 3) == pytest.approx(0.9 * share) and g.rule.cuts == 0
    assert g.round_done([0.9 * share] * 3, [0.0] * 3) == pytest.approx(0.9 * share * 1.04)  # clean: the soft step


def test_r15_a_floor_below_the_brains_estimate_changes_nothing():
    """The uploads' share is the server's receiving; on loopback it sent faster than it received:
    a broadcast whose own flood estimate is above the floor, up to START_CAP times it, keeps it
    (no seed, R14 as before). The brain here: 1000 of 1400 chunks, reply 0.25 s, sent in 0.1 s:
    sqrt(47 x 118) = 74.6 Mbit/s."""
    g = PacerGroup()
    g.floor_bps = 40e6
    m = g.member()
    m.on_pass(1400, 1000, 1400 * DGRAM, 0.1, 0.25, True, 0.0)
    assert not g.granted and m.rate_bps == pytest.approx(74.6e6, rel=0.01)


def test_r15_a_broadcast_flood_start_far_above_the_uploads_share_is_seeded_at_it():
    """A broadcast flood sent fast gives the brain a start far above the share (the send time is
    its upper bound: 298 Mbit/s a stream where 8 share 100 Mbit/s, docs/pacing.md), from which
    R14's rule swings. Above START_CAP x the share the group is seeded at 0.9 x the share, as
    below the floor; the unpaced broadcast's loss is no verdict on it."""
    g = PacerGroup()
    g.floor_bps = 12.5e6
    m = g.member()
    m.on_pass(1400, 1000, 1400 * DGRAM, 0.01, 0.05, True, 0.0)  # the brain: sqrt(235 x 1178) = 527 Mbit/s
    assert g.granted and m.rate_bps == pytest.approx(0.9 * 12.5e6)
    assert g.round_done([0.0] * 8, [0.7] * 8) == pytest.approx(0.9 * 12.5e6) and g.rule.cuts == 0
    assert g.round_done([0.9 * 12.5e6] * 8, [0.0] * 8) == pytest.approx(0.9 * 12.5e6 * 1.04)
    late = PacerGroup()  # a stream whose first pass began after the seed states it; the others flooded
    late.floor_bps = 33e6
    late.member().on_pass(1400, 1000, 1400 * DGRAM, 0.01, 0.05, True, 0.0)
    seed = 0.9 * 33e6
    assert late.round_done([0.0, seed, 0.0], [0.95, 0.8, 0.96]) == pytest.approx(seed)  # judged: halved
    assert late.rule.cuts == 0
    alone = PacerGroup()  # no floor (the uploads' flood did not overflow: loopback, fast links): as before
    alone.member().on_pass(1400, 1000, 1400 * DGRAM, 0.01, 0.05, True, 0.0)
    assert not alone.granted and alone.brain.rate_bps == pytest.approx(527e6, rel=0.01)


def test_r16_the_broadcast_holds_its_rate_through_a_bursts_head():
    """A burst switched on as round k opens hits round k-1's slower broadcast streams: light loss at
    the group's proven rate. Judged, it is a 20% cut, and round k's burst broadcast goes at the cut
    rate (docs/pacing.md, R16). When round k's uploads were taken for a burst (UploadGrant.burst),
    the light loss is the burst's head: the rate is held, and the burst and its tail after it
    change nothing. Without the uploads' word the light loss is congestion."""
    u = UploadGrant()
    u.round_done([30e6] * 3, [0.0] * 3)
    u.round_done([0.0] * 3, [0.0] * 3)
    assert not u.burst
    grant = u.rate_bps
    assert u.round_done([0.0] * 3, [0.7] * 3) == pytest.approx(grant) and u.burst  # the uploads' burst
    assert u.round_done([0.0] * 3, [0.0] * 3) > 0 and not u.burst

    def settled() -> tuple[PacerGroup, float]:
        g = PacerGroup()
        g.round_done([30e6] * 3, [0.05] * 3)  # seeded, light loss: cut to 24M, proven
        return g, g.round_done([0.0] * 3, [0.0] * 3)

    g, r = settled()
    assert g.round_done([0.0] * 3, [0.0, 0.05, 0.08], burst=True) == pytest.approx(r)  # the head: held
    assert g.brain.rate_bps == pytest.approx(r) and g.rule.cuts == 1
    assert g.round_done([0.0] * 3, [0.7] * 3, burst=False) == pytest.approx(r)  # the burst broadcast
    assert g.round_done([0.0] * 3, [0.03] * 3) == pytest.approx(r)  # its tail
    assert g.round_done([0.0] * 3, [0.0] * 3) == pytest.approx(r * 1.04)  # clean: the step, as before
    old, r = settled()
    assert old.round_done([0.0] * 3, [0.0, 0.05, 0.08]) == pytest.approx(r * 0.8)  # no burst said: a cut
    assert old.rule.cuts == 2


def test_r17_heavy_loss_beside_a_clean_upload_after_a_burst_is_its_tail():
    """The flagship's shape (docs/pacing.md, R17): a 70% burst at round 50 (a burst verdict, the
    grant held at 142 Mbit/s) that ends while round 51's first passes are under way - they lose
    40%, 35% and 0% (the last worker starts after it). Judged, that mean of 25% at a proven grant
    is the second heavy round in a row and halves the grant. Heavy loss beside a clean first pass,
    just after a burst, is the burst's tail; the same loss on every upload is still congestion,
    and a congested round after the tail still counts as the next strike."""
    def proven() -> tuple[UploadGrant, float]:
        u = UploadGrant()
        u.round_done([142e6] * 3, [0.0] * 3)
        u.round_done([0.0] * 3, [0.0] * 3)  # (doubling, capped by nothing here)
        u.round_done([0.0] * 3, [0.04] * 3)  # the doubling overshot: back to the clean grant, ceiling set
        return u, u.round_done([0.0] * 3, [0.0] * 3)

    u, g = proven()
    assert u.round_done([0.0] * 3, [0.7, 0.7, 0.7]) == pytest.approx(g) and u.burst  # the burst
    assert u.round_done([0.0] * 3, [0.40, 0.35, 0.0]) == pytest.approx(g)  # its tail: before R17, g / 2
    assert u.cuts == 1 and u.round_done([0.0] * 3, [0.0] * 3) > g  # clean after it: the step up
    c, g = proven()
    c.round_done([0.0] * 3, [0.7] * 3)
    assert c.round_done([0.0] * 3, [0.40, 0.35, 0.30]) == pytest.approx(g * 0.5)  # every upload lost: congestion
    t, g = proven()
    t.round_done([0.0] * 3, [0.7] * 3)
    t.round_done([0.0] * 3, [0.40, 0.35, 0.0])  # the tail
    assert t.round_done([0.0] * 3, [0.3] * 3) == pytest.approx(g * 0.5)  # heavy again: the second strike, a cut
    one, g = UploadGrant(), 0.0
    one.round_done([142e6], [0.0])
    one.round_done([0.0], [0.0])
    one.round_done([0.0], [0.04])
    g = one.round_done([0.0], [0.0])
    one.round_done([0.0], [0.7])
    assert one.round_done([0.0], [0.25]) < g  # one worker: no witness, as before


def test_r15_the_bitmap_states_the_flood_rate_and_the_sender_starts_from_it():
    """On the wire a BITMAP with a rate is type 13 (type 5, byte for byte the old frame, without one). A
    self-paced receiver answers an unpaced first pass that lost with the rate its chunks arrived at
    (400 chunks over 0.05 s); the sender's AutoPacer starts its retransmissions at 0.9 of it, where its
    own bounds (the reply 0.25 s late) said a few Mbit/s. A paced first pass is not told; nor is a
    receiver of a run that does not self-pace."""
    old = ctl.Bitmap(3, ctl.UP, 5, b"\x0f\xf0")
    told = ctl.Bitmap(3, ctl.UP, 5, b"\x0f\xf0", 40e6)
    assert ctl.encode(old)[4] == 5 and ctl.encode(told)[4] == 13 and len(ctl.encode(told)) == len(ctl.encode(old)) + 8
    assert ctl.ControlDecoder().feed(ctl.encode(old) + ctl.encode(told)) == [old, told]
    for body in (ctl.encode(told)[5:14], ctl.encode(old)[5:14] + b"\x00" * 8 + b"\x0f\xf0",
                 ctl.encode(old)[5:14] + struct.pack("!d", math.inf) + b"\x0f\xf0"):
        with pytest.raises(ctl.ControlError):
            ctl.decode_frame(13, body)

    layout = ChunkLayout(362 * 1000)
    values = np.zeros(layout.elements, np.float32)
    rates = {}
    for tell, stated in ((True, 0.0), (False, 0.0), (True, 20e6)):
        rcv = Receiver(layout, run_id=1, expected_sender=0, direction=ctl.UP)
        rcv.tell_rate = tell
        rcv.begin_round(0, None, now=0.0, tolerance=0.0)
        seqs = np.arange(0, 1000, 2)[:400]
        for i in range(0, 400, 40):
            rcv.receive_chunks(0, seqs[i:i + 40], 0.01 + 0.05 * (i + 40) / 400)
        rcv.handle_control(ctl.Probe(0, ctl.UP, 1, stated), 0.26)
        (bm,) = rcv.control_to_send()
        rates[(tell, stated)] = bm.rate_bps
    arrived = 360 * layout.datagram_size * 8 / 0.045  # the first read's 40 left out
    assert rates == {(True, 0.0): pytest.approx(arrived), (False, 0.0): 0.0, (True, 20e6): 0.0}

    enc = EncodedRound(values, layout, round_no=0, run_id=1, sender=0)
    pacer = AutoPacer()
    snd = RoundSender(enc, direction=ctl.UP, now=0.0, order="inorder", pacer=pacer)
    while snd.datagrams_to_send(0.0) is not None:
        pass
    snd.control_to_send()
    mask = np.zeros(layout.chunks, bool)
    mask[np.arange(0, 1000, 2)[:400]] = True
    snd.handle_control(ctl.Bitmap(0, ctl.UP, 400, np.packbits(mask).tobytes(), arrived), 0.26)
    assert pacer.rate_bps == pytest.approx(0.9 * arrived) and pacer.cuts == 1
