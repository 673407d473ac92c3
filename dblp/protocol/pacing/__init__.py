"""Pacing of the data channel: the pacing rules R11-R17, each stated once here, and the modules
that decide their numbers, clock passed in.

The rules build on the protocol's own rules R1-R10 and R5b (:mod:`dblp.protocol.core`). Pacing
decides the numbers; the core objects measure and the round logic says when to ask:

- :mod:`~dblp.protocol.pacing.bucket` - the token bucket every sender paces with;
- :mod:`~dblp.protocol.pacing.auto` - R11's self-pacing rate (:class:`AutoPacer`), the worker's
  side of R12's grant, and a sender's pacer (:func:`make_pacer`);
- :mod:`~dblp.protocol.pacing.grant` - R12's upload grant with R15's seed and R17's tail
  (:class:`UploadGrant`);
- :mod:`~dblp.protocol.pacing.group` - R14's broadcast rate with R15's floor and R16's head
  (:class:`PacerGroup`);
- :mod:`~dblp.protocol.pacing.rates` - what a self-paced server's round logic asks
  (:class:`ServerPacing`): the arrival rates and R15's flood share its rules read;
- :mod:`~dblp.protocol.pacing.cork` - R13's held control, sans I/O (:class:`ControlCork`).

What the rules read is measured where the data is: the sender's reports and stated rates in
:class:`dblp.protocol.sender.RoundSender`, the receiver's first-pass loss and flood times in
:class:`dblp.protocol.receiver.Receiver`. When a round asks is the round logic's
(:mod:`dblp.protocol.session`); the writes R13 holds are the transport's
(:mod:`dblp.transport.sockets`, :mod:`dblp.transport.server`). docs/pacing.md gives the
measurements behind each rule.

R11 Self-pacing: when a pass's reply comes (BITMAP, or STOP after the PROBE) the sender reports the
    pass to its pacer - datagrams sent, how many of them arrived (the reply's count less the
    previous one), their bytes, the time spent sending, the time from the pass's first datagram to
    the reply, whether it was the round's first pass, and the rate it was sent at. A STOP (the
    receiver counts up to its threshold, and more may be in flight, R5/R6) reports a clean pass when
    at most :data:`dblp.protocol.core.EARLY_CLEAN` of the datagrams sent are unaccounted for, else
    nothing. A fixed-rate pacer ignores the report; the default pacer (:class:`AutoPacer`) sets its
    rate from it, cutting only for loss its own rate caused. Why: a hand-set rate is right for one
    path and one load only; the loss of whole passes tells a sender its share.
R12 Rate grant (beyond the paper): a self-pacing sender's PROBE states the rate its pass was sent at
    (0, not stated, when unpaced or fixed-rate); the receiver keeps the last stated rate of its peer
    (:attr:`dblp.protocol.core.Receiver.stated_rate_bps`) and the loss of the round's first pass when
    its PROBE comes (:attr:`~dblp.protocol.core.Receiver.first_loss`) with the rate that PROBE states
    (:attr:`~dblp.protocol.core.Receiver.first_rate_bps`). When STOP comes first (a high tolerance:
    the threshold falls mid-pass) and the receiver knows the sender's R3 order, the loss is that of
    the chunks the order put before the last one that arrived: one pass crosses one FIFO path, so
    each of them still missing was lost, and a grant that overflows the bottleneck's queue shows in
    such rounds too; at most :data:`~dblp.protocol.core.EARLY_CLEAN` of them is clean, as R11 takes a
    STOP. When every upload of a round is in, the server grants the next round's upload rate in
    ROUND(up), one rate for every worker, set from all their first passes (:class:`UploadGrant`,
    asked by :meth:`ServerPacing.uploads_done`); the worker's pacer starts from it
    (:meth:`AutoPacer.grant`); a fixed-rate pacer ignores the grant. Why: senders that adapt alone
    by factors of their own rates keep the unequal shares their first flood gave them, and a round
    lasts as long as its slowest upload; the server sees every upload and decides one rate.
R13 Coalesced control (a transport's rule like R10, no message changes): a side may hold the control
    messages it sends one peer and write them later in one piece, in their order, so that one write
    wakes the peer once instead of once per message. Held messages go before any datagram that
    follows them (a ROUND still announces its datagrams), and before the holder waits for input -
    except a STOP, which may be held across waits until the holder's next message to that peer, when
    its timing tells nobody anything: a pass of fewer than :data:`MIN_SAMPLE` datagrams, which R11
    does not report. A STOP that is held is still sent (R5: sent means queued; a PROBE crossing it
    gets no answer), and nothing else that is awaited waits behind it. :class:`ControlCork` decides
    what is held and when it is due. The server (:mod:`dblp.transport.server`) holds: a one-batch
    round's STOP(up)s until the end of its loop's turn (:func:`corks_upstream`) - below MIN_SAMPLE
    chunks (:func:`stops_tell_nothing`), and the last worker's always, until the broadcast, whose
    ROUND(down) they join - and each worker's ROUND(down) until that worker's datagrams, its
    PROBE(down) until the turn ends. Why: on a host with fewer cores than processes every wakeup of
    a peer preempts the writer, and a small model's round is all control.
R14 Broadcast rate (beyond the paper: R12 for the server's own streams): a sender keeps its first
    pass's loss at that pass's reply (:attr:`dblp.protocol.core.RoundSender.first_loss`, from the
    BITMAP's count; when STOP comes first, the loss R12's receiver counted, which the STOP states as
    its span - the first pass's datagrams up to the last arrival - when more than
    :data:`~dblp.protocol.core.EARLY_CLEAN` of them are missing; else 0) and the rate that pass was
    sent at (:attr:`~dblp.protocol.core.RoundSender.first_rate_bps`) - a self-pacing sender's. When
    the next broadcast begins (:meth:`ServerPacing.broadcast_begins`), the rate of all the server's
    self-paced streams is set from every stream's first pass of the round before, by R12's rule
    (:meth:`PacerGroup.round_done`); the streams then hold that rate for the whole round, and their
    R11 reports move it only until the rule has a rate (rounds 0-1: the unpaced flood, then the
    start it gave). Why: the streams leave through the server's one link; paced apart, those that
    get through unpaced flood the queue the others lose in, and a round waits for its slowest
    stream.
R15 The flood's dispersion (beyond the paper: the first estimate of R12 and R14): a receiver keeps
    when it accepted the round's first and latest chunk; at the first pass's PROBE it keeps that
    pass's chunks and their span (:attr:`dblp.protocol.core.Receiver.first_received`,
    :attr:`~dblp.protocol.core.Receiver.first_span_s`; a STOP first: the chunks and span at STOP) -
    without the chunks of the first read (:attr:`~dblp.protocol.core.Receiver.lead`): the times are
    those of the reads, and a receiver that reads late finds a backlog whose arrival it did not see,
    which counted in would make the rate many times the link's; the chunks of a later read arrived
    after the read before it, so the rate is a lower bound of the arrival rate over the span. Every
    datagram accepted before that PROBE's answer belongs to the first pass (a retransmission needs
    the answer). The server's receivers (:attr:`~dblp.protocol.core.Receiver.tell_rate`, a
    self-paced run) answer an unpaced first upload pass (its PROBE states no rate) that lost with the
    rate its chunks arrived at (a BITMAP+, :mod:`dblp.protocol.control` type 13): the worker's pacer
    starts round 0's retransmissions from it (:meth:`AutoPacer.on_pass`), not from its own bounds,
    which the reply's delay spoils - the full queue drops the PROBE, and TCP resends it 0.2 s later.
    (One sender's rate is an estimate of its share only where the bottleneck interleaves the senders
    finely; served in bursts, each sees up to the whole link - as the broadcast's streams are, whose
    receivers therefore tell nothing.) When every upload of a round whose first passes were all
    unpaced is in, they lost :data:`FLOOD_LOSS` or more (their mean: an overflow), and no grant
    exists yet, all first passes' chunks over the span from the earliest first chunk to the latest
    last one (:func:`flood_share_bps`) - while an unpaced flood overflows a queue, the link behind it
    is busy, so that is the bottleneck's rate (packet-train dispersion, the whole pass the train) -
    are every worker's equal share of it. It seeds R12's grant at :data:`HOLD` of the share, the
    share its ceiling (:meth:`UploadGrant.seed`: soft until the first cut, it rises by the step a
    clean round); and it is the floor of R14's start: when the broadcast's own flood gives its group
    a rate below HOLD of the share, the group is seeded there the same way (:meth:`PacerGroup.report`;
    the uploads measure the server's receiving, its sending may be faster) - and so when the flood
    gives it more than :data:`START_CAP` times the share (the brain's upper bound reads the send
    time, which a fast sender makes short). A seed is unproven: the next round's loss is judged as
    at any new rate (a cut, the ceiling the rate); the unpaced passes it was measured on are no
    verdict on it.
R16 A burst's head (beyond the paper: R14 beside R12's burst verdict): when the uploads of the round
    a broadcast serves were taken for a burst by R12's rule (heavy first-pass loss at a proven
    grant: :attr:`UploadGrant.burst`), light first-pass loss in the broadcast before is the burst's
    head - a burst that begins as a round opens meets the last broadcast's slower streams - not the
    group's rate: R14 holds the rate for this broadcast and judges that loss no further
    (:meth:`PacerGroup.round_done`, ``burst``), and the burst and its tail that follow are judged as
    after a burst. Why: judged, the head is congestion - a cut that is undone only after the burst
    round, which is then sent at the cut rate. A fixed-rate run (no rules) is untouched.
R17 A burst's tail (beyond the paper: R12's verdict on the round after a burst): a burst that ends
    while the next round's first passes are under way spares the uploads that come later, where a
    grant that overflows the server's link loses on every upload. So in the round after a round R12
    took for a burst, heavy first-pass loss beside a worker whose first pass was clean is the
    burst's tail: the grant holds and the loss is no strike (:meth:`UploadGrant.round_done`).
    Congestion is still found, one round later at most: the next round's loss is judged as after any
    round. A run of one worker has no such witness and is untouched.
"""

