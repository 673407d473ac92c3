"""Loss traces for DBLP: one format, generators, importers, replay helpers.

Public API (see ``traces/FORMAT.md`` for the file format)::

    from traces import read_trace, write_trace, SegmentTrace, PacketTrace
    tr = read_trace("traces/samples/onoff-lognormal.loss.csv")
    tr.loss_at(t_us)                 # loss in force at times (us since replay start)
    for ch in tr.changes(): ...      # Change(t_us, loss, rate_bps, queue_pkts) for rule updaters
    tr.sample_drops(times_us, rng)   # simulator: bool drop per packet
    tr.drop_process(rng).drops(times_us)   # same hook for both forms (stateful for packets)
"""

from .errors import NotMappableError, TraceError, TraceFormatError
from .generators import (
    bernoulli_packets,
    bernoulli_segments,
    gilbert_elliott_mean_loss,
    gilbert_elliott_packets,
    gilbert_elliott_segments,
    iteration_burst_segments,
    onoff_mean_loss,
    onoff_segments,
)
from .io import dumps, loads, read_packets, read_segments, read_trace, write_trace
from .meta import TraceMeta
from .model import Change, DropProcess, PacketCursor, PacketTrace, SegmentTrace, segments_from_events
from .stats import packet_bursts, segment_bursts, summarize

__all__ = [
    "Change",
    "DropProcess",
    "NotMappableError",
    "PacketCursor",
    "PacketTrace",
    "SegmentTrace",
    "TraceError",
    "TraceFormatError",
    "TraceMeta",
    "bernoulli_packets",
    "bernoulli_segments",
    "dumps",
    "gilbert_elliott_mean_loss",
    "gilbert_elliott_packets",
    "gilbert_elliott_segments",
    "iteration_burst_segments",
    "loads",
    "onoff_mean_loss",
    "onoff_segments",
    "packet_bursts",
    "read_packets",
    "read_segments",
    "read_trace",
    "segment_bursts",
    "segments_from_events",
    "summarize",
    "write_trace",
]
