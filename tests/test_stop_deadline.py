"""Core R5b's ``deadline`` stop rule on the sans-I/O receiver, with hand-made times (exact values).

The receiver has no clock: every time here is the ``now`` handed in. A 100-chunk transfer at
tolerance 0.4 has the threshold ceil(0.6 * 100) = 60.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol import receiver as recv_mod
from dblp.protocol.core import Receiver, RoundSender, VirtualRound
from dblp.protocol.wire import ChunkLayout, ParameterError

CF = ChunkLayout(1).chunk_floats


def _receiver(rule: str = "deadline") -> Receiver:
    return Receiver(ChunkLayout(100 * CF), run_id=1, expected_sender=0, direction=ctl.UP, stop_rule=rule)


def _open(r: Receiver, k: int, now: float) -> None:
    r.begin_round(k, None, now, tolerance=0.4)
    r.control_to_send()


def _stops(r: Receiver) -> list[ctl.Stop]:
    return [m for m in r.control_to_send() if isinstance(m, ctl.Stop)]


def test_defaults_are_the_charters():
    assert recv_mod.DEADLINE_FACTOR == 2.0 and recv_mod.DEADLINE_GAIN == 0.25
    assert recv_mod.STOP_RULES == ("early", "once", "deadline")
    with pytest.raises(ParameterError, match="stop_rule must be one of early, once, deadline, got 'soon'"):
        _receiver("soon")


def test_first_transfer_has_no_estimate_and_behaves_as_once():
    r = _receiver()
    _open(r, 0, 0.0)
    assert r.deadline_s == math.inf and r.deadline_at == math.inf and r.stop_count == 100
    r.receive_chunks(0, np.arange(80), 1.2)  # 80 held at t=1.2: above the threshold, no estimate: no STOP
    assert not r.complete and r.received == 80
    assert r.stats.t_first == 1.2
    r.receive_chunks(0, np.arange(80, 100), 1.7)  # every chunk: STOP
    assert r.complete and [s.received for s in _stops(r)] == [100]
    assert r.pass_estimate_s == pytest.approx(0.5, abs=1e-12)  # 1.7 - 1.2, all held: scale 1
    assert r.deadline_s == pytest.approx(1.0, abs=1e-12)


def _with_estimate(est: float = 0.5) -> Receiver:
    """A receiver whose first transfer ran ``est`` seconds, clean (estimate = est)."""
    r = _receiver()
    _open(r, 0, 0.0)
    r.receive_chunks(0, np.arange(1), 0.0)
    r.receive_chunks(0, np.arange(1, 100), est)
    assert r.complete and r.pass_estimate_s == est
    r.finish_round()
    return r


def test_sixty_percent_before_the_deadline_waits_after_it_stops():
    r = _with_estimate(0.5)  # deadline 1.0 s after the first chunk
    _open(r, 1, 9.0)
    r.receive_chunks(1, np.arange(1), 10.0)  # t_first = 10.0
    assert r.deadline_at == 11.0
    r.receive_chunks(1, np.arange(1, 60), 10.5)  # 60% held at t=10.5: the bound holds, the deadline not
    assert not r.complete and r.received == 60
    r.receive_chunks(1, np.arange(60, 70), 10.999)  # 70 held, still before 11.0
    assert not r.complete and r.received == 70
    r.receive_chunks(1, np.arange(70, 71), 11.0)  # the first arrival at the deadline closes the pass
    assert r.complete and r.received == 71 and r.stats.t_done == 11.0
    assert [s.received for s in _stops(r)] == [71]
    # the cut pass's sample: 1.0 s for 71 chunks, i.e. 100/71 s for the whole; the estimate moves by a quarter
    assert r.pass_estimate_s == pytest.approx(0.5 + 0.25 * (100 / 71 - 0.5), rel=1e-12)
    assert r.mask[:71].all() and not r.mask[71:].any()


def test_never_before_the_bound():
    r = _with_estimate(0.5)
    _open(r, 1, 20.0)
    r.receive_chunks(1, np.arange(50), 20.0)  # 50 at t_first = 20.0
    r.receive_chunks(1, np.arange(50, 51), 30.0)  # 10 s late, 51 held: below the threshold, no STOP
    assert not r.complete and r.received == 51
    r.receive_chunks(1, np.arange(51, 59), 30.1)
    assert not r.complete and r.received == 59
    r.receive_chunks(1, np.arange(59, 60), 30.2)  # the 60th: past the deadline, the bound met: STOP
    assert r.complete and [s.received for s in _stops(r)] == [60]
    assert r.pass_estimate_s == pytest.approx(0.5 + 0.25 * (10.2 * 100 / 60 - 0.5), rel=1e-12)


def test_every_chunk_before_the_deadline_stops_at_once():
    r = _with_estimate(0.5)
    _open(r, 1, 0.0)
    r.receive_chunks(1, np.arange(1), 5.0)
    r.receive_chunks(1, np.arange(1, 100), 5.4)
    assert r.complete and [s.received for s in _stops(r)] == [100]
    assert r.pass_estimate_s == pytest.approx(0.5 + 0.25 * (0.4 - 0.5), rel=1e-12)  # 0.475


def test_the_probe_ends_the_deadline_and_r5_applies():
    r = _with_estimate(0.5)
    _open(r, 1, 0.0)
    r.receive_chunks(1, np.arange(1), 1.0)
    r.receive_chunks(1, np.arange(1, 30), 1.3)  # a burst: 30 held
    r.handle_control(ctl.Probe(1, ctl.UP, 1), 1.6)  # the first pass's PROBE: BITMAP, the deadline gone
    out = r.control_to_send()
    assert [type(m) for m in out] == [ctl.Bitmap] and r.deadline_s == math.inf and r.stop_count == 60
    assert r.pass_estimate_s == pytest.approx(0.5 + 0.25 * (0.6 - 0.5), rel=1e-12)  # the whole pass was sent: 0.6
    r.receive_chunks(1, np.arange(30, 59), 50.0)  # a retransmission, long after: no deadline close below the bound
    assert not r.complete
    r.receive_chunks(1, np.arange(59, 61), 50.1)  # R5: STOP at the threshold
    assert r.complete and [s.received for s in _stops(r)] == [61]


def test_a_pass_without_time_is_a_sample_of_zero():
    r = _receiver()
    _open(r, 0, 0.0)
    r.receive_chunks(0, np.arange(100), 3.0)  # every chunk at one instant (one read, a host-local slot, a model)
    assert r.complete and r.pass_estimate_s == 0.0 and r.deadline_s == 0.0
    r.finish_round()
    _open(r, 1, 4.0)
    r.receive_chunks(1, np.arange(59), 5.0)
    assert not r.complete
    r.receive_chunks(1, np.arange(59, 60), 5.001)  # a deadline of 0: the threshold closes the pass (as early)
    assert r.complete and r.received == 60
    assert r.pass_estimate_s == pytest.approx(0.25 * 0.001 * 100 / 60, rel=1e-9)


@pytest.mark.parametrize("rule", ["early", "once"])
def test_other_rules_have_no_deadline(rule):
    r = _receiver(rule)
    _open(r, 0, 0.0)
    r.receive_chunks(0, np.arange(1), 0.0)
    r.receive_chunks(0, np.arange(1, 100), 1.0)
    assert math.isnan(r.pass_estimate_s) and r.deadline_s == math.inf


def test_stop_arrival_names_the_arrival_the_stop_comes_with():
    r = _with_estimate(0.5)
    _open(r, 1, 0.0)
    # before the first chunk: the deadline counts from the first arrival's time
    times = 10.0 + np.arange(100) / 32  # chunk i at 10 + i/32 s: the deadline 11.0 is the 33rd arrival's
    assert r.stop_arrival(times) == 60  # the bound (60) comes after the deadline: STOP with the 60th
    slow = 10.0 + np.arange(100) / 128  # the deadline after the last arrival: every chunk first
    assert r.stop_arrival(slow) == 100
    mid = 10.0 + np.arange(100) / 64  # the deadline 11.0 at chunk 64 (the 65th arrival)
    assert r.stop_arrival(mid) == 65
    r.receive_chunks(1, np.arange(1), float(mid[0]))
    r.receive_chunks(1, np.arange(1, 64), float(mid[63]))
    assert not r.complete and r.deadline_at == 11.0
    assert r.stop_arrival(mid[64:]) == 1  # the next arrival, at the deadline itself
    assert r.stop_arrival(mid[64:64]) == 0  # no arrival: no STOP among them
    r.receive_chunks(1, np.arange(64, 65), float(mid[64]))
    assert r.complete and r.received == 65 and r.stop_arrival(mid[65:]) == 0
    early = _receiver("early")
    _open(early, 0, 0.0)
    assert early.stop_arrival(times) == 60 and early.stop_arrival(times[:59]) == 0


def _paced_transfer(r: Receiver, k: int, t0: float, dt: float) -> tuple[RoundSender, float]:
    """One transfer, datagram i handed out and received at t0 + i dt, the PROBE after the last."""
    lay = r.layout
    s = RoundSender(VirtualRound(lay, k), direction=ctl.UP, now=t0, order="inorder")
    _open(r, k, t0)
    i, now = 0, t0
    while not s.done:
        now = t0 + i * dt
        b = s.datagrams_to_send(now, limit=1)
        if b is None:
            for m in s.control_to_send():
                r.handle_control(m, now)
        else:
            r.receive_chunks(k, b.seqs, now)
            i += 1
        for m in r.control_to_send():
            s.handle_control(m, now)
    r.finish_round()
    return s, now


def test_a_straggling_pass_is_cut_at_its_deadline_and_the_sender_knows_what_it_never_sent():
    r = _receiver()
    s0, _ = _paced_transfer(r, 0, 0.0, 1 / 128)  # clean: 100 chunks over 99/128 s, STOP with the last
    assert s0.stats.received == 100 and r.pass_estimate_s == 99 / 128
    s1, t_stop = _paced_transfer(r, 1, 10.0, 3 / 128)  # three times slower: the deadline 2 x 99/128 s
    # the first chunk at or after 10 + 198/128 is number 66 (66 x 3/128 = 198/128): 67 held, 33 never sent
    assert t_stop == 10.0 + 198 / 128 and s1.stats.received == 67 and s1.stats.early_stop
    assert s1.undelivered().tolist() == list(range(67, 100))
    assert r.pass_estimate_s == pytest.approx(99 / 128 + 0.25 * (198 / 128 * 100 / 67 - 99 / 128), rel=1e-12)
    early = _receiver("early")
    s2, _ = _paced_transfer(early, 0, 0.0, 3 / 128)  # the paper's rule cuts at the threshold
    assert s2.stats.received == 60
