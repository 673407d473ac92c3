"""The round level's shortcuts for many workers give the reference's records.

The reference is ``dblp.sim.engines.fast.EAGER_PORT``: every port re-evaluates every
pass at every change and every host materialises every sender's layout at
every re-layout (the engine as it was before its cost was made linear).
The shortcuts under test:

* a host whose head sender stops early re-lays out the others by dropping
  it from a shared description (:meth:`dblp.sim.engines.hostsched.HostSched._drop_head`,
  O(1) Python per early STOP instead of O(senders));
* multi-port paths (leaf-spine, two sites) re-evaluated lazily per port.
"""

from __future__ import annotations

import pytest

import dblp.sim.engines.fast as fast
import dblp.sim.engines.roundkit as roundkit
from dblp.sim import SimConfig, simulate
from dblp.sim.engines.hostsched import HostSched

from pin_configs import fingerprint
from test_engine_pins import _assert_same


def _count_drop_head(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    taken = [0]
    orig = HostSched._drop_head

    def counted(self, f, t):
        ok = orig(self, f, t)
        taken[0] += ok
        return ok

    monkeypatch.setattr(HostSched, "_drop_head", counted)
    return taken


@pytest.mark.parametrize("workers,host_slice,policy", [(12, 1024, "fixed"), (20, 512, "dblp"), (9, 400, "fixed")])
def test_early_stops_of_a_broadcast_equal_the_reference(monkeypatch, workers, host_slice, policy):
    """Early STOPs of N broadcast senders on one host (p = 0.3, the server link provisioned
    so each sender is alone at its port): same passes, counts and latencies as re-laying
    out every sender at every STOP, and the shortcut is actually taken."""
    cfg = SimConfig(model=120_000, workers=workers, rounds=6, policy=policy, p=0.3, freq=2, host_slice=host_slice,
                    server_bandwidth_bps=workers * 10e9,
                    loss=[{"kind": "bernoulli", "p": 0.01}, {"kind": "iteration_bursts", "at": [2], "loss": 0.5}])
    taken = _count_drop_head(monkeypatch)
    fast_run = fingerprint(simulate(cfg))
    assert taken[0] >= workers  # at least one round's early STOPs went the O(1) way
    monkeypatch.setattr(fast, "EAGER_PORT", True)
    taken[0] = 0
    ref = fingerprint(simulate(cfg))
    assert taken[0] == 0
    _assert_same(fast_run, ref, f"w{workers}")


@pytest.mark.parametrize("kw", [
    dict(topology="leafspine", racks=3, oversubscription=2.0, queue_bytes=40 * 1514),
    dict(topology="twosites", local_workers=2, wan_bandwidth_bps=5e9, wan_delay_s=1e-3, wan_queue_bytes=60 * 1514,
         wan_loss=0.01),
])
def test_multi_port_paths_lazy_equal_eager(monkeypatch, kw):
    """Passes crossing several ports (incast at the server's rack, a WAN queue): re-checking
    a pass when its crossing falls due gives the same run as re-evaluating all at every change."""
    cfg = SimConfig(model=80_000, workers=6, rounds=4, freq=2, **kw,
                    loss=[{"kind": "iteration_bursts", "at": [1], "loss": 0.5}])
    lazy = fingerprint(simulate(cfg))
    monkeypatch.setattr(fast, "EAGER_PORT", True)
    _assert_same(lazy, fingerprint(simulate(cfg)), kw["topology"])


def test_pass_draws_are_default_rng_streams():
    """The port's per-pass draws come from the stream ``np.random.default_rng`` names by the same
    entropy (built more cheaply, not differently): the results pinned before stay reproducible."""
    import numpy as np

    for entropy in ([0, 0x9047, 0, 3, 7, 1], [2**40 + 5, 0x9047, 1, 1023, 299, 12, 2]):
        assert np.array_equal(roundkit._rng(entropy).random(1000), np.random.default_rng(entropy).random(1000))


def test_shared_scratch_arrays_are_read_only():
    """The engine hands every flow views of one shared 0..r-1 / 1..r / zeros array; none may write them."""
    import numpy as np

    eng = fast.RoundEngine.__new__(fast.RoundEngine)
    eng._iota, eng._ones, eng._zeros, eng._fiota = roundkit._EMPTY_I, roundkit._EMPTY_F, roundkit._EMPTY_F, roundkit._EMPTY_F
    for get, first in ((eng.iota, 0.0), (eng.ones, 1.0), (eng.zeros, 0.0), (eng.fiota, 0.0)):
        a = get(5)
        assert a.size == 5 and a[0] == first and not a.flags.writeable
        assert get(3).base is a.base  # grown once, then shared
        with pytest.raises(ValueError):
            a[0] = 9
    assert np.array_equal(eng.iota(4), np.arange(4)) and np.array_equal(eng.ones(3), [1.0, 2.0, 3.0])
    assert eng.fiota(3).dtype == np.float64 and np.array_equal(eng.fiota(3), [0.0, 1.0, 2.0])


@pytest.mark.parametrize("workers,want,kw", [
    (24, (3, 69), {}),  # at their fair share: a round's 23 early ends at one instant, one re-layout
    (10, None, dict(compute_s=1e-3, compute_jitter_s=3e-4, loss=[{"kind": "bernoulli", "p": 0.01},
                                                          {"kind": "iteration_bursts", "at": [1], "loss": 0.5}])),
])
def test_paced_early_ends_of_one_instant_relay_out_once(monkeypatch, workers, want, kw):
    """A paced host's early ends at one instant are one re-layout (``HostSched._defer``), with the
    records of re-laying out every sender at every end (``EAGER_PORT``, the reference)."""
    cfg = SimConfig(model=150_000, workers=workers, rounds=3, send_rate_bps=10e9 / workers, **kw)
    calls = [0]
    orig = HostSched.relayout

    def counted(self, t):
        calls[0] += len(self.active) > 1  # the server's host (a worker's has one sender)
        return orig(self, t)

    monkeypatch.setattr(HostSched, "relayout", counted)
    fast_run = fingerprint(simulate(cfg))
    coalesced = calls[0]
    monkeypatch.setattr(fast, "EAGER_PORT", True)
    calls[0] = 0
    ref = fingerprint(simulate(cfg))
    _assert_same(fast_run, ref, f"w{workers}")
    if want is not None:
        assert (coalesced, calls[0]) == want
    else:  # ends spread by compute jitter and losses: fewer coincide (103 of 132 on this seed)
        assert 0 < coalesced < calls[0]


def test_less_load_checks_a_pass_at_its_earliest_crossing(monkeypatch):
    """Early STOPs at a congested port (uploads paced at their fair share, 40% tolerance after the
    critical phase): the others are re-evaluated at the earliest time their crossing could come
    (``RoundFlow.less_load``), not at every STOP - the records of re-evaluating all at once
    (``EAGER_PORT``), with fewer evaluations."""
    cfg = SimConfig(model=150_000, workers=24, rounds=12, freq=2, send_rate_bps=10e9 / 24,
                    loss=[{"kind": "bernoulli", "p": 0.005}])
    calls = [0]
    orig = fast.RoundFlow.port_refresh

    def counted(self, t):
        calls[0] += 1
        return orig(self, t)

    monkeypatch.setattr(fast.RoundFlow, "port_refresh", counted)
    lazy = fingerprint(simulate(cfg))
    lazy_calls = calls[0]
    monkeypatch.setattr(fast.RoundFlow, "less_load", lambda self, t: self.port_refresh(t))  # the rule before
    calls[0] = 0
    _assert_same(lazy, fingerprint(simulate(cfg)), "paced, at once")
    # 3,802 with the bound that counted every slot after the last delivered one as arriving; 2,814 since
    # it takes the final verdicts of the slots that reached the port before the last evaluation
    assert (lazy_calls, calls[0]) == (2814, 6928)
    monkeypatch.setattr(fast, "EAGER_PORT", True)
    _assert_same(lazy, fingerprint(simulate(cfg)), "paced, eager")


def test_an_early_stop_asks_the_passes_the_whole_walk_asks(monkeypatch):
    """An early STOP at a congested port asks only the watched passes the port's heap names
    (``FluidQueue.recheck`` / ``fallen_due``: those whose ``_quiet`` came): exactly the passes the walk
    over every watched pass asked, in the same order - the same records, the same ``less_load``
    calls - while the heap names a fraction of what the watch holds."""
    from dblp.sim.network.net import FluidQueue

    cfg = SimConfig(model=150_000, workers=24, rounds=12, freq=2, send_rate_bps=10e9 / 24,
                    loss=[{"kind": "bernoulli", "p": 0.005}])
    asked, named = [0], [0]
    less_load, fallen_due = fast.RoundFlow.less_load, FluidQueue.fallen_due

    def counted(self, t):
        asked[0] += 1
        return less_load(self, t)

    def naming(self, t):
        got = fallen_due(self, t)
        named[0] += len(got)
        return got

    monkeypatch.setattr(fast.RoundFlow, "less_load", counted)
    monkeypatch.setattr(FluidQueue, "fallen_due", naming)
    heap = fingerprint(simulate(cfg))
    heap_counts = (asked[0], named[0])
    asked[0] = named[0] = 0

    def every(self, t):  # the walk before the heap: every watched pass, in the watch's order
        got = list(self.watch)
        named[0] += len(got)
        return got

    monkeypatch.setattr(FluidQueue, "fallen_due", every)
    _assert_same(heap, fingerprint(simulate(cfg)), "every watched pass")
    assert heap_counts[0] == asked[0]
    # 854 passes asked; the heap named 1,070 (some of them stale or not yet due), the walk 2,286
    # (at 1024 workers x 20: 53,202 named against 4.6M walked)
    assert (heap_counts, named[0]) == ((854, 1070), 2286)
