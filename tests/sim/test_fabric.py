"""The round at class level (dblp.sim.fabric, ``fidelity="class"``: one representative flow per port
class, for 10,000 workers on a leaf-spine) against the round level's walk of every flow (the
reference), on leaf-spines small enough to walk.

Tolerances, on the run's means over workers and iterations (1M floats; in parentheses the largest
difference measured on the three configurations below, the walk at seeds 0 and 1 - the class level
is deterministic - 2026-12-04 22:56 UTC): the mean round time within 5% (3.7%), the time to train
within 3% (2.2%), the mean upload latency within 12% (9.5%), the datagrams put on the wire within 8%
(6.5%), the lost fractions exact (every transfer ends at its receiver's need). Passes per upload are
held loosely (within 35%; 27.4%): the first iteration's synchronised incast is one lockstep pass
sequence for every flow here, where the walk's flows drift apart, so its pass count differs by about
one pass either way. Larger configurations, measured once: docs/scale.md.
"""

from __future__ import annotations

import pytest

from dblp.sim import SimConfig, simulate
from dblp.wire import ParameterError

CASES = {
    "3racks_2servers": dict(workers=16, rounds=4, racks=3, spines=2, servers=2),
    "4racks_3servers_oversubscribed": dict(workers=24, rounds=3, racks=4, spines=2, servers=3, oversubscription=3.0),
    "4racks_1server": dict(workers=16, rounds=3, racks=4, spines=2, servers=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_class_level_holds_to_the_walk(name: str) -> None:
    kw = dict(model=1_000_000, topology="leafspine", **CASES[name])
    walk = simulate(SimConfig(fidelity="round", **kw))
    cls = simulate(SimConfig(fidelity="class", **kw))
    a, b = cls.summary(), walk.summary()

    def rel(key: str) -> float:
        return abs(a[key] / b[key] - 1)

    assert rel("mean_round_s") < 0.05
    assert rel("time_to_train_s") < 0.03
    assert rel("mean_up_s") < 0.12
    assert rel("up_passes") < 0.35
    assert abs(cls.datagrams / walk.datagrams - 1) < 0.08
    assert a["lost_up"] == pytest.approx(b["lost_up"], rel=1e-12)
    assert a["lost_down"] == pytest.approx(b["lost_down"], rel=1e-12)
    # one worker record per worker and iteration, as any run's
    workers = [r for r in cls.records if r.role == "worker"]
    assert len(workers) == kw["workers"] * kw["rounds"]
    assert {r.extra["fidelity"] for r in workers} == {"class"}


@pytest.mark.parametrize("kw, why", [
    (dict(topology="twosites"), "topology 'twosites'"),
    (dict(send_rate_bps=1e9), "paced senders"),
    (dict(loss=[{"kind": "bernoulli", "p": 0.01}]), "a loss process"),
    (dict(aggregation="sharded"), "sharded"),
    (dict(compute_jitter_s=1e-3), "compute jitter"),
])
def test_class_level_is_refused_where_it_does_not_apply(kw: dict, why: str) -> None:
    with pytest.raises(ParameterError, match=f"fidelity='class'.*{why}"):
        SimConfig(model=1_000_000, workers=8, fidelity="class", **kw)
