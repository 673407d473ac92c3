"""The round at class level: one representative flow per port class, for fabrics of 10,000 workers.

Why: on a leaf-spine with ``servers`` M and N workers a round is N x M sessions per direction
(10,000 x 100: 1M core senders, receivers and flows each way, some GiB before a datagram moves),
and the round level (:mod:`dblp.sim.engines.fast`) walks every pass of every one of them through every
port it crosses; 200 workers x 10 servers did not finish one iteration in 500 s. Nothing the
headline records hold needs the flows one by one where they are alike: with the uploads starting
together (no compute jitter) and unpaced senders, every worker's host sends its
M shard uploads round-robin the same way, every server's host its N broadcasts, and each port of
a class (a worker rack's pooled uplinks, the spines' port into the servers' rack, a server's
port; the reverse ports for the broadcast) sees the same offered load.

The model (:func:`simulate_classes`, ``SimConfig.fidelity = "class"``): the run's round logic is
the sessions' - one :class:`dblp.protocol.session.ServerSession` (S1-S4, S6, S8: phases, the
tolerance policy, the records) and one :class:`dblp.protocol.session.WorkerSession` (S5, S6), as
every other driver (:mod:`dblp.sim.model`, the socket server and worker) drives them; this module is
their network. Per iteration and direction the session's one :class:`dblp.protocol.core.RoundSender`
(on shard 0's layout) hands out each pass by its count (:meth:`~dblp.protocol.core.RoundSender.count_to_send`),
its receiver gets the chunks that arrive (:meth:`~dblp.protocol.core.Receiver.receive_chunks`, the
first ``got`` of the send order) and answers the PROBE with its BITMAP and its own STOP (R5), so
every protocol rule (R2, R3, R5, R6, R8's backoff) comes from :mod:`dblp.protocol.core`; the mean's
norm the server session feeds its policy is what :mod:`dblp.sim.model` computes.
A pass of ``m`` datagrams is, for every flow alike, ``m`` datagrams at the host's rate shared by
its flows; each port on the representative's path is a fluid drop-tail queue (rate, buffer in
datagrams, its queue carried from pass to pass) offered the flows of its class at that rate,
thinned by the ports before it; a pass delivers its expected share of its datagrams (the
acceptance of the ports in series; the receiver holds the whole chunks of that running sum), so the
run is deterministic (``seed`` changes nothing here). The PROBE waits behind the queues, the BITMAP returns on the
idle reverse path, the receiver's crossing of its need is placed by the pass's arrival rate, its
STOP cuts the pass (the sender hands out what left before it). Control messages reach the other
session at the instants the model places them (a ROUND(down) at the broadcast's start).

**One session peer per port class, not one per worker.** The sessions hold one core sender and
receiver per worker and direction, and their round costs a few session calls per worker: 10,000
peers would spend the run in session bookkeeping of flows that are alike by construction (the
class level's whole point), where one peer of weight N costs the same at any N. So the server
session has one peer, the representative worker (its records stand for every worker: worker ``i``'s
record is the representative's with ``worker=i``), and the representative's one shard stands for
its M: the sessions' records of shard 0 are made the worker's whole records by the class weights
(:func:`_whole`: datagrams sent x M, chunks and chunks received prorated to the tensor's), as
:func:`dblp.transport.shard.merge_records` merges a worker's per-shard records elsewhere. The
upload's overlap with its class (below) is found by running scratch core senders and receivers
(the same rules, no session) over the ports before the session's own upload.

The workers' spread: the first iteration's uploads start together (lockstep); a broadcast's
round-robin (``host_slice`` datagrams a turn, the servers' turns rotated so that no two meet at one
port: :meth:`dblp.sim.model.Simulation._dispatch_server`) ends the workers' rounds spread over its
last turn, so from the second iteration on the uploads start spread over that time S, and an
upload of length D meets only :func:`overlap` (D, S) of its class's flows at once (found by
iterating D). The last turn is the broadcast's last pass as it left (cut by the STOP): after a lossy
broadcast the retransmissions are short turns, so the next uploads start nearly together again (an
incast after each burst, as the walk has it). The records are the mean worker's (its start and end
S/2 before the last's); the server's upstream ends with the last worker's.

Loss processes (bursts): the round level draws each datagram's fate at its receiver's ingress, after
the queues (:mod:`dblp.sim.network.loss`); here the representative's receiver takes the same processes in
expectation - a pass's arrivals thinned by ``mean_loss`` over their arrival window
(:mod:`traces.processes`: an iteration burst's loss, a time burst's loss weighted by its overlap,
Bernoulli's p, a Gilbert-Elliott chain's stationary loss). A burst is then a fraction of every flow
of the receiving class's datagrams lost, not a draw per datagram; ``tests/sim/test_fabric.py`` holds
it to the walk under the microburst's iteration bursts. A trace keyed by time is refused (it is
replayed per datagram).

What it leaves out: the spread of the workers' figures (every worker gets the mean's record);
which chunks arrive; stale counts; the workers in the servers' own rack (they skip the fabric:
the representative is a worker in another rack). In a synchronised incast all flows back off
(R8) together, where the walk's drift apart: the passes per upload come out high there (+39% at
1024 workers on the star, the round time +1.2%; docs/scale.md). ``tests/sim/test_fabric.py`` holds
it to the round level on small leaf-spines (tolerances there).

When it applies (:func:`not_applicable`): star or leaf-spine, dedicated servers (not sharded),
unpaced senders, no loss trace keyed by time, no compute jitter, ``group`` 1, no S7 consistency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.core import Receiver, RoundSender, VirtualRound
from dblp.protocol.records import RoundRecord
from dblp.protocol.session import (ControlToSend, RecordContext, RecordWritten, SenderStarted, ServerSession,
                                   WorkerSession)
from dblp.protocol.wire import ChunkLayout, ParameterError
from dblp.transport.shard import NORM_MESSAGE_BYTES
from dblp.sim.network.loss import Combined, make_flow_loss
from dblp.sim.network.net import Host, ctrl_wire_bytes, fluid_step
from dblp.sim.network.topology import Fabric, rack_of, uplink_rate_bps

#: a representative's passes per direction and iteration past which the model gives up (a sender
#: that never reaches its receiver's need, e.g. a port that accepts nothing)
MAX_PASSES = 100_000
#: a PROBE's, BITMAP's or STOP's payload, bytes, as timed on the wire (a BITMAP of a shard's few hundred
#: chunks at most; at 10,000 workers x 100 servers a shard is 28 chunks)
CTRL_BYTES = 64
#: the core's chunk order at class level: which chunks a pass carries does not change how many arrive
#: (the round level's shortcut, :mod:`dblp.sim.engines.fast`), so the receiver holds the order's first ``got``
ORDER = "inorder"


def not_applicable(cfg: Any) -> str | None:
    """Why the class-level round cannot stand for this configuration (None: it can)."""
    if cfg.topology not in ("star", "leafspine"):
        return f"topology {cfg.topology!r} (star or leafspine only)"
    if cfg.aggregation != "server":
        return "aggregation='sharded' (dedicated servers only)"
    if cfg.send_rate_bps:
        return "paced senders"
    if cfg.recv_cost_s or cfg.server_recv_cost_s or cfg.wake_s:
        return "a receive cost or sender batching (recv_cost_s, server_recv_cost_s, wake_s: round or packet level)"
    specs = cfg.loss if isinstance(cfg.loss, list) else []  # (the config's own check names a malformed list)
    trace = next((sp for sp in specs if isinstance(sp, dict) and sp.get("kind") == "trace"
                  and sp.get("key", "time") == "time"), None)
    if trace is not None:
        return f"a loss trace keyed by time ({trace.get('path')}: replayed per datagram only)"
    if cfg.compute_jitter_s:
        return "compute jitter (the flows would not start together)"
    if cfg.group != 1:
        return "group > 1"
    if cfg.consistency != "none":
        return "consistency='intersect'"
    if getattr(cfg, "stop_rule", "early") != "early":
        return f"stop_rule={cfg.stop_rule!r} (the class-level round counts the paper's early stop)"
    if cfg.topology == "leafspine" and cfg.racks < 2:
        return "a leaf-spine of one rack (no worker crosses the fabric; use the star)"
    return None


def overlap(dur: float, spread: float) -> float:
    """The mean fraction of a class's flows that send beside one of them, when each lasts ``dur`` and
    their starts are spread uniformly over ``spread`` seconds: E[overlap of two such intervals] / dur
    (D/S - D^2/(3 S^2) for D < S, 1 - S/(3 D) beyond; 1 when they start together)."""
    if spread <= 0:
        return 1.0
    if dur < spread:
        return dur / spread - dur * dur / (3 * spread * spread)
    return 1.0 - spread / (3 * dur)


class _Port:
    """A fluid drop-tail port of one class: rate and buffer in datagrams, its queue carried over
    (the rule: :func:`dblp.sim.network.net.fluid_step`)."""

    def __init__(self, rate_pps: float, qcap: float, flows_rate: float) -> None:
        self.mu = rate_pps
        self.qcap = qcap
        self.share = self.share0 = flows_rate  # offered datagrams/s when the representative sends at 1 datagram/s
        self.q = 0.0
        self.t = 0.0

    def drain(self, t: float) -> None:
        if t > self.t:
            self.q = max(0.0, self.q - self.mu * (t - self.t))
            self.t = t

    def carry(self, lam: float, t0: float, dur: float) -> float:
        """Offered ``lam`` datagrams/s for ``dur`` seconds from ``t0``: the rate that gets through."""
        self.drain(t0)
        if dur <= 0:
            return lam
        q_end, whole = fluid_step(self.q, self.qcap, self.mu, lam, dur)
        acc = lam * dur if whole >= dur else lam * whole + self.mu * (dur - whole)
        self.q, self.t = q_end, t0 + dur
        return acc / dur


@dataclass(frozen=True)
class _Transfer:
    """How one direction's transfer went on the class's ports (the sender and receiver hold the rest)."""

    crossing: float  # when the receiver crossed its need (its STOP)
    t_stop: float  # when that STOP reached the sender
    last_pass: int  # datagrams of the last pass that left before the STOP


def _deliver(r: Receiver, order: np.ndarray, lo: int, hi: int, t_first: float, t_last: float) -> None:
    """Hand the receiver chunks ``order[lo:hi]`` of its round: the first of the round alone at ``t_first``
    (its first arrival, so the receiver's ``t_first`` is the pass's), the rest at ``t_last``."""
    if hi <= lo:
        return
    if r.received == 0 and hi - lo > 1:
        r.receive_chunks(r.round_no, order[lo : lo + 1], t_first)
        lo += 1
    r.receive_chunks(r.round_no, order[lo:hi], t_last)


def _hand_out(s: RoundSender, t: float, dur: float, left: int, m: int) -> None:
    """The sender's pass of ``m`` datagrams from ``t`` for ``dur`` seconds, of which ``left`` leave (fewer
    than ``m``: a STOP cut it, R6); a whole pass's last datagram leaves at its end, the PROBE after it (R2)."""
    if left < m:
        s.count_to_send(t, left)
        return
    if m > 1:
        s.count_to_send(t, m - 1)
    s.count_to_send(t + dur, 1)


