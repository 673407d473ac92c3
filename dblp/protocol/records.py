"""The per-round record: one row per (round, worker, role), shared by every view.

Loopback runs, Mininet emulation, the SimPy simulator and real hosts all
write this same schema as JSONL, so one analysis and one plotting code serve
them all. "up" is the worker-to-server direction (the worker's DBLP_SEND of
its gradient, the paper's "send latency"); "down" is the server's broadcast
of the averaged gradient.

Every line is strict JSON (any JSON reader, ``jq``, pandas): a value that is
not a number (NaN, an unmeasured latency) is written ``null`` and read back
as NaN for the float fields, so analysis code keeps its NaN arithmetic. Each
line opens with ``schema`` (:data:`SCHEMA_VERSION`, bumped when a field
changes meaning) and ``run`` (the label of the run the row belongs to, e.g.
``dblp`` or ``baseline`` in a merged results file; empty when a file holds
one run). Version-0 lines (no ``schema``; the label, if any, in
``extra["run"]``) are still read.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

from dblp.protocol.policy import policy_name

#: Version of the JSONL line format written by :meth:`RoundRecord.to_dict`.
#: 1: strict JSON (null for NaN), ``schema`` and ``run`` at the top level.
SCHEMA_VERSION = 1


_JSON_PLAIN = frozenset({str, int, bool, type(None)})


def json_safe(v: Any) -> Any:
    """``v`` with every non-finite float replaced by ``None`` (and numpy scalars
    made Python numbers), so ``json.dumps(..., allow_nan=False)`` accepts it:
    ``NaN`` is not JSON and strict readers (``jq``, browsers, Go) reject it."""
    t = type(v)  # most of a record's fields are decided by their exact type: the ABC and attribute checks
    if t is float:  # below cost ~1 us a field (a 10,000-worker simulation writes 800,000 records)
        return v if math.isfinite(v) else None
    if t in _JSON_PLAIN:
        return v
    if t is dict:
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if hasattr(v, "item") and callable(v.item) and not isinstance(v, (str, bytes)):
        try:
            return json_safe(v.item())
        except (TypeError, ValueError):
            return v
    return v


@dataclass
class RoundRecord:
    source: str  # "loopback" | "emulation" | "simulation" | "hosts"
    role: str  # "worker" | "server"
    worker: int
    round: int
    t_start: float = 0.0  # seconds (wall clock, or simulated time) when the round began here
    policy: str = ""  # "reliable" | "baseline" | "dblp" (older records' "fixed" reads as "baseline")
    tolerance_up: float = 0.0
    tolerance_down: float = 0.0
    clr: bool = False  # server's CLR state when it set tolerance_down
    grad_norm: float = float("nan")  # L2 norm of the averaged gradient (server side)
    chunks: int = 0  # chunks per direction per round
    up_latency_s: float = float("nan")  # worker: DBLP_SEND time; server: DBLP_RECV time
    down_latency_s: float = float("nan")  # worker: DBLP_RECV time; server: DBLP_SEND time
    round_latency_s: float = float("nan")  # whole exchange as seen by this side
    up_sent: int = 0  # datagrams sent upstream, retransmissions included
    up_passes: int = 0
    up_received: int = 0  # chunks the server accepted (from STOP)
    down_sent: int = 0
    down_passes: int = 0
    down_received: int = 0
    early_stop_up: bool = False
    early_stop_down: bool = False
    send_rate_bps: float = 0.0  # pacing rate in force (0 = unlimited)
    order: str = "perm"  # "perm" (seeded permutation per round) | "inorder"
    stale: int = 0  # drop counters of this side's receiver during the round
    duplicate: int = 0
    corrupt: int = 0
    foreign: int = 0
    malformed: int = 0
    out_of_range: int = 0
    wrong_length: int = 0
    unauthenticated: int = 0  # authenticated wire: datagrams without a valid tag under the run's key
    extra: dict = field(default_factory=dict)  # view-specific extras (burst flag, compute time...)
    run: str = ""  # label of the run this row belongs to ("dblp", "baseline"...; "" = the file's only run)

    @property
    def up_frac(self) -> float:
        return self.up_received / self.chunks if self.chunks else float("nan")

    @property
    def down_frac(self) -> float:
        return self.down_received / self.chunks if self.chunks else float("nan")

    def to_dict(self) -> dict:
        """The record as a dict in line order (``schema`` and ``run`` first), NaN kept as NaN."""
        # field by field, ``extra`` one level deep: asdict's recursive deepcopy cost ~170 us a
        # record, paid every round by a writer and by the DDP hook's per-step info
        d = {name: getattr(self, name) for name in _FIELD_NAMES}
        d["extra"] = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                      for k, v in self.extra.items()}
        d["up_frac"] = self.up_frac
        d["down_frac"] = self.down_frac
        return {"schema": SCHEMA_VERSION, "run": d.pop("run"), **d}

    def to_json(self) -> str:
        """The JSONL line (without newline): strict JSON, ``null`` where a value is not a number."""
        return json.dumps(json_safe(self.to_dict()), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict) -> "RoundRecord":
        """A record from a line of any schema up to :data:`SCHEMA_VERSION` (null -> NaN for floats)."""
        version = d.get("schema", 0)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"record schema {version!r} is newer than this dblp reads ({SCHEMA_VERSION}); "
                             "upgrade dblp")
        kw = {k: v for k, v in d.items() if k in _FIELDS}
        for k in _FLOAT_FIELDS:
            if k in kw and kw[k] is None:
                kw[k] = math.nan
        if not kw.get("run") and isinstance(kw.get("extra"), dict) and "run" in kw["extra"]:  # schema 0
            kw["extra"] = dict(kw["extra"])
            kw["run"] = str(kw["extra"].pop("run"))
        if isinstance(kw.get("policy"), str):  # records written before the one vocabulary say "fixed"
            kw["policy"] = policy_name(kw["policy"])
        return cls(**kw)


_FIELDS = {f.name for f in fields(RoundRecord)}
_FLOAT_FIELDS = {f.name for f in fields(RoundRecord) if f.type in (float, "float")}

COLUMNS = ["schema", "run"] + [f.name for f in fields(RoundRecord) if f.name != "run"] + ["up_frac", "down_frac"]


_FIELD_NAMES = tuple(f.name for f in fields(RoundRecord))


class RecordsError(OSError):
    """The records file cannot be written; the message names ``--records`` and the path.

    An OSError, so callers that handle a file they cannot open keep doing so; its
    own class, so that a path such as ``/proc/version`` (whose error carries no
    file name) is not taken for a socket's error ("cannot listen on --host").
    """

    def __str__(self) -> str:
        return self.strerror or super().__str__()


#: A records file named ``*.gz`` is gzip-compressed JSONL (written and read by suffix).
GZIP_SUFFIX = ".gz"


def _open_records(path: Path, mode: str) -> IO[str]:
    """A records file for text ``mode`` ("a" or "r"): gzip by the ``.gz`` suffix, plain JSONL
    otherwise. Level 1: a 10,000-worker simulation's 0.7 GB of JSONL a run comes to 5 MB, and is
    written faster than the plain file (docs/records.md)."""
    if path.suffix == GZIP_SUFFIX:
        return gzip.open(path, mode + "t", encoding="utf-8", compresslevel=1)
    return open(path, mode, encoding="utf-8")


class RecordWriter:
    """Appends records to a JSONL file, flushing each line so a killed run keeps its rows - unless
    ``flush_each`` is False (a simulation's or a merge's records, written in bulk: a flush a line
    was a system call a line, ~12 s of the 44 s a 10,000-worker simulation took). A path ending
    ``.gz`` is written gzip-compressed and flushed only at :meth:`close` (a flush per line would
    end the compressor's block at every line): a run killed before then loses its rows."""

    def __init__(self, path: str | os.PathLike | None, *, flush_each: bool = True) -> None:
        self.path = Path(path) if path else None
        self._fh: IO[str] | None = None
        self._flush = flush_each and self.path is not None and self.path.suffix != GZIP_SUFFIX
        if self.path:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = _open_records(self.path, "a")
            except OSError as exc:
                where = f" ({exc.filename} is in the way)" if exc.filename and str(exc.filename) != str(self.path) else ""
                raise RecordsError(exc.errno, f"--records {self.path}: cannot append records there: "
                                              f"{exc.strerror or exc}{where}") from None

    def write(self, rec: RoundRecord) -> None:
        if self._fh:
            self._fh.write(rec.to_json() + "\n")
            if self._flush:
                self._fh.flush()

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike, *, skipped: list[int] | None = None) -> Iterator[RoundRecord]:
    """The records of a JSONL file (gzip-compressed when it ends ``.gz``).

    A line that is not a round record raises ValueError naming it; with ``skipped`` (a one-item
    counter, for folders of mixed files) it is left out and counted instead, as is a line without a
    ``role`` and a ``round``, or the whole file when it cannot be opened."""
    lineno = 0
    try:
        try:
            fh = _open_records(Path(path), "r")
        except OSError:
            if skipped is None:
                raise
            skipped[0] += 1
            return
        with fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line)
                    if skipped is not None and (not isinstance(d, dict) or "role" not in d or "round" not in d):
                        skipped[0] += 1
                        continue
                    rec = RoundRecord.from_dict(d)
                except (json.JSONDecodeError, TypeError, ValueError) as exc:
                    if skipped is not None:
                        skipped[0] += 1
                        continue
                    raise ValueError(f"{path}:{lineno}: not a round record: {exc}") from exc
                yield rec
    except EOFError as exc:  # a run killed while it wrote the file
        raise ValueError(f"{path}: a gzip file cut short (after line {lineno}): {exc}") from exc
    except gzip.BadGzipFile as exc:
        why = "not a gzip file" if lineno == 0 else f"corrupt gzip data after line {lineno}"
        raise ValueError(f"{path}: {why}: {exc}") from exc


