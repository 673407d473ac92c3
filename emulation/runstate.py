"""Registry of emulation runs on this machine: state files and a cross-process lock.

Why: several runs may overlap (a scenario in one terminal, the emulation tests
in another). They share the root namespace, where bridges and switch-side
veths live, and global sysctls. Each run writes ``/run/dblpem/<run>.json``
(what it created, which sysctls it changed and their original values), and
all starts/stops take one ``flock`` so that:

- a new run picks bridge names no live run uses;
- the original sysctl values are inherited from live runs, and only the last
  run to stop restores them (otherwise run A would restore under run B's feet,
  or B would "restore" A's modified values forever);
- ``python -m emulation.cleanup`` can undo a run that was killed with -9, and
  leaves live runs alone.

It is also the one home of *ownership*: what marks a thing as the testbed's,
so that cleanup touches only what the testbed made and never a plain Mininet
session beside it. Processes (Mininet shells included) carry ``DBLPEM_RUN=<run>``
in their environment (:func:`tagged_env`); bridges carry the ifalias
``dblpem pid=<creator>`` (:func:`bridge_alias`); root-namespace veths are listed
in the run's state file before they exist.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .sysutil import BRIDGE_ALIAS, RUN_ENV

STATE_DIR = Path("/run/dblpem")
LOCK_FILE = STATE_DIR / ".lock"


class RunLock:
    """Process-wide reentrant lock that is also an ``flock`` across processes.

    Reentrant because teardown can run from a signal handler while the same
    thread is inside ``start()`` holding the lock.
    """

    _rlock = threading.RLock()
    _depth = 0
    _fd: int | None = None

    def __enter__(self) -> "RunLock":
        RunLock._rlock.acquire()
        if RunLock._depth == 0:
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            RunLock._fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(RunLock._fd, fcntl.LOCK_EX)
        RunLock._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        RunLock._depth -= 1
        if RunLock._depth == 0 and RunLock._fd is not None:
            fcntl.flock(RunLock._fd, fcntl.LOCK_UN)
            os.close(RunLock._fd)
            RunLock._fd = None
        RunLock._rlock.release()


def pid_alive(pid: int) -> bool:
    """Running (not gone, not a zombie that nobody reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"


def ppid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


@dataclass
class RunStates:
    """What the state files say: live runs (process alive) and dead ones."""

    live: dict[str, dict] = field(default_factory=dict)  # run_id -> state
    dead: list[tuple[Path, dict]] = field(default_factory=list)

    @property
    def live_pids(self) -> set[int]:
        return {int(s.get("pid", 0)) for s in self.live.values()}

    @property
    def live_names(self) -> set[str]:
        """Root-namespace interface names (bridges, switch ports) owned by live runs."""
        out: set[str] = set()
        for s in self.live.values():
            out |= set(s.get("bridges", [])) | set(s.get("root_intfs", []))
        return out

    @property
    def live_netns(self) -> set[int]:
        out: set[int] = set()
        for s in self.live.values():
            out |= set(s.get("netns_inodes", []))
        return out

    def owned_by_live(self, pid: int) -> bool:
        """Whether ``pid`` belongs to a live run: tagged with its id, or descended from its process."""
        if run_tag(pid) in self.live:
            return True
        live = self.live_pids
        p: int | None = pid
        for _ in range(16):
            if p in live:
                return True
            p = ppid(p) if p else None
            if not p or p <= 1:
                return False
        return False


def run_tag(pid: int) -> str | None:
    """The run id in a process's ``DBLPEM_RUN`` (None: not started by a testbed run, or gone)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = RUN_ENV.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


@contextmanager
def tagged_env(run_id: str) -> Iterator[None]:
    """Within the block, processes this one starts inherit ``DBLPEM_RUN=run_id``.

    Why: Mininet starts each node's shell with the caller's environment and no
    way to pass another, and a shell left by a killed run must be told apart
    from the shells of a plain ``mn`` session running beside it.
    """
    old = os.environ.get(RUN_ENV)
    os.environ[RUN_ENV] = run_id
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(RUN_ENV, None)
        else:
            os.environ[RUN_ENV] = old


def bridge_alias(pid: int | None = None) -> str:
    """The ifalias a testbed bridge carries: marks it as ours and names the process that made it."""
    return f"{BRIDGE_ALIAS} pid={pid if pid is not None else os.getpid()}"


def alias_owner(alias: str | None) -> int | None:
    """Creator pid from a bridge's ifalias; 0 for our older bare alias; None: not a testbed bridge."""
    if not alias:
        return None
    if alias == BRIDGE_ALIAS:
        return 0
    m = re.fullmatch(re.escape(BRIDGE_ALIAS) + r" pid=(\d+)", alias)
    return int(m.group(1)) if m else None


def stale_bridge(alias: str | None) -> bool:
    """A testbed bridge whose creator is gone (safe to delete); False for anybody else's."""
    owner = alias_owner(alias)
    return owner is not None and (owner == 0 or not pid_alive(owner))


def read_states(exclude_run: str | None = None) -> RunStates:
    """Read every state file; a run is live when its recorded process still runs."""
    rs = RunStates()
    if not STATE_DIR.is_dir():
        return rs
    for f in sorted(STATE_DIR.glob("*.json")):
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            st = {}
        run_id = st.get("run_id", f.stem)
        if run_id == exclude_run:
            continue
        pid = int(st.get("pid", 0) or 0)
        if pid and pid_alive(pid):
            rs.live[run_id] = st
        else:
            rs.dead.append((f, st))
    return rs


def write_state(path: Path, state: dict) -> None:
    """Atomically replace a run's state file."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(path)