class _Direction:
    """One direction's representative: its ports in series, its host's per-flow rate, the delays, and
    the loss process at its receiver's ingress (the round level's place for it: :mod:`dblp.sim.network.loss`),
    taken in expectation (``mean_loss`` over the pass's arrivals)."""

    def __init__(self, ports: list[_Port], flow_pps: float, base: float, back: float, loss: Combined) -> None:
        self.ports, self.flow_pps, self.base, self.back = ports, flow_pps, base, back
        self.loss = loss

    def scale(self, factor: float) -> None:
        """Only ``factor`` of each class's flows send at once (the uploads' starts spread out)."""
        for p in self.ports:
            p.share = p.share0 * factor
            p.q, p.t = 0.0, 0.0

    def transfer(self, s: RoundSender, r: Receiver, t0: float) -> _Transfer:
        """Carry sender ``s``'s round from ``t0`` to receiver ``r`` (open, its tolerance known) until the
        receiver's STOP reaches the sender."""
        k, order, need = s.round_no, s.order, r.stop_count
        got, mean, t = 0, 0.0, t0  # chunks the receiver holds: whole, and in expectation
        for _ in range(MAX_PASSES):
            m = s.pass_remaining
            if m == 0:
                raise RuntimeError(f"class level: the sender of round {k} has nothing to send at t={t}")
            dur = m / self.flow_pps
            lam = 1.0
            for p in self.ports:  # offered to each port: its class's flows, thinned by the ports before
                lam = p.carry(self.flow_pps * p.share * lam, t, dur) / (self.flow_pps * p.share)
            wait = sum(p.q / p.mu for p in self.ports)  # the PROBE waits behind what the queues hold
            first = t + self.base + wait
            # the pass's expected arrivals: a flow of its class, on average, less what the loss process
            # drops at the receiver's ingress (after the queues: a dropped datagram still used the links)
            keep = 1.0 - self.loss.mean_loss(first, first + dur, k) if self.loss.procs else 1.0
            arriving = m * min(1.0, lam) * keep
            if mean + arriving >= need - 1e-9:  # R5: the receiver crosses need within this pass
                crossing = first + dur * (need - mean) / arriving
                t_stop = crossing + self.back
                left = m  # what left before the STOP: the pass's datagrams, its last turns cut (R6 mid-pass)
                if t_stop < t + dur:
                    left = max(1, math.ceil(m * (t_stop - t) / dur))
                _hand_out(s, t, dur, left, m)
                _deliver(r, order, got, need, first, crossing)
                for msg in r.control_to_send():  # its STOP
                    s.handle_control(msg, t_stop)
                for msg in s.control_to_send():  # a whole pass's PROBE, past the STOP: the receiver ignores it
                    r.handle_control(msg, t + dur + self.base + wait)
                if not s.done:
                    raise RuntimeError(f"class level: round {k}'s receiver did not stop at {need} chunks")
                return _Transfer(crossing, t_stop, left)
            _hand_out(s, t, dur, m, m)
            mean += arriving
            whole = int(mean + 1e-9)
            _deliver(r, order, got, whole, first, first + dur)
            got = whole
            t_probe = t + dur + self.base + wait
            for msg in s.control_to_send():  # the PROBE
                r.handle_control(msg, t_probe)
            t_reply = t_probe + self.back
            for msg in r.control_to_send():  # its BITMAP: the next pass, or R8's backoff
                s.handle_control(msg, t_reply)
            nxt = s.get_timer()
            t = t_reply if nxt is None else nxt
        raise RuntimeError(f"class level: round {k} did not reach its receiver's need in {MAX_PASSES} passes")


