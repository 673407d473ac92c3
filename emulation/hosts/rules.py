"""Loss rules on inventory hosts: nftables through the transport (ssh, a namespace, ``sudo -n``).

The rules, their transactions and counters are :class:`emulation.loss.LossController`'s
(rule text: :mod:`emulation.nft`) - the same as in Mininet; only the way a
command reaches the host differs: :class:`HostsNet` gives the controller the
``cmd``/``host_intf`` it needs, over the run's transport. Iteration-keyed
rules become an :class:`emulation.bursts.BurstInjector` schedule.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from ..bursts import IterationBurst
from ..loss import LossController, LossTarget
from .inventory import HostsError, Inventory
from .keep import KeptHost
from .transport import Transport

#: the nft table the launcher makes on each host (removed after every run)
NFT_TABLE = "dblp_hosts"


class HostsNet:
    """What :class:`emulation.loss.LossController` needs of a network, over a transport.

    ``kept``: hosts with a kept agent (:class:`emulation.hosts.keep.KeptHost`): their commands
    go through it (one line each way, nft in the agent's process) instead of a transport
    process per command. ``rules_t``: per kept host, when its last rule transaction
    (``nft -f -``) finished, on its clock: when a burst was really on there."""

    def __init__(self, tr: Transport, kept: dict[str, KeptHost] | None = None) -> None:
        self.tr = tr
        self.kept = dict(kept or {})
        self.rules_t: dict[str, float] = {}

    def cmd(self, host: str, args: Sequence[str], *, input: str | None = None, check: bool = True,
            timeout: float = 30.0) -> str:
        h = self.tr.inv.host(host)
        argv = (["sudo", "-n"] if h.sudo else []) + list(args)
        if host in self.kept:
            r = self.kept[host].cmd(argv, input=input, timeout=timeout)
            rc, out, err = r["rc"], r["stdout"], r["stderr"]
            if "-f" in argv:
                self.rules_t[host] = r["t"]
        else:
            p = self.tr.run(h, shlex.join(argv), input=input, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        if check and rc != 0:
            raise HostsError(f"host {host}: {shlex.join(argv)!r} failed (rc={rc}): {err.strip()}")
        return out

    def host_intf(self, host: str) -> str:
        return self.tr.inv.host(host).intf


def loss_controller(tr: Transport, kept: dict[str, KeptHost] | None = None) -> LossController:
    """A loss controller acting on the inventory's hosts through ``tr`` (or their kept agents)."""
    return LossController(HostsNet(tr, kept), table=NFT_TABLE)


def loss_targets(inv: Inventory) -> tuple[list[tuple[LossTarget, float]], list[IterationBurst]]:
    """(static [(target, rate)], iteration bursts) of the inventory's loss rules.

    Rules bursting in the same iterations at the same loss switch together
    (one burst, several targets)."""
    static_rules, burst_rules = inv.loss_schedule()

    def target(h, r) -> LossTarget:
        return LossTarget(h.name, r.direction, r.proto, tuple(r.dports) if r.dports else None, r.intf)

    static = [(target(h, r), p) for h, r, p in static_rules]
    keyed: dict[tuple[int, int, float], list[LossTarget]] = {}
    for h, r, k, n, loss in burst_rules:
        keyed.setdefault((k, n, loss), []).append(target(h, r))
    bursts = [IterationBurst(k, loss, n, targets=tuple(ts)) for (k, n, loss), ts in sorted(keyed.items())]
    return static, bursts
