"""The simulated parameter server and workers: SimPy processes driving the same sessions.

The server process drives a :class:`dblp.protocol.session.ServerSession` and each
worker process a :class:`dblp.protocol.session.WorkerSession` - the very objects the
socket server and worker drive - so the round logic (and the records) cannot
differ from the real ones; only the I/O and the clock do:

* **server**, round k: wait until every worker's upstream receiver holds
  ceil((1-p) n) chunks (the core's STOP rule), close those rounds, reduce
  (``reduce_s``), feed the mean's norm to the tolerance policy (CLR
  detection) for ``p_down``, announce ROUND(k, down, p_down) and start one
  :class:`~dblp.protocol.core.RoundSender` per worker; as each broadcast sender is
  stopped, write that worker's server record and open its upstream receiver
  for round k+1 under the policy's current tolerance (ROUND(k+1, up)).
* **worker**: compute (``compute_s``), wait for ROUND(k, up), open the
  broadcast receiver (tolerance comes with ROUND(k, down)), send its gradient
  with a RoundSender until STOP, wait for the broadcast, write its record.

With several parameter servers or the sharded mode (``servers``,
``aggregation``) every shard has its own server process and each worker one
exchange per shard, merged into one record (:class:`Simulation`).

The datagrams and control messages between the core objects are carried by
an engine: :class:`dblp.sim.engines.packet.PacketEngine` (one event per datagram) or
:class:`dblp.sim.engines.fast.RoundEngine` (numpy per retransmission pass). Neither
holds a protocol rule: thresholds, STOP, bitmaps, passes, backoff, stale
datagrams all come from :mod:`dblp.protocol.core` and :mod:`dblp.protocol.policy`.

Both write the sessions' :class:`dblp.protocol.records.RoundRecord` rows with
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

from dblp.protocol import control as ctl
from dblp.runs.gradients import read_norms, synthetic_norms
from dblp.protocol.records import RecordWriter, RoundRecord, write_records
from dblp.transport.shard import NORM_MESSAGE_BYTES, merge_records, sum_sq_norms
from dblp.protocol.session import ControlToSend, RecordContext, RecordWritten, SenderStarted, ServerSession, WorkerSession
from dblp.protocol.wire import ChunkLayout, ParameterError
from dblp.sim.config import SimConfig
from dblp.sim.engines.flow import Endpoint
from dblp.sim.engines.local import LocalFlow
from dblp.sim.network.loss import make_flow_loss
from dblp.sim.network.net import ctrl_wire_bytes
from dblp.sim.network.simpy_adapter import run as run_env  # env.run() with the round level's entries (re-exported)
from dblp.sim.network.topology import build_network, wan_loss_spec

RUN_ID = 0x51A1_0001
SOURCE = "simulation"


@dataclass
class _Link:
    """One worker's exchange with one (shard) server: the worker's session for that shard and
    the two core receivers. With one server there is one link per worker."""

    wid: int  # the worker
    shard: int
    fid: int  # its flow number (dblp.sim.network.topology.Network): shard * workers + wid
    session: WorkerSession  # the worker's Algorithm 4 for this shard
    up_ep: Endpoint  # server side: receives this worker's gradient (shard)
    down_ep: Endpoint  # worker side: receives the broadcast (shard)
    up_wait: Any = None  # event fired when ROUND(k, up) arrives
    finish_wait: Any = None  # event fired when COMMON(k) arrives (session S7)


@dataclass
class _Shard:
    """One shard server: its slice of the tensor and its own session (round counter,
    tolerance policy, STOP rule), as a socket server of :mod:`dblp.transport.shard` runs it."""

    j: int
    elements: int
    layout: ChunkLayout  # the real one of the shard: records, wire sizes
    core_layout: ChunkLayout  # the one its core objects run on (coarser with group > 1)
    policy: Any
    server: ServerSession = None  # type: ignore[assignment]
    links: list[_Link] = field(default_factory=list)  # worker i's at i
    dones: list = field(default_factory=list)  # this round's broadcast flows' done events


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord]
    end_time_s: float
    wall_s: float
    datagrams: int  # datagrams put on the simulated wire
    events: int  # SimPy events processed (packet level: ~2 per datagram)

    def summary(self) -> dict:
        """:func:`summarize`'s numbers and ``collapse_warning`` (:func:`collapse_warning`: a text or None)."""
        s = summarize(self.records, self.end_time_s)
        s["collapse_warning"] = collapse_warning(self.config, s)
        return s


