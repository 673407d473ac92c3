"""The broadcast's one rate (rules R14, R15's floor and R16): the server's streams as a group.

The rules are stated in :mod:`dblp.protocol.pacing`; :class:`PacerGroup` sets the rate of every
stream from the round before's first passes, the round logic says when a broadcast begins.
"""

from __future__ import annotations

from collections.abc import Sequence

from dblp.protocol.pacing.auto import BURSTY_LOSS, HOLD, STRIKES, AutoPacer
from dblp.protocol.pacing.bucket import PACE_QUANTUM_S, SENDER_MIN_BURST, TokenBucket
from dblp.protocol.pacing.grant import UploadGrant

START_CAP = 2.0  # R15: a broadcast's flood start above this many times the uploads' share is seeded at the share


class _Member(TokenBucket):
    """One stream of a :class:`PacerGroup`: its own tokens, the group's rate."""

    auto = True

    def __init__(self, group: "PacerGroup") -> None:
        self.group = group
        super().__init__(0.0, SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)

    def _sync(self) -> None:
        r = self.group.brain.rate_bps
        if r != getattr(self, "_rate", None):
            TokenBucket.rate_bps.fset(self, r)  # type: ignore[attr-defined]

    @property
    def rate_bps(self) -> float:
        self._sync()
        return self._rate

    @rate_bps.setter
    def rate_bps(self, rate: float) -> None:
        TokenBucket.rate_bps.fset(self, rate)  # type: ignore[attr-defined]

    @property
    def unlimited(self) -> bool:
        self._sync()
        return self._rate == 0.0

    def allowance(self, now: float, item_bytes: int, limit: int) -> int:
        self._sync()
        return super().allowance(now, item_bytes, limit)

    def next_time(self, now: float, item_bytes: int) -> float:
        self._sync()
        return super().next_time(now, item_bytes)

    def on_pass(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
                first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        if not self.group.granted:  # R14: once the group has a rate, it moves at round boundaries only
            self.group.report(sent, delivered, nbytes, send_s, reply_s, first, rate_bps, arrival_bps)


class PacerGroup:
    """Streams that share one bottleneck and one rate: a server's broadcast to N workers.

    Why: the N streams leave through the server's one link. Paced apart,
    each would find its own rate from its own losses - streams that get
    through unpaced stay unpaced and flood the queue the others lose in,
    and those fall far below their share (a round lasts as long as its
    slowest stream). So every member paces at one rate, each with its own
    tokens.

    Who sets it (rule R14): in round 0 nothing is known, and one
    :class:`AutoPacer` (``brain``) takes the members' R11 reports - the
    first lossy report of the unpaced flood sets the start rate, and a
    report about a rate the group has already left is ignored. From then on
    the rate moves once a round, at the next broadcast's start, by R12's
    rule on *every* stream's first pass (:meth:`round_done`, an
    :class:`UploadGrant`): the brain alone would move on whichever reply
    comes first, and the first reply of a broadcast is usually a clean
    stream's early STOP, so it would step up a round at a time while the
    streams that lose are ignored as stale."""

    def __init__(self) -> None:
        self.brain = AutoPacer(SENDER_MIN_BURST, depth_s=PACE_QUANTUM_S)
        # one strike more than the uploads: a burst that begins while a broadcast is under way reaches
        # into two broadcasts in a row, and two strikes would cut the group at every burst
        self.rule = UploadGrant(strikes=STRIKES + 1)
        self.granted = False  # the rule has set a rate: the members' own reports no longer move it
        self.floor_bps = 0.0  # R15: each stream's share as the uploads' first flood measured it (0: none)
        self._floored = False  # R15: seeded at the floor during a broadcast whose first passes were unpaced

    def member(self) -> TokenBucket:
        return _Member(self)

    def report(self, sent: int, delivered: int, nbytes: int, send_s: float, reply_s: float,
               first: bool = True, rate_bps: float | None = None, arrival_bps: float = 0.0) -> None:
        """A member's R11 report while the group has no rate of the rule's: the brain's. R15: when
        the brain's start - its estimate from the first lossy pass of the unpaced flood - falls
        below :data:`HOLD` of the share the uploads' flood measured (:attr:`floor_bps`), the group
        is seeded at that share instead (:meth:`seed`).

        Why a floor, not the broadcast's first rate: the brain's estimate reads the reply time,
        which the flood's full queue stretches (it drops the PROBE; TCP resends it 0.2 s later),
        so it starts far below the share and climbs to it round by round. But the uploads measure
        the server's receiving, not its sending, and a server may send faster than it receives
        (docs/pacing.md), so a broadcast paced at the uploads' share from its first datagram
        would be slowed there. As a floor the
        measurement only lifts a worse guess.

        And a cap, :data:`START_CAP` times the share: the brain's upper bound reads the send time,
        which a server that puts its flood out fast makes far too short, and from a start many
        times the share R14's rule swings (a cut after which the loss cannot fall is undone).
        Twice the share, because the rule's deepest cut is :data:`MAX_CUT` (half): from at most
        twice the share one cut reaches the share, so the loss falls and the cut stands, where from
        further up the loss cannot fall and the cut is undone. It also leaves room for a server
        that sends faster than it receives (on loopback, where no floor is set: its random loss is
        not an overflow)."""
        start = self.brain.rate_bps == 0.0
        self.brain.on_pass(sent, delivered, nbytes, send_s, reply_s, first, rate_bps, arrival_bps)
        if start and self.brain.rate_bps > 0.0 and not (
                HOLD * self.floor_bps <= self.brain.rate_bps <= START_CAP * self.floor_bps):
            self._floored = self.seed(self.floor_bps) > 0

    def seed(self, share_bps: float) -> float:
        """R15: the group's rate from a measured share of each stream (:meth:`UploadGrant.seed`:
        :data:`HOLD` of it, the share its ceiling). Returns the rate (0: none)."""
        g = self.rule.seed(share_bps)
        if g > 0:
            self.granted = True
            self.brain.grant(g)
        return g

    def round_done(self, stated_bps: Sequence[float], losses: Sequence[float], arrival_bps: float = 0.0,
                   burst: bool = False) -> float:
        """R14: a broadcast's streams are done - the rate each first pass was sent at (0: unpaced),
        each first pass's loss, and the mean rate clean streams arrived at (0: some lost), as
        :meth:`UploadGrant.round_done` takes them. Sets and returns the group's next rate (0:
        nothing known yet, the brain's start stands).

        R16: ``burst`` - the uploads of the round this broadcast serves were taken for a burst
        (:attr:`UploadGrant.burst`). Light loss in the broadcast before is then the burst's head
        (a burst is switched on as a round opens, while the last broadcast's slower streams are
        still sending), not the group's rate: the rate is held for the burst round and the loss
        not judged. Why: judged, the head is congestion - a cut that is undone only after the
        burst round, which is then sent at the cut rate. Heavy loss goes to the rule (its
        strikes)."""
        if self._floored:  # R15: seeded during an unpaced broadcast, whose loss says nothing of the seed
            self._floored = False
            # (nor the loss of a stream whose first pass began after the seed: the unpaced streams
            # beside it flooded the queue it lost in - judged, it would halve the seed)
            if not all(r > 0 for r in stated_bps):
                return self.rule.rate_bps
        if burst and self.rule.rate_bps > 0 and losses and 0.0 < sum(losses) / len(losses) < BURSTY_LOSS:
            self.rule.hold_for_burst()
            return self.rule.rate_bps
        g = self.rule.round_done(stated_bps, losses, arrival_bps)
        if g > 0:
            self.granted = True
            self.brain.grant(g)
        return g

