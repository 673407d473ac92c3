"""Run recorder: one results folder per emulation run, everything a later analysis needs.

Layout of ``results/<name>-<YYYYmmdd-HHMMSS>/``::

    config.json            what was asked for (scenario flags, topology, shaping, versions)
    bursts.jsonl           the burst schedule actually applied (BurstInjector log)
    counters_start.json    tc qdisc + nft counters per interface at start
    counters_end.json      ... and at the end
    records/<role>.jsonl   per-round RoundRecords written by server and workers
                           (dblp/protocol/records.py schema; one file per process, so no
                           two processes append to one file)
    rounds.jsonl           all records/ files merged, sorted by (round, role, worker)
    summary.json           start/end times, counter deltas, record counts

Why files per process: the server and workers run as separate processes in
separate hosts; giving each its own JSONL path (``record_path``) avoids
interleaved partial lines, and the merge at ``finish()`` gives one table.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from dblp.protocol.records import RoundRecord, read_records, write_records


class RunRecorder:
    """Creates and fills a run folder.

    name: run label (folder prefix). root: parent folder (default ``results``) of a new
    timestamped folder; out: the folder itself instead (``--out``; refused if it holds a run).
    config: JSON-able dict saved as config.json (extended with machine facts).
    """

    def __init__(self, name: str, config: dict | None = None, root: str | Path = "results",
                 out: str | Path | None = None) -> None:
        if out is not None:  # the folder itself (--out); never mixed into another run's files
            path = Path(out)
            if (path / "config.json").exists():
                raise FileExistsError(f"--out {out}: that folder already holds a run (config.json); name another")
        else:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            base = Path(root) / f"{name}-{stamp}"
            path, n = base, 1
            while path.exists():  # two runs in the same second
                n += 1
                path = Path(f"{base}-{n}")
        self.path = path
        self.records_dir = self.path / "records"  # made by record_path: a run whose records live elsewhere
        self.path.mkdir(parents=True, exist_ok=out is not None)  # (per policy subfolders): no empty records/
        self.bursts_path = self.path / "bursts.jsonl"
        self.t_start = time.time()
        self.config = dict(config or {})
        self._snapshots: dict[str, dict] = {}
        self.write_json("config.json", {**self.config, "_run": _machine_facts(self.t_start)})

    # ------------------------------------------------------------ paths
    def record_path(self, role: str, worker: int | None = None) -> Path:
        """Where one process writes its RoundRecords: ``records/server.jsonl``, ``records/worker1.jsonl``."""
        name = role if worker is None else f"{role}{worker}"
        self.records_dir.mkdir(exist_ok=True)
        return self.records_dir / f"{name}.jsonl"

    def file(self, name: str) -> Path:
        """Path of any other artefact in the run folder (CSV, PNG, logs)."""
        return self.path / name

    def write_json(self, name: str, obj: Any) -> Path:
        p = self.path / name
        p.write_text(json.dumps(obj, indent=1, default=str))
        return p

    # ------------------------------------------------------------ counters
    def snapshot(self, label: str, net=None, loss=None) -> dict:
        """Save ``counters_<label>.json``: qdisc counters of every interface, nft loss counters.

        net: an ``EmuNet`` (tc -s on every interface); loss: a ``LossController``.
        """
        snap: dict[str, Any] = {"t": time.time(), "label": label}
        if net is not None:
            snap["qdisc"] = net.qdisc_stats()
            snap["shapes"] = net.shapes()
        if loss is not None:
            snap["nft"] = loss.counters()
            snap["loss_targets"] = loss.describe()
        self._snapshots[label] = snap
        self.write_json(f"counters_{label}.json", snap)
        return snap

    # ------------------------------------------------------------ records
    def merge_records(self) -> list[RoundRecord]:
        """Merge every records/*.jsonl into rounds.jsonl, sorted; returns the records."""
        recs: list[RoundRecord] = []
        for f in sorted(self.records_dir.glob("*.jsonl")):
            recs.extend(read_records(f))
        recs.sort(key=lambda r: (r.round, r.role, r.worker))
        out = self.path / "rounds.jsonl"
        if out.exists():
            out.unlink()
        write_records(out, recs)
        return recs

    def finish(self, net=None, loss=None, extra: dict | None = None) -> dict:
        """End snapshot, merged records, summary.json. Returns the summary."""
        if net is not None or loss is not None:
            self.snapshot("end", net=net, loss=loss)
        recs = self.merge_records()
        summary: dict[str, Any] = {
            "t_start": self.t_start, "t_end": time.time(),
            "records": len(recs),
            "rounds": len({r.round for r in recs}),
            "burst_events": _count_lines(self.bursts_path),
        }
        start, end = self._snapshots.get("start"), self._snapshots.get("end")
        if start and end:
            summary["qdisc_delta"] = _delta(start.get("qdisc", {}), end.get("qdisc", {}),
                                            ("sent_packets", "sent_bytes", "dropped", "overlimits"))
            summary["nft_delta"] = _delta(start.get("nft", {}), end.get("nft", {}),
                                          ("seen_packets", "dropped_packets"))
        summary.update(extra or {})
        self.write_json("summary.json", summary)
        return summary


def _delta(a: dict, b: dict, keys: tuple[str, ...]) -> dict:
    out = {}
    for name, s1 in b.items():
        s0 = a.get(name, {})
        out[name] = {k: s1.get(k, 0) - s0.get(k, 0) for k in keys}
    return out


def _count_lines(path: Path) -> int:
    try:
        with open(path, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())
    except FileNotFoundError:
        return 0


def _machine_facts(t: float) -> dict:
    from dblp.cli.provenance import provenance

    from .netem import has_netem

    return {
        "started": t,
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "netem": has_netem(),
        **provenance(),  # commit, dirty flag, package versions
    }
