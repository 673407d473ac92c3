"""A common start for the rounds of a benchmark: every worker has its gradient in hand first.

Why: the gloo harness a DBLP round is compared with (``scenarios/gloo_allreduce.py``) copies
each rank's tensor into place and only then starts every rank at one wall-clock instant; its
time runs from that common start to the last rank's end. A ``dblp worker`` makes its round's
synthetic gradient (a multiply over the whole tensor) and calls ``allreduce`` at once, and the
loopback and benchmark measures run from the *first* worker's call to the last one's end - so
without a common start they also count the other workers still making their gradients: three
100 MB multiplies on two cores put 14-28 ms between the first and the last call of a ~120 ms
round (25M x 3 on loopback). With ``--start-together DIR`` each worker touches a file when its
gradient is ready and waits until every worker's file for that round is there: both sides are
then timed from the moment every rank holds its data, and no worker sends before that.

Files, not sockets: the workers of a loopback run or of namespace hosts share one file system,
and a benchmark needs nothing more (a cluster's workers use torchrun's own rendezvous). A worker
that never arrives is reported by number, in bounded time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dblp.protocol.wire import ParameterError

__all__ = ["StartLine", "StartLineTimeout"]

#: how often a waiting worker looks for the others (s): a late start of at most this much, at a
#: cost of a few stat calls per look (spinning would take the core of the worker still preparing)
POLL_S = 0.0005


class StartLineTimeout(TimeoutError):
    """Some workers did not reach the start line in time."""


class StartLine:
    """Worker ``me`` of ``parties`` lines up in ``folder`` before each round (see the module)."""

    def __init__(self, folder: str | os.PathLike, parties: int, me: int, timeout_s: float = 120.0) -> None:
        if parties < 1 or not 0 <= me < parties:
            raise ParameterError(f"--start-together: worker {me} of {parties} workers is not one of them")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.parties, self.me, self.timeout_s = parties, me, timeout_s

    def _mark(self, round_no: int, worker: int) -> Path:
        return self.folder / f"round{round_no}.worker{worker}"

    def wait(self, round_no: int) -> float:
        """Say this worker is ready for ``round_no`` and return once every worker is (the seconds
        waited). Round ``round_no - 2``'s mark goes: every worker passed that start line before
        anyone could reach this one."""
        self._mark(round_no, self.me).touch()
        old = self._mark(round_no - 2, self.me)
        if round_no >= 2 and old.exists():
            old.unlink()
        t0 = time.monotonic()
        missing = [w for w in range(self.parties) if w != self.me]
        while True:
            missing = [w for w in missing if not self._mark(round_no, w).exists()]
            if not missing:
                return time.monotonic() - t0
            if time.monotonic() - t0 > self.timeout_s:
                raise StartLineTimeout(f"start line {self.folder}, round {round_no}: worker(s) "
                                       f"{', '.join(map(str, missing))} not ready after {self.timeout_s:g} s")
            time.sleep(POLL_S)
