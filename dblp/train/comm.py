"""DDP over DBLP in one line: the communication hook, this rank's worker, and the server.

A ``DistributedDataParallel`` script launched with ``torchrun`` changes two lines::

    from dblp.train import DBLPComm                          # 1
    model = DistributedDataParallel(model)
    comm = DBLPComm(model, policy="dblp", records="runs/ddp")  # 2 (closed at exit, or `with DBLPComm(...)`)

:class:`DBLPComm` registers :func:`dblp.train.ddp.exchange_hook` on the model,
so each iteration's gradient goes through one DBLP round instead of DDP's
all-reduce; on rank 0 it also starts the DBLP parameter server (``python -m
dblp server`` as a child process: its own interpreter, so its datagram loop
never competes with training for the GIL) for the world size the process
group knows. Every rank learns the server's address from rank 0 over the
process group (a broadcast), so a server that failed to start is reported on
every rank at once instead of as a connect timeout.

Why a context manager: the server ends cleanly only when every worker says
goodbye. A worker that just exits resets its connection and the server
stops with "control connection failed: Connection reset by peer" (exit
code 2). :meth:`DBLPComm.close` (called by ``with``, and at interpreter exit
as a fallback) says goodbye and, on rank 0, waits for the server and checks
that it exited 0.

The server listens on :data:`dblp.protocol.control.DEFAULT_PORT` (29600: torch's
rendezvous uses 29500) of rank 0's host; workers reach it at ``MASTER_ADDR``,
which torchrun sets to rank 0's node. ``port=0`` picks a free port.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch.distributed as dist

from dblp.protocol.control import DEFAULT_PORT
from dblp.protocol.auth import SECRET_ENV, new_secret
from dblp.runs.launch import LISTENING_RE, LocalRunner, RunArgs, server_argv, tail
from dblp.protocol.policy import run_policy
from dblp.train.ddp import ExchangeHookState, exchange_hook
from dblp.train.exchange import AllreduceExchange
from dblp.transport.watch import end_process_group
from dblp.transport.worker import failed_reason
from dblp.transport.udp import is_loopback
from dblp.protocol.wire import AUTO_MTU, ParameterError

__all__ = ["DBLPComm", "DBLPCommError"]

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the dblp package
_POLICY_KW = ("p", "p_low", "p_high", "eta", "freq")


class DBLPCommError(RuntimeError):
    """The DBLP server could not start, or did not end cleanly."""


class DBLPComm:
    """DBLP as DDP's gradient exchange: hook, worker and (on rank 0) server, closed together.

    ``model``: a ``DistributedDataParallel`` module (its process group must be initialized).
    ``policy`` (``reliable``, ``baseline``/``fixed``, ``dblp``) and ``p`` (= ``p_low``),
    ``p_high``, ``eta``, ``freq``: the server's tolerance policy
    (:func:`dblp.protocol.policy.run_policy`). ``records``: a folder for ``server.jsonl`` (the
    server's round records), ``worker<rank>.jsonl`` and ``server.log``; None writes no
    records. ``server_host``: where the workers reach rank 0 (default ``MASTER_ADDR``, else
    127.0.0.1). ``peer_timeout``: the longest pause between two iterations (evaluation,
    checkpointing) before the server gives a silent rank up. ``server_args``: further
    ``python -m dblp server`` flags (e.g. ``["--pace", "900M"]``). ``timeout``: seconds to
    wait for the server to start and to end. ``local``: a rank on the server's host moves its
    gradient through a shared-memory slot instead of UDP datagrams (:mod:`dblp.transport.hostlocal`; the
    rounds, tolerances and control messages are the same, nothing is lost on that path) -
    ``"auto"`` (the default) when the server's address is one of this host's, ``True``, or
    ``False`` (datagrams even on one host: to measure DBLP's own data path, to lose datagrams
    to an emulated path on loopback, or where ranks share rank 0's address but not its
    ``/dev/shm``, as containers of one pod may - the server then refuses the slot).
    ``compensation``: the loss compensation and stop rule (:mod:`dblp.protocol.compensation`), a
    :class:`~dblp.protocol.compensation.Compensation` or its label (``"unbiased+fill-local"``,
    ``"stop-once"``...); None keeps the paper's zero-fill and early stop.
    """

    def __init__(self, model: Any, *, policy: str = "dblp", records: str | os.PathLike | None = None,
                 port: int = DEFAULT_PORT, server_host: str | None = None, peer_timeout: float = 600.0,
                 server_args: Sequence[str] = (), timeout: float = 60.0, local: bool | str = "auto",
                 compensation: Any = None, **policy_kw: float) -> None:
        unknown = set(policy_kw) - set(_POLICY_KW)
        if unknown:
            raise TypeError(f"unknown policy parameter(s) {sorted(unknown)}; known: {', '.join(_POLICY_KW)}")
        if "p" in policy_kw:
            policy_kw.setdefault("p_low", policy_kw.pop("p"))
        from dblp.protocol.compensation import Compensation

        try:
            flags = run_policy(policy, **policy_kw).flags()  # checks every value, by name
            # the loss compensation and stop rule (dblp.protocol.compensation): an object, a label such as
            # "unbiased+fill-local", or None for the paper's zero-fill and early stop
            comp = compensation if isinstance(compensation, Compensation) else \
                Compensation.from_label(compensation) if compensation else Compensation()
        except ParameterError as exc:
            raise ValueError(str(exc)) from None
        flags = flags + comp.flags()
        if not 0 <= port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        if not peer_timeout > 0:
            raise ValueError(f"peer_timeout must be positive, got {peer_timeout}")
        if local not in (True, False, "auto"):
            raise ValueError(f"local must be True, False or 'auto', got {local!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DBLPComm needs an initialized torch.distributed process group "
                               "(dist.init_process_group, as DistributedDataParallel does)")
        from dblp.transport.worker import Worker  # numpy-only, but keep `import dblp.train` light

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.records_dir = Path(records) if records is not None else None
        self.timeout = timeout
        self.server: subprocess.Popen | None = None
        self._log: Path | None = None
        self._closed = False
        host = server_host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        if self.records_dir is not None:  # a rerun into the same folder replaces its files (writers append)
            self.records_dir.mkdir(parents=True, exist_ok=True)
            (self.records_dir / f"worker{self.rank}.jsonl").unlink(missing_ok=True)
            if self.rank == 0:
                (self.records_dir / "server.jsonl").unlink(missing_ok=True)
                # what made these records: the policy, the world, the commit and the package versions
                from dblp.cli.provenance import write_config

                write_config(self.records_dir, {"policy": policy, **policy_kw, "compensation": comp.to_dict(),
                                                "server_args": list(server_args),
                                                "world_size": self.world, "peer_timeout": peer_timeout})
        status: list[Any] = [None]
        if self.rank == 0:
            # the run's secret goes to the ranks over torch's own rendezvous (as torchrun's store does)
            secret = new_secret()
            try:
                status[0] = ("ok", self._start_server(port, flags, peer_timeout, server_args, host, secret), secret)
            except DBLPCommError as exc:
                status[0] = ("error", str(exc), "")
        dist.broadcast_object_list(status, src=0)
        kind, value, secret = status[0]
        if kind != "ok":
            raise DBLPCommError(f"rank {self.rank}: the DBLP server on rank 0 did not start: {value}")
        self.server_addr = (host, int(value))
        elements = sum(p.numel() for p in model.parameters() if p.requires_grad)
        wrec = str(self.records_dir / f"worker{self.rank}.jsonl") if self.records_dir is not None else None
        if local == "auto":  # the server's address is this host's: its data need not cross a socket
            from dblp.transport.shard import find_local_shard

            local = find_local_shard([self.server_addr]) == 0
        self.local = bool(local)
        try:
            self.worker = Worker(host, int(value), elements=elements, worker_id=self.rank, records=wrec,
                                 source="hosts", connect_timeout=timeout, secret=bytes.fromhex(secret),
                                 local=self.local).connect()
        except Exception:
            self._stop_server()
            raise
        self.state = ExchangeHookState(AllreduceExchange(self.worker))
        model.register_comm_hook(self.state, exchange_hook)
        atexit.register(self._close_at_exit)

    # -- the server (rank 0) -------------------------------------------------------------------
    def _start_server(self, port: int, policy_flags: list[str], peer_timeout: float,
                      extra: Sequence[str], host: str, secret: str) -> int:
        if port == 0:
            with socket.socket() as s:  # a free port (TCP; the server's UDP socket takes the same number)
                s.bind(("", 0))
                port = s.getsockname()[1]
        # A server on a loopback address has every rank on this host, on lo: its datagrams are sized
        # for lo (--mtu auto; a 10,762-parameter gradient is then 2 datagrams, not 31). Elsewhere the
        # server's default (1500): ranks on other hosts may have smaller paths than its own link.
        # A --mtu in server_args comes later on the command line and wins.
        args = RunArgs(workers=self.world, iterations=None, model=0, policy=policy_flags, source="hosts",
                       peer_timeout_s=peer_timeout, plain=False, port=port, server_extra=list(extra),
                       mtu=AUTO_MTU if is_loopback(host) else None)
        records = self.records_dir / "server.jsonl" if self.records_dir is not None else None
        if self.records_dir is not None:
            self._log = self.records_dir / "server.log"
        else:
            fd, name = tempfile.mkstemp(prefix="dblp-server-", suffix=".log")
            os.close(fd)
            self._log = Path(name)
        argv = server_argv(args, records, bind=host)
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
               SECRET_ENV: secret}
        with open(self._log, "w", encoding="utf-8") as log:
            self.server = LocalRunner().popen("rank0", argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout
        while not LISTENING_RE.search(self._log.read_text(encoding="utf-8", errors="replace")):
            if self.server.poll() is not None:
                raise DBLPCommError(f"`{' '.join(argv[1:])}` exited with {self.server.returncode}:\n"
                                    f"{tail(self._log)}")
            if time.monotonic() > deadline:
                self._stop_server()
                raise DBLPCommError(f"`{' '.join(argv[1:])}` did not listen within {self.timeout:g} s")
            time.sleep(0.05)
        return port

    def _stop_server(self) -> None:
        if self.server is not None:
            end_process_group(self.server, 5.0)

    # -- closing -------------------------------------------------------------------------------
    def close(self, reason: str = "training done") -> None:
        """Say goodbye to the server; on rank 0 wait for it to end and check it exited 0."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        self.worker.close(reason)
        if self.server is None:
            return
        try:
            rc = self.server.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self._stop_server()
            raise DBLPCommError(f"the DBLP server did not end within {self.timeout:g} s of the workers "
                                f"leaving; log: {self._log}") from None
        if rc != 0:
            raise DBLPCommError(f"the DBLP server exited with {rc}; log {self._log}:\n{tail(self._log)}")

    def _close_at_exit(self) -> None:
        try:
            self.close("process exiting")
        except Exception as exc:  # noqa: BLE001 - at exit, report instead of a traceback
            print(f"dblp: {exc}", file=sys.stderr)

    def __enter__(self) -> "DBLPComm":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        self._closed = True  # training failed: leave, stop the server, let the error through
        atexit.unregister(self._close_at_exit)
        # a failure BYE for an error (the server applies --on-worker-loss), not a goodbye
        self.worker.close(failed_reason(exc) if isinstance(exc, Exception) else "training stopped")
        self._stop_server()

    @property
    def round_records(self) -> list[dict[str, Any]]:
        """Per-iteration records of the hook (round, buckets, latency, tolerance...)."""
        return self.state.records
