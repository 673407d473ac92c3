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
from .transport import Transport

#: the nft table the launcher makes on each host (removed after every run)
NFT_TABLE = "dblp_hosts"


class HostsNet:
    """What :class:`emulation.loss.LossController` needs of a network, over a transport."""

    def __init__(self, tr: Transport) -> None:
        self.tr = tr

    def cmd(self, host: str, args: Sequence[str], *, input: str | None = None, check: bool = True,
            timeout: float = 30.0) -> str:
        h = self.tr.inv.host(host)
        script = ("sudo -n " if h.sudo else "") + shlex.join(list(args))
        r = self.tr.run(h, script, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise HostsError(f"host {host}: {script!r} failed (rc={r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def host_intf(self, host: str) -> str:
        return self.tr.inv.host(host).intf


def loss_controller(tr: Transport) -> LossController:
    """A loss controller acting on the inventory's hosts through ``tr``."""
    return LossController(HostsNet(tr), table=NFT_TABLE)


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
