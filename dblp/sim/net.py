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
from dataclasses import dataclass, field

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
    flows_per_round: int = 1  # round level: flows that cross this port in one round's direction
    busy_until: float = 0.0  # packet level: when the last enqueued byte leaves
    dropped: int = 0
    done: dict = field(default_factory=dict)  # round level: rnd -> flows finished

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

    # -- round level: fluid approximation of the shared queue -----------------------------
    def load(self, rnd: int) -> int:
        """Flows of round ``rnd`` still sending through this port (at least 1)."""
        return max(1, self.flows_per_round - self.done.get(rnd, 0))

    def flow_done(self, rnd: int) -> None:
        self.done[rnd] = self.done.get(rnd, 0) + 1
        for k in [k for k in self.done if k < rnd - 2]:
            del self.done[k]

    def fluid(self, arr: np.ndarray, offered_pps: float, wire_bytes: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """Departure times and overflow drops of one pass arriving at ``arr``.

        ``offered_pps`` is the total arrival rate at the port while the pass
        lasts. Below capacity every datagram waits only its own transmission.
        Above it the buffer fills at (offered - capacity) from the pass's
        start, arrivals see the growing queue, and once it is full each is
        dropped with probability 1 - capacity/offered (drop-tail's share).
        """
        ser = self.ser(wire_bytes)
        cap = 1.0 / ser
        if offered_pps <= cap * (1 + 1e-9) or arr.size == 0:
            return arr + ser, None
        qcap = max(self.queue_bytes // wire_bytes - 1, 0)
        el = arr - arr[0]
        q = np.minimum((offered_pps - cap) * el, qcap)
        dep = arr + (q + 1.0) * ser
        full = np.flatnonzero(q >= qcap)
        ovf = None
        if full.size:
            ovf = np.zeros(arr.size, bool)
            ovf[full] = rng.random(full.size) < (1.0 - cap / offered_pps)
        return dep, ovf


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
