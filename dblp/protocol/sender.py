"""The sending side of a transfer: R3's chunk orders, a round's encoded datagrams, and
:class:`RoundSender`, DBLP_SEND (Algorithm 1) toward one peer.

The rules it follows are stated in :mod:`dblp.protocol.core` (R2, R3, R6, R8) and :mod:`dblp.protocol.pacing` (its
reports to the pacer, R11, and the rates it states, R12 and R14). Sans I/O like the rest of the
core: the clock is passed in as ``now``, datagram batches and control messages come out. Import
these names from :mod:`dblp.protocol.core`, which re-exports them.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.pacing import TokenBucket
from dblp.protocol.wire import ChunkLayout, ParameterError, assemble_rows, encode_headers

BACKOFF_START_S = 0.001
BACKOFF_MAX_S = 0.200
ORDERS = ("blocks", "perm", "inorder")
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
        from several threads (the server's parallel loops, :func:`dblp.transport.sockets.pump_parallel`):
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
        round's order already computed (:mod:`dblp.protocol.session` computes it once per round and
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
        chunks only, nothing encoded (a data path that carries no datagrams, :mod:`dblp.transport.hostlocal`)."""
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
        datagrams by their count (the simulator's synchronised incast, :mod:`dblp.sim.engines.incast`):
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
        models which datagrams arrive by their number (:mod:`dblp.sim.engines.incast`: which chunks a pass
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
