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
from typing import Any, Iterable

__all__ = ["provenance", "write_config", "PACKAGES", "code_version", "remember_flags", "flags_of", "config_record",
           "run_values", "plain"]

ROOT = Path(__file__).resolve().parents[2]
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
        "load": load_average(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (None where the platform has none): a run on a machine shared
    with other work is slower per datagram, so a calibration says what load it was measured under."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def code_version() -> str:
    """The testbed's version and commit (``--version``'s answer; one home: :func:`traces.argtypes.code_version`)."""
    from traces.argtypes import code_version as version

    return version()


#: id(namespace) -> (weak reference, {dest: (flag name, value as given)}): every Namespace that
#: dblp.cli.args' parser returned, so that write_config writes the flags as they were given ("500M",
#: not the 500000000.0 bit/s they became) and keeps the values the run used apart; and the dests that
#: steer the parser only (--config, --print-config), written nowhere
_FLAGS: dict[int, tuple[Any, dict[str, tuple[str, Any]], frozenset[str]]] = {}


def remember_flags(ns: Any, flags: dict[str, tuple[str, Any]], hidden: Iterable[str] = ()) -> None:
    """Record a parsed Namespace's flags: dest -> (long flag name, value as given); ``hidden``: dests
    that are not the run's (``config``, ``print_config``)."""
    import weakref

    key = id(ns)
    _FLAGS[key] = (weakref.ref(ns, lambda _r: _FLAGS.pop(key, None)), dict(flags), frozenset(hidden))


def flags_of(args: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(flags, derived)`` of a Namespace the parser returned (None for any other object).

    ``flags``: long flag name -> value as given (what ``--config`` reads back: the same flags give the
    same Namespace). ``derived``: every value of the Namespace that is not its flag's text as given -
    a rate in bit/s, a count the run rounded to whole epochs, what the run added (``elements``,
    ``policy_list``) - so that readers of a run's config (``dblp.sim.studies.calibrate``) find the values the
    run used, under the names the Namespace has."""
    entry = _FLAGS.get(id(args))
    if entry is None or entry[0]() is not args:
        return None
    _, by_dest, hidden = entry
    flags = {key: raw for key, raw in by_dest.values()}
    derived = {k: v for k, v in vars(args).items()
               if k not in hidden and (k not in by_dest or _plain(v) != _plain(by_dest[k][1]))}
    return flags, derived


def config_record(args: Any) -> dict[str, Any]:
    """What a run's ``config.json`` holds besides ``_run``: the flags at the top level and ``derived``
    apart (:func:`flags_of`), or, for a dict or a Namespace the testbed's parser did not make, all of it."""
    split = flags_of(args) if not isinstance(args, dict) else None
    if split is None:
        return _plain(dict(args if isinstance(args, dict) else vars(args)))
    flags, derived = split
    return {**_plain(flags), "derived": _plain(derived)}


def run_values(config: dict[str, Any]) -> dict[str, Any]:
    """The values a run used, from its ``config.json``: the flags overlaid with ``derived`` (older files,
    without ``derived``, are already that)."""
    derived = config.get("derived")
    flat = {k: v for k, v in config.items() if k != "derived"}
    if isinstance(derived, dict):
        flat.update(derived)
    return flat


def plain(v: Any) -> Any:
    """A value as JSON holds it: paths and other objects as their text, NaN as null."""
    return _plain(v)


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
    """Write the run's flags and :func:`provenance` into ``folder/name``.

    For a Namespace from the testbed's parser (:mod:`dblp.cli.args`) the top level holds exactly the
    flags, as given (``"bandwidth": "500M"``), so ``--config folder/config.json`` reruns the run; what
    the run derived from them (or changed after parsing: whole epochs, a resolved model size) goes
    under ``derived``, the provenance under ``_run``; ``--config`` skips both. Any other object
    (a dict, a plain Namespace) is written whole.
    """
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**config_record(args), "_run": provenance()}, indent=1))
    return path
