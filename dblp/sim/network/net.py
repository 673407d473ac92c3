"""Hosts, switch ports and paths of the simulated network (the star below; leaf-spine and
two sites are built from the same pieces by :mod:`dblp.sim.network.topology`).

::

    worker i --(bandwidth_bps, delay_s)--> switch --[port srv: server_bandwidth_bps, queue_bytes]--(delay_s)--> server
    server  --(server_bandwidth_bps, delay_s)--> switch --[port i: bandwidth_bps, queue_bytes]--(delay_s)--> worker i

A **host** pushes datagrams at most ``send_pps`` (the per-host send cost)
and at most its NIC's line rate, whichever is slower; a sender blocks on a
busy NIC (a blocking socket), so a host never drops its own datagrams. The
server's host is shared by its N broadcast senders.

A **switch port** is a FIFO with a drop-tail buffer of ``queue_bytes``
(TBF's ``limit``): a datagram that finds more than ``queue_bytes -
size`` bytes still to be transmitted is dropped. All upstream flows meet at
the port towards the server (incast).

A **path** is host -> propagation -> port -> propagation -> receiver.
Control messages (TCP) follow the same path, never dropped, FIFO behind the
data in the port (so a PROBE never overtakes the datagrams sent before it),
and each costs ``ctrl_overhead_s`` of processing.
"""

from __future__ import annotations

import heapq
import math
import os
from itertools import chain, count
from dataclasses import dataclass
from typing import Protocol

import numpy as np

try:  # a port's profile and a pass's waits and drops in C loops (the optional helper, setup.py); numpy otherwise
    from dblp._fastpath import fluid_outcome as _c_fluid_outcome
    from dblp._fastpath import fluid_profile as _c_fluid_profile
except ImportError:
    _c_fluid_outcome = _c_fluid_profile = None
if os.environ.get("DBLP_NO_C"):
    _c_fluid_outcome = _c_fluid_profile = None

_WSEQ = count()  # ties of FluidQueue._wheap (never compares owners)

TCP_MSS = 1448
TCP_OVERHEAD = 66  # Ethernet 14 + IPv4 20 + TCP 32 (timestamps) per segment


def ctrl_wire_bytes(frame_bytes: int) -> int:
    """On-wire bytes of a control frame of ``frame_bytes`` sent over TCP."""
    return frame_bytes + TCP_OVERHEAD * max(1, math.ceil(frame_bytes / TCP_MSS))


@dataclass
class Host:
    name: str
    send_pps: float
    nic_bps: float
    wire_bytes: int
    #: seconds a datagram this host sends costs the receiving host when it is delivered (SimConfig's
    #: ``recv_cost_s`` / ``server_recv_cost_s``), charged to this host's stream: on the emulator every
    #: host shares the machine's cores, so a receiver's CPU time is time the sender does not get, and
    #: a datagram a burst drops before the receiver costs only its send part
    recv_s: float = 0.0

    @property
    def interval_s(self) -> float:
        """Seconds per datagram of a lossless pass: the slower of the host cost (send part and
        the receive part of a delivered datagram) and the NIC."""
        return max(1.0 / self.send_pps + self.recv_s, self.wire_bytes * 8.0 / self.nic_bps)

    def cpu_at(self, loss: float) -> float:
        """:meth:`interval_at` without the NIC: the host's own cost (a sender whose egress is a queue)."""
        return 1.0 / self.send_pps + self.recv_s * (1.0 - loss)

    def interval_at(self, loss: float) -> float:
        """Seconds per datagram when a fraction ``loss`` of them is dropped before the receiver
        (a burst at its ingress): only the delivered ones cost the receive part."""
        return max(1.0 / self.send_pps + self.recv_s * (1.0 - loss), self.wire_bytes * 8.0 / self.nic_bps)


