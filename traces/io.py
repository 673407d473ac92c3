"""Reading and writing trace files, with validation that names the bad line.

Both forms are plain text (see ``traces/FORMAT.md``):

* line 1 is ``#`` + one JSON metadata object;
* segments: line 2 is the CSV column header, then one row per segment;
* packets: lines of ``0``/``1`` characters (1 = dropped), any line length.

Later lines starting with ``#`` are comments. Blank lines are refused, and so
is a file that does not end in a newline or holds fewer rows/packets than its
metadata states: both are what a truncated copy looks like. A ``.gz`` suffix
reads and writes gzip.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Union

import numpy as np

from .errors import TraceFormatError
from .meta import parse_header
from .model import PacketTrace, SegmentTrace

Trace = Union[SegmentTrace, PacketTrace]
PathLike = Union[str, os.PathLike]

SEGMENT_COLUMNS = ("start_us", "loss", "rate_bps", "queue_pkts")
REQUIRED_COLUMNS = ("start_us", "loss")
PACKETS_PER_LINE = 64


# -- writing -----------------------------------------------------------------
def _num(x: float) -> str:
    if np.isnan(x):
        return ""
    if float(x).is_integer() and abs(x) < 1e18:
        return str(int(x))
    return repr(float(x))


def dumps(trace: Trace) -> str:
    """The file text of ``trace``."""
    if isinstance(trace, SegmentTrace):
        return _dump_segments(trace)
    if isinstance(trace, PacketTrace):
        return _dump_packets(trace)
    raise TypeError(f"not a trace: {type(trace).__name__}")


def _dump_segments(tr: SegmentTrace) -> str:
    head = tr.meta.to_header(duration_us=tr.duration_us, rows=len(tr))
    cols: list[list[str]] = [
        [str(int(v)) for v in tr.start_us],
        [repr(float(v)) for v in tr.loss],
    ]
    names = ["start_us", "loss"]
    if tr.rate_bps is not None:
        names.append("rate_bps")
        cols.append([_num(v) for v in tr.rate_bps])
    if tr.queue_pkts is not None:
        names.append("queue_pkts")
        cols.append([_num(v) for v in tr.queue_pkts])
    rows = [",".join(r) for r in zip(*cols)]
    return "\n".join(["# " + json.dumps(head, separators=(",", ":")), ",".join(names), *rows]) + "\n"


def _dump_packets(tr: PacketTrace) -> str:
    head = tr.meta.to_header(packets=len(tr))
    chars = tr.drops.astype(np.uint8) + ord("0")
    n = chars.size
    full = n // PACKETS_PER_LINE
    block = chars[: full * PACKETS_PER_LINE].reshape(full, PACKETS_PER_LINE)
    body = np.hstack([block, np.full((full, 1), ord("\n"), np.uint8)]).tobytes().decode()
    rest = chars[full * PACKETS_PER_LINE :].tobytes().decode()
    if rest:
        body += rest + "\n"
    return "# " + json.dumps(head, separators=(",", ":")) + "\n" + body


def write_trace(trace: Trace, path: PathLike) -> Path:
    """Write ``trace`` to ``path`` (gzip when it ends in ``.gz``); returns the path."""
    p = Path(path)
    text = dumps(trace)
    if p.suffix == ".gz":
        with gzip.open(p, "wt", encoding="utf-8", newline="\n") as f:
            f.write(text)
    else:
        p.write_text(text, encoding="utf-8", newline="\n")
    return p


# -- reading -----------------------------------------------------------------
def read_trace(path: PathLike) -> Trace:
    """Read and validate a trace file of either form."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8", newline="") as f:
                text = f.read()
        else:
            text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not UTF-8 text ({e.reason})", 0, str(p)) from None
    except (OSError, EOFError) as e:
        raise TraceFormatError(f"cannot read: {e}", 0, str(p)) from None
    return loads(text, path=str(p))


def read_segments(path: PathLike) -> SegmentTrace:
    tr = read_trace(path)
    if not isinstance(tr, SegmentTrace):
        raise TraceFormatError("expected a segments trace, found a packets trace", 1, str(path))
    return tr


def read_packets(path: PathLike) -> PacketTrace:
    tr = read_trace(path)
    if not isinstance(tr, PacketTrace):
        raise TraceFormatError("expected a packets trace, found a segments trace", 1, str(path))
    return tr


