"""A worker's own shard handed to the shard server on its host through shared memory.

Why: in the sharded mode (:mod:`dblp.transport.shard`) every host runs a worker and the
server of one shard. The worker's own shard never has to cross a network - as
a ring all-reduce never sends a rank's own chunk - yet over sockets it was
sent, checked and copied by the kernel like any other: each host moved ``2N``
each way instead of ``2N (k-1)/k``. Here the worker and the server on its
host share one file in ``/dev/shm`` holding two float32 arrays of the shard's
size: ``up`` (the worker's values) and ``down`` (the server's mean).

The protocol does not change. Each side still runs its
:class:`~dblp.protocol.core.RoundSender` and :class:`~dblp.protocol.core.Receiver` (round
counter, PROBE, STOP, tolerance); only the data path differs: a pass is one
copy into the slot and a LOCAL control message naming round and direction
(:class:`dblp.protocol.control.Local`), whose receiver copies the slot into its round's
buffer and takes every chunk at once (:mod:`dblp.transport.sockets`). Nothing is lost
on this path, so a round's local share is always whole.

The slot is made by the worker (owner-only, named after its process id so
:mod:`emulation.cleanup` can tell a killed run's leftovers), named in its
authenticated HELLO, opened by the server only after the handshake, and
unlinked by the worker as soon as the server's META says it attached: from
then on only the two mappings keep it, and the kernel frees it when both
processes end, however they end.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
from pathlib import Path

import numpy as np

from dblp.protocol.control import LOCAL_DIR, LOCAL_PATH_RE as PATH_RE, LOCAL_PREFIX as PREFIX


class LocalSlotError(OSError):
    """The host-local slot cannot be made or opened; the message says why."""


class LocalSlot:
    """Two float32 arrays of ``elements`` in one shared file: ``up`` (worker -> server), ``down``."""

    def __init__(self, path: str, mm: mmap.mmap, elements: int) -> None:
        self.path = path
        self.elements = elements
        self._mm = mm
        self.up = np.frombuffer(mm, np.float32, count=elements, offset=0)
        self.down = np.frombuffer(mm, np.float32, count=elements, offset=4 * elements)

    @classmethod
    def create(cls, elements: int) -> "LocalSlot":
        """A new slot (the worker's side). Its memory is reserved at once, so a full ``/dev/shm``
        is an error here rather than a SIGBUS in the middle of a round."""
        if elements < 1:
            raise LocalSlotError(f"a host-local slot needs at least one element, got {elements}")
        path = str(LOCAL_DIR / f"{PREFIX}{os.getpid()}-{secrets.token_hex(16)}")
        size = 8 * elements
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise LocalSlotError(f"cannot make the host-local slot {path}: {exc.strerror or exc}") from None
        try:
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise LocalSlotError(f"cannot reserve {size} bytes for the host-local slot in {LOCAL_DIR}: "
                                 f"{exc.strerror or exc}") from None
        os.close(fd)
        return cls(path, mm, elements)

    @classmethod
    def open(cls, path: str, elements: int) -> "LocalSlot":
        """The slot a worker named (the server's side): only a regular file of our naming in
        ``/dev/shm``, owned by this user, of exactly the size of ``elements`` floats twice."""
        if not isinstance(path, str) or not PATH_RE.fullmatch(path):
            raise LocalSlotError(f"{path!r} is not a host-local slot's path")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise LocalSlotError(f"cannot open the host-local slot {path}: {exc.strerror or exc} "
                                 f"(is the worker on this server's host?)") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise LocalSlotError(f"{path} is not a regular file of this user")
            if st.st_size != 8 * elements:
                raise LocalSlotError(f"{path} holds {st.st_size} bytes, a shard of {elements} elements "
                                     f"needs {8 * elements}")
            mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        return cls(path, mm, elements)

    def unlink(self) -> None:
        """Remove the name; the mappings stay valid until both sides close."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.up = self.down = np.empty(0, np.float32)  # let go of the views before the mapping
        try:
            self._mm.close()
        except BufferError:  # a caller still holds a view: the mapping goes with the last one
            pass


def slots() -> list[tuple[Path, int]]:
    """Every slot in ``/dev/shm`` with the process id of the worker that made it (its name says
    it): :mod:`emulation.cleanup` removes those whose creator is gone."""
    out = []
    for p in LOCAL_DIR.glob(PREFIX + "*"):
        m = PATH_RE.fullmatch(str(p))
        if m is not None:
            out.append((p, int(m.group(1))))
    return out
