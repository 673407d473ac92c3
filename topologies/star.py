"""The paper's testbed: one parameter server and N workers on one switch.

    w1 --+
    w2 --+-- s1 -- srv        (+ optional x1..xM for cross-traffic)
    w3 --+

Every link is shaped at ``bw`` Mbit/s with a ``buffer``-sized drop-tail queue
at both ends; the queue that matters for incast is s1's port towards ``srv``,
where all workers' uploads (and any cross-traffic) meet.

Usage: ``emulation.net.EmuNet(StarTopo(...))``, which shapes every link with
TBF itself; or the Mininet CLI, ``mn --custom topologies/star.py --topo star,n=3
--switch ipbr --controller none --test pingall`` (there links stay unshaped
unless ``--link tc``, whose HTB gives ``bw`` but whose buffer and delay need netem).
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


def link_opts(bw: float | None, buffer_pkts: int | None, buffer_bytes: int | None,
              delay: str | None) -> dict:
    """Shaping options for one link, in the keys ``EmuNet`` reads."""
    opts: dict = {}
    if bw is not None:
        opts["bw"] = float(bw)
    if buffer_bytes is not None:
        opts["buffer_bytes"] = int(buffer_bytes)
    elif buffer_pkts is not None:
        opts["buffer_pkts"] = int(buffer_pkts)
    if delay:
        opts["delay"] = delay
    return opts


class StarTopo(Topo):
    """``srv`` + ``w1..wN`` (+ ``x1..xM``) on switch ``s1``.

    n: workers. bw: Mbit/s of every worker/server link. buffer_pkts /
    buffer_bytes: drop-tail queue per link end (bytes win if both given).
    delay: per-link one-way delay, netem only. server_bw: the server link's rate
    if it should differ. cross_hosts: extra hosts for cross-traffic, on links of
    cross_bw Mbit/s (default bw).
    """

    def build(self, n: int = 3, bw: float | None = 100.0, buffer_pkts: int | None = 100,
              buffer_bytes: int | None = None, delay: str | None = None,
              server_bw: float | None = None, cross_hosts: int = 0,
              cross_bw: float | None = None, max_queue_size: int | None = None,
              loss: float | None = None) -> None:
        """``max_queue_size`` and ``loss`` are Mininet's names: the first is ``buffer_pkts``; a
        link loss needs netem, which this testbed does not assume, so it is refused, not ignored."""
        if n < 1:
            raise ValueError("a star needs at least one worker")
        if loss:
            raise ValueError(f"loss={loss}: link loss needs netem; the testbed drops with nftables "
                             "(emulation.loss.LossController, scenarios' --loss / bursts / traces)")
        if max_queue_size is not None:
            buffer_pkts, buffer_bytes = int(max_queue_size), None
        s1 = self.addSwitch("s1")
        srv = self.addHost("srv")
        self.addLink(srv, s1, **link_opts(server_bw if server_bw is not None else bw,
                                          buffer_pkts, buffer_bytes, delay))
        for i in range(1, n + 1):
            self.addLink(self.addHost(f"w{i}"), s1,
                         **link_opts(bw, buffer_pkts, buffer_bytes, delay))
        for i in range(1, cross_hosts + 1):
            self.addLink(self.addHost(f"x{i}"), s1,
                         **link_opts(cross_bw if cross_bw is not None else bw,
                                     buffer_pkts, buffer_bytes, delay))


# `mn --custom` exec()s this file: offer the testbed's iproute2 bridge as `--switch ipbr`
# when the repository is importable (PYTHONPATH=.), since Mininet's lxbr needs brctl.
try:
    from emulation.bridge import IPBridge

    switches = {"ipbr": IPBridge}
except ImportError:  # plain Mininet install: use --switch lxbr (bridge-utils) instead
    pass

topos = {"star": StarTopo}