def loads(text: str, *, path: str | None = None) -> Trace:
    """Parse trace text; every refusal is a :class:`TraceFormatError` with its line."""
    if not text:
        raise TraceFormatError("empty file", 0, path)
    lines = text.split("\n")
    if lines[-1] != "":
        raise TraceFormatError("file does not end with a newline (truncated?)", len(lines), path)
    lines.pop()
    if any(line.endswith("\r") for line in lines):
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    meta, head = parse_header(lines[0], path=path)
    if meta.form == "segments":
        return _load_segments(lines, meta, head, path)
    return _load_packets(lines, meta, head, path)


def _body(lines: list[str], first: int, path: str | None) -> tuple[list[str], np.ndarray]:
    """Data lines from index ``first`` on, without comments, with 1-based line numbers."""
    body: list[str] = []
    nums: list[int] = []
    for i in range(first, len(lines)):
        line = lines[i]
        if not line.strip():
            raise TraceFormatError("blank line (data lines cannot be empty)", i + 1, path)
        if line[0] == "#":
            continue
        body.append(line)
        nums.append(i + 1)
    return body, np.asarray(nums, dtype=np.int64)


def _load_segments(lines: list[str], meta, head: dict, path: str | None) -> SegmentTrace:  # type: ignore[no-untyped-def]
    if len(lines) < 2:
        raise TraceFormatError("missing the column header line (truncated?)", 2, path)
    names = [c.strip() for c in lines[1].split(",")]
    for c in names:
        if c not in SEGMENT_COLUMNS:
            raise TraceFormatError(
                f"unknown column {c!r} (known: {', '.join(SEGMENT_COLUMNS)})", 2, path
            )
    if len(set(names)) != len(names):
        raise TraceFormatError("duplicate column in the header", 2, path)
    for c in REQUIRED_COLUMNS:
        if c not in names:
            raise TraceFormatError(f"missing required column {c!r}", 2, path)
    rows, nums = _body(lines, 2, path)
    if not rows:
        raise TraceFormatError("no segment rows (truncated?)", len(lines), path)
    fields = [r.split(",") for r in rows]
    counts = np.fromiter((len(f) for f in fields), dtype=np.int64, count=len(fields))
    bad = np.flatnonzero(counts != len(names))
    if bad.size:
        k = int(bad[0])
        raise TraceFormatError(
            f"expected {len(names)} fields ({','.join(names)}), got {counts[k]}", int(nums[k]), path
        )
    cols = dict(zip(names, (list(c) for c in zip(*fields))))

    start = _parse_int_col(cols["start_us"], "start_us", nums, path, required=True)
    loss = _parse_float_col(cols["loss"], "loss", nums, path, required=True)
    rate = None if "rate_bps" not in cols else _parse_float_col(cols["rate_bps"], "rate_bps", nums, path)
    queue = None if "queue_pkts" not in cols else _parse_int_col(cols["queue_pkts"], "queue_pkts", nums, path)

    def at(k: int, reason: str) -> TraceFormatError:
        return TraceFormatError(reason, int(nums[k]), path)

    if start[0] != 0:
        raise at(0, f"the first segment must start at 0 us, not {int(start[0])}")
    d = np.diff(start)
    bad = np.flatnonzero(d <= 0)
    if bad.size:
        k = int(bad[0]) + 1
        raise at(k, f"start_us {int(start[k])} is not after the previous {int(start[k - 1])} (times must increase)")
    dur = head["duration_us"]
    bad = np.flatnonzero(start >= dur)
    if bad.size:
        k = int(bad[0])
        raise at(k, f"start_us {int(start[k])} is not before duration_us {dur}")
    bad = np.flatnonzero(~((loss >= 0.0) & (loss <= 1.0)))
    if bad.size:
        k = int(bad[0])
        raise at(k, f"loss {cols['loss'][k].strip()} is outside [0, 1]")
    if rate is not None:
        bad = np.flatnonzero(~(np.isnan(rate) | (rate > 0)))
        if bad.size:
            k = int(bad[0])
            raise at(k, f"rate_bps {cols['rate_bps'][k].strip()} must be positive (or empty)")
    if queue is not None:
        bad = np.flatnonzero(~(np.isnan(queue) | (queue >= 1)))
        if bad.size:
            k = int(bad[0])
            raise at(k, f"queue_pkts {cols['queue_pkts'][k].strip()} must be a positive integer (or empty)")
    if len(rows) != head["rows"]:
        raise TraceFormatError(
            f"metadata says {head['rows']} rows, the file has {len(rows)} (truncated or edited?)",
            len(lines),
            path,
        )
    return SegmentTrace(start.astype(np.int64), loss, dur, rate, queue, meta)


