"""The pacing package's decisions the round logic and the transport ask for: R12/R14's arrival
rates, R15's flood share, ServerPacing's grant and group rate (R12, R14-R16), and R13's cork."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dblp.protocol.pacing import (FLOOD_LOSS, HOLD, MIN_SAMPLE, ControlCork, ServerPacing, broadcast_arrival_bps,
                                  clean_rate_bps, corks_upstream, flood_share_bps, stops_tell_nothing,
                                  upload_arrival_bps)

DGRAM = 1472


def upload(*, loss: float = 0.0, stated: float = 0.0, first_rate: float = 0.0, first_received: int = 0,
           span: float = 0.0, received: int = 0, lead: int = 0, t_first: float = 0.0, t_done: float = 0.0):
    """A receiver's view of one upload, as :class:`dblp.protocol.receiver.Receiver` holds it."""
    return SimpleNamespace(stated_rate_bps=stated, first_rate_bps=first_rate, first_loss=loss,
                           first_received=first_received, first_span_s=span, received=received, lead=lead,
                           stats=SimpleNamespace(t_first=t_first, t_done=t_done))


def stream(*, loss: float = 0.0, rate: float = 0.0, received: int = 0, t_start: float = 0.0, t_done: float = 0.0):
    """A broadcast stream's sender, as :class:`dblp.protocol.sender.RoundSender` holds it."""
    return SimpleNamespace(first_loss=loss, first_rate_bps=rate,
                           stats=SimpleNamespace(received=received, t_start=t_start, t_done=t_done))


def flood() -> list[SimpleNamespace]:
    """Three unpaced first passes that lost 60% each: 400 chunks each over 0.1 s, starting 1 ms apart."""
    return [upload(loss=0.6, first_received=400, span=0.1, received=400, t_first=i * 0.001, t_done=0.3)
            for i in range(3)]


def test_clean_rate_is_the_mean_of_clean_flows_and_nothing_after_any_loss():
    assert clean_rate_bps([(0.0, 1000, 0.25), (0.0, 500, 0.25)], DGRAM) == pytest.approx(35.328e6)
    assert clean_rate_bps([(0.0, 1000, 0.25), (0.01, 500, 0.25)], DGRAM) == 0.0
    assert clean_rate_bps([(0.0, 1000, 0.0)], DGRAM) == 0.0
    assert clean_rate_bps([], DGRAM) == 0.0
    ups = [upload(received=400, t_first=0.1, t_done=0.3), upload(received=800, t_first=0.0, t_done=0.4)]
    assert upload_arrival_bps(ups, DGRAM) == pytest.approx((23.552e6 + 23.552e6) / 2)
    # R14: an unpaced stream (rate 0) among them: no evidence, the group stays as its brain left it
    paced = [stream(rate=50e6, received=1000, t_done=0.25), stream(rate=50e6, received=1000, t_done=0.25)]
    assert broadcast_arrival_bps(paced, DGRAM) == pytest.approx(47.104e6)
    assert broadcast_arrival_bps(paced + [stream(rate=0.0, received=1000, t_done=0.25)], DGRAM) == 0.0


