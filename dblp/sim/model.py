"""The simulated parameter server and workers: SimPy processes driving the same sessions.

The server process drives a :class:`dblp.session.ServerSession` and each
worker process a :class:`dblp.session.WorkerSession` - the very objects the
socket server and worker drive - so the round logic (and the records) cannot
differ from the real ones; only the I/O and the clock do:

* **server**, round k: wait until every worker's upstream receiver holds
  ceil((1-p) n) chunks (the core's STOP rule), close those rounds, reduce
  (``reduce_s``), feed the mean's norm to the tolerance policy (CLR
  detection) for ``p_down``, announce ROUND(k, down, p_down) and start one
  :class:`~dblp.core.RoundSender` per worker; as each broadcast sender is
  stopped, write that worker's server record and open its upstream receiver
  for round k+1 under the policy's current tolerance (ROUND(k+1, up)).
* **worker**: compute (``compute_s``), wait for ROUND(k, up), open the
  broadcast receiver (tolerance comes with ROUND(k, down)), send its gradient
  with a RoundSender until STOP, wait for the broadcast, write its record.

The datagrams and control messages between the core objects are carried by
an engine: :class:`dblp.sim.packet.PacketEngine` (one event per datagram) or
:class:`dblp.sim.fast.RoundEngine` (numpy per retransmission pass). Neither
holds a protocol rule: thresholds, STOP, bitmaps, passes, backoff, stale
datagrams all come from :mod:`dblp.core` and :mod:`dblp.policy`.

Both write the sessions' :class:`dblp.records.RoundRecord` rows with
``source="simulation"`` (one per round and worker and role); times are
simulated seconds since the start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import simpy

from .. import control as ctl
from ..gradients import read_norms, synthetic_norms
from ..records import RecordWriter, RoundRecord
from ..session import ControlToSend, RecordContext, RecordWritten, SenderStarted, ServerSession, WorkerSession
from ..wire import ChunkLayout, ParameterError
from .config import SimConfig
from .flow import Endpoint
from .loss import make_flow_loss
from .net import ctrl_wire_bytes
from .topology import build_network, wan_loss_spec

RUN_ID = 0x51A1_0001
SOURCE = "simulation"


@dataclass
class _Worker:
    wid: int
    session: WorkerSession  # the worker's Algorithm 4
    up_ep: Endpoint  # server side: receives this worker's gradient
    down_ep: Endpoint  # worker side: receives the broadcast
    up_wait: Any = None  # event fired when ROUND(k, up) arrives
    finish_wait: Any = None  # event fired when COMMON(k) arrives (session S7)


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord]
    end_time_s: float
    wall_s: float
    datagrams: int  # datagrams put on the simulated wire
    events: int  # SimPy events processed (packet level: ~2 per datagram)

    def summary(self) -> dict:
        return summarize(self.records, self.end_time_s)


class Simulation:
    def __init__(self, cfg: SimConfig, *, records: str | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.env = simpy.Environment()
        self.layout = cfg.layout  # the real one: records, wire sizes
        self.core_layout = self.layout  # the one the core objects run on (coarser with group > 1)
        if cfg.group > 1:
            units = math.ceil(self.layout.chunks / cfg.group)
            self.core_layout = ChunkLayout(units * self.layout.chunk_floats, self.layout.mtu, key=self.layout.key)
        self._scale = self.layout.chunks / self.core_layout.chunks
        self._extra = {"group": cfg.group} if cfg.group > 1 else {}
        self._bursts: dict[int, bool] = {}
        self.n = cfg.workers
        self.policy = cfg.make_policy()
        self.norms = load_norms(cfg)
        self._compute_rng = np.random.default_rng([cfg.seed, 0xC0DE])
        self.records: list[RoundRecord] = []
        self._writer = RecordWriter(records) if records else None
        self.datagrams = 0
        # -- topology: the paper's star, leaf-spine or two sites (dblp.sim.topology) ---------------
        net = build_network(cfg)
        self.server_host, self.worker_hosts = net.server_host, net.worker_hosts
        self.up_paths, self.down_paths = net.up_paths, net.down_paths
        wan = wan_loss_spec(cfg)
        self.loss = {
            (direction, i): make_flow_loss(cfg.loss + wan if net.remote[i] else cfg.loss, seed=cfg.seed,
                                           direction=direction, worker=i, rounds=cfg.rounds)
            for direction in (ctl.UP, ctl.DOWN)
            for i in range(self.n)
        }
        if cfg.fidelity == "packet":
            from .packet import PacketEngine

            self.engine: Any = PacketEngine(self)
        else:
            from .fast import RoundEngine

            self.engine = RoundEngine(self)
        ctx = RecordContext(source=SOURCE, policy=self.policy.name, order=cfg.order,
                            send_rate_bps=cfg.send_rate_bps, scale=self._scale)
        core_order, seed = self.engine.core_order, cfg.seed
        self.server = ServerSession(
            self.core_layout, range(self.n), policy=self.policy, run_id=RUN_ID, context=ctx, order=core_order,
            seed=seed, rounds=cfg.rounds, values=False, max_batch=cfg.max_batch,
            pacer=lambda w: self.engine.pacer(ctl.DOWN, w), consistency=cfg.consistency)
        self.workers = []
        for i in range(self.n):
            ws = WorkerSession(self.core_layout, i, run_id=RUN_ID, context=ctx, order=core_order, seed=seed,
                               pacer=self.engine.pacer(ctl.UP, i), max_batch=cfg.max_batch,
                               consistency=cfg.consistency)
            self.workers.append(_Worker(i, ws, Endpoint(self, self.server.receiver(i)), Endpoint(self, ws.receiver)))
        self.env.process(self._server())
        for w in self.workers:
            self.env.process(self._worker(w))

    # -- helpers -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(t)`` at simulated time ``t`` (now if ``t`` is in the past)."""
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(t))

    def ctrl_wire(self, msg: ctl.Message) -> int:
        n = len(ctl.encode(msg))
        if isinstance(msg, ctl.Bitmap) and self.core_layout is not self.layout:
            n += math.ceil(self.layout.chunks / 8) - len(msg.bits)  # the real bitmap's size
        return ctrl_wire_bytes(n)

    def count(self, count: int) -> int:
        """A count of core chunks as datagrams (differs only with group > 1)."""
        return count if self._scale == 1.0 else int(round(count * self._scale))

    def _compute_time(self) -> float:
        c = self.cfg.compute_s
        if self.cfg.compute_jitter_s:
            c = max(0.0, c + self.cfg.compute_jitter_s * float(self._compute_rng.standard_normal()))
        return c

    def _write(self, rec: RoundRecord) -> None:
        self.records.append(rec)
        if self._writer:
            self._writer.write(rec)

    def burst(self, rnd: int) -> bool:
        """Whether an iteration-keyed burst hits iteration ``rnd`` (records' extra["burst"])."""
        b = self._bursts.get(rnd)
        if b is None:
            b = self._bursts[rnd] = any(p.burst(rnd) for p in self.loss.values())
        return b

    # -- the server: dblp.session.ServerSession over SimPy ------------------------------------
    def _dispatch_server(self, t: float) -> None:
        """Carry out the server session's events at simulated time ``t``."""
        while (ev := self.server.next_event()) is not None:
            if isinstance(ev, ControlToSend):
                w = self.workers[ev.worker]
                if isinstance(ev.message, ctl.RoundStart) and ev.message.direction == ctl.UP:
                    w.up_ep.opened(t)  # the session opened this worker's next upstream (S1)
                self.engine.send_ctrl(self.down_paths[w.wid], ev.message, t,
                                      lambda m, tt, w=w: self._on_control(w, m, tt), None)
            elif isinstance(ev, SenderStarted):
                w = self.workers[ev.worker]
                flow = self.engine.start_flow(ev.sender, w.down_ep, self.down_paths[w.wid], self.up_paths[w.wid],
                                              ctl.DOWN, w.wid, ev.sender.round_no)
                flow.done.callbacks.append(lambda e, w=w: self._down_done(w, e.value))
                self._dones.append(flow.done)
            elif isinstance(ev, RecordWritten):
                self._write(ev.record)

    def _on_held(self, w: _Worker, msg: ctl.Message, t: float) -> None:
        self.server.handle_control(w.wid, msg, t)
        self._dispatch_server(t)

    def _down_done(self, w: _Worker, t: float) -> None:
        w.up_ep.before_open(t)
        self.server.poll(t, w.wid)  # S4: the record, then this worker's next upstream
        self._dispatch_server(t)

    def _grad_norm(self, rnd: int) -> float:
        """The norm the server feeds to the policy.

        ``sequence``: the norm sequence itself. ``received`` (default): what
        the real server computes from replayed gradients (norm_r times a fixed
        random unit direction per worker, dblp.gradients.ReplayGradients): the
        mean of zero-filled gradients has norm ~ norm_r * sqrt(sum_i f_i) / N,
        f_i the fraction of worker i's chunks received, so losses move the
        norm the detector sees, as on real hosts.
        """
        base = float(self.norms[rnd % self.norms.size])
        if self.cfg.norm_model == "sequence":
            return base
        fr = sum(w.up_ep.receiver.received for w in self.workers) / self.core_layout.chunks
        return base * math.sqrt(fr) / self.n

    def _server(self):
        env = self.env
        self.server.start(env.now)
        for w in self.workers:
            w.up_ep.opened(env.now)
        self._dispatch_server(env.now)
        for rnd in range(self.cfg.rounds):
            yield env.all_of([w.up_ep.completed for w in self.workers])
            self.server.poll(env.now)  # S2: every upstream is in
            self._dispatch_server(env.now)
            if self.cfg.reduce_s:
                yield env.timeout(self.cfg.reduce_s)
            self._dones = []
            self.server.broadcast(self._grad_norm(rnd), env.now, None,
                                  extra={"reduce": "zero", "fidelity": self.cfg.fidelity, "burst": self.burst(rnd),
                                         **self._extra})
            self._dispatch_server(env.now)
            yield env.all_of(self._dones)

    # -- the worker: dblp.session.WorkerSession over SimPy --------------------------------------
    def _on_control(self, w: _Worker, msg: ctl.Message, t: float) -> None:
        if isinstance(msg, ctl.Common):  # S7
            w.session.handle_control(msg, t)
            if w.finish_wait is not None and w.session.can_finish():
                ev, w.finish_wait = w.finish_wait, None
                ev.succeed(t)
            return
        r = w.down_ep.receiver
        flow = w.down_ep.flow
        mine = msg.direction == ctl.DOWN and r.round_no == msg.round and r.active
        if mine and flow is not None and flow.rnd == msg.round:
            flow.deliver_until(t)
        w.session.handle_control(msg, t)
        if mine:
            w.down_ep.after(t)
            if flow is not None and flow.rnd == msg.round:
                flow.tolerance_changed(t)
        if msg.direction == ctl.UP and w.up_wait is not None and w.session.can_send():
            ev, w.up_wait = w.up_wait, None
            ev.succeed(t)

    def _worker(self, w: _Worker):
        env = self.env
        ws = w.session
        for k in range(self.cfg.rounds):
            c = self._compute_time()
            if c > 0:
                yield env.timeout(c)
            t0 = env.now
            if not ws.can_send():
                w.up_wait = env.event()
                yield w.up_wait
            w.down_ep.before_open(env.now)
            sender = ws.begin_round(env.now, t_ready=t0)  # S5; the tolerance comes with ROUND(k, down)
            w.down_ep.opened(env.now)
            flow = self.engine.start_flow(sender, w.up_ep, self.up_paths[w.wid], self.down_paths[w.wid],
                                          ctl.UP, w.wid, k)
            yield flow.done
            ws.sent(env.now)
            if not w.down_ep.completed.triggered:
                yield w.down_ep.completed
            held = ws.held(env.now)
            if held is not None:  # S7: report what we hold, apply what all hold
                self.engine.send_ctrl(self.up_paths[w.wid], held, env.now,
                                      lambda m, t, w=w: self._on_held(w, m, t), None)
                if not ws.can_finish():
                    w.finish_wait = env.event()
                    yield w.finish_wait
            self._write(ws.finish_round(env.now, extra={"compute_s": c, "fidelity": self.cfg.fidelity,
                                                        "burst": self.burst(k), **self._extra}))

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> SimResult:
        t = time.perf_counter()
        try:
            self.env.run()
        finally:
            if self._writer:
                self._writer.close()
        wall = time.perf_counter() - t
        n_rec = sum(1 for r in self.records if r.role == "worker")
        if n_rec != self.cfg.rounds * self.n:
            raise RuntimeError(f"simulation stalled at t={self.env.now:.6f} s after {n_rec} worker records "
                               f"of {self.cfg.rounds * self.n}")
        return SimResult(self.cfg, self.records, self.env.now, wall, self.datagrams,
                         getattr(self.engine, "events", 0))