def _scratch(layout: ChunkLayout, k: int, direction: int, t0: float, tolerance: float,
             run_id: int) -> tuple[RoundSender, Receiver]:
    """A core sender and receiver of round ``k`` outside the sessions: the overlap search's trial upload."""
    s = RoundSender(VirtualRound(layout, k), direction=direction, now=t0, order=ORDER)
    r = Receiver(layout, run_id=run_id, expected_sender=0, direction=direction)
    r.begin_round(k, None, t0, tolerance=tolerance)
    return s, r


def _ports(cfg: Any, n: int, m: int, wire: int, up: bool, remote: int, fullest: int) -> list[_Port]:
    """The representative's ports in series, each with its class's offered share (flows' rate in
    units of the representative's)."""
    q = cfg.queue_bytes / wire
    pps = 8.0 * wire
    srv = _Port(cfg.server_rate_bps / pps, q, n) if up else _Port(cfg.bandwidth_bps / pps, q, m)
    if cfg.topology == "star":
        return [srv]
    pool = cfg.spines * uplink_rate_bps(cfg) / pps
    if up:
        # a worker rack's uplinks (its workers' M flows each), then the spines' port into the servers'
        # rack (every remote worker's; a port fed by one rack alone never queues: topology.queueless_as_delay)
        ports = [_Port(pool, q, fullest * m)]
        if cfg.racks > 2:
            ports.append(_Port(pool, q, remote * m))
        return ports + [srv]
    # the servers' rack's uplinks (every server's flows to remote workers), then the worker's port
    return [_Port(pool, q, remote * m), srv]


