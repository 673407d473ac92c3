"""The sans-I/O DBLP core: one sender and one receiver state machine per peer.

This module states the protocol's per-transfer rules (paper section III,
Algorithms 1 and 2); :mod:`dblp.protocol.sender` (the chunk orders, the encoding,
:class:`RoundSender`) and :mod:`dblp.protocol.receiver` (:class:`Receiver`) implement
them; this module re-exports their names, so callers import them from here.
The core never touches a socket, a thread or SimPy: bytes and control messages go in, with the clock passed in as ``now`` (seconds);
datagram batches, control messages and timer deadlines come out. The socket
transport (:mod:`dblp.transport.sockets`), the simulator (:mod:`dblp.sim`) and the
tests all drive these same objects, in the style of aioquic's
``QuicConnection`` (``receive_datagram`` / ``datagrams_to_send`` /
``get_timer`` / ``handle_timer``).

Rules, each stated once here:

R1  A round's tensor is cut into MTU-sized chunks (:class:`dblp.protocol.wire.ChunkLayout`).
R2  The sender sends every unsent chunk of a pass, then one PROBE (Alg. 1 l.4-10).
R3  A pass's order is a fresh seeded permutation per round - of runs of 64
    chunks (default) or of single chunks - or index order; retransmission
    passes keep the round's order, restricted to the chunks the last BITMAP
    reports missing.
R4  The receiver accepts a datagram only if it is well-formed, carries the
    expected run id and sender, passes its CRC - or, on the authenticated
    wire (the default, :mod:`dblp.protocol.auth`), carries a valid tag under the run's
    key (else counted ``unauthenticated``) - belongs to the current round,
    names an in-range chunk, has that chunk's exact length and is not a
    duplicate. Everything else is counted by reason and dropped (III-A).
R5  The receiver sends STOP as soon as it holds ceil((1-p) n) chunks, without
    waiting for a probe (Alg. 2 l.19-22); on PROBE it answers STOP if the
    threshold holds, else BITMAP (l.10-17) - except a PROBE of a round
    whose STOP it already sent: that STOP is on the control channel, which
    is reliable and ordered (TCP; the simulator's too), so the PROBE needs no
    answer. (Beyond the paper: a second STOP would cost one control message
    and one wakeup of the other side per direction, worker and round - in a
    lossless one-pass round, the common case, every PROBE crosses its STOP.)
R5b The stop rule (:data:`STOP_RULES`, a run's option): ``early`` is R5 as the paper has it,
    whose STOP cuts the first pass at ceil((1-p) n) chunks, so a lossless P_high round
    delivers only ~(1-p) of every transfer. ``once`` sends every chunk once: the receiver
    sends no STOP before the first pass's PROBE (unless it holds every chunk); at that PROBE
    and afterwards R5 applies unchanged, so the loss bound governs retransmission only -
    loss is tolerated, never manufactured. ``deadline`` is ``once`` with an adaptive close of the
    first pass (after OptiReduce's adaptive timeout, which ends a round by time, not by count): the
    receiver also sends STOP before that PROBE when it holds ceil((1-p) n) chunks and the time since
    the transfer's first accepted chunk is at least ``DEADLINE_FACTOR`` (2.0) times its running
    estimate of a clean first pass - never below the bound, and with every chunk in at once. The
    estimate is per receiver (per peer and direction), kept across rounds: when a first pass ends
    (its PROBE, or a STOP before it) at ``now``, the sample is ``now - t_first``, scaled by n / held
    when a STOP cut the pass (the time the whole pass would take at the rate it came); the first
    sample is the estimate, later ones move it by ``DEADLINE_GAIN`` (0.25) of the difference. Until
    there is an estimate (during a receiver's first transfer), the rule is ``once``. The clock is
    the caller's ``now``, looked at when chunks or the PROBE arrive: no timer, so the close comes
    with the first of them at or after the deadline. Persistent slowness raises the estimate until
    passes fit their deadline again; a straggling pass is cut. After the first pass's PROBE the
    deadline is gone and R5 applies, as under ``once``.
R6  The sender stops at once on STOP, also mid-pass ("early stop", IV-B). The chunks the
    pass that STOP ended never handed out are the ones it knows undelivered
    (:meth:`RoundSender.undelivered`; what its last pass lost in flight it cannot know).
R7  Unreceived chunks are zero-filled (Alg. 2 l.26); :mod:`dblp.protocol.compensation` states what a
    run may make of them instead.
R8  A pass that delivered nothing new (100% loss) delays the next pass by an
    exponential backoff (1 ms doubling to 200 ms), so an outage does not
    busy-spin a core, and sending resumes within one backoff once the path
    recovers.
R9  Chunks of a round arriving after the round completed, and datagrams of
    another round, are stale: counted, never written.
R10 Placement (a transport's copy saver, not a rule change): while a round
    is open and before STOP, a receiver may let the transport receive a
    payload straight into the slot of a chunk it still misses, aimed by the
    sender's R3 order. Those bytes count only once their datagram passes
    R4; a slot whose chunk is still missing at STOP is zero-filled (R7), so
    nothing that failed R4 (stale, foreign, corrupt, mispredicted) survives
    into the result, and nothing is placed after STOP or between rounds.
R11-R17, the pacing rules (self-pacing, rate grant, coalesced control, broadcast rate, flood
    dispersion, burst head and tail), are stated in :mod:`dblp.protocol.pacing`.
"""

from __future__ import annotations

from dblp.protocol.receiver import (
    DEADLINE_FACTOR,
    DEADLINE_GAIN,
    STOP_RULES,
    DropCounters,
    Placement,
    Receiver,
    RecvStats,
)
from dblp.protocol.sender import (
    _INDEX_ORDERS,
    BACKOFF_MAX_S,
    BACKOFF_START_S,
    DEFAULT_ORDER,
    DOWN_STREAM,
    EARLY_CLEAN,
    ENCODE_SLAB,
    ORDER_BLOCK,
    ORDERS,
    Batch,
    EncodedRound,
    RoundSender,
    SendState,
    SendStats,
    VirtualRound,
    index_order,
    send_order,
)

__all__ = [
    "BACKOFF_MAX_S", "BACKOFF_START_S", "DEADLINE_FACTOR", "DEADLINE_GAIN", "DEFAULT_ORDER", "DOWN_STREAM", "EARLY_CLEAN", "ENCODE_SLAB",
    "ORDER_BLOCK", "ORDERS", "STOP_RULES", "Batch", "DropCounters", "EncodedRound", "Placement", "Receiver",
    "RecvStats", "RoundSender", "SendState", "SendStats", "VirtualRound", "index_order", "send_order",
]
