"""Start a DBLP server and its workers: one interface for local, namespace, Mininet and ssh hosts.

Why one: the microburst, trace-replay, cross-check and benchmark scenarios
and the real-host launcher each wrote their own ``python -m dblp server`` /
``worker`` command lines, their own wait for the server and their own
teardown, and they drifted (flag names, what a failure reports). Here:

* :class:`RunArgs` and :func:`server_argv` / :func:`worker_argv`: the one
  place that writes the programs' command lines (flags of
  :mod:`dblp.cli`, units stated: ``--pace 900000000bit``, ``--compute 5ms``);
* :class:`Runner`: where a program runs - anything with
  ``popen(host, argv, env=..., **popen_kw)`` and ``address(host)``:
  :class:`emulation.net.EmuNet` (Mininet hosts), :class:`emulation.nshosts.NsNet`
  (namespace hosts), :class:`LocalRunner` (processes on loopback) and the
  ssh/netns/local transports of :mod:`emulation.hosts` (``TransportRunner``);
* :class:`Launch`: a server and its workers on a runner - started in order
  (the workers once the server says it listens), watched, and ended on
  exit, whatever happened; a failure names the process and shows its log.

The iteration clock of a run is :class:`emulation.watch.RoundWatcher`;
:func:`run_with_bursts` puts the three together for the Mininet scenarios
(one policy on a star, a burst schedule switched at iteration starts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, Sequence

from dblp.control import DEFAULT_PORT

from .watch import end_process_group

__all__ = ["RunArgs", "server_argv", "worker_argv", "Runner", "LocalRunner", "Launch", "LaunchError",
           "LISTENING_RE", "run_with_bursts", "run_scenario_policy", "scenario_run_args"]

#: what ``python -m dblp server`` prints once it accepts workers (group 1: the port)
LISTENING_RE = re.compile(r"listening on \S+:(\d+)")


class LaunchError(RuntimeError):
    """A server or worker failed or did not finish in time; the message carries its log's tail."""


@dataclass
class RunArgs:
    """What a server and its workers are told (one run of one policy)."""

    workers: int
    iterations: int
    model: str | int  # gradient size: a model name or an element count
    policy: list[str]  # the server's policy flags (dblp.policy.run_policy(...).flags())
    source: str = "emulation"  # the records' source tag
    pace_bps: float = 0.0  # sender pacing, bit/s (0 = unpaced)
    seed: int = 0
    compute_s: float = 0.0  # the workers' simulated compute per iteration
    peer_timeout_s: float = 60.0
    plain: bool = True  # no UDP GSO/GRO (a drop rule would drop whole super-packets)
    port: int = DEFAULT_PORT
    mtu: int | None = None
    python: str = sys.executable
    server_extra: list[str] = field(default_factory=list)
    worker_extra: list[str] = field(default_factory=list)


def _common(a: RunArgs) -> list[str]:
    out = ["--iterations", str(a.iterations), "--seed", str(a.seed), "--pace", f"{a.pace_bps:.0f}bit",
           "--peer-timeout", f"{a.peer_timeout_s:g}s"]
    return out + (["--plain"] if a.plain else [])


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


class Runner(Protocol):
    """Where programs run: a host by name, and the address other hosts reach it at."""

    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw: Any) -> subprocess.Popen: ...

    def address(self, host: str) -> str: ...


class LocalRunner:
    """Every "host" is this machine; processes talk over loopback (no root, no loss rules)."""

    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw: Any) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, **kw)

    def address(self, host: str) -> str:
        return "127.0.0.1"