class Simulation:
    """One configuration over SimPy; :meth:`run` simulates it.

    **Several servers and the sharded mode** (``cfg.servers``,
    ``cfg.aggregation``; :mod:`dblp.transport.shard`): the tensor is cut by
    :func:`dblp.transport.shard.shard_bounds` and each shard is an ordinary DBLP run -
    its own ServerSession and, per worker, WorkerSession, with their own
    round counters and STOP rules. What the shards share is what the real
    shard servers share: the tolerance policy's input. Each shard server
    computes its shard's norm and they exchange the squares
    (:class:`dblp.transport.shard.NormExchange`: each sends its square to shard 0, the
    hub, which sends back the sum; control frames on ``Network.hub_paths``),
    so every shard feeds the whole mean's norm to its policy and announces
    the same tolerance - and no shard broadcasts round k before every shard
    has reduced it. (The real shard servers start the broadcast's datagrams
    at their own reduce and announce ROUND(down) after the exchange, session
    rule S3b; the model keeps the barrier, which its host round-robin's
    turn order below relies on to keep ports free of incast at the packet
    level: its sharded rounds are longer by up to the exchange, two control
    frames, plus the shards' reduce skew.) A worker sends its k shards at once (one sender each,
    round-robin on its host, as :class:`dblp.transport.shard.ShardedWorker`'s threads)
    and starts round k+1 when all k broadcasts are in; its record is
    :func:`dblp.transport.shard.merge_records` of its k per-shard records. Each shard's
    reduce takes ``reduce_s`` x its share of the tensor. In the sharded mode
    a worker's own shard is **host-local** (:class:`dblp.sim.engines.local.LocalFlow`:
    one LOCAL control message per pass delivers the whole shard - no link, no
    loss), as the real transport hands it over in shared memory
    (:mod:`dblp.transport.hostlocal`).
    """

    def __init__(self, cfg: SimConfig, *, records: str | None = None) -> None:
        cfg.validate()
        if cfg.fidelity == "class":  # no engine here walks it: simulate() takes dblp.sim.engines.fabric
            raise ParameterError("fidelity='class' runs through simulate() (dblp.sim.engines.fabric), not a Simulation")
        self.cfg = cfg
        self.env = simpy.Environment()
        self.layout = cfg.layout  # the real one of the whole tensor (one server: of its one shard)
        self._extra = {"group": cfg.group} if cfg.group > 1 else {}
        self._bursts: dict[int, bool] = {}
        self.n = cfg.workers
        self.k = cfg.shards
        self.norms = load_norms(cfg)
        self._compute_rng = np.random.default_rng([cfg.seed, 0xC0DE])
        self.records: list[RoundRecord] = []
        self.shard_records: list[RoundRecord] = []  # several shards: each worker's per-shard records (not written)
        self._writer = RecordWriter(records, flush_each=False) if records else None  # (simulated: no one tails it)
        self.datagrams = 0
        self.shards = [self._make_shard(j, a, b) for j, (a, b) in enumerate(cfg.shard_bounds)]
        sh0 = self.shards[0]
        self.core_layout = sh0.core_layout  # (one server: the run's; kept for callers of that time)
        self._scale = sh0.layout.chunks / sh0.core_layout.chunks
        self.policy = sh0.policy
        # -- topology: the paper's star, leaf-spine or two sites (dblp.sim.network.topology) ---------------
        net = build_network(cfg)
        self.server_host, self.worker_hosts = net.server_host, net.worker_hosts
        self.up_paths, self.down_paths = net.up_paths, net.down_paths  # by flow: shard * workers + worker
        self.hub_paths = net.hub_paths
        self.local = net.local
        wan = wan_loss_spec(cfg)
        self.loss = {
            (direction, f): make_flow_loss([] if net.local[f] else cfg.loss + wan if net.remote[f] else cfg.loss,
                                           seed=cfg.seed, direction=direction, worker=f, rounds=cfg.rounds)
            for direction in (ctl.UP, ctl.DOWN)
            for f in range(self.k * self.n)
        }
        if cfg.fidelity == "packet":
            from dblp.sim.engines.packet import PacketEngine

            self.engine: Any = PacketEngine(self)
        else:
            from dblp.sim.engines.fast import RoundEngine

            self.engine = RoundEngine(self)
        core_order, seed = self.engine.core_order, cfg.seed
        auto = cfg.self_pacing  # no pacer and no rate: the sessions make the core's AutoPacers and PacerGroup
        for sh in self.shards:
            ctx = RecordContext(source=SOURCE, policy=sh.policy.name, order=cfg.order,
                                send_rate_bps=None if auto else cfg.send_rate_bps,
                                scale=sh.layout.chunks / sh.core_layout.chunks)
            base = sh.j * self.n
            sh.server = ServerSession(
                sh.core_layout, range(self.n), policy=sh.policy, run_id=RUN_ID, context=ctx, order=core_order,
                seed=seed, rounds=cfg.rounds, values=False, max_batch=cfg.max_batch,
                pacer=None if auto else (lambda w, base=base: self.engine.pacer(ctl.DOWN, base + w)),
                consistency=cfg.consistency, compensation=cfg.compensation)
            for i in range(self.n):
                ws = WorkerSession(sh.core_layout, i, run_id=RUN_ID, context=ctx, order=core_order, seed=seed,
                                   pacer=None if auto else self.engine.pacer(ctl.UP, base + i),
                                   max_batch=cfg.max_batch, consistency=cfg.consistency, compensation=cfg.compensation)
                sh.links.append(_Link(i, sh.j, base + i, ws, Endpoint(self, sh.server.receiver(i)),
                                      Endpoint(self, ws.receiver)))
        self.server = sh0.server  # one server: the run's
        self.workers = sh0.links  # one server: each worker's one link
        self._exchange: dict[int, dict] = {}  # round -> the shard servers' norm exchange under way
        self._norm_wire = ctrl_wire_bytes(NORM_MESSAGE_BYTES)
        for sh in self.shards:
            self.env.process(self._server(sh))
        for i in range(self.n):
            self.env.process(self._worker(i))

    def _make_shard(self, j: int, a: int, b: int) -> _Shard:
        cfg = self.cfg
        layout = self.layout if self.k == 1 else ChunkLayout(b - a, cfg.mtu, key=self.layout.key)
        core = layout
        if cfg.group > 1:
            units = math.ceil(layout.chunks / cfg.group)
            core = ChunkLayout(units * layout.chunk_floats, layout.mtu, key=layout.key)
        return _Shard(j, b - a, layout, core, cfg.make_policy())

    # -- helpers -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(t)`` at simulated time ``t`` (now if ``t`` is in the past)."""
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(t))

    def ctrl_wire(self, msg: ctl.Message) -> int:
        n = len(ctl.encode(msg))
        if isinstance(msg, ctl.Bitmap) and self.cfg.group > 1:
            # the real bitmap's size: the largest shard's (shards differ by at most one chunk)
            n += math.ceil(max(sh.layout.chunks for sh in self.shards) / 8) - len(msg.bits)
        return ctrl_wire_bytes(n)

    def count(self, count: int) -> int:
        """A count of core chunks as datagrams (differs only with group > 1; shard 0's scale)."""
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

    def _incast(self, rnd: int) -> dict:
        """Records' extra of iteration ``rnd``: ``incast: "flow"`` where its uploads were the flow-level
        incast's (dblp.sim.engines.incast), so a reader knows that round's upload figures are the model's."""
        return {"incast": "flow"} if rnd == 0 and getattr(self.engine, "incast", None) is not None else {}

    def burst(self, rnd: int) -> bool:
        """Whether an iteration-keyed burst hits iteration ``rnd`` (records' extra["burst"])."""
        b = self._bursts.get(rnd)
        if b is None:
            b = self._bursts[rnd] = any(p.burst(rnd) for p in self.loss.values())
        return b

    # -- the server: dblp.protocol.session.ServerSession over SimPy ------------------------------------
    def _dispatch_server(self, sh: _Shard, t: float) -> None:
        """Carry out shard ``sh``'s server session's events at simulated time ``t``.

        With several shards the senders take turns so that no two hosts' round-robins
        meet at one port: shard server ``j`` broadcasts to workers ``j, j-1, j-2, ...``
        and worker ``i`` uploads to shards ``i, i+1, i+2, ...`` (:meth:`_worker`), so at
        each turn the hosts aim at distinct ports. The worker a server reaches last,
        ``j+1``, starts its next upload with that shard last (its ROUND comes last), which
        keeps the turns aligned from round to round. In the first order every host's
        first quantum would meet at worker 0's port: an incast the real shard threads'
        fine-grained interleaving does not have."""
        started: list[SenderStarted] = []
        while (ev := sh.server.next_event()) is not None:
            if isinstance(ev, ControlToSend):
                w = sh.links[ev.worker]
                if isinstance(ev.message, ctl.RoundStart) and ev.message.direction == ctl.UP:
                    w.up_ep.opened(t)  # the session opened this worker's next upstream (S1)
                self.engine.send_ctrl(self.down_paths[w.fid], ev.message, t,
                                      lambda m, tt, w=w: self._on_control(w, m, tt), None)
            elif isinstance(ev, SenderStarted):
                if self.k == 1:
                    self._start_broadcast(sh, ev)
                else:
                    started.append(ev)
            elif isinstance(ev, RecordWritten):
                self._write(ev.record)
        for ev in sorted(started, key=lambda e: (sh.j - e.worker) % self.n):
            self._start_broadcast(sh, ev)

    def _start_broadcast(self, sh: _Shard, ev: SenderStarted) -> None:
        w = sh.links[ev.worker]
        flow = self._start_flow(ev.sender, w.down_ep, ctl.DOWN, w.fid, ev.sender.round_no)
        flow.done.callbacks.append(lambda e, w=w: self._down_done(w, e.value))
        sh.dones.append(flow.done)

    def _on_held(self, w: _Link, msg: ctl.Message, t: float) -> None:
        sh = self.shards[w.shard]
        sh.server.handle_control(w.wid, msg, t)
        self._dispatch_server(sh, t)

    def _down_done(self, w: _Link, t: float) -> None:
        sh = self.shards[w.shard]
        w.up_ep.before_open(t)
        sh.server.poll(t, w.wid)  # S4: the record, then this worker's next upstream
        self._dispatch_server(sh, t)

    def _grad_norm(self, rnd: int, sh: _Shard | None = None) -> float:
        """The norm shard ``sh``'s server computes (default: shard 0; one server: the run's).

        ``sequence``: the norm sequence itself, the shard's share of it
        (``sqrt(elements_j / elements)``). ``received`` (default): what the
        real server computes from replayed gradients (norm_r times a fixed
        random unit direction per worker, dblp.runs.gradients.ReplayGradients): the
        mean of zero-filled gradients has norm ~ norm_r * sqrt(sum_i f_i) / N,
        f_i the fraction of worker i's chunks received, so losses move the
        norm the detector sees, as on real hosts; a shard holds its share
        of each worker's squared norm, so its norm is that times
        ``sqrt(elements_j / elements)``, f_i its own chunks' fractions.
        Squares of the shards' norms add up to the whole mean's (see
        :meth:`_norm_exchange`).
        """
        sh = sh or self.shards[0]
        base = float(self.norms[rnd % self.norms.size])
        if self.k > 1:
            base *= math.sqrt(sh.elements / self.cfg.elements)
        if self.cfg.norm_model == "sequence":
            return base
        fr = sum(w.up_ep.receiver.received for w in sh.links) / sh.core_layout.chunks
        return base * math.sqrt(fr) / self.n

    def _norm_exchange(self, sh: _Shard, rnd: int, sq_norm: float):
        """Shard ``sh``'s part in round ``rnd``'s exchange of squared norms (dblp.transport.shard.NormExchange):
        an event that fires, with the sum over the shards, when the hub's answer reaches this
        shard's server. Each square reaches the hub (shard 0) one control frame later; the hub
        answers once it holds all of them, adding in shard order as it does."""
        x = self._exchange.setdefault(rnd, {"sq": [0.0] * self.k, "at": [0.0] * self.k, "ev": [None] * self.k,
                                            "n": 0})
        now = self.env.now
        ev = self.env.event()
        to_hub = self.hub_paths[sh.j]
        x["sq"][sh.j] = sq_norm
        x["at"][sh.j] = now if to_hub is None else now + to_hub[0].ctrl_base_delay(self._norm_wire)
        x["ev"][sh.j] = ev
        x["n"] += 1
        if x["n"] == self.k:
            del self._exchange[rnd]
            total = sum_sq_norms(x["sq"])
            t_hub = max(x["at"])
            for j, e in enumerate(x["ev"]):
                back = self.hub_paths[j]
                t = t_hub if back is None else t_hub + back[1].ctrl_base_delay(self._norm_wire)
                self.at(t, lambda _t, e=e: e.succeed(total))
        return ev

    def _server(self, sh: _Shard):
        env = self.env
        server = sh.server
        server.start(env.now)
        for w in sh.links:
            w.up_ep.opened(env.now)
        self._dispatch_server(sh, env.now)
        reduce_s = self.cfg.reduce_s * (sh.elements / self.cfg.elements if self.k > 1 else 1.0)
        extra = {"reduce": "zero", "fidelity": self.cfg.fidelity, **self._extra}
        if self.k > 1:
            extra.update(aggregation=self.cfg.aggregation, shard=sh.j, shards=self.k)
        for rnd in range(self.cfg.rounds):
            yield all_done(env, [w.up_ep.completed for w in sh.links])
            server.poll(env.now)  # S2: every upstream is in
            self._dispatch_server(sh, env.now)
            if reduce_s:
                yield env.timeout(reduce_s)
            sh.dones = []
            norm = self._grad_norm(rnd, sh)
            if self.k > 1:  # as dblp.transport.server: the policy sees the whole mean's norm
                norm = math.sqrt((yield self._norm_exchange(sh, rnd, norm * norm)))
            server.broadcast(norm, env.now, None, extra={**extra, "burst": self.burst(rnd), **self._incast(rnd)})
            self._dispatch_server(sh, env.now)
            yield all_done(env, sh.dones)

    # -- the worker: dblp.protocol.session.WorkerSession over SimPy --------------------------------------
    def _on_control(self, w: _Link, msg: ctl.Message, t: float) -> None:
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
            if not ev.triggered:  # several shards' links may wait on one event (_sharded_round)
                ev.succeed(t)

    def _worker(self, wid: int):
        env = self.env
        links = [sh.links[wid] for sh in self.shards]
        for k in range(self.cfg.rounds):
            c = self._compute_time()
            if c > 0:
                yield env.timeout(c)
            t0 = env.now
            extra = {"compute_s": c, "fidelity": self.cfg.fidelity, "burst": self.burst(k), **self._extra,
                     **self._incast(k)}
            if len(links) == 1:
                w = links[0]
                if not w.session.can_send():
                    w.up_wait = env.event()
                    yield w.up_wait
                rec = yield from self._exchange_shard(w, self._begin_shard(w, k, t0), extra)
            else:
                rec = yield from self._sharded_round(links, k, t0, extra)
            self._write(rec)

    def _sharded_round(self, links: list[_Link], k: int, t0: float, extra: dict):
        """Worker ``wid``'s round ``k`` with every shard at once, as dblp.transport.shard.ShardedWorker's
        threads: each shard's upload starts when its ROUND(k, up) is in, the round ends with the
        last broadcast; the merged record (dblp.transport.shard.merge_records).

        Uploads that can start at the same instant join the host in the order ``wid, wid+1,
        ...`` (see :meth:`_dispatch_server`)."""
        env = self.env
        wid = links[0].wid
        waiting = [links[(wid + r) % self.k] for r in range(self.k)]
        procs: dict[int, Any] = {}
        while waiting:
            ready = [w for w in waiting if w.session.can_send()]
            if not ready:
                ev = env.event()  # one event for all: an AnyOf per wake-up would cost O(k) each
                for w in waiting:
                    w.up_wait = ev
                yield ev
                continue
            for w in ready:  # the ROUNDs of this instant are all in (SimPy runs them before this process)
                waiting.remove(w)
                w.up_wait = None
                procs[w.shard] = env.process(self._exchange_shard(w, self._begin_shard(w, k, t0), extra))
        yield env.all_of(list(procs.values()))
        recs = [procs[j].value for j in range(self.k)]
        self.shard_records.extend(recs)
        rec = merge_records(recs)
        rec.extra.update(aggregation=self.cfg.aggregation, shards=self.k)
        return rec

    def _begin_shard(self, w: _Link, k: int, t0: float):
        """S5 for worker ``w.wid`` and shard ``w.shard`` (ROUND(k, up) is in): start the upload."""
        w.down_ep.before_open(self.env.now)
        sender = w.session.begin_round(self.env.now, t_ready=t0)  # S5; the tolerance comes with ROUND(k, down)
        w.down_ep.opened(self.env.now)
        return self._start_flow(sender, w.up_ep, ctl.UP, w.fid, k)

    def _start_flow(self, sender: Any, ep: Endpoint, direction: int, fid: int, rnd: int) -> Any:
        """Flow ``fid``'s transfer in ``direction``: by the engine over the network, or host-local
        (a worker's own shard: :class:`dblp.sim.engines.local.LocalFlow`)."""
        fwd, back = (self.up_paths, self.down_paths) if direction == ctl.UP else (self.down_paths, self.up_paths)
        if self.local[fid]:
            return LocalFlow(self, sender, ep, fwd[fid], back[fid], direction, fid, rnd)
        return self.engine.start_flow(sender, ep, fwd[fid], back[fid], direction, fid, rnd)

    def _exchange_shard(self, w: _Link, flow: Any, extra: dict):
        """The rest of worker ``w.wid``'s round with shard ``w.shard``'s server: its record."""
        env = self.env
        ws = w.session
        yield flow.done
        ws.sent(env.now)
        if not w.down_ep.completed.triggered:
            yield w.down_ep.completed
        held = ws.held(env.now)
        if held is not None:  # S7: report what we hold, apply what all hold
            self.engine.send_ctrl(self.up_paths[w.fid], held, env.now,
                                  lambda m, t, w=w: self._on_held(w, m, t), None)
            if not ws.can_finish():
                w.finish_wait = env.event()
                yield w.finish_wait
        return ws.finish_round(env.now, extra=dict(extra))

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> SimResult:
        t = time.perf_counter()
        try:
            run_env(self.env)
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


