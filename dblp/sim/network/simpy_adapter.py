"""The one place the simulator touches SimPy's internals: its event queue, its event ids, its clock.

SimPy's public API schedules an *event* (``Environment.schedule``, ``env.timeout``) and runs the
queue (``Environment.run``/``step``). The round level (:mod:`dblp.sim.engines.fast`) queues a few thousand
entries per iteration and the simulator processes ~2,000 events per iteration at 64 workers; an
event object per entry, and a ``step()`` call with its ``try`` per event, cost a large share of a
run. So, here and only here:

* :func:`queue` and :func:`event_ids` hand out the environment's heap and its id counter. An entry
  is the tuple ``Environment.schedule`` pushes, ``(time, priority, next(ids), event)``, and in place
  of ``event`` the round level puts ``(fn, args)``: a call ``fn(*args)`` at that time and priority,
  ordered among SimPy's own events exactly as an event with one callback would be.
* :func:`run` is ``env.run()`` (until no event is left): the same events in the same order as
  ``Environment.step`` takes them - setting the clock, calling the callbacks, crashing on a failed
  event nobody defused - and it calls the ``(fn, args)`` entries. Nothing else reads the queue
  (``env.step()`` would not know those entries; the simulator never calls it).

These follow SimPy 4.1 (:data:`PINNED`); ``tests/sim/test_simpy_adapter.py`` holds the installed
version to them: the entry layout ``schedule`` pushes, the order and clock of :func:`run` against
``env.run()``, and the failure it raises. Everything else in the simulator uses public SimPy API.
"""

from __future__ import annotations

import heapq
from typing import Iterator

import simpy
from simpy.events import NORMAL, URGENT

__all__ = ["NORMAL", "PINNED", "URGENT", "event_ids", "queue", "run"]

#: the SimPy release whose internals this module follows (pyproject: simpy>=4.1,<5)
PINNED = "4.1"


def queue(env: simpy.Environment) -> list:
    """The environment's event heap (``Environment._queue``): entries ``(time, priority, id, event)``."""
    return env._queue


def event_ids(env: simpy.Environment) -> Iterator[int]:
    """The environment's counter of entry ids (``Environment._eid``): ``next()`` of it orders equal times."""
    return env._eid


def run(env: simpy.Environment) -> None:
    """``env.run()`` until no event is left, calling the ``(fn, args)`` entries in their places."""
    q = env._queue
    pop = heapq.heappop
    while q:
        env._now, _, _, event = pop(q)
        if event.__class__ is tuple:
            event[0](*event[1])
            continue
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            # a failed event nobody defused: crash as Environment.step does
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
