"""What the two round sessions share (:mod:`dblp.protocol.session`): the settings of a run's rounds,
S5's upload stream, S7's consistency modes, and S6's record context and drop accounting.

Both :class:`dblp.protocol.session.ServerSession` and :class:`dblp.protocol.worker_session.WorkerSession` are
a :class:`SessionBase` (the settings both are built with, checked once), build their records from a
:class:`RecordContext` and count each receiver's drops by :func:`_drops`; the names are re-exported by
:mod:`dblp.protocol.session`, where callers import them.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from dblp.protocol.compensation import PAPER, Compensation
from dblp.protocol.core import DEFAULT_ORDER, DropCounters, Receiver
from dblp.protocol.wire import ChunkLayout, ParameterError

CONSISTENCY = ("none", "intersect")  # S7


def check_round_options(consistency: str, compensation: "Compensation") -> None:
    """Refuse a consistency mode S7 does not know, or compensation it cannot compose with (C6), naming it."""
    if consistency not in CONSISTENCY:
        raise ParameterError(f"consistency must be one of {CONSISTENCY}, got {consistency!r}")
    compensation.check_consistency(consistency)


def up_stream(worker: int) -> int:
    """R3 order stream of worker ``worker``'s upstream (S5)."""
    return 1 + worker


@dataclass(frozen=True)
class RecordContext:
    """What every record of a run states besides the round's own numbers."""

    source: str
    policy: str
    order: str
    send_rate_bps: float | None = None  # the senders' pacing (None: self-pacing, 0: unlimited)
    clock_offset: float = 0.0  # added to ``now`` for ``t_start``
    scale: float = 1.0  # datagrams per core chunk (the simulator's grouping); 1 elsewhere

    def count(self, n: int) -> int:
        return n if self.scale == 1.0 else int(round(n * self.scale))


@dataclass(eq=False, repr=False)
class SessionBase:
    """The settings a run's rounds are played under, the same on the server's side and a worker's:
    declared and checked (S7, C6) here once, so the two sessions cannot take them differently.

    Not compared or printed by value: a session is a running state machine, one object per peer."""

    layout: ChunkLayout
    _: KW_ONLY
    run_id: int
    context: RecordContext
    order: str = DEFAULT_ORDER  # R3: the chunk order of every stream
    seed: int = 0
    max_batch: int = 256  # datagrams a sender hands out per call
    consistency: str = "none"  # S7
    compensation: Compensation = PAPER  # S8
    round: int = field(init=False, default=0)  # the round this side is in

    def __post_init__(self) -> None:
        check_round_options(self.consistency, self.compensation)

    def _receiver(self, sender: int, direction: int, peer_addr: tuple[str, int] | None) -> Receiver:
        """A core receiver of this run from ``sender``, stopping by the run's stop rule (S8, core R5b)."""
        return Receiver(self.layout, run_id=self.run_id, expected_sender=sender, direction=direction,
                        peer_addr=peer_addr, stop_rule=self.compensation.stop_rule)


def _drops(rec: RecordContext, receiver: Receiver, reported: DropCounters) -> dict[str, int]:
    """The receiver's drops since the last record (``reported`` is brought up to date).

    Counted from the receiver's lifetime totals, not its per-round counters,
    so datagrams classified between rounds (a worker reads what arrived
    during its compute step only when its next round begins) land in the
    next record instead of in none."""
    total, seen = vars(receiver.total_drops), vars(reported)
    if total == seen:  # nothing dropped since (the common case: a record per worker and round)
        return dict(_NO_DROPS)
    delta = {k: v - seen[k] for k, v in total.items()}  # every counter, in the record's order
    seen.update(total)  # reported + delta
    delta["stale"], delta["duplicate"] = rec.count(delta["stale"]), rec.count(delta["duplicate"])  # in datagrams
    return delta


_NO_DROPS = dict.fromkeys(vars(DropCounters()), 0)  # every counter, none dropped
