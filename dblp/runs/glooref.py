"""The gloo reference: ``torch.distributed`` gloo all-reduce ranks that a DBLP round is timed against.

Each rank is one ``scenarios/gloo_allreduce.py`` process (its docstring states the line protocol:
a ``ready`` line, then JSON commands on stdin, ``done``/``error`` lines on stdout). :class:`GlooRanks`
starts one rank on each of a list of hosts - namespace hosts (:class:`emulation.nshosts.NsHost`), or
:class:`LocalHost` for loopback - and commands them: every rank of a run starts at one wall-clock
instant, so a time can be taken from that common start to the last rank done (:meth:`GlooRanks.run`
and ``collect``, as ``scenarios/benchmark.py`` times it) or from the first rank's start
(:meth:`GlooRanks.allreduce_s`, as ``scenarios/bench_loopback.py`` times it).
:func:`loopback_median_s` is the loopback figure the benchmark's targets divide by.

Why one module: the benchmark and the loopback bench compare DBLP with the same yardstick, so the
ranks are started and read one way.
"""

from __future__ import annotations

import json
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Sequence

__all__ = ["GLOO_RANK", "GlooError", "GlooRanks", "LocalHost", "free_port", "loopback_median_s"]

#: the rank program (one process per rank)
GLOO_RANK = Path(__file__).resolve().parents[2] / "scenarios" / "gloo_allreduce.py"


class GlooError(RuntimeError):
    """A rank reported an error, exited, or answered out of turn."""


class LocalHost:
    """This machine as a gloo rank's host (loopback): :class:`GlooRanks` on 127.0.0.1.

    ``new_session``: each rank in a session of its own (a Ctrl-C at the terminal reaches the
    parent only, which then quits the ranks itself)."""

    ip = "127.0.0.1"
    name = "local"

    def __init__(self, new_session: bool = True) -> None:
        self.new_session = new_session

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        if self.new_session:
            kw.setdefault("start_new_session", True)
        return subprocess.Popen(argv, **kw)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (rank 0's rendezvous)."""
    with socket.socket() as sk:
        sk.bind((host, 0))
        return sk.getsockname()[1]


class GlooRanks:
    """gloo ranks, one on each of ``hosts`` (anything with ``popen(argv, **kw)`` and ``ip``), bound to
    ``iface`` there; rank 0's address and ``port`` are the rendezvous.

    ``logdir``: each rank's stderr goes to ``gloo-rank<r>.log`` there (None: this process's stderr);
    ``env`` and ``cwd`` are the ranks' (None: this process's). A reader thread per rank queues its
    lines, so :meth:`collect` waits with a timeout.
    """

    def __init__(self, hosts: Sequence, port: int, timeout: float, logdir: Path | None = None,
                 iface: str = "eth0", *, env: dict | None = None, cwd: Path | None = None) -> None:
        self.workers = list(hosts)
        self.q: queue.Queue = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.logs: list[IO] = []
        init = f"tcp://{self.workers[0].ip}:{port}"
        for r, w in enumerate(self.workers):
            lf = None
            if logdir is not None:
                lf = open(logdir / f"gloo-rank{r}.log", "w")
                self.logs.append(lf)
            p = w.popen([sys.executable, str(GLOO_RANK), "--rank", str(r), "--world-size", str(len(self.workers)),
                         "--init", init, "--iface", iface, "--timeout", f"{timeout!r}s"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=lf, text=True, env=env, cwd=cwd)
            self.procs.append(p)
            threading.Thread(target=self._reader, args=(r, p), daemon=True).start()

    def _reader(self, rank: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            try:
                self.q.put((rank, json.loads(line)))
            except ValueError:
                pass
        self.q.put((rank, {"event": "exit"}))

    def collect(self, event: str, tag: str | None, timeout: float) -> dict[int, dict]:
        """Every rank's ``event`` line (of ``tag``, unless None), by rank; TimeoutError when not all
        came within ``timeout`` s, :class:`GlooError` when a rank failed or exited."""
        got: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self.workers):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"gloo: {len(got)}/{len(self.workers)} ranks answered {event} {tag or ''} in {timeout:.0f} s")
            try:
                rank, msg = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if msg.get("event") in ("error", "exit"):
                raise GlooError(f"gloo rank {rank}: {msg.get('error', 'exited')}")
            if msg.get("event") == event and (tag is None or msg.get("tag") == tag):
                got[rank] = msg
        return got

    def send(self, msg: dict) -> None:
        for p in self.procs:
            try:
                p.stdin.write(json.dumps(msg) + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def run(self, tag: str, elements: int, lead: float = 0.05) -> tuple[float, float]:
        """Start one all-reduce of ``elements`` floats on every rank ``lead`` s from now; returns
        (the common start, 0.0). Its ``done`` lines come through :meth:`collect`."""
        start = time.time() + lead
        self.send({"cmd": "run", "tag": tag, "elements": elements, "start": start})
        return start, 0.0

    def allreduce_s(self, elements: int, tag: str, timeout: float) -> float:
        """One all-reduce, every rank starting at one instant: the first rank's start to the last rank done."""
        self.run(tag, elements)
        done = self.collect("done", tag, timeout).values()
        return max(d["t_end"] for d in done) - min(d["t_start"] for d in done)

    def close(self) -> None:
        self.send({"cmd": "quit"})
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for f in self.logs:
            f.close()


def loopback_median_s(elements: int, workers: int, *, rounds: int, warmup: int, timeout: float,
                      logdir: Path, env: dict | None = None, cwd: Path | None = None) -> float:
    """Median of ``rounds`` gloo all-reduces (after ``warmup``) among ``workers`` local ranks, each
    timed from the common start to the last rank done (rank 0 on a free port of 127.0.0.1)."""
    logdir.mkdir(parents=True, exist_ok=True)
    ranks = GlooRanks([LocalHost()] * workers, free_port(), timeout, logdir, iface="lo", env=env, cwd=cwd)
    times = []
    try:
        ranks.collect("ready", None, 120)
        for i in range(warmup + rounds):
            start, _ = ranks.run(f"r{i}", elements)
            got = ranks.collect("done", f"r{i}", timeout + 10)
            if i >= warmup:
                times.append(max(m["t_end"] for m in got.values()) - start)
    finally:
        ranks.close()
    return statistics.median(times)
