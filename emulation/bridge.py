"""A Mininet switch that is a plain Linux bridge, driven with iproute2.

Mininet's own ``LinuxBridge`` shells out to ``brctl`` (bridge-utils), which a
minimal Debian lacks, and this kernel has no Open vSwitch module, so we keep
the same idea (a kernel bridge in the root namespace, no controller) with
``ip link`` only. Every bridge gets the ifalias ``dblpem`` so that
``python -m emulation.cleanup`` can tell our bridges from anybody else's.
"""

from __future__ import annotations

from mininet.node import Switch

from .sysutil import BRIDGE_ALIAS, run


class IPBridge(Switch):
    """Linux bridge switch. ``stp=True`` enables kernel STP (needed for loops, e.g. 2 spines)."""

    def __init__(self, name: str, stp: bool = False, **kwargs) -> None:
        self.stp = stp
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
        """Create the bridge, enslave our ports, bring it up."""
        run(["ip", "link", "del", self.name], check=False)
        run(["ip", "link", "add", "name", self.name, "type", "bridge",
             "stp_state", "1" if self.stp else "0",
             # STP's minimum forward delay (2 s) keeps loop topologies quick to start
             "forward_delay", "200" if self.stp else "0"])
        run(["ip", "link", "set", "dev", self.name, "alias", BRIDGE_ALIAS])
        for intf in self.intfList():
            if self.name in intf.name:
                run(["ip", "link", "set", "dev", intf.name, "master", self.name])
                run(["ip", "link", "set", "dev", intf.name, "up"])
        run(["ip", "link", "set", "dev", self.name, "up"])

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet API
        """Delete the bridge (and, by default, our veth ends)."""
        run(["ip", "link", "del", self.name], check=False)
        super().stop(deleteIntfs)


def _bridge_ports(bridge: str) -> list[dict]:
    import json

    out = run(["ip", "-j", "-d", "link", "show", "master", bridge], check=False)
    try:
        return json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return []
