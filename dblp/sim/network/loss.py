"""Loss processes of the simulated data channel.

A loss process decides, for the datagrams of one flow (one direction of one
worker's path) that reach the receiving host, which are dropped. It sits at
the receiver's ingress - where the emulation's nftables drop rule sits in
the host's namespace - after the switch queue, so a datagram it drops still
used the link. Control messages are never dropped (they ride TCP).

The vocabulary (spec dicts, their kinds and parameters, the text form) and
the processes are :mod:`traces.processes`, shared with the emulation and the
host inventory; this module places them on the simulator's flows and turns
their errors into :class:`~dblp.protocol.wire.ParameterError`.

Iteration-keyed bursts hit every datagram of that iteration's rounds, both
the upstream and the broadcast (as the paper's "for one iteration"), subject
to ``dirs``.

Every flow gets its own instance of each process with its own random stream
(derived from the run's seed, the spec's index, the direction and the
worker), so two runs with the same seed draw the same losses, and the
state of a Gilbert-Elliott chain or a packet-trace cursor is per flow.
Each process answers a whole pass at once (``drops``) for the round-level
mode and one datagram (``drop1``) for the packet-level mode; both draw from
the same distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from traces import processes as _p
from traces.processes import (KINDS, Bernoulli, Combined, GilbertElliott, IterationBursts, LossProcess,
                              LossSpecError, TimeBursts, TraceLoss)

from dblp.protocol.control import DOWN, UP
from dblp.protocol.wire import ParameterError

__all__ = ["KINDS", "DIRS", "LossProcess", "Bernoulli", "GilbertElliott", "IterationBursts", "TimeBursts",
           "TraceLoss", "Combined", "check_spec", "check_specs", "burst_iterations", "make_flow_loss"]

_DIR = {"up": UP, "down": DOWN}
DIRS = {name: tuple(_DIR[d] for d in dirs) for name, dirs in _p.DIRECTIONS.items()}


def check_specs(specs: list) -> None:
    """:func:`traces.processes.check_specs`, and :func:`traces.processes.undeliverable`
    (a process that never lets a round finish), failing with a ParameterError."""
    try:
        _p.check_specs(specs)
        why = next((w for w in map(_p.undeliverable, specs) if w), None)
    except LossSpecError as exc:
        raise ParameterError(str(exc)) from None
    if why:  # the simulator would retransmit forever
        raise ParameterError(why)


def check_spec(spec: Any, index: int = 0) -> None:
    """:func:`traces.processes.check_spec`, failing with a ParameterError."""
    try:
        _p.check_spec(spec, index)
    except LossSpecError as exc:
        raise ParameterError(str(exc)) from None


def burst_iterations(spec: dict, index: int, seed: int, rounds: int) -> dict[int, float]:
    """Iteration -> loss of an iteration-keyed spec (:func:`traces.processes.burst_iterations`)."""
    return _p.burst_iterations(spec, index, seed, rounds)


def make_flow_loss(specs: list, *, seed: int, direction: int, worker: int, rounds: int) -> Combined:
    """The loss process of one flow (direction, worker), from the run's specs."""
    procs = []
    for i, spec in enumerate(specs):
        if direction not in DIRS[spec.get("dirs", "both")]:
            continue
        rng = np.random.default_rng([seed, 0x105, i, direction, worker])
        try:
            procs.append(_p.make_process(spec, i, rng, seed=seed, rounds=rounds))
        except LossSpecError as exc:
            raise ParameterError(str(exc)) from exc
    return Combined(procs)
