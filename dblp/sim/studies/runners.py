"""Where a sweep's simulations run, and the disk cache that lets a sweep resume.

Three ways, one interface (:func:`run_tasks`: configurations in, summaries
out, each written to the cache the moment it is done):

* **in process** (``jobs=1``): for tests and debugging;
* **local process pool** (the default): all cores of this machine, no
  service needed;
* **Dask distributed** (``dask="tcp://host:8786"``): the configurations go
  to a running scheduler's workers - many machines. Every worker needs this
  project importable (``pip install -e '.[cluster]'`` on each, same code).
  ``dask`` and ``distributed`` are the optional extra ``cluster``.

The **cache** is a folder of one small JSON file per finished simulation,
named by the SHA-256 of the configuration (:func:`config_key`) and of
:data:`CACHE_VERSION`. A sweep that is interrupted (Ctrl-C, a lost
cluster) keeps every finished point; run the same command again and only
the missing ones are simulated. Bump :data:`CACHE_VERSION` when the
simulator's results change, so old entries are not reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable

from dblp.protocol.wire import ParameterError
from dblp.sim.config import SimConfig

# 2: the round level's port draws one uniform per datagram from a stream per pass (dblp.sim.network.net.FluidQueue)
# 3: summaries carry the per-round trace time to accuracy is computed from (_round_end_s, _round_lost)
CACHE_VERSION = 3

Runner = Callable[[dict], dict]


def config_key(cfg: SimConfig) -> str:
    """A configuration's identity: SHA-256 of its canonical JSON and the cache version."""
    text = json.dumps({"v": CACHE_VERSION, "config": cfg.to_dict()}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


class ResultCache:
    """Finished simulations on disk: ``<folder>/<key[:2]>/<key>.json`` = {config, summary}."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str, cfg: SimConfig) -> dict | None:
        p = self._path(key)
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None  # absent, or cut short by a crash: simulate again
        if d.get("config") != json.loads(json.dumps(cfg.to_dict())):
            return None  # a hash collision or a hand-edited file: do not trust it
        return d.get("summary")

    def put(self, key: str, cfg: SimConfig, summary: dict) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"config": cfg.to_dict(), "summary": summary}, default=float)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")  # atomic: a reader never sees half a file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, p)


def run_tasks(tasks: dict[str, SimConfig], runner: Runner, *, jobs: int = 0, dask: str | None = None,
              cache: ResultCache | None = None, progress: bool = True) -> tuple[dict[str, dict], int]:
    """Summaries of ``tasks`` (key -> configuration) and how many came from the cache."""
    results: dict[str, dict] = {}
    todo: list[tuple[str, SimConfig]] = []
    for k, c in tasks.items():
        hit = cache.get(k, c) if cache is not None else None
        if hit is not None:
            results[k] = hit
        else:
            todo.append((k, c))
    cached = len(results)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), initial=cached, desc="sweep", unit="run", smoothing=0.1)

    def done(k: str, summary: dict) -> None:
        results[k] = summary
        if cache is not None:
            cache.put(k, tasks[k], summary)
        if bar:
            bar.update()

    try:
        if not todo:
            pass
        elif dask:
            _run_dask(todo, runner, dask, done)
        elif (jobs or os.cpu_count() or 1) == 1:
            for k, c in todo:
                done(k, runner(c.to_dict()))
        else:
            ex = ProcessPoolExecutor(max_workers=min(jobs or os.cpu_count() or 1, len(todo)))
            try:
                futs = {ex.submit(runner, c.to_dict()): k for k, c in todo}
                for f in as_completed(futs):
                    done(futs[f], f.result())
            finally:  # on Ctrl-C or a failed run, drop the queued runs instead of waiting for all of them
                ex.shutdown(wait=True, cancel_futures=True)
    finally:
        if bar:
            bar.close()
    return results, cached


def _run_dask(todo: Iterable[tuple[str, SimConfig]], runner: Runner, address: str,
              done: Callable[[str, dict], None]) -> None:
    try:
        from distributed import Client, as_completed as dask_completed
    except ImportError:
        raise ParameterError("--dask needs the 'cluster' extra: pip install -e '.[cluster]' "
                             "(dask and distributed)") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise ParameterError(f"--dask {address}: cannot reach the scheduler: {exc}") from None
    try:
        todo = list(todo)
        futs = client.map(runner, [c.to_dict() for _, c in todo], key=[f"dblp-sim-{k}" for k, _ in todo],
                          pure=False)
        keys = {f.key: k for f, (k, _) in zip(futs, todo)}
        for f in dask_completed(futs):
            done(keys[f.key], f.result())
    finally:
        client.close()


def connect_check(address: str) -> None:
    """Fail early, naming the flag, when ``--dask`` is given but cannot work."""
    if not address.startswith(("tcp://", "tls://", "ws://", "wss://", "inproc://", "ucx://")) and ":" not in address:
        raise ParameterError(f"--dask must be a scheduler address such as tcp://host:8786, got {address!r}")


def describe(jobs: int, dask: str | None) -> str:
    """Where the runs went, for the sweep's summary line."""
    return f"Dask scheduler {dask}" if dask else f"{jobs or os.cpu_count() or 1} processes"
