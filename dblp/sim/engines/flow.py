"""What the simulator's engines share: the SimPy side of a core receiver and of one transfer.

An :class:`Endpoint` wraps a persistent core :class:`~dblp.protocol.core.Receiver`
(owned by a :mod:`dblp.protocol.session` session) with the event fired when the core
says the round is complete; a :class:`FlowBase` is one ``RoundSender ->
Receiver`` transfer whose data path an engine (:mod:`dblp.sim.engines.packet`,
:mod:`dblp.sim.engines.fast`) adds. Kept apart from :mod:`dblp.sim.model` so the
engines and the model import in one direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dblp.protocol import control as ctl
from dblp.protocol.core import Receiver, RoundSender

if TYPE_CHECKING:
    from dblp.sim.network.net import Path


def pass_remaining(sender: RoundSender) -> int:
    """Datagrams left in the sender's current pass, read from the core's state."""
    return sender.pass_remaining


class Endpoint:
    """A persistent core :class:`Receiver` plus the SimPy side of it: an event
    fired when the core says the round is complete, and routing of the
    receiver's control messages (BITMAP/STOP) to the flow feeding it."""

    def __init__(self, sim: Any, receiver: Receiver) -> None:
        self.sim = sim
        self.receiver = receiver
        self.flow: Any = None
        self.completed = sim.env.event()

    def before_open(self, now: float) -> None:
        """Call before the session opens the receiver's next round: what arrived of
        the last round before ``now`` counts there."""
        if self.flow is not None:
            self.flow.deliver_until(now)

    def opened(self, now: float) -> None:
        """Call after the session opened the receiver's round: a fresh completion event."""
        self.completed = self.sim.env.event()
        self.after(now)

    def after(self, t: float) -> None:
        """Route what the core wants to send, and notice completion."""
        r = self.receiver
        for m in r.control_to_send():
            if self.flow is not None:
                self.flow.send_to_sender(m, t)
        if r.complete and r.active and not self.completed.triggered:
            self.completed.succeed(t)


@dataclass(eq=False, repr=False)
class FlowBase:
    """One RoundSender -> Receiver transfer; the engines add the data path.

    Not compared or printed by value: a flow is a live transfer inside a running simulation."""

    sim: Any
    sender: RoundSender
    ep: Endpoint
    path: Path
    rpath: Path
    direction: int
    worker: int
    rnd: int

    def __post_init__(self) -> None:
        self.env = self.sim.env
        self.ep.flow = self
        self.loss = self.sim.loss[(self.direction, self.worker)]
        self.done = self.env.event()

    # -- control channel ------------------------------------------------------------
    def send_to_receiver(self, msg: ctl.Message, t: float) -> None:
        self.sim.engine.send_ctrl(self.path, msg, t, self._at_receiver, self)

    def send_to_sender(self, msg: ctl.Message, t: float) -> None:
        self.sim.engine.send_ctrl(self.rpath, msg, t, self._at_sender, None)

    def _at_receiver(self, msg: ctl.Message, t: float) -> None:
        self.deliver_until(t)  # data that arrived before the message is in the receiver first
        self.ep.receiver.handle_control(msg, t)
        self.ep.after(t)

    def _at_sender(self, msg: ctl.Message, t: float) -> None:
        if self.sender.done:
            self.sender.handle_control(msg, t)  # counted/ignored by the core
            return
        self.before_sender_msg(msg, t)
        self.sender.handle_control(msg, t)
        self.flush_sender(t)
        if self.sender.done:
            self.finish(t)
        else:
            self.wake()

    def flush_sender(self, t: float) -> None:
        for m in self.sender.control_to_send():
            self.send_to_receiver(m, t)

    def finish(self, t: float) -> None:
        self.after_finish(t)
        self.done.succeed(t)

    # -- engine hooks -------------------------------------------------------------------
    def deliver_until(self, t: float) -> None:
        pass

    def before_sender_msg(self, msg: ctl.Message, t: float) -> None:
        pass

    def tolerance_changed(self, t: float) -> None:
        pass

    def wake(self) -> None:
        pass

    def after_finish(self, t: float) -> None:
        pass


