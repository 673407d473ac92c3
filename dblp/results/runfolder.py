"""A run's results read back from disk: its round records and its ``config.json``.

Every view writes the same layouts, so one module says where a run's records are:

* a records JSONL file (``records-<label>.jsonl[.gz]``, the simulator's and loopback's);
* a recorder's folder (:class:`emulation.recorder.RunRecorder`): ``records/<role>.jsonl``, one
  file per process, and ``rounds.jsonl``, those merged;
* a scenario's folder: ``rounds.jsonl`` merged over its runs, each record labelled with its run,
  and ``<run>/records/*.jsonl`` below it;
* ``bursts.jsonl`` beside them: the burst injector's log, not round records.

:func:`load_run` reads every run of a folder for the comparisons and checks (records labelled by
where they were found); the calibration (:mod:`dblp.sim.studies.calibrate`) takes one process's
view, ``records/`` first, and otherwise the same :func:`record_files`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from dblp.protocol.records import GZIP_SUFFIX, RoundRecord, read_records

__all__ = ["load", "load_run", "record_files", "run_config"]


def load(paths: str | Path | Iterable[str | Path]) -> list[RoundRecord]:
    """The records of JSONL files: one file, every ``*.jsonl`` of a folder (a ``records/`` folder),
    or the files named."""
    if isinstance(paths, (str, Path)):
        p = Path(paths)
        paths = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    out: list[RoundRecord] = []
    for p in paths:
        out.extend(read_records(p))
    return out


def record_files(folder: str | Path) -> list[Path]:
    """The files of a results folder that hold its round records: ``rounds.jsonl`` (the merged
    file) if there is one, else every ``*.jsonl`` and ``*.jsonl.gz`` below it but the burst logs
    (``bursts.jsonl``)."""
    p = Path(folder)
    if (p / "rounds.jsonl").is_file():
        return [p / "rounds.jsonl"]
    found = [*p.rglob("*.jsonl"), *p.rglob("*.jsonl" + GZIP_SUFFIX)]
    return sorted(f for f in found if f.name != "bursts.jsonl")


def load_run(path: str | Path) -> list[RoundRecord]:
    """A run's records from a records JSONL file or a results folder (its :func:`record_files`).

    Among several files, one that holds something else than round records is skipped; a lone one
    is read as records, and what is wrong with it is said. Records without a ``run`` label take the
    name of their policy's subfolder (``<run>/<policy>/records/*.jsonl``) or file
    (``records-<label>.jsonl``)."""
    p = Path(path)
    if p.is_file():
        return [_label(r, p) for r in read_records(p)]
    if not p.is_dir():
        raise ValueError(f"{path}: no such records file or results folder")
    files = record_files(p)
    out: list[RoundRecord] = []
    for f in files:
        try:
            out.extend(_label(r, f, p) for r in read_records(f))
        except ValueError:
            if len(files) == 1:
                raise
            continue  # not a records file
    if not out:
        raise ValueError(f"{path}: no round records (*.jsonl, *.jsonl.gz) found in this folder")
    return out


def _label(r: RoundRecord, f: Path, root: Path | None = None) -> RoundRecord:
    """Fill an unlabelled record's ``run`` from where it was found (see :func:`load_run`):
    ``records-<label>.jsonl[.gz]``, or ``<label>/records/*.jsonl`` below the folder loaded."""
    if not r.run:
        name = f.name.removesuffix(GZIP_SUFFIX).removesuffix(".jsonl")
        if name.startswith("records-"):
            r.run = name[len("records-"):]
        elif f.parent.name == "records" and root is not None and f.parent.parent != root:
            r.run = f.parent.parent.name
    return r


#: config.json keys that say where and when a run was made, not what it ran: left out of a diff
_NOT_A_DIFFERENCE = frozenset({"_run", "derived", "config", "results", "out", "quiet", "verbose", "dry_run"})


def run_config(path: str | Path) -> dict | None:
    """The ``config.json`` of the run at ``path`` (a results folder, or a records file inside one: the
    nearest of its three parent folders that holds one), as :func:`dblp.cli.provenance.run_values` with
    the keys in underscores (files name flags ``p-low`` or, older ones, ``p_low``) and ``_flags``: the
    flags given at its top level; None when there is none."""
    from dblp.cli.provenance import run_values

    p = Path(path)
    for d in ([p] if p.is_dir() else []) + list(p.parents)[:3]:
        f = d / "config.json"
        if f.is_file():
            try:
                cfg = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            if not isinstance(cfg, dict):
                return None
            flat = {k.replace("-", "_"): v for k, v in run_values(cfg).items()}
            flat["_flags"] = [k.replace("-", "_") for k in cfg if k.replace("-", "_") not in _NOT_A_DIFFERENCE]
            return flat
    return None
