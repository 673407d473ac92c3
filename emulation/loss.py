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

Caveat: the hooks see socket buffers, not wire frames. A UDP GSO send (or a
GRO-merged receive) is one buffer holding many datagrams, dropped or kept as
a whole; run the transport without GSO/GRO when loss is per datagram. IP
fragments after the first carry no UDP header and are not matched by ``udp``
targets (losing the first fragment still loses the datagram).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Literal

from . import nft

TABLE = "dblp_loss"


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


class LossController:
    """Adds, changes and removes loss rules on host links of an ``EmuNet``. Thread-safe.

    Every change is logged in ``self.log`` as ``{"t", "target", "rate"}``;
    ``close()`` (or leaving the ``with`` block) deletes the tables it made.
    """

    def __init__(self, net, table: str = TABLE) -> None:
        # net: anything with cmd(host, argv, input=, check=, timeout=) -> stdout and host_intf(host):
        # emulation.net.EmuNet, emulation.nshosts.NsNet, emulation.hosts' transport adapter
        self.net = net
        self.table = table
        self._lock = threading.Lock()
        self._installed: dict[tuple[str, str], LossTarget] = {}  # (host, chain) -> target
        self._rates: dict[LossTarget, float] = {}
        self._hosts: set[str] = set()
        self.log: list[dict] = []

    def __enter__(self) -> "LossController":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ names
    def _chain(self, target: LossTarget) -> str:
        return target.chain(self.net.host_intf(target.host))

    def _nft(self, host: str, script: str) -> None:
        self.net.cmd(host, ["nft", "-f", "-"], input=script)

    # ------------------------------------------------------------ rules
    def set_loss(self, target: LossTarget, rate: float) -> float:
        """Drop ``rate`` of the target's packets from now on (0 = none). Returns time.time().

        The first call for a target creates its chain and counters; later calls
        swap the rules atomically (one nft transaction).
        """
        n = nft.threshold(rate)
        chain = self._chain(target)
        dev = target.device(self.net.host_intf(target.host))
        key = (target.host, chain)
        lines: list[str] = []
        with self._lock:
            existing = self._installed.get(key)
            if existing is not None and existing != target:
                raise ValueError(f"{target} collides with {existing} on chain {chain}")
            if existing is None:
                lines += nft.chain_lines(self.table, chain, target.direction, dev)
            lines += nft.drop_lines(self.table, chain, target.match(), rate)
            self._nft(target.host, nft.script(lines))
            t = time.time()
            self._installed[key] = target
            self._rates[target] = n / nft.MOD
            self._hosts.add(target.host)
            self.log.append({"t": t, "target": target.label(), "rate": n / nft.MOD})
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
        raw = {host: nft.parse_counters(self.net.cmd(host, nft.list_counters_args(self.table), check=False,
                                                     timeout=10))
               for host in {h for h, _ in targets}}
        return {target.label(): {"host": host, "chain": chain, "rate": self._rates.get(target, 0.0),
                                 **nft.chain_counters(raw[host], chain)}
                for (host, chain), target in targets.items()}

    def close(self) -> None:
        """Delete this controller's table from every host it touched (ignores dead hosts)."""
        with self._lock:
            for host in self._hosts:
                try:
                    self.net.cmd(host, nft.delete_table_args(self.table), check=False, timeout=5)
                except Exception:  # noqa: BLE001 - host may be gone already
                    pass
            self._hosts.clear()
            self._installed.clear()
            self._rates.clear()

    def describe(self) -> list[dict]:
        """The installed targets and their rates (for the run recorder)."""
        return [dict(asdict(t), rate=r, label=t.label()) for t, r in self._rates.items()]

