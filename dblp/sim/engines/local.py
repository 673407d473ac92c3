"""A host-local transfer: a worker's own shard in the sharded mode, as :mod:`dblp.transport.hostlocal` moves it.

Why: on real hosts a worker's own shard goes to the shard server on its host
through a shared-memory slot, not the network. The protocol is unchanged -
the core's :class:`~dblp.protocol.core.RoundSender` and :class:`~dblp.protocol.core.Receiver`
keep their passes, PROBE, STOP and tolerance - only the data path differs: a
pass is one LOCAL control message, and its receiver takes every chunk of the
shard at once (:meth:`dblp.transport.sockets.Peer._receive_local`). Nothing is lost
and no link is used, so the local share of a round is always whole. Here the
same: each pass the sender hands out is one :class:`dblp.protocol.control.Local` on the
host's loopback control path (:data:`dblp.sim.network.topology.LOOPBACK_S`, plus
``ctrl_overhead_s``), delivering every chunk; the copy into the slot is not
timed (a memcpy: ~3 ms for a third of 25M floats at 10 GB/s).

The engines (:mod:`dblp.sim.engines.fast`, :mod:`dblp.sim.engines.packet`) are not involved:
they carry datagrams, and this path carries none.
"""

from __future__ import annotations

import numpy as np

from dblp.protocol import control as ctl
from dblp.sim.engines.flow import FlowBase


class LocalFlow(FlowBase):
    """One host-local RoundSender -> Receiver transfer: a LOCAL control message per pass."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self._last_rx = 0.0  # sender -> receiver frames arrive in order (one TCP stream, as the real one)
        self._every = np.arange(self.ep.receiver.layout.chunks, dtype=np.int64)
        self.wait_ev = self.env.event()
        self.env.process(self.run())

    def run(self):
        env, s = self.env, self.sender
        while not s.done:
            if s.ready(env.now):
                b = s.datagrams_to_send(env.now, limit=max(1, s.pass_remaining), headers=False)
                if b is not None:  # as dblp.transport.sockets's _send_local: the pass in the slot, then LOCAL
                    self.send_to_receiver(ctl.Local(self.rnd, self.direction), env.now)
                self.flush_sender(env.now)  # the PROBE follows the LOCAL
                if b is not None:
                    continue
            t = s.get_timer()
            self.wait_ev = env.event()
            if t is None:
                yield self.wait_ev
            else:
                yield self.wait_ev | env.timeout(max(1e-9, t - env.now))

    def wake(self) -> None:
        if not self.wait_ev.triggered:
            self.wait_ev.succeed()

    def send_to_receiver(self, msg: ctl.Message, t: float) -> None:
        """A frame to the receiver, FIFO behind the ones sent before it (a LOCAL is never overtaken
        by its PROBE)."""
        t_rx = max(t + self.path.ctrl_base_delay(self.sim.ctrl_wire(msg)), self._last_rx)
        self._last_rx = t_rx
        self.sim.at(t_rx, lambda tt: self._at_receiver(msg, tt))

    def _at_receiver(self, msg: ctl.Message, t: float) -> None:
        if isinstance(msg, ctl.Local):  # the whole shard at once (dblp.transport.sockets: _receive_local)
            self.ep.receiver.receive_chunks(msg.round, self._every, t)
            self.ep.after(t)
            return
        super()._at_receiver(msg, t)
