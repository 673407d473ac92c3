"""The synchronised incast at flow level: the first iteration's uploads of an unpaced star, one
event per pass instead of one array of datagrams per pass and port.

Why: on the default star (one 10 Gbit/s server link, workers sending at 200k datagrams/s) the
first iteration's N uploads start at one instant and meet at the server's port at N times its
rate. Each pass gets ~1/N of its datagrams through; an upload of 1M floats takes ~725 passes at
1024 workers, 742,000 passes in the iteration, and the round level (:mod:`dblp.sim.engines.fast`) walks
each one through the host layout, the port's fluid profile over all N passes, a random stream of
its own and the core's batches: 219 s of the 230 s of a 1024 x 100 run. Nothing the records hold
depends on which datagrams a pass carries or on the port's queue slot by slot: per worker they
hold its passes, datagrams sent, the receiver's first and threshold-crossing times and the
received and stale counts.

The model (:func:`simulate_incast`). Every upload is one sender on its own host (one every
``h`` seconds: a pass of ``m`` datagrams is a constant rate ``1/h`` at the port for ``m h``
seconds, as the round level sees a pass); the port is the same fluid drop-tail queue as
:class:`dblp.sim.network.net.FluidQueue` (capacity ``cap``, buffer ``qcap`` datagrams; while the buffer
is full an arrival gets in with probability ``cap / offered``), stepped forward from event to
event in time order by :func:`dblp.sim.network.net.fluid_step`, O(1) per event. A pass delivers a binomial draw of its
datagrams with the mean acceptance over its interval (the round level draws each datagram
against the same probability). Its PROBE leaves behind the last datagram (FIFO through the
queue), the BITMAP comes back on the idle reverse path, and the core decides the next pass and
its start (R3, R8's backoff): :meth:`dblp.protocol.core.RoundSender.count_to_send` and
:meth:`~dblp.protocol.core.RoundSender.handle_count_reply`, the count-level forms of its batch and bitmap
calls, so every protocol rule still comes from :mod:`dblp.protocol.core`. The pass that brings the
receiver to ``need`` places its crossing at the expected position of that datagram among the
pass's accepted ones; the STOP then takes the ordinary control path, and a STOP that reaches
the sender before its pass is out cuts it to whole batches as the round level does.

What it leaves out, and why that is safe for the records: which chunks arrive (the receiver
gets the round's first ``received`` chunks in send order - counts and times do not depend on
identity, as the round level's ``inorder`` shortcut already argues); the port's load of a pass
cut by an early STOP (its last pass only); the final PROBE's answer (a STOP to a sender that is
done). ``tests/sim/test_incast.py`` holds it to the round level's walk on incasts of 8-64
workers (round time, passes, datagrams, received fractions; tolerances stated there).

When it applies (:func:`incast_group`): ``SimConfig.incast`` "flow" or "auto" (the latter from
:data:`AUTO_MIN_WORKERS` workers on, where the walk costs seconds; smaller runs keep their
records bit for bit); the star with one parameter server; unpaced senders; no loss process; no
compute jitter (so the first iteration's uploads all start at once); ``group`` 1; and the
server's port overloaded (the workers together send faster than it drains). Only the first
iteration: from the second on the broadcast, one host's round-robin, has spread the workers'
starts over the broadcast's length and the walk costs little (~0.1 s an iteration at 1024).
``incast="walk"`` keeps the round level's walk everywhere (the reference).
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import RoundSender
from dblp.sim.engines.flow import Endpoint, FlowBase
from dblp.sim.network.net import Path, fluid_step

#: from this many workers on, ``incast="auto"`` takes the flow-level model (below it the walk
#: costs well under a second an iteration, and the records of small runs stay as pinned)
AUTO_MIN_WORKERS = 128


def not_applicable(sim: Any) -> str | None:
    """Why the flow-level incast cannot stand for the walk in this run (None: it can)."""
    cfg = sim.cfg
    if cfg.fidelity != "round":
        return "the packet level walks every datagram"
    if cfg.topology != "star" or cfg.shards != 1:
        return "only the star with one parameter server"
    if cfg.send_rate_bps:
        return "paced senders"
    if cfg.compute_jitter_s:
        return "compute jitter (the uploads do not start at once)"
    if cfg.group != 1:
        return "group > 1"
    if getattr(cfg, "stop_rule", "early") != "early":
        return "a stop rule other than the paper's early stop"
    if any(sim.loss[(ctl.UP, f)].procs for f in range(cfg.workers)):
        return "a loss process on the uploads"
    paths = sim.up_paths
    port, host0 = paths[0].port, paths[0].host
    if any(p.port is not port or p.more or p.host.interval_s != host0.interval_s for p in paths):
        return "the uploads do not share one port from equal hosts"
    cap = 1.0 / port.ser(cfg.wire_bytes)
    if cfg.workers / host0.interval_s <= cap * (1 + 1e-9):
        return "the server's port is not overloaded (no incast)"
    return None


def incast_group(engine: Any) -> "IncastGroup | None":
    """The first iteration's incast group of ``engine``'s run, or None where the walk stays."""
    sim = engine.sim
    mode = sim.cfg.incast
    if mode == "walk" or (mode == "auto" and sim.cfg.workers < AUTO_MIN_WORKERS):
        return None
    if not_applicable(sim) is not None:
        return None
    return IncastGroup(engine)


class IncastFlow(FlowBase):
    """One worker's first-iteration upload, carried by its :class:`IncastGroup`: the data path
    is the group's model; the control messages after it (STOP) take the ordinary paths."""

    def __init__(self, group: "IncastGroup", sim: Any, sender: RoundSender, ep: Endpoint, path: Path,
                 rpath: Path, direction: int, worker: int, rnd: int) -> None:
        FlowBase.__init__(self, sim, sender, ep, path, rpath, direction, worker, rnd)
        self.group = group

    def dep_last(self) -> float | None:
        """(RoundEngine.send_ctrl asks of a PROBE's flow) the group's PROBEs are its own: none here."""
        return None


