"""Start a DBLP server and its workers: one interface for local, namespace, Mininet and ssh hosts.

It sits in :mod:`dblp` (below the emulation) so the loopback timer, the
training scenario and the DDP entry start their processes the same way as
the emulation scenarios and the real-host launcher do.

Why one: the microburst, trace-replay, cross-check and benchmark scenarios
and the real-host launcher each wrote their own ``python -m dblp server`` /
``worker`` command lines, their own wait for the server and their own
teardown, and they drifted (flag names, what a failure reports). Here:

* :class:`RunArgs` and :func:`server_argv` / :func:`worker_argv`: the one
  place that writes the programs' command lines (flags of
  :mod:`dblp.cli.commands`, units stated: ``--pace 900000000bit``, ``--compute 5ms``);
* :class:`Runner`: where a program runs - anything with
  ``popen(host, argv, env=..., **popen_kw)`` and ``address(host)``:
  :class:`emulation.net.EmuNet` (Mininet hosts), :class:`emulation.nshosts.NsNet`
  (namespace hosts), :class:`LocalRunner` (processes on loopback) and the
  ssh/netns/local transports of :mod:`emulation.hosts` (``TransportRunner``);
* :class:`Launch`: a server and its workers (``python -m dblp worker``, or
  any worker program such as the training worker ``python -m dblp.train
  worker``) on a runner - started in order
  (the workers once the server says it listens), watched, and ended on
  exit, whatever happened; a failure names the process and shows its log.

The iteration clock of a run is :class:`dblp.transport.watch.RoundWatcher`;
:func:`emulation.launch.run_with_bursts` puts the three together for the
Mininet scenarios (one policy on a star, a burst schedule switched at
iteration starts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Protocol, Sequence

from dblp.protocol.auth import SECRET_ENV, new_secret
from dblp.protocol.control import DEFAULT_PORT
from dblp.transport.shard import shard_hub_port
from dblp.transport.watch import end_process_group

__all__ = ["RunArgs", "server_argv", "worker_argv", "train_worker_argv", "Runner", "LocalRunner", "Launch", "LaunchError",
           "LISTENING_RE", "tail"]

#: what ``python -m dblp server`` prints once it accepts workers (group 1: the port)
LISTENING_RE = re.compile(r"listening on \S+:(\d+)")
#: what shard 0's server prints in the sharded mode (group 1: its norm exchange's port)
HUB_RE = re.compile(r"shard hub on \S+:(\d+)")


class LaunchError(RuntimeError):
    """A server or worker failed or did not finish in time; the message carries its log's tail."""


@dataclass
class RunArgs:
    """What a server and its workers are told (one run of one policy)."""

    workers: int
    iterations: int | None  # rounds the server serves and each worker runs (None: until the workers leave)
    model: str | int  # gradient size: a model name or an element count
    policy: list[str]  # the server's policy flags (dblp.protocol.policy.run_policy(...).flags())
    source: str = "emulation"  # the records' source tag
    pace_bps: float | None = None  # sender pacing, bit/s (None = self-pacing, 0 = unpaced)
    seed: int = 0
    compute_s: float = 0.0  # the workers' simulated compute per iteration
    peer_timeout_s: float = 60.0
    plain: bool = True  # no UDP GSO/GRO (a drop rule would drop whole super-packets)
    port: int = DEFAULT_PORT
    mtu: int | str | None = None  # link bytes or "auto" (the server's --mtu; None: its default)
    python: str = sys.executable
    insecure: bool = False  # the paper's unauthenticated wire; else a secret per launch in $DBLP_SECRET
    aggregation: str = "server"  # "server" (the paper) | "sharded": a shard server on each worker host (dblp.transport.shard)
    server_extra: list[str] = field(default_factory=list)
    worker_extra: list[str] = field(default_factory=list)


def _pace(a: RunArgs) -> str:
    """``--pace``'s value: ``auto`` (self-pacing) or the rate with its unit."""
    return "auto" if a.pace_bps is None else f"{a.pace_bps:.0f}bit"


def _common(a: RunArgs) -> list[str]:
    out = ["--iterations", str(a.iterations)] if a.iterations is not None else []
    out += ["--seed", str(a.seed), "--pace", _pace(a), "--peer-timeout", f"{a.peer_timeout_s:g}s"]
    return out + (["--plain"] if a.plain else []) + (["--insecure"] if a.insecure else [])


def server_argv(a: RunArgs, records: str | os.PathLike | None, *, bind: str | None = None,
                port: int | None = None) -> list[str]:
    """``python -m dblp server ...`` of a run (records to ``records``; ``port`` 0: any free one)."""
    argv = [a.python, "-m", "dblp", "server", "--port", str(a.port if port is None else port),
            "--workers", str(a.workers), "--source", a.source, *_common(a)]
    if bind:
        argv += ["--host", bind]
    if records is not None:
        argv += ["--records", str(records)]
    if a.mtu:
        argv += ["--mtu", str(a.mtu)]
    return argv + a.server_extra + list(a.policy)


