"""The round level's cheaper SimPy plumbing gives bit-identical records.

:mod:`dblp.sim.engines.fast` drives each transfer's sender as a state machine whose
entries sit in SimPy's queue where the SimPy process it replaced put its
events (Initialize, ``wait_ev.succeed()``, a timed wait's Timeout and
Condition), and schedules its callbacks without a Timeout and a closure each.
The reference below is that process and ``Simulation.at``, as they were (a pass's
start and end are the flow's own steps, ``RoundFlow.begin_pass`` and
``end_if_out``: only the scheduling differs): every
record (every field, floats compared exactly), the end time and the datagram
count must be the same - on ties (identical workers), an overflowing incast
with backoff, early STOPs of a broadcast, pacing, jittered compute and a
multi-port path.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest

import dblp.protocol.control as ctl
import dblp.sim.engines.fast as fast
import dblp.sim.engines.roundflow as roundflow
import dblp.sim.engines.roundkit as roundkit
from dblp.sim import SimConfig, simulate

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


class _Pass:
    """A pass's owner as a FluidQueue sees it (dblp.sim.network.net.PortReader), for the port's own tests."""

    fresh_t = -float("inf")

    def port_settle(self, t: float) -> None:
        pass


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
                t_end = self.end_if_out()
                if t_end is not None:
                    self.wait_ev = env.event()
                    yield env.timeout(t_end - env.now) | self.wait_ev
            elif s.ready(env.now):
                self.begin_pass()
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
        assert gc.get_threshold() == (roundkit._GC_GEN0, 11, 12)
        gc.set_threshold(5 * roundkit._GC_GEN0, 11, 12)
        fast.quiet_gc()
        assert gc.get_threshold() == (5 * roundkit._GC_GEN0, 11, 12)
        gc.set_threshold(0, 11, 12)  # collection off stays off
        fast.quiet_gc()
        assert gc.get_threshold() == (0, 11, 12)
    finally:
        gc.set_threshold(*old)


# -- the exact shortcuts of the 64-worker speed-up: each gives what it replaces ---------------------


def test_segments_are_the_binary_search_of_each_slot() -> None:
    """``net._segments`` (breakpoints placed in the slots, counted up) equals a binary search per
    slot, floored at 0 after the shift - ties, slots before the first breakpoint, long and short."""
    import numpy as np

    from dblp.sim.network.net import _segments

    rng = np.random.default_rng(5)
    bt = np.unique(np.round(rng.random(300), 3))
    for n, lo in ((2000, 0.0), (2000, 0.5), (600, 0.2), (300, 0.1), (1500, -0.5)):
        arr = np.sort(np.concatenate((np.round(rng.random(n - 10) * 0.6 + lo, 3), bt[100:110])))
        want = np.maximum(bt.searchsorted(arr, side="right") - 1, 0)
        got = _segments(bt, arr, -1)
        if n <= 512 or lo < bt[0]:
            assert got is None  # the caller's binary search then
        else:
            assert got.tolist() == want.tolist()


def test_unique_and_queue_at_one_time_are_numpys() -> None:
    import numpy as np

    from dblp.sim.network.net import FluidQueue, Port, _unique

    a = np.array([3.0, 1.0, 2.0, 1.0, 3.0, 0.5, 2.0])
    assert _unique(a.copy()).tolist() == np.unique(a).tolist() == [0.5, 1.0, 2.0, 3.0]

    q = FluidQueue(Port("srv", 10e9, 100 * 1514), 1514)
    owners = [_Pass() for _ in range(5)]
    for k, o in enumerate(owners):  # five passes at 2.4 Gbit/s each: the buffer fills and overflows
        q.set(o, k * 1e-4, (k * 1e-4, 5e-3 + k * 1e-4, 2e5))
    ts = np.linspace(0.0, 8e-3, 401)
    assert max(q.queue_at(ts)) == q.qcap
    assert [q._queue_at1(float(t)) for t in ts] == q.queue_at(ts).tolist()


def test_pass_draws_are_default_rngs_stream() -> None:
    import numpy as np

    for entropy in ([0, 0x9047, 0, 3, 0, 1], [7, 0x9047, 1, 63, 99, 12, 2], [2**40, 0x9047, 1, 2, 3, 4]):
        assert roundkit._rng(entropy).random(50).tolist() == np.random.default_rng(entropy).random(50).tolist()


def test_count_le_is_a_capped_binary_search() -> None:
    import numpy as np

    a = np.array([1.0, 2.0, 2.0, 3.0, 5.0, 8.0])
    for x in (0.0, 1.0, 1.5, 2.0, 4.0, 5.0, 8.0, 9.0):
        for limit in range(0, 7):
            assert roundkit._count_le(a, x, limit) == min(int(a.searchsorted(x, side="right")), limit)


def test_round_robin_patterns_are_the_direct_layout() -> None:
    """A cached slot pattern, scaled, gives the times the round-robin formula gives directly."""
    import numpy as np

    from dblp.sim.engines import hostsched

    fi = np.arange(5000, dtype=np.float64)
    for r, k, q, i in ((2763, 64, 1024, 5), (1024, 3, 1024, 2), (700, 8, 256, 7), (3, 2, 1024, 0)):
        full, rest = divmod(r, q)
        want = np.empty(r)
        if full:
            np.add.outer(fi[:full] * float(k * q), fi[:q] + float(i * q + 1), out=want[: full * q].reshape(full, q))
        if rest:
            np.add(fi[:rest], float(full * k * q + i * rest + 1), out=want[full * q :])
        want *= 7.5e-6
        want += 0.123
        got = hostsched._pattern(lambda m: fi[:m], r, k, q, i) * 7.5e-6
        got += 0.123
        assert got.tolist() == want.tolist()


def test_receive_chunks_fast_path_keeps_the_cores_state() -> None:
    """``Receiver.receive_chunks``' shortcut for new, increasing, in-range chunks leaves the receiver
    as the full R4/R5 path does - also for what it hands back to that path (repeats, out of range,
    another round, after STOP)."""
    import numpy as np

    from dblp.protocol.core import Receiver
    from dblp.protocol.wire import ChunkLayout

    lay = ChunkLayout(40_000)
    feeds = [(0, [0]), (0, list(range(1, 50))), (0, [60, 61, 61, 62]), (0, [70, 5, 71]), (1, [80, 81]),
             (0, [lay.chunks - 1]), (0, [lay.chunks + 3, 90]), (0, list(range(90, 100))), (0, []),
             (0, list(range(100, lay.chunks - 1))), (0, [3, 4])]

    def run(shortcut: bool) -> tuple:
        r = Receiver(lay, run_id=1, expected_sender=0, direction=0)
        if not shortcut:
            r._accept_new = lambda seqs, now: -1
        r.begin_round(0, None, 0.0, tolerance=0.35)  # need: 73 of 111 chunks
        got = [r.receive_chunks(rnd, np.array(s, np.int64), 0.001 * (k + 1)) for k, (rnd, s) in enumerate(feeds)]
        return (got, r.received, r.mask.tolist(), r.complete, repr(r.stats), repr(r.total_drops),
                [repr(m) for m in r.control_to_send()])

    fast_run, full_run = run(True), run(False)
    assert fast_run == full_run
    assert fast_run[0] == [1, 49, 3, 2, 0, 1, 1, 9, 0, 10, 0] and fast_run[1] == 76 and fast_run[3]
    assert "stale=4, duplicate=3" in fast_run[5] and "out_of_range=1" in fast_run[5]


def test_engine_queue_entries_run_in_simpys_order() -> None:
    """``run_env`` calls the round level's ``(fn, args)`` queue entries where they sit among SimPy's
    own events (time, priority, insertion), with the arguments ``call``/``at``/``at_msg`` gave."""
    import simpy

    from dblp.sim.network import simpy_adapter
    from dblp.sim.model import run_env

    env = simpy.Environment()
    eng = fast.RoundEngine.__new__(fast.RoundEngine)
    eng.env = env
    eng._q, eng._ids = simpy_adapter.queue(env), simpy_adapter.event_ids(env)  # as RoundEngine.__init__
    got: list = []
    env.timeout(0.5).callbacks.append(lambda e: got.append(("timeout", env.now)))
    eng.at(0.5, lambda t: got.append(("at", t)))
    eng.at(0.2, lambda t, a: got.append(("at2", t, a)), "x")
    eng.at_msg(0.5, lambda m, t: got.append(("msg", m, t)), "m")
    eng.call(0.2, lambda a: got.append(("call", a, env.now)), 7)
    eng.call(0.2, lambda a: got.append(("urgent", a, env.now)), 8, fast.URGENT)
    env.timeout(0.2).callbacks.append(lambda e: eng.at(0.1, lambda t: got.append(("past", t, env.now))))
    run_env(env)
    assert got == [("urgent", 8, 0.2), ("at2", 0.2, "x"), ("call", 7, 0.2), ("past", 0.1, 0.2),
                   ("timeout", 0.5), ("at", 0.5), ("msg", "m", 0.5)]


def test_kept_layout_products_are_the_direct_layout() -> None:
    """``HostSched._leave``'s kept products (the scaled round-robin pattern, a lone sender's
    1h..rh) shifted by ``t`` are the times computed afresh, to the bit."""
    import numpy as np

    from dblp.sim.engines import hostsched

    class _Eng:
        def fiota(self, m):
            return np.arange(m, dtype=np.float64)

        def ones(self, m):
            return np.arange(1, m + 1, dtype=np.float64)

    hs = hostsched.HostSched.__new__(hostsched.HostSched)
    hs.engine, hs.h, hs.q, hs.pace, hs._hsteps = _Eng(), 1.0 / 200_000.0, 1024, 0.0, np.empty(0)
    for t in (0.0, 0.123456789, 3.3):
        for r in (1, 700, 2763, 5000, 10):
            want = np.arange(1, r + 1, dtype=np.float64) * hs.h
            want += t
            assert hs._leave((t, np.array([r]), True), 0, None, 0).tolist() == want.tolist()
        for r, k, i in ((2763, 64, 5), (1024, 3, 2), (700, 8, 7), (3, 2, 0)):
            want = hostsched._pattern(_Eng().fiota, r, k, hs.q, i) * hs.h
            want += t
            for _ in range(2):  # made, then kept
                got = hs._leave((t, np.full(k, r), True), i, None, 0)
                assert got.tolist() == want.tolist() and got.flags.writeable


def test_drops_bring_reported_up_to_date_as_add_did() -> None:
    """``session._drops`` leaves ``reported`` and returns what ``reported.add(DropCounters(**delta))`` did."""
    from dblp.protocol.core import DropCounters
    from dblp.protocol.session import RecordContext, _drops

    class _Rx:
        total_drops = DropCounters(stale=9, duplicate=4, corrupt=1, foreign=2, malformed=0, out_of_range=3,
                                   wrong_length=5, unauthenticated=6)

    for scale in (1.0, 2.5):
        rec = RecordContext(source="sim", policy="dblp", order="inorder", scale=scale)
        reported = DropCounters(stale=2, duplicate=4, out_of_range=1)
        ref = DropCounters(stale=2, duplicate=4, out_of_range=1)
        ref.add(DropCounters(**{k: v - getattr(ref, k) for k, v in vars(_Rx.total_drops).items()}))
        got = _drops(rec, _Rx(), reported)
        assert reported == ref == _Rx.total_drops
        assert got == {"stale": rec.count(7), "duplicate": 0, "corrupt": 1, "foreign": 2, "malformed": 0,
                       "out_of_range": 2, "wrong_length": 5, "unauthenticated": 6}
        assert _drops(rec, _Rx(), reported) == dict.fromkeys(got, 0)


@pytest.mark.parametrize("pre", [0, 2, 4])
def test_all_done_resumes_where_all_of_does(pre: int) -> None:
    """``model.all_done`` wakes its waiter at the same place among the other events as
    ``env.all_of`` (``pre`` of the events already processed when it is made; none at all)."""
    import simpy

    from dblp.sim.model import all_done, run_env

    def run(make) -> list:
        env = simpy.Environment()
        log: list = []
        evs = [env.event() for _ in range(4)]

        def fire(k: int, t: float):
            yield env.timeout(t)
            evs[k].succeed(k)
            log.append(("fired", k, env.now))

        def waiter(name: str, which: list):
            yield env.timeout(0.5 if pre else 0.0)
            yield make(env, which)
            log.append((name, env.now))

        def other():
            for t in (0.5, 1.0, 1.0, 2.0):
                yield env.timeout(t - env.now) if t > env.now else env.timeout(0)
                log.append(("other", env.now))

        for k in range(4):
            env.process(fire(k, 0.2 if k < pre else 1.0 + 0.5 * (k % 2)))
        env.process(other())
        env.process(waiter("all", evs))
        env.process(waiter("none", []))
        run_env(env)
        return log

    ref = run(lambda env, evs: env.all_of(evs))
    assert run(all_done) == ref
    assert ("all", 0.5 if pre == 4 else 1.5) in ref and ("none", 0.5 if pre else 0.0) in ref
    assert ref[-1] == ("other", 2.0)


def test_fluid_outcome_in_c_gives_numpy_verdicts(monkeypatch) -> None:
    """dblp/_fastpath_c/fluid.c's waits and drops are the numpy path's to the last bit: on a port
    whose buffer fills and overflows, for slots in order, a hair out of order, before the first
    breakpoint, and few or many; and None exactly where numpy gives None."""
    import numpy as np

    import dblp.sim.network.net as net
    from dblp.sim.network.net import FluidQueue, Port

    if net._c_fluid_outcome is None:
        pytest.skip("the C helper is not built here")

    rng = np.random.default_rng(5)
    q = FluidQueue(Port("srv", 10e9, 60 * 1514), 1514)
    for _ in range(7):  # seven passes of 2.4-4.8 Gbit/s into 10: the queue builds, fills, drains
        lo = float(rng.uniform(0, 4e-3))
        q.set(_Pass(), 0.0, (lo, lo + float(rng.uniform(1e-3, 4e-3)), float(rng.uniform(2e5, 4e5))))
    assert q.congested
    cases = {
        "ordered": np.sort(rng.uniform(-1e-3, 9e-3, 3000)),
        "few": np.sort(rng.uniform(2e-3, 3e-3, 7)),
        "hair": np.sort(rng.uniform(0, 8e-3, 800)) + rng.choice([0.0, 1e-15, -1e-15], 800),
        "before": np.linspace(-2e-3, -1e-3, 20),
    }
    seen_drop = seen_wait = False
    for name, arr in cases.items():
        u = rng.random(arr.size)
        got = q.outcome(arr, u, name != "hair")
        monkeypatch.setattr(net, "_c_fluid_outcome", None)
        want = q.outcome(arr, u, name != "hair")
        monkeypatch.undo()
        for g, w in zip(got, want):
            assert (g is None) == (w is None), name
            if w is not None:
                assert g.dtype == w.dtype and np.array_equal(g, w), name
        seen_wait |= want[0] is not None
        seen_drop |= want[1] is not None
    assert seen_wait and seen_drop  # both verdicts were exercised


@pytest.mark.parametrize("c_helper", [True, False])
def test_outcome_into_writes_the_verdicts_of_outcome(monkeypatch, c_helper: bool) -> None:
    """FluidQueue.outcome_into (port_refresh writes a pass's verdicts into its own arrays) gives
    outcome's waits and drops to the last bit, zeros where outcome gives None, and flags saying
    which it found - with the C helper and without; stale values in the arrays are overwritten."""
    import numpy as np

    import dblp.sim.network.net as net
    from dblp.sim.network.net import FluidQueue, Port

    if c_helper and net._c_fluid_outcome is None:
        pytest.skip("the C helper is not built here")
    if not c_helper:
        monkeypatch.setattr(net, "_c_fluid_outcome", None)
    rng = np.random.default_rng(5)
    q = FluidQueue(Port("srv", 10e9, 60 * 1514), 1514)
    for _ in range(7):  # the port of the test above: the queue builds, fills, drains
        lo = float(rng.uniform(0, 4e-3))
        q.set(_Pass(), 0.0, (lo, lo + float(rng.uniform(1e-3, 4e-3)), float(rng.uniform(2e5, 4e5))))
    flags = []
    for arr in (np.sort(rng.uniform(-1e-3, 9e-3, 3000)), np.sort(rng.uniform(2e-3, 3e-3, 7)),
                np.linspace(20.0, 21.0, 5)):  # the last: after the queue is calm (no wait, no drop)
        u = rng.random(arr.size)
        want_w, want_o = q.outcome(arr, u, True)
        wait, ovf = np.full(arr.size, 7.0), np.ones(arr.size, bool)
        got = q.outcome_into(arr, u, wait, ovf)
        assert got == (want_w is not None) | ((want_o is not None) << 1)
        assert np.array_equal(wait, np.zeros(arr.size) if want_w is None else want_w)
        assert np.array_equal(ovf, np.zeros(arr.size, bool) if want_o is None else want_o)
        flags.append(got)
    assert flags == [3, 1, 0]  # waits and drops, waits alone, neither


def test_paced_leave_in_place_gives_the_formula_s_doubles() -> None:
    """HostSched._paced_leave (in place on the engine's shared 1..r) is max(t + h k (j + 1),
    b_t0 + max(0, (start + j + 1) bytes - tokens) / rate) to the last bit, the formula it
    replaced, for several senders, starts and bucket states."""
    import numpy as np

    from dblp.sim.config import SimConfig
    from dblp.sim.engines.fast import RoundFlow
    from dblp.sim.model import Simulation

    sim = Simulation(SimConfig(model=300_000, workers=8, rounds=1, send_rate_bps=10e9 / 8))
    eng = sim.engine
    sched = eng.sched(sim.up_paths[0].host)
    assert sched.pace > 0  # the bucket binds: the paced layout
    f = RoundFlow.__new__(RoundFlow)
    f.engine = eng
    rng = np.random.default_rng(3)
    for k, start, r in ((1, 0, 200), (8, 0, 200), (3, 57, 1000), (1024, 9, 33)):
        f.b_t0, f.b_tokens0 = float(rng.uniform(0, 1)), float(rng.uniform(0, eng.burst_bytes))
        t = f.b_t0 + float(rng.uniform(0, 1e-3))
        j = np.arange(r, dtype=np.int64)
        slots = start + j
        bucket = f.b_t0 + np.maximum(0.0, (slots + 1).astype(np.float64) * eng.dgram_bytes - f.b_tokens0) / eng.rate_Bps
        want = np.maximum(t + (sched.h * k) * (j + 1).astype(np.float64), bucket)
        got = sched._paced_leave(t, k, f, start, r)
        assert got.flags.writeable and np.array_equal(got, want), (k, start, r)
        assert (got > t).all()


@pytest.mark.parametrize("passes", [3, 60, 200])  # 200: over 256 segments, the walk's long form
def test_fluid_profile_in_c_is_numpys(monkeypatch, passes: int) -> None:
    """dblp/_fastpath_c/fluid.c's profile of a port (breakpoints, offered rate, queue, congested) is
    FluidQueue._rebuild's numpy one to the last bit, through changes that fill, overflow and drain
    the buffer, with passes ending before the rebuild's instant and several ending at once."""
    import numpy as np

    import dblp.sim.network.net as net
    from dblp.sim.network.net import FluidQueue, Port

    if net._c_fluid_profile is None:
        pytest.skip("the C helper is not built here")

    def run(c: bool) -> list:
        if not c:
            monkeypatch.setattr(net, "_c_fluid_profile", None)
        rng = np.random.default_rng(passes)
        q = FluidQueue(Port("srv", 10e9, 80 * 1514), 1514)
        owners = [_Pass() for _ in range(passes)]
        got = []
        for step in range(3 * passes):
            t = step * 2e-5
            o = owners[int(rng.integers(passes))]
            lo = t + float(rng.uniform(0, 2e-3))
            hi = round(lo + float(rng.uniform(1e-4, 3e-3)), 4)  # rounded: several passes end at one instant
            q.set(o, t, None if rng.random() < 0.2 else (lo, hi, float(rng.uniform(2.5e5, 6e5))))
            got.append((q._bt.tolist(), q._ba.tolist(), q._bq.tolist(), q.congested))
        monkeypatch.undo()
        return got

    c, ref = run(True), run(False)
    assert c == ref
    assert any(g[3] for g in ref) and any(max(g[2]) > 0 for g in ref)
    if passes == 200:
        assert max(len(g[0]) for g in ref) > net._WALK_SHORT + 1



def test_fluid_profile_breakpoints_are_numpys_sorted_set() -> None:
    """fluid.c sorts the breakpoints with an inline introsort (not qsort): through sorted, reversed,
    all-equal, few-valued, organ-pipe and random inputs of many sizes - quicksort's levels
    and the insertion sort below 16 - they come out as ``np.unique`` of t0 and every lo, hi after it."""
    import numpy as np

    import dblp.sim.network.net as net

    if net._c_fluid_profile is None:
        pytest.skip("the C helper is not built here")
    rng = np.random.default_rng(7)
    checked = 0
    for e in (1, 2, 7, 8, 9, 17, 40, 333, 1500):
        for kind in ("random", "sorted", "reversed", "equal", "few", "organ"):
            lo = {"random": rng.uniform(0, 1, e), "sorted": np.linspace(0, 1, e), "reversed": np.linspace(1, 0, e),
                  "equal": np.full(e, 0.5), "few": rng.integers(0, 5, e) / 4.0,
                  "organ": np.concatenate((np.linspace(0, 1, e - e // 2), np.linspace(1, 0, e // 2)))}[kind]
            hi = lo + rng.choice([0.25, 0.5], e)
            ent = np.column_stack((lo, hi, np.full(e, 1e5))).ravel()
            t0 = 0.1 if kind != "equal" else 0.0
            bt, ba, bq = (np.empty(2 * e + 1) for _ in range(3))
            m, _ = net._c_fluid_profile(ent, t0, 0.0, 8e5, 50.0, bt, ba, bq)
            want = np.unique(np.concatenate(([t0], lo[lo > t0], hi[hi > t0])))
            assert bt[:m].tolist() == want.tolist(), (e, kind)
            checked += 1
    assert checked == 54


def test_uniforms_are_the_seed_sequences_stream() -> None:
    """``roundkit._uniforms`` (the PCG64 state from fluid.c's pcg64_seed, set on one kept generator) gives
    ``np.random.default_rng(entropy).random(n)`` to the last bit: entropy of 1 to 9 words (the pool
    of four, and words beyond it), large words, zeros, one stream after another; and words of 2**32
    or more take numpy's own path."""
    import numpy as np

    if roundkit._c_pcg64_seed is None:
        pytest.skip("the C helper is not built here")
    rng = np.random.default_rng(3)
    for k in range(60):
        words = [int(w) for w in rng.integers(0, 2**32, 1 + k % 9, dtype=np.uint64)]
        if k % 4 == 0:
            words = [w % 7 for w in words]
        n = 1 + k * 37
        assert roundkit._uniforms(words, n).tolist() == np.random.default_rng(words).random(n).tolist(), words
    big = [2**40, 5, 9]
    assert roundkit._uniforms(big, 50).tolist() == np.random.default_rng(big).random(50).tolist()


def test_a_ports_kept_past_survives_its_buffer() -> None:
    """FluidQueue keeps its profile in one buffer, rewritten from each change's instant on, its past
    trimmed, compacted and grown in place: through thousands of changes the past it keeps is always
    a suffix of the profile before the change, up to the change's instant, and the profile it
    rebuilds starts at that instant (or, on a calm port, nothing changes)."""
    import numpy as np

    from dblp.sim.network.net import FluidQueue, Port

    rng = np.random.default_rng(7)
    q = FluidQueue(Port("srv", 10e9, 80 * 1514), 1514)
    owners = [_Pass() for _ in range(40)]
    trims = grows = compactions = 0
    for step in range(4000):
        t = step * 2e-5
        o = owners[int(rng.integers(len(owners)))]
        o.fresh_t = t  # its verdicts are final up to now: the past before the oldest such time may go
        old = (q._bt.copy(), q._ba.copy(), q._bq.copy())
        buf, lo0 = q._buf, q._lo
        start = t + float(rng.uniform(0, 2e-3))
        span = (start, start + float(rng.uniform(1e-4, 3e-3)), float(rng.uniform(2.5e5, 6e5)))
        q.set(o, t, None if rng.random() < 0.2 else span)
        new = (q._bt, q._ba, q._bq)
        k = int(old[0].searchsorted(t, side="left"))
        kk = int(new[0].searchsorted(t, side="left"))
        if kk < new[0].size and new[0][kk] == t:  # rebuilt from t: the past kept, then the new profile
            assert kk <= k
            for a, b in zip(old, new):
                assert np.array_equal(b[:kk], a[k - kk : k])
            trims += kk < k
        else:  # calm before and after: the profile is what it was
            for a, b in zip(old, new):
                assert np.array_equal(a, b)
        grows += q._buf is not buf
        compactions += q._buf is buf and q._lo < lo0
    assert trims and grows and compactions, (trims, grows, compactions)


@pytest.mark.parametrize("name", ["incast", "early_stops", "leafspine"])
def test_round_level_records_are_the_same_without_the_c_helper(monkeypatch, name: str) -> None:
    """The C loops of a congested or lossy port (fluid_profile, fluid_outcome, fluid_arrivals) change
    no record: the whole run with them and with numpy alone, every field compared exactly."""
    import dblp.sim.network.net as net

    if net._c_fluid_outcome is None or roundkit._c_fluid_arrivals is None:
        pytest.skip("the C helper is not built here")
    cfg = SimConfig(**CONFIGS[name])
    with_c = simulate(cfg)
    for mod, attr in ((net, "_c_fluid_outcome"), (net, "_c_fluid_profile"), (roundflow, "_c_fluid_arrivals")):
        monkeypatch.setattr(mod, attr, None)
    without = simulate(cfg)
    assert [dataclasses.asdict(r) for r in with_c.records] == [dataclasses.asdict(r) for r in without.records]
    assert (with_c.end_time_s, with_c.datagrams) == (without.end_time_s, without.datagrams)


def test_fluid_loops_refuse_arrays_of_the_wrong_kind() -> None:
    """The C loops read raw memory: an array of another dtype or length is refused by name, not read."""
    import numpy as np

    import dblp.sim.network.net as net

    if net._c_fluid_outcome is None or roundkit._c_fluid_arrivals is None:
        pytest.skip("the C helper is not built here")
    from dblp._fastpath import fluid_arrivals, fluid_outcome, fluid_profile

    f, z = np.zeros, np.zeros(3)
    with pytest.raises(ValueError, match="fluid_outcome"):  # ba float32
        fluid_outcome(z, f(3, np.float32), z, 1.0, 1.0, 1.0, f(2), f(2), f(2), f(2, bool))
    with pytest.raises(ValueError, match="fluid_outcome"):  # ovf shorter than arr
        fluid_outcome(z, z, z, 1.0, 1.0, 1.0, f(2), f(2), f(2), f(1, bool))
    with pytest.raises(ValueError, match="fluid_profile"):  # no room for 2 * passes + 1 breakpoints
        fluid_profile(f(6), 0.0, 0.0, 1.0, 1.0, f(4), f(4), f(4))
    with pytest.raises(ValueError, match="fluid_arrivals"):  # lossdrop not bool
        fluid_arrivals(f(4), 0, 4, 0.0, f(4), None, None, 0.0, f(4, np.int64), f(4))
    with pytest.raises(ValueError, match="fluid_arrivals"):  # limit past the pass
        fluid_arrivals(f(4), 0, 5, 0.0, None, None, None, 0.0, f(5, np.int64), f(5))
