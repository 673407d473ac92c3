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
unless ``--link tc``, which these files make the testbed's TBF link: ``bw`` is its rate,
``max_queue_size``/``buffer_pkts`` a real drop-tail queue, ``delay`` netem where the kernel has
it; ``loss`` is refused - see :mod:`emulation.mnlink`).
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
        refuse_loss(loss)
        buffer_pkts, buffer_bytes = queue(buffer_pkts, buffer_bytes, max_queue_size)
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


# `mn --custom` exec()s this file: offer the testbed's iproute2 bridge as `--switch ipbr` (Mininet's
# lxbr needs brctl) and its TBF link as `--link tc` (Mininet's TCLink would ignore the queue);
# a refused option exits before mn builds anything (else mn's error path runs `mn -c`).
from emulation.mnlink import mn_custom

globals().update(mn_custom({"star": StarTopo}))  # topos, switches, links (LINKS), validate
