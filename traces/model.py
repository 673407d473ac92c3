"""In-memory loss traces: time segments and per-packet drop sequences.

Two forms, because the two replay paths need different things:

* :class:`SegmentTrace` - piecewise-constant loss over time (microseconds).
  The emulator turns it into kernel drop rules replaced on the trace's
  schedule (:meth:`SegmentTrace.changes`); the simulator asks for the loss in
  force when each packet crosses the link (:meth:`SegmentTrace.sample_drops`).
* :class:`PacketTrace` - an exact drop/deliver decision for the n-th packet,
  as packet-level traces (and captures) give it. Replayed per packet (an
  NFQUEUE verdict in the emulator, the n-th modelled packet in the simulator).

All queries take numpy arrays and answer without per-packet Python loops.
Times are microseconds relative to the start of the replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, overload

import numpy as np

from .errors import TraceError
from .meta import TraceMeta, check_meta_fields


SEGMENT_DTYPE = np.dtype(
    [("start_us", "<i8"), ("end_us", "<i8"), ("loss", "<f8"), ("rate_bps", "<f8"), ("queue_pkts", "<f8")]
)


@dataclass(frozen=True)
class Change:
    """The link state from ``t_us`` on, until the next change.

    ``rate_bps`` / ``queue_pkts`` are None where the trace leaves the link's
    configured value in force.
    """

    t_us: int
    loss: float
    rate_bps: float | None = None
    queue_pkts: int | None = None


class DropProcess(Protocol):
    """What the simulator calls: drop decisions for packets in arrival order."""

    def drops(self, times_us: np.ndarray) -> np.ndarray:
        """Bool array, True = drop, for packets crossing at ``times_us`` (non-decreasing)."""
        ...


def _code_meta(form: str) -> TraceMeta:
    """Metadata of a trace built in code without any: it claims nothing it cannot know.

    "generated" rather than "measured", so that such a trace written to a
    file can never pass for a measurement.
    """
    return TraceMeta(
        form=form,
        provenance="generated",
        source="constructed in code",
        generator={"name": "manual", "params": {}},
    )


def _as_f64(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(a, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class SegmentTrace:
    """Piecewise-constant loss: segment i holds from ``start_us[i]`` to the next start.

    ``start_us`` is int64, starts at 0 and strictly increases; ``loss`` is in
    [0, 1]; the last segment ends at ``duration_us``. ``rate_bps`` and
    ``queue_pkts`` are optional float arrays where NaN means "the link's
    configured value". Past ``duration_us`` the trace repeats when
    ``meta.loop`` is true, otherwise the loss is 0 (the replay is over).
    """

    start_us: np.ndarray
    loss: np.ndarray
    duration_us: int
    rate_bps: np.ndarray | None = None
    queue_pkts: np.ndarray | None = None
    meta: TraceMeta = field(default_factory=lambda: _code_meta("segments"))

    def __post_init__(self) -> None:
        start = np.ascontiguousarray(self.start_us, dtype=np.int64)
        loss = np.ascontiguousarray(self.loss, dtype=np.float64)
        object.__setattr__(self, "start_us", start)
        object.__setattr__(self, "loss", loss)
        object.__setattr__(self, "rate_bps", _as_f64(self.rate_bps))
        object.__setattr__(self, "queue_pkts", _as_f64(self.queue_pkts))
        object.__setattr__(self, "duration_us", int(self.duration_us))
        n = start.size
        if n == 0:
            raise TraceError("a segment trace needs at least one segment")
        if loss.shape != start.shape or start.ndim != 1:
            raise TraceError("start_us and loss must be 1-D arrays of equal length")
        for name in ("rate_bps", "queue_pkts"):
            a = getattr(self, name)
            if a is not None and a.shape != start.shape:
                raise TraceError(f"{name} must have one value per segment")
        if start[0] != 0:
            raise TraceError(f"the first segment must start at 0 us, not {start[0]}")
        bad = np.flatnonzero(np.diff(start) <= 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise TraceError(f"segment {i} starts at {start[i]} us, not after {start[i - 1]} us")
        if self.duration_us <= start[-1]:
            raise TraceError(f"duration_us={self.duration_us} must exceed the last start {start[-1]}")
        bad = np.flatnonzero(~((loss >= 0) & (loss <= 1)))
        if bad.size:
            raise TraceError(f"segment {bad[0]}: loss {loss[bad[0]]} outside [0, 1]")
        if self.rate_bps is not None and np.any(self.rate_bps[~np.isnan(self.rate_bps)] <= 0):
            raise TraceError("rate_bps must be positive (NaN = link default)")
        if self.queue_pkts is not None:
            q = self.queue_pkts[~np.isnan(self.queue_pkts)]
            if np.any(q < 1) or np.any(q != np.round(q)):
                raise TraceError("queue_pkts must be positive integers (NaN = link default)")
        if self.meta.form != "segments":
            object.__setattr__(self, "meta", self.meta.with_(form="segments"))
        check_meta_fields(self.meta)

    @classmethod
    def from_schedule(
        cls,
        t_us: np.ndarray,
        loss: np.ndarray,
        duration_us: int,
        *,
        rate_bps: np.ndarray | None = None,
        queue_pkts: np.ndarray | None = None,
        meta: TraceMeta | None = None,
    ) -> "SegmentTrace":
        """A trace from change times as they happened, e.g. a replayer's achieved schedule.

        Times are rounded to whole microseconds; when several changes fall on
        the same microsecond the last one wins; before the first change the
        loss is 0 (and link defaults hold). Record what a replayer actually
        applied this way and it can be compared with, plotted and replayed
        like the trace it was asked to apply.
        """
        t = np.rint(np.asarray(t_us, dtype=np.float64)).astype(np.int64)
        cols = [np.asarray(loss, dtype=np.float64)]
        cols += [np.asarray(c, dtype=np.float64) for c in (rate_bps, queue_pkts) if c is not None]
        if any(c.shape != t.shape for c in cols) or t.ndim != 1 or t.size == 0:
            raise TraceError("t_us, loss (and rate_bps/queue_pkts) must be equal-length non-empty 1-D arrays")
        order = np.argsort(t, kind="stable")
        t, cols = t[order], [c[order] for c in cols]
        last = np.append(t[1:] != t[:-1], True)  # last change at each distinct time
        t, cols = t[last], [c[last] for c in cols]
        if t[0] < 0:
            raise TraceError("schedule times must not be negative")
        if t[0] > 0:
            t = np.concatenate(([0], t))
            cols = [np.concatenate(([0.0 if i == 0 else np.nan], c)) for i, c in enumerate(cols)]
        keep = t < int(duration_us)
        cols = [c[keep] for c in cols]
        it = iter(cols[1:])
        rate = next(it) if rate_bps is not None else None
        queue = next(it) if queue_pkts is not None else None
        return cls(t[keep], cols[0], int(duration_us), rate, queue, meta or _code_meta("segments"))

    # -- shape -----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.start_us.size)

    @property
    def end_us(self) -> np.ndarray:
        """End of each segment (the next start, or ``duration_us``)."""
        return np.append(self.start_us[1:], self.duration_us)

    @property
    def durations_us(self) -> np.ndarray:
        return self.end_us - self.start_us

    @property
    def segments(self) -> np.ndarray:
        """All segments as one structured array (start_us, end_us, loss, rate_bps, queue_pkts).

        rate_bps / queue_pkts are NaN where the link's configured value holds
        (and everywhere when the trace has no such column).
        """
        out = np.empty(len(self), SEGMENT_DTYPE)
        out["start_us"] = self.start_us
        out["end_us"] = self.end_us
        out["loss"] = self.loss
        out["rate_bps"] = np.nan if self.rate_bps is None else self.rate_bps
        out["queue_pkts"] = np.nan if self.queue_pkts is None else self.queue_pkts
        return out

    @property
    def loop(self) -> bool:
        return self.meta.loop

    # -- queries ---------------------------------------------------------------
    def index_at(self, t_us: np.ndarray | float) -> np.ndarray:
        """Segment index in force at each time, -1 where the trace is not in force."""
        t = np.asarray(t_us, dtype=np.float64)
        if self.loop:
            t = np.mod(t, self.duration_us)
        idx = np.searchsorted(self.start_us, t, side="right") - 1
        return np.where((t < 0) | (t >= self.duration_us), -1, idx)

    @overload
    def loss_at(self, t_us: float) -> float: ...
    @overload
    def loss_at(self, t_us: np.ndarray) -> np.ndarray: ...
    def loss_at(self, t_us):  # type: ignore[no-untyped-def]
        """Loss probability in force at ``t_us`` (scalar or array); 0 outside the trace."""
        idx = self.index_at(t_us)
        out = np.where(idx >= 0, self.loss[np.maximum(idx, 0)], 0.0)
        return float(out) if np.ndim(t_us) == 0 else out

    def rate_at(self, t_us: np.ndarray | float) -> np.ndarray:
        """Rate (bit/s) in force; NaN = link default (also outside the trace)."""
        return self._opt_at(self.rate_bps, t_us)

    def queue_at(self, t_us: np.ndarray | float) -> np.ndarray:
        """Queue limit (packets) in force; NaN = link default."""
        return self._opt_at(self.queue_pkts, t_us)

    def _opt_at(self, a: np.ndarray | None, t_us: np.ndarray | float) -> np.ndarray:
        idx = self.index_at(t_us)
        if a is None:
            return np.full(np.shape(idx), np.nan)
        return np.where(idx >= 0, a[np.maximum(idx, 0)], np.nan)

    def mean_loss(self) -> float:
        """Time-weighted mean loss over one pass of the trace."""
        return float(np.dot(self.loss, self.durations_us) / self.duration_us)

    def sample_drops(self, times_us: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Independent drop decisions: packet k is dropped with ``loss_at(times_us[k])``."""
        p = self.loss_at(np.asarray(times_us, dtype=np.float64))
        return rng.random(np.shape(p)) < p

    def drop_process(self, rng: np.random.Generator) -> "SegmentDropProcess":
        return SegmentDropProcess(self, rng)

    # -- schedule for kernel-rule updaters --------------------------------------
    def merged(self) -> "SegmentTrace":
        """Same trace with consecutive identical segments joined."""
        cols = [self.loss] + [a for a in (self.rate_bps, self.queue_pkts) if a is not None]
        same = np.ones(len(self) - 1, dtype=bool)
        for c in cols:
            same &= (c[1:] == c[:-1]) | (np.isnan(c[1:]) & np.isnan(c[:-1]))
        keep = np.concatenate(([True], ~same))
        return self._take(keep)

    def _take(self, keep: np.ndarray) -> "SegmentTrace":
        return SegmentTrace(
            self.start_us[keep],
            self.loss[keep],
            self.duration_us,
            None if self.rate_bps is None else self.rate_bps[keep],
            None if self.queue_pkts is None else self.queue_pkts[keep],
            self.meta,
        )

    def changes(self, until_us: int | None = None) -> Iterator[Change]:
        """Yield the link state at each change point, in time order.

        Identical consecutive segments are merged (no redundant rule
        updates). Without ``loop`` the last item is the end of the trace at
        ``duration_us`` with loss 0 and link defaults: the updater removes its
        rules then. With ``loop`` the trace repeats until ``until_us``
        (required, to keep the iterator finite); a non-looping trace is also
        cut at ``until_us`` when given.
        """
        if self.loop and until_us is None:
            raise TraceError("a looping trace needs until_us to bound its schedule")
        m = self.merged()
        states = [
            Change(
                int(m.start_us[i]),
                float(m.loss[i]),
                None if m.rate_bps is None or np.isnan(m.rate_bps[i]) else float(m.rate_bps[i]),
                None if m.queue_pkts is None or np.isnan(m.queue_pkts[i]) else int(m.queue_pkts[i]),
            )
            for i in range(len(m))  # one item per change point, not per packet
        ]
        prev: tuple | None = None
        base = 0
        while True:
            for s in states:
                t = base + s.t_us
                if until_us is not None and t >= until_us:
                    return
                key = (s.loss, s.rate_bps, s.queue_pkts)
                if key == prev:  # only at a loop's wrap-around: nothing changes
                    continue
                prev = key
                yield Change(t, s.loss, s.rate_bps, s.queue_pkts)
            if not self.loop:
                end = self.duration_us
                if until_us is None or end < until_us:
                    yield Change(end, 0.0, None, None)
                return
            base += self.duration_us

    def resample(self, bin_us: int) -> "SegmentTrace":
        """Coarsen to ``bin_us`` bins holding each bin's time-averaged loss.

        For replayers that cannot switch as fast as the trace (a kernel rule
        update takes on the order of a millisecond): the mean loss is kept
        exactly, the microstructure inside a bin is averaged away. Rate and
        queue take the value in force at each bin's start.
        """
        bin_us = int(bin_us)
        if bin_us <= 0:
            raise TraceError("bin_us must be positive")
        edges = np.arange(0, self.duration_us, bin_us, dtype=np.int64)
        ends = np.minimum(edges + bin_us, self.duration_us)
        cum = np.concatenate(([0.0], np.cumsum(self.loss * self.durations_us)))

        def integral(t: np.ndarray) -> np.ndarray:
            i = np.searchsorted(self.start_us, t, side="right") - 1
            i = np.clip(i, 0, len(self) - 1)
            return cum[i] + self.loss[i] * (t - self.start_us[i])

        loss = (integral(ends) - integral(edges)) / (ends - edges)
        loss = np.clip(loss, 0.0, 1.0)
        idx = np.searchsorted(self.start_us, edges, side="right") - 1
        out = SegmentTrace(
            edges,
            loss,
            self.duration_us,
            None if self.rate_bps is None else self.rate_bps[idx],
            None if self.queue_pkts is None else self.queue_pkts[idx],
            self.meta,
        )
        return out.merged()

    def to_packets(
        self, packet_interval_us: float, rng: np.random.Generator, n_packets: int | None = None
    ) -> "PacketTrace":
        """Sample a per-packet trace for a constant-rate flow crossing this link."""
        if packet_interval_us <= 0:
            raise TraceError("packet_interval_us must be positive")
        if n_packets is None:
            n_packets = int(np.ceil(self.duration_us / packet_interval_us))
        t = np.arange(n_packets, dtype=np.float64) * packet_interval_us
        drops = self.sample_drops(t, rng)
        meta = self.meta.with_(form="packets", packet_interval_us=float(packet_interval_us))
        return PacketTrace(drops, meta)