class IncastGroup:
    """The N uploads of the first iteration: collected as they start (all at one instant), then
    simulated at once by :func:`simulate_incast`; what each worker's receiver and sender see is
    queued at its simulated time."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.sim = engine.sim
        self.flows: list[IncastFlow] = []
        self.t0: float | None = None
        self.done = False

    def takes(self, direction: int, rnd: int) -> bool:
        return not self.done and direction == ctl.UP and rnd == 0

    def start_flow(self, sender: RoundSender, ep: Endpoint, path: Path, rpath: Path, direction: int,
                   worker: int, rnd: int) -> IncastFlow:
        now = self.sim.env.now
        if self.t0 is None:
            self.t0 = now
        elif now != self.t0:
            raise RuntimeError(f"incast: upload {worker} started at {now!r}, the first at {self.t0!r} "
                               f"(the flow-level incast needs them at one instant; incast='walk' avoids it)")
        f = IncastFlow(self, self.sim, sender, ep, path, rpath, direction, worker, rnd)
        self.flows.append(f)
        if len(self.flows) == self.sim.cfg.workers:
            self.done = True
            self._run()
        return f

    def _run(self) -> None:
        eng, sim = self.engine, self.sim
        flows = sorted(self.flows, key=lambda f: f.worker)
        path, rpath = flows[0].path, flows[0].rpath
        q = eng.fluid(path.port)
        r0 = flows[0].ep.receiver
        if r0.tolerance is None:
            raise RuntimeError("incast: the server's receivers have no tolerance at the upload's start")
        need = r0.need
        lay = r0.layout
        probe_w = eng.ctrl_wire(ctl.Probe(0, ctl.UP, 1))
        bitmap_w = eng.ctrl_wire(ctl.Bitmap(0, ctl.UP, 0, bytes(-(-lay.chunks // 8))))
        stop_w = eng.ctrl_wire(ctl.Stop(0, ctl.UP, 0))
        res = simulate_incast(
            [f.sender for f in flows], self.t0, need,
            h=path.host.interval_s, d1=path.d1, d2=path.d2, ser=q.ser, qcap=q.qcap,
            probe_out=probe_w * 8.0 / path.host.nic_bps + path.d1,
            probe_tail=path.port.ser(probe_w) + path.d2 + path.ctrl_overhead_s,
            bitmap_back=rpath.ctrl_base_delay(bitmap_w), stop_back=rpath.ctrl_base_delay(stop_w),
            batch=eng.batch, seed=[sim.cfg.seed, 0x1CA5, flows[0].rnd])
        sim.datagrams += int(res["sent"].sum())
        for k, f in enumerate(flows):
            t_first, t_cross, stale = float(res["t_first"][k]), float(res["t_cross"][k]), int(res["stale"][k])
            eng.at(t_cross, self._cross, (f, t_first, need, stale))

    @staticmethod
    def _cross(t: float, arg: tuple) -> None:
        """The datagram that brings the receiver to ``need`` arrives: the receiver gets the round's
        first ``need`` chunks (the first alone, at its own arrival time, so the core's t_first is
        exact), sends its STOP (R5) through the ordinary path, then counts the pass's datagrams
        still in flight as stale (R9)."""
        f, t_first, need, stale = arg
        r = f.ep.receiver
        order = f.sender.order
        if need > 1:
            r.receive_chunks(f.rnd, order[:1], t_first)
        r.receive_chunks(f.rnd, order[1 if need > 1 else 0 : need], t)
        f.ep.after(t)
        if stale:
            r.receive_chunks(f.rnd, order[need : need + stale], t)


def simulate_incast(senders: list[RoundSender], t0: float, need: int, *, h: float, d1: float, d2: float,
                    ser: float, qcap: float, probe_out: float, probe_tail: float, bitmap_back: float,
                    stop_back: float, batch: int, seed: list[int]) -> dict[str, np.ndarray]:
    """N senders' uploads, all starting at ``t0``, through one fluid drop-tail port (module docstring).

    ``h``: a host's seconds per datagram; ``d1``/``d2``: propagation to and from the port; ``ser``:
    the port's seconds per datagram, ``qcap`` its buffer in datagrams; ``probe_out``: a PROBE's
    NIC time and propagation to the port, ``probe_tail`` its serialisation, propagation and
    processing after it; ``bitmap_back``/``stop_back``: a BITMAP's and a STOP's delay on the idle
    reverse path; ``batch``: datagrams per core call (an early STOP lets whole batches out).

    The senders are driven through their passes here (their core state ends where the STOP
    finds it). Returns per sender: ``t_first`` and ``t_cross`` (the receiver's first arrival
    and its arrival of the ``need``-th chunk), ``stale`` (its pass's accepted datagrams after
    that), ``sent``, ``passes``, ``early`` (the STOP reached it mid-pass).
    """
    n_s = len(senders)
    cap = 1.0 / ser
    c_total = d1 + ser + d2
    rng = np.random.default_rng(seed)
    binom = rng.binomial
    uniform = random.Random(int(rng.integers(1 << 62))).random  # one float per pass: the stdlib's is cheaper
    recv = [0] * n_s
    acc_at = [0.0] * n_s  # the acceptance integral at each sender's pass start
    t_cross = np.full(n_s, math.nan)
    t_first = np.full(n_s, math.nan)
    stale = np.zeros(n_s, np.int64)
    early = np.zeros(n_s, bool)
    # events at the port: (time, kind 0 start / 1 end, sender, host time of the pass's start, datagrams)
    resumed = [False] * n_s  # the sender's next pass begins after a backoff (the core starts it at its first datagram)
    ev = [(t0 + h + d1, 0, i, t0, s.pass_remaining) for i, s in enumerate(senders)]
    heapq.heapify(ev)
    pop, push, step = heapq.heappop, heapq.heappush, fluid_step
    t, qlen, active, acc = t0 + h + d1, 0.0, 0, 0.0  # clock, queue (datagrams), passes offering, integral
    while ev:
        tn, kind, i, ts, m = pop(ev)
        dt = tn - t
        if dt > 0.0:  # the queue from t to tn at the offered rate of the active passes
            a = active / h
            qlen, whole = step(qlen, qcap, cap, a, dt)
            acc += dt if whole >= dt else whole + (dt - whole) * cap / a
            t = tn
        if kind == 0:
            active += 1
            acc_at[i] = acc
            push(ev, (tn + m * h, 1, i, ts, m))
            continue
        active -= 1
        p = (acc - acc_at[i]) / (h * m)  # the pass's mean acceptance
        got = int(binom(m, p if p < 1.0 else 1.0))
        s = senders[i]
        te = ts + m * h  # the pass's last datagram leaves the host
        wait = qlen * ser
        r0 = recv[i]
        if got and r0 == 0:  # the receiver's first datagram: the expected slot of the pass's first accepted one
            j1 = max(1, round((m + 1) / (got + 1)))
            t_first[i] = ts + j1 * h + c_total + (wait if j1 > 1 or ts > t0 else 0.0)
        if r0 + got >= need:  # the receiver reaches need during this pass
            left = need - r0
            j = min(m, max(left, round(left * (m + 1) / (got + 1))))  # that datagram's slot (1-based)
            tc = ts + j * h + c_total + wait
            t_cross[i] = tc
            recv[i] = need
            m_out = m
            t_stop = tc + stop_back
            if t_stop < te:  # the STOP finds the pass under way: whole batches of what left by then
                m0 = min(m, max(0, math.ceil((t_stop - ts) / h)))
                m_out = min(m, max(-(-m0 // batch) * batch, j))
                early[i] = m_out < m
            s.count_to_send(ts + h, 1)
            if m_out > 1:
                s.count_to_send(ts + m_out * h, m_out - 1)
            s.control_to_send()  # its PROBE (if the pass is out) meets a receiver that has stopped
            stale[i] = max(0, round(got * m_out / m) - left)
            continue
        if resumed[i]:  # the pass starts (R8) at its first datagram, so the wait it ends is counted to then
            s.count_to_send(ts + h, 1)
            if m > 1:
                s.count_to_send(te, m - 1)
        else:
            s.count_to_send(te, m)
        s.control_to_send()  # the PROBE: timed below
        recv[i] = r0 + got
        # FIFO behind the pass's last datagram that got into the queue (none: the PROBE's own way). With ~1/N of
        # a pass getting in, that one is often well before the pass's end: its slot is drawn as the last of
        # `got` uniform ones (an expected slot would bias the wait low: it enters through a max)
        t_probe = te + probe_out
        if got:
            t_probe = max(t_probe, ts + math.ceil(m * uniform() ** (1.0 / got)) * h + d1 + wait + ser)
        t_probe += probe_tail
        t_bitmap = t_probe + bitmap_back
        t_next = s.handle_count_reply(recv[i], t_bitmap)  # R3, R8: the next pass now or after a backoff
        resumed[i] = t_next != t_bitmap
        push(ev, (t_next + h + d1, 0, i, t_next, s.pass_remaining))
    return {"t_first": t_first, "t_cross": t_cross, "stale": stale, "early": early,
            "sent": np.array([s.stats.sent for s in senders], np.int64),
            "passes": np.array([s.stats.passes for s in senders], np.int64)}


def compare_first_iteration(walk: Any, flow: Any) -> dict[str, float]:
    """How far a flow-level run's first iteration is from the walk's (two ``SimResult``s of one
    configuration): relative differences of the end time and of the workers' mean round time,
    upload latency, passes and datagrams sent, and the largest difference of a worker's received
    fraction (absolute). What ``tests/sim/test_incast.py`` holds and ``scenarios/bench_sim.py
    --only-incast`` prints."""
    def means(res: Any) -> dict[str, float]:
        wk = [r for r in res.records if r.role == "worker" and r.round == 0]
        return {"end": res.end_time_s,
                "round": float(np.mean([r.round_latency_s for r in wk])),
                "up": float(np.mean([r.up_latency_s for r in wk])),
                "passes": float(np.mean([r.up_passes for r in wk])),
                "sent": float(np.mean([r.up_sent for r in wk]))}

    a, b = means(walk), means(flow)
    out = {k: b[k] / a[k] - 1.0 for k in a}
    fa = {r.worker: r.up_received / r.chunks for r in walk.records if r.role == "worker" and r.round == 0}
    fb = {r.worker: r.up_received / r.chunks for r in flow.records if r.role == "worker" and r.round == 0}
    out["received_frac"] = max(abs(fb[w] - fa[w]) for w in fa)
    return out
