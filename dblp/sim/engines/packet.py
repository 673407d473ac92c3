"""Packet-level engine: every datagram is an event.

Each host runs one SimPy process that serves its active senders round-robin,
``host_slice`` datagrams per turn in core batches of ``max_batch`` (as
:func:`dblp.transport.sockets.pump` serves its peers), spending the host's
per-datagram interval on each. Every datagram then has an event where it
reaches its switch port (exact FIFO with a drop-tail byte buffer, all flows
interleaved in time order) and one where it reaches the receiving host,
where the flow's loss process decides its fate and the survivor goes to the
core receiver alone (``Receiver.receive_chunks`` with one chunk). Control
messages cross the same port FIFO (never dropped). Pacing, when configured,
is the core's own :class:`~dblp.protocol.pacing.TokenBucket`.

Exact, and slow by nature (tens of thousands of datagrams per second of
wall time): for small gradients and for cross-checking the round level.
"""

from __future__ import annotations

import numpy as np
from simpy.events import Timeout

from dblp.protocol import control as ctl
from dblp.protocol.core import RoundSender
from dblp.protocol.pacing import TokenBucket, make_pacer
from dblp.sim.engines.flow import Endpoint, FlowBase
from dblp.sim.network.net import Host, Path, Port


class PacketFlow(FlowBase):
    def __init__(self, engine: "PacketEngine", *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.engine = engine
        self.hostproc = engine.hostproc(self.path.host)
        self._seqs: list[int] = []  # arrivals not yet given to the core receiver (see _arrive)
        self._last_t = 0.0

    def emit_batch(self, seqs: list[int], t0: float, h: float) -> None:
        """Datagram i of ``seqs`` leaves the host at t0 + (i+1) h; one port event each.

        With sender batching (``wake_s``) the host's own egress is a drop-tail queue of the link's
        rate and ``queue_bytes`` (the emulator's TBF on the host's interface: a UDP socket does not
        block on a full qdisc, the datagram is dropped), and ``h`` is the host's cost alone."""
        env, d1, cb = self.env, self.path.d1, self._at_port
        now = env.now
        egress = self.hostproc.egress
        for i, seq in enumerate(seqs):
            t_port = t0 + (i + 1) * h
            if egress is not None:
                dep = egress.arrive(t_port, self.engine.wire)
                if dep is None:
                    continue
                t_port = dep
            t_port += d1
            ev = Timeout(env, t_port - now, (seq, t_port))
            ev.callbacks.append(cb)
        self.engine.events += len(seqs)
        self.sim.datagrams += len(seqs)

    def _at_port(self, ev: Timeout) -> None:
        seq, t_port = ev.value
        path = self.path
        dep = path.port.arrive(t_port, self.engine.wire)
        if dep is None:
            return
        if path.more:  # the next port: one more event (each port's FIFO takes arrivals in time order)
            self._hop(seq, dep + path.d2, 0)
            return
        t_rx = dep + path.d2
        ev = Timeout(self.env, t_rx - self.env.now, (seq, t_rx))
        ev.callbacks.append(self._at_rx)
        self.engine.events += 1

    def _hop(self, seq: int, t: float, k: int) -> None:
        """Datagram ``seq`` reaches the path's ``k``-th further port at ``t``."""
        ev = Timeout(self.env, t - self.env.now, (seq, t, k))
        ev.callbacks.append(self._at_more)
        self.engine.events += 1

    def _at_more(self, ev: Timeout) -> None:
        seq, t, k = ev.value
        port, d = self.path.more[k]
        dep = port.arrive(t, self.engine.wire)
        if dep is None:
            return
        if k + 1 < len(self.path.more):
            self._hop(seq, dep + d, k + 1)
            return
        t_rx = dep + d
        ev = Timeout(self.env, t_rx - self.env.now, (seq, t_rx))
        ev.callbacks.append(self._at_rx)
        self.engine.events += 1

    def _at_rx(self, ev: Timeout) -> None:
        self._arrive(*ev.value)

    def _arrive(self, seq: int, t: float) -> None:
        if self.loss.drop1(t, self.rnd):
            return
        self._seqs.append(seq)
        self._last_t = t
        r = self.ep.receiver
        if (not (r.active and r.round_no == self.rnd and not r.complete) or r.received == 0
                or (r.tolerance is not None and (r.received + len(self._seqs) >= r.stop_count
                                                 or (r.stop_rule == "deadline" and r.received + len(self._seqs)
                                                     >= r.need and t >= r.deadline_at)))):
            # its time matters: the first one (t_first), the one meeting need (or, under R5b's deadline, the
            # first at the deadline with need held), stale ones
            self.deliver_until(t)
        # else it waits in the buffer: nothing about it depends on its time until the
        # next control message, round change or crossing, which deliver first

    def deliver_until(self, t: float) -> None:
        """Hand the buffered arrivals to the core receiver in one call (the last one's time)."""
        if not self._seqs:
            return
        seqs, self._seqs = self._seqs, []
        when = self._last_t
        self.ep.receiver.receive_chunks(self.rnd, np.array(seqs, np.int64), when)
        self.ep.after(when)

    def wake(self) -> None:
        self.hostproc.kick()


class HostProc:
    """One host's sending loop (its CPU and NIC)."""

    def __init__(self, engine: "PacketEngine", host: Host) -> None:
        self.engine = engine
        self.env = engine.sim.env
        self.host = host
        self.flows: list[PacketFlow] = []
        self.wake = self.env.event()
        # sender batching (wake_s): the host's own egress queue (see PacketFlow.emit_batch); else the host
        # blocks on its NIC (never drops its own datagrams)
        cfg = engine.sim.cfg
        self.egress = Port(f"{host.name}->", host.nic_bps, cfg.queue_bytes) if cfg.wake_s else None
        self.env.process(self.run())

    def add(self, flow: PacketFlow) -> None:
        self.flows.append(flow)
        self.kick()

    def kick(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def run(self):
        env = self.env
        host = self.host
        h = host.interval_s
        cfg = self.engine.sim.cfg
        while True:
            busy = False
            for f in list(self.flows):
                s = f.sender
                if s.done:
                    self.flows.remove(f)
                    continue
                if host.recv_s:  # the receive part only for the share the loss lets through
                    h = host.interval_at(f.loss.mean_loss(env.now, env.now, f.rnd))
                if self.egress is not None:  # the CPU's cost alone: the egress queue holds the link's time
                    h = host.cpu_at(f.loss.mean_loss(env.now, env.now, f.rnd) if host.recv_s else 0.0)
                sent = 0
                while sent < cfg.host_slice and not s.done:
                    b = s.datagrams_to_send(env.now, limit=min(cfg.max_batch, cfg.host_slice - sent))
                    if b is None:
                        break
                    f.emit_batch(b.seqs.tolist(), env.now, h)
                    sent += len(b)
                    yield env.timeout(len(b) * h)
                    f.flush_sender(env.now)  # the PROBE leaves after the pass's last datagram
                busy |= sent > 0
            if busy:
                continue
            timers = [t for f in self.flows if not f.sender.done for t in [f.sender.get_timer()] if t is not None]
            self.wake = env.event()
            if timers:
                # at least 1 ns: at the exact time TokenBucket.next_time names, float
                # rounding can leave its allowance at 0, and a zero wait would spin
                # (sender batching: the transport's loop sleeps at least wake_s, then sends what its bucket allows)
                yield self.wake | env.timeout(max(1e-9, cfg.wake_s, min(timers) - env.now))
            else:
                yield self.wake


class PacketEngine:
    def __init__(self, sim) -> None:
        self.sim = sim
        self.core_order = sim.cfg.order
        self.wire = sim.cfg.wire_bytes
        self.events = 0
        self._hosts: dict[int, HostProc] = {}
        self._worker_pacers: dict[int, TokenBucket] = {}

    def pacer(self, direction: int, worker: int) -> TokenBucket:
        """As the real hosts: a worker keeps one bucket for all rounds
        (dblp.transport.worker.Worker.pacer), the server makes one per round and worker."""
        if direction == ctl.UP:
            b = self._worker_pacers.get(worker)
            if b is None:
                b = self._worker_pacers[worker] = self._bucket()
            return b
        return self._bucket()

    def _bucket(self) -> TokenBucket:
        """The simulator's bucket (64 KiB deep: its timers are exact), or with sender batching
        (``wake_s``) the real sender's (:func:`dblp.protocol.pacing.make_pacer`: 5 ms of its rate)."""
        cfg = self.sim.cfg
        return make_pacer(cfg.send_rate_bps) if cfg.wake_s else TokenBucket(cfg.send_rate_bps)

    def hostproc(self, host: Host) -> HostProc:
        hp = self._hosts.get(id(host))
        if hp is None:
            hp = self._hosts[id(host)] = HostProc(self, host)
        return hp

    def start_flow(self, sender: RoundSender, ep: Endpoint, path: Path, rpath: Path, direction: int,
                   worker: int, rnd: int) -> PacketFlow:
        f = PacketFlow(self, self.sim, sender, ep, path, rpath, direction, worker, rnd)
        self.hostproc(path.host).add(f)
        return f

    def send_ctrl(self, path: Path, msg: ctl.Message, t: float, on_arrival, flow) -> None:
        """A control frame: host NIC, propagation, the port's FIFO (never dropped), propagation."""
        sim = self.sim
        wire = sim.ctrl_wire(msg)
        t_port = t + wire * 8.0 / path.host.nic_bps + path.d1

        ports, delays = path.ports, path.delays

        def at_port(k: int, t_in: float) -> None:  # FIFO behind the data at each port, never dropped
            t_out = ports[k].pass_ctrl(t_in, wire) + delays[k + 1]
            if k + 1 < len(ports):
                sim.at(t_out, lambda tt: at_port(k + 1, tt))
            else:
                sim.at(t_out + path.ctrl_overhead_s, lambda tt: on_arrival(msg, tt))

        ev = sim.env.timeout(max(0.0, t_port - sim.env.now))
        ev.callbacks.append(lambda _e: at_port(0, t_port))
