"""Two sites (data centres) joined by one slower WAN link: the paper's cross-DC future work.

    srv, w1..wK -- s1 ==== wan (wan_bw, wan_buffer, wan_delay) ==== s2 -- w(K+1)..wN

``local_workers`` workers share site 1 with the server; the rest are remote and
every byte they exchange with ``srv`` crosses the WAN link, whose s1/s2 ends
hold the bottleneck queues. Cross-traffic hosts ``x1..xM`` sit in site 2 so
their traffic towards site 1 competes on the WAN.

Usage: ``mn --custom topologies/twosites.py --topo twosites,n=3,local_workers=1``.
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


class TwoSitesTopo(Topo):
    """Site 1 (``s1``: srv + local workers) and site 2 (``s2``: remote workers) over a WAN."""

    def build(self, n: int = 3, local_workers: int = 1, lan_bw: float | None = None,
              wan_bw: float | None = None, buffer_pkts: int | None = 100,
              buffer_bytes: int | None = None, wan_buffer_pkts: int | None = None,
              wan_buffer_bytes: int | None = None, wan_delay: str | None = None,
              cross_hosts: int = 0, bw: float | None = None, delay: str | None = None,
              max_queue_size: int | None = None, loss: float | None = None) -> None:
        """Mininet's names set every link: ``bw`` (default: LAN 1000, WAN 100 Mbit/s),
        ``delay``, ``max_queue_size`` (= ``buffer_pkts``); ``loss`` is refused. The ``lan_*`` and
        ``wan_*`` options, where given, win for their links."""
        if not 0 <= local_workers <= n:
            raise ValueError("local_workers must be between 0 and n")
        refuse_loss(loss)
        buffer_pkts, buffer_bytes = queue(buffer_pkts, buffer_bytes, max_queue_size)
        lan_bw = lan_bw if lan_bw is not None else (bw if bw is not None else 1000.0)
        wan_bw = wan_bw if wan_bw is not None else (bw if bw is not None else 100.0)
        wan_delay = wan_delay or delay
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        if wan_buffer_pkts is None and wan_buffer_bytes is None:
            wan_buffer_pkts, wan_buffer_bytes = buffer_pkts, buffer_bytes
        self.addLink(s1, s2, **link_opts(wan_bw, wan_buffer_pkts, wan_buffer_bytes, wan_delay))
        lan = link_opts(lan_bw, buffer_pkts, buffer_bytes, delay)
        self.addLink(self.addHost("srv"), s1, **lan)
        for i in range(1, n + 1):
            self.addLink(self.addHost(f"w{i}"), s1 if i <= local_workers else s2, **lan)
        for i in range(1, cross_hosts + 1):
            self.addLink(self.addHost(f"x{i}"), s2, **lan)


# `mn --custom` exec()s this file: offer the testbed's iproute2 bridge as `--switch ipbr` (Mininet's
# lxbr needs brctl) and its TBF link as `--link tc` (Mininet's TCLink would ignore the queue);
# a refused option exits before mn builds anything (else mn's error path runs `mn -c`).
from emulation.mnlink import mn_custom

globals().update(mn_custom({"twosites": TwoSitesTopo}))  # topos, switches, links (LINKS), validate