def worker_argv(a: RunArgs, wid: int, server: str, records: str | os.PathLike | None, *,
                program: Sequence[str] = ("-m", "dblp", "worker")) -> list[str]:
    """The worker ``wid`` of a run, reaching the server at ``server`` (HOST:PORT).

    ``program``: what runs after the interpreter (the host launcher's agent
    takes the same flags)."""
    argv = [a.python, *program, "--server", server, "--id", str(wid), "--model", str(a.model),
            "--source", a.source, "--compute", f"{a.compute_s * 1e3:g}ms", *_common(a)]
    if records is not None:
        argv += ["--records", str(records)]
    return argv + a.worker_extra


def train_worker_argv(a: RunArgs, train: dict, wid: int, server: str, records: str | os.PathLike,
                      out: str | os.PathLike) -> list[str]:
    """A real training worker (``python -m dblp.train worker``) of a run: ``train`` holds the
    workload and epochs, optionally ``iterations_per_epoch`` (a cap), ``data_root``, ``data``/``data_size``
    (a teacher-labelled synthetic set), ``device`` (cpu/cuda; several workers may share one GPU),
    ``save_weights``, ``eval_every`` (test every N iterations) and ``progress``
    (:func:`dblp.cli.args.check_workload_args`); ``out`` its folder."""
    argv = [a.python, "-m", "dblp.train", "worker", "--server", server, "--id", str(wid), "--workers", str(a.workers),
            "--workload", train["workload"], "--epochs", str(train["epochs"]), "--seed", str(a.seed),
            "--out", str(out), "--records", str(records), "--source", a.source,
            "--peer-timeout", f"{a.peer_timeout_s:g}s", "--pace", _pace(a), "--threads", "1"]
    if train.get("iterations_per_epoch"):
        argv += ["--max-iters-per-epoch", str(train["iterations_per_epoch"])]
    if train.get("data_root"):
        argv += ["--data-root", str(train["data_root"])]
    if train.get("data", "real") != "real":
        argv += ["--data", train["data"]] + (["--data-size", str(train["data_size"])] if train.get("data_size") else [])
    if train.get("device"):
        argv += ["--device", str(train["device"])]
    if train.get("save_weights"):
        argv.append("--save-weights")
    if train.get("eval_every"):
        argv += ["--eval-every", str(train["eval_every"])]
    if train.get("progress"):
        argv.append("--progress")
    return argv + (["--plain"] if a.plain else []) + (["--insecure"] if a.insecure else []) + a.worker_extra


class Runner(Protocol):
    """Where programs run: a host by name, and the address other hosts reach it at."""

    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw: Any) -> subprocess.Popen: ...

    def address(self, host: str) -> str: ...


