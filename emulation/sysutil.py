"""Small wrappers around the system tools the emulation drives (ip, tc, nft, sysctl).

Why not Mininet's ``node.cmd``: a Mininet node has one interactive shell, and
``cmd`` is not thread-safe. The burst injector changes nft rules from a timer
thread while the scenario may be using the same host's shell, so every kernel
change here runs as its own short process, entered into the host's namespace
with ``mnexec -a PID`` (the tool Mininet itself uses for ``popen``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

#: Marks every process the emulation starts inside a host (see ``EmuNet.popen``),
#: so ``python -m emulation.cleanup`` can find strays of a killed run.
RUN_ENV = "DBLPEM_RUN"
#: Off on every testbed bridge: with them on, frames crossing a bridge also traverse its
#: namespace's iptables/nftables IP hooks (rules not ours, and per-packet work on every datagram).
BRIDGE_NF_SYSCTLS = ("net.bridge.bridge-nf-call-iptables",
                     "net.bridge.bridge-nf-call-ip6tables",
                     "net.bridge.bridge-nf-call-arptables")
#: ``ifalias`` put on every bridge the builder creates, for the same reason.
BRIDGE_ALIAS = "dblpem"


class CommandError(RuntimeError):
    """A system command failed; carries its stderr so the cause is visible."""


def run(
    args: Sequence[str],
    *,
    pid: int | None = None,
    input: str | None = None,
    check: bool = True,
    timeout: float = 30.0,
    detach: bool = False,
) -> str:
    """Run ``args`` (in the network namespace of ``pid`` when given); return stdout.

    ``check=False`` returns stdout even on failure (for best-effort teardown).
    ``detach``: in a session of its own, so a Ctrl-C sent to our process group
    (a terminal's, or ``sudo`` forwarding one) does not kill the command half-way;
    teardown's commands use it.
    """
    cmd = list(args)
    if pid is not None:
        cmd = ["mnexec", "-a", str(pid)] + cmd
    proc = subprocess.run(
        cmd, input=input, capture_output=True, text=True, timeout=timeout, start_new_session=detach
    )
    if check and proc.returncode != 0:
        raise CommandError(
            f"{' '.join(cmd)!r} failed (rc={proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout


def have(tool: str) -> bool:
    """Whether ``tool`` is on PATH."""
    return shutil.which(tool) is not None


def netns_inode(pid: int | str) -> int | None:
    """Inode of the network namespace of process ``pid`` (None if it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def listening(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a TCP socket listening on ``port`` (IPv4 or IPv6).

    Read from ``/proc/PID/net/tcp{,6}`` - the tables of the process's own network namespace - and
    matched to the process's descriptors by socket inode, so another listener on that port (in
    the same namespace, or the root one before the process entered its own) does not count."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return False
    fds: set[str] = set()
    for fd in names:
        try:
            fds.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed while we looked (the listing's own, for this process)
            pass
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()  # sl local_address rem_address st ... inode (10th)
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port \
                    and f"socket:[{f[9]}]" in fds:
                return True
    return False


def wait_listening(proc: subprocess.Popen, port: int, timeout_s: float = 20.0) -> None:
    """Return once ``proc`` (a server started in a host, e.g. ``iperf3 -s``) listens on TCP ``port``.

    Why not a sleep after starting it: on a loaded machine the server is not listening yet when
    the client connects, and the client fails with "connection refused". Raises
    :class:`CommandError` naming the program if it exits first or is not listening in ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    name = " ".join(map(str, proc.args)) if isinstance(proc.args, (list, tuple)) else str(proc.args)
    while not listening(proc.pid, port):
        if proc.poll() is not None:
            raise CommandError(f"{name!r} exited (rc={proc.returncode}) before listening on TCP port {port}")
        if time.monotonic() > deadline:
            raise CommandError(f"{name!r} was not listening on TCP port {port} after {timeout_s:g} s")
        time.sleep(0.005)


def root_netns_inode() -> int | None:
    """Inode of the root network namespace (that of PID 1)."""
    return netns_inode(1)


def pids_in_netns(inodes: Iterable[int]) -> list[int]:
    """All processes whose network namespace is one of ``inodes``.

    This is how teardown finds everything a run left inside a host, including
    processes started with ``host.cmd('... &')`` that nobody tracked.
    """
    wanted = set(inodes)
    root = root_netns_inode()
    wanted.discard(root)  # never sweep the root namespace
    found = []
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            if netns_inode(entry) in wanted:
                found.append(int(entry))
    return found


def pids_by_netns(inodes: Iterable[int] | None = None) -> dict[int, list[int]]:
    """Processes grouped by the inode of their network namespace (only ``inodes`` when given;
    the root namespace never), in one pass over ``/proc``."""
    wanted = None if inodes is None else set(inodes)
    root = root_netns_inode()
    out: dict[int, list[int]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            ino = netns_inode(entry)
            if ino is not None and ino != root and (wanted is None or ino in wanted):
                out.setdefault(ino, []).append(int(entry))
    return out


def pids_with_env(var: str, value: str | None = None) -> list[int]:
    """Processes whose environment has ``var`` (equal to ``value`` if given)."""
    needle = f"{var}=".encode() + (value.encode() if value is not None else b"")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if (value is None and item.startswith(needle)) or item == needle:
                found.append(int(entry))
                break
    return found


def pids_with_cmdline_prefix(prefix: str) -> list[int]:
    """Processes whose argv contains an argument starting with ``prefix``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(prefix.encode()) for a in argv):
            found.append(int(entry))
    return found


def proc_start(pid: int | str) -> int | None:
    """A process's start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``); None if gone.

    Why: a pid alone does not name a process. The kernel hands a freed pid to the
    next process that asks, so "kill pid 4242 of the dead run" can hit a stranger.
    A pid together with its start time names one process for the machine's uptime.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def kill_pids(pids: Iterable[int], grace_s: float = 1.0, starts: dict[int, int] | None = None) -> int:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL. Returns how many were signalled.

    Each pid is bound to its start time (from ``starts``, e.g. recorded when the
    pid was found, else read on entry), and a process is signalled only while its
    start time is unchanged: a pid that exits during the grace period and is
    handed to another process is never sent the SIGKILL.
    """
    me = os.getpid()
    bound: dict[int, int] = {}
    for p in set(pids):
        st = proc_start(p)
        want = (starts or {}).get(p, st)
        if p != me and st is not None and st == want:
            bound[p] = st
    for p, st in bound.items():
        _signal_if(p, st, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = list(bound)
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _alive(p, bound[p])]
    for p in alive:
        _signal_if(p, bound[p], signal.SIGKILL)
    return len(bound)


def _signal_if(pid: int, start: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it is still the process that started at ``start``.

    (A pid freed and reused between this check and the kill is a window of
    microseconds, against the seconds of a grace period without the check.)
    """
    if proc_start(pid) != start:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int, start: int | None = None) -> bool:
    """Running and not a zombie; with ``start``, also still the same process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(") ", 1)[1]
    except (OSError, IndexError):
        return False
    if rest[0] in "ZX":
        return False
    return start is None or int(rest.split()[19]) == start


def links(pid: int | None = None) -> list[dict]:
    """``ip -j link show`` (in the netns of ``pid``), parsed."""
    out = run(["ip", "-j", "-d", "link", "show"], pid=pid, check=False)
    try:
        return json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        return []


def sysctl_get(key: str) -> str | None:
    """Read a sysctl from /proc/sys (None when the key does not exist)."""
    path = Path("/proc/sys") / key.replace(".", "/")
    try:
        return " ".join(path.read_text().split())
    except OSError:
        return None


def sysctl_set(key: str, value: str) -> bool:
    """Write a sysctl; False when the key does not exist or is read-only."""
    path = Path("/proc/sys") / key.replace(".", "/")
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


# -- device offloads for per-datagram loss with UDP GSO senders (emulation.loss.segment_links) ----------
#: The host end of a link: UDP GSO sends are cut into datagrams by the host's own device (after its
#: netdev egress hook and qdisc, before the wire), and what arrives is merged again by GRO (after the
#: switch end, before the host's ingress hook), so sender and receiver still make one system call per run.
HOST_END_SEGMENTED = {"tx-udp-segmentation": "off", "gro": "on"}
#: The switch end: without TSO a veth hands forwarded packets to its peer's GRO (with TSO it delivers
#: them one by one), so the host end's GRO sees them.
SWITCH_END_SEGMENTED = {"tso": "off"}
#: The defaults of a veth pair (what :func:`offload_args` with ``segmented=False`` sets back).
HOST_END_DEFAULT = {"tx-udp-segmentation": "on", "gro": "off"}
SWITCH_END_DEFAULT = {"tso": "on"}


def offload_args(dev: str, *, switch_end: bool, segmented: bool = True) -> list[str]:
    """The ``ethtool -K`` argv that puts one end of a veth link in the segmented mode (or back)."""
    if switch_end:
        features = SWITCH_END_SEGMENTED if segmented else SWITCH_END_DEFAULT
    else:
        features = HOST_END_SEGMENTED if segmented else HOST_END_DEFAULT
    return ["ethtool", "-K", dev, *(x for kv in features.items() for x in kv)]