class Launch:
    """A server on ``server`` and one worker per name of ``workers``, on ``runner``.

    Records go to ``records_dir`` (``server.jsonl``, ``worker<i>.jsonl``),
    every process's output to ``log_dir`` (``server.log``, ``worker<i>.log``).
    The workers start once the server has printed that it listens (or after
    ``listen_timeout_s`` a :class:`LaunchError`). Use as a context manager:
    leaving it ends every process still running.
    """

    def __init__(self, runner: Runner, server: str, workers: Sequence[str], args: RunArgs, *,
                 records_dir: str | os.PathLike, log_dir: str | os.PathLike, env: dict | None = None,
                 cwd: str | os.PathLike | None = None, bind: str | None = None,
                 listen_timeout_s: float = 60.0) -> None:
        if len(workers) != args.workers:
            raise ValueError(f"{len(workers)} worker hosts for {args.workers} workers")
        self.runner, self.server, self.workers, self.args = runner, server, list(workers), args
        self.records_dir, self.log_dir = Path(records_dir), Path(log_dir)
        self.env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd, self.bind, self.listen_timeout_s = cwd, bind, listen_timeout_s
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

    def start(self) -> "Launch":
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        a = self.args
        sp = self._start("server", self.server, server_argv(a, self.server_records, bind=self.bind))
        log = self.log_dir / "server.log"
        deadline = time.monotonic() + self.listen_timeout_s
        while self.port is None:
            m = LISTENING_RE.search(log.read_text(encoding="utf-8", errors="replace"))
            if m:
                self.port = int(m.group(1))
            elif sp.poll() is not None or time.monotonic() > deadline:
                raise LaunchError(f"the server on {self.server} did not start listening "
                                  f"(exit code {sp.poll()}):\n{tail(log)}")
            else:
                time.sleep(0.02)
        addr = f"{self.runner.address(self.server)}:{self.port}"
        for i, h in enumerate(self.workers):
            self._start(f"worker{i}", h, worker_argv(a, i, addr, self.records_dir / f"worker{i}.jsonl"))
        return self

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

    def wait(self, timeout_s: float) -> None:
        """Wait until every process has exited 0; :class:`LaunchError` on a failure or the timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.done():
            self.check()
            if time.monotonic() > deadline:
                running = [n for n, p, _ in self.procs if p.poll() is None]
                raise LaunchError(f"not done after {timeout_s:g} s (still running: {', '.join(running)})")
            time.sleep(0.05)

    def _host(self, name: str) -> str:
        return self.server if name == "server" else self.workers[int(name.removeprefix("worker"))]

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


def tail(path: str | os.PathLike, n: int = 15) -> str:
    """The last ``n`` lines of a log ("" when it does not exist)."""
    try:
        return "".join(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(True)[-n:])
    except OSError:
        return ""


# -- the emulation scenarios' run: a star, a burst schedule, one policy ----------------------------
#: the server's TCP control port in the emulation scenarios
SCENARIO_PORT = DEFAULT_PORT


def scenario_run_args(a: Any, policy: list[str], *, python: str = sys.executable) -> RunArgs:
    """:class:`RunArgs` from the emulation scenarios' shared flags (``dblp.cliargs.add_run_args``)."""
    from dblp.cliargs import pace_rate

    return RunArgs(workers=a.workers, iterations=a.iterations, model=a.elements, policy=list(policy),
                   source="emulation", pace_bps=pace_rate(a), seed=a.seed, compute_s=a.compute,
                   peer_timeout_s=60.0, plain=not a.gso, port=SCENARIO_PORT, python=python)


def run_with_bursts(net: Runner, lc: Any, args: RunArgs, d: str | os.PathLike, schedule: Sequence[Any], *,
                    targets: Sequence[Any] | None = None, label: str = "", marks: Sequence[int] = (),
                    quiet: bool = False, env: dict | None = None, timeout_s: float | None = None) -> Path:
    """One run on a star (server ``srv``, workers ``w1..wN``) with a burst schedule switched at
    iteration starts (:class:`emulation.bursts.BurstInjector` on ``lc``, clocked by the
    :class:`~emulation.watch.RoundWatcher`). Writes ``d/records/``, ``d/logs/``, ``d/bursts.jsonl``;
    returns ``d``. ``targets``: the schedule's default loss targets (the server's link, UDP, both
    directions). ``marks``: iterations whose start is printed (with every 10th) unless ``quiet``.
    """
    from .bursts import BurstInjector
    from .loss import LossTarget
    from .watch import RoundWatcher

    d = Path(d)
    if targets is None:
        targets = [LossTarget("srv", "ingress", "udp"), LossTarget("srv", "egress", "udp")]
    workers = [f"w{i + 1}" for i in range(args.workers)]
    with BurstInjector(lc, schedule, targets, log_path=d / "bursts.jsonl") as inj:
        inj.on_iteration(0)
        with Launch(net, "srv", workers, args, records_dir=d / "records", log_dir=d / "logs", env=env) as run:
            t0 = time.time()

            def on_round(r: int) -> None:
                inj.on_iteration(r)
                if not quiet and (r % 10 == 0 or r in marks or r - 1 in marks or r == args.iterations):
                    print(f"  {label:9s} iteration {r:5d}/{args.iterations}  "
                          f"({r / max(1e-9, time.time() - t0):.1f} it/s)", flush=True)

            with RoundWatcher(run.server_records, args.workers, on_round):
                run.wait(timeout_s if timeout_s is not None else 60 + args.iterations * 30)
    return d


def run_scenario_policy(name: str, a: Any, net: Runner, lc: Any, out: str | os.PathLike, schedule: Sequence[Any], *,
                        python: str = sys.executable, env: dict | None = None) -> Path:
    """The emulation scenarios' run of the named policy ``name`` (``reliable``/``baseline``/``dblp``)
    with their shared flags ``a``, into ``out/<name>/``."""
    from dblp.policy import run_policy

    flags = run_policy(name, a.p_low, a.p_high, a.eta, a.freq).flags()
    return run_with_bursts(net, lc, scenario_run_args(a, flags, python=python), Path(out) / name, schedule,
                           label=name, marks=getattr(a, "bursts_list", ()), quiet=a.quiet, env=env)
