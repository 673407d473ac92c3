"""What part of a time-varying loss a run's rounds were exposed to, from their records.

A replayed loss trace (``emulation.replay.TraceReplayer``) changes the loss
on a link over wall-clock time; a round's datagrams sample it only while they
are on the link. With ON/OFF bursts a few times shorter than a round, the
loss a direction saw differs from the run's mean by several percent, so a
direction's measured loss is held to the schedule's mean over the windows it
was sending (:func:`exposure_by_direction`), not to the trace's mean.

Everything here reads :class:`dblp.protocol.records.RoundRecord` s (``t_start`` and the
latencies are wall-clock seconds) and, for the exposure, a function giving a
schedule's mean loss over a window - the replayer's ``requested_mean`` or
``achieved_mean`` - so it needs no emulation.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from dblp.protocol.records import RoundRecord

#: (start, end) in wall-clock seconds -> mean loss of a schedule over that window
WindowMean = Callable[[float, float], float]


def round_windows(recs: Sequence[RoundRecord]) -> dict[int, tuple[float, float]]:
    """Per round: wall-clock span from the first worker's start to the last worker's end."""
    out: dict[int, list[float]] = {}
    for r in recs:
        if r.role != "worker" or not math.isfinite(r.round_latency_s):
            continue
        a, b = r.t_start, r.t_start + r.round_latency_s
        w = out.setdefault(r.round, [a, b])
        w[0], w[1] = min(w[0], a), max(w[1], b)
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def run_window(recs: Sequence[RoundRecord]) -> tuple[float | None, float | None]:
    """The whole run's span over its rounds (None, None without worker rounds)."""
    wins = round_windows(recs)
    if not wins:
        return None, None
    return min(w[0] for w in wins.values()), max(w[1] for w in wins.values())


def direction_windows(recs: Sequence[RoundRecord]) -> dict[str, list[tuple[float, float, int]]]:
    """Per direction: (start, end, datagrams sent) of each transfer, in wall-clock seconds.

    Up: a worker's DBLP_SEND; down: the server's DBLP_SEND to that worker,
    which starts when its upstream receive ends.
    """
    out: dict[str, list[tuple[float, float, int]]] = {"up": [], "down": []}
    for r in recs:
        if not (math.isfinite(r.up_latency_s) and math.isfinite(r.down_latency_s)):
            continue
        if r.role == "worker" and r.up_sent:
            out["up"].append((r.t_start, r.t_start + r.up_latency_s, r.up_sent))
        elif r.role == "server" and r.down_sent:
            a = r.t_start + r.up_latency_s
            out["down"].append((a, a + r.down_latency_s, r.down_sent))
    return out


def exposure_by_direction(mean_over: WindowMean, recs: Sequence[RoundRecord]) -> dict[str, float]:
    """The schedule's loss over the windows each direction was sending, weighted by datagrams sent."""
    res: dict[str, float] = {}
    for d, wins in direction_windows(recs).items():
        vals = [(mean_over(a, b), n) for a, b, n in wins if b > a]
        vals = [(v, n) for v, n in vals if math.isfinite(v)]
        tot = sum(n for _, n in vals)
        res[d] = sum(v * n for v, n in vals) / tot if tot else float("nan")
    return res


def exposure_by_round(mean_over: WindowMean, recs: Sequence[RoundRecord]) -> dict[int, float]:
    """The schedule's mean loss over each round's span (:func:`round_windows`)."""
    return {k: mean_over(*w) for k, w in round_windows(recs).items()}


def received_fractions(recs: Sequence[RoundRecord], first_round: int = 1) -> dict[str, float]:
    """Mean and minimum received fraction per direction, and the share of rounds that needed more
    than one upstream pass, over rounds from ``first_round`` (round 0 is the connection warm-up).

    Up is what the server received (server records), down what each worker received."""
    srv = [r for r in recs if r.role == "server" and r.round >= first_round]
    wrk = [r for r in recs if r.role == "worker" and r.round >= first_round]
    nan = math.nan
    return {
        "up_mean": float(np.mean([r.up_frac for r in srv])) if srv else nan,
        "up_min": float(np.min([r.up_frac for r in srv])) if srv else nan,
        "down_mean": float(np.mean([r.down_frac for r in wrk])) if wrk else nan,
        "down_min": float(np.min([r.down_frac for r in wrk])) if wrk else nan,
        "retx_rounds": sum(1 for r in wrk if r.up_passes > 1) / max(1, len(wrk)),
    }
