"""Random packet loss without netem: nftables ``numgen random`` drop rules in a host's netns.

One ``netdev`` table ``dblp_loss`` per host namespace, one base chain per
(interface, direction), bound to the interface's ``ingress`` or ``egress``
hook. Why netdev hooks and not inet input/output: a drop in the inet
``output``/``postrouting`` hooks is reported to the sending application as
``EPERM`` from ``sendto`` (a drop on the wire is silent), which would crash or
mislead the transport under test. The netdev egress hook sits just before the
qdisc, where a drop looks to a UDP sender like a full NIC queue (silently
counted), and the ingress hook sees frames as they come off the wire, before
any local processing. Both see exactly one interface, i.e. one link end.

Each chain holds two rules: one that counts every matching packet (``seen``)
and one that drops ``rate`` of them (``numgen random mod 10000 < N``), both
feeding *named* counters, which survive rule replacement. Changing the rate is
one ``nft -f -`` transaction (flush chain + add rules), a few milliseconds, so
a burst can start and end at iteration boundaries. The rule text and the
counter parsing are :mod:`emulation.nft`'s; this module keeps the state.

The hooks see socket buffers, not wire frames. A UDP GSO send is one buffer
of up to 64 datagrams from the sender's ``sendmsg`` until some device cuts
it, and that is never before the sending host's own egress hook (the egress
hook runs before the qdisc, the cut after it); a GRO-merged receive is one
buffer again before the receiver's ingress hook. So a rule on a host's own
hooks drops whole super-packets. **Segmented links** (:func:`segment_links`,
what the emulation runs with ``--gso``) keep loss per datagram at GSO speed:
every host's device cuts its UDP GSO sends (``tx-udp-segmentation off``:
after the host's qdisc, so the sender still makes one system call per 64
datagrams), the rules sit on the *switch end* of each link (a host's
``ingress`` target on the switch port's egress hook, its ``egress`` target on
the switch port's ingress hook), where every datagram passes alone, and the
host end merges what survives again (GRO; the switch end without TSO so its
veth hands packets to that GRO), so the receiver also makes one call per
run. ``tests/emulation/test_emu_gso.py`` checks it datagram by datagram. The
switch ends need a net with ``switch_port(host)`` and ``switch_cmd(host,
argv, ...)`` (:class:`emulation.net.EmuNet`, :class:`emulation.nshosts.NsNet`).
IP fragments after the first carry no UDP header and are not matched by
``udp`` targets (losing the first fragment still loses the datagram).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from . import nft
from .shaping import backpressure_commands
from .sysutil import have, offload_args

TABLE = "dblp_loss"
#: the hook of the switch end of a link that sees a host's ``ingress`` / ``egress`` packets
SWITCH_HOOK = {"ingress": "egress", "egress": "ingress"}


@dataclass(frozen=True)
class LossTarget:
    """Where loss applies: a host's interface, a direction, and which packets.

    host: Mininet host name. direction: ``ingress`` (packets arriving at the
    host) or ``egress`` (packets it sends). proto: ``udp`` (the DBLP data
    datagrams; TCP control stays reliable) or ``all`` (every IPv4/IPv6 packet,
    TCP included; ARP is never dropped). dports: optional inclusive UDP
    destination port range. intf: interface name (default: host's first).
    """

    host: str
    direction: Literal["ingress", "egress"] = "ingress"
    proto: Literal["udp", "all"] = "udp"
    dports: tuple[int, int] | None = None
    intf: str | None = None

    def __post_init__(self) -> None:
        if self.direction not in ("ingress", "egress"):
            raise ValueError(f"direction must be ingress or egress, not {self.direction!r}")
        if self.proto not in ("udp", "all"):
            raise ValueError(f"proto must be udp or all, not {self.proto!r}")
        nft.match(self.proto, self.dports)  # refuses dports with 'all'
        if self.dports:
            lo, hi = self.dports
            if not 0 < lo <= hi < 65536:
                raise ValueError(f"bad port range {self.dports}")

    def device(self, default_intf: str) -> str:
        return self.intf or default_intf

    def match(self) -> str:
        """The nft match expression for this target's packets."""
        return nft.match(self.proto, self.dports)

    def chain(self, default_intf: str) -> str:
        """The nft chain of this target (one per link end, direction and packets)."""
        return nft.chain_name(self.direction, self.device(default_intf), self.proto, self.dports)

    def label(self) -> str:
        """A short human label, e.g. ``srv:ingress:udp:5000-5999``."""
        ports = f":{self.dports[0]}-{self.dports[1]}" if self.dports else ""
        return f"{self.host}:{self.direction}:{self.proto}{ports}"


@dataclass(frozen=True)
class Hook:
    """Where one target's chain sits: on ``host``'s own interface, or (``switch_end``) on the
    switch end of ``host``'s link; ``dev`` and the netdev ``hook`` there."""

    host: str
    switch_end: bool
    dev: str
    hook: Literal["ingress", "egress"]


def hook_of(net: Any, target: LossTarget, segmented: bool = False) -> Hook:
    """The hook that sees ``target``'s packets one datagram at a time (see the module doc):
    the host's own interface, or on a segmented link the switch end (directions swapped)."""
    if not segmented:
        return Hook(target.host, False, target.device(net.host_intf(target.host)), target.direction)
    if target.intf is not None:
        raise ValueError(f"{target.label()}: a segmented link's rules sit on the switch end; "
                         "a target's own interface (intf=) cannot be chosen")
    return Hook(target.host, True, net.switch_port(target.host), SWITCH_HOOK[target.direction])


def hook_cmd(net: Any, where: Hook, args: list[str], *, input: str | None = None, check: bool = True,
             timeout: float = 60.0) -> str:
    """Run ``args`` in the namespace of ``where`` (the host's, or its link's switch end's)."""
    run = net.switch_cmd if where.switch_end else net.cmd
    return run(where.host, args, input=input, check=check, timeout=timeout)


def table_counters(net: Any, where: Hook, table: str) -> dict:
    """The counters of every chain of nft ``table`` in the namespace of ``where``, parsed
    (:func:`emulation.nft.parse_counters`); a host that is gone gives none (no raise)."""
    return nft.parse_counters(hook_cmd(net, where, nft.list_counters_args(table), check=False, timeout=10))


def segment_links(net: Any, hosts: list[str] | tuple[str, ...], on: bool = True) -> None:
    """Put the links of ``hosts`` in the segmented mode (``on``) or back to veth defaults.

    Segmented: each host's device cuts its UDP GSO sends into datagrams and merges what it
    receives (GRO), the switch end has no TSO (so its veth feeds that GRO) and a queue
    (:data:`emulation.shaping.BACKPRESSURE_QUEUE` where it had none, so a full GRO ring holds
    packets back instead of dropping them); the feature lists are :mod:`emulation.sysutil`'s.
    Every sending host must be in it, or its super-packets reach the switch end whole. Rules
    of a :class:`LossController` made with ``segmented=True`` then drop single datagrams.
    Needs ``ethtool``."""
    if not have("ethtool"):
        raise RuntimeError("segmented links (--gso in the emulation) need ethtool: apt-get install ethtool "
                           "(scripts/setup.sh installs it)")
    for h in hosts:
        port = net.switch_port(h)
        net.cmd(h, offload_args(net.host_intf(h), switch_end=False, segmented=on))
        net.switch_cmd(h, offload_args(port, switch_end=True, segmented=on))
        for cmd in backpressure_commands(port, net.switch_cmd(h, ["tc", "-j", "qdisc", "show", "dev", port]), on):
            net.switch_cmd(h, cmd)


class LossController:
    """Adds, changes and removes loss rules on host links of an ``EmuNet``. Thread-safe.

    Every change is logged in ``self.log`` as ``{"t", "target", "rate"}``;
    ``close()`` (or leaving the ``with`` block) deletes the tables it made.
    ``segmented``: the links are in :func:`segment_links`' mode, so rules go on the
    switch ends (table ``<table>_sw<pid>`` there: a switch end's namespace may be shared).
    """

    def __init__(self, net, table: str = TABLE, *, segmented: bool = False) -> None:
        # net: anything with cmd(host, argv, input=, check=, timeout=) -> stdout and host_intf(host)
        # (segmented: also switch_port(host) and switch_cmd(host, ...)):
        # emulation.net.EmuNet, emulation.nshosts.NsNet, emulation.hosts' transport adapter
        self.net = net
        self.table = table
        self.segmented = segmented
        self._lock = threading.Lock()
        self._installed: dict[tuple[Hook, str], LossTarget] = {}  # (hook, chain) -> target
        self._rates: dict[LossTarget, float] = {}
        self._sites: dict[tuple[str, bool], Hook] = {}  # namespaces touched: (host, switch_end) -> a hook there
        self.log: list[dict] = []

    def __enter__(self) -> "LossController":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ names
    def _table(self, where: Hook) -> str:
        return f"{self.table}_sw{os.getpid()}" if where.switch_end else self.table

    def _where(self, target: LossTarget) -> tuple[Hook, str]:
        where = hook_of(self.net, target, self.segmented)
        return where, nft.chain_name(where.hook, where.dev, target.proto, target.dports)

    def use_segmented_links(self, hosts: list[str] | tuple[str, ...]) -> None:
        """Segment the links of ``hosts`` (:func:`segment_links`) and put every rule of this
        controller on their switch ends: the emulation's GSO mode. Before the first rule
        (a rule already on a host's own hooks would miss datagrams that GRO merged)."""
        with self._lock:
            if self._installed and not self.segmented:
                raise RuntimeError("loss rules already sit on the hosts' own hooks: segment the links "
                                   "before the first set_loss")
            segment_links(self.net, hosts)
            self.segmented = True

    # ------------------------------------------------------------ rules
    def set_loss(self, target: LossTarget, rate: float) -> float:
        """Drop ``rate`` of the target's packets from now on (0 = none). Returns time.time().

        The first call for a target creates its chain and counters; later calls
        swap the rules atomically (one nft transaction).
        """
        return self.set_losses({target: rate})

    def set_losses(self, rates: dict[LossTarget, float]) -> float:
        """:meth:`set_loss` for several targets at once: one nft transaction per namespace, so the
        rules of one host (a burst on its ingress and egress) switch together, in one command
        (one round trip on a remote host). Returns time.time() after the last one."""
        per_site: dict[tuple[str, bool], tuple[Hook, list[str], list[tuple]]] = {}
        t = time.time()
        with self._lock:
            for target, rate in rates.items():
                where, chain = self._where(target)
                table = self._table(where)
                key = (where, chain)
                existing = self._installed.get(key)
                if existing is not None and existing != target:
                    raise ValueError(f"{target} collides with {existing} on chain {chain}")
                site = per_site.setdefault((where.host, where.switch_end), (where, [], []))
                if existing is None:
                    site[1].extend(nft.chain_lines(table, chain, where.hook, where.dev))
                site[1].extend(nft.drop_lines(table, chain, target.match(), rate))
                site[2].append((key, target, nft.applied_rate(rate)))
            for (host, sw), (where, lines, done) in per_site.items():
                hook_cmd(self.net, where, ["nft", "-f", "-"], input=nft.script(lines))
                t = time.time()
                for key, target, r in done:
                    self._installed[key] = target
                    self._rates[target] = r
                    self.log.append({"t": t, "target": target.label(), "rate": r})
                self._sites.setdefault((host, sw), where)
            return t

    def clear(self, target: LossTarget) -> float:
        """Stop dropping on ``target`` (counting continues). Returns time.time()."""
        return self.set_loss(target, 0.0)

    def rate(self, target: LossTarget) -> float:
        """The loss rate currently installed on ``target`` (0 if none)."""
        return self._rates.get(target, 0.0)

    def counters(self) -> dict[str, dict]:
        """Per target label: packets seen / dropped (bytes too) since the target was first set."""
        with self._lock:
            targets = dict(self._installed)
            sites = dict(self._sites)
        raw = {site: table_counters(self.net, where, self._table(where)) for site, where in sites.items()}
        return {target.label(): {"host": where.host, "chain": chain, "rate": self._rates.get(target, 0.0),
                                 **({"switch_end": where.dev} if where.switch_end else {}),
                                 **nft.chain_counters(raw[(where.host, where.switch_end)], chain)}
                for (where, chain), target in targets.items()}

    def close(self) -> None:
        """Delete this controller's table from every host it touched (ignores dead hosts)."""
        with self._lock:
            for where in self._sites.values():
                try:
                    hook_cmd(self.net, where, nft.delete_table_args(self._table(where)), check=False, timeout=5)
                except Exception:  # noqa: BLE001 - host may be gone already
                    pass
            self._sites.clear()
            self._installed.clear()
            self._rates.clear()

    def describe(self) -> list[dict]:
        """The installed targets and their rates (for the run recorder)."""
        return [dict(asdict(t), rate=r, label=t.label()) for t, r in self._rates.items()]

