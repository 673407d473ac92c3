"""Link options of the testbed's topologies, in the keys ``EmuNet`` and ``mn --link tc`` read.

One home for how a topology turns its parameters into a link's options, so the
three topologies take the same names: the testbed's (``bw``, ``buffer_pkts``,
``buffer_bytes``, ``delay``) and Mininet's (``max_queue_size`` = ``buffer_pkts``;
``loss``, refused because it needs netem - :func:`emulation.mnlink.loss_refusal`).
"""

from __future__ import annotations

from emulation.mnlink import loss_refusal


def queue(buffer_pkts: int | None, buffer_bytes: int | None,
          max_queue_size: int | None) -> tuple[int | None, int | None]:
    """The drop-tail queue as (packets, bytes): Mininet's ``max_queue_size`` is the packets.

    Bytes win over packets when both are given (as in ``emulation.shaping``).
    """
    if max_queue_size is not None:
        return int(max_queue_size), None
    return buffer_pkts, buffer_bytes


def refuse_loss(loss: float | None) -> None:
    """A topology cannot honour Mininet's link ``loss`` here: say so instead of ignoring it."""
    if loss:
        raise ValueError(loss_refusal(loss))


def link_opts(bw: float | None, buffer_pkts: int | None, buffer_bytes: int | None,
              delay: str | None) -> dict:
    """Shaping options for one link (unset ones left out)."""
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
