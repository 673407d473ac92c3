"""Progress lines with an ETA: the one format every long run prints (scenarios, launchers, training).

Why lines and not a bar: scenario output usually goes to a log file or a pipe,
where a redrawn bar turns into carriage-return noise; a line such as

    dblp      iteration   400/1000  (40 %, 12.3 it/s, elapsed 32 s, ETA 49 s)

reads the same in a terminal and in a log. (The simulator's sweeps keep tqdm's
bar, which also shows an ETA, since they run in a terminal.)
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO



def clock_text(s: float) -> str:
    """A wait as people read it: ``'49 s'``, ``'4 min 09 s'``, ``'2 h 05 min'``."""
    s = max(0.0, s)
    if s < 59.5:
        return f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def eta_text(done: float, total: float, elapsed_s: float, unit: str = "it") -> str:
    """``"40 %, 12.3 it/s, elapsed 32 s, ETA 49 s"`` for ``done`` of ``total`` after ``elapsed_s``."""
    parts = [f"{100 * done / total:.0f} %"] if total else []
    if done > 0 and elapsed_s > 0:
        rate = done / elapsed_s
        parts.append(f"{rate:.3g} {unit}/s" if rate >= 1 else f"{elapsed_s / done:.3g} s/{unit}")
    parts.append(f"elapsed {clock_text(elapsed_s)}")
    if done > 0 and total:
        parts.append(f"ETA {clock_text(elapsed_s / done * (total - done))}")
    return ", ".join(parts)


class Progress:
    """Prints ``label what done/total (…, ETA …)`` at most every ``every_s`` seconds, and at the end.

    ``update(done)`` is cheap to call often (e.g. once per iteration); ``force``
    prints regardless of the interval (e.g. at an iteration worth marking).
    """

    def __init__(self, total: int, label: str = "", what: str = "iteration", unit: str = "it",
                 every_s: float = 5.0, out: TextIO | Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.label, self.what, self.unit, self.every_s = total, label, what, unit, every_s
        self._out = out
        self._clock = clock
        self.t0 = clock()
        self._last_print = -float("inf")
        self._last_done = -1

    def line(self, done: int) -> str:
        width = len(str(self.total))
        head = f"{self.label:9s} " if self.label else ""
        return (f"{head}{self.what} {done:{width}d}/{self.total}  "
                f"({eta_text(done, self.total, self._clock() - self.t0, self.unit)})")

    def update(self, done: int, *, force: bool = False) -> bool:
        """Print a line when due; returns whether it printed.

        ``done == 0`` (the first iteration starting) restarts the clock instead of
        printing, so start-up time does not distort the rate and the ETA.
        """
        now = self._clock()
        if done <= 0 and not force:
            self.t0 = now
            return False
        due = force or done >= self.total or now - self._last_print >= self.every_s
        if not due or done == self._last_done:
            return False
        self._last_print, self._last_done = now, done
        text = "  " + self.line(done)
        out = self._out if self._out is not None else sys.stdout
        if callable(out) and not hasattr(out, "write"):
            out(text)
        else:
            print(text, file=out, flush=True)
        return True


class Stamped:
    """Prints each message with the seconds since it was made: ``[   12.3s] msg`` (nothing when ``quiet``).

    For runs whose steps are not counted in advance (a benchmark's hosts, runs and rules), where
    :class:`Progress`'s ``done/total`` has no total to count against.
    """

    def __init__(self, quiet: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.t0 = clock()
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self._clock() - self.t0:7.1f}s] {msg}", flush=True)
