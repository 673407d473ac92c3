"""Replay a loss trace (``traces/FORMAT.md``) on emulated links during a run.

    from emulation.replay import TraceReplayer
    targets = [LossTarget("srv", "ingress"), LossTarget("srv", "egress")]
    with TraceReplayer(lc, "traces/samples/onoff-lognormal.loss.csv", targets,
                       log_path=run / "replay.jsonl", loop=True) as rp:
        ...                                   # the run; the trace plays meanwhile
    rp.summary()    # requested vs achieved mean loss, nft counters, timing lag
    rp.write_achieved(run / "achieved.loss.csv")   # what was applied, as a trace file

Two forms, two mechanisms (both kernel-side, both per target link end):

* **Segments** (time-varying loss): a thread sleeps until each change point
  and swaps the target chains' ``numgen random`` drop rule, all targets in one
  nft transaction. The swap runs through libnftables loaded into this process
  (``ctypes``), on the replayer's own thread, which enters the host's network
  namespace for the call (``setns`` changes the calling thread's namespace
  only) and returns at once. A swap then costs ~0.05 ms instead of the
  ~15-30 ms of starting ``nft`` in the host (measured here, 2 loaded cores), so
  the default step is 1 ms. Where libnftables cannot be loaded the replayer
  falls back to the ``nft`` command (``backend="nft"``) and a 20 ms step.
  Segments shorter than the step are averaged by ``SegmentTrace.resample``,
  which keeps the mean loss exactly. Drop probabilities have a resolution
  of 1e-6 (``numgen random mod 1000000``). A thread wakes up late on a busy
  machine; with ``keep_mean`` (default) each switch is aimed so that the
  achieved integral of the loss meets the trace's (levels stay exact, switch
  times move by at most half the next segment), and when the next change is
  already due the thread applies that one and skips the missed state.
  Every change applied is logged with its due and actual ``time.time()``;
  the achieved schedule is also available as a trace
  (:meth:`TraceReplayer.achieved_trace`). Optional ``rate_bps``/``queue_pkts``
  columns reshape the TBF that queues the target's direction (``tc``, a
  subprocess: tens of ms per change).
* **Packets** (exact per-packet verdicts): no thread and no userspace
  verdict at all. nft's ``numgen inc`` numbers the packets that reach the
  target's rule (0, 1, 2, ...) and a set holds the indices the trace drops
  (runs of drops as intervals): ``numgen inc mod M @drops drop``. The k-th
  matching packet gets verdict k, at line rate. ``M`` is the trace length for
  a looping trace, 2**32-1 otherwise (past the end everything is delivered).
  Each target (link end, direction) numbers its own packets from 0.

Why not NFQUEUE for the exact mode: this kernel has no ``nft_queue``
expression (CONFIG_NFT_QUEUE unset: ``queue num N`` fails with "No such file or
directory"), NFQUEUE is only reachable through the xtables target, and no
``iptables`` binary is installed; ``netfilterqueue`` on PyPI is an sdist that
needs ``libnetfilter_queue`` headers. A userspace verdict loop in Python on
two busy cores would also cap the packet rate far below the link's. The
``numgen inc`` set lookup gives the same exact verdicts inside the kernel.

Where the rules live: a netdev table ``dblp_loss_replay<N>`` per replayer in
each target host's namespace, one base chain per target on the interface's
ingress/egress hook (the same hooks and matches as ``emulation.loss``, so the
TCP control channel stays untouched with ``proto="udp"``), with named
counters ``seen_<chain>`` / ``drop_<chain>``. It is separate from the
``LossController``'s table, so a burst injector and a replayer can act on the
same link (their drops compound). ``stop()`` deletes the table; a host's
namespace and everything in it disappear with the net anyway, and
``python -m emulation.cleanup`` removes ``dblp_loss*`` tables left in the root
namespace.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence

import numpy as np

from traces import Change, PacketTrace, SegmentTrace, TraceMeta, read_trace, write_trace

from . import nft
from .replayloss import datagram_loss, datagram_loss_by_round, plot_loss  # noqa: F401  (re-exported)
from .nft import CliNftBackend, LibNftBackend, NftBackend, have_libnftables, make_backend  # noqa: F401  (re-exported)
from .loss import Hook, LossController, LossTarget, hook_cmd, hook_of, table_counters
from .shaping import FRAME_BYTES, Shape, default_burst

__all__ = ["TraceReplayer", "NftBackend", "LibNftBackend", "CliNftBackend", "have_libnftables",
           "datagram_loss", "window_mean", "TABLE_PREFIX"]

TABLE_PREFIX = "dblp_loss_replay"
#: ``numgen random`` modulus: drop probabilities in steps of 1e-6
RANDOM_MOD = nft.FINE_MOD
#: default smallest step between two rule swaps, by backend (microseconds)
DEFAULT_STEP_US = {"libnftables": 1_000, "nft": 20_000}
_table_seq = itertools.count(1)


# ----------------------------------------------------------------------------- helpers
def _integral(trace: SegmentTrace, t_us: np.ndarray) -> np.ndarray:
    """Integral of the trace's loss from 0 to each ``t_us`` (loops when the trace loops)."""
    t = np.asarray(t_us, dtype=np.float64)
    seg = np.concatenate(([0.0], np.cumsum(trace.loss * trace.durations_us)))
    total = seg[-1]
    D = float(trace.duration_us)
    if trace.loop:
        k = np.floor(t / D)
        r = t - k * D
    else:
        k = np.zeros_like(t)
        r = np.clip(t, 0.0, D)
    i = np.clip(np.searchsorted(trace.start_us, r, side="right") - 1, 0, len(trace) - 1)
    return k * total + seg[i] + trace.loss[i] * (r - trace.start_us[i])