@dataclass
class Port:
    """A switch egress port: rate, drop-tail buffer; exact state for the packet level."""

    name: str
    rate_bps: float
    queue_bytes: int
    busy_until: float = 0.0  # packet level: when the last enqueued byte leaves
    dropped: int = 0

    def ser(self, nbytes: int) -> float:
        return nbytes * 8.0 / self.rate_bps

    # -- packet level: exact FIFO (Lindley) with drop-tail ----------------------------
    def arrive(self, t: float, nbytes: int) -> float | None:
        """A datagram reaches the port at ``t``: its departure time, or None if dropped."""
        backlog = (self.busy_until - t) * self.rate_bps / 8.0 if self.busy_until > t else 0.0
        if backlog + nbytes > self.queue_bytes:
            self.dropped += 1
            return None
        self.busy_until = max(t, self.busy_until) + self.ser(nbytes)
        return self.busy_until

    def pass_ctrl(self, t: float, nbytes: int) -> float:
        """A control frame (never dropped) enters at ``t``: its departure time."""
        self.busy_until = max(t, self.busy_until) + self.ser(nbytes)
        return self.busy_until



class PortReader(Protocol):
    """What a :class:`FluidQueue` asks of a pass's owner (the round level's flow)."""

    fresh_t: float  # its verdicts of datagrams reaching the port before this time are final

    def port_settle(self, t: float) -> None:
        """Take final verdicts now: the queue is about to forget this pass."""


def fluid_step(q: float, qcap: float, cap: float, offered: float, dt: float) -> tuple[float, float]:
    """The fluid drop-tail rule over ``dt`` seconds of a constant ``offered`` rate into a port of
    ``cap`` datagrams/s holding ``q`` of its ``qcap`` datagrams: the queue grows at offered - cap
    (drains at cap - offered, down to 0) until the buffer is full; from then on ``cap / offered``
    of the arrivals get in. Returns the queue at the end and the seconds from the interval's start
    in which every arrival got in (``dt`` when the buffer never filled). One home for the round
    level's interval step: the fabric's class ports (:class:`dblp.sim.engines.fabric._Port`) and the
    incast's walk (:func:`dblp.sim.engines.incast.simulate_incast`) take it; :class:`FluidQueue` keeps
    the same rule as a profile over breakpoints, vectorised (and in C, fluid.c)."""
    if offered <= cap:
        q -= (cap - offered) * dt
        return (q if q > 0.0 else 0.0), dt
    if q >= qcap:
        return qcap, 0.0
    t_full = (qcap - q) / (offered - cap)
    if t_full >= dt:
        return q + (offered - cap) * dt, dt
    return qcap, t_full


