"""Round-level engine: one numpy computation per retransmission pass.

At the start of each pass the flow reads from the core how many datagrams
the pass holds; the host lays them out in time - its per-datagram interval,
shared round-robin in ``host_slice`` quanta by the host's senders that have
a pass under way, as the packet level and :func:`dblp.transport.pump` do,
re-laid out whenever a sender joins or leaves the host - and the flow
pushes them through the path (the switch port's fluid drop-tail model, see
:meth:`dblp.sim.net.Port.fluid`) and its loss process, all with numpy,
which gives every delivered datagram its arrival time. Datagrams re-timed
after a sender left the host keep the path delay and loss outcome drawn
when their pass started.

Nothing of the protocol is decided here. The core is asked for the pass's
datagrams (``RoundSender.datagrams_to_send`` with the count emitted so far),
and the receiver gets them in a few ``Receiver.receive_chunks`` calls: the
first datagram alone (so ``t_first`` is exact), then everything up to the
datagram at which the receiver's own ``need`` is reached - delivered at that
datagram's arrival time, so the core's STOP leaves at the right moment -
then the datagrams still in flight, which the core counts as stale. The
STOP reaches the sender after the control path's delay; the sender is then
given exactly the datagrams that left before it (an early stop mid-pass, as
the core records it). PROBEs follow the pass's last datagram through the
port (FIFO), the receiver answers from its own state, and BITMAPs start the
next pass or the core's backoff.

Two shortcuts keep a 69k-datagram pass at a few milliseconds, and neither
changes a count-level statistic:

* the core runs with ``order="inorder"`` (records state the configured
  order): when loss depends on time and position in the stream, not on chunk
  identity, which chunks a pass carries does not change how many arrive or
  when, and a per-round permutation of 69k chunks would cost ~0.6 ms;
* senders get an unlimited :class:`~dblp.pacing.TokenBucket` and a
  configured pacing rate stretches the datagram interval instead (a
  64 KB-burst bucket would otherwise take ~1,500 core calls per pass).
"""

from __future__ import annotations

import numpy as np

from .. import control as ctl
from ..core import RoundSender
from ..pacing import TokenBucket
from .model import Endpoint, FlowBase, pass_remaining
from .net import Host, Path


