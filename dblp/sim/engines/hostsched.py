"""Round level: a host's sending capacity, shared round-robin by its senders' passes.

A host sends ``host_slice`` datagrams for one peer, then the next (as
:func:`dblp.transport.sockets.pump` does), one every ``h`` seconds; a pacing bucket
slower than ``h`` spreads the senders evenly instead. Whenever a sender
joins, or leaves before its pass is out (an early STOP), the host lays the
remaining slots of every active sender out afresh from that instant
(:meth:`HostSched.relayout`, round-robin in join order).

Why a module of its own, and why the bookkeeping below: the server's host
carries N broadcast senders, and at a tolerance above zero each of them is
stopped early, one after the other - N re-layouts of N senders per round.
Materialising them is O(N^2) (1024 workers: ~3 s of Python per round).
So a re-layout only *describes* the layout of the senders that cannot
notice it yet (alone on a port they cannot congest, next datagram not due):
one :class:`_Layout` per host holds their remaining slot counts in numpy
arrays, and a sender's leave times are computed from it when it asks
(:meth:`HostSched.settle`) or just before its next datagram would leave.
When the sender at the head of the round-robin stops early and every other
one is still only described, the next layout is the same description from
the new instant without the head - an array view and one ``cumsum``
(:meth:`HostSched._drop_head`), O(1) Python per early STOP. It is the
re-layout's own result, not an approximation; ``fast.EAGER_PORT`` turns
all of it off (every layout materialised at once), and the tests hold the
two to the same records.

A paced host (a bucket slower than its interval) gives each sender the same
leave times whatever the others do but for their count, so its early ends of
one instant - a broadcast at its fair share is stopped in lockstep - are one
re-layout, owed until something at that instant asks (:meth:`HostSched._defer`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dblp.sim.network.net import Host

# dblp.sim.engines.fast's RoundEngine and RoundFlow (not imported: fast imports this module)
RoundEngine = Any
RoundFlow = Any


# Slot positions (in host intervals) of the equal round-robin: a broadcast's layouts repeat from
# round to round (64 workers: ~130 distinct of ~12,000 per 100 iterations), and the times are
# these whole numbers scaled by the host interval, so they are made once, scaled (read-only), and
# only shifted per use. Keyed by (r, k, q, i, host interval).
_PATTERNS: dict[tuple[int, int, int, int, float], np.ndarray] = {}
_PATTERNS_KEPT = 4096  # ~1024 distinct per iteration at 1024 workers; cleared beyond this


def _pattern(fiota, r: int, k: int, q: int, i: int) -> np.ndarray:
    """1-based positions in the host's sequence of sender ``i``'s next ``r`` slots, ``k``
    senders with ``r`` slots each taking turns of ``q`` (whole numbers as floats: exact)."""
    full, rest = divmod(r, q)
    pos = np.empty(r)
    if full:
        np.add.outer(fiota(full) * float(k * q), fiota(q) + float(i * q + 1), out=pos[: full * q].reshape(full, q))
    if rest:
        np.add(fiota(rest), float(full * k * q + i * rest + 1), out=pos[full * q :])
    pos.flags.writeable = False
    return pos


class _Layout:
    """One re-layout from ``t``: the active senders in round-robin order from
    position ``base`` on, with the slots each had left (``rem``), the first
    slot the layout applies to (``a``), when that slot would have left under
    the sender's last materialised layout (``lead``) and when the sender must
    at the latest be given its layout (``due``; inf once it has it)."""

    __slots__ = ("t", "base", "flows", "index", "rem_all", "a", "lead", "due", "rem", "equal", "solo", "quanta",
                 "positive")

    def __init__(self, t: float, flows: list, index: dict, rem_all: np.ndarray, a: np.ndarray, lead: np.ndarray,
                 due: np.ndarray, base: int, solo: bool, equal: bool = False) -> None:
        """``equal``: known equal (a tail of an equal layout is), not computed again."""
        self.t, self.flows, self.index, self.base, self.solo = t, flows, index, base, solo
        self.rem_all, self.a, self.lead, self.due = rem_all, a, lead, due
        self.rem = rem_all[base:]  # remaining slots of the senders from base on (a view)
        self.equal = equal or bool(self.rem.size == 0 or np.logical_and.reduce(self.rem == self.rem[0]))
        # shared along a chain of _drop_head layouts (same rem_all): min(rem_all, host_slice) as floats,
        # and whether every rem is known positive (a tail of positive ones is)
        self.quanta: np.ndarray | None = None
        self.positive = False

    @property
    def ctx(self) -> tuple[float, np.ndarray, bool]:
        return self.t, self.rem, self.equal


class HostSched:
    """A host's sending capacity, shared by its senders' passes."""

    def __init__(self, engine: RoundEngine, host: Host) -> None:
        self.sim = engine.sim
        self.engine = engine
        self.host = host
        self.h = host.interval_s * engine.group  # per unit of `group` datagrams
        self.eps = 1e-6 * self.h  # times closer than this are the same instant of the host's clock
        self.q = max(1, engine.sim.cfg.host_slice // engine.group)
        # a bucket slower than the host's own interval binds; a faster one never does
        self.pace = engine.pace_s if engine.pace_s > self.h else 0.0
        self.active: list[RoundFlow] = []
        self.joining: list[RoundFlow] = []
        self._commit_at: float | None = None
        self._layout: _Layout | None = None  # the layout the pending senders are owed
        self._pending: dict[RoundFlow, int] = {}  # laid out lazily: sender -> its position in _layout.flows
        self._chain_gen = 0
        self._hsteps = np.empty(0)  # see _steps
        # Paced hosts: the instant of a re-layout owed since an early end and not yet made (see _defer),
        # and the senders laid out from it on request since, with the sender count they got it for
        self.redo: float | None = None
        self._redo_gen = 0
        self._redo_laid: dict[RoundFlow, int] = {}

    def _steps(self, r: int) -> np.ndarray:
        """``engine.ones(r) * h`` (1h, 2h, ..., rh: a lone sender's slot offsets), read-only and kept:
        the same products, made once per host instead of once per pass."""
        if self._hsteps.size < r:
            self._hsteps = self.engine.ones(max(r, 2 * self._hsteps.size)) * self.h
            self._hsteps.flags.writeable = False
        return self._hsteps[:r]

    def join(self, f: RoundFlow) -> None:
        self.joining.append(f)
        if self._commit_at is None:  # passes starting at the same instant are laid out together
            self._commit_at = self.sim.env.now
            self.engine.at(self._commit_at, self._commit)

    def _commit(self, t: float) -> None:
        self._commit_at = None
        new, self.joining = self.joining, []
        if self.host.recv_s and not self.active and not self._pending and self.redo is None:
            self._set_interval(t, new)
        self.active.extend(new)
        self.relayout(t)

    def _set_interval(self, t: float, new: list) -> None:
        """A host with a receive cost (:attr:`Host.recv_s`) starting passes while idle: its interval for
        them, from the share of their datagrams the loss lets through (the mean of the passes' expected
        loss at ``t``: an iteration's burst holds for the whole round). Why only while idle: a layout
        made with one interval is never continued with another; the passes of one round see one loss."""
        loss = sum(f.loss.mean_loss(t, t, f.rnd) for f in new) / len(new) if new else 0.0
        h = self.host.interval_at(loss) * self.engine.group
        if h != self.h:
            self.h = h
            self.eps = 1e-6 * h
            self._hsteps = np.empty(0)
            self.pace = self.engine.pace_s if self.engine.pace_s > h else 0.0

    def remove(self, f: RoundFlow, t: float) -> None:
        if f in self.joining:
            self.joining.remove(f)
        if f in self.active:
            natural = self._ends_first(f, t)
            head = self.active[0] is f
            self.active.remove(f)
            if self.active and not natural and not (head and self._drop_head(f, t)):
                if self.pace and not self.engine.eager:
                    self._defer(t)
                else:
                    self.relayout(t)

    # -- paced hosts: early ends of one instant, one re-layout ---------------------------------
    def _defer(self, t: float) -> None:
        """Owe the re-layout from ``t`` after an early end, made once later at this instant.

        Why: a paced sender's leave times depend on the others only through
        their count (``_paced_leave``), and a paced broadcast's N senders are
        stopped at one instant (their receivers reach ``need`` in lockstep):
        N re-layouts of N senders, O(N^2) per round (1024 workers paced at
        their fair share: ~9 s of CPU a round). Early ends with the same
        re-layout instant are coalesced into one :meth:`relayout`, queued
        at the present instant; a sender asked for its times before that
        (``settle``) gets exactly what the re-layout would give it with the
        senders active then. ``fast.EAGER_PORT`` re-lays out at every end.
        """
        if self.redo is not None and self.redo != t:
            self._flush_redo()
        if self.redo is None:
            self.redo = t
            self.engine.owing.add(self)
            self._redo_gen += 1
            self.engine.call(0.0, self._redo_due, self._redo_gen)

    def _redo_due(self, gen: int) -> None:
        if gen == self._redo_gen and self.redo is not None:
            self._flush_redo()

    def _flush_redo(self) -> None:
        """Make the owed re-layout (every active sender, as the last early end asked)."""
        t, self.redo = self.redo, None
        self._redo_laid.clear()
        self.relayout(t)

    def _settle_redo(self, f: RoundFlow) -> None:
        """Lay ``f`` out as the owed re-layout will, for the senders active now."""
        k = len(self.active)
        if f not in self.active or self._redo_laid.get(f) == k:
            return
        t = self.redo
        a = 0 if f.leave is None else int(f.leave.searchsorted(t + self.eps, side="right"))
        self._redo_laid[f] = k
        r = f.n - a
        if r <= 0 or (f.leave is not None and k == 1 and a > 0):
            return  # as relayout: nothing left, or alone and laid out already
        if f.leave is None:
            f.bucket_start(t)
        f.laid_out(a, self._paced_leave(t, k, f, a, r), t)

    def _ends_first(self, f: RoundFlow, t: float) -> bool:
        """Whether ``f`` leaves at its last datagram's time, with every sender before it
        (in round-robin order) out too: the round-robin from ``t`` over the rest
        is then exactly the current layout's continuation, so no sender moves.

        This is how equal passes end (each sender's tail follows the previous
        one's), and skipping their re-layout keeps a host of N senders at O(N)
        work per pass instead of O(N^2).
        """
        if self.pace or f.leave is None or f in self._pending:
            return False
        end = float(f.leave[-1])
        if abs(t - end) > self.eps:  # its last datagram must be the host's last one before t
            return False
        for g in self.active:
            if g is f:
                return True
            if g.leave is None or g in self._pending or float(g.leave[-1]) > t + self.eps:
                return False
        return False

    # -- laying out -----------------------------------------------------------------------
    def _settle_owed(self, t: float) -> None:
        """Before a re-layout at ``t``: give the pending senders the layout owed by ``t``,
        or all of it if the layout was made for a later instant than ``t`` (a STOP's
        last batch may still be leaving)."""
        L = self._layout
        if not self._pending or L is None:
            return
        if L.t > t:
            for f in list(self._pending):
                self.settle(f)
            return
        for i in (L.due[L.base:] <= t + self.eps).nonzero()[0].tolist():
            self.settle(L.flows[L.base + i])

    def relayout(self, t: float) -> None:
        """Lay the active senders out afresh from ``t`` (round-robin in join order).

        A sender that cannot notice the change before its next datagram
        leaves - its pass under way, alone and uncongested at its port - is
        laid out lazily (:meth:`settle`): at the latest half a slot before
        the old or the new layout would send its next datagram, or when
        anything asks for its times. With N senders and N early STOPs per
        round that is the difference between O(N^2) and O(N) re-layouts.
        """
        if self.redo is not None:  # an owed re-layout of an earlier early end comes first
            self._flush_redo()
        if len(self.active) == 1 and not self._pending:
            self._relayout_one(t)
            return
        self._settle_owed(t)
        old, pending = self._layout, self._pending
        self._pending = {}
        flows = list(self.active)
        k = len(flows)
        tt = t + self.eps  # a datagram leaving at t (to float noise) is out: ties do not hang on rounding
        starts = np.empty(k, np.int64)
        lead = np.empty(k)
        lead.fill(math.inf)
        rem = np.empty(k, np.int64)
        for i, f in enumerate(flows):
            j = pending.get(f)
            if j is not None:
                a = int(old.a[j])
                lead[i] = old.lead[j]
            elif f.leave is None:
                a = 0
            else:
                a = int(f.leave.searchsorted(tt, side="right"))
                if a < f.n:
                    lead[i] = f.leave[a]
            starts[i] = a
            rem[i] = f.n - a
        due = np.empty(k)
        due.fill(math.inf)
        L = _Layout(t, flows, {f: i for i, f in enumerate(flows)}, rem, starts, lead, due, 0, True)
        ctx = L.ctx
        lazy = not self.pace and k > 1
        if lazy:  # when each sender's first datagram of the new layout leaves
            first = L.quanta = np.minimum(rem.astype(np.float64), self.q)
            first = t + self.h * (1.0 + first.cumsum() - first)
        new_pending: dict = {}
        # as they are re-pended, the senders are owed this layout (a sender asked for its times
        # while the others are laid out gets it)
        self._layout, self._pending = L, new_pending
        self.engine.owing.add(self)
        for i, f in enumerate(flows):
            r = int(rem[i])
            if r <= 0 or (f.leave is not None and k == 1 and starts[i] > 0):
                if f in pending:  # its owed layout is the one that continues
                    self._settle_in(old, f, pending[f])
                continue  # alone and already laid out: nothing changes
            if f.leave is None and self.pace:
                f.bucket_start(t)
            if lazy and f.leave is not None and self._private(f):
                d = min(float(first[i]), float(lead[i])) - 0.5 * self.h
                if d > t + self.eps:
                    new_pending[f] = i
                    due[i] = d
                    L.solo = L.solo and f.solo
                    continue
            f.laid_out(int(starts[i]), self._leave(ctx, i, f, int(starts[i])), t)
        self._schedule_chain()

    def _relayout_one(self, t: float) -> None:
        """:meth:`relayout` of a host with one sender and nothing pending (every worker's
        host): its remaining slots one host interval apart from ``t`` (paced: as its bucket
        lets them go), without the shared description (no other sender could ever read it;
        a paced host never reads one). Why: 1024 workers paced lay out ~1,300 passes a round."""
        f = self.active[0]
        self._layout = None
        self._chain_gen += 1
        if f.leave is None:
            a = 0
        else:
            a = int(f.leave.searchsorted(t + self.eps, side="right"))
            if a > 0:
                return  # alone and already laid out: nothing changes
        r = f.n - a
        if r <= 0:
            return
        if self.pace:
            if f.leave is None:
                f.bucket_start(t)
            f.laid_out(a, self._paced_leave(t, 1, f, a, r), t)
            return
        f.laid_out(a, self._steps(r) + t, t)

    def _drop_head(self, f: RoundFlow, t: float) -> bool:
        """The head of the round-robin, ``f``, left before its pass was out (already
        taken off ``active``): if every other sender is still only described by the
        current layout, the re-layout from ``t`` is that description without ``f`` -
        O(1) Python instead of :meth:`relayout`'s loop. False if it does not apply."""
        L = self._layout
        if self.pace or L is None or f in self._pending or self.engine.eager:
            return False
        jf = L.index.get(f)
        if jf is None or jf < L.base or L.flows[jf] is not f:
            return False
        self._settle_owed(t)
        k = len(self.active)
        if k < 2 or len(self._pending) != k or len(L.flows) - jf - 1 != k or not L.solo or L.t > t:
            return False  # someone else has its layout, or a sender no longer sits alone on its port
        N = _Layout(t, L.flows, L.index, L.rem_all, L.a, L.lead, L.due, jf + 1, True, L.equal)
        rem = N.rem
        if not L.positive and int(np.minimum.reduce(rem)) <= 0:
            return False
        N.positive = True
        N.quanta = L.quanta if L.quanta is not None else np.minimum(L.rem_all.astype(np.float64), self.q)
        first = N.quanta[N.base :]
        first = t + self.h * (1.0 + first.cumsum() - first)
        due = np.minimum(first, N.lead[N.base:]) - 0.5 * self.h
        N.due[N.base:] = due
        self._layout = N
        for i in (due <= t + self.eps).nonzero()[0].tolist():  # its next datagram is due: lay it out now
            self.settle(N.flows[N.base + i])
        self._schedule_chain()
        return True

    def _schedule_chain(self) -> None:
        self._chain_gen += 1
        if self._pending:
            L = self._layout
            g = self._chain_gen
            self.engine.at(float(np.minimum.reduce(L.due[L.base:])), self._chain, g)

    def _private(self, f: RoundFlow) -> bool:
        """Whether nothing but ``f`` can notice its layout: alone on a port it cannot congest."""
        if self.engine.eager:
            return False
        now = self.sim.env.now
        for qu in f.queues:
            ent = qu.entries
            if not ((not ent or (len(ent) == 1 and f in ent)) and not qu.congested and qu.quiet_after(now)
                    and self.h >= qu.ser):
                return False
        return True

    def _chain(self, now: float, gen: int) -> None:
        if gen != self._chain_gen or not self._pending:
            return  # a newer layout took over
        L = self._layout
        for i in (L.due[L.base:] <= now + self.eps).nonzero()[0].tolist():
            self.settle(L.flows[L.base + i])
        if self._pending:
            self.engine.at(float(np.minimum.reduce(L.due[L.base:])), self._chain, gen)

    def settle(self, f: RoundFlow) -> None:
        """Give ``f`` the layout it is owed now (no-op if it has it)."""
        if self.redo is not None:  # a paced host (never lazy below): see _defer
            self._settle_redo(f)
            return
        j = self._pending.pop(f, None)
        if j is not None:
            self._settle_in(self._layout, f, j)

    def _settle_in(self, L: _Layout, f: RoundFlow, j: int) -> None:
        L.due[j] = math.inf
        a = int(L.a[j])
        f.laid_out(a, self._leave(L.ctx, j - L.base, f, a), L.t)

    def _leave(self, ctx: tuple[float, np.ndarray, bool], i: int, f: RoundFlow, start: int) -> np.ndarray:
        """Leave times of sender ``i``'s slots ``start..n-1`` in the layout made at ``ctx``."""
        t, rem, equal = ctx
        r = int(rem[i])
        h, q, k = self.h, self.q, len(rem)
        if not self.pace and k == 1:
            return self._steps(r) + t
        if self.pace:
            return self._paced_leave(t, k, f, start, r)
        j = np.arange(r, dtype=np.int64) if not equal else None
        if equal:  # round-robin, equal passes: turn u, offset w (whole numbers: exact in any order)
            key = (r, k, q, i, h)
            scaled = _PATTERNS.get(key)
            if scaled is None:
                scaled = _pattern(self.engine.fiota, r, k, q, i) * h
                scaled.flags.writeable = False
                if len(_PATTERNS) >= _PATTERNS_KEPT:
                    _PATTERNS.clear()
                _PATTERNS[key] = scaled
            return scaled + t
        else:  # round-robin in quanta of host_slice datagrams, in join order
            uq = j // q
            uq *= q
            pos = j - uq
            pos += 1
            for kk, rk in enumerate(rem.tolist()):
                pos += np.minimum(rk, uq)
                if kk < i:
                    pos += np.clip(rk - uq, 0, q)
            leave = pos.astype(np.float64)
        leave *= h
        leave += t
        return leave

    def _paced_leave(self, t: float, k: int, f: RoundFlow, start: int, r: int) -> np.ndarray:
        """Leave times of paced sender ``f``'s slots ``start..start+r-1`` laid out from ``t``
        with ``k`` active senders: paced senders take what their bucket allows each turn,
        the host shared evenly, each sender capped by its bucket (the others matter only
        through ``k``)."""
        leave = self.engine.ones(r) * (self.h * k)  # (j + 1) h k for j = 0..r-1, then + t: in place
        leave += t
        np.maximum(leave, f.bucket_times(start, r), out=leave)
        if self.engine.wake_s:  # batches (bucket_times): a batch's slots leave at the host's pace, h k apart
            step = self.engine.fiota(r) * (self.h * k)
            leave -= step
            np.maximum.accumulate(leave, out=leave)
            leave += step
        return leave
