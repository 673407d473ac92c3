"""Summary statistics of a trace: mean loss, bursts and their lengths.

A *burst* is defined per form:

* packets: a maximal run of consecutive dropped packets (the usual
  definition of a loss burst; its length is in packets);
* segments: a maximal stretch of time whose loss exceeds a threshold, by
  default the trace's own time-weighted mean loss. That default finds the
  ON periods of an ON/OFF trace, the bad states of a Gilbert-Elliott trace
  and the burst iterations of an iteration-burst trace without being told
  their levels, and reports no bursts in a constant-loss trace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .model import PacketTrace, SegmentTrace


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index and length of each maximal run of True in ``mask``."""
    m = np.asarray(mask, dtype=np.int8)
    edges = np.diff(np.concatenate(([0], m, [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return starts, ends - starts


def packet_bursts(drops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first packet index, length in packets) of each run of drops."""
    return runs(np.asarray(drops, dtype=bool))


def segment_bursts(
    trace: SegmentTrace, threshold: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start_us, duration_us, mean loss) of each stretch with loss > threshold.

    ``threshold`` defaults to the trace's time-weighted mean loss.
    """
    thr = trace.mean_loss() if threshold is None else float(threshold)
    above = trace.loss > thr
    first, count = runs(above)
    if first.size == 0:
        z = np.zeros(0)
        return z.astype(np.int64), z.astype(np.int64), z
    durs = trace.durations_us
    last = first + count - 1
    start = trace.start_us[first]
    end = trace.start_us[last] + durs[last]
    weighted = np.concatenate(([0.0], np.cumsum(trace.loss * durs)))
    mean = (weighted[last + 1] - weighted[first]) / (end - start)
    return start, end - start, mean


@dataclass
class Summary:
    """What ``python -m traces show`` prints; lengths are in ``length_unit``."""

    form: str
    provenance: str
    source: str
    description: str
    mean_loss: float
    span: float  # duration_us (segments) or packet count (packets)
    span_unit: str
    bursts: int
    length_unit: str
    burst_mean: float
    burst_p50: float
    burst_p90: float
    burst_p99: float
    burst_max: float
    threshold: float | None
    generator: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"form:        {self.form}  ({self.provenance}; source: {self.source or '-'})",
            f"description: {self.description or '-'}",
            f"span:        {self.span:g} {self.span_unit}",
            f"mean loss:   {self.mean_loss:.6f}  ({self.mean_loss * 100:.4f}%)"
            + ("  [time-weighted]" if self.form == "segments" else ""),
        ]
        thr = "" if self.threshold is None else f" (loss > {self.threshold:.6g})"
        lines.append(f"bursts:      {self.bursts}{thr}")
        if self.bursts:
            lines.append(
                f"burst length [{self.length_unit}]: mean {self.burst_mean:.6g}  p50 {self.burst_p50:.6g}  "
                f"p90 {self.burst_p90:.6g}  p99 {self.burst_p99:.6g}  max {self.burst_max:.6g}"
            )
        if self.generator:
            lines.append(f"generator:   {self.generator.get('name')} {self.generator.get('params', {})}")
        return "\n".join(lines)


def summarize(trace: SegmentTrace | PacketTrace, threshold: float | None = None) -> Summary:
    """Mean loss, burst count and burst-length distribution of ``trace``."""
    m = trace.meta
    if isinstance(trace, PacketTrace):
        _, lengths = packet_bursts(trace.drops)
        span, span_unit, unit, thr = float(len(trace)), "packets", "packets", None
    else:
        thr = trace.mean_loss() if threshold is None else float(threshold)
        _, lengths, _ = segment_bursts(trace, thr)
        span, span_unit, unit = float(trace.duration_us), "µs", "µs"
    lengths = lengths.astype(np.float64)
    if lengths.size:
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        mean, mx = float(lengths.mean()), float(lengths.max())
    else:
        p50 = p90 = p99 = mean = mx = 0.0
    return Summary(
        form=m.form,
        provenance=m.provenance,
        source=m.source,
        description=m.description,
        mean_loss=trace.mean_loss(),
        span=span,
        span_unit=span_unit,
        bursts=int(lengths.size),
        length_unit=unit,
        burst_mean=mean,
        burst_p50=float(p50),
        burst_p90=float(p90),
        burst_p99=float(p99),
        burst_max=mx,
        threshold=thr,
        generator=m.generator,
    )