@dataclass(frozen=True, eq=False)
class PacketTrace:
    """Exact per-packet decisions: ``drops[k]`` is True when the k-th packet is lost.

    Past the end, packets are delivered, or the sequence repeats when
    ``meta.loop`` is true. ``meta.packet_interval_us`` (optional) states the
    packet spacing the sequence was made for, for conversion to time.
    """

    drops: np.ndarray
    meta: TraceMeta = field(default_factory=lambda: _code_meta("packets"))

    def __post_init__(self) -> None:
        d = np.asarray(self.drops)
        if d.ndim != 1 or d.size == 0:
            raise TraceError("a packet trace needs a non-empty 1-D drop array")
        if d.dtype != np.bool_:
            if not np.all((d == 0) | (d == 1)):
                raise TraceError("drops must be 0/1 or booleans")
            d = d.astype(bool)
        object.__setattr__(self, "drops", np.ascontiguousarray(d))
        if self.meta.form != "packets":
            object.__setattr__(self, "meta", self.meta.with_(form="packets"))
        check_meta_fields(self.meta)

    def __len__(self) -> int:
        return int(self.drops.size)

    @property
    def loop(self) -> bool:
        return self.meta.loop

    def mean_loss(self) -> float:
        return float(self.drops.mean())

    def drops_for(self, start: int, n: int) -> np.ndarray:
        """Decisions for packets ``start .. start+n-1`` (wrapping when looping)."""
        k = np.arange(start, start + n, dtype=np.int64)
        if self.loop:
            return self.drops[k % self.drops.size]
        out = np.zeros(n, dtype=bool)
        inside = k < self.drops.size
        out[inside] = self.drops[k[inside]]
        return out

    def cursor(self, start: int = 0) -> "PacketCursor":
        return PacketCursor(self, start)

    def drop_process(self, rng: np.random.Generator | None = None) -> "PacketCursor":
        """The simulator's hook; times are ignored, packets are taken in order."""
        return PacketCursor(self, 0)

    def to_segments(self, bin_us: int, packet_interval_us: float | None = None) -> SegmentTrace:
        """Loss fraction per ``bin_us`` window, packets spaced ``packet_interval_us`` apart."""
        iv = packet_interval_us or self.meta.packet_interval_us
        if not iv:
            raise TraceError("packet_interval_us is needed to place packets in time")
        t = np.arange(len(self), dtype=np.float64) * iv
        return segments_from_events(t, self.drops, int(bin_us), self.meta.with_(form="segments"))


