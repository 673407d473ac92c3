"""Scriptable microburst injector: random-drop bursts and real congestion bursts.

Kinds of burst (mix freely in one schedule):

- ``IterationBurst(iteration=k, loss=r, iterations=1)``: the paper's method
  (section V-B: 70% loss for one iteration). Needs the scenario to call
  ``injector.on_iteration(k)`` at the start of every iteration.
- ``TimedBurst(at_s=t, loss=r, duration_ms=d)``: wall-clock burst, ``t``
  seconds after ``injector.start()``, driven by a timer thread.
- ``bursts_from_spec(spec, rounds=...)``: the iteration bursts of a loss spec
  of the project's vocabulary (``traces.processes``: ``iteration_bursts``,
  ``random_bursts``), the same iterations the simulator hits;
- ``random_bursts(...)`` / ``poisson_bursts(...)``: seeded random schedules of
  the two kinds above.
- ``CongestionBurst(src, dst, rate_mbps, duration_s, at_iteration|at_s)``:
  real cross-traffic (iperf3 UDP from an extra host) that overflows a shaped
  bottleneck's finite TBF queue, so the loss comes from a full queue, hits
  every flow through that port, and shows up in ``tc -s`` drop counters.

Overlapping random-drop bursts on one target apply the highest active rate.
Every action is appended to a JSONL log (``time.time()`` stamps), with the
nft counters (and for congestion bursts the qdisc counters) read at each end,
so the schedule that was *actually* applied, and what it dropped, is on record.
"""

from __future__ import annotations

import heapq
import json
import random
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable, Sequence, Union

from traces.processes import burst_iterations, burst_windows, check_spec

from .loss import LossController, LossTarget
from .sysutil import CommandError, wait_listening


@dataclass(frozen=True)
class IterationBurst:
    """Loss ``loss`` on the targets for ``iterations`` iterations starting at ``iteration``."""

    iteration: int
    loss: float = 0.7
    iterations: int = 1
    targets: tuple[LossTarget, ...] | None = None  # None: the injector's default targets

    kind = "iteration"


@dataclass(frozen=True)
class TimedBurst:
    """Loss ``loss`` from ``at_s`` seconds after ``start()`` for ``duration_ms`` ms."""

    at_s: float
    loss: float = 0.7
    duration_ms: float = 100.0
    targets: tuple[LossTarget, ...] | None = None

    kind = "timed"


@dataclass(frozen=True)
class CongestionBurst:
    """iperf3 UDP at ``rate_mbps`` from host ``src`` to host ``dst`` for ``duration_s``.

    Starts at iteration ``at_iteration`` or at ``at_s`` seconds after start
    (exactly one of them). ``bottleneck``: interface whose qdisc drops are
    reported (default: the switch port towards ``dst``). The sender's own link
    must be faster than the bottleneck for its queue to overflow (e.g.
    ``StarTopo(cross_hosts=1, cross_bw=10*bw)``).
    """

    src: str
    dst: str
    rate_mbps: float
    duration_s: float
    at_iteration: int | None = None
    at_s: float | None = None
    port: int = 5201
    length: int = 1400
    bottleneck: str | None = None

    kind = "congestion"

    def __post_init__(self) -> None:
        if (self.at_iteration is None) == (self.at_s is None):
            raise ValueError("CongestionBurst needs exactly one of at_iteration / at_s")


Burst = Union[IterationBurst, TimedBurst, CongestionBurst]


def bursts_from_spec(spec: dict, *, rounds: int, seed: int = 0, index: int = 0,
                     targets: tuple[LossTarget, ...] | None = None) -> list[IterationBurst]:
    """The bursts of an iteration-keyed loss spec of the project's one vocabulary
    (:mod:`traces.processes`: ``iteration_bursts`` / ``random_bursts``), so the
    emulation injects exactly the iterations the simulator and the host launcher
    hit for the same spec, seed and spec index. Consecutive iterations at one
    loss become one burst."""
    check_spec(spec)
    level = burst_iterations(spec, index, seed, rounds)
    return [IterationBurst(k, loss, n, targets) for k, n, loss in burst_windows(level)]


