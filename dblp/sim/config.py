"""Simulator parameters: one flat, JSON-serialisable dataclass.

Units are in the names (``_bps`` bit/s, ``_s`` seconds, ``_bytes``,
``_pps`` packets per second), as in SimPy's examples. The topology is the
paper's star: ``workers`` hosts on links of ``bandwidth_bps`` to one switch,
and one link of ``server_bandwidth_bps`` from the switch to the parameter
server, every link with ``delay_s`` one-way propagation delay and a drop-tail
queue of ``queue_bytes`` at the switch's egress port; ``topology`` selects
leaf-spine or two sites instead (:mod:`dblp.sim.network.topology`).

``aggregation`` and ``servers`` say who averages the tensor (see
:mod:`dblp.transport.shard`, the real transport's sharded mode). ``"server"`` (the
paper's, default): ``servers`` dedicated parameter-server hosts, each with
a link of ``server_bandwidth_bps`` and the server's send cost, each
averaging 1/``servers`` of the tensor (1 = the paper's single server).
``"sharded"``: no server host; every worker's host also runs the server of
one shard (k = ``workers`` shards), on the worker's own link and send cost
(``server_bandwidth_bps`` and ``server_send_pps`` then describe no host).
Either way each shard is an ordinary DBLP run (own session, round counter,
STOP rule) and all shards take the tolerance of the whole mean's norm.

``group`` > 1 (round level only) is an approximation for speed: the core
runs on a layout of ceil(chunks / group) units, each standing for ``group``
consecutive datagrams - timed as that many, sharing one loss verdict (a loss
process sees one datagram per unit), counted as that many in the records.
Thresholds are then met to within one unit (``group`` chunks). The default
1 simulates every datagram; ``scenarios/bench_sim.py`` measures the error.

``calibrate`` writes this same structure (``params.json``); ``run --params``
reads it back. Keys starting with ``_`` are comments and are ignored; any
other unknown key is an error naming it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from traces.units import FRAME_BYTES

from dblp.protocol.core import DEFAULT_ORDER, ORDERS
from dblp.runs.gradients import model_elements
from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_P_LOW, default_p_high, make_policy, policy_name
from dblp.transport.shard import AGGREGATIONS, shard_bounds
from dblp.protocol.wire import IP_UDP_OVERHEAD, TAG_SIZE, ChunkLayout, ParameterError
from dblp.sim.network.topology import check_topology

FIDELITIES = ("round", "packet", "class")  # class: dblp.sim.engines.fabric
INCAST_MODES = ("auto", "flow", "walk")  # dblp.sim.engines.incast
NORM_MODELS = ("received", "sequence")
ETHERNET_HEADER = 14


@dataclass
class SimConfig:
    # -- workload ------------------------------------------------------------
    model: str = "resnet50"  # a name of dblp.runs.gradients.MODEL_SIZES or an element count
    workers: int = 3
    rounds: int = 100
    mtu: int = 1500
    wire: int = 1  # data wire: 1 = the paper's (24-byte header, 362 floats), 2 = authenticated (dblp.protocol.auth: 358)
    compute_s: float = 0.0  # per-iteration compute time of each worker
    compute_jitter_s: float = 0.0  # std-dev of a normal jitter on compute_s (clipped at 0)
    reduce_s: float = 0.0  # server's reduce step, between upstream and broadcast (a shard server: its share)
    # -- tolerance policy (as dblp.protocol.policy.make_policy) ---------------------------
    policy: str = "dblp"
    p: float = DEFAULT_P_LOW
    p_low: float | None = None
    p_high: float | None = None
    eta: float = DEFAULT_ETA
    freq: int = DEFAULT_FREQ
    order: str = DEFAULT_ORDER  # chunk order recorded (and used by the packet-level mode)
    # -- gradient norms that CLR detection sees -----------------------------------
    # None/"synthetic": dblp.runs.gradients.synthetic_norms (as the replaying workers); "varied": jumps of
    # random size (dblp.sim.model.varied_norms, for eta sweeps); a CSV path (iteration,grad_norm); a list
    norms: Any = None
    critical_every: int = 150  # synthetic norms: a jump every this many iterations
    norm_model: str = "received"  # see dblp.sim.model.Simulation._grad_norm
    # -- network -------------------------------------------------------------------
    bandwidth_bps: float = 10e9  # each worker's link
    server_bandwidth_bps: float | None = None  # the server's link (default: bandwidth_bps)
    delay_s: float = 50e-6  # one-way propagation delay of each link
    queue_bytes: int = 100 * FRAME_BYTES  # drop-tail buffer of each switch egress port (100 full frames)
    frame_overhead_bytes: int = IP_UDP_OVERHEAD + ETHERNET_HEADER  # on-wire bytes beyond the DBLP datagram
    # -- aggregation (dblp.transport.shard; the model's placement: dblp.sim.network.topology) --------------------------
    aggregation: str = "server"  # "server": dedicated parameter servers | "sharded": a shard server per worker host
    servers: int = 1  # aggregation="server": parameter-server hosts, each averaging 1/servers of the tensor
    # -- topology (dblp.sim.network.topology; the parameters of topologies/leafspine.py and twosites.py) ---------
    topology: str = "star"  # star | leafspine | twosites
    switch_ports: int | None = None  # ports per switch (None: as many as the hosts need)
    racks: int = 2  # leafspine: racks of one leaf switch each (server in rack 1, workers from rack 2 on)
    spines: int = 1  # leafspine: spine switches
    oversubscription: float = 1.0  # leafspine: hosts per rack x bandwidth / (spines x uplink rate), >= 1
    uplink_bandwidth_bps: float | None = None  # leafspine: each leaf-spine link (unset: from oversubscription)
    local_workers: int = 1  # twosites: workers in the server's site; the others cross the WAN
    wan_bandwidth_bps: float = 1e9  # twosites: the WAN link's rate
    wan_delay_s: float = 5e-3  # twosites: the WAN link's one-way propagation delay
    wan_queue_bytes: int | None = None  # twosites: drop-tail buffer at each end of the WAN (unset: queue_bytes)
    wan_loss: float = 0.0  # twosites: probability that the WAN drops a datagram (each direction)
    # -- hosts -----------------------------------------------------------------------
    send_pps: float = 200_000.0  # datagrams/s a worker's sender can push (per-host send cost)
    server_send_pps: float | None = None  # the server host's (shared by its N senders); default send_pps
    send_rate_bps: float = 0.0  # pacing of every sender (dblp.protocol.pacing.TokenBucket); 0 = unlimited
    # receive cost: seconds a delivered datagram costs its receiving host - a worker for the broadcast's, the
    # server for the uploads' (dblp.sim.studies.calibrate fits them from a run's burst rounds). The engines charge it
    # to the sending host's stream, in proportion to the datagrams the loss lets through: on the emulator the
    # hosts share the machine's cores, and a datagram a burst drops before the receiver costs only the send
    # part (1 / send_pps). 0 = none: the send cost holds the whole datagram's cost (as before).
    recv_cost_s: float = 0.0
    server_recv_cost_s: float = 0.0
    # sender batching: a paced sender's loop sleeps at least this long between batches (the transport's
    # dblp.protocol.pacing.WAKE_S, longer on a loaded host) and sends what its bucket allows then, as a batch at the
    # host's rate; 0 = exact timers (a paced flow leaves one datagram at a time: smooth)
    wake_s: float = 0.0
    # self-pacing (the transport's --pace auto): no pacer is handed to the sessions, so dblp.protocol.session makes the
    # core's own dblp.protocol.pacing.AutoPacer per sender and the server's PacerGroup (rules R11, R12, R14 act as in
    # the transport); packet level only (the round level's bucket is a fixed rate in closed form)
    self_pacing: bool = False
    ctrl_overhead_s: float = 20e-6  # processing added to each control message
    # -- loss processes (see dblp.sim.network.loss) ------------------------------------------
    loss: list = field(default_factory=list)
    # -- simulator -----------------------------------------------------------------
    fidelity: str = "round"  # "round" (fast, numpy per pass) or "packet" (one event per datagram)
    seed: int = 0
    group: int = 1  # round level: datagrams simulated as one unit (1 = every datagram; see below)
    # round level: the first iteration's synchronised incast at flow level (dblp.sim.engines.incast) - "auto" from
    # incast.AUTO_MIN_WORKERS workers on, "flow" wherever it applies, "walk" never (every pass walked)
    incast: str = "auto"
    host_slice: int = 1024  # datagrams a host sends for one peer before the next (transport.pump)
    max_batch: int = 64  # packet level: datagrams per core call (RoundSender.max_batch)
    consistency: str = "none"  # "none" (the paper) | "intersect" (dblp.protocol.session S7: identical replicas)
    # -- loss compensation and the stop rule (dblp.protocol.compensation C1-C6, core R5b; the paper's by default):
    # the stop rule changes what a round sends, the rest what a round's update is (convergence models)
    upload_estimate: str = "zero"
    broadcast_fill: str = "zero"
    feedback: str = "off"
    feedback_bound: float = 1.0
    stop_rule: str = "early"

    @property
    def compensation(self) -> Any:
        """The options as one :class:`dblp.protocol.compensation.Compensation` (validated)."""
        from dblp.protocol.compensation import Compensation

        return Compensation(self.upload_estimate, self.broadcast_fill, self.feedback, float(self.feedback_bound),
                            self.stop_rule)

    def __post_init__(self) -> None:
        self.policy = policy_name(self.policy)  # "fixed", the old name, is "baseline"
        self.validate()

    # -- checks ------------------------------------------------------------------------
    def validate(self) -> None:
        self.compensation.check_consistency(self.consistency)  # refuses a bad option by name (C6 included)
        model_elements(_model_arg(self.model))
        _positive_int("workers", self.workers)
        _positive_int("rounds", self.rounds)
        ChunkLayout(1, self.mtu)
        if self.wire not in (1, 2):
            raise ParameterError(f"wire must be 1 (the paper's CRC wire) or 2 (authenticated), got {self.wire!r}")
        for name in ("compute_s", "compute_jitter_s", "reduce_s", "delay_s", "ctrl_overhead_s", "send_rate_bps",
                     "recv_cost_s", "server_recv_cost_s", "wake_s"):
            _nonneg(name, getattr(self, name))
        for name in ("bandwidth_bps", "send_pps"):
            _positive(name, getattr(self, name))
        for name in ("server_bandwidth_bps", "server_send_pps"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        _positive_int("queue_bytes", self.queue_bytes)
        if int(self.frame_overhead_bytes) != self.frame_overhead_bytes or self.frame_overhead_bytes < 0:
            raise ParameterError(f"frame_overhead_bytes must be a non-negative integer, got {self.frame_overhead_bytes!r}")
        if self.fidelity not in FIDELITIES:
            raise ParameterError(f"fidelity must be one of {FIDELITIES}, got {self.fidelity!r}")
        if self.norm_model not in NORM_MODELS:
            raise ParameterError(f"norm_model must be one of {NORM_MODELS}, got {self.norm_model!r}")
        if self.order not in ORDERS:
            raise ParameterError(f"order must be one of {ORDERS}, got {self.order!r}")
        _positive_int("host_slice", self.host_slice)
        if not (isinstance(self.seed, int) and self.seed >= 0):  # numpy's generators take no negative seed
            raise ParameterError(f"seed must be a non-negative integer, got {self.seed!r}")
        _positive_int("group", self.group)
        if self.incast not in INCAST_MODES:
            raise ParameterError(f"incast must be one of {INCAST_MODES}, got {self.incast!r}")
        if self.fidelity == "class":
            from dblp.sim.engines.fabric import not_applicable

            why = not_applicable(self)
            if why is not None:
                raise ParameterError(f"fidelity='class' (one representative flow per port class) does not apply "
                                     f"to {why}; use fidelity='round'")
        if self.group > 1 and self.fidelity != "round":
            raise ParameterError(f"group={self.group} is a round-level approximation; the packet level needs group=1")
        _positive_int("max_batch", self.max_batch)
        if not isinstance(self.self_pacing, bool):
            raise ParameterError(f"self_pacing must be true or false, got {self.self_pacing!r}")
        if self.self_pacing and self.fidelity != "packet":
            raise ParameterError(f"self_pacing (the core's AutoPacer, rules R11/R12/R14) is modelled at the packet "
                                 f"level only (the round level's bucket is a fixed rate); got fidelity={self.fidelity!r}")
        if self.self_pacing and self.send_rate_bps:
            raise ParameterError(f"self_pacing and a fixed send_rate_bps={self.send_rate_bps!r} exclude each other "
                                 "(the transport's --pace auto or a rate); set send_rate_bps to 0")
        if not (isinstance(self.critical_every, int) and self.critical_every >= 0):
            raise ParameterError(f"critical_every must be a non-negative integer, got {self.critical_every!r}")
        if not isinstance(self.loss, list):
            raise ParameterError(f"loss must be a list of loss-process specs, got {type(self.loss).__name__}")
        if isinstance(self.norms, str) and self.norms not in ("synthetic", "varied") and not Path(self.norms).is_file():
            raise ParameterError(f"norms must be synthetic, varied or a CSV file (iteration,grad_norm), "
                                 f"got {self.norms!r}: no such file")
        self.make_policy()  # validates the policy arguments
        self._check_aggregation()
        check_topology(self)
        from dblp.sim.network.loss import check_specs

        check_specs(self.loss)

    def _check_aggregation(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ParameterError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        _positive_int("servers", self.servers)
        if self.aggregation == "sharded":
            if self.servers != 1:
                raise ParameterError(f"servers={self.servers} counts dedicated parameter-server hosts "
                                     "(aggregation='server'); aggregation='sharded' runs one shard server on "
                                     "each worker's host; servers must be 1 there")
            if self.workers < 2:
                raise ParameterError(f"aggregation='sharded' needs workers >= 2 (a shard server on each worker's "
                                     f"host), got workers={self.workers}")
        elements = self.elements
        if elements < self.shards:
            who = (f"workers={self.workers}, aggregation='sharded'" if self.aggregation == "sharded"
                   else f"servers={self.servers}")
            raise ParameterError(f"model={self.model!r} has {elements} elements, fewer than the {self.shards} "
                                 f"shards ({who}): every shard needs at least one")

    # -- derived -----------------------------------------------------------------------
    @property
    def shards(self) -> int:
        """Shard servers: ``servers`` dedicated hosts, or (sharded) one per worker."""
        return self.workers if self.aggregation == "sharded" else self.servers

    @property
    def shard_bounds(self) -> list[tuple[int, int]]:
        """``[start, stop)`` of each shard of the tensor (:func:`dblp.transport.shard.shard_bounds`, the one cut)."""
        return shard_bounds(self.elements, self.shards)

    @property
    def elements(self) -> int:
        return model_elements(_model_arg(self.model))

    @property
    def layout(self) -> ChunkLayout:
        """The real chunking; on wire 2 a key of zeros sizes the 40-byte header (no tag is computed)."""
        return ChunkLayout(self.elements, self.mtu, key=bytes(TAG_SIZE) if self.wire == 2 else None)

    @property
    def server_rate_bps(self) -> float:
        return self.bandwidth_bps if self.server_bandwidth_bps is None else self.server_bandwidth_bps

    @property
    def server_pps(self) -> float:
        return self.send_pps if self.server_send_pps is None else self.server_send_pps

    @property
    def wire_bytes(self) -> int:
        """On-wire bytes of one full data datagram (the tensor's short last one is timed as full)."""
        return self.layout.datagram_size + int(self.frame_overhead_bytes)

    def make_policy(self):
        return make_policy(self.policy, p=self.p, p_low=self.p_low, p_high=self.p_high, eta=self.eta, freq=self.freq)

    @property
    def baseline_p(self) -> float:
        """The baseline's fixed tolerance: P_low (paper Table I)."""
        return self.p if self.p_low is None else self.p_low

    @property
    def effective_p_high(self) -> float:
        return default_p_high(self.baseline_p) if self.p_high is None else self.p_high

    # -- (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, path: str | Path | None = None, extra: dict | None = None) -> str:
        d = {**(extra or {}), **self.to_dict()}
        text = json.dumps(d, indent=2, allow_nan=False) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "SimConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in names and not str(k).startswith("_"))
        if unknown:
            raise ParameterError(f"unknown simulator parameter(s) {unknown}; known: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, path: str | Path) -> "SimConfig":
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ParameterError(f"{path}: cannot read simulator parameters: {exc}") from exc
        if not isinstance(d, dict):
            raise ParameterError(f"{path}: expected a JSON object of simulator parameters")
        return cls.from_dict(d)

    def with_(self, **kw: Any) -> "SimConfig":
        return replace(self, **kw)


def _model_arg(m: Any) -> str | int:
    if isinstance(m, float) and m.is_integer():
        return int(m)
    if isinstance(m, (str, int)) and not isinstance(m, bool):
        return m
    raise ParameterError(f"model must be a model name or an element count, got {m!r}")


def _positive(name: str, v: Any) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ParameterError(f"{name} must be a positive number, got {v!r}")


def _nonneg(name: str, v: Any) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise ParameterError(f"{name} must be a non-negative number, got {v!r}")


def _positive_int(name: str, v: Any) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ParameterError(f"{name} must be a positive integer, got {v!r}")
