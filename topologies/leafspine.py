"""Leaf-spine: several racks (one leaf switch each) joined by spine switches.

    spine1 ... spineS
      |  \\      /  |
    leaf1  ...  leafR
     |||         |||
    hosts       hosts

``srv`` sits in rack 1; workers ``w1..wN`` fill the racks round-robin starting
with rack 2 (so with 2+ racks the server's traffic crosses the fabric), and
cross-traffic hosts ``x1..xM`` likewise. Host links run at ``bw``, leaf-spine
uplinks at ``uplink_bw`` (oversubscription = hosts per rack * bw / (spines *
uplink_bw)).

With more than one spine the L2 fabric has loops; plain Linux bridges then need
STP, so spines > 1 turns STP on (``stp=True`` switch option; start takes a few
seconds longer while ports go through listening/learning, and STP keeps only
one spine path active). One spine (the default) needs no STP.

Usage: ``mn --custom topologies/leafspine.py --topo leafspine,racks=2``.
"""

from __future__ import annotations

# `mn --custom topologies/FILE.py` exec()s this file without ``__file__`` and without the
# repository on sys.path: find the repository from the code's own file name, so the testbed's
# pieces (the `ipbr` switch) import without PYTHONPATH.
import inspect as _inspect
import sys as _sys
from pathlib import Path as _Path

_ROOT = str(_Path(_inspect.currentframe().f_code.co_filename).resolve().parent.parent)
if _ROOT not in _sys.path:
    _sys.path.insert(0, _ROOT)

from mininet.topo import Topo

from topologies.linkopts import link_opts, queue, refuse_loss


class LeafSpineTopo(Topo):
    """racks leaves, spines spines, srv + w1..wN (+ x1..xM) spread over the racks."""

    def build(self, racks: int = 2, spines: int = 1, n: int = 3, bw: float | None = 100.0,
              uplink_bw: float | None = None, buffer_pkts: int | None = 100,
              buffer_bytes: int | None = None, delay: str | None = None,
              cross_hosts: int = 0, cross_bw: float | None = None,
              max_queue_size: int | None = None, loss: float | None = None) -> None:
        """Link options as :class:`topologies.star.StarTopo`'s (Mininet's ``max_queue_size`` is
        ``buffer_pkts``; ``loss`` is refused), on every link; ``uplink_bw`` for leaf-spine links."""
        if racks < 1 or spines < 1:
            raise ValueError("need at least one rack and one spine")
        refuse_loss(loss)
        buffer_pkts, buffer_bytes = queue(buffer_pkts, buffer_bytes, max_queue_size)
        stp = spines > 1
        # names with numbers: Mininet derives a switch id from the first number
        leaves = [self.addSwitch(f"leaf{r}", stp=stp) for r in range(1, racks + 1)]
        spine_sw = [self.addSwitch(f"spine{s}", stp=stp) for s in range(1, spines + 1)]
        up = uplink_bw if uplink_bw is not None else bw
        for leaf in leaves:
            for spine in spine_sw:
                self.addLink(leaf, spine, **link_opts(up, buffer_pkts, buffer_bytes, delay))
        host_opts = link_opts(bw, buffer_pkts, buffer_bytes, delay)
        self.addLink(self.addHost("srv"), leaves[0], **host_opts)
        for i in range(1, n + 1):
            rack = i % racks  # w1 -> rack 2 (index 1) when racks >= 2
            self.addLink(self.addHost(f"w{i}"), leaves[rack], **host_opts)
        cross = link_opts(cross_bw if cross_bw is not None else bw, buffer_pkts,
                          buffer_bytes, delay)
        for i in range(1, cross_hosts + 1):
            self.addLink(self.addHost(f"x{i}"), leaves[i % racks], **cross)


# `mn --custom` exec()s this file: offer the testbed's iproute2 bridge as `--switch ipbr` (Mininet's
# lxbr needs brctl) and its TBF link as `--link tc` (Mininet's TCLink would ignore the queue);
# a refused option exits before mn builds anything (else mn's error path runs `mn -c`).
from emulation.mnlink import mn_custom

globals().update(mn_custom({"leafspine": LeafSpineTopo}))  # topos, switches, links (LINKS), validate