def random_bursts(n_iterations: int, rate: float, *, loss: float = 0.7, seed: int = 0,
                  iterations: int = 1, first: int = 1) -> list[IterationBurst]:
    """Seeded schedule: each iteration in [first, n_iterations) starts a burst with
    probability ``rate`` (the ``random_bursts`` spec of :mod:`traces.processes`)."""
    spec = {"kind": "random_bursts", "rate": rate, "loss": loss, "length": iterations}
    return [b for b in bursts_from_spec(spec, rounds=n_iterations, seed=seed) if b.iteration >= first]


def poisson_bursts(duration_s: float, rate_hz: float, *, loss: float = 0.7,
                   duration_ms: float = 100.0, seed: int = 0) -> list[TimedBurst]:
    """Seeded Poisson schedule of timed bursts at ``rate_hz`` over ``duration_s`` seconds."""
    rng = random.Random(seed)
    out: list[TimedBurst] = []
    t = rng.expovariate(rate_hz) if rate_hz > 0 else duration_s
    while t < duration_s:
        out.append(TimedBurst(at_s=round(t, 6), loss=loss, duration_ms=duration_ms))
        t += duration_ms / 1000 + rng.expovariate(rate_hz)
    return out


def burst_to_dict(b: Burst) -> dict:
    """JSON-ready description of a burst (targets as labels)."""
    d = asdict(b)
    d["kind"] = b.kind
    if d.get("targets") is not None:
        d["targets"] = [t.label() for t in b.targets]
    return d


