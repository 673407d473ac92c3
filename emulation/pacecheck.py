"""The self-pacing targets (docs/pacing.md), measured on namespace hosts and returned as rows.

Three checks, each a real run of ``python -m dblp`` servers and workers on
the star of :func:`emulation.hostnet.star_net` (network namespaces, TBF
links with drop-tail queues, no Mininet needed):

- :func:`rate_check`: a sender paced by hand at 90% of a 1 or 2 Gbit/s link
  (one worker, GSO or plain path) delivers >= 90% of its rate: wire bytes
  of its upload over the upload's time, median of the rounds after the first.
- :func:`passes_check`: without any rate flag (self-pacing,
  :class:`dblp.protocol.pacing.AutoPacer`, the server's rules R12 and R14), rounds
  without injected loss need <= 1.2 passes per direction (mean over the
  workers' uploads and the server's broadcasts, every round counted, the
  first one's unpaced flood included; the detail also from rounds 1 and 2).
- :func:`burst_check`: under 70% bursts, the burst rounds of a self-paced run
  are no slower than those of the same run paced by hand at 90% of the
  fair share (the scenarios' old default ``--pace-share 0.9``).

:func:`targets` runs them all and returns :class:`Target` rows (target text,
measured value, threshold, met), which ``scenarios/benchmark.py --pacing``
prints. Needs root. Timing on a shared 2-core machine is noisy: each row
says what it measured so a reader can judge.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from dblp.runs.gradients import model_elements
from dblp.runs.launch import RunArgs
from dblp.protocol.policy import run_policy
from dblp.protocol.records import read_records
from dblp.protocol.wire import TAG_SIZE, ChunkLayout

from .launch import SCENARIO_PORT, run_with_bursts

__all__ = ["Target", "rate_check", "passes_check", "burst_check", "targets", "format_targets",
           "PASS_CONFIGS", "RATE_LINKS"]

#: (link bit/s, GSO) of the rate check
RATE_LINKS: tuple[tuple[float, bool], ...] = ((1e9, True), (1e9, False), (2e9, True), (2e9, False))
#: (link bit/s, queue in packets, workers) of the passes check: 4 link rates x 2 queue depths x 2 world sizes
PASS_CONFIGS: tuple[tuple[float, int, int], ...] = tuple(
    (bw, q, w) for bw in (100e6, 1e9, 2e9, 10e9) for q in (100, 1000) for w in (3, 8))
RATE_SHARE = 0.9  # the rate check paces at this fraction of the link
MIN_DELIVERED = 0.9  # ... and wants this fraction of that rate delivered
MAX_PASSES = 1.2  # passes per direction per round without injected loss
FRAME_OVERHEAD = 14  # Ethernet header bytes per frame on the TBF queue (Shape.from_link_opts counts frames)


@dataclass(frozen=True)
class Target:
    """One target row: what is asked, what was measured (``measured`` in ``unit``), the threshold,
    whether it is met, and how it was measured."""

    target: str
    measured: float
    threshold: float
    met: bool
    unit: str = ""
    detail: str = ""


def _env() -> dict[str, str]:
    """The launched processes import this checkout's packages."""
    return {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def _run(workers: int, bw_bps: float, queue_pkts: int, *, model: str | int, iterations: int,
         pace_bps: float | None, gso: bool = False, bursts: Sequence[int] = (), burst_loss: float = 0.7,
         mtu: int = 1500, out: Path, python: str = sys.executable, seed: int = 0) -> Path:
    """One baseline run (p = 0.008) on a fresh namespace star; returns the run folder (records/)."""
    from .bursts import bursts_from_spec
    from .hostnet import host_names, star_net
    from .loss import LossController

    queue_bytes = queue_pkts * (mtu + FRAME_OVERHEAD)
    net = star_net("netns", workers=workers, bw_mbps=bw_bps / 1e6, queue_bytes=queue_bytes, mtu=mtu, name="pacecheck")
    flags = run_policy("baseline", 0.008, 0.408, 0.5, 10).flags()
    args = RunArgs(workers=workers, iterations=iterations, model=model, policy=flags, source="emulation",
                   pace_bps=pace_bps, seed=seed, compute_s=0.005, peer_timeout_s=60.0, plain=not gso,
                   port=SCENARIO_PORT, python=python, mtu=mtu)
    schedule = bursts_from_spec({"kind": "iteration_bursts", "at": list(bursts), "loss": burst_loss},
                                rounds=iterations, seed=seed) if bursts else []
    with net, LossController(net) as lc:
        if gso:
            lc.use_segmented_links(host_names(net))  # GSO super-packets cut at the host link (emulation.loss)
        return run_with_bursts(net, lc, args, out, schedule, quiet=True, env=_env(),
                               timeout_s=120 + iterations * 60)


def _records(run: Path, role: str) -> list:
    recs = []
    for f in sorted((run / "records").glob("*.jsonl")):
        recs += [r for r in read_records(f) if r.role == role]
    return recs


def rate_check(bw_bps: float, gso: bool, *, model: str | int = "25M", iterations: int = 4, out: Path,
               python: str = sys.executable) -> Target:
    """One worker paced at :data:`RATE_SHARE` of a ``bw_bps`` link: its upload's wire rate over the
    pacing rate (median of the rounds after the first, whose buffers are touched for the first time)."""
    rate = RATE_SHARE * bw_bps
    run = _run(1, bw_bps, 1000, model=model, iterations=iterations, pace_bps=rate, gso=gso, out=out, python=python)
    ups = _records(run, "worker")
    lay = ChunkLayout(model_elements(model), 1500, key=bytes(TAG_SIZE))  # the run's wire (authenticated)
    got = [r.up_sent * lay.datagram_size * 8 / r.up_latency_s / rate for r in ups if r.up_latency_s > 0 and r.round > 0]
    frac = statistics.median(got) if got else 0.0
    passes = statistics.mean(r.up_passes for r in ups) if ups else float("nan")
    path = "GSO" if gso else "plain"
    return Target(f"paced sender delivers >= {MIN_DELIVERED:.0%} of its rate ({bw_bps / 1e9:g} Gbit/s link, {path})",
                  frac, MIN_DELIVERED, frac >= MIN_DELIVERED, "of rate",
                  f"paced at {rate / 1e6:g} Mbit/s; {len(got)} rounds: {', '.join(f'{g:.2f}' for g in got)}; "
                  f"{passes:.2f} passes per upload (round 0 left out)")


def _passes(run: Path, since: int = 1) -> tuple[float, float, float, float]:
    """Mean upload passes (workers' records) and broadcast passes (server's), all rounds and from
    round ``since`` on (1: without round 0's unpaced flood; 2: also without round 1, which paces at
    the flood's estimates before the server's rules (R12, R14) have a rate)."""
    up = [(r.round, r.up_passes) for r in _records(run, "worker")]
    down = [(r.round, r.down_passes) for r in _records(run, "server")]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    return (mean([p for _, p in up]), mean([p for _, p in down]),
            mean([p for k, p in up if k >= since]), mean([p for k, p in down if k >= since]))


def passes_check(bw_bps: float, queue_pkts: int, workers: int, *, model: str | int = "200k", iterations: int = 20,
                 out: Path, python: str = sys.executable) -> Target:
    """A run without any rate flag: the worse direction's mean passes per round (every round)."""
    run = _run(workers, bw_bps, queue_pkts, model=model, iterations=iterations, pace_bps=None, out=out, python=python)
    up, down, up1, down1 = _passes(run)
    up2, down2 = _passes(run, since=2)[2:]
    worst = max(up, down)
    return Target(f"no rate flag: <= {MAX_PASSES:g} passes per direction ({_bw(bw_bps)}, {queue_pkts}-pkt queue, "
                  f"{workers} workers)", worst, MAX_PASSES, worst <= MAX_PASSES, "passes",
                  f"up {up:.2f}, down {down:.2f} over {iterations} rounds of {model}; "
                  f"without round 0's unpaced flood: up {up1:.2f}, down {down1:.2f}; "
                  f"from round 2: up {up2:.2f}, down {down2:.2f}")


def _burst_latency(run: Path) -> float:
    """Median latency of the burst rounds (the server's records mark them, ``extra.burst``)."""
    rounds: dict[int, float] = {}
    for r in _records(run, "server"):
        if r.extra.get("burst"):
            rounds[r.round] = max(rounds.get(r.round, 0.0), r.round_latency_s)
    return statistics.median(rounds.values()) if rounds else float("nan")


def burst_check(*, bw_bps: float = 100e6, queue_pkts: int = 100, workers: int = 3, model: str | int = "500k",
                iterations: int = 16, bursts: Sequence[int] = (5, 9, 13), out: Path,
                python: str = sys.executable) -> Target:
    """The same bursty run twice, self-paced and paced by hand at 90% of the fair share: the
    median burst-round latency of the first over that of the second."""
    hand = RATE_SHARE * bw_bps / workers
    auto = _burst_latency(_run(workers, bw_bps, queue_pkts, model=model, iterations=iterations, pace_bps=None,
                               bursts=bursts, out=out / "auto", python=python))
    fixed = _burst_latency(_run(workers, bw_bps, queue_pkts, model=model, iterations=iterations, pace_bps=hand,
                                bursts=bursts, out=out / "hand", python=python))
    ratio = auto / fixed if fixed > 0 else float("nan")
    return Target(f"70% bursts: burst round no slower self-paced than paced by hand ({_bw(bw_bps)}, "
                  f"{workers} workers)", ratio, 1.0, ratio <= 1.0, "x hand-paced",
                  f"median burst round {auto:.3f} s self-paced vs {fixed:.3f} s at {hand / 1e6:g} Mbit/s "
                  f"(rounds {', '.join(map(str, bursts))} of {iterations}, {model})")


def _bw(bps: float) -> str:
    return f"{bps / 1e9:g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:g} Mbit/s"


def targets(*, out: str | os.PathLike | None = None, rates: Sequence[tuple[float, bool]] = RATE_LINKS,
            passes: Sequence[tuple[float, int, int]] = PASS_CONFIGS, burst: bool = True,
            python: str = sys.executable, progress: Callable[[str], None] = lambda s: print(s, flush=True)
            ) -> list[Target]:
    """Every pacing target as rows; runs under ``out`` (a temporary folder, removed, if None)."""
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="dblp-pacecheck-")
        out = tmp.name
    root = Path(out)
    rows: list[Target] = []
    jobs: list[tuple[str, Callable[[Path], Target]]] = []
    for bw, gso in rates:
        jobs.append((f"rate-{bw / 1e9:g}G-{'gso' if gso else 'plain'}",
                     lambda d, bw=bw, gso=gso: rate_check(bw, gso, out=d, python=python)))
    for bw, q, w in passes:
        jobs.append((f"passes-{bw / 1e6:g}M-{q}pkt-{w}w",
                     lambda d, bw=bw, q=q, w=w: passes_check(bw, q, w, out=d, python=python)))
    if burst:
        jobs.append(("bursts", lambda d: burst_check(out=d, python=python)))
    try:
        for i, (name, job) in enumerate(jobs, 1):
            progress(f"pacecheck [{i}/{len(jobs)}] {name}")
            rows.append(job(root / name))
            progress(f"  {rows[-1].measured:.3g} {rows[-1].unit} ({'met' if rows[-1].met else 'NOT met'}): "
                     f"{rows[-1].detail}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return rows


def format_targets(rows: Sequence[Target]) -> str:
    """The rows as a plain table: target, measured, threshold, met."""
    w = max([len(r.target) for r in rows] + [6])
    lines = [f"{'target':<{w}}  {'measured':>10}  {'threshold':>9}  met", "-" * (w + 30)]
    for r in rows:
        lines.append(f"{r.target:<{w}}  {r.measured:>10.3g}  {r.threshold:>9.3g}  {'yes' if r.met else 'NO'}")
    return "\n".join(lines)
