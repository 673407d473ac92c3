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

Ownership is proven, never assumed from an id the kernel recycles:

- a run's process is its pid *and* start time (``pid_start``, clock ticks from
  ``/proc/<pid>/stat``): a run whose pid now names another process is dead;
- a host namespace is its inode *and* a label inside it (the loopback's ifalias
  ``dblpem run=<run>``, :func:`netns_label`): the kernel hands a freed namespace
  inode to the next namespace within seconds, and the inode alone once made
  cleanup kill another live run's processes;
- a bridge carries ``dblpem pid=<creator> start=<ticks>``: stale only when that
  very process is gone, not when its pid was merely reused.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, NoReturn

from .sysutil import BRIDGE_ALIAS, RUN_ENV, proc_start

STATE_DIR = Path("/run/dblpem")
LOCK_FILE = STATE_DIR / ".lock"


#: What the last teardown in this process removed and left (:func:`teardown_summary`).
_LAST_TEARDOWN: list[dict] = []


def record_teardown(report: dict) -> None:
    """Keep an ``EmuNet`` teardown's report (``removed``/``left``: phrases) for :func:`teardown_summary`."""
    _LAST_TEARDOWN[:] = [report]


def teardown_summary() -> str:
    """One sentence on the last teardown in this process: what was removed, what was not.

    For the scenarios' "interrupted" line: it is printed after the network is
    gone, where the ``EmuNet`` object is out of reach (here, importing needs no Mininet).
    """
    if not _LAST_TEARDOWN:
        return "no emulated network was started"
    r = _LAST_TEARDOWN[-1]
    left = r["left"]
    removed = ", ".join(r["removed"]) or "nothing was left to remove"
    if not left:
        return f"the emulated network was torn down ({removed})"
    return (f"the emulated network was NOT fully torn down: left {'; '.join(left)} "
            f"(removed: {removed}); run `sudo python -m emulation.cleanup`")


