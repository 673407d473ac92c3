"""The receiving side of a transfer: :class:`Receiver`, DBLP_RECV (Algorithm 2) from one peer,
with its drop counters and the placement it offers the transport.

The rules it follows are stated in :mod:`dblp.protocol.core` (R4, R5, R5b, R7, R9, R10) and
:mod:`dblp.protocol.pacing` (what it measures for the rate rules: R12's first-pass loss, R15's flood
dispersion). Sans I/O: bytes and control messages go in with the clock as ``now``, control
messages come out. Import these names from :mod:`dblp.protocol.core`, which re-exports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.pacing import MIN_SAMPLE
from dblp.protocol.policy import check_tolerance, needed_chunks
from dblp.protocol.sender import EARLY_CLEAN, index_order
from dblp.protocol.wire import (
    KIND_DATA,
    MAGIC,
    ChunkLayout,
    ParameterError,
    crc_placed,
    parse_headers,
    placed_ok,
    rows_ok,
    scatter_payloads,
    zero_chunks,
)

STOP_RULES = ("early", "once", "deadline")  # R5b
DEADLINE_FACTOR = 2.0  # R5b deadline: the deadline is this multiple of the clean-pass estimate
DEADLINE_GAIN = 0.25  # R5b deadline: the weight of a transfer's sample in the running estimate


@dataclass
class DropCounters:
    stale: int = 0
    duplicate: int = 0
    corrupt: int = 0
    foreign: int = 0
    malformed: int = 0
    out_of_range: int = 0
    wrong_length: int = 0
    unauthenticated: int = 0  # authenticated wire: no valid tag under the run's key (R4)

    def total(self) -> int:
        return sum(vars(self).values())

    def add(self, other: "DropCounters") -> None:
        for k, v in vars(other).items():
            setattr(self, k, getattr(self, k) + v)


@dataclass
class RecvStats:
    t_start: float = 0.0
    t_first: float = float("nan")  # first accepted chunk
    t_done: float = float("nan")
    accepted: int = 0
    probes: int = 0
    drops: DropCounters = field(default_factory=DropCounters)

    @property
    def latency(self) -> float:
        return self.t_done - self.t_start


@dataclass
class Placement:
    """Where the transport may receive payloads in place (R10); arrays are the receiver's own."""

    out: np.ndarray  # the round's tensor as bytes
    mask: np.ndarray  # chunks received (bool)
    claim: np.ndarray  # uint8 scratch, all zero between calls
    order: np.ndarray  # the sender's chunk order (int64)
    pos: np.ndarray  # its inverse
    cursor: np.ndarray  # int64[1]: position in order after the last chunk seen
    chunk_bytes: int
    key: bytes = b""  # the run's data key on the authenticated wire (tags checked in the receive loop)


