"""Time lossless DBLP rounds on 127.0.0.1, one process per party, without root.

The quickest way to measure the transport anywhere, and the one-call API for
comparisons with other transports on the same loopback (e.g. the DBLP
authors' prototype)::

    from dblp.runs.loopback import loopback_rounds
    res = loopback_rounds(25_000_000, workers=3, rounds=5)
    print(res.median_s, res.round_s)

    python -m dblp loopback --model 25M --workers 3 --iterations 5

A server and ``workers`` workers start as separate processes through
:mod:`dblp.runs.launch` - the same ``python -m dblp server`` / ``worker``
commands every launcher of the testbed writes - and
exchange synthetic gradients. Every worker makes its round's gradient and
waits at a common start line (:mod:`dblp.runs.startline`), as gloo's harness starts
its ranks together once each holds its tensor; a round's time is the span from
the first worker's start of the round (within a millisecond of the last's) to
the last worker's averaged result, from the workers' own per-round records
(:mod:`dblp.protocol.records`), after ``warmup`` untimed rounds (the first touches fresh
memory).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dblp.protocol.core import DEFAULT_ORDER, ORDERS
from dblp.runs.launch import Launch, LaunchError, LocalRunner, RunArgs
from dblp.protocol.policy import run_policy
from dblp.protocol.records import read_records
from dblp.transport.shard import AGGREGATIONS
from dblp.transport.udp import resolve_mtu
from dblp.protocol.wire import AUTO_MTU, DEFAULT_MTU, ChunkLayout, ParameterError

_ROOT = Path(__file__).resolve().parents[2]
_BIND = "127.0.0.1"


@dataclass
class LoopbackResult:
    elements: int
    workers: int
    mtu: int = DEFAULT_MTU  # the link MTU the run's datagrams were sized for (auto: lo's, capped)
    round_s: list[float] = field(default_factory=list)  # per timed round, first start (the workers start together) to last result
    up_s: list[float] = field(default_factory=list)  # slowest worker's send (start to the server's STOP)
    down_s: list[float] = field(default_factory=list)  # slowest worker's receive of the mean
    passes: list[int] = field(default_factory=list)  # most send passes any worker needed, either direction
    chunks: int = 0  # datagrams per worker per direction (per shard server's part, summed, when sharded)

    @property
    def median_s(self) -> float:
        return statistics.median(self.round_s)

    def to_dict(self) -> dict:
        return {"elements": self.elements, "workers": self.workers, "mtu": self.mtu, "median_s": self.median_s,
                "round_s": self.round_s, "up_s": self.up_s, "down_s": self.down_s,
                "passes": self.passes, "chunks": self.chunks}


def loopback_rounds(
    elements: int,
    *,
    workers: int = 3,
    rounds: int = 5,
    warmup: int = 1,
    p: float = 0.0,
    mtu: int | str = AUTO_MTU,
    order: str = DEFAULT_ORDER,
    fast: bool | None = None,
    timeout: float = 300.0,
    insecure: bool = False,
    aggregation: str = "server",
    compensation: Any = None,
) -> LoopbackResult:
    """Run ``warmup + rounds`` rounds; return the timed ones. ``p`` = 0 is the
    reliable policy, else a fixed tolerance; ``fast=False`` forces the plain
    (no GSO/GRO: one datagram per message, sendmmsg/recvmmsg batches) path;
    ``insecure`` the paper's CRC-only wire instead of the authenticated one; ``aggregation``
    ``sharded`` a shard server per worker (:mod:`dblp.transport.shard`) instead of the paper's one server.
    ``mtu``: ``auto`` (the default) sizes datagrams for the path, 127.0.0.1's ``lo``
    (:func:`dblp.transport.udp.auto_mtu`, the same rule the server applies to ``--mtu auto``); a number of
    bytes, e.g. 1500, sizes them as on an Ethernet path between real hosts. ``compensation``: a
    :class:`dblp.protocol.compensation.Compensation` for the server (None: the paper's)."""
    mtu = resolve_mtu(mtu, _BIND)[0]  # resolved here, so the result can say which size the run used
    ChunkLayout(elements, mtu)  # refuses a bad size or MTU by name
    if workers < 1 or rounds < 1 or warmup < 0:
        raise ParameterError(f"need workers >= 1, rounds >= 1, warmup >= 0 (got {workers}, {rounds}, {warmup})")
    if not 0 <= p < 1:
        raise ParameterError(f"p must be in [0, 1), got {p}")
    if aggregation not in AGGREGATIONS:
        raise ParameterError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "sharded" and workers < 2:
        raise ParameterError(f"the sharded mode needs at least 2 workers, got {workers}")
    if order not in ORDERS:
        raise ParameterError(f"order must be one of {ORDERS}, got {order!r}")
    total = warmup + rounds
    env = {"PYTHONPATH": f"{_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory(prefix="dblp-loopback-") as tmp:
        d = Path(tmp)
        # timed from a common start, as gloo's harness is: every worker has its gradient first (dblp.runs.startline)
        args = RunArgs(workers=workers, iterations=total, model=elements, source="loopback",
                       policy=run_policy("reliable" if p == 0 else "fixed", p_low=p).flags(), peer_timeout_s=timeout,
                       plain=fast is False, port=0, mtu=mtu, server_extra=["--order", order] + (compensation.flags() if compensation else []), insecure=insecure,
                       aggregation=aggregation, worker_extra=["--start-together", str(d / "start")])
        try:
            with Launch(LocalRunner(), "local", ["local"] * workers, args, records_dir=d, log_dir=d, env=env,
                        bind=_BIND) as run:
                run.wait(timeout)
        except LaunchError as exc:
            raise RuntimeError(f"loopback rounds: {exc}") from None
        per_round: dict[int, list[dict]] = {}
        for i in range(workers):
            for rec in read_records(d / f"worker{i}.jsonl"):  # null -> NaN, as written
                per_round.setdefault(rec.round, []).append(vars(rec))
    res = LoopbackResult(elements, workers, mtu)
    for r in range(warmup, total):
        recs = per_round[r]
        res.round_s.append(max(x["t_start"] + x["round_latency_s"] for x in recs) - min(x["t_start"] for x in recs))
        res.up_s.append(max(x["up_latency_s"] for x in recs))
        res.down_s.append(max(x["down_latency_s"] for x in recs))
        res.passes.append(max(max(x["up_passes"], x["down_passes"]) for x in recs))
        res.chunks = max(x["chunks"] for x in recs)
    return res
