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

Why a module of its own: the paths are the only thing the engines see of a
topology (:class:`dblp.sim.net.Path`), so one function builds them all and
the checks of the parameters sit beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..wire import ParameterError
from .net import Host, Path, Port

TOPOLOGIES = ("star", "leafspine", "twosites")


@dataclass
class Network:
    """What :class:`dblp.sim.model.Simulation` needs of a topology."""

    server_host: Host
    worker_hosts: list[Host]
    up_paths: list[Path]
    down_paths: list[Path]
    remote: list[bool]  # per worker: its datagrams cross the WAN (twosites)


def hosts_per_rack(cfg: Any) -> int:
    """The fullest rack's hosts (server included): the oversubscription's numerator."""
    return math.ceil((cfg.workers + 1) / cfg.racks)


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
    if cfg.topology == "star":
        _fits("s1", cfg.workers + 1, ports, "workers + the server")
    elif cfg.topology == "leafspine":
        _fits("each leaf", hosts_per_rack(cfg) + cfg.spines, ports, "the fullest rack's hosts + one uplink per spine")
        _fits("each spine", cfg.racks, ports, "one link per rack")
    else:
        _fits("s1", cfg.local_workers + 2, ports, "local workers + the server + the WAN")
        _fits("s2", cfg.workers - cfg.local_workers + 1, ports, "remote workers + the WAN")


def _fits(switch: str, need: int, ports: int, what: str) -> None:
    if need > ports:
        raise ParameterError(f"switch_ports={ports} is too few: {switch} needs {need} ({what}); "
                             "use fewer workers or more racks, or raise it")


def _positive_int(name: str, v: Any) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise ParameterError(f"{name} must be a positive integer, got {v!r}")


def build_network(cfg: Any) -> Network:
    """Hosts and paths of ``cfg``'s topology (parameters already checked)."""
    wire, d, n, ov = cfg.wire_bytes, cfg.delay_s, cfg.workers, cfg.ctrl_overhead_s
    q = cfg.queue_bytes
    server = Host("server", cfg.server_pps, cfg.server_rate_bps, wire)
    workers = [Host(f"w{i}", cfg.send_pps, cfg.bandwidth_bps, wire) for i in range(n)]
    srv_port = Port("->server", cfg.server_rate_bps, q)  # the incast port: every upstream ends there
    w_ports = [Port(f"->w{i}", cfg.bandwidth_bps, q) for i in range(n)]
    remote = [False] * n
    if cfg.topology == "star":
        up = [Path(workers[i], d, srv_port, d, ov) for i in range(n)]
        down = [Path(server, d, w_ports[i], d, ov) for i in range(n)]
    elif cfg.topology == "leafspine":
        rate = cfg.spines * uplink_rate_bps(cfg)  # a rack's pooled uplinks
        to_spine = [Port(f"leaf{r + 1}->spines", rate, q) for r in range(cfg.racks)]
        from_spine = [Port(f"spines->leaf{r + 1}", rate, q) for r in range(cfg.racks)]
        up, down = [], []
        for i in range(n):
            r = rack_of(i, cfg.racks)
            if r == 0:  # the server's rack: one switch between them
                up.append(Path(workers[i], d, srv_port, d, ov))
                down.append(Path(server, d, w_ports[i], d, ov))
            else:
                up.append(Path(workers[i], d, to_spine[r], d, ov, ((from_spine[0], d), (srv_port, d))))
                down.append(Path(server, d, to_spine[0], d, ov, ((from_spine[r], d), (w_ports[i], d))))
        both = queueless_as_delay(up + down, wire)
        up, down = both[:n], both[n:]
    else:
        wq = q if cfg.wan_queue_bytes is None else cfg.wan_queue_bytes
        wan_up = Port("s2->wan", cfg.wan_bandwidth_bps, wq)
        wan_down = Port("s1->wan", cfg.wan_bandwidth_bps, wq)
        dw = cfg.wan_delay_s
        up, down = [], []
        for i in range(n):
            if i < cfg.local_workers:
                up.append(Path(workers[i], d, srv_port, d, ov))
                down.append(Path(server, d, w_ports[i], d, ov))
            else:
                remote[i] = True
                up.append(Path(workers[i], d, wan_up, dw, ov, ((srv_port, d),)))
                down.append(Path(server, d, wan_down, dw, ov, ((w_ports[i], d),)))
    return Network(server, workers, up, down, remote)


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