class Receiver:
    """DBLP_RECV (Algorithm 2) from one peer, across rounds.

    It lives for the whole connection so that datagrams arriving between
    rounds are classified (R9) rather than left to a missing object.
    Received chunks are written straight into ``out`` (the caller's float32
    buffer) and missing ones zero-filled when the round completes (R7).
    """

    def __init__(
        self,
        layout: ChunkLayout,
        *,
        run_id: int,
        expected_sender: int,
        direction: int,
        peer_addr: object = None,
        stop_rule: str = "early",
    ) -> None:
        if stop_rule not in STOP_RULES:
            raise ParameterError(f"stop_rule must be one of {', '.join(STOP_RULES)}, got {stop_rule!r}")
        self.stop_rule = stop_rule  # R5b
        self.layout = layout
        self.run_id = run_id
        self.expected_sender = expected_sender
        self.direction = direction
        self.peer_addr = peer_addr
        self.round_no = -1
        self.active = False  # a round is open and not complete
        self.tolerance: float | None = None
        self.need = layout.chunks
        self.mask = np.zeros(layout.chunks, dtype=bool)
        self._slot = np.zeros(layout.chunks, dtype=np.int64)  # scratch for duplicate detection
        self.received = 0
        self.out: np.ndarray | None = None
        self.stats = RecvStats()
        self.total_drops = DropCounters()  # over the connection's life, between rounds included
        self.stated_rate_bps = 0.0  # R12: the rate the peer's last PROBE stated (kept across rounds); 0 = none
        self.first_loss = 0.0  # R12: the loss of this round's first pass at its PROBE, or at a STOP before it
        self.first_rate_bps = 0.0  # R12: the rate that PROBE stated (0: unpaced, or STOP came first)
        self.t_last = float("nan")  # R15: when the latest chunk of the round was accepted
        self.lead = 0  # R15: chunks accepted at the round's first read (``now`` of t_first): when they arrived is unknown
        # R15: chunks of the first pass after its first read (at its PROBE; 0: not yet, or STOP came first) ...
        self.first_received = 0
        self.first_span_s = 0.0  # ... and the span from the first read to the last chunk's (s)
        self.tell_rate = False  # R15: answer an unpaced lossy first pass with the rate it arrived at (self-paced runs)
        self._told_bps = 0.0  # R15: the rate to state in the next BITMAP (once a round)
        self._control: list[ctl.Message] = []
        self._stop_sent = False
        self._identity = np.arange(layout.chunks, dtype=np.int64)
        self._index = index_order(layout.chunks)  # see _accept_new
        self._order = self._pos = self._identity
        self._order_known = False  # expect_order was told this round's order (R12's loss at an early STOP)
        self._claim = np.zeros(layout.chunks, np.uint8)
        self._cursor = np.zeros(1, np.int64)
        self.pass_estimate_s = math.nan  # R5b deadline: the running estimate of a clean first pass (s); nan: none yet

    # -- round life ----------------------------------------------------------
    def begin_round(self, round_no: int, out: np.ndarray | None, now: float, tolerance: float | None = None) -> None:
        """Open a round. ``tolerance`` may come later (:meth:`set_tolerance`):
        the worker opens the broadcast round before its ROUND message arrives
        so that early datagrams are kept, not dropped."""
        if out is not None and (out.dtype != np.float32 or out.size != self.layout.elements
                                or not out.flags.c_contiguous):
            raise ValueError("out must be a contiguous float32 array of the layout's size")
        self.round_no = round_no
        self.out = None if out is None else out.reshape(-1)
        self.mask[:] = False
        self.received = 0
        self.active = True
        self._stop_sent = False
        self.first_loss = self.first_rate_bps = self.first_span_s = 0.0
        self.first_received = self.lead = 0
        self.t_last = float("nan")
        self._told_bps = 0.0
        self.stats = RecvStats(t_start=now)
        self.tolerance = None
        self.need = self.layout.chunks
        self._order = self._pos = self._identity
        self._order_known = False
        self._cursor[0] = 0
        if tolerance is not None:
            self.set_tolerance(tolerance, now)

    def set_tolerance(self, tolerance: float, now: float) -> None:
        self.tolerance = check_tolerance("tolerance", tolerance)
        self.need = needed_chunks(self.layout.chunks, self.tolerance)
        self._check_threshold(now)

    @property
    def complete(self) -> bool:
        return self._stop_sent

    @property
    def stop_count(self) -> int:
        """How many chunks make this receiver STOP before the current pass's PROBE (R5, R5b): the
        threshold, or under ``once`` and ``deadline`` every chunk until the first pass's PROBE
        (the deadline's close by time: :meth:`stop_arrival`). For drivers that
        model a pass's arrivals by their number."""
        return self.need if self.stop_rule == "early" or self.stats.probes > 0 else self.layout.chunks

    @property
    def deadline_s(self) -> float:
        """R5b ``deadline``: how long after the transfer's first chunk holding the threshold makes this
        receiver STOP before the first pass's PROBE - :data:`DEADLINE_FACTOR` times the running
        estimate of a clean first pass. inf: no such close (another rule, no estimate yet, or the
        first pass's PROBE came)."""
        if self.stop_rule != "deadline" or self.stats.probes > 0 or self.pass_estimate_s != self.pass_estimate_s:
            return math.inf
        return DEADLINE_FACTOR * self.pass_estimate_s

    @property
    def deadline_at(self) -> float:
        """R5b ``deadline``: the time from which the threshold makes this receiver STOP before the
        first pass's PROBE (inf: none, or no chunk in yet). Drivers that model arrivals compare an
        arrival's time with this same sum."""
        return self.stats.t_first + self.deadline_s if self.received else math.inf

    def stop_arrival(self, times: np.ndarray) -> int:
        """R5 and R5b for drivers that model a pass's arrivals by their number: of the next arrivals,
        at the sorted ``times``, how many this receiver takes up to the one its STOP comes with
        (before any PROBE); 0 when none of them brings it (or no round is open with a tolerance)."""
        if not self.active or self._stop_sent or self.tolerance is None:
            return 0
        k = self.stop_count - self.received
        dl = self.deadline_s
        if dl < math.inf and times.size:  # the first arrival at the deadline with the threshold held
            at = self.stats.t_first + dl if self.received else float(times[0]) + dl
            k = min(k, max(self.need - self.received, int(times.searchsorted(at, side="left")) + 1))
        return k if 0 < k <= times.size else 0

    # -- placement (R10) -------------------------------------------------------
    def expect_order(self, order: np.ndarray) -> None:
        """The sender's R3 order of this round (its first pass), so placement
        predicts which chunk comes next. Without it, index order is assumed."""
        order = np.ascontiguousarray(order, dtype=np.int64)
        n = self.layout.chunks
        if order.shape != (n,) or (n and (order.min() < 0 or order.max() >= n)):
            raise ValueError(f"order must be a permutation of the {n} chunks")
        pos = np.zeros_like(order)
        pos[order] = self._identity
        if not np.array_equal(order[pos], self._identity):
            raise ValueError(f"order must be a permutation of the {n} chunks")
        self._order, self._pos = order, pos
        self._order_known = True

    def placement(self) -> Placement | None:
        """Where payloads may be received in place now, or None (no round
        open, STOP sent, no output buffer, or a one-chunk tensor)."""
        if not self.active or self._stop_sent or self.out is None or self.layout.chunks < 2:
            return None
        return Placement(self.out.view(np.uint8), self.mask, self._claim, self._order, self._pos, self._cursor,
                         self.layout.chunk_bytes, self.layout.key_bytes)

    def receive_placed(self, rows: np.ndarray, lengths: np.ndarray, aims: np.ndarray, now: float,
                       foreign: np.ndarray | None = None, crcs: np.ndarray | None = None) -> int:
        """Feed a batch received under :meth:`placement`: where ``aims[i] >= 0``
        the header is in ``rows[i, :24]`` and the payload already sits in the
        slot of chunk ``aims[i]``; elsewhere the whole datagram is in
        ``rows[i, :lengths[i]]`` as for :meth:`receive_batch`. R4 applies to
        both; placed ones are taken first. ``crcs[i]``: the CRC-32C of placed
        datagram i's bytes (header from byte 8, then its slot) if the
        transport took it while they were in cache; computed here if None."""
        aims = np.asarray(aims, dtype=np.int64)
        placed = aims >= 0
        if not placed.any():
            return self.receive_batch(rows, lengths, now, foreign)
        fp = None if foreign is None else np.asarray(foreign, bool)
        got = self._receive_in_place(rows[placed, : self.layout.header_size], aims[placed], now,
                                     None if fp is None else fp[placed],
                                     None if crcs is None else np.asarray(crcs)[placed])
        rest = ~placed
        if rest.any():
            got += self.receive_batch(rows[rest], np.asarray(lengths)[rest], now, None if fp is None else fp[rest])
        return got

    def _receive_in_place(self, hdr_rows: np.ndarray, aims: np.ndarray, now: float,
                          foreign: np.ndarray | None, crcs: np.ndarray | None) -> int:
        """R4 for full-size datagrams whose payload is in place; the same checks
        and counters as :meth:`_receive_rows`, without writing anything."""
        if foreign is not None and foreign.any():
            self._drop("foreign", int(foreign.sum()))
            hdr_rows, aims = hdr_rows[~foreign], aims[~foreign]
            crcs = None if crcs is None else crcs[~foreign]
        if aims.size == 0:
            return 0
        if not self.active or self._stop_sent or self.out is None:
            # cannot happen through placement(); a driver bug must not accept unchecked bytes
            self._drop("stale", int(aims.size))
            return 0
        hdr = parse_headers(hdr_rows)
        ok = self._well_formed(hdr, self.layout.chunk_bytes)
        # the transport placed chunk aims[i]; a header naming another chunk is not in its slot
        moved = ok & (hdr["seq"].astype(np.int64) != aims)
        self._drop("corrupt", int(moved.sum()))
        ok &= ~moved
        if not ok.all():
            hdr_rows, hdr, aims = hdr_rows[ok], hdr[ok], aims[ok]
            crcs = None if crcs is None else crcs[ok]
        if aims.size == 0:
            return 0
        if crcs is None:
            crcs = crc_placed(hdr_rows, self.out, aims, self.layout)
        hdr, aims = self._authentic(placed_ok(hdr_rows, crcs, self.layout), hdr, aims)
        return self._accept(hdr["round"].astype(np.int64), aims, now, None, 0)

    def _well_formed(self, hdr: np.ndarray, payload_bytes: int) -> np.ndarray:
        """R4, first checks: magic, version, kind, and the declared payload length; drops counted.
        A version-1 datagram on the authenticated wire is ``unauthenticated``, not malformed."""
        ok = (hdr["magic"] == MAGIC) & (hdr["kind"] == KIND_DATA)
        self._drop("malformed", int(ok.size - ok.sum()))
        vers = ok & (hdr["version"] != self.layout.version)
        self._drop("unauthenticated" if self.layout.key is not None else "malformed", int(vers.sum()))
        ok &= ~vers
        decl = ok & (hdr["length"].astype(np.int64) != payload_bytes)
        self._drop("wrong_length", int(decl.sum()))
        return ok & ~decl

    def _authentic(self, intact: np.ndarray, hdr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """R4's last checks, the same for placed and copied datagrams: the integrity field (``intact``,
        checked by the caller on what it holds) and this run's sender. Returns the headers and their
        ``rows`` (data rows, or chunk indices) that pass; drops counted."""
        if not intact.all():
            self._drop(self._integrity_drop, int((~intact).sum()))
            hdr, rows = hdr[intact], rows[intact]
        mine = self._from_peer(hdr)
        if not mine.all():
            hdr, rows = hdr[mine], rows[mine]
        return hdr, rows

    def _from_peer(self, hdr: np.ndarray) -> np.ndarray:
        """R4: this run's id and the expected sender; others counted foreign."""
        bad = (hdr["run_id"] != self.run_id) | (hdr["sender"] != self.expected_sender)
        self._drop("foreign", int(bad.sum()))
        return ~bad

    # -- data ------------------------------------------------------------------
    def receive_datagrams(self, data: bytes | bytearray | memoryview | np.ndarray, now: float,
                          seg_size: int | None = None, addr: object = None) -> int:
        """Feed one datagram, or a GRO-coalesced run of ``seg_size``-byte
        datagrams (the last may be shorter). Returns chunks accepted."""
        buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
        n = buf.size
        if n == 0:
            self._drop("malformed", 1)
            return 0
        if self.peer_addr is not None and addr is not None and addr != self.peer_addr:
            # Foreign source: count the datagrams it carried, read nothing.
            self._drop("foreign", max(1, n // seg_size) if seg_size else 1)
            return 0
        seg = n if not seg_size or seg_size >= n else seg_size
        nfull, rem = divmod(n, seg)
        got = 0
        if nfull:
            got += self._receive_rows(buf[: nfull * seg].reshape(nfull, seg), now)
        if rem:
            got += self._receive_rows(buf[nfull * seg :].reshape(1, rem), now)
        return got

    def receive_batch(self, rows: np.ndarray, lengths: np.ndarray, now: float,
                      foreign: np.ndarray | None = None) -> int:
        """Feed many datagrams at once: ``rows[i, :lengths[i]]``, rows of the
        full datagram size processed together. ``foreign[i]`` marks datagrams
        whose source is not the registered peer (the transport knows sources);
        a length above the row width marks a datagram the transport truncated."""
        lengths = np.asarray(lengths)
        keep = np.ones(lengths.size, bool) if foreign is None else ~np.asarray(foreign, bool)
        self._drop("foreign", int(lengths.size - keep.sum()))
        width = rows.shape[1]
        over = keep & (lengths > width)  # longer than the row: truncated by the transport, never exact (R4)
        if over.any():
            self._drop("wrong_length", int(over.sum()))
            keep &= ~over
        full = keep & (lengths == width)
        got = 0
        if full.all():
            got = self._receive_rows(rows, now)
        elif full.any():
            got = self._receive_rows(rows[full], now)
        for i in np.flatnonzero(keep & ~full):
            if lengths[i] == 0:
                self._drop("malformed", 1)
            else:
                got += self._receive_rows(rows[i : i + 1, : lengths[i]], now)
        return got

    @property
    def _integrity_drop(self) -> str:
        """The counter of a failed integrity check: a bad CRC is ``corrupt``, a bad tag ``unauthenticated``."""
        return "unauthenticated" if self.layout.key is not None else "corrupt"

    def _drop(self, reason: str, count: int) -> None:
        if count:  # (the counters' __dict__: no getattr/setattr pair per counter)
            vars(self.stats.drops)[reason] += count
            vars(self.total_drops)[reason] += count

    def _receive_rows(self, rows: np.ndarray, now: float) -> int:
        """R4 over a batch of equal-length datagrams, vectorised."""
        k, size = rows.shape
        hs = self.layout.header_size
        if size < hs:
            self._drop("malformed", k)
            return 0
        hdr = parse_headers(rows)
        ok = self._well_formed(hdr, size - hs)
        if not ok.any():
            return 0
        # Copies of the batch are made only on the (rare) paths that drop rows.
        sub, h = (rows, hdr) if ok.all() else (rows[ok], hdr[ok])
        h, sub = self._authentic(rows_ok(sub, self.layout), h, sub)
        return self._accept(h["round"].astype(np.int64), h["seq"].astype(np.int64), now, sub, size)

    def receive_chunks(self, round_no: int, seqs: np.ndarray, now: float) -> int:
        """Deliver chunk indices without bytes (a :class:`VirtualRound`'s
        datagrams, already past the byte-level checks). Same rules from the
        round check on; nothing is written to ``out``."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if not self.active or self._stop_sent:
            return self._accept(seqs, seqs, now, None, 0)  # R9 before anything: ``rounds`` is not read
        if round_no != self.round_no:  # R9: another round's, every one stale (what _accept finds)
            self._drop("stale", int(seqs.size))
            return 0
        got = self._accept_new(seqs, now)
        if got >= 0:
            return got
        return self._accept(np.full(seqs.size, round_no, np.int64), seqs, now, None, 0)

    def _accept_new(self, seqs: np.ndarray, now: float) -> int:
        """:meth:`_accept`'s outcome when this round's ``seqs`` are strictly increasing, in range
        and all new (the simulator's every call but a few), without its filters: a third of
        the numpy calls (the round level makes ~50k of these per 64-worker run). -1: not so,
        take :meth:`_accept`."""
        n = seqs.size
        if n == 0:
            return 0
        s0, s1 = int(seqs[0]), int(seqs[-1])
        # strictly increasing: a run of the shared index order (a slice of a read-only 0..n-1) is,
        # else checked (the ufuncs' reduce directly: ndarray.all/any go through a Python wrapper)
        if not (0 <= s0 and s1 < self.layout.chunks
                and (n == 1 or (seqs.base is self._index and seqs.strides[0] == 8)
                     or np.logical_and.reduce(seqs[1:] > seqs[:-1]))):
            return -1
        # strictly increasing from s0 to s1 in n steps: the run s0..s1, whose mask is a slice (no gather)
        mask = self.mask[s0 : s1 + 1] if s1 - s0 == n - 1 else None
        if self.mask[s0] if n == 1 else np.logical_or.reduce(self.mask[seqs] if mask is None else mask):
            return -1
        if self.received == 0:
            self.stats.t_first = now
        if mask is None:
            self.mask[seqs] = True
        else:
            mask[:] = True
        self.received += n
        self.stats.accepted += n
        self.t_last = now
        if now == self.stats.t_first:
            self.lead += n
        self._check_threshold(now)
        return n

    def _accept(self, rounds: np.ndarray, seqs: np.ndarray, now: float, rows: np.ndarray | None, size: int) -> int:
        """R4 from the round check on, then R5. ``keep`` maps surviving datagrams
        to rows; filters run only when something is actually dropped."""
        if not self.active or self._stop_sent:  # R9 before anything is built (the simulator's common case)
            self._drop("stale", int(seqs.size))
            return 0
        keep = np.arange(seqs.size)

        def drop(bad: np.ndarray, reason: str) -> None:
            nonlocal keep, seqs
            if bad.any():
                self._drop(reason, int(bad.sum()))
                keep, seqs = keep[~bad], seqs[~bad]

        drop(rounds != self.round_no, "stale")
        drop(seqs >= self.layout.chunks, "out_of_range")
        if rows is not None:
            drop(self.layout.payload_lengths(seqs) != size - self.layout.header_size, "wrong_length")
        if seqs.size == 0:
            return 0
        cand = np.flatnonzero(~self.mask[seqs])
        cs = seqs[cand]
        if cs.size > 1 and not bool(np.all(cs[1:] > cs[:-1])):
            # Repeats inside the batch, found without sorting: one position per
            # chunk survives (whichever the scatter kept).
            self._slot[cs] = cand
            cand = cand[self._slot[cs] == cand]
        pick = cand
        self._drop("duplicate", int(seqs.size - pick.size))
        if pick.size == 0:
            return 0
        uniq = seqs[pick]
        if self.received == 0:
            self.stats.t_first = now
        if rows is not None:
            sel = keep[pick]
            identity = sel.size == rows.shape[0]  # sel is increasing: then it is every row, in order
            self._write(uniq, rows if identity else rows[sel], size)
        self.mask[uniq] = True
        self.received += int(uniq.size)
        self.stats.accepted += int(uniq.size)
        self.t_last = now
        if now == self.stats.t_first:
            self.lead += int(uniq.size)
        self._check_threshold(now)
        return int(uniq.size)

    def _write(self, seqs: np.ndarray, rows: np.ndarray, size: int) -> None:
        assert self.out is not None
        cf = self.layout.chunk_floats
        if size - self.layout.header_size == self.layout.chunk_bytes:
            scatter_payloads(rows, seqs, self.out, self.layout)
        else:  # the tensor's short last chunk
            self.out[(self.layout.chunks - 1) * cf :] = rows[0, self.layout.header_size : size].view("<f4")

    def _check_threshold(self, now: float) -> None:
        """R5: stop as soon as the threshold holds, without waiting for a probe - under R5b's
        ``once``, only from the first pass's PROBE on, or with every chunk in; under ``deadline``,
        also from :attr:`deadline_at` on."""
        if self.active and not self._stop_sent and self.tolerance is not None and self.received >= self.need \
                and (self.stop_rule == "early" or self.stats.probes > 0 or self.received == self.layout.chunks
                     or (self.stop_rule == "deadline" and now >= self.deadline_at)):
            self._stop_sent = True
            self.stats.t_done = now
            span = 0
            if self.stats.probes == 0:  # R12: STOP before the first pass's PROBE
                self.first_loss, span = self._early_stop_loss()
                self._pass_sample(now, self.layout.chunks / max(1, self.received))
            self._control.append(ctl.Stop(self.round_no, self.direction, self.received, span))
            self._zero_fill()

    def _pass_sample(self, now: float, scale: float) -> None:
        """R5b ``deadline``: a transfer's first pass ended (its PROBE, or a STOP before it) ``now``;
        its time since the first chunk, times ``scale`` (a STOP that cut it: the chunks it would
        have taken at the rate they came), updates the running estimate. A pass that took no time
        (every chunk in one read) is a sample of 0: passes that fast make any slower one late."""
        if self.stop_rule != "deadline" or not self.received:
            return
        sample = max(0.0, now - self.stats.t_first) * scale
        est = self.pass_estimate_s
        self.pass_estimate_s = sample if est != est else est + DEADLINE_GAIN * (sample - est)

    def _early_stop_loss(self) -> tuple[float, int]:
        """R12: the first pass's loss at a STOP that came before its PROBE - the fraction of the
        chunks the sender's order put before the last one that arrived that are missing (a pass
        crosses one FIFO path: those were sent, and lost). Why: at a high tolerance STOP always comes
        first, and without this loss a grant whose uploads overflow the server link's queue looks
        clean round after round and keeps rising. 0 when the order is not known (index order
        assumed) or nothing arrived, and at most :data:`EARLY_CLEAN` counts as clean, as R11 takes
        a STOP: a few datagrams missing at a rate far below the link (a loaded host's late
        wake-ups, a 5 ms bucket each, meeting in a 100-packet queue; a batch cut by the STOP) are
        not the rate's doing, and judged as congestion they would ratchet the grant down cut after
        cut.
        Returns the loss and the span it is of (the STOP states the span when the loss counts, R14)."""
        if not self._order_known or self.received == 0:
            return 0.0, 0
        held = self.mask[self._order]  # in send order
        sent = held.size - int(np.argmax(held[::-1]))  # positions 0..sent-1 left before the last arrival
        loss = 1.0 - self.received / sent
        return (loss, sent) if loss > EARLY_CLEAN else (0.0, 0)

    def _zero_fill(self) -> None:
        """R7: unreceived chunks become zeros."""
        if self.out is not None:
            zero_chunks(self.out, self.layout, np.flatnonzero(~self.mask))

    # -- control -------------------------------------------------------------
    def handle_control(self, msg: ctl.Message, now: float) -> None:
        if not isinstance(msg, ctl.Probe) or msg.direction != self.direction:
            return
        if msg.round != self.round_no:
            return  # a probe that crossed our STOP of an earlier round
        self.stats.probes += 1
        if msg.rate_bps > 0:  # R12: the rate the peer's pass was sent at
            self.stated_rate_bps = float(msg.rate_bps)
        if msg.pass_no == 1 and not self._stop_sent:  # R12: the first pass's loss (a STOP first: none)
            self.first_loss = 1.0 - self.received / self.layout.chunks
            self._pass_sample(now, 1.0)  # R5b: the whole pass was sent
            self.first_rate_bps = float(msg.rate_bps)
            if self.received:  # R15: the first pass's chunks and their span, before any retransmission
                self.first_received = self.received - self.lead
                self.first_span_s = self.t_last - self.stats.t_first
                if (self.tell_rate and msg.rate_bps == 0 and self.first_received >= MIN_SAMPLE
                        and self.first_span_s > 0):
                    self._told_bps = self.first_received * self.layout.datagram_size * 8.0 / self.first_span_s
        if self._stop_sent:
            return  # R5: the STOP of this round is already on its way
        if self.tolerance is None:
            # ROUND not seen yet (cannot happen over one ordered TCP stream,
            # kept for other drivers): report progress, decide later.
            self._control.append(self._bitmap())
        else:
            self._check_threshold(now)
            if not self._stop_sent:
                self._control.append(self._bitmap())

    def _bitmap(self) -> ctl.Bitmap:
        told, self._told_bps = self._told_bps, 0.0
        return ctl.Bitmap(self.round_no, self.direction, self.received, np.packbits(self.mask).tobytes(), told)

    def control_to_send(self) -> list[ctl.Message]:
        out, self._control = self._control, []
        return out

    def finish_round(self) -> None:
        """Close the round; later datagrams of it count as stale (R9). The
        caller's buffer is let go: nothing is written to it any more."""
        self.active = False
        self.out = None
