"""Loss traces for DBLP: one format, generators, importers, replay helpers.

The file format is in ``traces/FORMAT.md``; the CLI is ``python -m traces``.
What the emulator's replayer and the simulator call (times are microseconds
since the replay started on the link)::

    from traces import read_trace, SegmentTrace, PacketTrace
    tr = read_trace("traces/samples/onoff-lognormal.loss.csv")   # either form

    # segments form
    tr.loss_at(t_us)                  # loss in force (scalar or array); 0 past the end unless loop
    tr.segments                       # structured array: start_us, end_us, loss, rate_bps, queue_pkts
    for ch in tr.changes(until_us):   # Change(t_us, loss, rate_bps, queue_pkts): kernel-rule updates
        ...
    tr.resample(1000).changes()       # same, at most one change per ms, mean loss kept
    tr.sample_drops(times_us, rng)    # bool per packet (simulator, vectorised)
    SegmentTrace.from_schedule(t, loss, duration_us)   # record an achieved schedule

    # both forms
    proc = tr.drop_process(rng)       # proc.drops(times_us) -> bool array; proc.drop(t_us) -> bool
    tr.mean_loss()

    # packets form
    cur = pkt.cursor(); cur.next(n); cur.next1()       # exact per-packet verdicts (NFQUEUE)

The loss-process vocabulary every layer shares - specs such as
``{"kind": "iteration_bursts", "at": [50], "loss": 0.7}`` or
``{"kind": "gilbert_elliott", "p": 0.01, "r": 0.25}``, their checker and
text form, the one Gilbert-Elliott chain - is :mod:`traces.processes`.
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
from .io import Trace, dumps, loads, read_packets, read_segments, read_trace, write_trace
from .meta import TraceMeta
from .model import (
    SEGMENT_DTYPE,
    Change,
    DropProcess,
    PacketCursor,
    PacketTrace,
    SegmentDropProcess,
    SegmentTrace,
    segments_from_events,
)
from .stats import packet_bursts, segment_bursts, summarize

__all__ = [
    "SEGMENT_DTYPE",
    "Change",
    "DropProcess",
    "NotMappableError",
    "PacketCursor",
    "PacketTrace",
    "SegmentDropProcess",
    "SegmentTrace",
    "Trace",
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
