"""Sharded aggregation (``--aggregation sharded``, beyond the paper): k shard servers, one per host.

The paper has one parameter server, which receives N floats from every
worker and sends N back to each: its link carries ``2 N w`` per round while
a worker's carries ``2 N``. In the sharded mode every host runs a worker and
the server of one shard (1/k of the tensor): a worker sends shard j of its
gradient to host j (the reduce-scatter) and receives the averaged shard j
back from it (the all-gather), for every j. Each host then carries
``2 N (k-1)/k`` each way, as in a ring, in two steps instead of 2(k-1).

Each shard is an ordinary DBLP run - its own server session, layout, round
counter, bounded-loss STOP rule and tolerance per direction (dblp.protocol.session,
dblp.protocol.core): nothing of the protocol changes. What the shards share is the
tolerance policy's input: the CLR detection needs the L2 norm of the whole
averaged gradient, which is the square root of the sum of the shards'
squared norms. :class:`NormExchange` is that one exchange per round between
the shard servers (shard 0 is the hub), so every shard's policy sees the
same norm and announces the same tolerance.

This module holds the sharded mode's rules, each once: how a tensor is cut
(:func:`shard_bounds`), how shards' norms combine (:class:`NormExchange`),
how a worker drives its k exchanges (:class:`ShardedWorker`) and how its k
per-shard records make one round record (:func:`merge_records`).
"""

from __future__ import annotations

import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Sequence

from dblp.protocol import auth
from dblp.protocol.login import (NORM_MESSAGE_BYTES, HubGate, NormMessageError, Refuse, ShardVerified,  # (the simulator
                                 WorkerVerified, decode_norm, encode_norm)  # prices the norm exchange by its size)
from dblp.protocol.records import RecordWriter, RoundRecord
from dblp.transport.login import LOGGED_REFUSALS, MAX_PENDING, AcceptLoop, listen
from dblp.transport.staging import HostStaging, ResultPool
from dblp.transport.sockets import connect_retry
from dblp.protocol.wire import ParameterError
from dblp.transport.worker import Worker, failed_reason

log = logging.getLogger("dblp.transport.shard")

AGGREGATIONS = ("server", "sharded")  # the paper's single server; k shard servers on the workers' hosts