def write_records(path: str | os.PathLike, recs: Iterable[RoundRecord]) -> None:
    """Append ``recs`` to ``path`` in one go (flushed at the end)."""
    with RecordWriter(path, flush_each=False) as w:
        for r in recs:
            w.write(r)


def merge_runs(runs: Mapping[str, Iterable[RoundRecord]], path: str | os.PathLike) -> None:
    """Write several runs' records into one file (replacing it), each row labelled with its
    run in ``run`` and sorted by (run, round, role, worker): a scenario's ``rounds.jsonl``."""
    Path(path).unlink(missing_ok=True)
    tagged = []
    for name, recs in runs.items():
        for r in recs:
            r.run = name
            tagged.append(r)
    write_records(path, sorted(tagged, key=lambda r: (r.run, r.round, r.role, r.worker)))

def round_trace(records: Iterable) -> tuple[list[float], list[float]]:
    """Per round (in order): when its last worker finished it (simulated s) and the fraction of the applied
    gradient lost, ``1 - mean_up_frac * mean_down_frac`` over the workers (from the worker records)."""
    by: dict[int, list] = {}
    for r in records:
        if r.role == "worker":
            by.setdefault(r.round, []).append(r)
    ends, lost = [], []
    for k in sorted(by):
        rs = by[k]
        ends.append(max(r.t_start + r.round_latency_s for r in rs))
        up = sum(r.up_received for r in rs) / sum(r.chunks for r in rs)
        down = sum(r.down_received for r in rs) / sum(r.chunks for r in rs)
        lost.append(1.0 - up * down)
    return ends, lost
