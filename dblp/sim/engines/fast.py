"""Round-level engine: numpy over each retransmission pass instead of one event per datagram.

At the start of each pass the flow reads from the core how many datagrams
the pass holds (its *slots*). Three shared resources then place every slot:

* the sending **host** lays the slots out in time: its per-datagram
  interval, shared round-robin in ``host_slice`` quanta by the host's
  senders with a pass under way - as the packet level and
  :func:`dblp.transport.sockets.pump` do - or evenly when a pacing bucket binds;
  re-laid out whenever a sender joins or leaves the host
  (:mod:`dblp.sim.engines.hostsched`);
* the flow's **loss process** draws each slot's fate at the receiver's
  ingress (once per pass, with the arrival times known then);
* the switch **port**'s fluid drop-tail queue (:class:`dblp.sim.network.net.FluidQueue`)
  gives each slot its queueing wait and overflow drop (each slot's own
  uniform draw, from a random stream named by seed, direction, worker,
  round and pass), re-evaluated for the slots still to
  come when the set of passes crossing the port changes (incast: the
  upstream passes of all workers meet there). A path of several ports
  (leaf-spine, two sites: :mod:`dblp.sim.network.topology`) takes them in turn,
  each port's departures the next one's arrivals, with a stream of draws
  per port; each port sees the pass shifted by the fixed delay to it and
  no faster than the slowest port before it.

Cost linear in the workers: a change that only adds load at a port (a pass
starting) can only delay or drop the other passes' datagrams, so their
pending need-crossings stay scheduled and each re-evaluates itself when it
falls due or when its datagrams are delivered (``ensure_fresh``); only a
change that removes load (an early STOP) re-evaluates every pass on the
port at once (``EAGER_PORT`` forces that for every change - the reference
the tests hold the lazy rule to). A sender that leaves its host at its last
datagram, after every sender before it in round-robin order, leaves the
others' layout as it is (the round-robin continues unchanged), so a host
of N equal passes is not re-laid out N times; and when a sender stops early,
the others are re-laid out lazily (``HostSched.settle``), each just before
its next datagram would leave - from one shared description, so the N
early STOPs of a broadcast cost O(N) in all, not O(N^2)
(``HostSched._drop_head``).

Nothing of the protocol is decided here. The core is asked for the pass's
datagrams (``RoundSender.datagrams_to_send`` with the number that have left),
and the receiver gets them in a few ``Receiver.receive_chunks`` calls: the
first datagram alone (so ``t_first`` is exact), then everything up to the
datagram at which the receiver's own ``need`` is reached - delivered at that
datagram's arrival time, so the core's STOP leaves at the right moment -
then the datagrams still in flight, which the core counts as stale. The
STOP reaches the sender after the control path's delay; the sender then
hands out exactly the datagrams that left before it, rounded up to whole
``max_batch`` batches (the transport gives the kernel whole batches), and
the core records the early stop. PROBEs follow the pass's last datagram
through the port (FIFO), the receiver answers from its own state, and
BITMAPs start the next pass or the core's backoff.

Two shortcuts keep a 69k-datagram pass at a few milliseconds, and neither
changes a count-level statistic:

* the core runs with ``order="inorder"`` (records state the configured
  order): when loss depends on time and position in the stream, not on chunk
  identity, which chunks a pass carries does not change how many arrive or
  when, and a per-round permutation of 69k chunks would cost ~0.6 ms;
* senders get an unlimited :class:`~dblp.protocol.pacing.TokenBucket`, and a
  configured pacing rate is applied to the slots' times in closed form (the
  same bucket: ``burst_bytes`` at once, then the rate) - handing the core's
  64 KB bucket its datagrams would take ~1,500 core calls per pass.

Approximations (the packet level is exact on all of them): a loss process
sees every slot of a pass, also those the switch queue drops; a port sees
each pass as a constant rate over its interval; slots re-timed by the host
keep the loss outcome drawn at the pass's start; on a path of several
ports, the verdicts of a slot that had reached the first port at a
re-evaluation are kept at the later ports too.

Where the pieces live: :class:`RoundEngine` here (the shared state of a run: ports, hosts' schedules,
control-message timing, SimPy queue entries), :class:`~dblp.sim.engines.roundflow.RoundFlow` in
:mod:`dblp.sim.engines.roundflow` (one transfer's passes), the random streams and memory settings in
:mod:`dblp.sim.engines.roundkit`, and every SimPy internal it relies on in :mod:`dblp.sim.network.simpy_adapter`.
"""