def all_done(env: simpy.Environment, events: list) -> simpy.Event:
    """``env.all_of(events)`` for a waiter that ignores its value: an event that succeeds (or fails)
    when the last of ``events`` is processed, at the very point a Condition's would - its check sits
    at the same place in each event's callbacks, its ``succeed`` queues the same entry - without the
    Condition's bookkeeping (two walks over the events at creation, a ConditionValue of them all at
    the end; the server waits on one per round of its N workers' upstreams, one of its N broadcasts)."""
    ev = env.event()
    left = len(events)
    if not left:
        ev.succeed()
        return ev

    def check(e: simpy.Event) -> None:
        nonlocal left
        if ev.triggered:
            return
        left -= 1
        if not e.ok:  # as Condition._check: the failure is this event's, defused
            e.defused = True
            ev.fail(e.value)
        elif not left:
            ev.succeed()

    for e in events:
        if e.callbacks is None:
            check(e)
        else:
            e.callbacks.append(check)
    return ev


def simulate(cfg: SimConfig, *, records: str | None = None) -> SimResult:
    """Run one configuration; ``records`` names a JSONL file for the round records. ``fidelity="class"``
    takes :func:`dblp.sim.engines.fabric.simulate_classes` (one representative flow per port class)."""
    if cfg.fidelity == "class":
        from dblp.sim.engines.fabric import simulate_classes

        wall = time.perf_counter()
        recs, end, datagrams = simulate_classes(cfg, load_norms(cfg), SOURCE, RUN_ID)
        res = SimResult(cfg, recs, end, time.perf_counter() - wall, datagrams, 0)
        if records:
            write_records(records, res.records)
        return res
    return Simulation(cfg, records=records).run()


