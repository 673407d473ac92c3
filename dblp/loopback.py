"""Time lossless DBLP rounds on 127.0.0.1, one process per party, without root.

The quickest way to measure the transport anywhere, and the one-call API for
comparisons with other transports on the same loopback (e.g. the DBLP
authors' prototype)::

    from dblp.loopback import loopback_rounds
    res = loopback_rounds(25_000_000, workers=3, rounds=5)
    print(res.median_s, res.round_s)

    python -m dblp loopback --model 25M --workers 3 --iterations 5

A server and ``workers`` workers start as separate processes - the same
``python -m dblp server`` / ``worker`` commands a deployment runs - and
exchange synthetic gradients. A round's time is the span from the first
worker's start of the round to the last worker's averaged result, from the
workers' own per-round records (:mod:`dblp.records`), after ``warmup``
untimed rounds (the first touches fresh memory).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .core import DEFAULT_ORDER, ORDERS
from .policy import run_policy
from .records import read_records
from .wire import ChunkLayout, ParameterError

_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LoopbackResult:
    elements: int
    workers: int
    round_s: list[float] = field(default_factory=list)  # per timed round, first start to last result
    up_s: list[float] = field(default_factory=list)  # slowest worker's send (start to the server's STOP)
    down_s: list[float] = field(default_factory=list)  # slowest worker's receive of the mean

    @property
    def median_s(self) -> float:
        return statistics.median(self.round_s)

    def to_dict(self) -> dict:
        return {"elements": self.elements, "workers": self.workers, "median_s": self.median_s,
                "round_s": self.round_s, "up_s": self.up_s, "down_s": self.down_s}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_rounds(
    elements: int,
    *,
    workers: int = 3,
    rounds: int = 5,
    warmup: int = 1,
    p: float = 0.0,
    mtu: int = 1500,
    order: str = DEFAULT_ORDER,
    fast: bool | None = None,
    timeout: float = 300.0,
) -> LoopbackResult:
    """Run ``warmup + rounds`` rounds; return the timed ones. ``p`` = 0 is the
    reliable policy, else a fixed tolerance; ``fast=False`` forces the plain
    (no GSO/GRO: one datagram per message, sendmmsg/recvmmsg batches) path."""
    ChunkLayout(elements, mtu)  # refuses a bad size or MTU by name
    if workers < 1 or rounds < 1 or warmup < 0:
        raise ParameterError(f"need workers >= 1, rounds >= 1, warmup >= 0 (got {workers}, {rounds}, {warmup})")
    if not 0 <= p < 1:
        raise ParameterError(f"p must be in [0, 1), got {p}")
    if order not in ORDERS:
        raise ParameterError(f"order must be one of {ORDERS}, got {order!r}")
    total = warmup + rounds
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=f"{_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    policy = run_policy("reliable" if p == 0 else "fixed", p_low=p).flags()
    plain = ["--plain"] if fast is False else []
    with tempfile.TemporaryDirectory(prefix="dblp-loopback-") as tmp:
        d = Path(tmp)
        procs = [subprocess.Popen(
            [sys.executable, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", str(workers), "--iterations", str(total), "--mtu", str(mtu), "--order", order,
             "--peer-timeout", f"{timeout:g}", *policy, *plain],
            stdout=subprocess.DEVNULL, stderr=open(d / "server.err", "w"), env=env)]
        for i in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dblp", "worker", "--server", f"127.0.0.1:{port}", "--id", str(i),
                 "--model", str(elements), "--iterations", str(total), "--records", str(d / f"w{i}.jsonl"),
                 "--peer-timeout", f"{timeout:g}", *plain],
                stdout=subprocess.DEVNULL, stderr=open(d / f"w{i}.err", "w"), env=env))
        try:
            for proc in procs:
                proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"loopback rounds did not finish within {timeout:g} s") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        names = ["server"] + [f"w{i}" for i in range(workers)]
        for name, proc in zip(names, procs):
            if proc.returncode != 0:
                tail = (d / f"{name}.err").read_text()[-2000:]
                raise RuntimeError(f"loopback {name} exited with {proc.returncode}:\n{tail}")
        per_round: dict[int, list[dict]] = {}
        for i in range(workers):
            for rec in read_records(d / f"w{i}.jsonl"):  # null -> NaN, as written
                per_round.setdefault(rec.round, []).append(vars(rec))
    res = LoopbackResult(elements, workers)
    for r in range(warmup, total):
        recs = per_round[r]
        res.round_s.append(max(x["t_start"] + x["round_latency_s"] for x in recs) - min(x["t_start"] for x in recs))
        res.up_s.append(max(x["up_latency_s"] for x in recs))
        res.down_s.append(max(x["down_latency_s"] for x in recs))
    return res