def _whole(rec: RoundRecord, shards: int, total_chunks: int) -> RoundRecord:
    """The class weights: a session's record of the representative's shard 0 as the worker's whole record
    over its ``shards`` alike (datagrams sent x shards; chunks, and chunks received in proportion, the tensor's)."""
    if shards == 1:
        return rec
    c = rec.chunks
    return replace(rec, chunks=total_chunks, up_sent=rec.up_sent * shards, down_sent=rec.down_sent * shards,
                   up_received=rec.up_received * total_chunks // c, down_received=rec.down_received * total_chunks // c)


def _serve(server: ServerSession, worker: WorkerSession, now: float) -> tuple[list[RoundRecord], RoundSender | None]:
    """Carry out the server session's events at ``now``: its control messages reach the worker session
    then; returns the records it wrote and the broadcast's sender, if one started."""
    recs: list[RoundRecord] = []
    sender = None
    while (ev := server.next_event()) is not None:
        if isinstance(ev, ControlToSend):
            worker.handle_control(ev.message, now)
        elif isinstance(ev, SenderStarted):
            sender = ev.sender
        elif isinstance(ev, RecordWritten):
            recs.append(ev.record)
    return recs, sender


def simulate_classes(cfg: Any, norms: np.ndarray, source: str,
                     run_id: int = 0) -> tuple[list[RoundRecord], float, int]:
    """Run ``cfg`` at class level (see the module's docstring) on the gradient ``norms``: its records
    (``source`` theirs), the simulated end time and the datagrams put on the wire (every flow's).
    :func:`dblp.sim.model.simulate` makes them its result (this module does not import it: the
    config's check imports this one)."""
    why = not_applicable(cfg)
    if why is not None:
        raise ParameterError(f"fidelity='class' does not apply here: {why}; use fidelity='round'")
    n, m = cfg.workers, cfg.shards
    wire = cfg.wire_bytes
    layouts = [ChunkLayout(b - a, cfg.mtu, key=cfg.layout.key) for a, b in cfg.shard_bounds]
    lay = layouts[0]
    total_chunks = sum(x.chunks for x in layouts)
    # delays of the representative pair (worker 0, server 0), from the topology's one rule for paths
    workers = [Host(f"w{i}", cfg.send_pps, cfg.bandwidth_bps, wire) for i in range(min(n, cfg.racks + 1))]
    servers = [Host("server0", cfg.server_pps, cfg.server_rate_bps, wire)]
    fab = Fabric(cfg, servers, workers)
    rep = next((w for i, w in enumerate(workers) if rack_of(i, cfg.racks) != 0), workers[0]) \
        if cfg.topology == "leafspine" else workers[0]
    up_path, down_path = fab.path(rep, servers[0]), fab.path(servers[0], rep)
    dgram = wire * 8.0
    ctrl = ctrl_wire_bytes(CTRL_BYTES)
    base_up = sum(up_path.delays) + sum(p.ser(wire) for p in up_path.ports) + cfg.ctrl_overhead_s
    base_dn = sum(down_path.delays) + sum(p.ser(wire) for p in down_path.ports) + cfg.ctrl_overhead_s
    if cfg.topology == "leafspine":
        racks = np.bincount([rack_of(i, cfg.racks) for i in range(n)], minlength=cfg.racks)
        remote, fullest = int(n - racks[0]), int(racks[1:].max())
    else:
        remote, fullest = n, n
    w_pps = min(cfg.send_pps, cfg.bandwidth_bps / dgram)
    s_pps = min(cfg.server_pps, cfg.server_rate_bps / dgram)
    # the representative flow's loss (the round level gives each flow its own instance of the run's
    # specs; iteration bursts, the microburst's, hit every flow of an iteration alike)
    up_loss, dn_loss = (make_flow_loss(cfg.loss, seed=cfg.seed, direction=d, worker=0, rounds=cfg.rounds)
                        for d in (ctl.UP, ctl.DOWN))
    upd = _Direction(_ports(cfg, n, m, wire, True, remote, fullest), w_pps / m, base_up,
                     down_path.ctrl_base_delay(ctrl), up_loss)
    dnd = _Direction(_ports(cfg, n, m, wire, False, remote, fullest), s_pps / n, base_dn,
                     up_path.ctrl_base_delay(ctrl), dn_loss)
    hub = 0.0 if m == 1 else 2 * fab.path(servers[0], servers[0]).ctrl_base_delay(ctrl_wire_bytes(NORM_MESSAGE_BYTES))
    # the sessions: the server's one peer is the representative worker (the module's docstring: why one)
    policy = cfg.make_policy()
    ctx = RecordContext(source=source, policy=policy.name, order=ORDER, send_rate_bps=0.0)  # unpaced
    server = ServerSession(lay, (0,), policy=policy, run_id=run_id, context=ctx, order=ORDER, seed=cfg.seed,
                           rounds=cfg.rounds, values=False, compensation=cfg.compensation)
    worker = WorkerSession(lay, 0, run_id=run_id, context=ctx, order=ORDER, seed=cfg.seed,
                           compensation=cfg.compensation)
    up_rx = server.receiver(0)
    records: list[RoundRecord] = []
    t = 0.0
    datagrams = 0
    a0, b0 = cfg.shard_bounds[0]
    reduce_s = cfg.reduce_s * ((b0 - a0) / cfg.elements if m > 1 else 1.0)
    # the broadcast's round-robin (host_slice datagrams a turn, servers' turns rotated:
    # model._dispatch_server) spreads the workers' ends over the last turn: the next uploads start spread
    # (of the broadcast's last pass: after a lossy broadcast the retransmissions are short turns, and the
    # next uploads start nearly together again - an incast after every burst, as the walk has it)

    def turn_spread(last_pass: int) -> float:
        last_turn = last_pass - cfg.host_slice * (math.ceil(last_pass / cfg.host_slice) - 1)
        return max(n - m, 1) * last_turn / s_pps if n > 1 else 0.0
    spread = 0.0  # round 0: every upload starts at once (no compute jitter)
    server.start(t)  # S1: ROUND(0, up)
    _serve(server, worker, t)
    for k in range(cfg.rounds):
        t_last = t + cfg.compute_s  # the last worker's start; the mean worker's is spread/2 before it
        t0 = t_last - spread / 2
        up_s = worker.begin_round(t_last, t_ready=t0)  # S5 (its broadcast receiver opens too)
        dur = lay.chunks * m / w_pps  # first guess of an upload's length: its host's time alone
        for _ in range(3 if spread > 0 else 1):  # uploads spread over `spread`: ~n dur/spread of them at once
            upd.scale(overlap(dur, spread))
            trial = upd.transfer(*_scratch(lay, k, ctl.UP, t_last, float(up_rx.tolerance), run_id), t_last)
            dur = max(dur, trial.crossing - t_last)
        up = upd.transfer(up_s, up_rx, t_last)
        worker.sent(up.t_stop)
        server.poll(up.crossing)  # S2: the upstream is in; reduce
        _serve(server, worker, up.crossing)
        t_red = up.crossing + reduce_s + hub
        base = float(norms[k % norms.size])
        # the mean's norm as dblp.sim.model's _grad_norm has it for n workers alike: sqrt(n f) / n
        norm = base if cfg.norm_model == "sequence" else base * math.sqrt(up_rx.received / lay.chunks / n)
        extra = {"fidelity": "class", "compute_s": cfg.compute_s, "burst": up_loss.burst(k) or dn_loss.burst(k)}
        if m > 1:
            extra.update(aggregation=cfg.aggregation, shards=m)
        server.broadcast(norm, t_red, None, extra={**extra, "reduce": "zero"})  # S3: ROUND(k, down) and its sender
        _, dn_s = _serve(server, worker, t_red)
        assert dn_s is not None
        dn = dnd.transfer(dn_s, worker.receiver, t_red)
        spread = turn_spread(dn.last_pass)
        t_end = dn.crossing  # the last worker's; the mean worker's spread/2 before
        server.poll(dn.t_stop, 0)  # S4: the server's record, ROUND(k+1, up)
        srecs, _ = _serve(server, worker, dn.t_stop)
        wrec = _whole(worker.finish_round(t_end - spread / 2, extra=extra), m, total_chunks)  # S6
        srec = _whole(srecs[0], m, total_chunks)
        records.extend(replace(wrec, worker=i) for i in range(n))
        records.extend(replace(srec, worker=i) for i in range(n))
        datagrams += (up_s.stats.sent + dn_s.stats.sent) * m * n
        t = max(t_end, dn.t_stop)
    return records, t, datagrams
