"""Link shaping with TBF (and netem delay where the kernel has it), plus qdisc counters.

The one place for ``tc`` text (as Mininet's ``link.py`` is for its links):
the Mininet builder (:mod:`emulation.net`), the namespace hosts
(:mod:`emulation.nshosts`), the trace replayer's rate/queue columns and the
host launcher's ``[network]`` all describe a link with :class:`Shape` and
install it with :func:`shape_commands` (remove it with
:func:`unshape_commands`); only *where* the commands run differs.

Why TBF and not TCLink: TCLink's buffer (``max_queue_size``) and delay are
netem options, and this kernel has no netem, so TCLink leaves links unshaped
without a word. TBF is built in: ``rate`` gives the bandwidth and ``limit``
(bytes) is a real finite drop-tail queue, so a burst of cross-traffic overflows
it and the drops show up in ``tc -s`` as they would on a switch port.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from traces.units import FRAME_BYTES, parse_rate  # FRAME_BYTES: a packet of a queue (1500 IP + 14 Ethernet)

from .netem import NetemUnavailable, has_netem
from .sysutil import run


@dataclass(frozen=True)
class Shape:
    """How one direction of one link is shaped.

    bw_mbps: rate in Mbit/s (None = unshaped).
    buffer_bytes: drop-tail queue in bytes (TBF ``limit``).
    burst_bytes: token bucket depth (0: :func:`default_burst`, small so the
    rate holds at millisecond scale).
    delay: netem delay such as ``"5ms"`` (only where netem exists).
    """

    bw_mbps: float | None
    buffer_bytes: int = 100 * FRAME_BYTES
    burst_bytes: int = 0
    delay: str | None = None

    def fit_mtu(self, mtu: int) -> "Shape":
        """The same shape on links of ``mtu`` bytes: a token bucket smaller than one frame would
        drop every frame (TBF never splits a packet that is not GSO), so the bucket holds at least
        four frames of that size and the queue at least the bucket. Unchanged at 1500."""
        if not self.bw_mbps:
            return self
        burst = max(self.burst_bytes or default_burst(self.bw_mbps), 4 * frame_bytes(mtu))
        if burst == (self.burst_bytes or default_burst(self.bw_mbps)):
            return self
        return replace(self, burst_bytes=burst, buffer_bytes=max(self.buffer_bytes, burst))

    @classmethod
    def tbf(cls, rate: str | float, *, queue_bytes: int = 1 << 20, burst_bytes: int | None = None) -> "Shape":
        """A namespace host's link (:mod:`emulation.nshosts`): ``rate`` in bit/s or as text.

        The bucket holds max(64 KiB + a frame, 4 ms of rate) by default, so
        GSO/TSO super-packets of 64 KiB pass unsplit; the queue is at least
        the bucket.
        """
        bps = parse_rate(rate, tc=True)  # text: tc's units ('1gbit', '500M', 125mbps = bytes/s); a bare number: bit/s
        if not bps > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        burst = burst_bytes or gso_burst(bps / 1e6)
        return cls(bw_mbps=bps / 1e6, buffer_bytes=max(int(queue_bytes), burst), burst_bytes=burst)

    @classmethod
    def from_link_opts(cls, opts: dict) -> "Shape | None":
        """Build from a Topo link's options (``bw``, ``buffer_pkts``/``buffer_bytes``, ``delay``).

        Returns None when the link carries no shaping at all.
        """
        bw = opts.get("bw")
        delay = opts.get("delay") or None
        if bw is None and delay is None:
            return None
        buffer_bytes = opts.get("buffer_bytes")
        if buffer_bytes is None:
            buffer_bytes = int(opts.get("buffer_pkts") or 100) * FRAME_BYTES
        burst = default_burst(bw) if bw else 0
        return cls(bw_mbps=float(bw) if bw else None, buffer_bytes=int(buffer_bytes),
                   burst_bytes=burst, delay=delay)


def frame_bytes(mtu: int) -> int:
    """An Ethernet frame's bytes on a link of ``mtu`` (the IP packet plus the 14-byte header)."""
    return int(mtu) + FRAME_BYTES - 1500


def default_burst(bw_mbps: float) -> int:
    """Token bucket depth: 1 ms of traffic at the rate, at least 4 full frames.

    Small enough that a line-rate burst cannot bypass the queue for long, large
    enough that the CPU's timer granularity does not cap the rate below target.
    """
    return max(int(bw_mbps * 1e6 / 8 * 0.001), 4 * FRAME_BYTES)


def gso_burst(bw_mbps: float) -> int:
    """Token bucket depth for links carrying GSO super-packets: 64 KiB + a frame, or 4 ms of rate."""
    return max(65536 + FRAME_BYTES, int(bw_mbps * 1e6 / 8 * 0.004))


