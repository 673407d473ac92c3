"""One emulation layer, two ways to make its hosts: Mininet (:class:`emulation.net.EmuNet`) or plain
network namespaces (:class:`emulation.nshosts.NsNet`).

Why: a GPU machine typically has neither Mininet nor ``mnexec`` (nor a package registry to install
them from), while everything the emulated star needs - namespaces, veth pairs, a bridge, TBF and
nftables - is in its kernel and in the carried ``iproute2``/``nftables`` binaries. Both nets offer
the same interface to the scenarios (:class:`dblp.runs.launch.Runner`'s ``popen``/``address``, the
``cmd``/``host_intf``/``switch_port``/``switch_cmd`` that :class:`emulation.loss.LossController`
drives, the ``qdisc_stats``/``shapes`` the run recorder snapshots), so a scenario builds its star
with :func:`star_net` and runs the same code on either.

``--hosts auto`` picks Mininet where ``import mininet`` works and ``mnexec`` is on PATH, else
namespaces; :func:`resolve_hosts` returns the choice and why, which the scenarios print and record
in ``config.json``.

The two stars are the same network: server ``srv``, workers ``w1..wN`` and cross-traffic hosts
``x1..xM`` on one switch, every link shaped at both ends with the same TBF
(:meth:`emulation.shaping.Shape.from_link_opts` of the link's ``bw`` and ``buffer_bytes``, as
Mininet's links get them). What differs: the namespace star's bridge lives in a namespace of its
own (nothing in the root namespace), and its addresses are 10.77.0.x.
"""

from __future__ import annotations

import importlib
import shutil
from typing import Any, Callable

from dblp.cli.args import HOST_KINDS  # the values of the scenarios' --hosts (one home: the flag's)

__all__ = ["HOST_KINDS", "resolve_hosts", "star_net", "host_names"]


def mininet_missing() -> str | None:
    """Why Mininet hosts cannot be made here (None: they can)."""
    try:
        importlib.import_module("mininet.net")
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install: either way no Mininet hosts
        return f"the mininet Python package does not import ({type(exc).__name__}: {exc})"
    if shutil.which("mnexec") is None:
        return "mnexec is not on PATH"
    return None


def resolve_hosts(choice: str) -> tuple[str, str]:
    """``--hosts`` -> (``"mininet"`` | ``"netns"``, why). ``mininet`` where it cannot run raises
    ValueError with the reason (the scenarios turn it into a usage error)."""
    if choice not in HOST_KINDS:
        raise ValueError(f"--hosts {choice!r}: one of {', '.join(HOST_KINDS)}")
    missing = mininet_missing()
    if choice == "mininet":
        if missing:
            raise ValueError(f"--hosts mininet: {missing} (use --hosts netns: namespace hosts, no Mininet)")
        return "mininet", "asked for (--hosts mininet)"
    if choice == "netns":
        return "netns", "asked for (--hosts netns)"
    if missing:
        return "netns", f"--hosts auto: {missing}, so namespace hosts"
    return "mininet", "--hosts auto: Mininet is importable and mnexec is on PATH"


def star_net(kind: str, *, workers: int, bw_mbps: float, queue_bytes: int, mtu: int = 1500, cross_hosts: int = 0,
             cross_bw_mbps: float | None = None, name: str = "emu", topo: Callable[[], Any] | None = None) -> Any:
    """The paper's star (``srv``, ``w1..wN``, ``x1..xM`` on one switch) as a not yet started net of
    ``kind`` (:func:`resolve_hosts`); use it as a context manager, which removes everything it made
    on exit, error and Ctrl-C.

    ``topo``: for Mininet, a callable that builds the Mininet ``Topo`` of the same star (the
    scenario's ``topologies.star.StarTopo``: topologies sit above this layer, and importing them
    imports Mininet); not called for namespace hosts, whose star is built here from the same numbers.
    """
    if kind == "mininet":
        if topo is None:
            raise ValueError("star_net('mininet'): give topo=, a callable that builds the Mininet Topo")
        from .net import EmuNet

        return EmuNet(topo(), name=name, mtu=mtu)
    if kind != "netns":
        raise ValueError(f"unknown host kind {kind!r}: mininet or netns")
    from .nshosts import NsNet
    from .shaping import Shape

    def shape(bw: float) -> Shape | None:  # what a Mininet star link with bw/buffer_bytes gets (emulation.mnlink)
        s = Shape.from_link_opts({"bw": float(bw), "buffer_bytes": int(queue_bytes)})
        return None if s is None else s.fit_mtu(mtu)

    hosts = ["srv", *[f"w{i + 1}" for i in range(workers)], *[f"x{i + 1}" for i in range(cross_hosts)]]
    shapes = {h: shape(cross_bw_mbps if h.startswith("x") and cross_bw_mbps else bw_mbps) for h in hosts}
    return NsNet(hosts, shape=shapes, mtu=mtu)


def host_names(net: Any) -> list[str]:
    """The host names of either net (EmuNet's ``hosts`` are names, NsNet's are host objects)."""
    return list(getattr(net, "names", None) or net.hosts)
