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
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

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
        """Whether ``pid`` descends from a live run's process (e.g. its Mininet shells)."""
        live = self.live_pids
        p: int | None = pid
        for _ in range(16):
            if p in live:
                return True
            p = ppid(p) if p else None
            if not p or p <= 1:
                return False
        return False


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
