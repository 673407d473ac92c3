"""The simulated parameter server and workers, driving the unchanged DBLP core.

The processes mirror :mod:`dblp.server` (``serve_round``) and
:mod:`dblp.worker` (``allreduce``) step by step; only the I/O differs:

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

Both write :class:`dblp.records.RoundRecord` rows with ``source="simulation"``
(one per round and worker and role), filled field by field as the real
server and worker fill them; times are simulated seconds since the start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import simpy

from .. import control as ctl
from ..core import Receiver, RoundSender, VirtualRound
from ..gradients import read_norms, synthetic_norms
from ..records import RecordWriter, RoundRecord
from ..wire import SERVER_ID, ChunkLayout, ParameterError
from .config import SimConfig
from .loss import make_flow_loss
from .net import Host, Path, Port, ctrl_wire_bytes

RUN_ID = 0x51A1_0001
SOURCE = "simulation"


def pass_remaining(sender: RoundSender) -> int:
    """Datagrams left in the sender's current pass, read from the core's state."""
    v = getattr(sender, "pass_remaining", None)
    if v is not None:
        return int(v)
    return int(sender._pass.size - sender._pos)  # noqa: SLF001 - see the report: a public property is requested


class Endpoint:
    """A persistent core :class:`Receiver` plus the SimPy side of it: an event
    fired when the core says the round is complete, and routing of the
    receiver's control messages (BITMAP/STOP) to the flow feeding it."""

    def __init__(self, sim: "Simulation", receiver: Receiver) -> None:
        self.sim = sim
        self.receiver = receiver
        self.flow: Any = None
        self.completed = sim.env.event()

    def begin_round(self, rnd: int, now: float, tolerance: float | None = None) -> None:
        if self.flow is not None:  # what arrived of the last round before now counts there
            self.flow.deliver_until(now)
        self.completed = self.sim.env.event()
        self.receiver.begin_round(rnd, None, now, tolerance=tolerance)
        self.after(now)

    def after(self, t: float) -> None:
        """Route what the core wants to send, and notice completion."""
        r = self.receiver
        for m in r.control_to_send():
            if self.flow is not None:
                self.flow.send_to_sender(m, t)
        if r.complete and r.active and not self.completed.triggered:
            self.completed.succeed(t)


class FlowBase:
    """One RoundSender -> Receiver transfer; the engines add the data path."""

    def __init__(self, sim: "Simulation", sender: RoundSender, ep: Endpoint, path: Path, rpath: Path,
                 direction: int, worker: int, rnd: int) -> None:
        self.sim = sim
        self.env = sim.env
        self.sender = sender
        self.ep = ep
        ep.flow = self
        self.path = path
        self.rpath = rpath
        self.direction = direction
        self.worker = worker
        self.rnd = rnd
        self.loss = sim.loss[(direction, worker)]
        self.done = sim.env.event()

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