class PacketCursor:
    """Stateful reader of a :class:`PacketTrace`, one call per batch (or per packet)."""

    def __init__(self, trace: PacketTrace, start: int = 0) -> None:
        self.trace = trace
        self.position = int(start)

    def next(self, n: int = 1) -> np.ndarray:
        out = self.trace.drops_for(self.position, n)
        self.position += n
        return out

    def next1(self) -> bool:
        """One packet's verdict (for an NFQUEUE callback)."""
        d = self.trace.drops
        k = self.position
        self.position += 1
        if k < d.size:
            return bool(d[k])
        return bool(d[k % d.size]) if self.trace.loop else False

    def drops(self, times_us: np.ndarray) -> np.ndarray:
        return self.next(int(np.size(times_us)))

    def drop(self, t_us: float = 0.0) -> bool:
        """Same as :meth:`next1`; the time is ignored (for a uniform per-packet callback)."""
        return self.next1()


class SegmentDropProcess:
    """:class:`DropProcess` for a segment trace: independent draws at each packet's time."""

    def __init__(self, trace: SegmentTrace, rng: np.random.Generator) -> None:
        self.trace = trace
        self.rng = rng

    def drops(self, times_us: np.ndarray) -> np.ndarray:
        return self.trace.sample_drops(times_us, self.rng)

    def drop(self, t_us: float) -> bool:
        return bool(self.rng.random() < self.trace.loss_at(float(t_us)))


def segments_from_events(
    times_us: np.ndarray, dropped: np.ndarray, bin_us: int, meta: TraceMeta, duration_us: int | None = None
) -> SegmentTrace:
    """Bin per-packet outcomes into a segment trace of loss fractions.

    A bin without packets gets loss 0: nothing was observed there. Times are
    shifted so the first packet falls in the first bin.
    """
    if bin_us <= 0:
        raise TraceError("bin_us must be positive")
    t = np.asarray(times_us, dtype=np.float64)
    if t.size == 0:
        raise TraceError("no packets to bin")
    t = t - t.min()
    b = (t // bin_us).astype(np.int64)
    nb = int(b.max()) + 1
    sent = np.bincount(b, minlength=nb)
    lost = np.bincount(b, weights=np.asarray(dropped, dtype=np.float64), minlength=nb)
    loss = np.divide(lost, sent, out=np.zeros(nb), where=sent > 0)
    dur = duration_us if duration_us is not None else nb * bin_us
    starts = np.arange(nb, dtype=np.int64) * bin_us
    keep = starts < dur
    return SegmentTrace(starts[keep], loss[keep], dur, meta=meta).merged()