def varied_norms(iterations: int, seed: int = 0, *, critical_every: int = 150, decay: float = 300.0,
                 sigma: float = 0.3) -> np.ndarray:
    """A norm sequence whose iteration-to-iteration changes span the eta range.

    DBLP's detector compares the norm with the previous iteration's at every
    ``freq``-th step (Algorithm 3), so what decides detection is the
    iteration-to-iteration variation there. :func:`dblp.runs.gradients.synthetic_norms`
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
    server (up) and at the worker (down). Broadcast passes of a worker's
    round are the most any shard needed (as :func:`dblp.transport.shard.merge_records`
    counts a round's passes).
    """
    wk = [r for r in records if r.role == "worker"]
    sv = [r for r in records if r.role == "server"]
    down: dict[tuple[int, int], int] = {}  # (worker, round) -> broadcast passes: with shards, the most any needed
    for r in sv:
        key = (r.worker, r.round)
        down[key] = max(down.get(key, 0), r.down_passes)
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
        "down_passes": float(np.mean(list(down.values()))) if sv else float("nan"),
        "clr_frac": float(np.mean([r.clr for r in sv])) if sv else float("nan"),
        "burst_rounds": len({r.round for r in wk if r.extra.get("burst")}),
        # passes on the rounds no iteration burst hit: what the senders' own congestion costs
        "clean_up_passes": _mean_or_nan([r.up_passes for r in wk if not r.extra.get("burst")]),
        "clean_down_passes": _mean_or_nan([r.down_passes for r in sv if not r.extra.get("burst")]),
    }


