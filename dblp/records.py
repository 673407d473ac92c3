"""The per-round record: one row per (round, worker, role), shared by every view.

Loopback runs, Mininet emulation, the SimPy simulator and real hosts all
write this same schema as JSONL, so one analysis and one plotting code serve
them all. "up" is the worker-to-server direction (the worker's DBLP_SEND of
its gradient, the paper's "send latency"); "down" is the server's broadcast
of the averaged gradient.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Iterable, Iterator


@dataclass
class RoundRecord:
    source: str  # "loopback" | "emulation" | "simulation" | "hosts"
    role: str  # "worker" | "server"
    worker: int
    round: int
    t_start: float = 0.0  # seconds (wall clock, or simulated time) when the round began here
    policy: str = ""  # "reliable" | "fixed" | "dblp"
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
    extra: dict = field(default_factory=dict)  # view-specific extras (burst flag, compute time...)

    @property
    def up_frac(self) -> float:
        return self.up_received / self.chunks if self.chunks else float("nan")

    @property
    def down_frac(self) -> float:
        return self.down_received / self.chunks if self.chunks else float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["up_frac"] = self.up_frac
        d["down_frac"] = self.down_frac
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RoundRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


COLUMNS = [f.name for f in fields(RoundRecord)] + ["up_frac", "down_frac"]


class RecordWriter:
    """Appends records to a JSONL file, flushing each line so a killed run keeps its rows."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path else None
        self._fh: IO[str] | None = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, rec: RoundRecord) -> None:
        if self._fh:
            self._fh.write(json.dumps(rec.to_dict(), allow_nan=True) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike) -> Iterator[RoundRecord]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield RoundRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a round record: {exc}") from exc


def write_records(path: str | os.PathLike, recs: Iterable[RoundRecord]) -> None:
    with RecordWriter(path) as w:
        for r in recs:
            w.write(r)
