"""Parse large inputs in forked children, so an event loop keeps answering everyone else.

The server's login loop is one thread; a valid HELLO of the most tensors (~3.3 MiB of JSON) takes
~0.4 s to parse and make canonical - and holds the GIL all that time, so a thread would not help.
Each such parse runs here in a child forked for it: the input is inherited through the fork
(nothing is written to a pipe), the answer comes back pickled on a pipe the loop's own selector
watches, and the loop reads it without blocking.

Why not :class:`multiprocessing.pool.Pool`: its ``terminate()`` can hang for good (CPython issues
#78178 and #96995, open). It kills a worker that may hold the result queue's lock while writing a
result into a pipe that nobody reads any more, then waits to put its own sentinel behind that lock;
with results of megabytes the window is wide. A server under test did not end within 60 s that way.
Here ending is ``SIGKILL`` and ``waitpid`` for each child: nothing to wait behind.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

_READ = 1 << 20  # bytes a readable answer pipe is read by at a time


class ParseFailed(Exception):
    """The child's parse raised (its message), or the child ended without an answer."""


@dataclass
class _Child:
    key: Hashable
    pid: int
    fd: int
    data: bytearray = field(default_factory=bytearray)


class ForkParsers:
    """At most ``at_once`` children parsing at a time; more inputs wait in order.

    ``submit(key, body)`` queues ``parse(body)``; when its answer is in, :meth:`on_ready` returns
    ``(key, value)`` where value is what ``parse`` returned, or a :class:`ParseFailed`.
    ``in_child`` runs first in every child (e.g. closing inherited sockets, so a connection the
    parent closes does close). :meth:`cancel` forgets one input, :meth:`close` all (a running child is
    killed and reaped)."""

    def __init__(self, sel: selectors.BaseSelector, parse: Callable[[bytes], Any], *, at_once: int = 1,
                 in_child: Callable[[], None] | None = None) -> None:
        if at_once < 1:
            raise ValueError(f"at_once must be at least 1, got {at_once}")
        self._sel = sel
        self._parse = parse
        self._at_once = at_once
        self._in_child = in_child
        self._waiting: deque[tuple[Hashable, bytes]] = deque()
        self._running: dict[int, _Child] = {}  # by the answer pipe's fd

    def submit(self, key: Hashable, body: bytes) -> None:
        self._waiting.append((key, body))
        self._start()

    def owns(self, fileobj: object) -> bool:
        """Whether a selector event's file object is one of this pool's answer pipes."""
        return isinstance(fileobj, int) and fileobj in self._running

    def busy(self) -> int:
        """Inputs submitted and not yet answered (running or waiting)."""
        return len(self._running) + len(self._waiting)

    def on_ready(self, fd: int) -> tuple[Hashable, Any] | None:
        """Read what the child at ``fd`` wrote; its ``(key, value)`` once the answer is whole."""
        child = self._running[fd]
        while True:
            try:
                chunk = os.read(fd, _READ)
            except (BlockingIOError, InterruptedError):
                return None
            if not chunk:
                break
            child.data += chunk
        self._end(child, kill=False)
        self._start()
        try:
            ok, value = pickle.loads(child.data) if child.data else (False, "the parse process ended "
                                                                              "without an answer")
        except Exception as exc:  # noqa: BLE001 - a truncated answer: the child died while writing
            ok, value = False, f"the parse process's answer was unreadable ({exc})"
        return child.key, value if ok else ParseFailed(value)

    def cancel(self, key: Hashable) -> None:
        """Forget ``key``'s input: taken off the queue, or its child killed. Why: the input of a login
        that was let go would otherwise stay queued (megabytes each) and be parsed for nothing."""
        self._waiting = deque((k, b) for k, b in self._waiting if k != key)
        for child in [c for c in self._running.values() if c.key == key]:
            self._end(child, kill=True)
        self._start()

    def close(self) -> None:
        """Kill every child still parsing and forget the waiting inputs."""
        self._waiting.clear()
        for child in list(self._running.values()):
            self._end(child, kill=True)

    def _start(self) -> None:
        while self._waiting and len(self._running) < self._at_once:
            key, body = self._waiting.popleft()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: parse, answer, leave without running the parent's exit handlers
                try:
                    os.close(r)
                    if self._in_child is not None:
                        self._in_child()
                    try:
                        answer = (True, self._parse(body))
                    except Exception as exc:  # noqa: BLE001 - its message is the answer
                        answer = (False, str(exc))
                    view = memoryview(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
                    while view:
                        view = view[os.write(w, view):]
                finally:
                    os._exit(0)
            os.close(w)
            os.set_blocking(r, False)
            self._running[r] = _Child(key, pid, r)
            self._sel.register(r, selectors.EVENT_READ)

    def _end(self, child: _Child, *, kill: bool) -> None:
        del self._running[child.fd]
        self._sel.unregister(child.fd)
        os.close(child.fd)
        if kill:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(child.pid, 0)  # (its answer is read, or it was killed: it is ending now)
        except ChildProcessError:
            pass