def _mean_or_nan(v: list[float]) -> float:
    return float(np.mean(v)) if v else float("nan")


#: mean send passes per upload (or broadcast) on rounds without injected loss above which a run of unpaced
#: senders has collapsed into mass retransmission (each pass resends what the overflowing queue dropped)
COLLAPSE_PASSES = 2.0


def collapse_warning(cfg: SimConfig, summary: dict) -> str | None:
    """One line when unpaced senders need more than :data:`COLLAPSE_PASSES` passes per upload or broadcast on
    the rounds without an iteration burst, else None.

    Why: N unpaced senders fill the bottleneck queue at N times its drain rate, most datagrams are dropped,
    and every pass resends them; the run's latency then measures the retransmission storm, not the network
    (64 unpaced workers on a 5G uplink: ~1,220 passes per upload and 13.8 s rounds; 1.25 s with --pace 200M).
    The suggested rate is the fair share of the server's link, its rate / the workers sending to it (a
    starting point: it ignores other bottlenecks of leaf-spine or WAN fabrics). A paced run gets no warning:
    its passes come from the loss it was given, not from its own senders. Summaries from before these
    fields (a sweep's cache) have no clean_* passes and get no warning."""
    if cfg.send_rate_bps:
        return None
    worst = max(((summary.get(f"clean_{d}_passes", float("nan")), d) for d in ("up", "down")),
                key=lambda t: t[0] if math.isfinite(t[0]) else -1.0)
    if not (math.isfinite(worst[0]) and worst[0] > COLLAPSE_PASSES):
        return None
    link = cfg.server_bandwidth_bps or cfg.bandwidth_bps
    share = link * cfg.servers / cfg.workers
    what = "upload" if worst[1] == "up" else "broadcast"
    return (f"warning: mass retransmission: {worst[0]:.1f} passes per {what} on average on rounds without "
            f"injected loss (> {COLLAPSE_PASSES:g}) with unpaced senders; try --pace {share / 1e6:.4g}M "
            f"(the fair share: {link / 1e6:g} Mbit/s server link x {cfg.servers} / {cfg.workers} workers)")
