"""The SimPy internals the simulator relies on (dblp.sim.network.simpy_adapter), held to the installed SimPy:
the entry ``Environment.schedule`` pushes, and ``run`` against ``env.run()`` - the same events, order,
clock and failures - with the round level's ``(fn, args)`` entries called in their places."""

from __future__ import annotations

import pytest
import simpy

from dblp.sim.network import simpy_adapter as sa


def test_the_installed_simpy_is_the_pinned_release():
    assert simpy.__version__.split(".")[:2] == sa.PINNED.split(".")


def test_schedule_pushes_time_priority_id_event_onto_the_adapters_queue():
    env = simpy.Environment(initial_time=2.0)
    ev = env.event()
    env.schedule(ev, sa.URGENT, 0.5)
    t, prio, eid, got = sa.queue(env)[-1]
    assert (t, prio, got) == (2.5, sa.URGENT, ev) and isinstance(eid, int)
    assert next(sa.event_ids(env)) == eid + 1  # one counter orders equal times
    assert sa.NORMAL > sa.URGENT  # URGENT entries of one instant come first


def _workload(env: simpy.Environment, log: list) -> None:
    """Processes, timeouts, conditions and priorities at shared instants."""
    def worker(name, delays):
        for d in delays:
            yield env.timeout(d)
            log.append((env.now, name))
        done = env.event()
        done.succeed(name)
        log.append((env.now, name, (yield done)))
        env.process(late(name))  # a process's start is an URGENT entry at this instant

    def late(name):
        log.append((env.now, name, "started"))
        yield env.timeout(0)

    def waiter():
        a, b = env.process(worker("a", [0.1, 0.2, 0.2])), env.process(worker("b", [0.3, 0.2]))
        yield a & b
        log.append((env.now, "both"))
        yield env.timeout(0.1) | env.timeout(0.2)
        log.append((env.now, "either"))

    env.process(waiter())
    env.timeout(0.3).callbacks.append(lambda e: log.append((env.now, "bare")))


def test_run_takes_the_events_as_env_run_does():
    ref: list = []
    env = simpy.Environment()
    _workload(env, ref)
    env.run()
    got: list = []
    env2 = simpy.Environment()
    _workload(env2, got)
    sa.run(env2)
    assert got == ref and env2.now == env.now and len(ref) > 6


def test_run_calls_fn_args_entries_at_their_time_and_priority():
    env = simpy.Environment()
    log: list = []
    env.timeout(0.2).callbacks.append(lambda e: log.append(("timeout", env.now)))
    q, ids = sa.queue(env), sa.event_ids(env)
    import heapq

    heapq.heappush(q, (0.2, sa.NORMAL, next(ids), (lambda x: log.append(("call", x, env.now)), (7,))))
    heapq.heappush(q, (0.2, sa.URGENT, next(ids), (lambda: log.append(("urgent", env.now)), ())))
    sa.run(env)
    assert log == [("urgent", 0.2), ("timeout", 0.2), ("call", 7, 0.2)]


def test_run_crashes_on_a_failed_event_nobody_defused_as_env_run_does():
    for runner in (lambda env: env.run(), sa.run):
        env = simpy.Environment()
        env.event().fail(ValueError("lost"))
        with pytest.raises(ValueError, match="lost") as exc:
            runner(env)
        assert isinstance(exc.value.__cause__, ValueError)
        env = simpy.Environment()
        ev = env.event()
        ev.fail(ValueError("handled"))
        ev.defused = True
        runner(env)  # a defused failure ends nothing
