"""A Mininet switch that is a plain Linux bridge, driven with iproute2.

Mininet's own ``LinuxBridge`` shells out to ``brctl`` (bridge-utils), which a
minimal Debian lacks, and this kernel has no Open vSwitch module, so we keep
the same idea (a kernel bridge in the root namespace, no controller) with
``ip link`` only. Every bridge gets the ifalias ``dblpem pid=<creator>``
(:func:`emulation.runstate.bridge_alias`) so that ``python -m emulation.cleanup``
can tell our bridges from anybody else's, and a leftover from a live one.

A bridge of the same name that this testbed did not make (a plain Mininet
session's, a host's ``br0``) is never deleted: starting refuses with a message
instead (:class:`emulation.net.EmuNet` picks names that clash with nothing).
"""

from __future__ import annotations

import json

from mininet.node import Switch

from .runstate import alias_owner, bridge_alias, stale_bridge
from .sysutil import CommandError, run


class IPBridge(Switch):
    """Linux bridge switch. ``stp=True`` enables kernel STP (needed for loops, e.g. 2 spines)."""

    def __init__(self, name: str, stp: bool = False, **kwargs) -> None:
        self.stp = stp
        self.created = False  # whether start() made the bridge: only then does stop() delete it
        super().__init__(name, **kwargs)

    def connected(self) -> bool:
        """Forwarding yet? Without STP at once; with STP when no port is still learning."""
        if not self.stp:
            return True
        for link in _bridge_ports(self.name):
            state = link.get("linkinfo", {}).get("info_slave_data", {}).get("state")
            if state in ("listening", "learning"):
                return False
        return True

    def start(self, _controllers) -> None:  # noqa: D401 - Mininet API
        """Create the bridge, enslave our ports, bring it up.

        An existing interface of this name is deleted only when it is a leftover
        testbed bridge whose creator is gone; anything else is refused.
        """
        existing = _link(self.name)
        if existing is not None:
            alias = existing.get("ifalias")
            if not stale_bridge(alias):
                owner = alias_owner(alias)
                whose = (f"a live testbed run's (pid {owner})" if owner else
                         "not made by this testbed (a plain Mininet session? the host's own?)")
                raise CommandError(
                    f"switch {self.name!r}: an interface of that name already exists, {whose}; "
                    "it is left alone. Name the switch differently, or remove that one yourself "
                    f"(`ip link del {self.name}`) if it is a leftover.")
            run(["ip", "link", "del", self.name], check=False)
        run(["ip", "link", "add", "name", self.name, "type", "bridge",
             "stp_state", "1" if self.stp else "0",
             # STP's minimum forward delay (2 s) keeps loop topologies quick to start
             "forward_delay", "200" if self.stp else "0"])
        self.created = True
        run(["ip", "link", "set", "dev", self.name, "alias", bridge_alias()])
        for intf in self.intfList():
            if self.name in intf.name:
                run(["ip", "link", "set", "dev", intf.name, "master", self.name])
                run(["ip", "link", "set", "dev", intf.name, "up"])
        run(["ip", "link", "set", "dev", self.name, "up"])

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet API
        """Delete the bridge if we made it (and, by default, our veth ends)."""
        if self.created:
            run(["ip", "link", "del", self.name], check=False)
            self.created = False
        super().stop(deleteIntfs)


def _link(name: str) -> dict | None:
    """``ip -j -d link show NAME``, parsed; None when there is no such interface."""
    out = run(["ip", "-j", "-d", "link", "show", "dev", name], check=False)
    try:
        found = json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return None
    return found[0] if found else None


def _bridge_ports(bridge: str) -> list[dict]:
    out = run(["ip", "-j", "-d", "link", "show", "master", bridge], check=False)
    try:
        return json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return []
