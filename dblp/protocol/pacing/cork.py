"""Coalesced control (rule R13), sans I/O: which control frames one side holds for a peer, and
when they must go.

The rule is stated in :mod:`dblp.protocol.pacing`. The transport writes
(:class:`dblp.transport.sockets.Peer`: its lock, its socket, its event loop's waits); this module
decides what is held and whether it is due.
"""

from __future__ import annotations

from dblp.protocol.pacing.auto import MIN_SAMPLE


def corks_upstream(chunks: int, max_batch: int) -> bool:
    """Whether a server holds a round's STOP(up)s until its loop's turn ends: a pass of one
    batch is on the wire before its STOP can come (nothing for R6 to cut), so the STOP may wait,
    and the last worker's joins the broadcast's ROUND(down) - one write, one wakeup."""
    return chunks <= max_batch


def stops_tell_nothing(chunks: int) -> bool:
    """Whether a STOP of a ``chunks``-datagram pass may be held across the holder's waits: its
    timing tells no pacer anything (R11 reads no pass under :data:`MIN_SAMPLE`)."""
    return chunks < MIN_SAMPLE


class ControlCork:
    """The control frames one side holds for one peer, in order (``None``: not corked), and
    whether held STOPs may wait across the holder's waits (:attr:`hold_stops`).

    Why: every write on the control connection wakes the peer's event loop, and on a host with
    fewer cores than processes a woken peer preempts the writer. Held frames go in one write:
    before any datagram that follows them (a ROUND announces its datagrams) and before the holder
    waits for input (a held frame may be what the peer waits for) - except STOPs while
    :attr:`hold_stops` is set, which any other frame clears (that frame is awaited, and it and
    what is held before it go before the wait)."""

    def __init__(self) -> None:
        self.frames: list[bytes] | None = None
        self.hold_stops = False

    @property
    def corked(self) -> bool:
        return self.frames is not None

    def cork(self) -> None:
        """Hold frames from now on (already corked: nothing changes)."""
        if self.frames is None:
            self.frames = []

    def hold(self, frame: bytes, stop: bool) -> bool:
        """Whether ``frame`` (``stop``: a STOP's) is held, appended after those before it; False:
        not corked, the caller writes it now."""
        if self.frames is None:
            return False
        self.frames.append(frame)
        if self.hold_stops and not stop:
            self.hold_stops = False
        return True

    def due_before_data(self) -> bool:
        """Whether held frames must go before the next datagram (any held frame must)."""
        return bool(self.frames)

    def due_before_wait(self) -> bool:
        """Whether held frames must go before the holder waits for input."""
        return bool(self.frames) and not self.hold_stops

    def take(self) -> bytes:
        """The held frames as one piece, no longer held (still corked); b"" when none."""
        if not self.frames:
            return b""
        data, self.frames[:] = b"".join(self.frames), []
        return data

    def uncork(self) -> None:
        """Hold nothing from now on (what is held must have been taken first)."""
        self.frames = None
        self.hold_stops = False