class RoundFlow(FlowBase):
    def __init__(self, engine: "RoundEngine", *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.engine = engine
        self.host = engine.sched(self.path.host)
        self.rng = engine.rng[(self.direction, self.worker)]
        self.in_pass = False
        self.n = 0  # datagrams in the current pass
        self.taken = 0  # of them handed out by the core so far
        self.leave: np.ndarray | None = None  # when each slot of the pass leaves the host
        self.seqbuf = np.empty(0, np.int64)
        self.d_slot = np.empty(0, np.int64)  # slots that reach the receiver, in arrival order
        self.d_lat = np.empty(0)  # their path delay (propagation, queueing, serialisation)
        self.d_t = np.empty(0)  # their arrival times
        self.dpos = 0  # next undelivered entry of d_slot
        self.dend = 0  # entries from dend on were never sent (the STOP came first)
        self.last_slot = -1  # last slot that got through the port, and its port departure - leave
        self.last_deplat = 0.0
        self.xgen = 0
        self.wait_ev = self.env.event()
        self.env.process(self.run())

    # -- the sender side ------------------------------------------------------------------
    def run(self):
        env, s = self.env, self.sender
        while not s.done:
            if self.in_pass:
                if self.leave is None:  # the host lays the pass out at its next commit
                    self.wait_ev = env.event()
                    yield self.wait_ev
                    continue
                t_end = float(self.leave[-1])
                if env.now >= t_end - 1e-12:
                    self.in_pass = False
                    self.host.remove(self, t_end)
                    self.take_until(self.n, t_end)
                    continue
                self.wait_ev = env.event()
                yield env.timeout(t_end - env.now) | self.wait_ev
            elif s.ready(env.now):
                self.n = pass_remaining(s)
                if self.n <= 0:
                    raise RuntimeError(f"round {self.rnd}: the core is sending a pass of {self.n} datagrams")
                self.leave, self.taken, self.in_pass = None, 0, True
                self.dpos = self.dend = 0
                self.host.join(self)
            else:
                t = s.get_timer()
                self.wait_ev = env.event()
                if t is None:
                    yield self.wait_ev
                else:
                    yield self.wait_ev | env.timeout(max(0.0, t - env.now))

    def wake(self) -> None:
        if not self.wait_ev.triggered:
            self.wait_ev.succeed()

    def laid_out(self, a: int, leave: np.ndarray, t: float) -> None:
        """The host set the leave times of slots ``a..n-1`` (all of them for a new pass)."""
        if self.leave is None:
            self.leave = leave
            self._sample_path(t)
        else:
            self.leave[a:] = leave
            i = max(self.dpos, int(np.searchsorted(self.d_slot[: self.dend], a, side="left")))
            self.d_t[i : self.dend] = self.leave[self.d_slot[i : self.dend]] + self.d_lat[i : self.dend]
        self.schedule_crossing()
        self.wake()

    def _sample_path(self, t0: float) -> None:
        eng, path, n, leave = self.engine, self.path, self.n, self.leave
        assert leave is not None
        span = max(float(leave[-1]) - t0, 1e-12)
        dep, ovf = path.port.fluid(leave + path.d1, path.port.load(self.rnd) * n / span, eng.wire, self.rng)
        rcv = dep + path.d2
        if ovf is None:
            reach = None
            t_reach = rcv
            self.last_slot = n - 1
        else:
            reach = np.flatnonzero(~ovf)
            t_reach = rcv[reach]
            self.last_slot = int(reach[-1]) if reach.size else -1
        if self.last_slot >= 0:
            self.last_deplat = float(dep[self.last_slot] - leave[self.last_slot])
        drop = self.loss.drops(t_reach, self.rnd) if t_reach.size else None
        if drop is None:
            self.d_slot = np.arange(n, dtype=np.int64) if reach is None else reach
            self.d_t = t_reach
        else:
            keep = ~drop
            self.d_slot = np.flatnonzero(keep) if reach is None else reach[keep]
            self.d_t = t_reach[keep]
        self.d_lat = self.d_t - leave[self.d_slot]
        self.dpos, self.dend = 0, int(self.d_slot.size)
        if self.seqbuf.size < n:
            self.seqbuf = np.empty(n, np.int64)

    def dep_last(self) -> float | None:
        """Port departure of the current pass's last datagram that got through the port."""
        if self.leave is None or self.last_slot < 0:
            return None
        return float(self.leave[self.last_slot]) + self.last_deplat

    def take_until(self, m: int, t: float) -> None:
        """Have the core hand out the pass's first ``m`` datagrams (those that left)."""
        k = m - self.taken
        if k <= 0:
            return
        b = self.sender.datagrams_to_send(t, limit=k)
        got = 0 if b is None else len(b)
        if got != k:
            raise RuntimeError(f"round {self.rnd}: the core handed out {got} of the {k} datagrams left in its pass")
        self.seqbuf[self.taken : m] = b.seqs
        self.taken = m
        self.sim.datagrams += k
        if m == self.n:  # the pass is out: its PROBE follows the last datagram
            self.flush_sender(float(self.leave[-1]))

    def before_sender_msg(self, msg: ctl.Message, t: float) -> None:
        if isinstance(msg, ctl.Stop) and msg.round == self.rnd and self.in_pass:
            self.in_pass = False
            if self.leave is None:
                self.host.remove(self, t)
                return
            # The core hands datagrams out in batches of max_batch that go to the
            # kernel whole (transport.pump): every batch taken before the STOP
            # arrived leaves. Slot j's batch is taken one interval before its
            # first datagram leaves.
            m0 = int(np.searchsorted(self.leave - self.host.h, t, side="left"))
            b = self.sim.cfg.max_batch
            m = min(self.n, max(-(-m0 // b) * b, self.taken))
            self.take_until(m, t)
            self.host.remove(self, max(t, float(self.leave[m - 1])) if m else t)  # the host is free after them
            self.dend = max(self.dpos, int(np.searchsorted(self.d_slot[: self.dend], m, side="left")))

    def after_finish(self, t: float) -> None:
        if self.dpos < self.dend:  # datagrams still in flight reach the receiver (stale there)
            self.sim.at(float(self.d_t[self.dend - 1]), self.deliver_until)

    # -- the receiver side -------------------------------------------------------------------
    def _open(self) -> bool:
        r = self.ep.receiver
        return r.active and r.round_no == self.rnd and not r.complete

    def schedule_crossing(self) -> None:
        """Wake at the arrival that brings the receiver to its ``need`` (if this pass has it)."""
        r = self.ep.receiver
        self.xgen += 1
        if not self._open() or r.tolerance is None:
            return
        left = r.need - r.received
        if 0 < left <= self.dend - self.dpos:
            t_x = float(self.d_t[self.dpos + left - 1])
            g = self.xgen
            self.sim.at(t_x, lambda t: self.deliver_until(t) if g == self.xgen else None)

    def tolerance_changed(self, t: float) -> None:
        self.schedule_crossing()

    def deliver_until(self, t: float) -> None:
        """Give the receiver every datagram that has arrived by ``t``, at its arrival time."""
        if self.dpos >= self.dend:
            return
        hi = min(int(np.searchsorted(self.d_t[: self.dend], t, side="right")), self.dend)
        r = self.ep.receiver
        while self.dpos < hi:
            lo = self.dpos
            j = hi
            if self._open():
                if r.received == 0:
                    j = lo + 1  # alone, so the core's t_first is its arrival time
                elif r.tolerance is not None:
                    j = min(hi, lo + max(1, r.need - r.received))  # up to the one that meets need
            when = float(self.d_t[j - 1])
            slots = self.d_slot[lo:j]
            self.take_until(int(slots[-1]) + 1, when)
            r.receive_chunks(self.rnd, self.seqbuf[slots], when)
            self.dpos = j
            self.ep.after(when)


class HostSched:
    """A host's sending capacity, shared round-robin by its senders' passes."""

    def __init__(self, engine: "RoundEngine", host: Host) -> None:
        self.sim = engine.sim
        self.h = host.interval_s
        self.q = engine.sim.cfg.host_slice
        self.pace = engine.pace_s
        self.active: list[RoundFlow] = []
        self.joining: list[RoundFlow] = []
        self._commit_at: float | None = None

    def join(self, f: RoundFlow) -> None:
        self.joining.append(f)
        if self._commit_at is None:  # passes starting at the same instant are laid out together
            self._commit_at = self.sim.env.now
            self.sim.at(self._commit_at, self._commit)

    def _commit(self, t: float) -> None:
        self._commit_at = None
        new, self.joining = self.joining, []
        self.active.extend(new)
        self.relayout(t)

    def remove(self, f: RoundFlow, t: float) -> None:
        if f in self.joining:
            self.joining.remove(f)
        if f in self.active:
            self.active.remove(f)
            if self.active:
                self.relayout(t)

    def relayout(self, t: float) -> None:
        flows = self.active
        starts = [0 if f.leave is None else int(np.searchsorted(f.leave, t, side="right")) for f in flows]
        rem = [f.n - a for f, a in zip(flows, starts)]
        h, q = self.h, self.q
        for i, f in enumerate(flows):
            r = rem[i]
            if r <= 0 or (f.leave is not None and len(flows) == 1 and not self.pace and starts[i] > 0):
                continue  # alone and already laid out: nothing changes
            j = np.arange(r, dtype=np.int64)
            if len(flows) == 1:
                pos = j + 1
            else:
                uq = (j // q) * q
                pos = j - uq + 1
                for k, rk in enumerate(rem):
                    pos = pos + np.minimum(rk, uq)
                    if k < i:
                        pos = pos + np.minimum(q, np.maximum(0, rk - uq))
            leave = t + h * pos.astype(np.float64)
            if self.pace:
                leave = np.maximum(leave, t + self.pace * (j + 1).astype(np.float64))
            f.laid_out(starts[i], leave, t)


class RoundEngine:
    def __init__(self, sim) -> None:
        self.sim = sim
        cfg = sim.cfg
        self.core_order = "inorder"
        self.wire = cfg.wire_bytes
        self.pace_s = sim.layout.datagram_size * 8.0 / cfg.send_rate_bps if cfg.send_rate_bps else 0.0
        self.rng = {(d, i): np.random.default_rng([cfg.seed, 0x9047, d, i]) for d in (ctl.UP, ctl.DOWN)
                    for i in range(cfg.workers)}
        self.events = 0
        self._sched: dict[int, HostSched] = {}

    def sched(self, host: Host) -> HostSched:
        s = self._sched.get(id(host))
        if s is None:
            s = self._sched[id(host)] = HostSched(self, host)
        return s

    def pacer(self) -> TokenBucket:
        return TokenBucket()

    def start_flow(self, sender: RoundSender, ep: Endpoint, path: Path, rpath: Path, direction: int,
                   worker: int, rnd: int) -> RoundFlow:
        return RoundFlow(self, self.sim, sender, ep, path, rpath, direction, worker, rnd)

    def send_ctrl(self, path: Path, msg: ctl.Message, t: float, on_arrival, flow) -> None:
        wire = self.sim.ctrl_wire(msg)
        dep_last = flow.dep_last() if flow is not None and isinstance(msg, ctl.Probe) else None
        if dep_last is not None:  # FIFO behind the pass's datagrams in the port
            t_port = t + wire * 8.0 / path.host.nic_bps + path.d1
            t_rx = max(t_port, dep_last) + path.port.ser(wire) + path.d2 + path.ctrl_overhead_s
        else:
            t_rx = t + path.ctrl_base_delay(wire)
        self.sim.at(t_rx, lambda tt: on_arrival(msg, tt))
