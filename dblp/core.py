"""The sans-I/O DBLP core: one sender and one receiver state machine per peer.

This module states the protocol's per-transfer rules (paper section III,
Algorithms 1 and 2) and implements them. It never touches a socket, a thread or SimPy: bytes and
control messages go in, with the clock passed in as ``now`` (seconds);
datagram batches, control messages and timer deadlines come out. The socket
transport (:mod:`dblp.transport`), the simulator (:mod:`dblp.sim`) and the
tests all drive these same objects, in the style of aioquic's
``QuicConnection`` (``receive_datagram`` / ``datagrams_to_send`` /
``get_timer`` / ``handle_timer``).

Rules, each stated once here:

R1  A round's tensor is cut into MTU-sized chunks (:class:`dblp.wire.ChunkLayout`).
R2  The sender sends every unsent chunk of a pass, then one PROBE (Alg. 1 l.4-10).
R3  A pass's order is a fresh seeded permutation per round - of runs of 64
    chunks (default) or of single chunks - or index order; retransmission
    passes keep the round's order, restricted to the chunks the last BITMAP
    reports missing.
R4  The receiver accepts a datagram only if it is well-formed, carries the
    expected run id and sender, passes its CRC - or, on the authenticated
    wire (the default, :mod:`dblp.auth`), carries a valid tag under the run's
    key (else counted ``unauthenticated``) - belongs to the current round,
    names an in-range chunk, has that chunk's exact length and is not a
    duplicate. Everything else is counted by reason and dropped (III-A).
R5  The receiver sends STOP as soon as it holds ceil((1-p) n) chunks, without
    waiting for a probe (Alg. 2 l.19-22); on PROBE it answers STOP if the
    threshold holds, else BITMAP (l.10-17) - except a PROBE of a round
    whose STOP it already sent: that STOP is on the control channel, which
    is reliable and ordered (TCP; the simulator's too), so the PROBE needs no
    answer. (Beyond the paper: a second STOP would cost one control message
    and one wakeup of the other side per direction, worker and round - in a
    lossless one-pass round, the common case, every PROBE crosses its STOP.)
R5b The stop rule (:data:`STOP_RULES`, a run's option): ``early`` is R5 as the paper has it,
    whose STOP cuts the first pass at ceil((1-p) n) chunks, so a lossless P_high round
    delivers only ~(1-p) of every transfer. ``once`` sends every chunk once: the receiver
    sends no STOP before the first pass's PROBE (unless it holds every chunk); at that PROBE
    and afterwards R5 applies unchanged, so the loss bound governs retransmission only -
    loss is tolerated, never manufactured.
R6  The sender stops at once on STOP, also mid-pass ("early stop", IV-B). The chunks the
    pass that STOP ended never handed out are the ones it knows undelivered
    (:meth:`RoundSender.undelivered`; what its last pass lost in flight it cannot know).
R7  Unreceived chunks are zero-filled (Alg. 2 l.26); :mod:`dblp.compensation` states what a
    run may make of them instead.
R8  A pass that delivered nothing new (100% loss) delays the next pass by an
    exponential backoff (1 ms doubling to 200 ms), so an outage does not
    busy-spin a core, and sending resumes within one backoff once the path
    recovers.
R9  Chunks of a round arriving after the round completed, and datagrams of
    another round, are stale: counted, never written.
R10 Placement (a transport's copy saver, not a rule change): while a round
    is open and before STOP, a receiver may let the transport receive a
    payload straight into the slot of a chunk it still misses, aimed by the
    sender's R3 order. Those bytes count only once their datagram passes
    R4; a slot whose chunk is still missing at STOP is zero-filled (R7), so
    nothing that failed R4 (stale, foreign, corrupt, mispredicted) survives
    into the result, and nothing is placed after STOP or between rounds.
R11-R17, the pacing rules (self-pacing, rate grant, coalesced control, broadcast rate, flood
    dispersion, burst head and tail), are stated in :mod:`dblp.pacing`.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

import numpy as np

from . import control as ctl
from .pacing import MIN_SAMPLE, TokenBucket
from .policy import check_tolerance, needed_chunks
from .wire import (
    KIND_DATA,
    MAGIC,
    ChunkLayout,
    ParameterError,
    assemble_rows,
    crc_placed,
    encode_headers,
    parse_headers,
    placed_ok,
    rows_ok,
    scatter_payloads,
    zero_chunks,
)

BACKOFF_START_S = 0.001
BACKOFF_MAX_S = 0.200
ORDERS = ("blocks", "perm", "inorder")
STOP_RULES = ("early", "once")  # R5b
DEFAULT_ORDER = "blocks"
ORDER_BLOCK = 64  # chunks per block of the "blocks" order (~92 KB at MTU 1500)
EARLY_CLEAN = 0.02  # R11: a STOP with at most this fraction of the sent datagrams missing is clean
DOWN_STREAM = 1000  # R3 order stream of the server's broadcast; worker i sends upstream with stream 1 + i


_INDEX_ORDERS: dict[int, np.ndarray] = {}


def index_order(chunks: int) -> np.ndarray:
    """0, 1, ..., chunks-1: the ``inorder`` order, one read-only array per chunk count, so a
    sender can tell it by identity (its missing chunks are then simply the unset bits)."""
    o = _INDEX_ORDERS.get(chunks)
    if o is None:
        if len(_INDEX_ORDERS) >= 64:  # a sweep over many tensor sizes: keep it small
            _INDEX_ORDERS.clear()
        o = _INDEX_ORDERS[chunks] = np.arange(chunks, dtype=np.int64)
        o.flags.writeable = False
    return o


def send_order(chunks: int, order: str, seed: int, round_no: int, stream: int) -> np.ndarray:
    """R3: the chunk order of a round; ``stream`` separates senders sharing a seed.

    ``blocks`` (the default) permutes runs of :data:`ORDER_BLOCK` consecutive
    chunks and keeps each run in index order: loss still falls on different
    parts of the tensor every round, while sender and receiver touch memory
    in ~92 KB runs rather than at a random 1.4 KB chunk per datagram, so a
    lossless round costs less time than with ``perm`` (a permutation of
    single chunks), which spreads one burst's loss more finely. ``inorder``
    loses the tail every round.
    """
    if order == "inorder" or (order == "blocks" and chunks <= ORDER_BLOCK):
        # (one block: its only permutation is index order - without the ~50 us of a seeded
        # generator, twice a round per worker, which a 30-chunk round notices)
        return index_order(chunks)
    rng = np.random.default_rng([seed, round_no, stream])
    if order == "perm":
        return rng.permutation(chunks)
    if order == "blocks":
        blocks = rng.permutation(-(-chunks // ORDER_BLOCK))
        idx = (blocks[:, None] * ORDER_BLOCK + np.arange(ORDER_BLOCK)).reshape(-1)
        return idx[idx < chunks] if chunks % ORDER_BLOCK else idx
    raise ParameterError(f"order must be one of {ORDERS}, got {order!r}")


ENCODE_SLAB = 4096  # datagrams encoded per call: numpy's per-call cost spread over many rows


class EncodedRound:
    """A round's datagram headers, encoded on first use and kept for retransmission.

    Only the 24-byte headers are stored (CRC included, computed over the
    payload in place); a datagram is its header plus a slice of ``values``,
    and the socket hands both to the kernel as two pieces, so the payload is
    never copied in user space. Headers are stored in send order (``order``,
    the sender's R3 permutation): a first pass takes contiguous slices.
    Encoding runs ahead in slabs of :data:`ENCODE_SLAB` datagrams, so a
    round stopped early (R6) does not pay for chunks it never sends. One
    instance can feed several senders with the same order (the server's
    broadcast): each chunk is encoded and CRC'd once. ``buffer`` (a previous
    round's headers) avoids fresh memory every round.
    """

    def __init__(
        self,
        values: np.ndarray,
        layout: ChunkLayout,
        *,
        round_no: int,
        run_id: int,
        sender: int,
        order: np.ndarray | None = None,
        buffer: np.ndarray | None = None,
    ) -> None:
        self.values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        if self.values.size != layout.elements:
            raise ValueError(f"tensor has {self.values.size} elements, layout expects {layout.elements}")
        self.layout = layout
        self.round_no = round_no
        self.run_id = run_id
        self.sender = sender
        self.order = np.arange(layout.chunks, dtype=np.int64) if order is None else np.asarray(order, np.int64)
        if self.order.shape != (layout.chunks,):
            raise ValueError(f"order has {self.order.size} entries, layout has {layout.chunks} chunks")
        shape = (layout.chunks, layout.header_size)
        self.headers = buffer if buffer is not None and buffer.shape == shape else np.empty(shape, np.uint8)
        self.lengths = np.full(layout.chunks, layout.datagram_size, dtype=np.int64)  # by chunk index
        self.lengths[-1] = layout.header_size + layout.last_chunk_floats * 4
        self._span_lengths = self.lengths[self.order]  # by position in send order
        self._encoded = 0  # headers[:_encoded] are encoded
        self._position: np.ndarray | None = None  # chunk index -> position, made on first use
        self._lock = threading.Lock()

    def span(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Headers and lengths of send positions ``start:stop`` (views, no copy)."""
        self._encode_to(stop)
        return self.headers[start:stop], self._span_lengths[start:stop]

    def take(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Headers (a copy, contiguous) and lengths of the datagrams ``seqs``, any order."""
        position = self._position
        if position is None:  # made whole before it is shared: senders may run on several threads
            position = np.empty(self.layout.chunks, np.int64)
            position[self.order] = np.arange(self.layout.chunks)
            self._position = position
        pos = position[seqs]
        if pos.size:
            self._encode_to(int(pos.max()) + 1)
        return self.headers[pos], self.lengths[seqs]

    def _encode_to(self, stop: int) -> None:
        """Encode the headers up to send position ``stop``. One encoding may feed senders driven
        from several threads (the server's parallel loops, :func:`dblp.transport.pump_parallel`):
        a header is written by one of them, under the lock, and counted encoded only once whole."""
        if stop <= self._encoded:
            return
        with self._lock:
            if stop <= self._encoded:
                return
            stop = min(self.layout.chunks, max(stop, self._encoded + ENCODE_SLAB))
            a = self._encoded
            encode_headers(self.values, self.layout, self.order[a:stop], run_id=self.run_id, sender=self.sender,
                           round_no=self.round_no, out=self.headers[a:stop])
            self._encoded = stop


class VirtualRound:
    """A round without payload bytes: :class:`RoundSender` yields chunk
    indices only. For drivers that model datagrams rather than carry them
    (the simulator); every protocol rule still runs."""

    _lengths: dict[tuple[int, int, int, int], np.ndarray] = {}  # read-only, one per layout shape

    def __init__(self, layout: ChunkLayout, round_no: int) -> None:
        self.layout = layout
        self.round_no = round_no
        key = (layout.chunks, layout.datagram_size, layout.last_chunk_floats, layout.header_size)
        lengths = VirtualRound._lengths.get(key)
        if lengths is None:  # a sender per worker and round at 1024 workers: made once, shared
            lengths = np.full(layout.chunks, layout.datagram_size, dtype=np.int64)
            lengths[-1] = layout.header_size + layout.last_chunk_floats * 4
            lengths.flags.writeable = False
            if len(VirtualRound._lengths) >= 64:  # a sweep over many tensor sizes: keep it small
                VirtualRound._lengths.clear()
            VirtualRound._lengths[key] = lengths
        self.lengths = lengths
        self.order = index_order(layout.chunks)  # positions are chunk indices: see span

    def span(self, start: int, stop: int) -> tuple[None, np.ndarray]:
        """Lengths of send positions ``start:stop`` of a sender in :attr:`order` (a view, no gather)."""
        return None, self.lengths[start:stop]

    def take(self, seqs: np.ndarray) -> tuple[None, np.ndarray]:
        return None, self.lengths[seqs]


class SendState(enum.Enum):
    SENDING = "sending"  # a pass is under way
    AWAIT_REPLY = "await_reply"  # pass sent, probe out, waiting for BITMAP/STOP
    BACKOFF = "backoff"  # R8: waiting before the next pass
    DONE = "done"


@dataclass
class Batch:
    """Datagrams to put on the wire now: for chunk ``seqs[i]``, header
    ``headers[i]`` then that chunk of ``values``, ``lengths[i]`` bytes in all
    (``headers`` is None for a :class:`VirtualRound`)."""

    headers: np.ndarray | None
    lengths: np.ndarray
    seqs: np.ndarray
    values: np.ndarray | None = None
    layout: ChunkLayout | None = None

    def __len__(self) -> int:
        return int(self.seqs.size)

    @property
    def rows(self) -> np.ndarray | None:
        """The whole datagrams, ``rows[i, :lengths[i]]`` (assembled: a copy)."""
        if self.headers is None or self.values is None or self.layout is None:
            return None
        return assemble_rows(self.headers, self.values, self.seqs, self.layout)[0]


@dataclass
class SendStats:
    sent: int = 0
    passes: int = 0
    received: int = 0  # chunks the receiver holds, from its last BITMAP/STOP
    early_stop: bool = False
    t_start: float = 0.0
    t_done: float = float("nan")
    ignored_control: int = 0  # control messages of another round or direction
    wait_s: float = 0.0  # time not sending: PROBE -> BITMAP/STOP, and R8 backoff (the per-pass overhead)

    @property
    def latency(self) -> float:
        return self.t_done - self.t_start


class RoundSender:
    """DBLP_SEND (Algorithm 1) of one round toward one peer."""

    def __init__(
        self,
        encoded: EncodedRound | VirtualRound,
        *,
        direction: int,
        now: float,
        order: str | np.ndarray = DEFAULT_ORDER,
        seed: int = 0,
        stream: int = 0,
        pacer: TokenBucket | None = None,
        max_batch: int = 256,
    ) -> None:
        """``order`` is R3's order name (computed here from ``seed`` and ``stream``) or the
        round's order already computed (:mod:`dblp.session` computes it once per round and
        direction and hands the same array to the encoder and every sender)."""
        self.enc = encoded
        self.layout = encoded.layout
        self.round_no = encoded.round_no
        self.direction = direction
        self.pacer = pacer or TokenBucket()
        self.max_batch = max_batch
        if isinstance(order, np.ndarray):
            if order.shape != (self.layout.chunks,):
                raise ValueError(f"order has {order.size} entries, layout has {self.layout.chunks} chunks")
            self.order = order
        else:
            self.order = send_order(self.layout.chunks, order, seed, self.round_no, stream)
        self._inorder = self.order is _INDEX_ORDERS.get(self.layout.chunks)  # 0..n-1 (see R3 below)
        # first passes go out as slices of the encoded headers when they are stored in this order
        self._same_order = getattr(encoded, "order", None) is self.order
        self.state = SendState.SENDING
        self.stats = SendStats(passes=1, t_start=now)
        self._pass = self.order  # chunks of the current pass, in send order
        self._pos = 0
        self._control: list[ctl.Message] = []
        self._backoff = 0.0
        self._backoff_until = 0.0
        self._last_received = -1
        self._idle_since: float | None = None  # when the current wait for a reply began
        # R11: the current pass as the pacer hears of it (first and last hand-out, datagrams, bytes)
        self._pass_t0: float | None = None
        self._pass_rate = 0.0  # the pacer's rate when the pass began
        self._pass_t1 = 0.0
        self._pass_sent = 0
        self._pass_bytes = 0
        self.first_loss = 0.0  # R14: the loss of this round's first pass at its reply (a STOP first: its span's)
        self.first_rate_bps = 0.0  # R14: the pacer's rate when the first pass began (0: unpaced)

    @property
    def done(self) -> bool:
        return self.state is SendState.DONE

    # -- data --------------------------------------------------------------
    def datagrams_to_send(self, now: float, limit: int | None = None, headers: bool = True) -> Batch | None:
        """R2: the next datagrams of the current pass, as allowed by pacing. ``headers=False``: the
        chunks only, nothing encoded (a data path that carries no datagrams, :mod:`dblp.hostlocal`)."""
        k = self._allowance(now, limit)
        if k <= 0:
            return None
        seqs = self._pass[self._pos : self._pos + k]
        hdrs: np.ndarray | None
        if not headers:
            hdrs, lengths = None, self.enc.lengths[seqs]
        elif self._pass is self.order and self._same_order:  # first pass: slices of the encoded headers
            hdrs, lengths = self.enc.span(self._pos, self._pos + k)
        else:
            hdrs, lengths = self.enc.take(seqs)
        # an unlimited bucket ignores what it is charged (no sum to take) unless it self-paces (R11)
        nbytes = int(lengths.sum()) if not self.pacer.unlimited or self.pacer.auto else 0
        self.pacer.consume(nbytes)
        if self._pass_t0 is None:
            self._pass_t0, self._pass_rate = now, self.pacer.rate_bps
        self._pass_t1, self._pass_sent, self._pass_bytes = now, self._pass_sent + k, self._pass_bytes + nbytes
        self._handed_out(k, now)
        return Batch(hdrs, lengths, seqs, getattr(self.enc, "values", None), self.layout)

    def count_to_send(self, now: float, limit: int) -> int:
        """R2 at the count level: hand out the next ``limit`` datagrams of the current pass (fewer
        if the pass has fewer left) as a number - what :meth:`datagrams_to_send` would hand out,
        neither gathered nor encoded - and return how many. For a driver that models a pass's
        datagrams by their count (the simulator's synchronised incast, :mod:`dblp.sim.incast`):
        at 1024 workers that is ~740,000 passes an iteration, each a Batch otherwise. Unpaced
        senders only (a bucket is charged by the datagrams' lengths)."""
        if self.pacer.rate_bps:
            raise ValueError("count_to_send: a paced sender hands out batches (its bucket is charged by length)")
        k = self._allowance(now, limit)
        if k > 0:
            self._handed_out(k, now)
            return k
        return 0

    def _allowance(self, now: float, limit: int | None) -> int:
        """How many datagrams of the current pass may go now (R8's backoff over: the next pass starts)."""
        if self.state is not SendState.SENDING:
            if self.state is not SendState.BACKOFF or now < self._backoff_until:
                return 0
            self._start_pass(now)
        k = min(limit or self.max_batch, self._pass.size - self._pos)
        return self.pacer.allowance(now, self.layout.datagram_size, k) if self.pacer.rate_bps else k

    def _handed_out(self, k: int, now: float) -> None:
        """``k`` datagrams of the pass are out; R2: the PROBE follows the pass's last one."""
        self._pos += k
        self.stats.sent += k
        if self._pos >= self._pass.size:
            self.state = SendState.AWAIT_REPLY
            self._idle_since = now
            # R12: a self-pacing sender states its pass's rate (0 when unpaced: nothing to state)
            self._control.append(ctl.Probe(self.round_no, self.direction, self.stats.passes,
                                           self._pass_rate if self.pacer.auto else 0.0))

    def control_to_send(self) -> list[ctl.Message]:
        out, self._control = self._control, []
        return out

    # -- control -----------------------------------------------------------
    def handle_control(self, msg: ctl.Message, now: float) -> None:
        if getattr(msg, "round", None) != self.round_no or getattr(msg, "direction", None) != self.direction:
            self.stats.ignored_control += 1
            return
        if self.done:
            return
        if isinstance(msg, ctl.Stop):
            # R6: stop at once, also mid-pass.
            self.stats.early_stop = self.state is SendState.SENDING
            self._report_pass(int(msg.received), now, stop=True, span=int(msg.span))
            self.stats.received = msg.received
            self.stats.t_done = now
            self._end_wait(now)
            self.state = SendState.DONE
        elif isinstance(msg, ctl.Bitmap) and self.state is SendState.AWAIT_REPLY:
            mask = msg.mask(self.layout.chunks)
            self._report_pass(int(msg.received), now, stop=False, arrival_bps=msg.rate_bps)
            # R3: missing chunks, round order (in index order that is the missing ones as they are)
            self._reply(int(msg.received), (~mask).nonzero()[0] if self._inorder else self.order[~mask[self.order]],
                        now)
        else:
            self.stats.ignored_control += 1

    def handle_count_reply(self, received: int, now: float) -> float:
        """A BITMAP at the count level: the receiver holds ``received`` chunks, the round's first
        ``received`` in send order (R3's next pass is then the order's rest). For a driver that
        models which datagrams arrive by their number (:mod:`dblp.sim.incast`: which chunks a pass
        carries does not change how many arrive or when), without a bitmap to pack and unpack
        per pass. The receiver it models gets the same chunks (``order[:received]``). Returns when
        the next pass may start: ``now``, or the end of R8's backoff."""
        if self.state is not SendState.AWAIT_REPLY:
            raise ValueError(f"handle_count_reply: the sender is {self.state.value}, not awaiting a reply")
        if not 0 <= received <= self.layout.chunks:
            raise ValueError(f"handle_count_reply: received={received} is outside 0..{self.layout.chunks}")
        self._reply(received, self.order[received:], now)
        return self._backoff_until if self.state is SendState.BACKOFF else now

    def _reply(self, received: int, missing: np.ndarray, now: float) -> None:
        """R3 and R8 on a BITMAP: the next pass carries ``missing``, at once or after a backoff."""
        self.stats.received = received
        self._pass = missing
        self._pos = 0
        if self._pass.size == 0:  # receiver has everything but did not stop: probe again
            self._control.append(ctl.Probe(self.round_no, self.direction, self.stats.passes))
            return
        if received <= self._last_received:  # R8: no progress
            self._backoff = BACKOFF_START_S if self._backoff == 0 else min(BACKOFF_MAX_S, 2 * self._backoff)
            self._backoff_until = now + self._backoff
            self.state = SendState.BACKOFF
        else:
            self._backoff = 0.0
            self._start_pass(now)
        self._last_received = received

    def _report_pass(self, received: int, now: float, *, stop: bool, span: int = 0,
                     arrival_bps: float = 0.0) -> None:
        """R11: tell the pacer how the pass that this reply answers went; a new pass starts counting."""
        sent, t0, nbytes = self._pass_sent, self._pass_t0, self._pass_bytes
        self._pass_t0, self._pass_sent, self._pass_bytes = None, 0, 0
        if t0 is None or sent == 0 or not self.pacer.auto:
            return
        delivered = received - self.stats.received
        if self.stats.passes == 1:  # R14: the first pass's outcome, for the broadcast's rate
            self.first_rate_bps = self._pass_rate
            # (a STOP first: the loss its receiver counted in the order's span, when it states one)
            self.first_loss = (1.0 - received / span if span >= received > 0 else 0.0) if stop else \
                min(1.0, max(0.0, 1.0 - delivered / sent))
        if stop:  # the receiver stopped counting at its threshold, datagrams may be in flight: clean, or nothing
            if sent - delivered > EARLY_CLEAN * sent:
                return
            arrived = min(sent, max(delivered, 0))
            nbytes, sent, delivered = nbytes * arrived // sent, arrived, arrived
        self.pacer.on_pass(sent, delivered, nbytes, self._pass_t1 - t0, now - t0, first=self.stats.passes == 1,
                           rate_bps=self._pass_rate, arrival_bps=arrival_bps)

    def _start_pass(self, now: float) -> None:
        self._end_wait(now)
        self.state = SendState.SENDING
        self.stats.passes += 1

    def _end_wait(self, now: float) -> None:
        if self._idle_since is not None:
            self.stats.wait_s += max(0.0, now - self._idle_since)
            self._idle_since = None

    def undelivered(self) -> np.ndarray:
        """R6: after STOP, the chunks the stopped pass never handed out (a copy, in send order)."""
        return np.array(self._pass[self._pos :], dtype=np.int64)

    @property
    def pass_chunks(self) -> np.ndarray:
        """The chunks the current pass has still to hand out, in send order (a view; read it only):
        what the next :meth:`datagrams_to_send` calls will return, batch after batch."""
        return self._pass[self._pos :]

    @property
    def pass_remaining(self) -> int:
        """Datagrams of the current pass not yet handed out."""
        return 0 if self.state is SendState.DONE else int(self._pass.size - self._pos)

    def ready(self, now: float) -> bool:
        """Whether :meth:`datagrams_to_send` would return datagrams at ``now``."""
        if self.state is SendState.BACKOFF:
            return now >= self._backoff_until
        return self.state is SendState.SENDING and self.pacer.allowance(now, self.layout.datagram_size, 1) > 0

    # -- timers ------------------------------------------------------------
    def get_timer(self) -> float | None:
        """The next time :meth:`datagrams_to_send` can make progress without new input."""
        if self.state is SendState.BACKOFF:
            return self._backoff_until
        if self.state is SendState.SENDING and not self.pacer.unlimited:
            return self.pacer.next_time(self.pacer.last_time, self.layout.datagram_size)
        return None


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
        threshold, or under ``once`` every chunk until the first pass's PROBE. For drivers that
        model a pass's arrivals by their number."""
        return self.need if self.stop_rule == "early" or self.stats.probes > 0 else self.layout.chunks

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
        crc_ok = placed_ok(hdr_rows, crcs, self.layout)
        if not crc_ok.all():
            self._drop(self._integrity_drop, int((~crc_ok).sum()))
            hdr, aims = hdr[crc_ok], aims[crc_ok]
        mine = self._from_peer(hdr)
        if not mine.all():
            hdr, aims = hdr[mine], aims[mine]
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
        crc_ok = rows_ok(sub, self.layout)
        if not crc_ok.all():
            self._drop(self._integrity_drop, int((~crc_ok).sum()))
            sub, h = sub[crc_ok], h[crc_ok]
        mine = self._from_peer(h)
        if not mine.all():
            sub, h = sub[mine], h[mine]
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
        ``once``, only from the first pass's PROBE on, or with every chunk in."""
        if self.active and not self._stop_sent and self.tolerance is not None and self.received >= self.need \
                and (self.stop_rule == "early" or self.stats.probes > 0 or self.received == self.layout.chunks):
            self._stop_sent = True
            self.stats.t_done = now
            span = 0
            if self.stats.probes == 0:  # R12: STOP before the first pass's PROBE
                self.first_loss, span = self._early_stop_loss()
            self._control.append(ctl.Stop(self.round_no, self.direction, self.received, span))
            self._zero_fill()

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