from __future__ import annotations

from heapq import heappush
from typing import Any, Callable

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import RoundSender
from dblp.protocol.pacing import TokenBucket, make_pacer
from dblp.sim.network.simpy_adapter import event_ids, queue as simpy_queue
from dblp.sim.engines.flow import Endpoint
from dblp.sim.engines.hostsched import HostSched
from dblp.sim.engines.incast import IncastFlow, incast_group
from dblp.sim.network.net import FluidQueue, Host, Path
from dblp.sim.engines.roundflow import RoundFlow
from dblp.sim.engines.roundkit import _EMPTY_F, _EMPTY_I, keep_heap, quiet_gc
from dblp.sim.network.simpy_adapter import NORMAL, URGENT  # noqa: F401  (URGENT re-exported)

__all__ = ["EAGER_PORT", "RoundEngine", "RoundFlow", "keep_heap", "quiet_gc"]

# Re-evaluate every pass on a port at every change (the lazy rule's reference; tests compare the two).
EAGER_PORT = False

_NOARG = object()

# control messages whose frame length is fixed by their type (and the length of their bits)
_FIXED_FRAMES = frozenset({ctl.RoundStart, ctl.Probe, ctl.Stop, ctl.Bitmap, ctl.Held, ctl.Common})
_BITS_FRAMES = frozenset({ctl.Bitmap, ctl.Held, ctl.Common})