def shard_bounds(elements: int, shards: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``shards`` shards of a tensor of ``elements`` floats: equal cuts
    (sizes differ by at most one), every shard non-empty."""
    if shards < 1:
        raise ParameterError(f"shards must be >= 1, got {shards}")
    if elements < shards:
        raise ParameterError(f"a tensor of {elements} elements cannot be cut into {shards} shards")
    return [(j * elements // shards, (j + 1) * elements // shards) for j in range(shards)]


def merge_records(recs: Sequence[RoundRecord]) -> RoundRecord:
    """One worker's round record from its per-shard records of that round: the round spans the
    first shard's start to the last shard's end; latencies are the slowest shard's; datagram and
    drop counts add up; passes are the most any shard needed."""
    first = min(recs, key=lambda r: r.t_start)
    end = max(r.t_start + r.round_latency_s for r in recs)
    add = ("chunks", "up_sent", "up_received", "down_sent", "down_received", "stale", "duplicate", "corrupt",
           "foreign", "malformed", "out_of_range", "wrong_length", "unauthenticated")
    out = replace(first, **{f: sum(getattr(r, f) for r in recs) for f in add})
    out.round_latency_s = end - first.t_start
    out.up_latency_s = max(r.up_latency_s for r in recs)
    out.down_latency_s = max(r.down_latency_s for r in recs)
    out.up_passes = max(r.up_passes for r in recs)
    out.down_passes = max(r.down_passes for r in recs)
    out.early_stop_up = any(r.early_stop_up for r in recs)
    out.early_stop_down = any(r.early_stop_down for r in recs)
    out.extra = {**first.extra, "aggregation": "sharded", "shards": len(recs)}
    return out


def sum_sq_norms(sq_norms: Sequence[float]) -> float:
    """The whole mean's squared norm from its shards' squared norms, added in shard order (as
    the hub adds them, so the simulator's sum is bit-identical to the transport's)."""
    total = 0.0
    for v in sq_norms:
        total += v
    return total


class NormExchangeError(RuntimeError):
    """A shard server's norm exchange failed: a peer is silent, gone, or not of this run."""


class NormExchange:
    """The shard servers' exchange of one number per round: each gives its shard's squared norm,
    each gets the sum over shards (the whole mean's squared norm).

    Shard 0 is the hub: it listens on ``hub`` (HOST, PORT; port 0 = any free one, see
    :attr:`port`) and waits for the other ``shards - 1`` servers; they connect to it. Every
    message carries the round, the sender's shard and the value, authenticated (HMAC-SHA256 under
    the run's secret, over a nonce the hub draws per connection, so a recorded exchange cannot be
    replayed into another run) unless the run is ``--insecure`` (``secret`` None).
    Blocking: called once per round from the server's thread, after its reduce; a peer silent for
    ``timeout`` seconds ends the run with a :class:`NormExchangeError` naming it."""

    def __init__(self, shard: int, shards: int, hub: tuple[str, int], secret: bytes | None,
                 timeout: float = 120.0, connect_timeout: float = 60.0, login_timeout: float = 10.0) -> None:
        if not 0 <= shard < shards:
            raise ParameterError(f"shard must be in [0, {shards}), got {shard}")
        self.shard, self.shards, self.hub, self.secret = shard, shards, hub, secret
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.login_timeout = min(login_timeout, timeout)  # a connection's time to introduce itself
        self.refused = 0  # connections to the hub closed before they were a shard server's
        self.listener: socket.socket | None = None
        self.peers: dict[int, tuple[socket.socket, bytes]] = {}  # hub: shard -> (connection, nonce)
        self.conn: tuple[socket.socket, bytes] | None = None  # a peer's connection to the hub, its nonce
        if shard == 0:
            self.listener = listen(hub)

    @property
    def port(self) -> int:
        """The hub's listening port (the hub only)."""
        assert self.listener is not None
        return self.listener.getsockname()[1]

    def _send(self, conn: socket.socket, nonce: bytes, round_no: int, shard: int, value: float) -> None:
        conn.sendall(encode_norm(self.secret, nonce, round_no, shard, value, from_hub=self.shard == 0))

    def _recv(self, conn: socket.socket, nonce: bytes, round_no: int, who: str) -> tuple[int, float]:
        data = _recv_exact(conn, NORM_MESSAGE_BYTES, who, self.timeout)
        try:
            return decode_norm(self.secret, nonce, data, round_no, from_hub=self.shard != 0)
        except NormMessageError as exc:
            raise NormExchangeError(f"{who}: {exc}") from None

    def _accept_peers(self) -> None:
        """Take the other shard servers' connections through the one login of every listener
        (:class:`dblp.transport.login.AcceptLoop` driving :class:`dblp.protocol.login.HubGate`): every
        login at once, each under its own deadline (``login_timeout``), a connection that says
        nothing, or not this run's introduction, closed when it fails without holding up the others."""
        assert self.listener is not None
        gate = HubGate(self.shards, self.secret, timeout=self.login_timeout, accept_timeout=self.connect_timeout,
                       now=time.monotonic(), max_pending=MAX_PENDING, taken=set(self.peers))
        _HubDoor(self, gate).run()

    def _connect(self) -> None:
        try:
            conn = connect_retry(self.hub, self.connect_timeout, interval_s=0.1, what="the shard hub")
        except OSError as exc:
            raise NormExchangeError(f"shard {self.shard}: cannot reach the shard hub at "
                                    f"{self.hub[0]}:{self.hub[1]}: {exc}") from None
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = _recv_exact(conn, auth.NONCE_BYTES, "shard hub", self.timeout)
        self._send(conn, nonce, 0, self.shard, 0.0)  # the introduction: round 0, our shard
        self.conn = (conn, nonce)

    def total(self, round_no: int, sq_norm: float) -> float:
        """The sum of every shard's squared norm of round ``round_no``, given this shard's."""
        if self.shards == 1:
            return sq_norm
        if self.shard == 0:
            if len(self.peers) < self.shards - 1:
                self._accept_peers()
            values = [sq_norm]
            for shard, (conn, nonce) in sorted(self.peers.items()):
                got, value = self._recv(conn, nonce, round_no, f"shard server {shard}")
                if got != shard:
                    raise NormExchangeError(f"shard server {shard} sent as shard {got}")
                values.append(value)
            total = sum_sq_norms(values)
            for shard, (conn, nonce) in self.peers.items():
                self._send(conn, nonce, round_no, 0, total)
            return total
        if self.conn is None:
            self._connect()
        assert self.conn is not None
        conn, nonce = self.conn
        self._send(conn, nonce, round_no, self.shard, sq_norm)
        _, total = self._recv(conn, nonce, round_no, "shard hub")
        return total

    def close(self) -> None:
        for conn, _ in self.peers.values():
            conn.close()
        self.peers.clear()
        if self.conn is not None:
            self.conn[0].close()
            self.conn = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None


class _HubDoor(AcceptLoop):
    """The norm hub's listener: a shard server in is a peer of the exchange; a refusal is a close,
    counted in ``exchange.refused`` (the first :data:`LOGGED_REFUSALS` logged, as the server's are)."""

    def __init__(self, exchange: NormExchange, gate: HubGate) -> None:
        assert exchange.listener is not None
        super().__init__(exchange.listener, gate)
        self.exchange = exchange

    def admitted(self, conn: socket.socket, event: WorkerVerified | ShardVerified) -> None:
        assert isinstance(event, ShardVerified)
        self.exchange.peers[event.shard] = (conn, event.nonce)

    def count(self, refusal: Refuse) -> None:
        x = self.exchange
        x.refused += 1
        if x.refused <= LOGGED_REFUSALS:  # a flood is counted, not logged line by line (as the server's)
            log.warning("shard hub: connection from %s:%s closed: %s%s", refusal.addr[0], refusal.addr[1],
                        refusal.why, " (further ones are counted, not logged)" if x.refused == LOGGED_REFUSALS else "")

    def summary(self) -> None:
        if self.exchange.refused > LOGGED_REFUSALS:
            log.warning("shard hub: closed %d connections that were no shard server's", self.exchange.refused)

    def overdue(self, why: str) -> BaseException:
        return NormExchangeError(f"shard hub: {why}")

    def ending(self, failure: BaseException | None) -> str:
        return "the hub has its shard servers" if self.gate.done else "the hub stopped waiting"


def _recv_exact(conn: socket.socket, n: int, who: str, timeout: float) -> bytes:
    conn.settimeout(timeout)
    buf = b""
    while len(buf) < n:
        try:
            part = conn.recv(n - len(buf))
        except socket.timeout:
            raise NormExchangeError(f"{who}: silent for {timeout:g} s in the norm exchange") from None
        except OSError as exc:
            raise NormExchangeError(f"{who}: {exc}") from None
        if not part:
            raise NormExchangeError(f"{who}: connection closed during the norm exchange")
        buf += part
    return buf


class ShardedWorker:
    """A worker of the sharded mode: one :class:`~dblp.transport.worker.Worker` per shard server, driven at
    once (one thread each: their C send and receive loops release the GIL), each sending and
    receiving its shard in place in the caller's buffers.

    ``servers``: the shard servers' (HOST, PORT), shard j's at index j. ``records``: one merged
    record per round (:func:`merge_records`). ``local_shard``: the shard whose server runs on this
    host, whose share then moves through shared memory (:mod:`dblp.transport.hostlocal`) instead of the
    network: an index, None (none), or ``"auto"`` (:func:`local_shard`). Other keywords go to every
    shard's Worker."""

    def __init__(self, servers: Sequence[tuple[str, int]], *, elements: int, records: str | None = None,
                 local_shard: int | str | None = "auto", **kw: Any) -> None:
        if len(servers) < 2:
            raise ParameterError(f"the sharded mode needs at least 2 shard servers, got {len(servers)}")
        self.bounds = shard_bounds(elements, len(servers))
        self.elements = elements
        if local_shard == "auto":
            local_shard = find_local_shard(servers, kw.get("worker_id", -1))
        elif local_shard is not None and not 0 <= int(local_shard) < len(servers):
            raise ParameterError(f"local shard {local_shard} is not one of the {len(servers)} shards")
        self.local_shard = local_shard
        self.shards = [Worker(h, p, elements=b - a, local=j == local_shard, **kw)
                       for j, ((h, p), (a, b)) in enumerate(zip(servers, self.bounds))]
        self.staging = HostStaging(elements)
        self._pool = ThreadPoolExecutor(len(servers), thread_name_prefix="dblp-shard")
        self._writer = RecordWriter(records)
        self._results = ResultPool(elements)
        self.last_record: RoundRecord | None = None

    @property
    def worker_id(self) -> int:
        return self.shards[0].worker_id

    @property
    def round(self) -> int:
        return self.shards[0].round

    def connect(self) -> "ShardedWorker":
        for f in [self._pool.submit(w.connect) for w in self.shards]:
            f.result()
        ids = {w.worker_id for w in self.shards}
        if len(ids) != 1:
            raise ParameterError(f"the shard servers gave this worker different ids {sorted(ids)}: give --id")
        return self

    def allreduce(self, x: Any) -> Any:
        """Send ``x``'s shards to their servers and receive the averaged shards, all at once;
        returns the averaged tensor (zero-filled where a shard's chunks stayed lost)."""
        staged = self.staging.stage(x)
        out = staged.recv if staged.recv is not None else self._results.take()
        futures = [self._pool.submit(w.allreduce, staged.send[a:b], out=out[a:b])
                   for w, (a, b) in zip(self.shards, self.bounds)]
        for f in futures:
            f.result()
        self.last_record = merge_records([w.last_record for w in self.shards])
        self.last_record.extra["local_shard"] = self.local_shard  # its share moved in memory (dblp.transport.hostlocal)
        self._writer.write(self.last_record)
        return staged.restore(out)

    def close(self, reason: str = "worker done") -> None:
        for w in self.shards:
            w.close(reason)
        self._pool.shutdown(wait=False)
        self._writer.close()

    def __enter__(self) -> "ShardedWorker":
        return self.connect()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close(failed_reason(exc))  # a failure BYE to every shard server when leaving with an error


def find_local_shard(servers: Sequence[tuple[str, int]], worker_id: int = -1) -> int | None:
    """The shard whose server is on this host, by its address: one this host can bind to. With
    several such (every server on one loopback address), the worker's own index if given - the
    launchers put shard j's server on worker j's host - else None: the network path for all."""
    mine = [j for j, (host, _) in enumerate(servers) if _is_own_address(host)]
    if len(mine) == 1:
        return mine[0]
    return worker_id if worker_id in mine else None


def _is_own_address(host: str) -> bool:
    """Whether ``host`` is an address of this host (its network namespace): the kernel routes a
    datagram to a local address from that same address (a bind test would pass any address where
    ``ip_nonlocal_bind`` is set)."""
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0] == s.getpeername()[0]
    except OSError:
        return False


def shard_hub_port(port: int) -> int:
    """The hub's default port beside a shard server's control port (0 stays 0: any free one)."""
    return 0 if port == 0 else (port + 1 if port < 65535 else port - 1)