def window_mean(trace: SegmentTrace, a_us: float, b_us: float) -> float:
    """Time-weighted mean loss of ``trace`` over [a_us, b_us] (trace time; loops; 0 past a non-looping end)."""
    if b_us <= a_us:
        return float("nan")
    lo, hi = _integral(trace, np.array([max(a_us, 0.0), max(b_us, 0.0)]))
    return float((hi - lo) / (b_us - a_us))


def _step_mean(t: Sequence[float], v: Sequence[float], a: float, b: float) -> float:
    """Mean over [a, b] of the step function that takes v[i] from t[i] on (0 before t[0])."""
    if b <= a or not len(t):
        return float("nan")
    tt = np.asarray(t, dtype=np.float64)
    vv = np.asarray(v, dtype=np.float64)
    edges = np.clip(np.append(tt, b), a, b)
    return float(np.sum(vv * np.diff(edges)) / (b - a))


def _pct(x: list[float], q: float) -> float:
    return float(np.percentile(x, q)) if x else float("nan")


class TraceReplayer:
    """Apply a loss trace to link ends of an ``EmuNet`` during a run.

    lc: the run's ``LossController`` (gives the net; the replayer keeps its own
    table, see the module doc). trace: a ``SegmentTrace``/``PacketTrace`` or a
    trace file path. targets: ``LossTarget`` s (host link end, direction,
    ``udp``/``all``, ports); every target gets the same trace.
    log_path: JSONL of what was applied (start, every change, stop with
    counters and summary); None keeps it in memory (``events``).
    time_scale: wall seconds per trace second (2.0 plays twice as slowly).
    min_step_us: smallest wall-clock interval between rule swaps (default
    1 ms with libnftables, 20 ms with the nft command); shorter segments are
    averaged (mean loss kept). loop: override the trace's ``loop`` flag.
    duration_s: stop applying after this long (a looping trace otherwise plays
    until ``stop()``). backend: ``auto`` | ``libnftables`` | ``nft``.
    shape: apply the trace's ``rate_bps``/``queue_pkts`` columns with tc.
    keep_mean: aim each switch so the achieved mean loss tracks the trace's
    despite wake-up lag (see ``_play``); False switches at the due times.
    """

    def __init__(self, lc: LossController, trace: SegmentTrace | PacketTrace | str | os.PathLike,
                 targets: Sequence[LossTarget], log_path: str | os.PathLike | None = None, *,
                 time_scale: float = 1.0, min_step_us: int | None = None, loop: bool | None = None,
                 duration_s: float | None = None, backend: str = "auto", shape: bool = True,
                 keep_mean: bool = True) -> None:
        self.lc = lc
        self.net = lc.net
        self.trace_path: str | None = None
        if isinstance(trace, (str, os.PathLike)):
            self.trace_path = str(trace)
            trace = read_trace(trace)
        if not isinstance(trace, (SegmentTrace, PacketTrace)):
            raise TypeError(f"not a trace: {type(trace).__name__}")
        if loop is not None and loop != trace.loop:
            trace = type(trace)(**{**_fields(trace), "meta": trace.meta.with_(loop=bool(loop))})
        self.trace = trace
        self.targets = tuple(targets)
        if not self.targets:
            raise ValueError("no targets to replay on")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError("a target is given twice")
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.time_scale = float(time_scale)
        self.duration_s = duration_s
        self.shape = shape
        self.keep_mean = keep_mean
        self.mode = "segments" if isinstance(trace, SegmentTrace) else "packets"
        self.backend: NftBackend = make_backend(backend) if self.mode == "segments" else CliNftBackend()
        step = DEFAULT_STEP_US[self.backend.name] if min_step_us is None else int(min_step_us)
        if step <= 0:
            raise ValueError("min_step_us must be positive")
        self.min_step_us = step
        self.played: SegmentTrace | None = None  # the (resampled) trace the thread follows
        self.bin_us: int | None = None
        if self.mode == "segments":
            self.played, self.bin_us = self._playable(trace)
        self.table = f"{TABLE_PREFIX}{os.getpid() % 100000}_{next(_table_seq)}"
        self.events: list[dict] = []
        self.achieved: list[tuple[float, float, float | None, int | None]] = []  # (t, loss, rate, queue)
        self.lags_ms: list[float] = []
        self.skipped = 0
        self.t0: float | None = None
        self.t_end: float | None = None
        self._log_path = Path(log_path) if log_path else None
        self._fh: IO[str] | None = None
        self._flushed = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.done = threading.Event()  # set when a non-looping trace has played out
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._installed = False
        self._counters_start: dict = {}
        self._counters_end: dict | None = None
        self._base_shapes: dict[str, Shape | None] = {}
        self._shape_now: dict[str, tuple] = {}
        self._stopped = False

    # ------------------------------------------------------------ set-up
    def _playable(self, tr: SegmentTrace) -> tuple[SegmentTrace, int | None]:
        """The trace resampled so no segment is shorter than the step (in wall time)."""
        bin_us = max(1, math.ceil(self.min_step_us / self.time_scale))
        shortest = int(tr.durations_us.min())
        if shortest >= bin_us:
            return tr.merged(), None
        return tr.resample(bin_us), bin_us

    def _where(self, t: LossTarget) -> Hook:
        """The hook of ``t``: the host's own, or on segmented links (the controller's
        ``segmented``, set before the replay starts) the switch end's."""
        return hook_of(self.net, t, getattr(self.lc, "segmented", False))

    def _host_pid(self, site: Hook) -> int:
        # a Mininet switch port lives in the root namespace, this process's
        return os.getpid() if site.switch_end else self.net.pid(site.host)

    def _chain(self, t: LossTarget) -> str:
        w = self._where(t)
        return nft.chain_name(w.hook, w.dev, t.proto, t.dports)

    def _by_host(self) -> dict[Hook, list[LossTarget]]:
        """The targets by namespace (a host's, or the switches' shared one), keyed by a hook there."""
        out: dict[Hook, list[LossTarget]] = {}
        sites: dict[tuple[str, bool], Hook] = {}
        for t in self.targets:
            w = self._where(t)
            out.setdefault(sites.setdefault(("" if w.switch_end else w.host, w.switch_end), w), []).append(t)
        return out

    def _setup_script(self, targets: list[LossTarget]) -> str:
        lines: list[str] = []
        for t in targets:
            c, w = self._chain(t), self._where(t)
            lines += nft.chain_lines(self.table, c, w.hook, w.dev)
            if self.mode == "packets":
                lines += self._packet_rules(t, c)
            else:
                lines += self._segment_rules(t, c, 0.0)
        return nft.script(lines)

    def _segment_rules(self, t: LossTarget, c: str, loss: float) -> list[str]:
        return nft.drop_lines(self.table, c, t.match(), loss, mod=RANDOM_MOD)

    def _packet_rules(self, t: LossTarget, c: str) -> list[str]:
        assert isinstance(self.trace, PacketTrace)
        return nft.trace_drop_lines(self.table, c, t.match(), self.trace.drops, self.trace.loop)

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "TraceReplayer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "TraceReplayer":
        """Install the rules and start the clock (segments: the replay thread). Returns self."""
        if self.t0 is not None:
            raise RuntimeError("a replayer starts once")
        if self._log_path:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self._log_path, "a", encoding="utf-8")
        if self.mode == "packets":
            for host, ts in self._by_host().items():
                self.backend.run(self._host_pid(host), self._setup_script(ts))
            self._installed = True
            self._counters_start = self.counters()
            self.t0 = time.time()
            self._emit_start()
            return self
        if self.shape and self._has_shape_columns():
            self._base_shapes = {self._shape_intf(t): self._base_shape(self._shape_intf(t))
                                 for t in self.targets}
        self._thread = threading.Thread(target=self._run, name="trace-replay", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join(timeout=5)
            self._close_log()
            raise RuntimeError(f"trace replay failed to start: {self._error}") from self._error
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a non-looping trace has played out (or ``duration_s`` passed). True if so."""
        if self.mode == "packets":
            return True
        return self.done.wait(timeout)

    def stop(self) -> None:
        """Stop applying, read the counters, delete the rules, restore shapes. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.t_end is None:
            self.t_end = time.time()
        if self._installed:
            # the thread normally deleted the table itself; if it could not, do it here
            try:
                self._counters_end = self._counters_end or self.counters()
            except Exception as exc:  # noqa: BLE001 - the host may be gone (teardown first)
                self._counters_end = {"error": str(exc)}
            for site in self._by_host():
                try:
                    hook_cmd(self.net, site, nft.delete_table_args(self.table), check=False, timeout=5)
                except Exception:  # noqa: BLE001 - host may be gone already
                    pass
            self._installed = False
        if self._base_shapes:
            self._restore_shapes()
        self._emit({"event": "stop", "t": self.t_end, "counters": self._counters_end or {},
                    "summary": self.summary()})
        self._close_log()

    def _close_log(self) -> None:
        with self._lock:
            if self._fh:
                self._fh.close()
                self._fh = None

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self.backend.open_thread()
            for host, ts in self._by_host().items():
                self.backend.run(self._host_pid(host), self._setup_script(ts))
            self._installed = True
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._safe_close_backend()
            self._ready.set()
            return
        try:
            self._counters_start = self.counters()
            self.t0 = time.time()
            self._emit_start()
            self._ready.set()
            self._play()
        except BaseException as exc:  # noqa: BLE001 - logged; stop() still cleans up
            self._error = exc
            self._emit({"event": "error", "t": time.time(), "error": repr(exc)})
        finally:
            self.t_end = time.time()
            self._ready.set()
            if self._installed:
                try:
                    self._counters_end = self.counters()
                    for host in self._by_host():
                        self.backend.run(self._host_pid(host), nft.script(nft.delete_table_lines(self.table)))
                    self._installed = False
                except Exception:  # noqa: BLE001 - stop() retries with the nft command
                    pass
            self._safe_close_backend()
            self.done.set()

    def _safe_close_backend(self) -> None:
        try:
            self.backend.close()
        except Exception:  # noqa: BLE001
            pass

    def _schedule(self) -> Iterator[Change]:
        tr = self.played
        assert tr is not None
        if self.duration_s is None:
            yield from tr.changes(2**62 if tr.loop else None)
            return
        until = int(self.duration_s * 1e6 / self.time_scale)
        last = None
        for last in tr.changes(until):
            yield last
        if last is None or last.loss != 0.0 or last.rate_bps is not None or last.queue_pkts is not None:
            yield Change(until, 0.0)

    def _requested_integral(self, wall: float) -> float:
        """Loss x seconds the trace asks for from the start to wall-clock time ``wall``."""
        assert self.t0 is not None and self.played is not None
        x = max(0.0, (wall - self.t0) * 1e6 / self.time_scale)
        if self.duration_s is not None:
            x = min(x, self.duration_s * 1e6 / self.time_scale)
        return float(_integral(self.played, np.array([x]))[0]) * self.time_scale * 1e-6

    def _play(self) -> None:
        """Follow the schedule; with ``keep_mean``, move each switch to pay back lag.

        A Python thread on a busy machine wakes up late (here ~1-2 ms at the
        median with the load at 3x the cores), and a late switch lengthens one
        level and shortens the next. With ``keep_mean`` each switch from level
        a to level b is aimed at the instant where the achieved integral of the
        loss meets the trace's (``due + debt / (a - b)``), moved by at most half
        the next segment, so the levels stay exactly the trace's and the error
        of the mean stays within about one wake-up, instead of piling up.
        """
        t0, scale = self.t0, self.time_scale
        assert t0 is not None
        due_of: Callable[[Change], float] = lambda ch: t0 + ch.t_us * 1e-6 * scale
        it = self._schedule()
        cur = next(it, None)
        cur_loss, t_last, ach = 0.0, t0, 0.0
        while cur is not None and not self._stop.is_set():
            nxt = next(it, None)
            due = due_of(cur)
            new = nft.applied_rate(cur.loss, RANDOM_MOD)
            target = due
            if self.keep_mean and new != cur_loss:
                debt = self._requested_integral(due) - (ach + cur_loss * (due - t_last))
                shift = debt / (cur_loss - new)
                hi = (due_of(nxt) - due) / 2 if nxt is not None else self.min_step_us * 1e-6
                target = due + min(max(shift, t_last - due), hi)
            wait = target - time.time()
            if wait > 0 and self._stop.wait(wait):
                return
            if nxt is not None and due_of(nxt) <= time.time():
                self.skipped += 1  # late: the next state is already due, apply that one
                cur = nxt
                continue
            t = self._apply(cur, due, target)
            ach += cur_loss * (t - t_last)
            cur_loss, t_last = new, t
            cur = nxt

    def _apply(self, ch: Change, due: float, target: float) -> float:
        loss = nft.applied_rate(ch.loss, RANDOM_MOD)
        for host, ts in self._by_host().items():
            lines: list[str] = []
            for t in ts:
                lines += self._segment_rules(t, self._chain(t), loss)
            self.backend.run(self._host_pid(host), nft.script(lines))
        t = time.time()
        if self._base_shapes:
            self._apply_shapes(ch)
        lag = (t - due) * 1e3
        self.lags_ms.append((t - target) * 1e3)
        with self._lock:
            self.achieved.append((t, loss, ch.rate_bps, ch.queue_pkts))
        ev = {"event": "change", "t": t, "t_due": due, "lag_ms": round(lag, 4), "trace_us": ch.t_us,
              "loss": loss}
        if target != due:
            ev["t_aim"] = target
        if ch.rate_bps is not None or ch.queue_pkts is not None:
            ev.update(rate_bps=ch.rate_bps, queue_pkts=ch.queue_pkts)
        self._emit(ev, flush=False)
        return t

    # ------------------------------------------------------------ rate / queue columns
    def _has_shape_columns(self) -> bool:
        tr = self.trace
        return isinstance(tr, SegmentTrace) and (tr.rate_bps is not None or tr.queue_pkts is not None)

    def _shape_intf(self, t: LossTarget) -> str:
        """The interface whose egress TBF queues the target's direction."""
        return self.net.host_intf(t.host) if t.direction == "egress" else self.net.switch_port(t.host)

    def _base_shape(self, intf: str) -> Shape | None:
        d = self.net.shapes().get(intf)
        return Shape(**d) if d else None

    def _apply_shapes(self, ch: Change) -> None:
        for intf, base in self._base_shapes.items():
            key = (ch.rate_bps, ch.queue_pkts)
            if self._shape_now.get(intf, (None, None)) == key:
                continue
            bw = ch.rate_bps / 1e6 if ch.rate_bps else (base.bw_mbps if base else None)
            if bw is None:
                continue  # an unshaped link and no rate given: nothing to shape
            buf = int(ch.queue_pkts) * FRAME_BYTES if ch.queue_pkts else (
                base.buffer_bytes if base else 100 * FRAME_BYTES)
            self.net.reshape(intf, Shape(bw_mbps=bw, buffer_bytes=buf, burst_bytes=default_burst(bw),
                                         delay=base.delay if base else None))
            self._shape_now[intf] = key

    def _restore_shapes(self) -> None:
        for intf, base in self._base_shapes.items():
            if intf in self._shape_now and base is not None:
                try:
                    self.net.reshape(intf, base)
                except Exception:  # noqa: BLE001 - the net may be gone
                    pass
        self._shape_now.clear()

    # ------------------------------------------------------------ log
    def _emit_start(self) -> None:
        tr = self.trace
        info: dict[str, Any] = {
            "event": "start", "t": self.t0, "mode": self.mode, "table": self.table,
            "backend": self.backend.name, "trace": self.trace_path, "source": tr.meta.source,
            "provenance": tr.meta.provenance, "loop": tr.loop, "mean_loss": tr.mean_loss(),
            "targets": [t.label() for t in self.targets], "counters": self._counters_start,
        }
        if isinstance(tr, SegmentTrace):
            assert self.played is not None
            info.update(duration_us=tr.duration_us, segments=len(tr), time_scale=self.time_scale,
                        min_step_us=self.min_step_us, resample_bin_us=self.bin_us,
                        played_segments=len(self.played), played_mean_loss=self.played.mean_loss(),
                        duration_s=self.duration_s)
        else:
            info.update(packets=len(tr), drops=int(tr.drops.sum()))
        self._emit(info)

    def _emit(self, ev: dict, flush: bool = True) -> None:
        with self._lock:
            self.events.append(ev)
            if self._fh:
                self._fh.write(json.dumps(ev) + "\n")
                now = time.monotonic()
                if flush or now - self._flushed > 0.5:  # changes: at most twice a second
                    self._fh.flush()
                    self._flushed = now

    # ------------------------------------------------------------ results
    def counters(self) -> dict[str, dict]:
        """Per target label: packets seen / dropped by this replayer's rules so far."""
        out: dict[str, dict] = {}
        for site, ts in self._by_host().items():
            raw = table_counters(self.net, site, self.table)
            for t in ts:
                cc = nft.chain_counters(raw, self._chain(t))
                seen, dropped = cc["seen_packets"], cc["dropped_packets"]
                out[t.label()] = {"seen_packets": seen, "dropped_packets": dropped,
                                  "fraction": dropped / seen if seen else None}
        return out

    def _trace_time_us(self, wall: float) -> float:
        assert self.t0 is not None
        return (wall - self.t0) * 1e6 / self.time_scale

    def requested_mean(self, t_from: float | None = None, t_to: float | None = None) -> float:
        """The trace's mean loss over a wall-clock window (default: the whole replay)."""
        if self.t0 is None:
            return float("nan")
        a = self.t0 if t_from is None else t_from
        b = (self.t_end or time.time()) if t_to is None else t_to
        if isinstance(self.trace, PacketTrace):
            return self.trace.mean_loss()
        a_us, b_us = self._trace_time_us(a), self._trace_time_us(b)
        if self.duration_s is not None:  # the replay ends there; 0 afterwards
            lim = self.duration_s * 1e6 / self.time_scale
            inside = max(0.0, min(b_us, lim) - a_us)
            if b_us <= a_us:
                return float("nan")
            return window_mean(self.trace, a_us, a_us + inside) * inside / (b_us - a_us) if inside else 0.0
        return window_mean(self.trace, a_us, b_us)

    def achieved_mean(self, t_from: float | None = None, t_to: float | None = None) -> float:
        """Mean of the loss actually installed over a wall-clock window (default: the replay)."""
        if self.t0 is None or not self.achieved:
            return float("nan")
        a = self.t0 if t_from is None else t_from
        b = (self.t_end or time.time()) if t_to is None else t_to
        with self._lock:
            pts = list(self.achieved)
        return _step_mean([p[0] for p in pts], [p[1] for p in pts], a, b)

    def achieved_trace(self) -> SegmentTrace:
        """The achieved schedule as a trace (wall-clock us since start; same format as the input)."""
        if self.mode != "segments":
            raise ValueError("packet traces are applied per packet in the kernel: there is no schedule")
        if self.t0 is None or not self.achieved:
            raise RuntimeError("nothing applied yet")
        with self._lock:
            pts = list(self.achieved)
        end = self.t_end or time.time()
        t = np.array([(p[0] - self.t0) * 1e6 for p in pts])
        loss = np.array([p[1] for p in pts])
        dur = max(int(math.ceil((end - self.t0) * 1e6)), int(np.rint(t.max())) + 1)
        rate = queue = None
        if self._has_shape_columns():
            rate = np.array([np.nan if p[2] is None else p[2] for p in pts])
            queue = np.array([np.nan if p[3] is None else p[3] for p in pts])
        src = self.trace_path or self.trace.meta.source
        meta = TraceMeta(
            provenance="generated", source=f"emulation.replay: achieved schedule of {src}",
            description=(f"loss installed by the trace replayer on {', '.join(t.label() for t in self.targets)}; "
                         f"times are wall-clock microseconds since the replay started "
                         f"(time_scale {self.time_scale:g}); the input's provenance is "
                         f"{self.trace.meta.provenance}"),
            generator={"name": "emulation.replay", "params": {
                "trace": src, "time_scale": self.time_scale, "min_step_us": self.min_step_us,
                "resample_bin_us": self.bin_us, "backend": self.backend.name, "loop": self.trace.loop}},
            link=", ".join(t.label() for t in self.targets),
            extra={"t0_unix": self.t0, "skipped_changes": self.skipped,
                   "input_mean_loss": self.trace.mean_loss()},
        )
        return SegmentTrace.from_schedule(t, loss, dur, rate_bps=rate, queue_pkts=queue, meta=meta)

    def write_achieved(self, path: str | os.PathLike) -> Path:
        """Write :meth:`achieved_trace` as a trace file."""
        return write_trace(self.achieved_trace(), path)

    def summary(self, t_from: float | None = None, t_to: float | None = None) -> dict:
        """Requested vs achieved mean loss (window default: the whole replay), counters, timing."""
        cnt = self._counters_end if self._counters_end and "error" not in self._counters_end else None
        if cnt is None and self._installed:
            try:
                cnt = self.counters()
            except Exception:  # noqa: BLE001
                cnt = None
        kernel = None
        if cnt:
            base = self._counters_start or {}
            kernel = {}
            for label, c in cnt.items():
                c0 = base.get(label, {})
                seen = c["seen_packets"] - c0.get("seen_packets", 0)
                dropped = c["dropped_packets"] - c0.get("dropped_packets", 0)
                kernel[label] = {"seen": seen, "dropped": dropped, "fraction": dropped / seen if seen else None}
        out: dict[str, Any] = {
            "mode": self.mode, "backend": self.backend.name, "trace_mean_loss": self.trace.mean_loss(),
            "requested_mean_loss": self.requested_mean(t_from, t_to), "kernel": kernel,
            "t0": self.t0, "t_end": self.t_end,
        }
        if self.mode == "segments":
            lags = [x for x in self.lags_ms if np.isfinite(x)]
            out.update(achieved_mean_loss=self.achieved_mean(t_from, t_to), changes=len(self.achieved),
                       skipped=self.skipped, resample_bin_us=self.bin_us, time_scale=self.time_scale,
                       wake_lag_ms={"p50": _pct(lags, 50), "p99": _pct(lags, 99), "max": max(lags, default=float("nan"))})
        if self._error is not None:
            out["error"] = repr(self._error)
        return out


def _fields(tr: SegmentTrace | PacketTrace) -> dict:
    if isinstance(tr, SegmentTrace):
        return {"start_us": tr.start_us, "loss": tr.loss, "duration_us": tr.duration_us,
                "rate_bps": tr.rate_bps, "queue_pkts": tr.queue_pkts}
    return {"drops": tr.drops}
