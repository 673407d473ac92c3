"""Net builder: Mininet on Linux bridges, no controller, every link shaped with TBF.

Use it as a context manager so that the kernel is left as it was found,
whatever happens::

    from topologies.star import StarTopo
    from emulation.net import EmuNet

    with EmuNet(StarTopo(n=3, bw=100, buffer_pkts=50)) as net:
        srv = net.popen("srv", ["python", "-m", "dblp.transport.server", ...])
        ...

Why our own teardown instead of ``Mininet.stop``: ``stop`` talks to every
node through its interactive shell, which hangs or garbles output if a signal
arrives while a shell is busy, and it does not know about processes started in
a host in the background. Teardown here works from the kernel's side instead:
it kills every process living in one of the run's network namespaces (so the
namespaces and their veth ends vanish), deletes the run's bridges and any
switch-side veth left, and restores the sysctls it changed. It is idempotent
and also runs from SIGINT/SIGTERM handlers; a second signal while it runs
waits until it is done (a Ctrl-C that ``sudo`` forwards to the process group
as well must not cut it short), and its commands run in a session of their own
(the group's signal does not kill them half-way). When it is done,
:func:`teardown_summary` says what was removed and what was not. Each host
namespace carries the run's label inside it (the loopback's ifalias,
:func:`emulation.runstate.netns_label`), and a state file under
``/run/dblpem/`` lets ``python -m emulation.cleanup`` finish the job after
``kill -9`` without touching a namespace that is not the run's any more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host, Node
from mininet.topo import Topo

from dblp.protocol.wire import MAX_MTU, MIN_MTU

from .bridge import IPBridge
from .mnlink import ShapedLink
from .shaping import Shape, apply_shape, qdisc_stats
from .runstate import (STATE_DIR, RunLock, forget_machine_sysctls, netns_label, read_states, record_machine_sysctls,
                       record_teardown, tagged_env, teardown_summary, write_state)
from .sysutil import (BRIDGE_NF_SYSCTLS, RUN_ENV, kill_pids, netns_inode, pids_by_netns, pids_in_netns, pids_with_env,
                      proc_start, run, sysctl_get, sysctl_set)

__all__ = ["EmuNet", "HostsKilled", "ShapedLink", "STATE_DIR", "teardown_summary"]

#: Seconds after a teardown run by a signal handler within which the same signal again is a copy
#: of the one handled (a terminal's Ctrl-C reaches the whole group, ``sudo`` forwards another).
_DUPLICATE_S = 2.0
#: Hosts labelled at once (one short ``ip`` each, in parallel on the cores there are).
_LABEL_BATCH = 64


# BRIDGE_NF_SYSCTLS (emulation.sysutil) are turned off during a run: with them on, frames crossing
# our bridges would also traverse the root namespace's iptables/nftables, whose rules are not ours.
#: Raised (never lowered) by Mininet's fixLimits(); saved and restored by us.
MININET_SYSCTLS = ("fs.file-max", "net.core.wmem_max", "net.core.rmem_max",
                   "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.core.netdev_max_backlog",
                   "net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2",
                   "net.ipv4.neigh.default.gc_thresh3", "net.ipv4.route.max_size",
                   "kernel.pty.max")


class HostsKilled(SystemExit):
    """The run's Mininet hosts were killed from outside (``sudo mn -c`` kills every Mininet shell on
    the machine), so the run cannot go on.

    A SystemExit, so that a scenario ends with its one-line message, not with the traceback of
    whatever failed first in a dead host (a worker's ``LaunchError``, an ``nft`` that found no
    namespace); the message names the hosts and the command that removes what the run left.
    """

    def __init__(self, hosts: Sequence[str], run_id: str) -> None:
        self.hosts = list(hosts)
        super().__init__(f"emulation: the hosts of run {run_id} were killed from outside "
                         f"({', '.join(self.hosts)} gone; `mn -c`?): the run cannot go on. Remove what it "
                         "left with: sudo .venv/bin/python -m emulation.cleanup")


class EmuNet:
    """A running emulated network built from a Mininet ``Topo``.

    shape: apply each link's TBF shaping (both ends). static_arp: preload all
    ARP entries, so a loss rule never has to drop ARP and first packets are not
    delayed. signals: install SIGINT/SIGTERM handlers that tear down and then
    re-raise (main thread only). name: a label used in the run id. mtu: every
    interface's MTU in bytes (9000: jumbo frames, a sixth of the datagrams per
    gradient; the TBF buckets then hold four such frames, :meth:`Shape.fit_mtu`).
    """

    def __init__(self, topo: Topo, *, shape: bool = True, static_arp: bool = True,
                 disable_ipv6: bool = True, signals: bool = True, name: str = "emu",
                 verbosity: str = "warning", mtu: int = 1500) -> None:
        if not (isinstance(mtu, int) and MIN_MTU <= mtu <= MAX_MTU):
            raise ValueError(f"mtu must be an integer number of bytes in [{MIN_MTU}, {MAX_MTU}], got {mtu!r}")
        self.mtu = mtu
        self.topo = topo
        self.shape = shape
        self.static_arp = static_arp
        self.disable_ipv6 = disable_ipv6
        self.signals = signals
        self.run_id = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.verbosity = verbosity
        self.net: Mininet | None = None
        self._procs: list[subprocess.Popen] = []
        self._netns: set[int] = set()
        self._saved_sysctls: dict[str, str] = {}
        self._old_handlers: dict[int, Any] = {}
        self._stopped = False
        self._in_teardown = False
        self.teardown_report: dict | None = None  # what stop() removed and left
        self._teardown_end = 0.0  # time.monotonic() when teardown finished
        self._pending_signal: int | None = None
        self._started = False
        self._lock = threading.RLock()
        self.state_file = STATE_DIR / f"{self.run_id}.json"
        self.switch_names: dict[str, str] = {}  # Topo name -> kernel bridge name
        self._planned_intfs: list[str] = []  # root-namespace switch ports, by Mininet's naming
        self.start_time: float | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "EmuNet":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        killed = self.killed_hosts() if exc_type is not None and not issubclass(exc_type, SystemExit) else []
        self.stop()
        self._restore_signal_handlers()  # after a teardown run by a signal handler (see _on_signal)
        if killed:  # what failed failed because its host is gone: say that, in one line
            raise HostsKilled(killed, self.run_id) from None

    def killed_hosts(self) -> list[str]:
        """The hosts whose shell is gone (killed from outside, e.g. by ``mn -c``) while the net runs."""
        if self.net is None or not self._started or self._stopped:
            return []
        # The shell is our child: poll() reaps it (a killed child stays a zombie, which kill(pid, 0) still
        # finds). A shell still exiting is not yet a zombie but has already dropped its namespace (the kernel
        # releases namespaces before it notifies the parent), so a missing /proc/PID/ns/net counts as gone too.
        return [h.name for h in self.net.hosts
                if getattr(h, "shell", None) is None or h.shell.poll() is not None
                or netns_inode(h.pid) is None]

    def start(self) -> "EmuNet":
        """Build, start and shape the network; on any failure, tear down and re-raise."""
        if os.geteuid() != 0:
            raise PermissionError("EmuNet needs root (network namespaces, tc, nft)")
        setLogLevel(self.verbosity)
        self._install_signal_handlers()
        try:
            with RunLock():  # names, sysctls and state file agree with concurrent runs
                others = read_states(exclude_run=self.run_id)
                self._save_sysctls(others.live)
                for key in BRIDGE_NF_SYSCTLS:
                    if key in self._saved_sysctls:
                        sysctl_set(key, "0")
                self.switch_names = _unique_switch_names(self.topo, others.live_names)
                topo = _renamed(self.topo, self.switch_names)
                self.net = Mininet(topo=topo, switch=IPBridge, controller=None,
                                   link=ShapedLink, autoSetMacs=True, build=False)
                self._planned_intfs = _switch_port_names(topo)
                self._write_state()  # before build: a kill during build still gets undone
                with tagged_env(self.run_id):  # node shells carry the run id: cleanup tells them apart
                    self.net.build()
                self._label_hosts()
                self._netns = {i for h in self.net.hosts if (i := netns_inode(h.pid))}
                self._write_state()
            self.net.start()
            if any(getattr(s, "stp", False) for s in self.net.switches):
                self.net.waitConnected(timeout=30)
            for h in self.net.hosts:
                if self.disable_ipv6:
                    run(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"],
                        pid=h.pid, check=False)
            if self.static_arp:
                self.net.staticArp()
            if self.mtu != 1500:
                self._set_mtu()
            if self.shape:
                self._apply_shapes()
            self._started = True
            self.start_time = time.time()
        except BaseException:
            self.stop()
            self._restore_signal_handlers()  # no __exit__ follows a failed start (see _on_signal)
            raise
        return self

    def stop(self, _from_signal: bool = False) -> None:
        """Tear everything down. Idempotent; safe after a partial start.

        A SIGINT/SIGTERM arriving during teardown is held back until teardown
        is complete, then delivered to the handler that was there before us.
        "In teardown" is marked before anything else (a signal between "stopped"
        and "in teardown" once let the second Ctrl-C of a pair interrupt the
        first one's teardown: bridge, state file and sysctls were left).
        """
        with self._lock:
            if self._stopped or self._in_teardown:
                return
            self._in_teardown = True
        report: dict = {"removed": [], "left": ["everything (teardown did not finish)"]}
        try:
            report = self._teardown()
        finally:
            self._stopped = True
            record_teardown(report)
            self.teardown_report = report
            self._teardown_end = time.monotonic()
            if not _from_signal:  # from the handler: it keeps ours a moment for the copies (_on_signal)
                self._restore_signal_handlers()
            self._in_teardown = False
            pending, self._pending_signal = self._pending_signal, None
            if (pending is not None and not _from_signal
                    and threading.current_thread() is threading.main_thread()):
                os.kill(os.getpid(), pending)

    def _teardown(self) -> dict:
        """Each step goes on whatever the one before did; returns what was removed and what was left."""
        removed: list[str] = []
        left: list[str] = []

        def step(what: str, fn) -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - teardown must go on
                left.append(f"{what} ({type(exc).__name__}: {exc})")

        step("the run's processes", self._end_processes)
        net = self.net
        created = [sw.name for sw in (net.switches if net else []) if getattr(sw, "created", False)]
        ports = [i.name for l in (net.links if net else []) for i in (l.intf1, l.intf2) if not i.node.inNamespace]
        # never a same-named bridge we did not make; then any switch-side veth left
        for name in created + ports:
            if _link_exists(name):
                step(f"interface {name}", lambda n=name: run(["ip", "link", "del", n], check=False, detach=True))
        still_in = pids_by_netns(self._netns)
        gone_ns = [i for i in self._netns if i not in still_in]
        left_ns = len(self._netns) - len(gone_ns)
        if gone_ns:
            removed.append(f"{len(gone_ns)} host namespace{'s' * (len(gone_ns) != 1)}")
        if left_ns:
            left.append(f"{left_ns} host namespace{'s' * (left_ns != 1)} (processes still inside)")
        for what, names in (("bridge", created), ("switch port", ports)):
            gone = [n for n in names if not _link_exists(n)]
            still = [n for n in names if _link_exists(n)]
            if gone:
                removed.append(f"{what}{'s' * (len(gone) != 1)} {', '.join(gone)}" if len(gone) <= 3
                               else f"{len(gone)} {what}s")
            if still:
                left.append(f"{what}{'s' * (len(still) != 1)} {', '.join(still)}")
        step("the sysctls and the state file", lambda: self._release(removed, left))
        return {"removed": removed, "left": left}

    def _end_processes(self) -> None:
        """End what popen started, the node shells, and everything else inside the hosts' namespaces."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)  # mnexec -d made it a session leader
                except (ProcessLookupError, PermissionError):
                    pass
        kill_pids([p.pid for p in self._procs if p.poll() is None], grace_s=0.5)
        for p in self._procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        net = self.net
        nodes: list[Node] = []
        if net is not None:
            nodes = list(net.hosts) + list(net.switches)
            self._netns |= {i for h in net.hosts if h.shell and (i := netns_inode(h.pid))}
        for node in nodes:
            try:
                node.terminate()  # SIGHUP to the shell's group (interactive bash ignores TERM)
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
        # everything still inside our hosts' namespaces: servers, forgotten '&' jobs
        kill_pids(pids_in_netns(self._netns) + pids_with_env(RUN_ENV, self.run_id), grace_s=0.5)

    def _release(self, removed: list[str], left: list[str]) -> None:
        """Under the registry's lock: restore sysctls if no other run lives, delete the state file."""
        with RunLock():
            # the last run standing restores; a live run holds the same originals
            others = read_states(exclude_run=self.run_id).live
            if not others:
                self._restore_sysctls()
                changed = [k for k, v in self._saved_sysctls.items() if sysctl_get(k) != v]
                if changed:
                    left.append(f"sysctls {', '.join(changed)} not restored")
                else:
                    forget_machine_sysctls(self.state_file.parent)  # back in place, and no run left to change them
                    if self._saved_sysctls:
                        removed.append("sysctls restored")
            elif self._saved_sysctls:
                removed.append(f"sysctls kept for {len(others)} other live run{'s' * (len(others) != 1)}")
            self.state_file.unlink(missing_ok=True)
            if self.state_file.exists():
                left.append(f"state file {self.state_file}")
            else:
                removed.append("state file")

    # ---------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Tear down, restore the previous handler, then let the signal do what it did before.

        Where the signal was ignored before us (a run started in the background
        with ``&`` inherits SIGINT ignored), the network is gone all the same, so
        the run cannot go on: KeyboardInterrupt, which the scenarios turn into one
        line and exit status 130, instead of the next step failing on a network
        that is not there any more.
        """
        if self._in_teardown:  # a second Ctrl-C must not cut teardown short
            self._pending_signal = signum
            return
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        if self._stopped:
            # CPython runs no handler while another runs: the copy that came during a teardown
            # run by this handler is handled right after it; it is the same Ctrl-C, dropped
            if time.monotonic() - self._teardown_end < _DUPLICATE_S:
                return
            self._restore_signal_handlers()
            _forward(old, signum, frame)
            return
        self.stop(_from_signal=True)
        if old == signal.SIG_DFL:
            self._restore_signal_handlers()
            os.kill(os.getpid(), signum)  # die by the signal, as without us
        elif callable(old):
            old(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
        else:
            raise KeyboardInterrupt(f"signal {signum}")

    # ---------------------------------------------------------------- state
    def _save_sysctls(self, live: dict[str, dict]) -> None:
        """Remember original sysctl values: the machine's record of them (written now if there is none:
        :func:`emulation.runstate.record_machine_sysctls`, which a kill -9 and a cleanup leave in place
        while a run lives), else a live run's record, else the current ones."""
        inherited: dict[str, str] = {}
        for st in live.values():
            inherited.update(st.get("sysctls") or {})
        current: dict[str, str] = {}
        for key in BRIDGE_NF_SYSCTLS + MININET_SYSCTLS:
            val = inherited.get(key, sysctl_get(key))
            if val is not None:
                current[key] = val
        self._saved_sysctls.update(record_machine_sysctls(current, self.state_file.parent))

    def _restore_sysctls(self) -> None:
        for key, val in self._saved_sysctls.items():
            if sysctl_get(key) != val:
                sysctl_set(key, val)

    def _write_state(self) -> None:
        """Record what a cleanup after ``kill -9`` must undo."""
        net = self.net
        write_state(self.state_file, {
            "run_id": self.run_id,
            "pid": os.getpid(),
            "pid_start": proc_start(os.getpid()),  # the pid alone may name another process later
            "netns_inodes": sorted(self._netns),
            "bridges": sorted(self.switch_names.values()),
            # the switch ports Mininet will create (known before build, so a kill during
            # build leaves nothing unrecorded), plus any it did create in the root namespace
            "root_intfs": sorted(set(self._planned_intfs) | {
                i.name for l in (net.links if net else []) for i in (l.intf1, l.intf2)
                if not i.node.inNamespace}),
            "sysctls": self._saved_sysctls,
        })

    def _label_hosts(self) -> None:
        """Put the run's label inside each host namespace (the loopback's ifalias).

        Why: the state file records each namespace's inode, and the kernel gives
        a freed inode to the next namespace within seconds; cleanup after ``kill -9``
        touches a recorded namespace only if it still carries this label.
        One short ``ip`` per host, ``_LABEL_BATCH`` at a time.
        """
        label = netns_label(self.run_id)
        hosts = [h for h in self.net.hosts if h.inNamespace]  # never the root namespace's loopback
        for i in range(0, len(hosts), _LABEL_BATCH):
            procs = [subprocess.Popen(["mnexec", "-a", str(h.pid), "ip", "link", "set", "dev", "lo", "alias", label],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                     for h in hosts[i:i + _LABEL_BATCH]]
            for h, p in zip(hosts[i:i + _LABEL_BATCH], procs):
                _, err = p.communicate(timeout=30)
                if p.returncode:
                    raise RuntimeError(f"could not label host {h.name}'s namespace: {err.decode().strip()}")

    # ---------------------------------------------------------------- shaping
    def _set_mtu(self) -> None:
        """Every link end, then every bridge (a bridge's MTU follows its ports, but say it)."""
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                run(["ip", "link", "set", "dev", intf.name, "mtu", str(self.mtu)], pid=_ns_pid(intf.node))
        for sw in self.net.switches:
            run(["ip", "link", "set", "dev", sw.name, "mtu", str(self.mtu)], pid=_ns_pid(sw))

    def _apply_shapes(self) -> None:
        for link in self.net.links:
            shape = getattr(link, "shape", None)
            if shape is None:
                continue
            for intf in (link.intf1, link.intf2):
                apply_shape(intf.name, shape.fit_mtu(self.mtu), pid=_ns_pid(intf.node))

    def reshape(self, intf_name: str, shape: Shape) -> None:
        """Change one interface's shaping mid-run (e.g. shrink a bottleneck buffer)."""
        node = self._intf_node(intf_name)
        apply_shape(intf_name, shape.fit_mtu(self.mtu), pid=_ns_pid(node))

    # ---------------------------------------------------------------- access
    @property
    def hosts(self) -> list[str]:
        """Host names, in creation order (srv, w1.., x1..)."""
        return [h.name for h in self.net.hosts]

    def host(self, name: str | Host) -> Host:
        """The Mininet host object."""
        return name if isinstance(name, Node) else self.net[name]

    def ip(self, name: str) -> str:
        """A host's IPv4 address."""
        return self.host(name).IP()

    def address(self, name: str) -> str:
        """Where other hosts reach ``name`` (:class:`dblp.runs.launch.Runner`)."""
        return self.ip(name)

    def host_intf(self, name: str) -> str:
        """Name of a host's (first) interface, e.g. ``srv-eth0``."""
        return self.host(name).defaultIntf().name

    def switch_port(self, name: str) -> str:
        """Switch-side interface of a host's link: the queue towards that host.

        For ``srv`` in the star this is the incast bottleneck where workers'
        uploads and cross-traffic meet; its TBF drops are the congestion loss.
        """
        intf = self.host(name).defaultIntf()
        link = intf.link
        return (link.intf2 if link.intf1 is intf else link.intf1).name

    def switch_cmd(self, name: str, args: Sequence[str], *, check: bool = True, timeout: float = 60.0,
                   input: str | None = None) -> str:
        """Run ``args`` where ``name``'s switch port is (the root namespace: the bridges live there);
        return stdout (:func:`emulation.loss.segment_links`, rules on segmented links)."""
        return run([str(a) for a in args], check=check, timeout=timeout, input=input)

    def shapes(self) -> dict[str, dict | None]:
        """Configured shaping per interface (for the run recorder)."""
        out: dict[str, dict | None] = {}
        for link in self.net.links:
            shape = getattr(link, "shape", None)
            for intf in (link.intf1, link.intf2):
                out[intf.name] = None if shape is None else shape.__dict__.copy()
        return out

    def switch(self, name: str) -> Node:
        """A switch by its Topo name (its bridge may carry another name, see ``switch_names``)."""
        return self.net[self.switch_names.get(name, name)]

    def _intf_node(self, intf_name: str) -> Node:
        for node in list(self.net.hosts) + list(self.net.switches):
            if intf_name in node.intfNames():
                return node
        raise KeyError(f"no interface {intf_name!r} in this net")

    # ---------------------------------------------------------------- processes
    def popen(self, host: str | Host, args: Sequence[str], *, env: dict | None = None,
              **kwargs: Any) -> subprocess.Popen:
        """Start ``args`` in a host's namespace, in the background; killed at teardown.

        The process gets its own session (so teardown can kill its whole group)
        and ``DBLPEM_RUN=<run id>`` in its environment (so the cleanup command
        can find it after a crash). Other kwargs go to ``subprocess.Popen``.
        """
        h = self.host(host)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env[RUN_ENV] = self.run_id
        proc = subprocess.Popen(["mnexec", "-da", str(h.pid), *map(str, args)],
                                env=full_env, **kwargs)
        self._procs.append(proc)
        return proc

    def cmd(self, host: str | Host, args: Sequence[str], *, check: bool = True,
            timeout: float = 60.0, input: str | None = None) -> str:
        """Run ``args`` in a host's namespace, wait, return stdout. Thread-safe."""
        return run([str(a) for a in args], pid=self.host(host).pid, check=check,
                   timeout=timeout, input=input)

    def pid(self, host: str | Host) -> int:
        """PID of the host's shell: ``mnexec -a PID`` / ``nsenter -t PID -n`` enter its netns."""
        return self.host(host).pid

    def qdisc_stats(self) -> dict[str, dict]:
        """Root-qdisc counters of every interface of the net, keyed by interface name."""
        stats: dict[str, dict] = {}
        names_root = {i.name for s in self.net.switches for i in s.intfList()
                      if i.name != "lo"}
        for iname, s in qdisc_stats(pid=None).items():
            if iname in names_root:
                stats[iname] = s
        for h in self.net.hosts:
            for iname, s in qdisc_stats(pid=h.pid).items():
                if iname != "lo":
                    stats[iname] = s
        return stats


def _forward(old: Any, signum: int, frame: Any) -> None:
    """Do what ``old`` (a handler as ``signal.signal`` returns it) does with ``signum``."""
    if callable(old):
        old(signum, frame)
    elif old == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def _ns_pid(node: Node) -> int | None:
    """PID whose netns holds ``node``'s interfaces (None = root namespace)."""
    return node.pid if node.inNamespace else None


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _unique_switch_names(topo: Topo, taken: set[str]) -> dict[str, str]:
    """Kernel names for the Topo's switches that no live run and no interface uses.

    Switches live in the root namespace, so two overlapping runs of the same
    topology would both want ``s1`` and ``s1-eth1``. The first run keeps the
    Topo's names; a later one gets ``s1x2``, ``s1x3``... (Mininet names ports
    ``<switch>-eth<N>``, so the suffix goes on the switch).
    """
    existing = set(os.listdir("/sys/class/net"))
    busy = taken | existing
    prefixes = {n.split("-eth")[0] for n in busy if "-eth" in n}
    out: dict[str, str] = {}
    for name in topo.switches():
        cand, n = name, 1
        while cand in busy or cand in prefixes or cand in out.values():
            n += 1
            cand = f"{name}x{n}"
        max_port = max(topo.ports.get(name, {0: None}))
        if len(f"{cand}-eth{max_port}") > 15:
            raise ValueError(f"switch name {cand!r} too long for Linux interface names")
        out[name] = cand
    return out


def _switch_port_names(topo: Topo) -> list[str]:
    """Root-namespace interface names the switches of ``topo`` will get (``<switch>-eth<N>``)."""
    return sorted(f"{sw}-eth{port}" for sw in topo.switches() for port in topo.ports.get(sw, {}))


def _renamed(topo: Topo, names: dict[str, str]) -> Topo:
    """A copy of ``topo`` with switches renamed (hosts, ports and link options kept)."""
    if all(k == v for k, v in names.items()):
        return topo
    new = Topo()
    for node in topo.nodes(sort=False):
        new.addNode(names.get(node, node), **topo.nodeInfo(node))
    for n1, n2, key, info in topo.links(sort=False, withKeys=True, withInfo=True):
        opts = dict(info)
        a, b = opts.pop("node1"), opts.pop("node2")
        p1, p2 = opts.pop("port1"), opts.pop("port2")
        new.addLink(names.get(a, a), names.get(b, b), port1=p1, port2=p2, key=key, **opts)
    return new
