"""The numbers a self-paced server's round logic asks for (rules R12, R14, R15, R16).

The rules are stated in :mod:`dblp.protocol.pacing`. The round logic (:mod:`dblp.protocol.session`)
says when: every upload of a round is in (:meth:`ServerPacing.uploads_done`), a broadcast begins
(:meth:`ServerPacing.broadcast_begins`); this module decides the rates from what the core objects
measured - each upload's receiver (:class:`dblp.protocol.receiver.Receiver`) and each broadcast
stream's sender (:class:`dblp.protocol.sender.RoundSender`), read through the attributes the
protocols below name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from dblp.protocol.pacing.auto import MIN_SAMPLE
from dblp.protocol.pacing.bucket import TokenBucket
from dblp.protocol.pacing.grant import UploadGrant
from dblp.protocol.pacing.group import PacerGroup

FLOOD_LOSS = 0.5  # R15: unpaced first passes losing this much (their mean) overflowed a queue: their span is a rate


class _ReceiveTimes(Protocol):
    t_first: float  # when the round's first chunk was accepted
    t_done: float  # when the receiver reached its threshold


class UploadPass(Protocol):
    """What one upload's receiver measured of its round (R12's loss and stated rates, R15's flood)."""

    stated_rate_bps: float
    first_rate_bps: float
    first_loss: float
    first_received: int
    first_span_s: float
    received: int
    lead: int

    @property
    def stats(self) -> _ReceiveTimes: ...


class _SendTimes(Protocol):
    t_start: float
    t_done: float
    received: int


class BroadcastPass(Protocol):
    """What one broadcast stream's sender knows of its round (R14's first pass)."""

    first_rate_bps: float
    first_loss: float

    @property
    def stats(self) -> _SendTimes: ...


def clean_rate_bps(flows: Sequence[tuple[float, int, float]], datagram_size: int) -> float:
    """R12/R14's arrival rate: the mean bit/s of ``(first-pass loss, chunks delivered, seconds)``
    flows of ``datagram_size``-byte datagrams, 0 when any first pass lost or a span is empty (no
    clean evidence of the path's rate)."""
    rates = []
    for loss, chunks, span in flows:
        if loss > 0 or not span > 0:
            return 0.0
        rates.append(chunks * datagram_size * 8.0 / span)
    return sum(rates) / len(rates) if rates else 0.0


def upload_arrival_bps(uploads: Sequence[UploadPass], datagram_size: int) -> float:
    """R12: the mean bit/s at which clean uploads arrived (first datagram to threshold; 0 when
    any first pass lost): paced below the bottleneck, each worker's own rate."""
    return clean_rate_bps([(r.first_loss, r.received, r.stats.t_done - r.stats.t_first) for r in uploads],
                          datagram_size)


def broadcast_arrival_bps(streams: Sequence[BroadcastPass], datagram_size: int) -> float:
    """R14: the mean bit/s at which clean broadcast streams got their chunks to the receivers
    (start to STOP; 0 when any first pass lost) - once the group paces. An unpaced broadcast
    that got through clean stays unpaced (0: no seed), as the group's AutoPacer leaves it:
    on a path it cannot overflow (loopback, fast links) pacing buys nothing, and a paced last
    datagram races its PROBE (a BITMAP that misses it resends it: duplicates)."""
    if any(s.first_rate_bps == 0 for s in streams):
        return 0.0
    return clean_rate_bps([(s.first_loss, s.stats.received, s.stats.t_done - s.stats.t_start) for s in streams],
                          datagram_size)


