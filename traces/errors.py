"""Exceptions of the traces package.

A trace that is wrong must be refused loudly and precisely: a replay of a
silently misread trace produces a wrong experiment that looks right. So every
parse error names the file, the 1-based line number and the reason.
"""

from __future__ import annotations


class TraceError(ValueError):
    """Base class: a trace or a trace parameter is invalid."""


class TraceFormatError(TraceError):
    """A trace file is malformed; ``line`` is 1-based (0 when not tied to a line)."""

    def __init__(self, reason: str, line: int = 0, path: str | None = None) -> None:
        self.reason = reason
        self.line = line
        self.path = path
        where = path or "<trace>"
        super().__init__(f"{where}: line {line}: {reason}" if line else f"{where}: {reason}")


class NotMappableError(TraceError):
    """A description (netem, mahimahi) uses a feature with no loss-trace equivalent."""
