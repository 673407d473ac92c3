"""The upload grant (rules R12, R15's seed and R17): one rate for every self-pacing worker.

The rules are stated in :mod:`dblp.protocol.pacing`; :class:`UploadGrant` decides the rate from
a round's first passes, the round logic (:mod:`dblp.protocol.session`, through
:class:`dblp.protocol.pacing.rates.ServerPacing`) says when a round's uploads are in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dblp.protocol.pacing.auto import (AUTO_FLOOR_BPS, BURSTY_LOSS, CEILING_CREEP, CUT, HEADROOM, HOLD, MAX_CUT,
                                       RECOVERED, STEP, STRIKES)


class UploadGrant:
    """R12, the server's side: one upload rate for every self-pacing worker, from all their passes.

    Why: senders that adapt alone keep the unequal shares their first flood gave them, and a
    round lasts as long as its slowest upload (docs/pacing.md). The server receives every
    worker's upload: after each round's upstream it knows each worker's first-pass loss (the
    count its first BITMAP carried; none when STOP came first) and, from the PROBEs, the rate
    each pass was sent at. It runs :class:`AutoPacer`'s verdicts on the group:

    - seed: the first round in which workers stated rates (their own R11 estimates after the
      unpaced first flood: a PROBE states its pass's rate), their mean - the sum they found,
      split equally; or, a round with every first pass clean (a STOP before the PROBE states
      nothing), the mean rate the uploads arrived at; judged by that round's loss as below;
    - every worker's first pass clean: the grant rises by :data:`STEP` up to :data:`HOLD` of
      the grant that last lost (the ceiling, creeping :data:`CEILING_CREEP` a round), doubling
      while no loss has been seen at a granted rate, but to at most :data:`HEADROOM` x the
      rate the clean uploads arrived at (a doubling past the share costs a round of retransmissions);
    - first-pass loss (the workers' mean): congestion when under :data:`BURSTY_LOSS` or at a
      grant above the last clean one: the ceiling becomes the grant, which is cut by
      ``max(2 x loss, CUT)`` (to no less than :data:`MAX_CUT`), and the cut grant counts as clean
      after light loss (a fifth less load cannot lose 20%); heavy loss at a clean grant, or
      one step above it, or more than the step up from the last clean grant can lose (a load
      raised f-fold loses at most 1 - 1/f of it: the start's 1.25x steps 20%), is a burst
      (DBLP's), no change, unless :data:`STRIKES` rounds in a row;
      nor does light loss in the round after a burst cut (the burst's tail: a burst that begins
      in one round reaches into the next round's first passes), nor heavy loss there
      beside a worker's clean first pass (R17: a burst that ends mid-pass spares the uploads
      that came later; congestion from the grant loses on all of them); a cut after which the
      loss did not fall (:data:`RECOVERED` of it or more) is undone (a lossy path: 25% random
      loss would otherwise halve the grant round after round, to the floor; and a burst's head -
      light loss as it began, a cut, then the burst - is not a reason to stay cut).

    The grant is then every worker's starting rate (:meth:`AutoPacer.grant`)."""

    def __init__(self, strikes: int = STRIKES) -> None:
        self.strikes = strikes  # rounds in a row of heavy loss at a proven grant that make congestion
        self.rate_bps = 0.0  # 0: no grant (nothing stated yet)
        self.ceiling_bps = math.inf
        self.good_bps = 0.0
        self._strikes = 0
        self._tail = False  # the last round was a burst: its tail may fall into the next round's first passes
        self._cut: tuple[float, float, bool] | None = None  # (grant before the last cut, that round's loss,
        # whether that grant was proven and the loss light)
        self._soft = False  # R15: the ceiling is a seed's measured share, not a loss seen: it rises STEP a round
        self.burst = False  # R16: the last round's loss was taken for a burst (DBLP's), not congestion
        self.cuts = 0
        self.restores = 0

    def seed(self, share_bps: float) -> float:
        """R15: the first grant from a measured share (bit/s per worker: the bottleneck's rate
        the round's unpaced first passes arrived at, split equally), when no grant exists yet.
        The grant starts at :data:`HOLD` of it and the share is its ceiling - where a hand-set
        ``--pace-share 0.9`` puts a worker - so it neither doubles past the share nor climbs
        to it from a poor guess (the workers' own estimates from the flood, well below the
        share). The ceiling is soft
        until the first cut: a clean round raises it by :data:`STEP`, not :data:`CEILING_CREEP`,
        so a share measured too low (a burst in the flood, a cold receiver) is left at 4% a
        round, and a right one costs one light loss a few rounds on. Unproven: the next
        round's loss is judged as at any new grant (a cut, the ceiling the grant).
        Returns the grant (0: a grant exists, or the share is not a rate)."""
        if self.rate_bps > 0 or not (math.isfinite(share_bps) and share_bps > 0):
            return 0.0
        self.ceiling_bps = share_bps
        self.good_bps = 0.0
        self._soft = True
        self.rate_bps = max(AUTO_FLOOR_BPS, HOLD * share_bps)
        return self.rate_bps

    def hold_for_burst(self) -> None:
        """R16: a round judged elsewhere to be a burst's head: no verdict, the rate held; the next
        round (the burst) and the one after (its tail) are judged as after a burst."""
        self._cut = None
        self._tail = True

    def round_done(self, stated_bps: Sequence[float], losses: Sequence[float], arrival_bps: float = 0.0,
                   paced: bool = True) -> float:
        """A round's uploads: the rate each worker stated (0: none), each first pass's loss
        fraction, the mean rate clean uploads arrived at (bit/s; 0: some first pass lost), and
        whether any first pass was paced (stated a rate). Returns the next round's grant (0: none);
        :attr:`burst` says whether this round's loss was taken for a burst."""
        self.burst = False
        if self.rate_bps == 0.0:
            rates = [r for r in stated_bps if math.isfinite(r) and r > 0]
            if rates:  # the seed: the sum the workers found alone, split equally
                self.rate_bps = max(AUTO_FLOOR_BPS, sum(rates) / len(rates))
                if not paced:  # stated by later passes: the first passes' loss is the unpaced flood's, no verdict
                    return self.rate_bps
            elif arrival_bps > 0 and math.isfinite(arrival_bps):  # nothing stated, nothing lost: as they arrived
                self.rate_bps = max(AUTO_FLOOR_BPS, arrival_bps)
            else:
                return 0.0
        loss = sum(losses) / len(losses) if losses else 0.0
        g = self.rate_bps
        proven = g <= self.good_bps * (1.0 + STEP) * CEILING_CREEP
        tail, self._tail = self._tail, False
        cut, self._cut = self._cut, None
        if loss == 0.0:
            self._strikes = 0
            self.good_bps = max(self.good_bps, g)
            if self.ceiling_bps == math.inf:  # doubling, but at most HEADROOM x what clean passes delivered
                # (paced below the path they arrive at the grant, so a clean round rises 25%, not 100%,
                # and the start does not double past the share)
                cap = HEADROOM * arrival_bps if arrival_bps > 0 and math.isfinite(arrival_bps) else math.inf
                self.rate_bps = max(MAX_CUT * g, min(2.0 * g, cap))
            else:
                self.ceiling_bps *= (1.0 + STEP) if self._soft else CEILING_CREEP
                self.rate_bps = max(g, min(g * (1.0 + STEP), HOLD * self.ceiling_bps))
            return self.rate_bps
        # a burst, not the rate's doing: heavy loss at a clean grant or one step above it (a +4%
        # step adds 4% to the load, it cannot lose 20% of it) ...
        # (or more than any step up from the last clean grant can lose - a load raised by a factor f loses at
        # most 1 - 1/f of it: a start step of 1.25x at most 20%; 70% during the start is a burst too)
        if cut is not None and cut[2] and loss >= BURSTY_LOSS:
            # a burst's head: light loss at a proven grant as the burst began, a cut, then the burst itself
            self.restores += 1
            self.rate_bps = self.good_bps = cut[0]
            self._strikes, self._tail, self.burst = 0, True, True
            return self.rate_bps
        if tail and proven and (loss < BURSTY_LOSS or (len(losses) > 1 and min(losses) == 0.0)):
            # the round after a burst, at a proven grant: its tail, not the rate - light loss, or (R17) heavy
            # loss beside a clean first pass (a burst that ends mid-pass spares the later uploads; a grant
            # that overflows the server's link loses on every upload): no strike, no cut
            return g
        if loss >= BURSTY_LOSS and (proven or (self.good_bps > 0 and loss > 1.0 - self.good_bps / g)):
            self._strikes += 1
            if self._strikes < self.strikes:
                self._tail = self.burst = True
                return g
        if cut is not None and loss >= RECOVERED * cut[1]:  # slower did not help: a lossy path, not congestion
            self.restores += 1
            self.rate_bps = self.good_bps = cut[0]
            self._strikes = 0
            return self.rate_bps
        self._strikes = 0
        self.cuts += 1
        self._soft = False
        starting = self.ceiling_bps == math.inf
        self.ceiling_bps = g
        self._cut = (g, loss, proven and loss < BURSTY_LOSS)
        if starting and 0.0 < self.good_bps < g:  # the doubling overshot: back to the last clean grant
            self.rate_bps = self.good_bps
        else:  # a cut after light loss is proven for bursts: at a fifth less load, the light loss cannot grow to 20%
            self.rate_bps = max(AUTO_FLOOR_BPS, g * max(MAX_CUT, 1.0 - max(2.0 * loss, CUT)))
            self.good_bps = self.rate_bps if loss < BURSTY_LOSS else 0.0
        return self.rate_bps