def flood_share_bps(uploads: Sequence[UploadPass], datagram_size: int) -> float:
    """R15: each worker's equal share of the bottleneck, from a round whose first passes were
    all unpaced and lost :data:`FLOOD_LOSS` or more (their mean: a queue overflowed; lighter
    random loss, as from a cold receiver, says less of the rate): all first-pass chunks over the
    span from the earliest first chunk's acceptance to the latest last one's (a first pass that
    ended in STOP: its chunks at STOP), the chunks of each receiver's first read left out
    (``lead``: a backlog, its arrival unseen). 0 when the round says nothing of the path: a paced
    or a clean first pass (R12's seeds act then), fewer than :data:`MIN_SAMPLE` chunks, or no span.

    Why the span, not the reply: while the flood overflows a queue the link behind it is busy,
    so chunks leave it at its rate; the replies wait on the PROBE, which the full queue may drop
    (TCP resends it 0.2 s later), so a span to the PROBE would give a fraction of the share."""
    rs = list(uploads)
    if not rs or any(r.first_rate_bps > 0 for r in rs) or sum(r.first_loss for r in rs) < FLOOD_LOSS * len(rs):
        return 0.0
    chunks, t0, t1 = 0, math.inf, -math.inf
    for r in rs:
        got, end = ((r.first_received, r.stats.t_first + r.first_span_s) if r.first_loss > 0
                    else (r.received - r.lead, r.stats.t_done))  # (no loss at the first PROBE: STOP came first)
        if got and math.isfinite(r.stats.t_first) and math.isfinite(end):
            chunks += got
            t0, t1 = min(t0, r.stats.t_first), max(t1, end)
    if chunks < MIN_SAMPLE or not t1 > t0:
        return 0.0
    return chunks * datagram_size * 8.0 / (t1 - t0) / len(rs)


class ServerPacing:
    """A self-paced server's rates: R12's upload grant and R14's broadcast group, with R15's
    first estimate and R16's burst head between them.

    Why one object: the two rules read each other - R15's flood share seeds the grant and floors
    the group, R16 holds the group's rate when the grant took the uploads for a burst - and the
    round logic should ask for numbers, not weigh them."""

    def __init__(self, datagram_size: int) -> None:
        self.datagram_size = datagram_size
        self.uploads = UploadGrant()  # R12: one upload rate for every self-pacing worker
        self.group = PacerGroup()  # R14: one rate for the broadcast's streams
        self.grant_bps = 0.0  # the rate granted in the next ROUND(up)s (0: none)

    def member(self) -> TokenBucket:
        """A broadcast stream's pacer: its own tokens, the group's rate."""
        return self.group.member()

    def uploads_done(self, uploads: Sequence[UploadPass]) -> float:
        """R12 and R15: every upload of the round is in, each first pass's loss known. Returns
        (and keeps, :attr:`grant_bps`) the next round's grant (0: none).

        While no grant exists, a lossy unpaced flood gives the bottleneck's rate
        (:func:`flood_share_bps`): it seeds the grant and is the floor of the broadcast's start.
        The workers' own rates, told their own floods' arrival, see the bottleneck serve each in
        bursts, up to its whole rate, so the share is taken over all of them."""
        rs = list(uploads)
        share = flood_share_bps(rs, self.datagram_size) if self.uploads.rate_bps == 0 else 0.0
        if share > 0 and not self.group.granted:
            self.group.floor_bps = share
        if share > 0:
            self.grant_bps = self.uploads.seed(share)
        else:
            self.grant_bps = self.uploads.round_done([r.stated_rate_bps for r in rs], [r.first_loss for r in rs],
                                                     upload_arrival_bps(rs, self.datagram_size),
                                                     paced=any(r.first_rate_bps > 0 for r in rs))
        return self.grant_bps

    def broadcast_begins(self, last: Sequence[BroadcastPass]) -> None:
        """R14 and R16: a broadcast begins; ``last``: the streams of the broadcast before that
        finished (none: round 0, the brain's start stands). Their first passes set this
        broadcast's rate; when this round's uploads were taken for a burst, light loss in them
        is the burst's head (:meth:`PacerGroup.round_done`)."""
        if last:
            self.group.round_done([s.first_rate_bps for s in last], [s.first_loss for s in last],
                                  broadcast_arrival_bps(last, self.datagram_size), burst=self.uploads.burst)