@dataclass
class _Worker:
    wid: int
    up_ep: Endpoint  # server side: receives this worker's gradient
    down_ep: Endpoint  # worker side: receives the broadcast
    msgs: dict = field(default_factory=dict)  # (round, direction) -> (RoundStart, arrival time)
    waits: dict = field(default_factory=dict)  # (round, direction) -> event
    up_tolerance: float = 0.0


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
            self.core_layout = ChunkLayout(units * self.layout.chunk_floats, self.layout.mtu)
        self._scale = self.layout.chunks / self.core_layout.chunks
        self._extra = {"group": cfg.group} if cfg.group > 1 else {}
        self._bursts: dict[int, bool] = {}
        self.n = cfg.workers
        self.policy = cfg.make_policy()
        self.norms = load_norms(cfg)
        self._compute_rng = np.random.default_rng([cfg.seed, 0xC0DE])
        self._rounds_vr: dict[int, VirtualRound] = {}
        self.records: list[RoundRecord] = []
        self._writer = RecordWriter(records) if records else None
        self.datagrams = 0
        # -- topology: the paper's star -------------------------------------------------
        wire = cfg.wire_bytes
        d = cfg.delay_s
        self.server_host = Host("server", cfg.server_pps, cfg.server_rate_bps, wire)
        self.worker_hosts = [Host(f"w{i}", cfg.send_pps, cfg.bandwidth_bps, wire) for i in range(self.n)]
        self.server_port = Port("s1->server", cfg.server_rate_bps, cfg.queue_bytes)
        self.worker_ports = [Port(f"s1->w{i}", cfg.bandwidth_bps, cfg.queue_bytes) for i in range(self.n)]
        self.up_paths = [Path(self.worker_hosts[i], d, self.server_port, d, cfg.ctrl_overhead_s) for i in range(self.n)]
        self.down_paths = [Path(self.server_host, d, self.worker_ports[i], d, cfg.ctrl_overhead_s)
                           for i in range(self.n)]
        self.loss = {
            (direction, i): make_flow_loss(cfg.loss, seed=cfg.seed, direction=direction, worker=i, rounds=cfg.rounds)
            for direction in (ctl.UP, ctl.DOWN)
            for i in range(self.n)
        }
        if cfg.fidelity == "packet":
            from .packet import PacketEngine

            self.engine: Any = PacketEngine(self)
        else:
            from .fast import RoundEngine

            self.engine = RoundEngine(self)
        self.workers = [
            _Worker(
                i,
                Endpoint(self, Receiver(self.core_layout, run_id=RUN_ID, expected_sender=i, direction=ctl.UP)),
                Endpoint(self, Receiver(self.core_layout, run_id=RUN_ID, expected_sender=SERVER_ID,
                                        direction=ctl.DOWN)),
            )
            for i in range(self.n)
        ]
        self.env.process(self._server())
        for w in self.workers:
            self.env.process(self._worker(w))

    # -- helpers -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(t)`` at simulated time ``t`` (now if ``t`` is in the past)."""
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(t))

    def virtual_round(self, rnd: int) -> VirtualRound:
        vr = self._rounds_vr.get(rnd)
        if vr is None:
            self._rounds_vr = {k: v for k, v in self._rounds_vr.items() if k >= rnd - 1}
            vr = self._rounds_vr[rnd] = VirtualRound(self.core_layout, rnd)
        return vr

    def new_sender(self, rnd: int, direction: int, worker: int) -> RoundSender:
        """A RoundSender as the real server (stream 1000+w) and worker (stream 1+w) make it."""
        stream = 1 + worker if direction == ctl.UP else 1000 + worker
        return RoundSender(self.virtual_round(rnd), direction=direction, now=self.env.now,
                           order=self.engine.core_order, seed=self.cfg.seed, stream=stream,
                           pacer=self.engine.pacer(direction, worker), max_batch=self.cfg.max_batch)

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

    # -- the server (dblp.server.ParameterServer.serve_round) ---------------------------------
    def _open_upstream(self, w: _Worker, rnd: int, now: float) -> None:
        p, clr = self.policy.tolerance, self.policy.clr
        w.up_tolerance = p
        w.up_ep.begin_round(rnd, now, tolerance=p)
        self.engine.send_ctrl(self.down_paths[w.wid], ctl.RoundStart(rnd, ctl.UP, p, clr), now,
                              lambda m, t, w=w: self._on_round_start(w, m, t), None)

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
        for w in self.workers:
            self._open_upstream(w, 0, env.now)
        for rnd in range(self.cfg.rounds):
            t0 = env.now
            yield env.all_of([w.up_ep.completed for w in self.workers])
            t_up = env.now
            for w in self.workers:
                w.up_ep.receiver.finish_round()
            if self.cfg.reduce_s:
                yield env.timeout(self.cfg.reduce_s)
            norm = self._grad_norm(rnd)
            p_down = self.policy.update(rnd, norm)
            clr = self.policy.clr
            now = env.now
            dones = []
            for w in self.workers:
                self.engine.send_ctrl(self.down_paths[w.wid], ctl.RoundStart(rnd, ctl.DOWN, p_down, clr), now,
                                      lambda m, t, w=w: self._on_round_start(w, m, t), None)
            for w in self.workers:
                sender = self.new_sender(rnd, ctl.DOWN, w.wid)
                flow = self.engine.start_flow(sender, w.down_ep, self.down_paths[w.wid], self.up_paths[w.wid],
                                              ctl.DOWN, w.wid, rnd)
                flow.done.callbacks.append(
                    lambda ev, w=w, flow=flow: self._down_done(w, flow, rnd, t0, t_up, p_down, clr, norm, ev.value))
                dones.append(flow.done)
            yield env.all_of(dones)

    def _down_done(self, w: _Worker, flow: Any, rnd: int, t0: float, t_up: float, p_down: float, clr: bool,
                   norm: float, t: float) -> None:
        r, s = w.up_ep.receiver, flow.sender
        dr = r.stats.drops
        self._write(RoundRecord(
            source=SOURCE, role="server", worker=w.wid, round=rnd, t_start=t0,
            policy=self.policy.name, tolerance_up=w.up_tolerance, tolerance_down=p_down, clr=clr,
            grad_norm=norm, chunks=self.layout.chunks,
            up_latency_s=r.stats.t_done - r.stats.t_first, down_latency_s=s.stats.t_done - s.stats.t_start,
            round_latency_s=t - t0, up_received=self.count(r.received), down_sent=self.count(s.stats.sent),
            down_passes=s.stats.passes, down_received=self.count(s.stats.received), early_stop_down=s.stats.early_stop,
            send_rate_bps=self.cfg.send_rate_bps, order=self.cfg.order,
            stale=self.count(dr.stale), duplicate=self.count(dr.duplicate), corrupt=dr.corrupt, foreign=dr.foreign,
            malformed=dr.malformed, out_of_range=dr.out_of_range, wrong_length=dr.wrong_length,
            extra={"reduce": "zero", "wait_others_s": t_up - t0, "fidelity": self.cfg.fidelity,
                   "burst": self.burst(rnd), **self._extra},
        ))
        if rnd + 1 < self.cfg.rounds:
            self._open_upstream(w, rnd + 1, t)

    # -- the worker (dblp.worker.Worker.allreduce) ----------------------------------------
    def _on_round_start(self, w: _Worker, msg: ctl.RoundStart, t: float) -> None:
        key = (msg.round, msg.direction)
        w.msgs[key] = (msg, t)
        ev = w.waits.pop(key, None)
        if ev is not None:
            ev.succeed(t)
        r = w.down_ep.receiver
        if msg.direction == ctl.DOWN and r.round_no == msg.round and r.active:
            flow = w.down_ep.flow
            if flow is not None and flow.rnd == msg.round:
                flow.deliver_until(t)
            r.set_tolerance(msg.tolerance, t)
            w.down_ep.after(t)
            if flow is not None and flow.rnd == msg.round:
                flow.tolerance_changed(t)

    def _worker(self, w: _Worker):
        env = self.env
        for k in range(self.cfg.rounds):
            c = self._compute_time()
            if c > 0:
                yield env.timeout(c)
            t0 = env.now
            if (k, ctl.UP) not in w.msgs:
                ev = w.waits[(k, ctl.UP)] = env.event()
                yield ev
            up_msg, _ = w.msgs.pop((k, ctl.UP))
            t_send = env.now
            sender = self.new_sender(k, ctl.UP, w.wid)
            w.down_ep.begin_round(k, t_send)  # tolerance arrives with ROUND(k, down)
            flow = self.engine.start_flow(sender, w.up_ep, self.up_paths[w.wid], self.down_paths[w.wid],
                                          ctl.UP, w.wid, k)
            yield flow.done
            t_sent = env.now
            if not w.down_ep.completed.triggered:
                yield w.down_ep.completed
            t_done = env.now
            recv = w.down_ep.receiver
            recv.finish_round()
            down_msg, t_down = w.msgs.pop((k, ctl.DOWN))
            dr = recv.stats.drops
            self._write(RoundRecord(
                source=SOURCE, role="worker", worker=w.wid, round=k, t_start=t0, policy=self.policy.name,
                tolerance_up=up_msg.tolerance, tolerance_down=down_msg.tolerance, clr=down_msg.clr,
                chunks=self.layout.chunks, up_latency_s=t_sent - t_send, down_latency_s=t_done - t_down,
                round_latency_s=t_done - t0, up_sent=self.count(sender.stats.sent), up_passes=sender.stats.passes,
                up_received=self.count(sender.stats.received), down_received=self.count(recv.received),
                early_stop_up=sender.stats.early_stop, send_rate_bps=self.cfg.send_rate_bps,
                order=self.cfg.order, stale=self.count(dr.stale), duplicate=self.count(dr.duplicate), corrupt=dr.corrupt,
                foreign=dr.foreign, malformed=dr.malformed, out_of_range=dr.out_of_range,
                wrong_length=dr.wrong_length,
                extra={"wait_start_s": t_send - t0, "wait_server_s": t_down - t_sent, "compute_s": c,
                       "fidelity": self.cfg.fidelity, "burst": self.burst(k), **self._extra},
            ))

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
