"""The simulated network's shape: the star, leaf-spine and two sites, from a SimConfig's fields.

The parameters are those of the Mininet topologies (``topologies/star.py``,
``leafspine.py``, ``twosites.py``) under the simulator's unit-carrying names:
``racks``, ``spines``, ``local_workers`` as there; ``bw`` is
``bandwidth_bps``, ``uplink_bw`` ``uplink_bandwidth_bps`` (or derived from
``oversubscription``), ``wan_bw``/``wan_delay``/``wan_buffer`` are
``wan_bandwidth_bps``/``wan_delay_s``/``wan_queue_bytes``. Hosts are placed
as there: the server in rack 1 (site 1), worker ``w(i+1)`` in rack
``(i+1) % racks``; the first ``local_workers`` workers in site 1.

Every link has a switch egress port (rate, drop-tail ``queue_bytes``) at its
far end's switch and ``delay_s`` of propagation (the WAN: ``wan_delay_s``).
A path lists the ports a worker's datagrams cross:

* **star**: worker -> [s1->srv] -> server; server -> [s1->w] -> worker.
* **leafspine**: a worker in another rack than the server crosses
  [leaf->spine] and [spine->leaf1] before [leaf1->srv] (incast at the
  server's rack: every worker meets there); the broadcast crosses
  [leaf1->spine] and [spine->leaf] before [leaf->w]. A rack's links to its
  ``spines`` spines are pooled into one port of ``spines`` x the uplink rate
  (ECMP spreading flows evenly, as one fluid); Mininet's STP keeps one spine
  path active, so compare with it at ``spines=1``. A port that only one
  port of no higher rate feeds (with two racks: [spines->leaf1] up,
  [spines->leaf2] and [leaf2->w] down) never queues and is carried as a
  delay (:func:`queueless_as_delay`): the round level would otherwise drop
  a congested uplink's flows there a second time.
* **twosites**: a remote worker crosses [s2->wan] then [s1->srv]; the
  broadcast [s1->wan] then [s2->w]; ``wan_loss`` drops datagrams on the WAN
  (a Bernoulli process on the remote workers' flows, both directions).

**Several servers, the sharded mode** (``servers``, ``aggregation``; the
real transport's :mod:`dblp.transport.shard`). Every shard server j and every worker i
exchange one flow each way (flow ``j * workers + i``), on the same rules as
above - a path runs from the sending host to the receiving host's port:

* ``servers`` = m > 1: m dedicated hosts ``server0..server{m-1}``, each
  on its own link (``server_bandwidth_bps``, port ``->server{j}``) with the
  server's send cost. Star: all on s1. Leaf-spine: **all in the server's
  rack (rack 1)**, as the single server - the fabric's incast at
  [spines->leaf1] stays, the per-server links share it. Two sites: all in
  site 1. A worker's host sends its m shard uploads round-robin through its
  one NIC.
* ``aggregation="sharded"``: no server host; shard server i runs on worker
  i's host (k = workers shards), so that host's NIC carries its k-1 uploads
  *and* its shard's k-1 broadcasts, and its port ``->w{i}`` the k-1
  uploads to its shard and the k-1 broadcasts from the others: 2N(k-1)/k
  each way. Workers keep their racks/sites (rack 1 then holds only the
  workers placed there). A worker's **own shard is host-local**
  (:mod:`dblp.sim.engines.local`, as :mod:`dblp.transport.hostlocal` on real hosts): its
  flows get a loopback path ``w{i}-lo-up``/``-down`` (:data:`LOOPBACK_S`
  a frame) for their control messages; no data crosses a link.

The shard servers' norm exchange (:class:`dblp.transport.shard.NormExchange`, shard 0
the hub) rides ``Network.hub_paths``: control frames, never data.

Why a module of its own: the paths are the only thing the engines see of a
topology (:class:`dblp.sim.network.net.Path`), so one function builds them all and
the checks of the parameters sit beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dblp.protocol.wire import ParameterError
from dblp.sim.network.net import Host, Path, Port

TOPOLOGIES = ("star", "leafspine", "twosites")
# A host's loopback (sharded: a worker's own shard, dblp.sim.engines.local): seconds per frame. Not zero - a path
# divides by its rate - but 1 ns, nothing against ctrl_overhead_s.
LOOPBACK_S = 1e-9
_LOOPBACK_QUEUE = 1 << 40  # bytes: never full


@dataclass
class Network:
    """What :class:`dblp.sim.model.Simulation` needs of a topology.

    Flows are numbered ``shard * workers + worker`` (with one server: the
    worker's number); ``up_paths[f]`` runs from the worker to the shard's
    server, ``down_paths[f]`` back."""

    server_hosts: list[Host]  # shard j's server's host at j (sharded: worker j's own host)
    worker_hosts: list[Host]
    up_paths: list[Path]
    down_paths: list[Path]
    remote: list[bool]  # per flow: its datagrams cross the WAN (twosites)
    local: list[bool]  # per flow: host-local (sharded: a worker's own shard; no link, no loss)
    hub_paths: list[tuple[Path, Path] | None]  # per shard: (to shard 0's server, back); None for shard 0

    @property
    def server_host(self) -> Host:
        return self.server_hosts[0]


def sharded(cfg: Any) -> bool:
    """Whether the shard servers sit on the workers' hosts (``aggregation="sharded"``)."""
    return getattr(cfg, "aggregation", "server") == "sharded"


def dedicated_servers(cfg: Any) -> int:
    """Dedicated parameter-server hosts: ``servers``, none in the sharded mode."""
    return 0 if sharded(cfg) else int(getattr(cfg, "servers", 1))


def hosts_per_rack(cfg: Any) -> int:
    """The fullest rack's hosts (servers included): the oversubscription's numerator.
    Servers sit in rack 1, worker ``w(i+1)`` in rack ``(i+1) % racks``."""
    counts = [0] * cfg.racks
    counts[0] += dedicated_servers(cfg)
    full, rest = divmod(cfg.workers, cfg.racks)  # workers 0.. fill racks 1, 2, ..., 0, 1, ... in turn
    for r in range(cfg.racks):
        counts[r] += full + (1 if (r - 1) % cfg.racks < rest else 0)
    return max(counts)


def uplink_rate_bps(cfg: Any) -> float:
    """Each leaf-spine link's rate: given, or hosts per rack x bandwidth / (spines x oversubscription)."""
    if cfg.uplink_bandwidth_bps is not None:
        return float(cfg.uplink_bandwidth_bps)
    return hosts_per_rack(cfg) * cfg.bandwidth_bps / (cfg.spines * cfg.oversubscription)


def rack_of(worker: int, racks: int) -> int:
    """0-based rack of 0-based worker ``worker`` (topologies/leafspine.py: w(i+1) -> rack (i+1) % racks)."""
    return (worker + 1) % racks


def check_topology(cfg: Any) -> None:
    """Refuse topology parameters that describe no network, naming them."""
    if cfg.topology not in TOPOLOGIES:
        raise ParameterError(f"topology must be one of {TOPOLOGIES}, got {cfg.topology!r}")
    if cfg.switch_ports is not None:
        _positive_int("switch_ports", cfg.switch_ports)
    for name in ("racks", "spines"):
        _positive_int(name, getattr(cfg, name))
    if not (isinstance(cfg.oversubscription, (int, float)) and math.isfinite(cfg.oversubscription)
            and cfg.oversubscription >= 1):
        raise ParameterError(f"oversubscription must be a number >= 1 (hosts per rack x bandwidth / "
                             f"(spines x uplink rate)), got {cfg.oversubscription!r}")
    for name in ("uplink_bandwidth_bps", "wan_bandwidth_bps"):
        v = getattr(cfg, name)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ParameterError(f"{name} must be a positive number, got {v!r}")
    if not (isinstance(cfg.wan_delay_s, (int, float)) and math.isfinite(cfg.wan_delay_s) and cfg.wan_delay_s >= 0):
        raise ParameterError(f"wan_delay_s must be a non-negative number, got {cfg.wan_delay_s!r}")
    if cfg.wan_queue_bytes is not None:
        _positive_int("wan_queue_bytes", cfg.wan_queue_bytes)
    if not (isinstance(cfg.wan_loss, (int, float)) and 0 <= cfg.wan_loss < 1):
        raise ParameterError(f"wan_loss must be a probability in [0, 1), got {cfg.wan_loss!r}")
    if not (isinstance(cfg.local_workers, int) and not isinstance(cfg.local_workers, bool)
            and 0 <= cfg.local_workers <= cfg.workers):
        raise ParameterError(f"local_workers must be an integer between 0 and workers ({cfg.workers}), "
                             f"got {cfg.local_workers!r}")
    ports = cfg.switch_ports
    if ports is None:
        return
    m = dedicated_servers(cfg)
    servers = "the server" if m == 1 else f"the {m} servers"
    if cfg.topology == "star":
        _fits("s1", cfg.workers + m, ports, "workers" if m == 0 else f"workers + {servers}")
    elif cfg.topology == "leafspine":
        _fits("each leaf", hosts_per_rack(cfg) + cfg.spines, ports, "the fullest rack's hosts + one uplink per spine")
        _fits("each spine", cfg.racks, ports, "one link per rack")
    else:
        _fits("s1", cfg.local_workers + m + 1, ports, "local workers + the WAN" if m == 0
              else f"local workers + {servers} + the WAN")
        _fits("s2", cfg.workers - cfg.local_workers + 1, ports, "remote workers + the WAN")


def _fits(switch: str, need: int, ports: int, what: str) -> None:
    if need > ports:
        raise ParameterError(f"switch_ports={ports} is too few: {switch} needs {need} ({what}); "
                             "use fewer workers or more racks, or raise it")


def _positive_int(name: str, v: Any) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ParameterError(f"{name} must be a positive integer, got {v!r}")


def build_network(cfg: Any) -> Network:
    """Hosts and paths of ``cfg``'s topology and aggregation (parameters already checked)."""
    wire, n = cfg.wire_bytes, cfg.workers
    m = dedicated_servers(cfg)
    # a datagram's receive part is the receiving host's: a worker's uploads reach a server, a broadcast a worker
    up_recv = cfg.server_recv_cost_s if m else cfg.recv_cost_s
    workers = [Host(f"w{i}", cfg.send_pps, cfg.bandwidth_bps, wire, up_recv) for i in range(n)]
    if m == 0:  # sharded: shard server i on worker i's host (one NIC, one send loop for both roles)
        servers = workers
    else:
        servers = [Host("server" if m == 1 else f"server{j}", cfg.server_pps, cfg.server_rate_bps, wire,
                        cfg.recv_cost_s) for j in range(m)]
    fab = Fabric(cfg, servers if m else [], workers)
    up: list[Path] = []
    down: list[Path] = []
    remote: list[bool] = []
    local: list[bool] = []
    for s in servers:  # flow j * n + i
        for w in workers:
            if s is w:
                up.append(fab.loopback(w, "up"))
                down.append(fab.loopback(w, "down"))
                remote.append(False)
                local.append(True)
                continue
            up.append(fab.path(w, s))
            down.append(fab.path(s, w))
            remote.append(fab.crosses_wan(w, s))
            local.append(False)
    if cfg.topology == "leafspine":
        both = queueless_as_delay(up + down, wire)
        up, down = both[: len(up)], both[len(up) :]
    hub = [None] + [(fab.path(s, servers[0]), fab.path(servers[0], s)) for s in servers[1:]]
    return Network(servers, workers, up, down, remote, local, hub)


class Fabric:
    """Where each host sits and the ports between them: one egress port per host at its
    switch (``->NAME``, the host's link rate), and the star's one switch, the leaf-spine's
    racks or the two sites; :meth:`path` is the one rule for a path between two hosts."""

    def __init__(self, cfg: Any, servers: list[Host], workers: list[Host]) -> None:
        self.cfg = cfg
        d, q = cfg.delay_s, cfg.queue_bytes
        self.d, self.ov, self.q = d, cfg.ctrl_overhead_s, q
        self.port = {id(h): Port(f"->{h.name}", h.nic_bps, q) for h in servers + workers}
        self.where: dict[int, int] = {id(h): 0 for h in servers}  # rack (leafspine) or site (twosites): servers in the first
        for i, w in enumerate(workers):
            if cfg.topology == "leafspine":
                self.where[id(w)] = rack_of(i, cfg.racks)
            elif cfg.topology == "twosites":
                self.where[id(w)] = 0 if i < cfg.local_workers else 1
            else:
                self.where[id(w)] = 0
        if cfg.topology == "leafspine":
            rate = cfg.spines * uplink_rate_bps(cfg)  # a rack's pooled uplinks
            self.to_spine = [Port(f"leaf{r + 1}->spines", rate, q) for r in range(cfg.racks)]
            self.from_spine = [Port(f"spines->leaf{r + 1}", rate, q) for r in range(cfg.racks)]
        elif cfg.topology == "twosites":
            wq = q if cfg.wan_queue_bytes is None else cfg.wan_queue_bytes
            self.to_wan = [Port("s1->wan", cfg.wan_bandwidth_bps, wq), Port("s2->wan", cfg.wan_bandwidth_bps, wq)]

    def crosses_wan(self, a: Host, b: Host) -> bool:
        return self.cfg.topology == "twosites" and self.where[id(a)] != self.where[id(b)]

    def path(self, a: Host, b: Host) -> Path:
        """Host ``a`` -> host ``b``: one switch between them when they share it, else
        leaf -> spines -> leaf, or site -> WAN -> site."""
        d, ov, ra, rb = self.d, self.ov, self.where[id(a)], self.where[id(b)]
        last = self.port[id(b)]
        if ra == rb:
            return Path(a, d, last, d, ov)
        if self.cfg.topology == "leafspine":
            return Path(a, d, self.to_spine[ra], d, ov, ((self.from_spine[rb], d), (last, d)))
        return Path(a, d, self.to_wan[ra], self.cfg.wan_delay_s, ov, ((last, d),))

    def loopback(self, h: Host, direction: str) -> Path:
        """``h``'s loopback for a host-local transfer (a worker's own shard, ``direction`` up or
        down): LOOPBACK_S a frame, no link, no queue, no other flow beside it."""
        rate = h.wire_bytes * 8.0 / LOOPBACK_S
        name = f"{h.name}-lo-{direction}"
        return Path(Host(name, 1.0 / LOOPBACK_S, rate, h.wire_bytes), 0.0, Port(name, rate, _LOOPBACK_QUEUE),
                    0.0, self.ov)



def queueless_as_delay(paths: list[Path], wire: int) -> list[Path]:
    """``paths`` with every port that can never hold a queue made a fixed delay (its serialisation).

    A port past a path's first whose every datagram, on every path through it,
    comes out of one and the same port of no higher rate receives datagrams at
    least one of its own serialisation times apart: it never queues and never
    drops (leaf-spine with two racks: [spines->leaf1] takes only rack 2's
    uplink; with any number, [spines->leaf r] takes only rack 1's, the
    broadcast, and [leaf r->w] only that). Keeping it as a port is not
    harmless at round level: the fluid queue sees each pass at its own
    sender's rate, not thinned by the drops of the port before, so a congested
    uplink's flows would overflow the equal-rate port after it a second time
    (measured: 3,639 datagrams sent per rack-2 worker and round instead of the
    packet level's 3,180 at a 250 Mbit/s uplink). As a delay it is exact at
    both levels for the data; a control frame crossing it is charged a full
    datagram's serialisation there (~45 us at 250 Mbit/s) instead of its own.
    """
    feeders: dict[int, set[int]] = {}  # port -> what hands it datagrams: the port before it, or the host
    for path in paths:
        ports = path.ports
        feeders.setdefault(id(ports[0]), set()).add(id(path.host))
        for k in range(1, len(ports)):
            feeders.setdefault(id(ports[k]), set()).add(id(ports[k - 1]))
    rate = {id(p): p.rate_bps for path in paths for p in path.ports}
    queueless = {pid for pid, fs in feeders.items()
                 if len(fs) == 1 and next(iter(fs)) in rate and rate[next(iter(fs))] <= rate[pid]}
    out = []
    for path in paths:
        hops = [(path.port, path.d2)] + list(path.more)
        kept = [hops[0]]
        for port, dly in hops[1:]:
            if id(port) in queueless:
                kept[-1] = (kept[-1][0], kept[-1][1] + port.ser(wire) + dly)
            else:
                kept.append((port, dly))
        out.append(Path(path.host, path.d1, kept[0][0], kept[0][1], path.ctrl_overhead_s, tuple(kept[1:])))
    return out


def wan_loss_spec(cfg: Any) -> list[dict]:
    """The WAN's loss as a loss-process spec for the remote workers' flows (none when 0)."""
    return [{"kind": "bernoulli", "p": float(cfg.wan_loss)}] if cfg.topology == "twosites" and cfg.wan_loss else []