class FluidQueue:
    """Round level: a fluid model of one port's drop-tail queue over time.

    Each pass crossing the port is registered as a constant arrival rate over
    its interval at the port; the queue (in datagrams) grows at (offered -
    capacity) and drains at (capacity - offered), between 0 and the buffer.
    A datagram arriving while the buffer is full is dropped when its own
    uniform draw (one per datagram, from a stream of its pass) falls below
    1 - capacity/offered (drop-tail's share of the excess); one arriving
    with q datagrams queued waits q/capacity. When the set of passes changes,
    the queue at that instant is kept and the future re-evaluated.

    The profile's past is kept (``_bt/_ba/_bq`` run from the oldest time a
    reader may still evaluate), so a pass can be judged lazily: a change
    that only adds load (a pass starting, a pass ending on time) can only
    delay or drop the others' datagrams, so their pending crossings are
    re-checked when they fall due instead of at every change - with N
    senders on one port that is O(N) work per change fewer. Changes that
    remove load (an early STOP) still re-evaluate every pass on the port.
    """

    def __init__(self, port: Port, wire_bytes: int) -> None:
        self.port = port
        self.ser = port.ser(wire_bytes)
        self.cap = 1.0 / self.ser
        self.qcap = float(max(port.queue_bytes // wire_bytes - 1, 0))
        self.entries: dict[PortReader, tuple[float, float, float]] = {}  # owner -> (start, end, rate)
        # Kept as the entries change, so a port that never congests costs O(log E)
        # per change, not O(E): the sum of the entries' rates, and their ends (a heap,
        # stale items skipped) to expire the passes that are over.
        self._total = 0.0
        self._ends: list[tuple[float, int, PortReader, tuple[float, float, float]]] = []
        # The entries as the C profile reads them, kept in place: (lo, hi, rate) triples in the
        # dict's order (a set appends, a removal leaves a (-inf, -inf, 0) hole that adds nothing),
        # compacted when the holes outnumber the passes. Building them from the dict at every
        # change was ~0.6 ms at 1024 passes - O(passes) per change of a congested port.
        self._ent = np.empty(3 * 64)
        self._eslot: dict[PortReader, int] = {}
        self._eused = 0
        self._tick = 0
        # the passes in ``entries``, in their order, less those a reader took out for good (the round
        # level's passes whose sender is done, which less load can no longer concern); each with the
        # tick of its entry (increasing in the dict's order, so a few of them sort back into it)
        self.watch: dict[PortReader, int] = {}
        # (time, seq, owner): a watched owner whose answer to less load may change from that time on
        # (recheck, fallen_due); every owner enters at -inf. Stale items (owner gone, or asked again
        # later) are skipped; the heap is rebuilt when it outgrows the watch (see fallen_due)
        self._wheap: list[tuple[float, int, PortReader]] = []
        self.version = 0  # bumped at every change: a reader evaluated at another version is stale
        self.t_ref = 0.0
        self.q_ref = 0.0
        # Breakpoints, offered rate and queue at each (past and future): views of the rows of one
        # buffer, [lo, hi) of its columns. A change rewrites the profile from its instant on in place;
        # the kept past stays where it is (copying it at every change made a congested port's cost
        # grow with its history: ~19,000 breakpoints per change at 128 workers).
        self._buf = np.zeros((3, 64))
        self._lo = 0
        self._trim_next = 0  # the kept past's length at which to look for a horizon again
        self._set_views(1)
        self.congested = False  # a queue or an excess ahead of t_ref
        self.calm_from = 0.0  # no queue and no excess at any time from here on (inf while congested)

    def quiet_after(self, t: float) -> bool:
        """Whether no datagram reaching the port at or after ``t`` waits or is dropped."""
        return t >= self.calm_from

    def queue_at(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        i = np.clip(np.searchsorted(self._bt, t, side="right") - 1, 0, None)
        q = self._bq[i] + (self._ba[i] - self.cap) * (t - self._bt[i])
        return np.clip(q, 0.0, self.qcap)

    def _queue_at1(self, t: float) -> float:
        """``float(queue_at(t))`` of one time, in Python floats (the same operations, in the same order)."""
        i = max(int(self._bt.searchsorted(t, side="right")) - 1, 0)
        q = float(self._bq[i]) + (float(self._ba[i]) - self.cap) * (t - float(self._bt[i]))
        return min(max(q, 0.0), self.qcap)

    def set(self, owner: PortReader, t: float, span: tuple[float, float, float] | None) -> tuple[bool, bool]:
        """Register (or with None remove) ``owner``'s pass at time ``t``.

        Returns (others affected, load removed): whether the other passes' verdicts
        may change at all, and whether they may improve (then they must be
        re-evaluated now; otherwise a pending crossing can only come later)."""
        was = self.congested or t < self.calm_from
        self.q_ref = self._queue_at1(t) if was else 0.0
        self.t_ref = t
        old = self.entries.pop(owner, None)
        self.watch.pop(owner, None)
        removed = old is not None and old[1] > t and (
            span is None or span[2] < old[2] or span[1] < old[1] or span[0] > max(old[0], t))
        if old is not None:
            self._total -= old[2]
            self._ent_drop(owner)
        if span is not None:
            self.entries[owner] = span
            self._tick += 1
            self.watch[owner] = self._tick
            self.recheck(owner, -math.inf)
            self._ent_add(owner, span)
            self._total += span[2]
            heapq.heappush(self._ends, (span[1], self._tick, owner, span))
        ends = self._ends
        while ends and ends[0][0] < t:  # passes over before t no longer shape the queue
            _hi, _k, o, sp = heapq.heappop(ends)
            if self.entries.get(o) is sp:
                if o is not owner:
                    o.port_settle(t)  # its last verdicts from the profile that held then
                del self.entries[o]
                self.watch.pop(o, None)
                self._ent_drop(o)
                self._total -= sp[2]
        if not self.entries:
            self._total = 0.0  # no drift of the running sum across idle periods
            self._eused = 0
        self.version += 1
        self._rebuild()
        return was or self.congested, removed

    def recheck(self, owner: PortReader, at: float) -> None:
        """Have ``fallen_due`` name the watched ``owner`` from time ``at`` on (until it is taken
        out of the watch). Why: the round level's early STOP asked every watched pass whether the
        load it removed concerned it, and most answered "not before a later time" - with N passes
        and N STOPs a round, an O(N^2) walk; this heap hands it only the passes whose time came."""
        heapq.heappush(self._wheap, (at, next(_WSEQ), owner))
        if len(self._wheap) > 4 * len(self.watch) + 64:  # mostly stale: every watched owner at -inf
            self._wheap = [(-math.inf, next(_WSEQ), o) for o in self.watch]  # (a heap: keys equal, seq rising)

    def fallen_due(self, t: float) -> list[PortReader]:
        """The watched owners with a ``recheck`` time at or before ``t``, each once, in the watch's
        order; their items leave the heap (the reader asks again for those it still watches)."""
        h, w = self._wheap, self.watch
        got: dict[PortReader, None] = {}
        while h and h[0][0] <= t:
            o = heapq.heappop(h)[2]
            if o in w:
                got[o] = None
        if len(got) < 2:
            return list(got)
        return sorted(got, key=w.__getitem__)

    def _ent_drop(self, owner: PortReader) -> None:
        k = 3 * self._eslot.pop(owner)
        self._ent[k : k + 3] = (-math.inf, -math.inf, 0.0)

    def _ent_add(self, owner: PortReader, span: tuple[float, float, float]) -> None:
        if self._eused > 2 * len(self._eslot) + 32:  # more holes than passes: compact, in order
            live = np.array([self._eslot[o] for o in self.entries if o is not owner], np.int64)
            ent = self._ent.reshape(-1, 3)[live].ravel()
            self._ent[: ent.size] = ent
            self._eslot = {o: i for i, o in enumerate(o for o in self.entries if o is not owner)}
            self._eused = len(self._eslot)
        if 3 * (self._eused + 1) > self._ent.size:
            self._ent = np.concatenate((self._ent, np.empty(self._ent.size)))
        k = self._eused
        self._ent[3 * k : 3 * k + 3] = span
        self._eslot[owner] = k
        self._eused = k + 1

    def _set_views(self, hi: int) -> None:
        buf, lo = self._buf, self._lo
        self._bt, self._ba, self._bq = buf[0, lo:hi], buf[1, lo:hi], buf[2, lo:hi]

    def _room(self, t0: float, need: int) -> int:
        """Drop the past no reader can still ask about, make room for ``need`` breakpoints from
        ``t0`` on, and return the buffer column where they go (the kept past ends there)."""
        k = int(self._bt.searchsorted(t0, side="left"))  # the past, kept for lazy readers
        if k > max(256 + 4 * len(self.entries), self._trim_next):  # drop the past no reader can still ask about
            horizon = min([o.fresh_t for o in self.entries] + [t0])
            j = max(0, int(self._bt[:k].searchsorted(horizon, side="right")) - 1)
            self._lo += j
            k -= j
            # a reader that keeps the horizon back keeps it for many changes: look again only once
            # the past has doubled (an O(passes) scan per change made that cost grow with them)
            self._trim_next = 2 * k
        buf, lo = self._buf, self._lo
        if lo + k + need > buf.shape[1]:  # compact, or grow (amortised: a copy per doubling)
            if k + need <= buf.shape[1] // 2:
                buf[:, :k] = buf[:, lo : lo + k]
            else:
                self._buf = np.empty((3, 2 * (k + need)))
                self._buf[:, :k] = buf[:, lo : lo + k]
            self._lo = 0
        return self._lo + k

    def _rebuild(self) -> None:
        t0 = self.t_ref
        if self.q_ref <= 0.0 and self._total <= self.cap * (1 + 1e-9):
            # even all passes at once fit: no queue anywhere ahead
            self.congested = False
            if t0 >= self.calm_from:
                return  # calm already: the profile from calm_from on is all zeros
            self.calm_from = t0
            p = self._room(t0, 1)
            self._buf[:, p] = (t0, 0.0, 0.0)
            self._set_views(p + 1)
            return
        if _c_fluid_profile is not None:  # the same profile (dblp/_fastpath_c/fluid.c)
            ent = self._ent[: 3 * self._eused]
            room = 2 * self._eused + 1
            p = self._room(t0, room)
            buf = self._buf
            m, congested = _c_fluid_profile(ent, t0, self.q_ref, self.cap, self.qcap,
                                            buf[0, p : p + room], buf[1, p : p + room], buf[2, p : p + room])
            self.congested = bool(congested)
        else:
            ent = np.fromiter(chain.from_iterable(self.entries.values()), np.float64, 3 * len(self.entries))
            ent = ent.reshape(-1, 3)  # (np.array of the list of tuples: twice the time)
            lo, hi, rate = ent[:, 0], ent[:, 1], ent[:, 2]
            bt = _unique(np.concatenate(([t0], lo[lo > t0], hi[hi > t0])))
            # each pass offers its rate on the breakpoints in [lo, hi): a difference array
            i0 = bt.searchsorted(lo - 1e-15, side="left")
            i1 = bt.searchsorted(hi, side="left")
            d = np.bincount(i0, rate, minlength=bt.size + 1) - np.bincount(i1, rate, minlength=bt.size + 1)
            ba = d[: bt.size].cumsum()
            bq = _clamped_walk(self.q_ref, (ba[:-1] - self.cap) * (bt[1:] - bt[:-1]), self.qcap)
            self.congested = bool(np.logical_or.reduce(ba > self.cap * (1 + 1e-9))
                                  or np.logical_or.reduce(bq > 0))
            m = bt.size
            p = self._room(t0, m)
            self._buf[:, p : p + m] = (bt, ba, bq)
        self.calm_from = math.inf if self.congested else t0
        self._set_views(p + m)

    def wait(self, arr: np.ndarray) -> np.ndarray | None:
        """Queueing wait (s) of datagrams reaching the port at ``arr``; None for none."""
        if arr.size == 0 or (not self.congested and self.quiet_after(float(arr[0]))):
            return None
        q = self.queue_at(arr)
        return q * self.ser if q.any() else None

    def outcome(self, arr: np.ndarray, u: np.ndarray,
                ordered: bool = False) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Queueing wait (s) and overflow drops of datagrams reaching the port at ``arr``
        (sorted), each with its uniform draw ``u``; None for no wait / no drops. ``ordered``:
        ``arr`` is non-decreasing to the last bit (a host's leave times plus a constant; after
        a port's waits it may be out of order by a hair)."""
        if arr.size == 0 or self.quiet_after(float(arr[0])):
            return None, None
        if _c_fluid_outcome is not None:  # the same verdicts (dblp/_fastpath_c/fluid.c)
            wait, ovf = np.empty(arr.size), np.empty(arr.size, bool)
            got = _c_fluid_outcome(self._bt, self._ba, self._bq, self.cap, self.qcap, self.ser, arr, u, wait, ovf)
            return (wait if got & 1 else None), (ovf if got & 2 else None)
        i = _segments(self._bt, arr, -1) if ordered else None
        if i is None:
            i = self._bt.searchsorted(arr, side="right")
            i -= 1
            np.maximum(i, 0, out=i)
        a = self._ba[i]
        q = a - self.cap
        q *= arr - self._bt[i]
        q += self._bq[i]
        np.minimum(np.maximum(q, 0.0, out=q), self.qcap, out=q)
        ovf = None
        if np.maximum.reduce(q) >= self.qcap:
            at_full = q >= self.qcap
            at_full &= a > self.cap
            full = at_full.nonzero()[0]
            if full.size:  # False but where the buffer is full: there, each slot's draw decides
                at_full[full] = u[full] < (1.0 - self.cap / a[full])
                if np.logical_or.reduce(at_full):  # (None: nothing dropped)
                    ovf = at_full
        if not np.logical_or.reduce(q):
            return None, ovf
        q *= self.ser
        return q, ovf


    def outcome_into(self, arr: np.ndarray, u: np.ndarray, wait: np.ndarray, ovf: np.ndarray) -> int:
        """:meth:`outcome` written into ``wait`` (float64, zeros where none) and ``ovf`` (bool) of
        ``arr``'s length; returns bit 1 when some wait is not zero, bit 2 when some slot is dropped.
        ``arr`` non-decreasing to the last bit. Why: the round level re-evaluates a pass at a
        congested port ~10 times a round and keeps the verdicts in arrays of its own; writing them
        there saves two arrays and two copies per evaluation (the C helper writes every entry)."""
        if _c_fluid_outcome is not None and arr.size and not self.quiet_after(float(arr[0])):
            return _c_fluid_outcome(self._bt, self._ba, self._bq, self.cap, self.qcap, self.ser, arr, u, wait, ovf)
        w, o = self.outcome(arr, u, True)
        wait[:] = 0.0 if w is None else w
        ovf[:] = False if o is None else o
        return (w is not None) | ((o is not None) << 1)


def _segments(bt: np.ndarray, arr: np.ndarray, shift: int) -> np.ndarray | None:
    """``max(bt.searchsorted(arr, side="right") + shift, 0)`` for a non-decreasing ``arr`` (and
    ``bt``): the same integers; None where a plain binary search per slot is as cheap (a short
    ``arr``) or the floor at 0 would bind. A long ``arr`` (a pass's slots, thousands) is placed
    the other way round - where each breakpoint from ``arr[0]`` on falls in ``arr`` (a few
    hundred binary searches), counted up - a third of the time of a binary search per slot."""
    n = arr.size
    if n <= 512:
        return None
    k0 = int(bt.searchsorted(arr[0], side="right"))  # breakpoints <= every slot's time
    if k0 + shift < 0:
        return None
    # breakpoint k is <= arr[j] exactly for j >= #(arr < bt[k])
    i = np.bincount(arr.searchsorted(bt[k0:], side="left"), minlength=n + 1)[:n].cumsum()
    i += k0 + shift
    return i


def _unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of a 1-d float array without NaNs (sorts ``a`` in place): the same
    values, without its wrapper's dispatch (a congested port rebuilds its profile per change)."""
    a.sort()
    keep = np.empty(a.size, bool)
    keep[:1] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


_WALK_SHORT = 256  # _clamped_walk's two forms (fluid.c's WALK_SHORT is the same: their doubles differ)


def _clamped_walk(q0: float, inc: np.ndarray, qcap: float) -> np.ndarray:
    """q[0] = q0, q[i+1] = min(max(q[i] + inc[i], 0), qcap), vectorised.

    The walk reflected at 0 alone is the cumulative sum minus its running
    minimum (Lindley); where it would pass ``qcap`` it is clamped there and
    restarted - one numpy pass per time the buffer fills.
    """
    if inc.size <= _WALK_SHORT:  # a short walk: one Python step each is cheaper than numpy calls
        out_l = [q0]
        q = q0
        for x in inc.tolist():  # min(max(q + x, 0.0), qcap), without two builtin calls a step
            q += x
            if q < 0.0:
                q = 0.0
            elif q > qcap:
                q = qcap
            out_l.append(q)
        return np.array(out_l)
    out = np.empty(inc.size + 1)
    i, q = 0, q0
    while True:
        s = np.empty(inc.size + 1 - i)
        s[0] = q
        np.cumsum(inc[i:], out=s[1:])
        s[1:] += q
        walk = s - np.minimum(np.minimum.accumulate(s), 0.0)
        over = np.flatnonzero(walk > qcap)
        if over.size == 0:
            out[i:] = walk
            return out
        j = int(over[0])
        out[i : i + j] = walk[:j]
        i, q = i + j, qcap
        out[i] = qcap
        if i == inc.size:
            return out


@dataclass
class Path:
    """Sender host -> (d1) -> port -> (d2) -> receiver; control frames ride the same way.

    ``more`` extends the path beyond the first port (leaf-spine, two sites):
    after ``d2`` come further ports, each followed by its own propagation
    delay, ``((port, delay), ...)``; the star's paths have none.
    """

    host: Host
    d1: float
    port: Port
    d2: float
    ctrl_overhead_s: float
    more: tuple[tuple[Port, float], ...] = ()

    @property
    def ports(self) -> tuple[Port, ...]:
        return (self.port,) + tuple(p for p, _ in self.more)

    @property
    def delays(self) -> tuple[float, ...]:
        """Propagation delays: host -> first port, then after each port."""
        return (self.d1, self.d2) + tuple(d for _, d in self.more)

    def ctrl_base_delay(self, wire: int) -> float:
        """Delay of a control frame on an idle path (NIC and port serialisation, propagation, processing)."""
        if not self.more:
            return wire * 8.0 / self.host.nic_bps + self.d1 + self.port.ser(wire) + self.d2 + self.ctrl_overhead_s
        return (wire * 8.0 / self.host.nic_bps + sum(self.delays) + sum(p.ser(wire) for p in self.ports)
                + self.ctrl_overhead_s)
