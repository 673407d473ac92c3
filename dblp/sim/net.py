"""Hosts, switch ports and paths of the simulated star network.

::

    worker i --(bandwidth_bps, delay_s)--> switch --[port srv: server_bandwidth_bps, queue_bytes]--(delay_s)--> server
    server  --(server_bandwidth_bps, delay_s)--> switch --[port i: bandwidth_bps, queue_bytes]--(delay_s)--> worker i

A **host** pushes datagrams at most ``send_pps`` (the per-host send cost)
and at most its NIC's line rate, whichever is slower; a sender blocks on a
busy NIC (a blocking socket), so a host never drops its own datagrams. The
server's host is shared by its N broadcast senders.

A **switch port** is a FIFO with a drop-tail buffer of ``queue_bytes``
(TBF's ``limit``): a datagram that finds more than ``queue_bytes -
size`` bytes still to be transmitted is dropped. All upstream flows meet at
the port towards the server (incast).

A **path** is host -> propagation -> port -> propagation -> receiver.
Control messages (TCP) follow the same path, never dropped, FIFO behind the
data in the port (so a PROBE never overtakes the datagrams sent before it),
and each costs ``ctrl_overhead_s`` of processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TCP_MSS = 1448
TCP_OVERHEAD = 66  # Ethernet 14 + IPv4 20 + TCP 32 (timestamps) per segment


def ctrl_wire_bytes(frame_bytes: int) -> int:
    """On-wire bytes of a control frame of ``frame_bytes`` sent over TCP."""
    return frame_bytes + TCP_OVERHEAD * max(1, math.ceil(frame_bytes / TCP_MSS))


@dataclass
class Host:
    name: str
    send_pps: float
    nic_bps: float
    wire_bytes: int

    @property
    def interval_s(self) -> float:
        """Seconds per datagram: the slower of the send cost and the NIC."""
        return max(1.0 / self.send_pps, self.wire_bytes * 8.0 / self.nic_bps)


@dataclass
class Port:
    """A switch egress port: rate, drop-tail buffer; exact state for the packet level."""

    name: str
    rate_bps: float
    queue_bytes: int
    busy_until: float = 0.0  # packet level: when the last enqueued byte leaves
    dropped: int = 0

    def ser(self, nbytes: int) -> float:
        return nbytes * 8.0 / self.rate_bps

    # -- packet level: exact FIFO (Lindley) with drop-tail ----------------------------
    def arrive(self, t: float, nbytes: int) -> float | None:
        """A datagram reaches the port at ``t``: its departure time, or None if dropped."""
        backlog = (self.busy_until - t) * self.rate_bps / 8.0 if self.busy_until > t else 0.0
        if backlog + nbytes > self.queue_bytes:
            self.dropped += 1
            return None
        self.busy_until = max(t, self.busy_until) + self.ser(nbytes)
        return self.busy_until

    def pass_ctrl(self, t: float, nbytes: int) -> float:
        """A control frame (never dropped) enters at ``t``: its departure time."""
        self.busy_until = max(t, self.busy_until) + self.ser(nbytes)
        return self.busy_until



class FluidQueue:
    """Round level: a fluid model of one port's drop-tail queue over time.

    Each pass crossing the port is registered as a constant arrival rate over
    its interval at the port; the queue (in datagrams) grows at (offered -
    capacity) and drains at (capacity - offered), between 0 and the buffer.
    A datagram arriving while the buffer is full is dropped with probability
    1 - capacity/offered (drop-tail's share of the excess); one arriving
    with q datagrams queued waits q/capacity. When the set of passes changes,
    the queue at that instant is kept and the future re-evaluated.
    """

    def __init__(self, port: Port, wire_bytes: int) -> None:
        self.port = port
        self.ser = port.ser(wire_bytes)
        self.cap = 1.0 / self.ser
        self.qcap = float(max(port.queue_bytes // wire_bytes - 1, 0))
        self.entries: dict[object, tuple[float, float, float]] = {}  # owner -> (start, end, rate)
        self.t_ref = 0.0
        self.q_ref = 0.0
        self._bt = np.array([0.0])  # breakpoints, offered rate and queue at each
        self._ba = np.array([0.0])
        self._bq = np.array([0.0])
        self.congested = False

    def queue_at(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if not self.congested:
            return np.zeros(t.shape)
        i = np.clip(np.searchsorted(self._bt, t, side="right") - 1, 0, None)
        q = self._bq[i] + (self._ba[i] - self.cap) * (t - self._bt[i])
        return np.clip(q, 0.0, self.qcap)

    def set(self, owner: object, t: float, span: tuple[float, float, float] | None) -> bool:
        """Register (or with None remove) ``owner``'s pass at time ``t``; whether others need a refresh."""
        was = self.congested
        self.q_ref = float(self.queue_at(t)) if self.congested else 0.0
        self.t_ref = t
        if span is None:
            self.entries.pop(owner, None)
        else:
            self.entries[owner] = span
        for k in [k for k, v in self.entries.items() if v[1] < t]:
            del self.entries[k]
        self._rebuild()
        return was or self.congested

    def _rebuild(self) -> None:
        t0 = self.t_ref
        if self.q_ref <= 0.0 and sum(e[2] for e in self.entries.values()) <= self.cap * (1 + 1e-9):
            self.congested = False  # even all passes at once fit: no queue anywhere ahead
            return
        pts = {t0}
        for lo, hi, _ in self.entries.values():
            if lo > t0:
                pts.add(lo)
            if hi > t0:
                pts.add(hi)
        bt = np.array(sorted(pts))
        ba = np.zeros(bt.size)
        for lo, hi, rate in self.entries.values():
            ba[(bt >= lo - 1e-15) & (bt < hi)] += rate
        bq = np.empty(bt.size)
        q = self.q_ref
        for i in range(bt.size):
            bq[i] = q
            if i + 1 < bt.size:
                q = min(max(q + (ba[i] - self.cap) * (bt[i + 1] - bt[i]), 0.0), self.qcap)
        self._bt, self._ba, self._bq = bt, ba, bq
        self.congested = bool(np.any(ba > self.cap * (1 + 1e-9)) or np.any(bq > 0))

    def wait(self, arr: np.ndarray) -> np.ndarray | None:
        """Queueing wait (s) of datagrams reaching the port at ``arr``; None for none."""
        if not self.congested or arr.size == 0:
            return None
        q = self.queue_at(arr)
        return q * self.ser if q.any() else None

    def outcome(self, arr: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Queueing wait (s) and overflow drops of datagrams reaching the port at ``arr``;
        None for no wait / no drops."""
        if not self.congested or arr.size == 0:
            return None, None
        q = self.queue_at(arr)
        wait = q * self.ser
        i = np.clip(np.searchsorted(self._bt, arr, side="right") - 1, 0, None)
        a = self._ba[i]
        full = np.flatnonzero((q >= self.qcap) & (a > self.cap))
        ovf = None
        if full.size:
            ovf = np.zeros(arr.size, bool)
            ovf[full] = rng.random(full.size) < (1.0 - self.cap / a[full])
        return (wait if q.any() else None), ovf


@dataclass
class Path:
    """Sender host -> (d1) -> port -> (d2) -> receiver; control frames ride the same way."""

    host: Host
    d1: float
    port: Port
    d2: float
    ctrl_overhead_s: float

    def ctrl_base_delay(self, wire: int) -> float:
        """Delay of a control frame on an idle path (NIC and port serialisation, propagation, processing)."""
        return wire * 8.0 / self.host.nic_bps + self.d1 + self.port.ser(wire) + self.d2 + self.ctrl_overhead_s
