"""What made a result: the code's commit (and whether it had uncommitted changes), the package
versions and the machine - written beside every run's resolved configuration, so a number in a
table can be traced to the code and the setup that produced it, and the run repeated
(``--config`` takes the same file back)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["provenance", "write_config", "PACKAGES"]

ROOT = Path(__file__).resolve().parent.parent
#: the distributions whose versions a run records
PACKAGES = ("dblp-testbed", "numpy", "torch", "torchvision", "simpy", "scapy", "mininet", "matplotlib", "scipy",
            "transformers", "dask", "distributed")


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def provenance() -> dict[str, Any]:
    """The commit, its dirty flag, package versions (None: not installed) and machine facts."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    commit = _git("rev-parse", "HEAD")
    return {
        "git_commit": commit or None,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None,
        "packages": versions,
        "python": platform.python_version(),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, float) and v != v:
        return None
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def write_config(folder: str | os.PathLike, args: Any, name: str = "config.json") -> Path:
    """Write the run's resolved flags (``vars(args)``) and :func:`provenance` into ``folder/name``."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = vars(args) if not isinstance(args, dict) else args
    path.write_text(json.dumps({**_plain(dict(flags)), "_run": provenance()}, indent=1))
    return path
