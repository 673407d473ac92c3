"""Lightweight hosts without Mininet: network namespaces, veth pairs, one Linux bridge.

Each host is a network namespace with one interface ``eth0`` (10.77.0.x/24)
whose veth peer is a port of one Linux bridge. The bridge lives in a
namespace of its own, so nothing is added to the root namespace: no
interface, no route, no address, no netfilter rule. The 10.77.0.0/24 range
exists only inside the namespaces and is routed nowhere else.

Every name starts with ``dblpns-<pid>-<n>-`` (``pid``: the creating process,
``n``: a counter per process), so two runs never collide with each other or
with anybody else's namespaces, and a leftover of a killed run can be told
apart and removed::

    from emulation.nshosts import NsNet

    with NsNet(["srv", "w1", "w2", "w3"], rate="1gbit") as net:
        assert net.ping("w1", "srv")
        p = net["srv"].popen(["iperf3", "-s", "-1"])
        print(net["w1"].run(["iperf3", "-c", net["srv"].ip, "-t", "2"]).stdout)

On exit - normal, exception, Ctrl-C, or SIGTERM while the context is open -
every process started through :meth:`NsHost.popen` is ended, every process
still inside one of the namespaces is killed (they are ours: nobody else
enters a ``dblpns-`` namespace), and every namespace is deleted, which also
removes its veth ends, the bridge and any nft table or qdisc inside.

Leftovers of a run killed with SIGKILL: ``python -m emulation.nshosts
--cleanup`` removes ``dblpns-`` namespaces whose creating process is gone
(``--cleanup --all``: every ``dblpns-`` namespace). The creator is its pid
*and* start time: each namespace carries ``dblpns pid=<pid> start=<ticks>`` as
its loopback's ifalias, so a namespace whose creator's pid was handed to
another process is still known to be stale. Listing them:
``ip netns list | grep dblpns-``. A new :class:`NsNet` also removes stale
ones on start.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Iterable, Mapping, Sequence

from dblp.transport.watch import end_process_group
from traces.units import HelpFormatter

from . import nft
from .shaping import Shape, parse_qdisc_stats, qdisc_stats_args, shape_commands, unshape_commands
from .sysutil import BRIDGE_NF_SYSCTLS, kill_pids, proc_start
from traces.argtypes import add_verbosity, add_version

PREFIX = "dblpns-"
SUBNET = ipaddress.ip_network("10.77.0.0/24")
BRIDGE = "br0"
HOST_INTF = "eth0"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_counter = itertools.count()


class NsError(RuntimeError):
    """A system command failed; the message carries the command and its stderr."""


def _ip(args: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NsError(f"'ip {' '.join(args)}' failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of existing network namespaces starting with ``prefix``."""
    out = _ip(["netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(ns: str) -> int | None:
    m = re.match(rf"^{re.escape(PREFIX)}(\d+)-", ns)
    return int(m.group(1)) if m else None


def _label() -> str:
    """The label each namespace of this process carries (its loopback's ifalias): creator pid and start."""
    return f"{PREFIX.rstrip('-')} pid={os.getpid()} start={proc_start(os.getpid())}"


def _owner_start(ns: str) -> int | None:
    """The creator's start time from the label inside ``ns`` (None: no label, e.g. made by an older version)."""
    out = _ip(["-n", ns, "-o", "link", "show", "dev", "lo"], check=False).stdout
    m = re.search(r"alias " + re.escape(PREFIX.rstrip("-")) + r" pid=\d+ start=(\d+)", out)
    return int(m.group(1)) if m else None


def _creator_alive(ns: str) -> bool:
    """Whether the process that made ``ns`` still runs: its pid (from the name) with its start time
    (from the label), so a reused pid does not keep a dead creator's namespace "alive"."""
    pid = _owner_pid(ns)
    if pid is None or not _pid_alive(pid):
        return False
    start = _owner_start(ns)
    return start is None or proc_start(pid) == start


def _kill_ns_processes(ns: str, grace: float = 1.0) -> None:
    """End every process inside namespace ``ns`` (ours by construction: only we enter dblpns-).

    Each process is bound to its start time when found (:func:`emulation.sysutil.kill_pids`),
    so one that exits and whose pid is reused in the grace period is never killed.
    """
    def pids() -> list[int]:
        out = _ip(["netns", "pids", ns], check=False).stdout
        return [int(x) for x in out.split() if x.isdigit() and int(x) != os.getpid()]

    for _ in range(3):  # a process may start another while we end it
        left = pids()
        if not left:
            return
        kill_pids(left, grace_s=grace)
        time.sleep(0.02)


def delete_namespace(ns: str) -> None:
    """Kill what runs inside ``ns`` and delete it (its interfaces, qdiscs and nft tables go with it)."""
    if not ns.startswith(PREFIX):
        raise ValueError(f"refusing to delete {ns!r}: not a {PREFIX} namespace")
    _kill_ns_processes(ns)
    _ip(["netns", "del", ns], check=False)



# -- random-drop rules on a namespace host's link (the benchmark's bursts) ----------
DROP_TABLE = "dblpbench"


def nft_apply(host: "NsHost", proto: str, loss: float, hooks=("ingress", "egress")) -> None:
    """Drop ``loss`` of ``proto`` packets at ``host``'s eth0 (netdev ``hooks``).

    The netdev family hooks the device, as a lossy link would: a drop at the
    inet ``output`` hook instead would fail the sender's ``sendto`` with
    EPERM, which no network does. Rule text: :mod:`emulation.nft`.
    """
    lines: list[str] = []
    for h in hooks:
        chain = nft.chain_name(h, host.intf, proto)
        lines += nft.chain_lines(DROP_TABLE, chain, h, host.intf) + nft.drop_lines(DROP_TABLE, chain,
                                                                                   nft.match(proto), loss)
    host.run(["nft", "-f", "-"], input=nft.script(lines))


def nft_remove(host: "NsHost") -> int:
    """Remove the loss table; returns the packets it dropped."""
    r = host.run(nft.list_counters_args(DROP_TABLE), check=False)
    dropped = nft.dropped_total(nft.parse_counters(r.stdout)) if r.returncode == 0 else 0
    host.run(nft.delete_table_args(DROP_TABLE), check=False)
    return dropped


def cleanup_stale(all_: bool = False) -> list[str]:
    """Delete ``dblpns-`` namespaces whose creating process is gone (``all_``: all of them).

    Returns the names deleted. Host namespaces go before bridge namespaces.
    """
    gone = []
    for ns in sorted(list_namespaces(), key=lambda n: n.endswith("-sw")):
        if all_ or not _creator_alive(ns):
            delete_namespace(ns)
            gone.append(ns)
    return gone


class NsHost:
    """One host: a network namespace with ``eth0`` on the shared bridge."""

    def __init__(self, net: "NsNet", name: str, ns: str, ip: str, port: str) -> None:
        self.net = net
        self.name = name
        self.ns = ns  # the namespace's name (for ``ip netns exec``)
        self.ip = ip
        self.intf = HOST_INTF
        self.port = port  # the bridge-side veth end, inside the bridge namespace

    def __repr__(self) -> str:
        return f"NsHost({self.name!r}, ns={self.ns!r}, ip={self.ip!r})"

    def exec_args(self, cmd: str | Sequence[str]) -> list[str]:
        """The argv that runs ``cmd`` inside this host (a string goes through ``sh -c``)."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, cmd: str | Sequence[str], **kw) -> subprocess.Popen:
        """Start ``cmd`` inside this host; keyword arguments go to :class:`subprocess.Popen`.

        The process gets a session of its own (so Ctrl-C in the terminal
        reaches the orchestrator only, which then ends it in order) and is
        ended when the network closes.
        """
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.exec_args(cmd), **kw)
        self.net._procs.append(proc)
        return proc

    def run(self, cmd: str | Sequence[str], *, check: bool = True, timeout: float | None = 60.0,
            **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside this host to completion; returns the CompletedProcess
        (stdout/stderr captured as text unless overridden). ``check`` raises
        :class:`NsError` with the stderr on a non-zero exit."""
        kw.setdefault("capture_output", "stdout" not in kw and "stderr" not in kw)
        kw.setdefault("text", True)
        proc = subprocess.run(self.exec_args(cmd), timeout=timeout, **kw)
        if check and proc.returncode != 0:
            err = proc.stderr.strip() if isinstance(proc.stderr, str) else ""
            raise NsError(f"{self.name}: {cmd if isinstance(cmd, str) else shlex.join(map(str, cmd))!r} "
                          f"failed (rc={proc.returncode}): {err}")
        return proc

    def shape(self, shape: Shape | None) -> None:
        """Apply TBF ``shape`` to this host's link in both directions (None: remove shaping)."""
        for ns, dev in ((self.ns, self.intf), (self.net.bridge_ns, self.port)):
            if shape is None:
                _ip(["-n", ns, "link", "show", dev])  # fails loudly if the link is gone
                for cmd in unshape_commands(dev):
                    subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True)
                continue
            for cmd in shape_commands(dev, shape):
                proc = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise NsError(f"tc on {self.name}/{dev}: {proc.stderr.strip()}")


class NsNet:
    """Hosts on one bridge. Use as a context manager; :meth:`close` undoes everything.

    ``hosts``: names (lower-case letters/digits, up to 10 characters) or a
    count (``h1..hN``). Addresses are given in order from 10.77.0.1.
    ``rate`` / ``shape``: TBF shaping for every host link, or per host via a
    mapping ``{name: Shape | rate | None}`` (a rate becomes :meth:`Shape.tbf`).
    """

    def __init__(
        self,
        hosts: Sequence[str] | int,
        *,
        rate: float | str | None = None,
        shape: Shape | Mapping[str, Shape | float | str | None] | None = None,
        mtu: int = 1500,
        clean_stale: bool = True,
    ) -> None:
        names = [f"h{i + 1}" for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not names:
            raise ValueError("need at least one host")
        if len(names) > 250:
            raise ValueError("at most 250 hosts fit in 10.77.0.0/24")
        for n in names:
            if not _NAME_RE.match(n):
                raise ValueError(f"bad host name {n!r}: use 1-10 lower-case letters/digits, starting with a letter")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate host names in {names}")
        self.names = names
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.bridge_ns = f"{self.tag}-sw"
        self.mtu = mtu
        self._shapes = self._resolve_shapes(names, rate, shape)
        self.clean_stale = clean_stale
        self.hosts: list[NsHost] = []
        self._made: list[str] = []  # namespaces we created, in creation order
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        self._started = False
        self._old_sigterm = None

    @staticmethod
    def _resolve_shapes(names, rate, shape) -> dict[str, Shape | None]:
        if rate is not None and shape is not None:
            raise ValueError("give rate= or shape=, not both")
        if rate is not None:
            return {n: Shape.tbf(rate) for n in names}
        if isinstance(shape, Shape) or shape is None:
            return {n: shape for n in names}
        unknown = set(shape) - set(names)
        if unknown:
            raise ValueError(f"shape for unknown hosts {sorted(unknown)}")
        return {n: (s if isinstance(s, Shape) or s is None else Shape.tbf(s)) for n, s in
                ((n, shape.get(n)) for n in names)}

    # -- life cycle ----------------------------------------------------------------
    def start(self) -> "NsNet":
        if self._started:
            return self
        if os.geteuid() != 0:
            raise PermissionError("network namespaces need root")
        self._started = True
        atexit.register(self.close)
        if self.clean_stale:
            cleanup_stale()
        try:
            self._add_ns(self.bridge_ns)
            b = ["-n", self.bridge_ns]
            _ip([*b, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
            _ip([*b, "link", "set", BRIDGE, "up"])
            _ip([*b, "link", "set", "lo", "up"])
            for key in BRIDGE_NF_SYSCTLS:  # per namespace where br_netfilter is loaded: frames skip IP hooks
                subprocess.run(["ip", "netns", "exec", self.bridge_ns, "sysctl", "-qw", f"{key}=0"],
                               capture_output=True)
            hosts_ips = SUBNET.hosts()
            for i, name in enumerate(self.names):
                ns = f"{self.tag}-{name}"
                ip = str(next(hosts_ips))
                port = f"p{i}-{name}"[:15]
                self._add_ns(ns)
                _ip([*b, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                     "peer", "name", HOST_INTF, "mtu", str(self.mtu), "netns", ns])
                _ip([*b, "link", "set", port, "master", BRIDGE])
                _ip([*b, "link", "set", port, "up"])
                _ip(["-n", ns, "addr", "add", f"{ip}/{SUBNET.prefixlen}", "dev", HOST_INTF])
                _ip(["-n", ns, "link", "set", HOST_INTF, "up"])
                _ip(["-n", ns, "link", "set", "lo", "up"])
                host = NsHost(self, name, ns, ip, port)
                self.hosts.append(host)
                if self._shapes.get(name) is not None:
                    host.shape(self._shapes[name])
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _ip(["netns", "add", ns])
        self._made.append(ns)
        _ip(["-n", ns, "link", "set", "dev", "lo", "alias", _label()])

    def close(self) -> None:
        """End our processes, delete our namespaces. Idempotent; never raises."""
        if self._closed or not self._started:
            return
        self._closed = True
        for p in self._procs:
            end_process_group(p, 2.0)
        # host namespaces first (their veth ends take the bridge ports with them), bridge last
        for ns in sorted(reversed(self._made), key=lambda n: n == self.bridge_ns):
            try:
                delete_namespace(ns)
            except Exception as exc:  # noqa: BLE001 - teardown must go on
                print(f"nshosts: could not delete {ns}: {exc}", file=sys.stderr)
        left = [n for n in list_namespaces(self.tag + "-")]
        if left:
            print(f"nshosts: namespaces left behind: {left}; remove with "
                  f"'python -m emulation.nshosts --cleanup'", file=sys.stderr)
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "NsNet":
        if threading.current_thread() is threading.main_thread():
            # SIGTERM -> KeyboardInterrupt while the network exists, so `kill PID` cleans up too.
            self._old_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
        try:
            return self.start()
        except BaseException:
            self._restore_sigterm()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # -- access --------------------------------------------------------------------
    def __getitem__(self, name: str) -> NsHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r}; hosts: {self.names}")

    def __iter__(self):
        return iter(self.hosts)

    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on host ``host`` (:class:`dblp.runs.launch.Runner`); ``env`` adds to ours."""
        if env is not None:
            kw["env"] = {**os.environ, **env}
        return self[host].popen(list(argv), **kw)

    def address(self, host: str) -> str:
        """Where other hosts reach ``host`` (:class:`dblp.runs.launch.Runner`)."""
        return self[host].ip

    def cmd(self, host: str, args: Sequence[str], *, input: str | None = None, check: bool = True,
            timeout: float = 60.0) -> str:
        """Run ``args`` on ``host``, return its stdout (the net interface of
        :class:`emulation.loss.LossController`)."""
        return self[host].run(list(args), input=input, check=check, timeout=timeout).stdout

    def host_intf(self, host: str) -> str:
        return self[host].intf

    def switch_port(self, host: str) -> str:
        """The bridge-side veth end of ``host``'s link (in the bridge namespace)."""
        return self[host].port

    def switch_cmd(self, host: str, args: Sequence[str], *, input: str | None = None, check: bool = True,
                   timeout: float = 60.0) -> str:
        """Run ``args`` where ``host``'s link's bridge end is (the bridge namespace); return stdout
        (:func:`emulation.loss.segment_links`, rules on segmented links)."""
        proc = subprocess.run(["ip", "netns", "exec", self.bridge_ns, *map(str, args)], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NsError(f"bridge of {host}: {shlex.join(map(str, args))!r} failed (rc={proc.returncode}): "
                          f"{proc.stderr.strip()}")
        return proc.stdout

    def qdisc_stats(self) -> dict[str, dict]:
        """Root-qdisc counters of every link end, keyed ``<host>:eth0`` and ``<bridge port>``
        (the run recorder's snapshot, as :meth:`emulation.net.EmuNet.qdisc_stats`)."""
        stats: dict[str, dict] = {}
        for h in self.hosts:
            out = h.run(qdisc_stats_args(h.intf), check=False).stdout
            stats.update({f"{h.name}:{k}": v for k, v in parse_qdisc_stats(out, h.intf).items()})
        out = self.switch_cmd(self.names[0], qdisc_stats_args(), check=False)
        stats.update({k: v for k, v in parse_qdisc_stats(out).items() if k.startswith("p")})
        return stats

    def shapes(self) -> dict[str, dict | None]:
        """Configured shaping per host link (both ends carry it), for the run recorder."""
        return {n: None if s is None else s.__dict__.copy() for n, s in self._shapes.items()}

    def namespaces(self) -> list[str]:
        """Every namespace this network made (hosts and bridge)."""
        return list(self._made)

    def ping(self, src: str, dst: str, count: int = 1, timeout_s: float = 2.0) -> bool:
        """Whether ``src`` reaches ``dst`` with ICMP echo (``count`` echoes, all must answer).

        Uses ``ping`` where installed, else a raw-socket echo in Python (root)."""
        ip = self[dst].ip
        if shutil.which("ping"):
            cmd = ["ping", "-n", "-q", "-c", str(count), "-i", "0.2", "-W", str(max(1, int(timeout_s))), ip]
        else:
            cmd = [sys.executable, "-c", _ICMP_ECHO, ip, str(count), str(timeout_s)]
        r = self[src].run(cmd, check=False, timeout=timeout_s * count + 10)
        return r.returncode == 0

    def ping_all(self) -> bool:
        """Every host reaches every other host."""
        return all(self.ping(a, b) for a in self.names for b in self.names if a != b)


_ICMP_ECHO = r"""
import os, socket, struct, sys, time
dst, count, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack(f"!{len(b)//2}H", b)); s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
for seq in range(count):
    body = struct.pack("!d", time.time())
    hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    sock.sendto(struct.pack("!BBHHH", 8, 0, csum(hdr + body), ident, seq) + body, (dst, 0))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0: sys.exit(1)
        sock.settimeout(left)
        try: pkt, addr = sock.recvfrom(2048)
        except socket.timeout: sys.exit(1)
        ihl = (pkt[0] & 0x0F) * 4
        typ, _, _, rid, rseq = struct.unpack("!BBHHH", pkt[ihl:ihl + 8])
        if addr[0] == dst and typ == 0 and rid == ident and rseq == seq: break
"""


def _sigterm_to_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m emulation.nshosts", formatter_class=HelpFormatter,
                                 description="Namespace hosts on one bridge: list or clean up leftovers, or a quick self-check.")
    add_version(ap)  # every entry point answers --version
    ap.add_argument("--cleanup", action="store_true",
                    help="delete dblpns- namespaces whose creating process is gone")
    ap.add_argument("--all", action="store_true", help="with --cleanup: delete every dblpns- namespace")
    ap.add_argument("--list", action="store_true", help="list dblpns- namespaces")
    ap.add_argument("--check", type=int, metavar="N", help="create N hosts, ping all pairs, tear down")
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


def main(argv: Iterable[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(list(argv) if argv is not None else None)
    if os.geteuid() != 0:
        print("nshosts: needs root", file=sys.stderr)
        return 2
    if args.list:
        for ns in list_namespaces():
            print(f"{ns}\t{'alive' if _creator_alive(ns) else 'stale'}")
    if args.cleanup:
        gone = cleanup_stale(all_=args.all)
        print(f"nshosts: deleted {len(gone)} namespace(s)" + (f": {' '.join(gone)}" if gone else ""))
    if args.check:
        with NsNet(args.check) as net:
            ok = net.ping_all()
            print(f"nshosts: {len(net.hosts)} hosts, all pairs reachable: {ok}")
            if not ok:
                return 1
    if not (args.list or args.cleanup or args.check):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
