"""The round level's flow (:class:`RoundFlow`): one transfer's passes, from the core's datagrams to the
receiver's chunks, each slot placed by the sending host, the loss process and the ports.

:mod:`dblp.sim.engines.fast` states the model, its shortcuts and its approximations, and drives the flows
through its :class:`~dblp.sim.engines.fast.RoundEngine` (the ``engine`` of a flow).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import RoundSender
from dblp.sim.engines.flow import Endpoint, FlowBase, pass_remaining
from dblp.sim.network.net import Path
from dblp.sim.engines.roundkit import _EMPTY_F, _EMPTY_I, _c_fluid_arrivals, _count_le, _slots_below, _uniforms
from dblp.sim.network.simpy_adapter import URGENT

__all__ = ["RoundFlow"]


class RoundFlow(FlowBase):
    # Per-pass state that starts as a constant lives here until first assigned (a flow is
    # built per transfer, thousands per round at 1024 workers: fewer stores in __init__).
    npass = 0  # passes started (names the stream of the port's draws)
    in_pass = False
    n = 0  # slots of the current pass
    limit = 0  # slots that will leave (n, or fewer once the STOP came)
    taken = 0  # slots handed out by the core so far
    leave: np.ndarray | None = None  # when each slot leaves the host
    lossdrop: np.ndarray | None = None  # the loss process's verdicts (None: none lost)
    wait: np.ndarray | None = None  # queueing wait at the port (None: none)
    ovf: np.ndarray | None = None  # dropped by the port's full buffer (None: none)
    u: np.ndarray | None = None  # each slot's uniform draw for the port's overflow verdict
    fresh_t = -math.inf  # port verdicts of slots reaching the port before this are final
    qver = -1  # the port's version they were computed at (another: stale, see FluidQueue)
    arr_ok = False  # d_slot/d_t hold the arrivals of the current leave times and limit, without waits
    seqbuf = _EMPTY_I  # the chunks of the pass, slot by slot (the core's pass_chunks at its start)
    _arr1: np.ndarray | None = None  # leave + path.d1 (single port), made when first needed
    d_slot = _EMPTY_I  # slots that reach the receiver, in arrival order
    d_t = _EMPTY_F  # and their arrival times
    dpos = 0  # next undelivered entry
    xgen = 0
    b_t0: float | None = None  # pacing bucket at the pass's start (time, tokens)
    b_tokens0 = 0.0
    b_end = 0.0  # when the last pass's datagrams were out, and how many
    b_used = 0
    _bound_at = math.inf  # when a check armed by less load at the port falls due (see less_load)
    _x_at = math.inf  # when the crossing event now waiting (xgen's) is due (inf: none waiting)
    # less_load's memory (see there): less load at the port before _quiet cannot concern this pass
    # (while its host owes it no re-layout); reset to -inf by whatever can bring its crossing bound
    # forward (a layout, a tolerance, a new pass, its STOP, the armed check falling due, another
    # crossing event than the one found final, _x_fin)
    _qv = -math.inf  # (the value of _quiet, below)
    _x_fin = -1.0
    _wgen = 0  # the sender's waits (see _arm)
    _waiting = _wtrig = _ctrig = _timed = False

    def __init__(self, engine: Any, sim: Any, sender: RoundSender, ep: Endpoint, path: Path,
                 rpath: Path, direction: int, worker: int, rnd: int) -> None:
        FlowBase.__init__(self, sim, sender, ep, path, rpath, direction, worker, rnd)
        self.engine = engine
        # the host, the ports the pass crosses (in order), whether it crosses several, whether
        # no other path's passes cross its ports (nothing else can notice its layout), and the
        # fixed delays (engine.hops; c_total: host -> receiver without waiting)
        (self.host, self.queues, self.queue, self.multi, self.solo, self._hops,
         self.c_total, self.free) = engine.path_info(self.path)
        self.u_more: dict[int, np.ndarray] = {}  # the further ports' uniform draws of this pass
        self._start()

    def _start(self) -> None:
        self.engine.call(0.0, self._resume, 0, URGENT)  # where SimPy put the process's Initialize

    @property
    def _quiet(self) -> float:
        return self._qv

    @_quiet.setter
    def _quiet(self, v: float) -> None:
        """An earlier answer than before: the ports that watch this pass ask it again from ``v``
        on (``FluidQueue.recheck``; a later one needs nothing: the earlier item still comes first,
        and the walk asks again from the new value)."""
        if v < self._qv:
            for q in self.queues:
                if self in q.watch:
                    q.recheck(self, v)
        self._qv = v

    # -- the sender side ------------------------------------------------------------------
    # A state machine, not a SimPy process: a process cost a Process, an Initialize, an
    # Event per wait and a Condition (plus its Timeout) per timed wait - most of a pass's
    # SimPy overhead. The machine puts its own entries (RoundEngine.call) in SimPy's queue
    # where the process put its events, at the same times and priorities: Initialize
    # (URGENT, now), ``wait_ev.succeed()`` (now), the Timeout of a timed wait, and the
    # Condition's succeed (now) one hop after whichever of the two came first. Every
    # other event therefore keeps its place in the queue (records bit-identical); only
    # entries that did nothing at the current instant are left out (the process's end,
    # a wake-up nobody waited for).
    def _arm(self, delay: float | None) -> None:
        """Wait for a wake-up (``delay`` None) or for the first of a wake-up and ``delay`` seconds."""
        self._wgen += 1
        self._waiting, self._wtrig, self._ctrig = True, False, False
        self._timed = delay is not None
        if delay is not None:
            self.engine.call(delay, self._timer_fired, self._wgen)

    def wake(self) -> None:
        if self._waiting and not self._wtrig and not self._ctrig:
            self._wtrig = True
            self.engine.call(0.0, self._wake_fired, self._wgen)

    def _wake_fired(self, gen: int) -> None:
        if gen != self._wgen:
            return
        if not self._timed:
            self._resume(gen)
        elif not self._ctrig:  # the Condition triggers now, resumes one hop later
            self._ctrig = True
            self.engine.call(0.0, self._resume, gen)

    def _timer_fired(self, gen: int) -> None:
        if gen == self._wgen and self._waiting and not self._ctrig:
            self._ctrig = True
            self.engine.call(0.0, self._resume, gen)

    def _resume(self, gen: int) -> None:
        self._waiting = False
        self.run()

    def run(self) -> None:
        """The sender's loop from now until it waits again (or its transfer is done)."""
        env, s = self.env, self.sender
        while not s.done:
            if self.in_pass:
                if self.host._pending or self.host.redo is not None:
                    self.host.settle(self)
                if self.leave is None:  # the host lays the pass out at its next commit
                    self._arm(None)
                    return
                t_end = self.end_if_out()
                if t_end is not None:
                    self._arm(t_end - env.now)
                    return
            elif s.ready(env.now):
                self.begin_pass()
            else:
                t = s.get_timer()
                self._arm(None if t is None else max(0.0, t - env.now))
                return

    def end_if_out(self) -> float | None:
        """End the pass if its last slot has left the host by now (None); else when that slot leaves."""
        t_end = float(self.leave[-1])
        if self.env.now < t_end - 1e-12:
            return t_end
        self.in_pass = False
        self.b_end, self.b_used = t_end, self.n
        self.host.remove(self, t_end)
        self.take_until(self.n, t_end)
        return None

    def begin_pass(self) -> None:
        """Start a pass of the core's remaining datagrams and have the host lay it out."""
        self.n = pass_remaining(self.sender)
        self.npass += 1
        if self.n <= 0:
            raise RuntimeError(f"round {self.rnd}: the core is sending a pass of {self.n} datagrams")
        self.limit = self.n
        self.seqbuf = self.sender.pass_chunks  # slot i of the pass carries chunk seqbuf[i] (the core's view)
        self.leave, self.taken, self.in_pass = None, 0, True
        self.d_slot, self.d_t, self.dpos = _EMPTY_I, _EMPTY_F, 0
        self._quiet = -math.inf
        self.host.join(self)

    def take_until(self, m: int, t: float) -> None:
        """Have the core hand out the pass's first ``m`` slots."""
        k = m - self.taken
        if k <= 0:
            return
        b = self.sender.datagrams_to_send(t, limit=k)
        got = 0 if b is None else b.seqs.size
        if got != k:
            raise RuntimeError(f"round {self.rnd}: the core handed out {got} of the {k} datagrams left in its pass")
        self.taken = m  # they are seqbuf[taken:m] (the pass's chunks, read at its start)
        self.sim.datagrams += k
        if m == self.n:  # the pass is out: its PROBE follows the last datagram
            self.flush_sender(float(self.leave[-1]))

    def before_sender_msg(self, msg: ctl.Message, t: float) -> None:
        if not (isinstance(msg, ctl.Stop) and msg.round == self.rnd and self.in_pass):
            return
        self._quiet = -math.inf
        self.host.settle(self)
        self.ensure_fresh()
        self.in_pass = False
        if self.leave is None:
            self.host.remove(self, t)
            return
        # Batches of max_batch go to the kernel whole (transport.pump): every
        # batch taken before the STOP arrived leaves. A slot's batch is taken
        # one host interval before the batch's first slot leaves.
        m0 = int(self.leave.searchsorted(t + self.host.h, side="left"))
        b = self.engine.batch
        m = min(self.n, max(-(-m0 // b) * b, self.taken))
        self.take_until(m, t)
        self.limit = m
        was_ok = self.arr_ok and self.wait is None and self.ovf is None
        self.arr_ok = False
        self.b_end = max(t, float(self.leave[m - 1])) if m else t
        self.b_used = m
        self.host.remove(self, self.b_end)  # the host is free once they are out
        if not self.free and (self.queue.congested if not self.multi else any(q.congested for q in self.queues)):
            self.queue_update(t)
        else:  # nothing changes at the port but the end of this pass (of which a free path's ports know nothing)
            if not self.free:
                for k, q in enumerate(self.queues):
                    q.set(self, t, self._span(k))
            k = _slots_below(self.d_slot, m)
            self.d_slot, self.d_t = self.d_slot[:k], self.d_t[:k]
            # arrivals without waits, of the same leave times: cut at the new limit, they are what
            # port_refresh would rebuild (it need not)
            self.arr_ok = was_ok and self.wait is None and self.ovf is None

    def after_finish(self, t: float) -> None:
        self.host.settle(self)
        self.ensure_fresh()
        if self.dpos < self.d_slot.size:  # datagrams still in flight reach the receiver (stale there)
            self.engine.at(float(self.d_t[-1]), self._drain)

    def _drain(self, t: float) -> None:
        """Deliver what is in flight after the transfer ended, until nothing is (the port may move arrivals)."""
        self.deliver_until(t)
        if self.dpos < self.d_slot.size:
            self.engine.at(max(t, float(self.d_t[-1])), self._drain)

    # -- pacing: the core's TokenBucket in closed form over a pass ----------------------------
    def bucket_start(self, t0: float) -> None:
        eng = self.engine
        if self.b_t0 is None:
            tokens = eng.burst_bytes
        else:
            left = self.b_tokens0 + (self.b_end - self.b_t0) * eng.rate_Bps - self.b_used * eng.dgram_bytes
            tokens = min(eng.burst_bytes, max(left, 0.0) + max(0.0, t0 - self.b_end) * eng.rate_Bps)
        self.b_t0, self.b_tokens0 = t0, tokens

    def bucket_times(self, start: int, r: int) -> np.ndarray:
        """Earliest time the bucket lets each of slots ``start..start+r-1`` of the pass go (a new array).

        In place on one array from the engine's shared 1..r (slot + 1 as whole floats: exact), the
        same operations as ``b_t0 + max(0, (slot + 1) * bytes - tokens) / rate``: a paced host lays
        out every sender of a broadcast several times a round, and the temporaries were half its cost."""
        eng = self.engine
        need = eng.ones(r) + float(start)
        need *= eng.dgram_bytes
        need -= self.b_tokens0
        np.maximum(need, 0.0, out=need)
        need /= eng.rate_Bps
        if eng.wake_s:  # sender batching: the loop wakes every wake_s and sends what the bucket allows then
            need /= eng.wake_s
            np.ceil(need, out=need)
            need *= eng.wake_s
        need += self.b_t0
        return need

    # -- placement ----------------------------------------------------------------------------
    def laid_out(self, a: int, leave: np.ndarray, t: float) -> None:
        """The host set the leave times of slots ``a..n-1`` (all of them for a new pass)."""
        self._quiet = -math.inf
        path = self.path
        self._arr1 = None
        if self.leave is None:
            self.leave = leave
            self.arr_ok = False
            # the loss process's verdicts, at the arrival times the port gives now
            if not self.loss.procs:
                self.lossdrop = None
            elif not self.loss.time_based:
                self.lossdrop = self.loss.drops(self.engine.zeros(self.n), self.rnd)
            else:
                arr = leave + path.d1
                if self.multi:
                    rcv = self._through(arr)
                else:
                    wait = self.queue.wait(arr)
                    rcv = arr + self.queue.ser + path.d2
                    if wait is not None:
                        rcv = rcv + wait
                self.lossdrop = self.loss.drops(rcv, self.rnd)
            self.wait, self.ovf, self.u, self.fresh_t = None, None, None, -math.inf
            self.u_more = {}
        else:
            self.leave[a:] = leave
            self.arr_ok = False
        self.queue_update(t)
        self.wake()

    def _through(self, arr: np.ndarray) -> np.ndarray:
        """Arrival times at the receiver of datagrams reaching the first port at ``arr``,
        with each port's queueing wait (no overflow verdicts)."""
        delays = self.path.delays
        for k, q in enumerate(self.queues):
            w = q.wait(arr)
            arr = arr + q.ser + delays[k + 1]
            if w is not None:
                arr = arr + w
        return arr

    def _span(self, k: int = 0) -> tuple[float, float, float] | None:
        """The pass at the path's ``k``-th port: (first arrival, last arrival, rate).

        Further ports see it shifted by the fixed path delay to them and no
        faster than the slowest port before them lets it through."""
        if self.leave is None or self.limit == 0:
            return None
        lo = float(self.leave[0]) + self.path.d1
        hi = float(self.leave[self.limit - 1]) + self.path.d1
        dur = (hi - lo) * self.limit / (self.limit - 1) if self.limit > 1 else self.host.h
        if k:
            off, slow = self._hops[0][k]
            dur = max(dur, self.limit * slow)
            lo += off
            hi = lo + dur * (self.limit - 1) / self.limit
        return lo, hi, self.limit / max(dur, 1e-15)

    def queue_update(self, t: float) -> None:
        """Tell the port about this pass's (new) interval; re-evaluate what it changed."""
        if self.free:  # no queue can form on this path: the ports need not know, the arrivals follow the host
            self.port_refresh(t)
            return
        if not self.multi:
            others, removed = self.queue.set(self, t, self._span())
            self.port_refresh(t)
            if others and (removed or self.engine.eager):  # less load: the others' crossings may come sooner
                if self.engine.eager:
                    for f in list(self.queue.entries):
                        if f is not self:
                            f.less_load(t)
                else:  # the passes whose sender is done leave the port's watch for good
                    q = self.queue
                    watch = q.watch
                    if self.engine.owing and self.engine.any_owing():
                        # a host owes a re-layout: its passes are asked whatever their _quiet
                        for f in list(watch):
                            # (less_load's first test, inline: this is N per STOP)
                            if f is self or (t < f._qv and not f.host._pending and f.host.redo is None):
                                continue
                            if f.less_load(t):
                                del watch[f]
                    else:
                        # No host owes one: the passes less_load would not skip are those whose _quiet
                        # is at or before t, and the port's heap names them (with others whose item
                        # is stale), in the watch's order. Why: 1024 paced uploads, ~1,000 early STOPs a
                        # round each walking ~500 passes, nearly all of them quiet (see docs/scale.md).
                        due = q.fallen_due(t)
                        for f in due:
                            if f is self or t < f._qv:
                                continue
                            if f.less_load(t):
                                del watch[f]
                        for f in due:  # the ones still watched are asked again from their _quiet on
                            v = f._qv
                            if v < math.inf and f in watch:
                                q.recheck(f, v)
            # more load only delays the others: each re-checks when its crossing falls due
            return
        changed = []
        for k, q in enumerate(self.queues):
            others, removed = q.set(self, t, self._span(k))
            if others and (removed or self.engine.eager):
                changed.append(q)
        self.port_refresh(t)
        seen = {self}
        for q in changed:
            for f in list(q.entries):
                if f not in seen:
                    seen.add(f)
                    f.less_load(t)

    def less_load(self, t: float) -> bool | None:
        """Another pass took load off this pass's port at ``t``: its verdicts may improve, and the
        crossing that brings its receiver to ``need`` come sooner than scheduled.

        Re-evaluated now only if that crossing could come by ``t``; otherwise checked at the
        earliest time it could (:meth:`_crossing_bound`), which no port can bring forward. A later
        evaluation gives the same verdicts (the port keeps its profile before a change as it was,
        as for the lazy rule of more load); only the crossing's event must not come late. Why:
        with N passes on a congested port and N early STOPs a round (paced uploads at a tolerance
        of 40%), re-evaluating every pass at every STOP was O(N^2) evaluations a round
        (128 workers: 20 per STOP, 85% of the run). ``self.engine.eager`` re-evaluates at once, and so does
        a pass crossing several ports."""
        if self.engine.eager or self.multi:  # several ports: a slot's verdicts at the later ports are fixed when it
            self.port_refresh(t)      # reaches the first, so when they are taken matters (fast.py's docstring)
            return
        # Between the changes that reset _quiet (and while its host owes it no re-layout), the
        # bound only moves later (deliveries and evaluations can only make it so): a check armed
        # at _bound_at, or a crossing found final, still stands without computing it again (N
        # passes asked at each of N STOPs a round: most of them armed or final). A done sender's
        # pass leaves the port's watch (queue_update) for good, and so does the pass of a receiver
        # that has met ``need`` (its STOP sent): complete stays so for the round, its round number
        # only grows, so _crossing_bound's answer is inf from now on. Why: in the lockstep of paced
        # uploads the receivers complete a little before their senders hear the STOP, and each of
        # them was asked again at every STOP until then (1024 x 20: 153,000 of 188,000 questions).
        h = self.host
        if not h._pending and h.redo is None:
            if self.sender.done:  # no crossing to come (_crossing_bound's inf), for good: the caller
                return True       # need not ask again (a re-evaluation of a done pass changes nothing)
            if t < self._quiet:
                return None
            r = self.ep.receiver
            if r.round_no == self.rnd and r.complete:
                return True
        tb = self._crossing_bound()
        if tb <= t:
            self.port_refresh(t)
        elif tb < math.inf and (tb < self._bound_at or self._bound_at < t):
            self._bound_at = self._quiet = tb  # (a check armed for no later than tb still stands)
            self.engine.at(tb, self._bound_due)
        elif tb < math.inf:
            self._quiet = self._bound_at
        return None

    def _bound_due(self, t: float) -> None:
        if t >= self._bound_at:
            self._bound_at = math.inf
            self._quiet = -math.inf
        self.ensure_fresh()

    def _crossing_bound(self) -> float:
        """The earliest time this pass can bring its receiver to ``need`` (-inf: no bound,
        re-evaluate now; inf: nothing to do - the pass cannot bring it, or the receiver is not
        waiting for one, and whatever reads the pass's arrivals re-evaluates them first, as the
        lazy rule has it; or the crossing already waiting is final, below).

        The slots that reached the port before the pass's last evaluation (``fresh_t``) have their
        final verdicts (a port's profile before a change stays as it was): those of them that
        arrive are certain, those that do not are certainly lost. If they alone bring the
        receiver to ``need``, the crossing waiting at ``_x_at`` is the one every later evaluation
        gives (inf). Otherwise the crossing is at best the slot that brings it there were every
        later slot to arrive without waiting. Why: paced uploads at their fair share cross in
        lockstep with their crossing slots in the queue, and a bound counting every slot after the
        last delivered one as arriving (the rule before) fell due at once at every early STOP, so
        such a pass was re-evaluated ~10 times in its crossing (128 workers x 30, counted)."""
        if self.host._pending or self.host.redo is not None:
            return -math.inf
        r = self.ep.receiver
        if (self.leave is None or self.sender.done or not (r.active and r.round_no == self.rnd and not r.complete)
                or r.tolerance is None):
            return math.inf
        dl = r.deadline_s if r.stop_rule == "deadline" else math.inf  # R5b: no sooner than need's arrival (see the end)
        left = max(1, r.need - r.received) if dl < math.inf else r.stop_count - r.received
        if left <= 0:
            return -math.inf
        dpos = self.dpos
        first = int(self.d_slot[dpos - 1]) + 1 if dpos else 0  # the first slot not delivered
        j = first + left - 1  # the crossing's slot were every slot from `first` on to arrive
        if j >= self.limit:
            return math.inf
        # slots reaching the port before the last evaluation (a nanosecond's margin: fewer is safe)
        m = int(self.leave.searchsorted(self.fresh_t - self.path.d1 - 1e-9, side="left"))
        if m > first:
            m = min(m, self.limit)
            got = _slots_below(self.d_slot, m) - dpos  # of them, those that arrive, undelivered
            if got >= left:
                if float(self.d_t[dpos + left - 1]) == self._x_at:
                    self._x_fin, self._quiet = self._x_at, math.inf
                    return math.inf  # final, and its event is waiting
            else:
                j = m + left - got - 1
                if j >= self.limit:
                    return math.inf
        tb = float(self.leave[j]) + self.c_total
        if dl < math.inf:  # ... nor before the deadline, unless every chunk can come first
            at = (r.deadline_at if r.received else float(self.leave[first]) + self.c_total + dl) - 1e-9
            ja = first + r.stop_count - r.received - 1  # (before the PROBE, stop_count is every chunk)
            tb = max(tb, at) if ja >= self.limit else min(float(self.leave[ja]) + self.c_total, max(tb, at))
        return tb

    def _version(self) -> int:
        """Changes whenever one of the path's ports changes (versions only grow)."""
        if not self.multi:
            return self.queue.version
        return sum(q.version for q in self.queues)

    def ensure_fresh(self) -> None:
        """Re-evaluate the port's verdicts if the port changed since they were computed."""
        if self.leave is not None and self.qver != (self._version() if self.multi else self.queue.version):
            self.port_refresh(self.env.now)

    def port_settle(self, t: float) -> None:
        """The port forgets this pass (it is over there): take the final verdicts first."""
        self.ensure_fresh()

    def port_refresh(self, t: float) -> None:
        """Re-evaluate the port's verdicts on the slots still to reach it, and the arrivals."""
        leave = self.leave
        if leave is None:
            return
        path, limit = self.path, self.limit
        b = 0 if self.fresh_t == -math.inf else _count_le(leave, self.fresh_t - path.d1, limit)
        self.fresh_t, self.qver = self.env.now, (self._version() if self.multi else self.queue.version)
        wait = ovf = None
        into = False  # the verdicts were written into the pass's arrays already
        if b < limit:
            if self.multi:
                wait, ovf = self._outcomes(b)
            elif not self.queue.quiet_after(float(leave[b]) + path.d1):
                arr = self._arr1
                if arr is None:  # the slots' arrival times at the port, kept until the next layout
                    arr = self._arr1 = leave + path.d1
                # the verdicts straight into the pass's arrays where it has them (scratch otherwise)
                sw, so = self.wait, self.ovf
                nb = limit - b
                w_out = sw[b:limit] if sw is not None else self.engine.scratch_wait(nb)
                o_out = so[b:limit] if so is not None else self.engine.scratch_ovf(nb)
                u = self.u if self.u is not None else self._draws(0)
                got = self.queue.outcome_into(arr[b:limit], u[b:limit], w_out, o_out)
                if sw is None and got & 1:
                    self.wait = np.zeros(self.n)
                    self.wait[b:limit] = w_out
                if so is None and got & 2:
                    self.ovf = np.zeros(self.n, bool)
                    self.ovf[b:limit] = o_out
                into = True
        if not into and (wait is not None or self.wait is not None):
            if self.wait is None:
                self.wait = np.zeros(self.n)
            self.wait[b:limit] = 0.0 if wait is None else wait
        if not into and (ovf is not None or self.ovf is not None):
            if self.ovf is None:
                self.ovf = np.zeros(self.n, bool)
            self.ovf[b:limit] = False if ovf is None else ovf
        if self.arr_ok and self.wait is None and self.ovf is None:
            # no wait or drop at the port, now or at the last evaluation, and the same leave
            # times: the arrivals would be rebuilt exactly as they are
            self.schedule_crossing()
            return
        # arrivals: keep those before slot b, rebuild from b on
        d_slot = self.d_slot
        keep = _slots_below(d_slot, b)
        every = False  # the arrivals are every slot from b on (no gather needed for d_slot)
        if _c_fluid_arrivals is not None and (self.lossdrop is not None or self.ovf is not None
                                              or self.wait is not None):
            # the same arrivals (dblp/_fastpath_c/fluid.c), in one loop instead of the numpy calls below
            idx, t_rx = np.empty(limit - b, np.int64), np.empty(limit - b)
            m = _c_fluid_arrivals(leave, b, limit, self.c_total, self.lossdrop, self.ovf, self.wait,
                                  float(self.d_t[keep - 1]) if keep else -math.inf, idx, t_rx)
            idx, t_rx = idx[:m], t_rx[:m]
        else:
            ok = None
            if self.lossdrop is not None:
                ok = ~self.lossdrop[b:limit]
            if self.ovf is not None:
                o = ~self.ovf[b:limit]
                ok = o if ok is None else (ok & o)
            c = self.c_total
            if ok is None:
                every = True
                idx = self.engine.iota(limit)[b:]  # a read-only view: d_slot is never written in place
                t_rx = leave[b:limit] + c
                if self.wait is not None:
                    t_rx += self.wait[b:limit]
            else:
                idx = ok.nonzero()[0]  # np.flatnonzero without its wrapper (1-d)
                idx += b
                t_rx = leave[idx]
                t_rx += c
                if self.wait is not None:
                    t_rx += self.wait[idx]
            # FIFO: a datagram never arrives before one sent ahead of it on the same path. A path of
            # several ports is re-evaluated port by port, which can leave arrivals a hair out of order;
            # delivery (deliver_until's searchsorted, _drain) needs them sorted, else it waits forever.
            # Without a queueing wait they are sorted already: the host's leave times are (each layout
            # continues after the slots already out), and the path adds the same constant to each.
            if t_rx.size:
                if self.wait is not None:
                    np.maximum.accumulate(t_rx, out=t_rx)
                if keep and t_rx[0] < self.d_t[keep - 1]:
                    np.maximum(t_rx, self.d_t[keep - 1], out=t_rx)
        if keep:
            if every and keep == b and int(d_slot[keep - 1]) == keep - 1:
                self.d_slot = self.engine.iota(limit)  # slots 0..b-1 kept, b.. added: every slot (no gather)
            else:
                self.d_slot = np.concatenate((d_slot[:keep], idx))
            self.d_t = np.concatenate((self.d_t[:keep], t_rx))
        else:
            self.d_slot, self.d_t = idx, t_rx
        self.arr_ok = True
        self.schedule_crossing()

    def dep_last(self) -> float | None:
        """When the pass's last datagram that got into the port leaves it."""
        self.host.settle(self)
        if self.leave is None or self.limit == 0:
            return None
        self.ensure_fresh()
        j = self.limit - 1
        if self.ovf is not None:  # the last slot the port did not drop
            j -= int(self.ovf[j::-1].argmin())  # (the first False from the end)
            if self.ovf[j]:
                return None
        w = 0.0 if self.wait is None else float(self.wait[j])
        if self.multi:  # when it leaves the path's last port
            return float(self.leave[j]) + self.c_total + w - self.path.delays[-1]
        return float(self.leave[j]) + self.path.d1 + w + self.queue.ser

    def _draws(self, k: int) -> np.ndarray:
        """Each slot's uniform draw for the overflow verdict at the path's ``k``-th port:
        one stream per pass and port, so verdicts do not depend on when or how often they are taken."""
        if k == 0:
            if self.u is None:
                self.u = _uniforms([self.engine.seed, 0x9047, self.direction, self.worker, self.rnd, self.npass], self.n)
            return self.u
        u = self.u_more.get(k)
        if u is None:
            u = self.u_more[k] = _uniforms(
                [self.engine.seed, 0x9047, self.direction, self.worker, self.rnd, self.npass, k], self.n)
        return u

    def _outcomes(self, b: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Waits (summed over the ports) and overflow drops (at any port) of slots ``b..limit-1``
        crossing the ports in turn, each port's departures the next one's arrivals."""
        delays = self.path.delays
        arr = self.leave[b : self.limit] + delays[0]
        wait = ovf = None
        for k, q in enumerate(self.queues):
            if not q.quiet_after(float(arr[0])):
                w, o = q.outcome(arr, self._draws(k)[b : self.limit])
                if w is not None:
                    arr = arr + w
                    wait = w if wait is None else wait + w
                if o is not None:
                    ovf = o if ovf is None else (ovf | o)
            arr = arr + (q.ser + delays[k + 1])
        return wait, ovf

    # -- the receiver side -------------------------------------------------------------------
    def schedule_crossing(self) -> None:
        """Wake at the arrival that brings the receiver to its ``need`` (if this pass has it)."""
        r = self.ep.receiver
        self.xgen += 1
        self._x_at = math.inf
        if not (r.active and r.round_no == self.rnd and not r.complete) or r.tolerance is None:  # not open
            return
        left = r.stop_count - r.received
        if r.stop_rule == "deadline":  # R5b: the first arrival at the deadline with need held, if sooner
            left = r.stop_arrival(self.d_t[self.dpos:]) or left
        if 0 < left <= self.d_slot.size - self.dpos:
            t_x = float(self.d_t[self.dpos + left - 1])
            self._x_at = t_x
            self.engine.at(t_x, self._crossing, self.xgen)
        if self._quiet == math.inf and self._x_at != self._x_fin:  # not the crossing found final
            self._quiet = -math.inf

    def _crossing(self, t: float, gen: int) -> None:
        if gen == self.xgen:
            self._x_at = math.inf
            if self._quiet == math.inf:
                self._quiet = -math.inf
            self.deliver_until(t)

    def tolerance_changed(self, t: float) -> None:
        self._quiet = -math.inf
        self.host.settle(self)
        self.ensure_fresh()
        self.schedule_crossing()

    def deliver_until(self, t: float) -> None:
        """Give the receiver every datagram that has arrived by ``t``, at its arrival time."""
        if self.host._pending or self.host.redo is not None:  # settle and ensure_fresh, without two calls
            self.host.settle(self)
        if self.leave is not None and self.qver != (self._version() if self.multi else self.queue.version):
            self.port_refresh(self.env.now)
        d_t, dpos = self.d_t, self.dpos
        if dpos >= d_t.size or t < d_t[dpos]:
            return  # nothing (more) has arrived
        hi = d_t.size if t >= d_t[-1] else int(d_t.searchsorted(t, side="right"))
        r = self.ep.receiver
        rnd = self.rnd
        while self.dpos < hi:
            lo = self.dpos
            j = hi
            if r.active and r.round_no == rnd and not r.complete:  # the receiver's round is open
                if r.received == 0:
                    j = lo + 1  # alone, so the core's t_first is its arrival time
                elif r.tolerance is not None:  # up to the one that meets need (R5b deadline: or the deadline)
                    k = r.stop_arrival(self.d_t[lo:hi]) if r.stop_rule == "deadline" else 0
                    j = min(hi, lo + max(1, k or r.stop_count - r.received))
            when = float(self.d_t[j - 1])
            s0, s1 = int(self.d_slot[lo]), int(self.d_slot[j - 1])
            self.take_until(s1 + 1, when)
            if s1 - s0 + 1 == j - lo:  # no gaps: a view, not a gather
                seqs = self.seqbuf[s0 : s1 + 1]
            else:
                seqs = self.seqbuf[self.d_slot[lo:j]]
            r.receive_chunks(self.rnd, seqs, when)
            self.dpos = j
            self.ep.after(when)
