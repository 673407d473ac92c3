"""What the hostile-peer tests share: threads whose errors are kept, the server's first control
message, and an on-path proxy that hands every control frame to a hook.

Why one module: the login, tampering and flooding tests (test_auth, test_hostile_control,
test_hostile_wire, test_hostile_tamper) attack the same control stream, so they read it and stand
in it one way.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable

from dblp.protocol import control as ctl


class Threads:
    """Callables on threads, each one's exception kept in ``errors`` for the test to assert on
    (an exception on a plain thread is only printed, and the test would pass)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, fn: Callable[..., object], *args: object) -> threading.Thread:
        def guarded() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                self.errors.append(exc)

        t = threading.Thread(target=guarded)
        t.start()
        self.threads.append(t)
        return t

    def join(self, timeout: float = 60.0) -> None:
        for t in self.threads:
            t.join(timeout)


def first_message(sock: socket.socket, timeout: float | None = 10.0) -> ctl.Message | None:
    """The first control message the peer sends on ``sock`` (None: it closed without one)."""
    if timeout is not None:
        sock.settimeout(timeout)
    dec = ctl.ControlDecoder()
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        msgs = dec.feed(data)
        if msgs:
            return msgs[0]


def recv_frame(s: socket.socket) -> bytes:
    """One whole control frame (its 4-byte length and the body), as it stood in the stream."""
    head = _recv_exactly(s, 4)
    (n,) = struct.unpack("!I", head)
    return head + _recv_exactly(s, n)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        part = s.recv(min(1 << 20, n - len(got)))
        if not part:
            raise ConnectionError
        got += part
    return got


class FrameProxy:
    """A proxy between one worker and the server, without the secret: every frame toward the worker
    passes :meth:`down`, every frame toward the server :meth:`up` (``n``: the frame's index in its
    direction), and what they return is sent on. A subclass sets its own fields before calling
    ``__init__``: the proxy serves from then on."""

    def __init__(self, server_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.server_port = server_port
        threading.Thread(target=self._run, daemon=True).start()

    def down(self, n: int, frame: bytes) -> bytes:
        return frame

    def up(self, n: int, frame: bytes) -> bytes:
        return frame

    def _run(self) -> None:
        w, _ = self.listener.accept()
        s = socket.create_connection(("127.0.0.1", self.server_port))
        threading.Thread(target=self._pipe, args=(s, w, self.down), daemon=True).start()
        self._pipe(w, s, self.up)

    def _pipe(self, src: socket.socket, dst: socket.socket, hook: Callable[[int, bytes], bytes]) -> None:
        n = 0
        try:
            while True:
                frame = recv_frame(src)
                dst.sendall(hook(n, frame))
                n += 1
        except OSError:
            pass
        finally:
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