class LocalRunner:
    """Every "host" is this machine; processes talk over loopback (no root, no loss rules).

    ``prefix`` goes before every command (e.g. ``ip netns exec NAME``: one namespace for all)."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = list(prefix)

    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw: Any) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.prefix + list(argv), env={**os.environ, **(env or {})}, **kw)

    def address(self, host: str) -> str:
        return "127.0.0.1"


class Launch:
    """A server on ``server`` and one worker per name of ``workers``, on ``runner``.

    Records go to ``records_dir`` (``server.jsonl``, ``worker<i>.jsonl``),
    every process's output to ``log_dir`` (``server.log``, ``worker<i>.log``).
    Each launch is authenticated with a fresh secret handed to every process
    in ``$DBLP_SECRET`` (as torchrun hands out its rendezvous), unless
    ``args.insecure`` or the caller's ``env`` names one; the server listens on
    the address the workers reach it at (``bind``, else the runner's address
    of its host), not on every interface.
    The workers start once the server has printed that it listens (or after
    ``listen_timeout_s`` a :class:`LaunchError`). Use as a context manager:
    leaving it ends every process still running.
    """

    def __init__(self, runner: Runner, server: str, workers: Sequence[str], args: RunArgs, *,
                 records_dir: str | os.PathLike, log_dir: str | os.PathLike, env: dict | None = None,
                 cwd: str | os.PathLike | None = None, bind: str | None = None,
                 listen_timeout_s: float = 60.0,
                 worker_program: Callable[[int, str, Path], list[str]] | None = None) -> None:
        if len(workers) != args.workers:
            raise ValueError(f"{len(workers)} worker hosts for {args.workers} workers")
        self.runner, self.server, self.workers, self.args = runner, server, list(workers), args
        self.records_dir, self.log_dir = Path(records_dir), Path(log_dir)
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        if not args.insecure and not self.env.get(SECRET_ENV):
            self.env[SECRET_ENV] = new_secret()
        self.cwd, self.bind, self.listen_timeout_s = cwd, bind, listen_timeout_s
        self.worker_program = worker_program
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []  # (name, process, log)
        self._logs: list[IO[str]] = []
        self.port: int | None = None

    @property
    def server_records(self) -> Path:
        return self.records_dir / "server.jsonl"

    def _start(self, name: str, host: str, argv: list[str]) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        fh = open(log, "w", encoding="utf-8")
        self._logs.append(fh)
        kw: dict[str, Any] = {"stdout": fh, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
        if self.cwd is not None:
            kw["cwd"] = str(self.cwd)
        p = self.runner.popen(host, argv, env=self.env, **kw)
        self.procs.append((name, p, log))
        return p

    def _wait_line(self, name: str, proc: subprocess.Popen, pattern: re.Pattern) -> int:
        """The number the server ``name`` prints in ``pattern``'s group 1 (its port), once printed."""
        log = self.log_dir / f"{name}.log"
        deadline = time.monotonic() + self.listen_timeout_s
        while True:
            m = pattern.search(log.read_text(encoding="utf-8", errors="replace"))
            if m:
                return int(m.group(1))
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LaunchError(f"the {name} on {self._host(name)} did not start listening "
                                  f"(exit code {proc.poll()}):\n{tail(log)}")
            time.sleep(0.02)

    def start(self) -> "Launch":
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        a = self.args
        if a.aggregation == "sharded":
            return self._start_sharded()
        bind = self.bind or self.runner.address(self.server)
        sp = self._start("server", self.server, server_argv(a, self.server_records, bind=bind))
        self.port = self._wait_line("server", sp, LISTENING_RE)
        self._start_workers(f"{self.runner.address(self.server)}:{self.port}")
        return self

    def _start_sharded(self) -> "Launch":
        """The sharded mode: shard j's server on worker host j (records ``server.shard<j>.jsonl``),
        shard 0's first (it is the norm exchange's hub), then every worker with all their addresses."""
        a = self.args
        k = len(self.workers)
        addrs = [self.runner.address(h) for h in self.workers]
        shared = len(set(addrs)) < k  # hosts on one address (loopback): one port each
        ports = [0 if a.port == 0 else a.port + (2 * j if shared else 0) for j in range(k)]
        hub_port = a.port + 2 * k if shared and a.port else shard_hub_port(a.port)
        servers: list[str] = []
        hub = ""
        for j, h in enumerate(self.workers):
            argv = server_argv(a, self.records_dir / f"server.shard{j}.jsonl", bind=addrs[j], port=ports[j])
            if self.worker_program is None:  # replayed gradients of a known size (training: the HELLO's)
                argv += ["--model", str(a.model)]
            argv += ["--shards", str(k), "--shard", str(j),
                     "--shard-hub", f"{addrs[0]}:{hub_port}" if j == 0 else hub]
            p = self._start(f"server{j}", h, argv)
            servers.append(f"{_bracket(addrs[j])}:{self._wait_line(f'server{j}', p, LISTENING_RE)}")
            if j == 0:
                hub = f"{addrs[0]}:{self._wait_line('server0', p, HUB_RE)}"
        self.port = int(servers[0].rsplit(":", 1)[1])
        self._start_workers(",".join(servers))
        return self

    def _start_workers(self, addr: str) -> None:
        a = self.args
        for i, h in enumerate(self.workers):
            rec = self.records_dir / f"worker{i}.jsonl"
            argv = self.worker_program(i, addr, rec) if self.worker_program else worker_argv(a, i, addr, rec)
            self._start(f"worker{i}", h, argv)

    def failed(self) -> tuple[str, int, Path] | None:
        """The first process that exited with an error: (name, code, log)."""
        for name, p, log in self.procs:
            rc = p.poll()
            if rc not in (None, 0):
                return name, rc, log
        return None

    def done(self) -> bool:
        return all(p.poll() == 0 for _, p, _ in self.procs)

    def check(self) -> None:
        """Raise :class:`LaunchError` if a process failed."""
        f = self.failed()
        if f is not None:
            raise LaunchError(f"{f[0]} on {self._host(f[0])} exited with {f[1]}; log {f[2]}:\n{tail(f[2])}")

    def wait(self, timeout_s: float, on_poll: Callable[[], None] | None = None) -> None:
        """Wait until every process has exited 0; :class:`LaunchError` on a failure or the timeout.
        ``on_poll`` runs at every look (e.g. to show a worker's progress lines)."""
        deadline = time.monotonic() + timeout_s
        while not self.done():
            if on_poll is not None:
                on_poll()
            self.check()
            if time.monotonic() > deadline:
                running = [n for n, p, _ in self.procs if p.poll() is None]
                raise LaunchError(f"not done after {timeout_s:g} s (still running: {', '.join(running)})")
            time.sleep(0.05)

    def _host(self, name: str) -> str:
        if name == "server":
            return self.server
        if name.startswith("server"):  # shard servers of the sharded mode, on the worker hosts
            return self.workers[int(name.removeprefix("server"))]
        return self.workers[int(name.removeprefix("worker"))]

    def stop(self, grace_s: float = 3.0) -> None:
        """End every process still running (workers first), close the logs. Idempotent."""
        for _, p, _ in reversed(self.procs):
            end_process_group(p, grace_s)
        for fh in self._logs:
            fh.close()
        self._logs.clear()

    def __enter__(self) -> "Launch":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bracket(host: str) -> str:
    """An address as the host part of HOST:PORT (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def tail(path: str | os.PathLike, n: int = 15) -> str:
    """The last ``n`` lines of a log ("" when it does not exist)."""
    try:
        return "".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(True)[-n:])
    except OSError:
        return ""
