"""The round level's cheaper SimPy plumbing gives bit-identical records.

:mod:`dblp.sim.fast` drives each transfer's sender as a state machine whose
entries sit in SimPy's queue where the SimPy process it replaced put its
events (Initialize, ``wait_ev.succeed()``, a timed wait's Timeout and
Condition), and schedules its callbacks without a Timeout and a closure each.
The reference below is that process and ``Simulation.at``, as they were: every
record (every field, floats compared exactly), the end time and the datagram
count must be the same - on ties (identical workers), an overflowing incast
with backoff, early STOPs of a broadcast, pacing, jittered compute and a
multi-port path.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest

import dblp.control as ctl
import dblp.sim.fast as fast
from dblp.sim import SimConfig, simulate
from dblp.sim.flow import pass_remaining

_BURSTS = {"kind": "iteration_bursts", "at": [1, 3], "loss": 0.6}

CONFIGS = {
    # identical workers, server link provisioned: every upstream crossing ties with the others
    "ties": dict(model=200_000, workers=24, rounds=4, server_bandwidth_bps=24 * 10e9),
    # early STOPs of the broadcast (p = 0.3), host slices, loss
    "early_stops": dict(model=120_000, workers=12, rounds=5, policy="fixed", p=0.3, host_slice=256,
                        server_bandwidth_bps=12 * 10e9, loss=[{"kind": "bernoulli", "p": 0.01}, _BURSTS]),
    # an overflowing incast: many passes, backoff timers
    "incast": dict(model=80_000, workers=16, rounds=4, freq=2, queue_bytes=30 * 1514,
                   loss=[{"kind": "bernoulli", "p": 0.01}, _BURSTS]),
    "paced": dict(model=100_000, workers=5, rounds=4, send_rate_bps=2e9, loss=[_BURSTS]),
    "jitter": dict(model=100_000, workers=8, rounds=5, compute_s=1e-3, compute_jitter_s=4e-4, loss=[_BURSTS]),
    "leafspine": dict(model=80_000, workers=6, rounds=3, topology="leafspine", racks=3, oversubscription=2.0,
                      queue_bytes=40 * 1514, loss=[_BURSTS]),
}


class _ProcessFlow(fast.RoundFlow):
    """The sender as the SimPy process it was before the state machine (the reference)."""

    def _start(self) -> None:
        self.wait_ev = self.env.event()
        self.env.process(self._proc())

    def wake(self) -> None:
        if not self.wait_ev.triggered:
            self.wait_ev.succeed()

    def _proc(self):
        env, s = self.env, self.sender
        while not s.done:
            if self.in_pass:
                self.host.settle(self)
                if self.leave is None:
                    self.wait_ev = env.event()
                    yield self.wait_ev
                    continue
                t_end = float(self.leave[-1])
                if env.now >= t_end - 1e-12:
                    self.in_pass = False
                    self.b_end, self.b_used = t_end, self.n
                    self.host.remove(self, t_end)
                    self.take_until(self.n, t_end)
                    continue
                self.wait_ev = env.event()
                yield env.timeout(t_end - env.now) | self.wait_ev
            elif s.ready(env.now):
                self.n = pass_remaining(s)
                self.npass += 1
                self.limit = self.n
                self.leave, self.taken, self.in_pass = None, 0, True
                self.d_slot, self.d_t, self.dpos = fast._EMPTY_I, fast._EMPTY_F, 0
                self.host.join(self)
            else:
                t = s.get_timer()
                self.wait_ev = env.event()
                if t is None:
                    yield self.wait_ev
                else:
                    yield self.wait_ev | env.timeout(max(0.0, t - env.now))


def _reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the SimPy process, ``Simulation.at`` and the uncached frame sizes back."""

    def start_flow(self, sender, ep, path, rpath, direction, worker, rnd):
        return _ProcessFlow(self, self.sim, sender, ep, path, rpath, direction, worker, rnd)

    def at(self, t, fn, arg=fast._NOARG):
        self.sim.at(t, fn if arg is fast._NOARG else (lambda tt: fn(tt, arg)))

    def at_msg(self, t, fn, msg):
        self.sim.at(t, lambda tt: fn(msg, tt))

    monkeypatch.setattr(fast.RoundEngine, "start_flow", start_flow)
    monkeypatch.setattr(fast.RoundEngine, "at", at)
    monkeypatch.setattr(fast.RoundEngine, "at_msg", at_msg)
    monkeypatch.setattr(fast.RoundEngine, "ctrl_wire", lambda self, msg: self.sim.ctrl_wire(msg))


def _everything(res) -> str:
    """Every record field (floats by repr: exact), the end time and the datagram count."""
    return repr((res.end_time_s, res.datagrams, [dataclasses.asdict(r) for r in res.records]))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_state_machine_equals_the_simpy_process(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    cfg = SimConfig(**CONFIGS[name])
    new = simulate(cfg)
    with monkeypatch.context() as m:
        _reference(m)
        ref = simulate(cfg)
    assert len(new.records) == 2 * cfg.rounds * cfg.workers
    assert _everything(new) == _everything(ref)


def test_frame_sizes_are_those_of_the_simulation() -> None:
    """The remembered control-frame sizes are ``Simulation.ctrl_wire``'s, per type and bitmap length."""
    sim = fast.RoundEngine.__new__(fast.RoundEngine)

    class _Sim:
        @staticmethod
        def ctrl_wire(msg):
            return len(ctl.encode(msg)) + 66

    sim.sim, sim._wire = _Sim(), {}
    msgs = [ctl.Probe(3, 0, 2), ctl.Probe(70000, 1, 9), ctl.Stop(5, 1, 1234), ctl.Stop(2**31, 0, 7),
            ctl.RoundStart(4, 1, 0.25, True), ctl.Bitmap(1, 0, 3, b"\x01\x02"), ctl.Bitmap(9, 1, 8, b"\xff" * 40),
            ctl.Bitmap(2, 0, 0, b"\x00\x00"), ctl.Held(1, b"\x07" * 5), ctl.Common(2, b"\x01" * 5)]
    for _ in range(2):  # computed, then remembered
        assert [sim.ctrl_wire(m) for m in msgs] == [_Sim.ctrl_wire(m) for m in msgs]
    assert len(sim._wire) == 7  # Probe, Stop, RoundStart, Bitmap x2 lengths, Held, Common


def test_quiet_gc_only_raises_the_youngest_threshold() -> None:
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        fast.quiet_gc()
        assert gc.get_threshold() == (fast._GC_GEN0, 11, 12)
        gc.set_threshold(50_000, 11, 12)
        fast.quiet_gc()
        assert gc.get_threshold() == (50_000, 11, 12)
        gc.set_threshold(0, 11, 12)  # collection off stays off
        fast.quiet_gc()
        assert gc.get_threshold() == (0, 11, 12)
    finally:
        gc.set_threshold(*old)