class BurstInjector:
    """Applies a burst schedule through a ``LossController`` and logs what happened.

    loss: the controller (its ``net`` is used for congestion bursts).
    schedule: bursts. targets: default loss targets of random-drop bursts.
    log_path: JSONL file (e.g. ``RunRecorder.bursts_path``); None keeps the log in memory only.

    Usage::

        with BurstInjector(lc, [IterationBurst(5, 0.7)], [LossTarget("srv")], path) as inj:
            for k in range(n):
                inj.on_iteration(k)   # before iteration k's traffic starts
                ...
    """

    def __init__(self, loss: LossController, schedule: Iterable[Burst],
                 targets: Sequence[LossTarget] = (), log_path: str | Path | None = None) -> None:
        self.loss = loss
        self.net = loss.net
        self.schedule: list[Burst] = list(schedule)
        self.targets = tuple(targets)
        for b in self.schedule:
            if isinstance(b, (IterationBurst, TimedBurst)) and not (b.targets or self.targets):
                raise ValueError(f"{b} has no targets and the injector has no default targets")
        self.events: list[dict] = []
        self._fh: IO[str] | None = None
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(log_path, "a", encoding="utf-8")
        self._lock = threading.RLock()
        self._active: dict[int, Burst] = {}  # burst index -> burst, random-drop bursts now on
        self._done: set[int] = set()
        self._t0: float | None = None
        self._iteration: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timers: list[tuple[float, int, str, int]] = []  # (t, seq, action, burst index)
        self._servers: dict[tuple[str, int], subprocess.Popen] = {}
        self._clients: dict[int, subprocess.Popen] = {}
        self._waiters: list[threading.Thread] = []
        self._window_start: dict[int, dict] = {}

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "BurstInjector":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "BurstInjector":
        """Start the clock (timed bursts count from here), iperf3 servers and the timer thread."""
        self._t0 = time.time()
        for i, b in enumerate(self.schedule):
            if isinstance(b, CongestionBurst) and (b.dst, b.port) not in self._servers:
                self._servers[(b.dst, b.port)] = self.net.popen(
                    b.dst, ["iperf3", "-s", "-p", str(b.port)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seq = 0
        for i, b in enumerate(self.schedule):
            if isinstance(b, TimedBurst):
                self._timers.append((self._t0 + b.at_s, seq, "on", i))
                self._timers.append((self._t0 + b.at_s + b.duration_ms / 1000, seq + 1, "off", i))
                seq += 2
            elif isinstance(b, CongestionBurst) and b.at_s is not None:
                self._timers.append((self._t0 + b.at_s, seq, "congest", i))
                seq += 1
        heapq.heapify(self._timers)
        self._emit({"event": "start", "t": self._t0,
                    "schedule": [dict(burst_to_dict(b), index=i) for i, b in enumerate(self.schedule)],
                    "default_targets": [t.label() for t in self.targets]})
        try:
            for (_, port), server in self._servers.items():  # listening before a client may connect
                wait_listening(server, port)
        except CommandError:
            self.stop()
            raise
        if self._timers:
            self._thread = threading.Thread(target=self._timer_loop, name="burst-timer", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End active bursts, wait for cross-traffic, stop servers, log final counters. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            for i in list(self._active):
                self._end(i, reason="stop")
        for w in self._waiters:
            w.join(timeout=30)
        for p in self._servers.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    p.kill()
        self._emit({"event": "stop", "t": time.time(), "counters": self._counters()})
        if self._fh:
            self._fh.close()
            self._fh = None

    # ------------------------------------------------------------ iteration hook
    def on_iteration(self, k: int) -> None:
        """Call at the start of iteration ``k``: ends and starts iteration-keyed bursts."""
        self.on_rounds(k, k)

    def on_rounds(self, first: int, last: int) -> bool:
        """Rounds ``first..last`` are in flight (the server's round hook: the fastest worker's
        round opens while the slowest still receives the one before): a burst is on while any
        of its iterations is in flight. Returns whether one is on for round ``last``."""
        if self._t0 is None:
            raise RuntimeError("call start() (or use the injector as a context manager) first")
        k = last
        with self._lock:
            self._iteration = k
            for i, b in enumerate(self.schedule):
                if isinstance(b, IterationBurst):
                    want = b.iteration <= last and first < b.iteration + b.iterations
                    if i in self._active and not want:
                        self._end(i, reason="iteration")
                    elif want and i not in self._active and i not in self._done:
                        self._begin(i)
                    elif not want and i not in self._done and k >= b.iteration + b.iterations:
                        self._done.add(i)
                        self._emit({"event": "missed", "t": time.time(), "burst": i,
                                    "iteration": k, **burst_to_dict(b)})
                elif isinstance(b, CongestionBurst) and b.at_iteration == k and i not in self._done:
                    self._congest(i)
            return any(isinstance(b, IterationBurst) and b.iteration <= k < b.iteration + b.iterations
                       for b in self.schedule)

    # ------------------------------------------------------------ internals
    def _targets_of(self, b: Burst) -> tuple[LossTarget, ...]:
        return tuple(b.targets) if getattr(b, "targets", None) else self.targets

    def _apply_rates(self, targets: Iterable[LossTarget]) -> dict[str, float]:
        """Set each target to the max loss of the bursts now active on it."""
        applied, change = {}, {}
        for t in targets:
            rate = max((b.loss for b in self._active.values() if t in self._targets_of(b)),
                       default=0.0)
            if rate != self.loss.rate(t):
                change[t] = rate
            applied[t.label()] = rate
        if change:  # one transaction per host: its rules switch together
            self.loss.set_losses(change)
        return applied

    def _begin(self, i: int) -> None:
        b = self.schedule[i]
        # The rules first, the window's counters right after: a burst's start must not wait for a
        # counter read (a round trip to a remote host's agent). Under the server's round hook nothing
        # of the burst's round has left yet when the counters are read; a timed burst's window
        # misses the packets of those few milliseconds.
        self._active[i] = b
        rates = self._apply_rates(self._targets_of(b))
        before = self._counters()
        self._window_start[i] = before
        self._emit({"event": "apply", "t": time.time(), "burst": i, "kind": b.kind,
                    "iteration": self._iteration, "loss": b.loss, "rates": rates,
                    "counters": before})

    def _end(self, i: int, reason: str) -> None:
        b = self._active.pop(i)
        self._done.add(i)
        rates = self._apply_rates(self._targets_of(b))
        after = self._counters()
        before = self._window_start.pop(i, {})
        window = {}
        for label, c in after.items():
            c0 = before.get(label, {})
            seen = c["seen_packets"] - c0.get("seen_packets", 0)
            dropped = c["dropped_packets"] - c0.get("dropped_packets", 0)
            window[label] = {"seen": seen, "dropped": dropped,
                             "fraction": dropped / seen if seen else None}
        self._emit({"event": "remove", "t": time.time(), "burst": i, "kind": b.kind,
                    "iteration": self._iteration, "reason": reason, "rates": rates,
                    "counters": after, "window": window})

    def _congest(self, i: int) -> None:
        b = self.schedule[i]
        assert isinstance(b, CongestionBurst)
        self._done.add(i)
        bottleneck = b.bottleneck or self.net.switch_port(b.dst)
        q0 = self.net.qdisc_stats()
        nbytes = int(b.rate_mbps * 1e6 / 8 * b.duration_s)
        # -n (bytes) rather than -t: iperf3 takes whole seconds only, bursts are shorter
        proc = self.net.popen(b.src, ["iperf3", "-c", self.net.ip(b.dst), "-u", "-p", str(b.port),
                                      "-b", f"{b.rate_mbps}M", "-l", str(b.length),
                                      "-n", str(nbytes), "-J"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t = time.time()
        self._clients[i] = proc
        self._emit({"event": "congestion_start", "t": t, "burst": i, "iteration": self._iteration,
                    **burst_to_dict(b), "bottleneck": bottleneck,
                    "qdisc": {bottleneck: _strip(q0.get(bottleneck, {}))}})
        w = threading.Thread(target=self._congest_wait, args=(i, bottleneck, q0, proc),
                             name=f"congestion-{i}", daemon=True)
        self._waiters.append(w)
        w.start()

    def _congest_wait(self, i: int, bottleneck: str, q0: dict, proc: subprocess.Popen) -> None:
        b = self.schedule[i]
        try:
            out, err = proc.communicate(timeout=b.duration_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        q1 = self.net.qdisc_stats()
        delta = {}
        for name, s in q1.items():
            s0 = q0.get(name, {})
            d = {k: s.get(k, 0) - s0.get(k, 0) for k in ("sent_packets", "sent_bytes",
                                                           "dropped", "overlimits")}
            if any(d.values()):
                delta[name] = d
        summary: dict = {"rc": proc.returncode}
        try:
            j = json.loads(out)
            s = j.get("end", {}).get("sum", {})
            summary.update({k: s.get(k) for k in ("seconds", "bytes", "bits_per_second",
                                                  "packets", "lost_packets", "lost_percent")})
            if j.get("error"):
                summary["error"] = j["error"]
        except (json.JSONDecodeError, TypeError):
            summary["stderr"] = (err or "")[-500:]
        self._emit({"event": "congestion_end", "t": time.time(), "burst": i,
                    "iteration": self._iteration, "bottleneck": bottleneck,
                    "bottleneck_dropped": delta.get(bottleneck, {}).get("dropped", 0),
                    "qdisc_delta": delta, "iperf3": summary})

    def _timer_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._timers:
                    return
                t, _, action, i = self._timers[0]
            wait = t - time.time()
            if wait > 0:
                if self._stop.wait(min(wait, 0.5)):
                    return
                continue
            with self._lock:
                heapq.heappop(self._timers)
                if action == "on" and i not in self._done:
                    self._begin(i)
                elif action == "off" and i in self._active:
                    self._end(i, reason="timer")
                elif action == "congest":
                    self._congest(i)

    def _counters(self) -> dict:
        try:
            return self.loss.counters()
        except Exception as exc:  # noqa: BLE001 - never let logging break a run
            return {"error": str(exc)}

    def _emit(self, ev: dict) -> None:
        with self._lock:
            self.events.append(ev)
            if self._fh:
                self._fh.write(json.dumps(ev) + "\n")
                self._fh.flush()

    # ------------------------------------------------------------ queries
    def applied(self) -> list[dict]:
        """The apply/remove/congestion events so far (what was really done, when)."""
        return [e for e in self.events if e["event"] not in ("start", "stop")]


def _strip(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k != "qdiscs"}


def read_burst_log(path: str | Path) -> list[dict]:
    """Read a burst JSONL log back."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
