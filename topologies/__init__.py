"""Mininet topologies of the DBLP testbed.

Every topology names its hosts the same way, so a scenario runs on any of them:
``srv`` (the parameter server), ``w1..wN`` (workers) and ``x1..xM`` (extra hosts
that only send cross-traffic). Link options are plain Mininet link params read
by ``emulation.net.EmuNet``:

- ``bw``: rate in Mbit/s (TBF),
- ``buffer_pkts`` or ``buffer_bytes``: the finite drop-tail queue (TBF ``limit``),
- ``delay``: e.g. ``"5ms"``, only honoured where the kernel has netem (the
  builder probes it and refuses a delay it cannot apply).

Mininet's own names are accepted too (``max_queue_size`` is ``buffer_pkts``);
``loss`` is refused, as it needs netem (:mod:`topologies.linkopts`).

``mn --custom topologies/star.py --topo star`` loads a module with plain
``exec``: each finds the repository from its own file name, so it imports the
testbed's pieces without ``PYTHONPATH``, and hands mn the ``ipbr`` switch and
the TBF link as ``--link tc`` (:func:`emulation.mnlink.mn_custom`).
"""

from .leafspine import LeafSpineTopo
from .star import StarTopo
from .twosites import TwoSitesTopo

TOPOLOGIES = {"star": StarTopo, "leafspine": LeafSpineTopo, "twosites": TwoSitesTopo}

__all__ = ["StarTopo", "LeafSpineTopo", "TwoSitesTopo", "TOPOLOGIES"]