def exit_main(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with a scenario's ``main()`` status; on Ctrl-C (130), say what the teardown removed.

    Why here: every emulation scenario ends the same way, and the sentence comes from
    :func:`teardown_summary`, after the network (and the ``EmuNet`` object) is gone.
    """
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted; {teardown_summary()} (partial results stay in the run folder)",
              file=sys.stderr)
        sys.exit(130)


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


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Running (not gone, not a zombie that nobody reaped); with ``start``, still the process
    that started at that tick (not a later one the kernel gave the same pid)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1]
    except (OSError, IndexError):
        return False
    if rest[0] in "ZX":
        return False
    return start is None or proc_start(pid) == start


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
    """The ifalias a testbed bridge carries: marks it as ours and names the process that made it
    (pid and start time, so a reused pid does not keep a dead creator's bridge "alive")."""
    pid = pid if pid is not None else os.getpid()
    start = proc_start(pid)
    return f"{BRIDGE_ALIAS} pid={pid}" + (f" start={start}" if start is not None else "")


def alias_owner(alias: str | None) -> int | None:
    """Creator pid from a bridge's ifalias; 0 for our older bare alias; None: not a testbed bridge."""
    owner = _alias_fields(alias)
    return None if owner is None else owner[0]


def _alias_fields(alias: str | None) -> tuple[int, int | None] | None:
    """(creator pid, its start time or None) from a testbed bridge's ifalias; None: not ours."""
    if not alias:
        return None
    if alias == BRIDGE_ALIAS:
        return 0, None
    m = re.fullmatch(re.escape(BRIDGE_ALIAS) + r" pid=(\d+)(?: start=(\d+))?", alias)
    return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else None


def stale_bridge(alias: str | None) -> bool:
    """A testbed bridge whose creator is gone (safe to delete); False for anybody else's."""
    owner = _alias_fields(alias)
    return owner is not None and (owner[0] == 0 or not pid_alive(*owner))


def netns_label(run_id: str) -> str:
    """The label a run puts inside each host namespace it makes (the loopback's ifalias)."""
    return f"{BRIDGE_ALIAS} run={run_id}"


def netns_label_of(pid: int, inode: int) -> str | None:
    """The label inside the network namespace ``inode``, entered through process ``pid``.

    None when ``pid`` is gone or no longer in that namespace, or the namespace
    carries no label. The namespace is opened first and its inode checked on the
    open descriptor, and ``ip`` enters through that descriptor, so a pid that
    exits and is reused meanwhile cannot make us read another namespace's label.
    """
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_ino != inode:
            return None
        proc = subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", "ip", "-j", "-d", "link", "show",
                               "dev", "lo"], pass_fds=(fd,), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        os.close(fd)
    try:
        return (json.loads(proc.stdout) or [{}])[0].get("ifalias") or None
    except (json.JSONDecodeError, AttributeError, IndexError):
        return None


def owned_netns(run_id: str, inodes: Iterable[int], pids_by_inode: dict[int, list[int]]) -> tuple[set[int], set[int]]:
    """Split the namespace ``inodes`` a run recorded into (still the run's, not the run's any more).

    A namespace is the run's only when it still exists under that inode *and*
    carries the run's label; one whose inode the kernel gave to somebody else
    (no label, or another run's) is not touched, whatever it runs.
    """
    want = netns_label(run_id)
    mine: set[int] = set()
    other: set[int] = set()
    for ino in inodes:
        pids = pids_by_inode.get(ino, [])
        if not pids:
            continue  # gone: nothing to do
        label = next((lab for p in pids[:3] if (lab := netns_label_of(p, ino)) is not None), None)
        (mine if label == want else other).add(ino)
    return mine, other


def state_dir(path: Path | None = None) -> Path:
    """The run registry's directory (``STATE_DIR`` unless a test gives its own)."""
    return STATE_DIR if path is None else Path(path)


def run_alive(state: dict) -> bool:
    """Whether a state file's run still runs: its process, with the recorded start time if any."""
    pid = int(state.get("pid", 0) or 0)
    start = state.get("pid_start")
    return bool(pid) and pid_alive(pid, int(start) if start is not None else None)


def read_states(exclude_run: str | None = None, directory: Path | None = None) -> RunStates:
    """Read every state file; a run is live when its recorded process (pid and start time) still runs."""
    rs = RunStates()
    d = state_dir(directory)
    if not d.is_dir():
        return rs
    for f in sorted(d.glob("*.json")):
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            st = {}
        if not isinstance(st, dict):
            st = {}
        run_id = st.get("run_id", f.stem)
        if run_id == exclude_run:
            continue
        if run_alive(st):
            rs.live[run_id] = st
        else:
            rs.dead.append((f, st))
    return rs


def write_state(path: Path, state: dict) -> None:
    """Atomically replace a run's state file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(path)


# -- the machine's own settings, recorded once ------------------------------------------------------------
#: The file that holds the machine's own sysctl values as they were before the first run changed them
#: (not ``*.json``: :func:`read_states` reads those as runs).
MACHINE_FILE = "machine.settings"


def machine_path(directory: Path | None = None) -> Path:
    """Where the machine's record of its own settings lives (beside the runs' state files)."""
    return state_dir(directory) / MACHINE_FILE


def machine_sysctls(directory: Path | None = None) -> dict[str, str]:
    """The machine's own sysctl values, as recorded by the first run that changed them ({}: none recorded)."""
    try:
        rec = json.loads(machine_path(directory).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    got = rec.get("sysctls") if isinstance(rec, dict) else None
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


def record_machine_sysctls(current: dict[str, str], directory: Path | None = None) -> dict[str, str]:
    """The original values of ``current``'s keys, recorded for the machine before a run changes them.

    Why: a run's state file dies with the run's cleanup, and a run started after another was
    killed sees the changed values as "current". The machine's record is written once (the
    first writer of a key wins, under the caller's :class:`RunLock`), outlives every run and
    cleanup while any run lives, and is removed only by whoever restores it with no run left
    (:func:`forget_machine_sysctls`). Without a record yet, a run's state file (a killed run of
    a version before the record) still beats ``current``."""
    recorded = machine_sysctls(directory)
    originals = dict(recorded)
    if not originals:
        for _, st in _all_states(directory):
            for k, v in (st.get("sysctls") or {}).items():
                originals.setdefault(str(k), str(v))
    out = {k: originals.get(k, v) for k, v in current.items()}
    if {**recorded, **out} != recorded:
        write_state(machine_path(directory), {"sysctls": {**recorded, **out},
                                              "note": "this machine's own values, before a dblpem run changed them"})
    return out


def forget_machine_sysctls(directory: Path | None = None) -> None:
    """Drop the machine's record: its values are back in place and no run is left to change them."""
    machine_path(directory).unlink(missing_ok=True)


def _all_states(directory: Path | None) -> list[tuple[Path, dict]]:
    """Every run's state file (live or dead), for the originals a run recorded."""
    d = state_dir(directory)
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(st, dict):
            out.append((f, st))
    return out
