"""The one round watcher: follows a server's records and says when each iteration starts.

Iteration k starts once the server has written its records of round k-1
for every worker (one JSONL line per worker and round), so counting lines
of the server's ``records.jsonl`` is a clock of the run that needs no
hook in the server: loss bursts keyed by iteration (``BurstInjector``)
and progress lines hang on it. The records are either a local file (the
Mininet and namespace hosts share this machine's file system) or a stream
of lines from a process (``tail -F`` on a remote host, through ssh).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["RoundWatcher", "RoundHookServer", "RoundHookClient", "Tail", "follow", "end_process_group"]


class Tail:
    """The complete lines appended to a file since the last call (the file may not exist yet).

    Reads only what was added, so following a long run costs the same per
    line at its end as at its start; a partial last line waits for its newline.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.pos = 0
        self._buf = b""

    def lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.pos += len(data)
        *lines, self._buf = (self._buf + data).split(b"\n")
        return lines

    def records(self) -> list[dict]:
        """The new lines as JSON objects (records files)."""
        return [json.loads(x) for x in self.lines() if x.strip()]


def follow(path: str | os.PathLike, stop: threading.Event, poll_s: float = 0.001) -> Iterator[bytes]:
    """Complete lines appended to ``path``, as they come, until ``stop`` is set."""
    t = Tail(path)
    while not stop.is_set():
        got = t.lines()
        if got:
            yield from got
        else:
            stop.wait(poll_s)


def end_process_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process's group (a process started with ``start_new_session``: its group id is
    its pid), SIGKILL it after ``grace`` seconds; never raises for a process already gone."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        try:
            proc.terminate()
        except ProcessLookupError:
            return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


class RoundWatcher(threading.Thread):
    """Calls ``on_round(k)`` when iteration k starts (all ``workers`` rows of round k-1 written).

    ``source``: the server's records file (followed by polling every
    ``poll_s``), or a process whose stdout streams its lines (ended by
    :meth:`stop`). When several iterations pass between two looks,
    ``on_round`` gets the latest only (the burst injector logs what it
    missed). A failing hook is reported and the watch goes on.
    """

    def __init__(self, source: str | os.PathLike | subprocess.Popen, workers: int,
                 on_round: Callable[[int], None], *, poll_s: float = 0.001) -> None:
        super().__init__(daemon=True, name="round-watcher")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.source, self.workers, self.on_round, self.poll_s = source, workers, on_round, poll_s
        self.rounds = 0
        self._halt = threading.Event()

    def _lines(self) -> Iterator[bytes]:
        if isinstance(self.source, subprocess.Popen):
            assert self.source.stdout is not None
            return iter(self.source.stdout)
        return follow(self.source, self._halt, self.poll_s)

    def run(self) -> None:
        lines = 0
        for _ in self._lines():
            lines += 1
            r = lines // self.workers
            if r != self.rounds:
                self.rounds = r
                try:
                    self.on_round(r)
                except Exception as exc:  # noqa: BLE001 - a hook must not end the watch
                    print(f"round watcher: hook failed at iteration {r}: {exc}", file=sys.stderr)

    def stop(self) -> None:
        """Stop following (and end the streaming process); waits for the thread."""
        self._halt.set()
        if isinstance(self.source, subprocess.Popen):
            end_process_group(self.source, 5.0)
        if self.is_alive():
            self.join(timeout=5)

    def __enter__(self) -> "RoundWatcher":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RoundHookServer(threading.Thread):
    """The other end of the server's ``--round-hook``: the exact clock of a run.

    The parameter server connects to this Unix socket and sends ``open k``
    before it announces round k to any worker, and ``end k`` once round k's
    broadcast is stopped at every worker, waiting for the reply each time.
    ``on_rounds(first, last)`` runs in between with the rounds now in flight
    (a round opens for the fastest worker while the slowest still receives
    the one before) and returns whether something is active for round
    ``last`` (the server writes that into its records as ``extra["burst"]``).
    Unlike :class:`RoundWatcher`, which learns of a round from records
    already written, nothing of round k is sent before its hook returned, so
    a burst named for round k hits round k from its first datagram to its
    last. A path-based Unix socket reaches across network namespaces
    (Mininet hosts share the file system).

    Several servers may connect (the sharded mode's shard servers, each with
    its own connection, served at once): a round is open once any of them
    opened it, and ended once every connected one has ended it, so a burst
    covers round k on every shard.
    """

    def __init__(self, path: str | os.PathLike, on_rounds: Callable[[int, int], bool | None]) -> None:
        super().__init__(daemon=True, name="round-hook")
        self.path = str(path)
        self.on_rounds = on_rounds
        self.opened = -1  # the last round opened
        self.ended = -1  # the last round ended
        self._halt = threading.Event()
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._lock = threading.Lock()
        self._ends: dict[int, int] = {}  # connection -> the last round it ended

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self._ends[n] = -1
            threading.Thread(target=self._serve, args=(conn, n), daemon=True, name=f"round-hook-{n}").start()
            n += 1

    def _serve(self, conn: socket.socket, cid: int) -> None:
        """One server's connection: each ``open k`` / ``end k`` answered after ``on_rounds``."""
        with conn, conn.makefile("rwb", buffering=0) as fh:
            for line in fh:
                try:
                    what, k = line.split()
                    k = int(k)
                except ValueError:
                    break
                with self._lock:
                    if what == b"open":
                        self.opened = max(self.opened, k)
                    else:
                        self._ends[cid] = max(self._ends[cid], k)
                    self.ended = max(self.ended, min(self._ends.values()))
                    try:
                        active = self.on_rounds(self.ended + 1, self.opened)
                    except Exception as exc:  # noqa: BLE001 - a hook must not stall the server
                        print(f"round hook: failed at {line.decode().strip()}: {exc}", file=sys.stderr)
                        active = None
                fh.write(b"1\n" if active else b"0\n")

    def stop(self) -> None:
        self._halt.set()
        self._sock.close()
        if self.is_alive():
            self.join(timeout=5)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "RoundHookServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RoundHookClient:
    """The server's side of ``--round-hook``: say a round opens or ended, wait for the reply."""

    def __init__(self, path: str, timeout_s: float = 30.0) -> None:
        self.path, self.timeout_s = path, timeout_s
        self._fh = None

    def _say(self, what: str, k: int) -> bool:
        try:
            if self._fh is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout_s)
                sock.connect(self.path)
                self._fh = sock.makefile("rwb", buffering=0)
            self._fh.write(f"{what} {k}\n".encode())
            reply = self._fh.readline()
        except OSError as exc:
            raise OSError(f"round hook {self.path}: {exc}") from exc
        if not reply:
            raise OSError(f"round hook {self.path}: closed before answering '{what} {k}'")
        return reply.strip() == b"1"

    def opening(self, k: int) -> bool:
        """Round ``k`` is about to open; True if the hook says a burst is on for it."""
        return self._say("open", k)

    def ended(self, k: int) -> None:
        self._say("end", k)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