class RoundEngine:
    def __init__(self, sim) -> None:
        self.sim = sim
        self.env = sim.env
        self._q, self._ids = simpy_queue(sim.env), event_ids(sim.env)  # see call
        cfg = sim.cfg
        self.core_order = "inorder"
        self.group = g = cfg.group  # a slot is `group` datagrams (1: one datagram)
        self.wire = cfg.wire_bytes * g
        self.batch = max(1, round(cfg.max_batch / g))
        self.dgram_bytes = sim.layout.datagram_size * g
        self.pace_s = self.dgram_bytes * 8.0 / cfg.send_rate_bps if cfg.send_rate_bps else 0.0
        self.rate_Bps = cfg.send_rate_bps / 8.0
        self.wake_s = cfg.wake_s  # sender batching (bucket_times): 0 = exact timers
        self.burst_bytes = TokenBucket(cfg.send_rate_bps).burst_bytes  # the core's default bucket
        if cfg.wake_s:  # sender batching: the real sender's bucket (dblp.protocol.pacing.make_pacer), 5 ms of its rate
            self.burst_bytes = make_pacer(cfg.send_rate_bps).burst_bytes
        self.seed = cfg.seed
        self.eager = EAGER_PORT  # read once per run (tests switch it)
        keep_heap()
        quiet_gc()
        self.events = 0
        self.port_users: dict[int, int] = {}  # paths whose data crosses each port
        for path in list(sim.up_paths) + list(sim.down_paths):
            self.port_users[id(path.port)] = self.port_users.get(id(path.port), 0) + 1
        self._sched: dict[int, HostSched] = {}
        self._fluid: dict[int, FluidQueue] = {}
        self._hops: dict[int, tuple[list[tuple[float, float]], float]] = {}
        self._paths: dict[int, tuple] = {}
        self._wire: dict = {}  # see ctrl_wire
        self._base_delay: dict[tuple[int, int], float] = {}  # (path, frame bytes) -> path.ctrl_base_delay
        self._iota = _EMPTY_I
        self._ones = _EMPTY_F
        self._fiota = _EMPTY_F
        self._zeros = _EMPTY_F
        self._scr_w = _EMPTY_F
        self._scr_o = np.empty(0, bool)
        # hosts that may owe their senders a re-layout (HostSched._pending or redo; pruned by any_owing):
        # while one does, an early STOP asks every watched pass on its port (queue_update)
        self.owing: set[HostSched] = set()
        # the first iteration's synchronised incast at flow level, where it stands for the walk (dblp.sim.engines.incast)
        self.incast = incast_group(self)

    def any_owing(self) -> bool:
        """Whether a host owes a re-layout now (forgetting those that no longer do)."""
        ow = self.owing
        for h in list(ow):
            if not h._pending and h.redo is None:
                ow.discard(h)
        return bool(ow)

    # -- SimPy queue entries ----------------------------------------------------------------
    # These push onto SimPy's queue the very tuple ``Environment.schedule`` pushes, with a call
    # ``(fn, args)`` in place of the event (dblp.sim.network.simpy_adapter): a few thousand per iteration.
    def call(self, delay: float, fn: Callable[[Any], None], arg: Any, priority: int = NORMAL) -> None:
        """``fn(arg)`` in ``delay`` seconds, queued as a SimPy event of that priority would be."""
        heappush(self._q, (self.env.now + delay, priority, next(self._ids), (fn, (arg,))))

    def at(self, t: float, fn: Callable[..., None], arg: Any = _NOARG) -> None:
        """``fn(t)`` (``fn(t, arg)``) at simulated time ``t``, now if ``t`` is past: what
        ``Simulation.at`` does with a Timeout and a closure, queued at the very same place."""
        now = self.env.now
        d = t - now
        heappush(self._q, (now + (d if d > 0.0 else 0.0), NORMAL, next(self._ids),  # max(0.0, d), no call
                           (fn, (t,) if arg is _NOARG else (t, arg))))

    def at_msg(self, t: float, fn: Callable[[ctl.Message, float], None], msg: ctl.Message) -> None:
        """``fn(msg, t)`` at simulated time ``t`` (a control message's arrival)."""
        now = self.env.now
        d = t - now
        heappush(self._q, (now + (d if d > 0.0 else 0.0), NORMAL, next(self._ids), (fn, (msg, t))))

    def path_info(self, path: Path) -> tuple:
        """What a flow on ``path`` needs of it (see RoundFlow.__init__), computed once per path."""
        got = self._paths.get(id(path))
        if got is None:
            ports = path.ports
            queues = [self.fluid(p) for p in ports]
            hops = self.hops(path)
            sched = self.sched(path.host)
            solo = all(self.port_users.get(id(p), 0) <= 1 for p in ports)
            # free: no other path crosses its ports and its host cannot send faster than any of them
            # serialises, so no queue ever forms there (EAGER_PORT, the reference, keeps every port informed)
            free = solo and not self.eager and all(sched.h >= q.ser for q in queues)
            got = self._paths[id(path)] = (sched, queues, queues[0], len(queues) > 1, solo, hops, hops[1], free)
        return got

    def hops(self, path: Path) -> tuple[list[tuple[float, float]], float]:
        """For each port of ``path``: (fixed delay after the first port's arrival, slowest
        serialisation before it); and the whole path's fixed delay (cached per path)."""
        got = self._hops.get(id(path))
        if got is None:
            qs = [self.fluid(p) for p in path.ports]
            delays = path.delays
            per, off, slow = [(0.0, 0.0)], 0.0, 0.0
            for k in range(1, len(qs)):
                off += qs[k - 1].ser + delays[k]
                slow = max(slow, qs[k - 1].ser)
                per.append((off, slow))
            if len(qs) == 1:
                total = qs[0].ser + path.d2 + path.d1  # the star's order of additions (pinned results)
            else:
                total = delays[0] + off + qs[-1].ser + delays[-1]
            got = self._hops[id(path)] = (per, total)
        return got

    def iota(self, r: int) -> np.ndarray:
        """0, 1, ..., r-1 (int64), a read-only view of one array shared by every flow of the run."""
        if self._iota.size < r:
            self._iota = np.arange(max(r, 2 * self._iota.size), dtype=np.int64)
            self._iota.flags.writeable = False
        return self._iota[:r]

    def fiota(self, r: int) -> np.ndarray:
        """0.0, 1.0, ..., r-1 (float64), read-only and shared: slot counts to scale into times."""
        if self._fiota.size < r:
            self._fiota = np.arange(max(r, 2 * self._fiota.size), dtype=np.float64)
            self._fiota.flags.writeable = False
        return self._fiota[:r]

    def scratch_wait(self, r: int) -> np.ndarray:
        """``r`` float64 entries to write into and read at once (one buffer of the run, reused: never kept)."""
        if self._scr_w.size < r:
            self._scr_w = np.empty(max(r, 2 * self._scr_w.size))
        return self._scr_w[:r]

    def scratch_ovf(self, r: int) -> np.ndarray:
        """``r`` bool entries to write into and read at once (as :meth:`scratch_wait`)."""
        if self._scr_o.size < r:
            self._scr_o = np.empty(max(r, 2 * self._scr_o.size), bool)
        return self._scr_o[:r]

    def zeros(self, r: int) -> np.ndarray:
        """``r`` zeros (float64), read-only and shared: the times a loss process that ignores them is given."""
        if self._zeros.size < r:
            self._zeros = np.zeros(max(r, 2 * self._zeros.size))
            self._zeros.flags.writeable = False
        return self._zeros[:r]

    def ones(self, r: int) -> np.ndarray:
        """1.0, 2.0, ..., r (float64), read-only and shared: the slot offsets of a lone sender's pass."""
        if self._ones.size < r:
            self._ones = np.arange(1, max(r, 2 * self._ones.size) + 1, dtype=np.float64)
            self._ones.flags.writeable = False
        return self._ones[:r]

    def sched(self, host: Host) -> HostSched:
        s = self._sched.get(id(host))
        if s is None:
            s = self._sched[id(host)] = HostSched(self, host)
        return s

    def fluid(self, port) -> FluidQueue:
        f = self._fluid.get(id(port))
        if f is None:
            f = self._fluid[id(port)] = FluidQueue(port, self.wire)
        return f

    def pacer(self, direction: int, worker: int) -> TokenBucket:
        return TokenBucket()

    def start_flow(self, sender: RoundSender, ep: Endpoint, path: Path, rpath: Path, direction: int,
                   worker: int, rnd: int) -> RoundFlow | IncastFlow:
        if self.incast is not None and self.incast.takes(direction, rnd):
            return self.incast.start_flow(sender, ep, path, rpath, direction, worker, rnd)
        return RoundFlow(self, self.sim, sender, ep, path, rpath, direction, worker, rnd)

    def ctrl_wire(self, msg: ctl.Message) -> int:
        """``Simulation.ctrl_wire(msg)``, remembered per message type (and bitmap length) for the
        types whose frame length depends on nothing else: their encoding is fixed structs."""
        tp = type(msg)
        if tp not in _FIXED_FRAMES:
            return self.sim.ctrl_wire(msg)
        key = (tp, len(msg.bits)) if tp in _BITS_FRAMES else tp
        w = self._wire.get(key)
        if w is None:
            w = self._wire[key] = self.sim.ctrl_wire(msg)
        return w

    def send_ctrl(self, path: Path, msg: ctl.Message, t: float, on_arrival, flow) -> None:
        wire = self.ctrl_wire(msg)
        dep_last = flow.dep_last() if flow is not None and isinstance(msg, ctl.Probe) else None
        if dep_last is not None and path.more:  # FIFO behind the pass's datagrams at the last port
            last = path.ports[-1]
            t_last = t + path.ctrl_base_delay(wire) - last.ser(wire) - path.delays[-1] - path.ctrl_overhead_s
            t_rx = max(t_last, dep_last) + last.ser(wire) + path.delays[-1] + path.ctrl_overhead_s
        elif dep_last is not None:  # FIFO behind the pass's datagrams in the port
            t_port = t + wire * 8.0 / path.host.nic_bps + path.d1
            t_rx = max(t_port, dep_last) + path.port.ser(wire) + path.d2 + path.ctrl_overhead_s
        else:
            key = (id(path), wire)
            d = self._base_delay.get(key)
            if d is None:
                d = self._base_delay[key] = path.ctrl_base_delay(wire)
            t_rx = t + d
        self.at_msg(t_rx, on_arrival, msg)