from __future__ import annotations

from dblp.protocol.pacing.auto import (AUTO_FLOOR_BPS, BURSTY_LOSS, CEILING_CREEP, CUT, HEADROOM, HOLD, MAX_CUT,
                                       MIN_SAMPLE, RECOVERED, STEP, STRIKES, AutoPacer, make_pacer)
from dblp.protocol.pacing.bucket import MIN_BURST_BYTES, PACE_QUANTUM_S, SENDER_MIN_BURST, WAKE_S, TokenBucket
from dblp.protocol.pacing.cork import ControlCork, corks_upstream, stops_tell_nothing
from dblp.protocol.pacing.grant import UploadGrant
from dblp.protocol.pacing.group import START_CAP, PacerGroup
from dblp.protocol.pacing.rates import (FLOOD_LOSS, ServerPacing, broadcast_arrival_bps, clean_rate_bps,
                                        flood_share_bps, upload_arrival_bps)

__all__ = [
    "AUTO_FLOOR_BPS", "BURSTY_LOSS", "CEILING_CREEP", "CUT", "FLOOD_LOSS", "HEADROOM", "HOLD", "MAX_CUT",
    "MIN_BURST_BYTES", "MIN_SAMPLE", "PACE_QUANTUM_S", "RECOVERED", "SENDER_MIN_BURST", "START_CAP", "STEP",
    "STRIKES", "WAKE_S", "AutoPacer", "ControlCork", "PacerGroup", "ServerPacing", "TokenBucket", "UploadGrant",
    "broadcast_arrival_bps", "clean_rate_bps", "corks_upstream", "flood_share_bps", "make_pacer",
    "stops_tell_nothing", "upload_arrival_bps",
]
