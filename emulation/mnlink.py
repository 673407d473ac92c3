"""Mininet links that take Mininet's option names and shape with the testbed's TBF.

A link's options arrive in either vocabulary: the testbed's (``bw``,
``buffer_pkts``/``buffer_bytes``, ``delay``) or Mininet's (``bw``, ``delay``,
``max_queue_size``, ``loss``, ...). :func:`link_shape` is the one place that
reads them: it turns what TBF can honour into a :class:`emulation.shaping.Shape`
(the one home of tc text) and refuses, with the option's name, what it cannot,
so nothing is silently ignored.

Why not Mininet's ``TCLink``: it puts ``max_queue_size``, ``delay`` and ``loss``
into netem; on a kernel without netem (this one) those commands fail, Mininet
prints an error and goes on with an HTB of its own default queue, and the
testbed's ``buffer_pkts`` it does not know at all. So:

- :class:`ShapedLink` (what :class:`emulation.net.EmuNet` builds) keeps the
  shape for EmuNet to apply to both ends once the net runs;
- :class:`TBFLink` applies it at once; the topology files offer it to
  ``mn --custom topologies/X.py`` as ``--link tc`` (and ``--link tbf``), so
  ``max_queue_size``/``buffer_pkts`` become a real drop-tail queue of that
  many packets, ``bw`` the TBF rate, and ``delay`` netem where the kernel has it.

``loss`` is refused: the testbed drops with nftables (``emulation.loss``), and
netem loss would need netem. Mininet's HTB/HFSC/RED/ECN switches are refused too.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from mininet.link import Link
from mininet.node import Node

#: Options that describe the shape, in both vocabularies.
SHAPE_KEYS = ("bw", "buffer_pkts", "buffer_bytes", "max_queue_size", "delay")
#: TCLink options TBF cannot honour: refused when set, never dropped silently.
REFUSED_KEYS = ("jitter", "use_hfsc", "use_tbf", "latency_ms", "enable_ecn", "enable_red",
                "speedup")


def loss_refusal(loss: object) -> str:
    """Why a link ``loss`` is refused (topologies and links say the same)."""
    return (f"loss={loss}: link loss needs netem; the testbed drops with nftables "
            "(emulation.loss.LossController, scenarios' --loss / bursts / traces)")


def shape_opts(params: dict[str, Any]) -> dict[str, Any]:
    """Pop the shaping options from a link's params, Mininet's names turned into the testbed's.

    ``max_queue_size`` (packets) is ``buffer_pkts``; ``loss`` and the options in
    :data:`REFUSED_KEYS` raise ``ValueError`` naming the option.
    """
    loss = params.pop("loss", None)
    if loss:
        raise ValueError(loss_refusal(loss))
    for key in REFUSED_KEYS:
        val = params.pop(key, None)
        if val not in (None, False, 0):
            raise ValueError(f"{key}={val}: a Mininet TCLink option the testbed's TBF links cannot "
                             f"honour (they take {', '.join(SHAPE_KEYS)})")
    opts = {k: params.pop(k, None) for k in SHAPE_KEYS}
    mqs = opts.pop("max_queue_size")
    if mqs is not None:
        if opts["buffer_pkts"] is not None or opts["buffer_bytes"] is not None:
            raise ValueError(f"max_queue_size={mqs} and buffer_pkts/buffer_bytes both given: "
                             "they are the same queue, give one")
        opts["buffer_pkts"] = int(mqs)
    return opts


#: the options of ``mn ... --link tc,KEY=VALUE`` (set by mn's ``validate`` hook, before anything is built)
_COMMAND_LINE: dict[str, Any] = {}
#: the keys that name a link's queue, in either vocabulary
QUEUE_KEYS = ("max_queue_size", "buffer_pkts", "buffer_bytes")


def merge_link_params(topology: dict[str, Any], command_line: dict[str, Any]) -> dict[str, Any]:
    """A link's options under ``mn --link tc,...``: the command line's win over the topology's.

    Why: Mininet hands ``--link`` options to the link as defaults that the topology's own link
    options override, and the testbed's topologies always set ``bw`` and a queue, so ``--link
    tc,bw=50,max_queue_size=50`` was ignored (``bw``) or refused as two queues (the topology's
    ``buffer_pkts`` beside the command line's ``max_queue_size``). A queue the command line names
    replaces the topology's, in whichever vocabulary each gave it.
    """
    merged = dict(topology)
    if any(k in command_line for k in QUEUE_KEYS):
        for k in QUEUE_KEYS:
            merged.pop(k, None)
    merged.update(command_line)
    return merged


def link_shape(params: dict[str, Any]):  # -> emulation.shaping.Shape | None
    """:func:`shape_opts`, then the :class:`~emulation.shaping.Shape` (None: an unshaped link)."""
    from .shaping import Shape

    return Shape.from_link_opts(shape_opts(params))


class ShapedLink(Link):
    """A veth pair that remembers its shape for ``EmuNet`` to apply (both ends, once running)."""

    def __init__(self, node1: Node, node2: Node, **params: Any) -> None:
        self.shape = link_shape(params)
        super().__init__(node1, node2, **params)


class TBFLink(ShapedLink):
    """A shaped veth pair that applies its shape to both ends as soon as it exists (``mn --link tc``)."""

    def __init__(self, node1: Node, node2: Node, **params: Any) -> None:
        super().__init__(node1, node2, **merge_link_params(params, _COMMAND_LINE))
        if self.shape is not None:
            from .shaping import apply_shape

            for intf in (self.intf1, self.intf2):
                apply_shape(intf.name, self.shape, pid=intf.node.pid if intf.node.inNamespace else None)


def _mn_topo(name: str, cls: type) -> Callable[..., Any]:
    """The topology as mn builds it: a refused option exits with its message.

    Why: when building fails with an exception, ``mn`` runs its own global
    cleanup (``mn -c``), which kills every Mininet shell on the machine, a
    testbed run's or another session's included. ``SystemExit`` skips it.
    """
    def make(*args: Any, **kwargs: Any) -> Any:
        try:
            return cls(*args, **kwargs)
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"--topo {name}: {exc} (refused before anything was built)") from None
    make.__name__, make.__doc__ = cls.__name__, cls.__doc__
    return make


def _validate(shaping_error: str | None) -> Callable[[Any], None]:
    """mn's ``validate`` hook: refuse ``--link tc`` options before anything is built (see :func:`_mn_topo`)."""
    def validate(opts: Any) -> None:
        from mininet.util import buildTopo, splitArgs

        link, _, link_kw = splitArgs(str(getattr(opts, "link", None) or "default"))
        if link not in ("tc", "tbf"):
            return
        _COMMAND_LINE.clear()
        _COMMAND_LINE.update(link_kw)  # they win over the topology's link options (merge_link_params)
        if shaping_error:
            raise SystemExit(f"--link {opts.link}: the testbed's TBF link could not be loaded "
                             f"({shaping_error}), and Mininet's TCLink would ignore the topology's "
                             "queue. Install numpy for the Python that runs mn (apt-get install "
                             "python3-numpy), or run `sudo .venv/bin/python $(which mn) ...`.")
        topos = getattr(sys.modules.get("__main__"), "TOPOS", None)
        topo = buildTopo(topos, opts.topo) if topos and getattr(opts, "topo", None) else None
        infos = [merge_link_params(topo.linkInfo(a, b), link_kw) for a, b in topo.links()] if topo else [link_kw]
        try:
            for info in infos:
                delay = shape_opts(dict(info)).get("delay")
                if delay:
                    from .netem import has_netem

                    if not has_netem():
                        raise ValueError(f"delay={delay}: link delay needs the netem qdisc, "
                                         "which this kernel lacks")
        except ValueError as exc:
            raise SystemExit(f"--link {opts.link}: {exc} (refused before anything was built)") from None
    return validate


def mn_custom(topos: dict[str, type]) -> dict[str, Any]:
    """What a topology file hands to ``mn --custom``: its topologies, the ``ipbr`` switch, the TBF
    link as ``tc`` and a ``validate`` hook.

    Mininet 2.3.0's ``setCustom`` forgets the ``links`` key (a missing comma), so
    the link table is also handed over whole as ``LINKS`` (mn's own, with ``tc``
    and ``tbf`` replaced). Refusals exit before mn builds anything (:func:`_mn_topo`),
    including ``--link tc`` where the shaping code cannot load (the Python
    running mn lacks numpy).
    """
    from .bridge import IPBridge

    custom: dict[str, Any] = {"topos": {k: _mn_topo(k, v) for k, v in topos.items()},
                              "switches": {"ipbr": IPBridge}}
    try:
        from . import shaping  # noqa: F401 - imports traces (numpy)
    except ImportError as exc:
        custom["validate"] = _validate(str(exc))
        return custom
    custom["validate"] = _validate(None)
    links = {"tc": TBFLink, "tbf": TBFLink}
    base = getattr(sys.modules.get("__main__"), "LINKS", None)
    custom["links"] = links
    if isinstance(base, dict):  # running inside mn
        custom["LINKS"] = {**base, **links}
    return custom