def shape_commands(dev: str, shape: Shape) -> list[list[str]]:
    """The ``tc`` commands that install ``shape`` on ``dev`` (root egress qdisc)."""
    if shape.delay and not has_netem():
        raise NetemUnavailable(
            f"link {dev}: delay={shape.delay!r} needs the netem qdisc, which this kernel "
            "lacks (CONFIG_NET_SCH_NETEM). Drop the delay, or use the Vagrant VM."
        )
    cmds: list[list[str]] = []
    parent = ["root"]
    if shape.delay:
        # netem first (delay line, generous queue), then TBF as its child: the TBF
        # bfifo stays the one finite buffer, so delay does not shrink the buffer.
        cmds.append(["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:",
                     "netem", "delay", shape.delay, "limit", "100000"])
        parent = ["parent", "1:1"]
    if shape.bw_mbps:
        cmds.append(["tc", "qdisc", "replace", "dev", dev, *parent, "handle", "10:",
                     "tbf", "rate", f"{int(round(shape.bw_mbps * 1e6))}bit",
                     "burst", str(shape.burst_bytes or default_burst(shape.bw_mbps)),
                     "limit", str(shape.buffer_bytes)])
    return cmds


#: A queue for an unshaped veth end that feeds its peer's GRO (segmented links, emulation.loss.segment_links):
#: with a qdisc a veth whose peer's ring is full stops its queue (backpressure); with the default
#: ``noqueue`` it drops the packet, a loss no rule made. Its handle marks it as ours.
BACKPRESSURE_QUEUE = ["handle", "5e9:", "pfifo", "limit", "1000"]


def backpressure_commands(dev: str, qdisc_json: str, on: bool = True) -> list[list[str]]:
    """The ``tc`` commands that give ``dev`` :data:`BACKPRESSURE_QUEUE` where it has no queue
    (``on``), or take ours away again; ``qdisc_json``: ``tc -j qdisc show dev DEV`` (a shaped
    end keeps its TBF, which queues already)."""
    try:
        roots = [q for q in json.loads(qdisc_json or "[]") if q.get("root")]
    except json.JSONDecodeError:
        roots = []
    kind, handle = (roots[0].get("kind"), roots[0].get("handle")) if roots else ("noqueue", None)
    if on and kind == "noqueue":
        return [["tc", "qdisc", "replace", "dev", dev, "root", *BACKPRESSURE_QUEUE]]
    if not on and kind == "pfifo" and handle == BACKPRESSURE_QUEUE[1]:
        return unshape_commands(dev)
    return []


def unshape_commands(dev: str) -> list[list[str]]:
    """The ``tc`` commands that remove any shaping from ``dev`` (back to the default qdisc)."""
    return [["tc", "qdisc", "del", "dev", dev, "root"]]


def apply_shape(dev: str, shape: Shape, pid: int | None = None) -> None:
    """Install ``shape`` on ``dev`` in the netns of ``pid`` (root netns if None)."""
    for cmd in shape_commands(dev, shape):
        run(cmd, pid=pid)


def qdisc_stats(pid: int | None = None, dev: str | None = None) -> dict[str, dict]:
    """Per-interface counters of the root qdisc: sent bytes/packets, drops, overlimits.

    Keyed by interface name; ``qdiscs`` keeps the full list for nested setups.
    """
    return parse_qdisc_stats(run(qdisc_stats_args(dev), pid=pid, check=False), dev)


def qdisc_stats_args(dev: str | None = None) -> list[str]:
    """The ``tc`` command whose JSON :func:`parse_qdisc_stats` reads (run it in any namespace)."""
    return ["tc", "-s", "-j", "qdisc", "show"] + (["dev", dev] if dev else [])


def parse_qdisc_stats(out: str, dev: str | None = None) -> dict[str, dict]:
    """:func:`qdisc_stats`'s counters from the text of :func:`qdisc_stats_args` (namespace hosts run
    the command with ``ip netns exec``, Mininet hosts with ``mnexec``: one parser for both)."""
    try:
        entries = json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return {}
    stats: dict[str, dict] = {}
    for q in entries:
        name = q.get("dev", dev or "?")
        s = stats.setdefault(name, {"sent_bytes": 0, "sent_packets": 0, "dropped": 0,
                                    "overlimits": 0, "backlog": 0, "qdiscs": []})
        s["qdiscs"].append({k: q.get(k) for k in ("kind", "handle", "parent", "root", "bytes",
                                                   "packets", "drops", "overlimits",
                                                   "backlog", "qlen")})
        if q.get("root"):
            s["sent_bytes"] = q.get("bytes", 0)
            s["sent_packets"] = q.get("packets", 0)
        # drops can happen at any level (TBF's bfifo, netem); sum them
        s["dropped"] += q.get("drops", 0)
        s["overlimits"] += q.get("overlimits", 0)
        s["backlog"] += q.get("backlog", 0)
    return stats