def test_r15_the_flood_share_is_all_first_pass_chunks_over_their_span_split_equally():
    """1,200 chunks of 1,472 bytes from t = 0 to 0.102 s (the last first pass's end), over three
    workers: 46.18 Mbit/s each."""
    assert flood_share_bps(flood(), DGRAM) == pytest.approx(1200 * DGRAM * 8 / 0.102 / 3)
    assert flood_share_bps(flood(), DGRAM) == pytest.approx(46.1804e6, rel=1e-5)
    # a STOP first (no loss at the first PROBE): the chunks at STOP less the first read's, to t_done
    mixed = [upload(loss=0.8, first_received=400, span=0.1, t_first=i * 0.001) for i in range(2)]
    mixed.append(upload(loss=0.0, received=450, lead=50, t_first=0.002, t_done=0.15))
    assert sum(u.first_loss for u in mixed) >= FLOOD_LOSS * 3
    assert flood_share_bps(mixed, DGRAM) == pytest.approx(1200 * DGRAM * 8 / 0.15 / 3)
    # nothing said of the path: lighter loss, a paced pass, too few chunks, no span
    light = [upload(loss=0.4, first_received=400, span=0.1, t_first=0.0) for _ in range(3)]
    assert flood_share_bps(light, DGRAM) == 0.0
    assert flood_share_bps(flood()[:2] + [upload(loss=0.6, first_rate=30e6, first_received=400, span=0.1)],
                           DGRAM) == 0.0
    few = [upload(loss=0.6, first_received=(MIN_SAMPLE - 1) // 3, span=0.1) for _ in range(3)]
    assert flood_share_bps(few, DGRAM) == 0.0
    assert flood_share_bps([upload(loss=0.6, first_received=400, span=0.0)], DGRAM) == 0.0
    assert flood_share_bps([], DGRAM) == 0.0


def test_server_pacing_seeds_the_grant_and_floors_the_group_from_the_flood_then_judges_rounds():
    sp = ServerPacing(DGRAM)
    share = 1200 * DGRAM * 8 / 0.102 / 3
    assert sp.uploads_done(flood()) == pytest.approx(HOLD * share) and sp.grant_bps == pytest.approx(HOLD * share)
    assert sp.group.floor_bps == pytest.approx(share) and sp.uploads.ceiling_bps == pytest.approx(share)
    # the next round: clean paced uploads at the grant - the soft ceiling rises 4%, the grant to HOLD of it
    g = sp.grant_bps
    clean = [upload(stated=g, first_rate=g, received=400, t_first=0.0, t_done=0.2) for _ in range(3)]
    assert sp.uploads_done(clean) == pytest.approx(HOLD * share * 1.04)
    assert sp.group.floor_bps == pytest.approx(share)  # (the floor is the first flood's, once)
    # a fixed-rate-like round with nothing stated and nothing known: no grant
    assert ServerPacing(DGRAM).uploads_done([upload(loss=0.1, first_received=400, span=0.1)]) == 0.0


def test_server_pacing_sets_the_broadcast_rate_from_the_last_broadcast_and_holds_it_for_a_burst_head():
    sp = ServerPacing(DGRAM)
    sp.broadcast_begins([])  # round 0: nothing before, the brain's start stands
    assert not sp.group.granted and sp.group.brain.rate_bps == 0.0
    sp.broadcast_begins([stream(rate=0.0, received=1000, t_done=0.25)] * 2)  # unpaced and clean: stays unpaced
    assert not sp.group.granted and sp.group.brain.rate_bps == 0.0
    paced = [stream(rate=50e6, received=1000, t_done=0.25) for _ in range(2)]
    sp.broadcast_begins(paced)  # R14: seeded at the stated 50M, clean: doubling, capped at 1.25 x 47.104M
    assert sp.group.granted and sp.group.brain.rate_bps == pytest.approx(1.25 * 47.104e6)
    assert sp.member().rate_bps == pytest.approx(1.25 * 47.104e6)
    # R16: this round's uploads were a burst: light loss in the last broadcast is its head, the rate holds
    sp.uploads.burst = True
    sp.broadcast_begins([stream(loss=0.05, rate=58.88e6, received=950, t_done=0.25) for _ in range(2)])
    assert sp.group.brain.rate_bps == pytest.approx(1.25 * 47.104e6) and sp.group.rule.cuts == 0
    # not a burst: the same light loss is congestion - in the start, back to the last clean rate (50M)
    sp.uploads.burst = False
    sp.broadcast_begins([stream(loss=0.05, rate=58.88e6, received=950, t_done=0.25) for _ in range(2)])
    assert sp.group.rule.cuts == 1 and sp.group.brain.rate_bps == 50e6
    assert sp.group.rule.ceiling_bps == pytest.approx(1.25 * 47.104e6)


def test_r13_the_cork_holds_in_order_and_says_what_is_due():
    c = ControlCork()
    assert not c.corked and not c.hold(b"round", stop=False)  # not corked: the caller writes now
    c.cork()
    assert c.corked and not c.due_before_data() and not c.due_before_wait() and c.take() == b""
    assert c.hold(b"R1", stop=False) and c.hold(b"S1", stop=True)
    assert c.due_before_data() and c.due_before_wait() and c.take() == b"R1S1"
    assert c.corked and c.frames == []
    # held STOPs wait across waits, not before data; any other frame ends that and goes at the wait
    c.hold_stops = True
    assert c.hold(b"S2", stop=True) and c.hold_stops
    assert c.due_before_data() and not c.due_before_wait()
    assert c.hold(b"B2", stop=False) and not c.hold_stops and c.due_before_wait()
    assert c.take() == b"S2B2"
    c.hold_stops = True
    c.uncork()
    assert not c.corked and not c.hold_stops and not c.due_before_data()


def test_r13_the_server_corks_one_batch_rounds_and_holds_stops_below_min_sample():
    assert corks_upstream(256, 256) and not corks_upstream(257, 256) and corks_upstream(1, 64)
    assert stops_tell_nothing(MIN_SAMPLE - 1) and not stops_tell_nothing(MIN_SAMPLE)
    assert MIN_SAMPLE == 32
