"""The first iteration's synchronised incast at flow level (dblp.sim.engines.incast) against the round
level's walk of every pass (the reference), on incasts small enough to walk.

Tolerances, on the first iteration's records (means over the workers; in parentheses the largest
difference measured on the three configurations below at seeds 0-4): the
run's end time and the mean round time within 0.5% (0.31%), the mean upload latency within 2%
(1.38%), the mean datagrams sent within 2% (1.16%), the mean passes per upload within 3% or one pass,
whichever is more (24 and 40 workers: 0.79%; 8 workers, 5 passes each: up to 0.88 of a pass, +17.5%
at seed 3 - a worker's last pass either reaches the receiver's need or leaves a few chunks for one
more); the received fractions exact (each upload ends at the receiver's need). Stale counts and which
worker is slowest are not held: the model draws a pass's verdicts as one binomial, not datagram by
datagram.
"""

from __future__ import annotations

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.core import RoundSender, SendState, VirtualRound
from dblp.sim import SimConfig, simulate
from dblp.sim.engines.incast import AUTO_MIN_WORKERS, compare_first_iteration, incast_group
from dblp.sim.model import Simulation
from dblp.protocol.wire import ChunkLayout, ParameterError

from pin_configs import fingerprint


CASES = {
    "w8": dict(workers=8),
    "w24_tolerance5pct": dict(workers=24, policy="baseline", p=0.05),  # early STOPs in the last pass
    "w40_5G_30pkt": dict(workers=40, server_bandwidth_bps=5e9, queue_bytes=30 * 1514),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flow_level_incast_holds_to_the_walk(name: str) -> None:
    kw = dict(model=1_000_000, rounds=1, **CASES[name])
    walk = simulate(SimConfig(incast="walk", **kw))
    flow = simulate(SimConfig(incast="flow", **kw))
    d = compare_first_iteration(walk, flow)
    passes = float(np.mean([r.up_passes for r in walk.records if r.role == "worker"]))
    assert abs(d["end"]) < 0.005 and abs(d["round"]) < 0.005
    assert abs(d["up"]) < 0.02
    assert abs(d["passes"]) * passes <= max(0.03 * passes, 1.0)
    assert abs(d["sent"]) < 0.02
    assert d["received_frac"] == 0.0
    assert min(r.up_passes for r in walk.records if r.role == "worker") > 4  # an incast: several passes each
    assert flow.datagrams == pytest.approx(walk.datagrams, rel=0.02)
    assert {r.extra.get("incast") for r in flow.records} == {"flow"}  # (one iteration: every record says so)
    assert {r.extra.get("incast") for r in walk.records} == {None}


def test_auto_keeps_the_walk_below_its_threshold_and_where_it_does_not_apply() -> None:
    """Small runs keep their records bit for bit; paced or lossy runs never take the model."""
    kw = dict(model=200_000, workers=6, rounds=3)
    assert fingerprint(simulate(SimConfig(incast="auto", **kw))) == fingerprint(simulate(SimConfig(incast="walk",
                                                                                                    **kw)))
    assert incast_group(Simulation(SimConfig(incast="flow", **kw)).engine) is not None
    big = dict(model=200_000, rounds=1)
    assert incast_group(Simulation(SimConfig(workers=AUTO_MIN_WORKERS, **big)).engine) is not None  # auto
    assert incast_group(Simulation(SimConfig(workers=AUTO_MIN_WORKERS - 1, **big)).engine) is None
    for other in (dict(send_rate_bps=1e9), dict(loss=[{"kind": "bernoulli", "p": 0.01}]),
                  dict(compute_jitter_s=1e-4), dict(topology="leafspine"), dict(servers=2),
                  dict(server_bandwidth_bps=100e9)):  # the last: no incast (the port is never overloaded)
        assert incast_group(Simulation(SimConfig(incast="flow", **kw, **other)).engine) is None, other


def test_incast_mode_is_checked() -> None:
    with pytest.raises(ParameterError, match="incast must be one of"):
        SimConfig(incast="fluid")


def _sender(chunks: int = 100) -> RoundSender:
    lay = ChunkLayout(chunks * 362, 1500)
    return RoundSender(VirtualRound(lay, 0), direction=ctl.UP, now=0.0, order="inorder", max_batch=16)


def test_count_level_core_calls_are_the_batch_calls() -> None:
    """count_to_send / handle_count_reply leave a sender exactly as datagrams_to_send / a BITMAP
    of the same chunks do: passes, sent, backoff (R8) and the next pass's chunks (R3)."""
    a, b = _sender(), _sender()
    received = [30, 30, 30, 75, 100]  # progress, none (backoff), none (doubled), progress, all (probe again)
    t = 0.0
    waits = []
    for got in received:
        t_go = max(t, a.get_timer() or t)
        while a.datagrams_to_send(t_go, limit=7) is not None:
            pass
        n = b.pass_remaining
        assert b.count_to_send(t_go, 5) == min(5, n)
        assert b.count_to_send(t_go, 10**6) == n - min(5, n)
        assert a.control_to_send() == b.control_to_send()  # the PROBE
        t = t_go + 0.01
        mask = np.zeros(100, bool)
        mask[:got] = True
        a.handle_control(ctl.Bitmap(0, ctl.UP, got, np.packbits(mask).tobytes()), t)
        b.handle_count_reply(got, t)
        assert (a.state, a.stats.passes, a.stats.sent, a.stats.received, a.get_timer()) == \
               (b.state, b.stats.passes, b.stats.sent, b.stats.received, b.get_timer())
        assert np.array_equal(a.pass_chunks, b.pass_chunks)
        waits.append(round((b.get_timer() or t) - t, 9))
        assert a.control_to_send() == b.control_to_send()
    # passes 2 and 3 delivered nothing: each next pass waited R8's backoff (1 ms, then 2 ms)
    assert waits == [0.0, 0.001, 0.002, 0.0, 0.0]
    assert a.stats.passes == 5 and a.stats.sent == 100 + 70 + 70 + 70 + 25
    assert a.state is SendState.AWAIT_REPLY and a.pass_remaining == 0