def simulate(cfg: SimConfig, *, records: str | None = None) -> SimResult:
    """Run one configuration; ``records`` names a JSONL file for the round records."""
    return Simulation(cfg, records=records).run()


def varied_norms(iterations: int, seed: int = 0, *, critical_every: int = 150, decay: float = 300.0,
                 sigma: float = 0.3) -> np.ndarray:
    """A norm sequence whose iteration-to-iteration changes span the eta range.

    DBLP's detector compares the norm with the previous iteration's at every
    ``freq``-th step (Algorithm 3), so what decides detection is the
    iteration-to-iteration variation there. :func:`dblp.gradients.synthetic_norms`
    has 3% noise and short 2.5x jumps, which a check rarely lands on: every
    eta below 1.5 then gives the same run. Here the 1/(1+t/decay) decay
    carries mini-batch-like lognormal noise (``sigma``): the relative change
    exceeds 0.3 about half the time and 0.7 about one time in ten; critical
    jumps (2.5x for 5 iterations every ``critical_every``) are kept.
    """
    rng = np.random.default_rng([seed, 0x4E0])
    t = np.arange(iterations)
    norms = 1.0 / (1.0 + t / decay) * rng.lognormal(0.0, sigma, iterations)
    if critical_every > 0:
        for start in range(critical_every, iterations, critical_every):
            s = max(0, start + int(rng.integers(-critical_every // 4, critical_every // 4 + 1)))
            norms[s : s + 5] *= 2.5
    return norms


def load_norms(cfg: SimConfig) -> np.ndarray:
    n = cfg.norms
    if n is None or (isinstance(n, str) and n == "synthetic"):
        return synthetic_norms(max(cfg.rounds, 1), cfg.seed, critical_every=cfg.critical_every)
    if isinstance(n, str) and n == "varied":
        return varied_norms(max(cfg.rounds, 1), cfg.seed, critical_every=cfg.critical_every)
    if isinstance(n, str):
        return read_norms(n)
    arr = np.asarray(n, dtype=float)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise ParameterError("norms must be None, a CSV path, or a non-empty list of finite numbers")
    return arr


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def summarize(records: list[RoundRecord], end_time_s: float) -> dict:
    """Headline numbers of a run, from the worker records.

    Round latency is the worker's ``round_latency_s`` (the whole exchange,
    compute excluded), send latency its ``up_latency_s`` (the paper's
    metric); time-to-train is the simulated time at which the last round
    finished, compute included; lost fractions are chunks missing at the
    server (up) and at the worker (down).
    """
    wk = [r for r in records if r.role == "worker"]
    sv = [r for r in records if r.role == "server"]
    rl = np.array([r.round_latency_s for r in wk])
    ul = np.array([r.up_latency_s for r in wk])
    up_frac = np.array([r.up_received / r.chunks for r in wk]) if wk else np.array([])
    dn_frac = np.array([r.down_received / r.chunks for r in wk]) if wk else np.array([])
    lost_up = float(1 - up_frac.mean()) if wk else float("nan")
    lost_down = float(1 - dn_frac.mean()) if wk else float("nan")
    return {
        "rounds": len({r.round for r in wk}),
        "mean_round_s": float(rl.mean()) if wk else float("nan"),
        "p99_round_s": _pct(rl, 99),
        "max_round_s": float(rl.max()) if wk else float("nan"),
        "mean_up_s": float(ul.mean()) if wk else float("nan"),
        "p99_up_s": _pct(ul, 99),
        "time_to_train_s": float(end_time_s),
        "lost_up": lost_up,
        "lost_down": lost_down,
        "lost": (lost_up + lost_down) / 2,
        "up_passes": float(np.mean([r.up_passes for r in wk])) if wk else float("nan"),
        "down_passes": float(np.mean([r.down_passes for r in sv])) if sv else float("nan"),
        "clr_frac": float(np.mean([r.clr for r in sv])) if sv else float("nan"),
        "burst_rounds": len({r.round for r in wk if r.extra.get("burst")}),
    }