def _parse_float_col(
    vals: list[str], name: str, nums: np.ndarray, path: str | None, required: bool = False
) -> np.ndarray:
    """Floats; an empty cell is NaN unless ``required``. 'nan'/'inf' spelled out are refused."""
    stripped = [v.strip() for v in vals]
    empty = np.array([not v for v in stripped], dtype=bool)
    if required and empty.any():
        k = int(np.flatnonzero(empty)[0])
        raise TraceFormatError(f"empty {name} (missing field)", int(nums[k]), path)
    try:
        out = np.array([v or "nan" for v in stripped], dtype=np.float64)
    except ValueError:
        for k, v in enumerate(stripped):  # slow path only to locate the error
            try:
                float(v or "nan")
            except ValueError:
                raise TraceFormatError(f"{name} {v!r} is not a number", int(nums[k]), path) from None
        raise
    bad = np.flatnonzero(~np.isfinite(out) & ~empty)
    if bad.size:
        k = int(bad[0])
        raise TraceFormatError(f"{name} {stripped[k]!r} is not a finite number", int(nums[k]), path)
    return out


def _parse_int_col(
    vals: list[str], name: str, nums: np.ndarray, path: str | None, required: bool = False
) -> np.ndarray:
    """Integers (decimal digits, optional sign); empty is NaN unless ``required``."""
    stripped = [v.strip() for v in vals]
    ok = [(_is_decimal(v) if v else not required) for v in stripped]
    if not all(ok):
        k = ok.index(False)
        v = stripped[k]
        reason = f"empty {name} (missing field)" if not v else f"{name} {v!r} is not an integer"
        raise TraceFormatError(reason, int(nums[k]), path)
    if required:
        try:
            out = np.array(stripped, dtype=np.int64)
        except OverflowError:  # a value beyond 2**63 - 1 us (~292,000 years)
            k = next(i for i, v in enumerate(stripped) if not -(2**63) <= int(v) < 2**63)
            raise TraceFormatError(f"{name} {stripped[k]} is out of range (at most {2**63 - 1})", int(nums[k]),
                                   path) from None
        bad = np.flatnonzero(out < 0)
        if bad.size:
            k = int(bad[0])
            raise TraceFormatError(f"{name} {stripped[k]} is negative", int(nums[k]), path)
        return out
    return np.array([v if v else "nan" for v in stripped], dtype=np.float64)


def _is_decimal(v: str) -> bool:
    digits = v[1:] if v[0] in "+-" else v
    return digits.isascii() and digits.isdigit()


def _load_packets(lines: list[str], meta, head: dict, path: str | None) -> PacketTrace:  # type: ignore[no-untyped-def]
    body, nums = _body(lines, 1, path)
    if not body:
        raise TraceFormatError("no packet lines (truncated?)", len(lines), path)
    lens = np.fromiter((len(b) for b in body), dtype=np.int64, count=len(body))
    raw = np.frombuffer("".join(body).encode("utf-8", "replace"), dtype=np.uint8)
    if raw.size != lens.sum():  # a non-ASCII character changed the byte count
        for k, b in enumerate(body):
            if not b.isascii():
                raise TraceFormatError("only the characters 0 and 1 may appear", int(nums[k]), path)
    bad = np.flatnonzero((raw != ord("0")) & (raw != ord("1")))
    if bad.size:
        pos = int(bad[0])
        k = int(np.searchsorted(np.cumsum(lens), pos, side="right"))
        col = pos - int(np.concatenate(([0], np.cumsum(lens)))[k]) + 1
        raise TraceFormatError(
            f"character {chr(raw[pos])!r} at column {col}: only 0 (delivered) and 1 (dropped) are allowed",
            int(nums[k]),
            path,
        )
    if raw.size != head["packets"]:
        raise TraceFormatError(
            f"metadata says {head['packets']} packets, the file has {raw.size} (truncated or edited?)",
            len(lines),
            path,
        )
    return PacketTrace(raw == ord("1"), meta)
