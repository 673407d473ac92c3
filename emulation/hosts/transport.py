"""How a shell line reaches a host: ssh, a network namespace on this machine, or a local process.

Why three: ``ssh`` is the real thing; ``netns`` (every host a namespace of
:class:`emulation.nshosts.NsNet`, veth links on one bridge, TBF shaping)
runs the same remote shell lines, pid files, nft rules and ``tar`` gathering
end to end without ssh; ``local`` (plain processes on loopback, no root, no
loss rules) checks the launcher quickly. Every transport is also an
:class:`dblp.runs.launch.Runner` (``popen(host, argv)``, ``address(host)``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import Any, Sequence

from .inventory import HostsError, HostSpec, Inventory


class Transport:
    """How to run a shell script on a host. Subclasses: ssh, netns, local."""

    name = "?"

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def argv(self, host: HostSpec, script: str) -> list[str]:
        raise NotImplementedError

    def data_address(self, host: HostSpec) -> str:
        raise NotImplementedError

    def bind_address(self, host: HostSpec) -> str:
        return "0.0.0.0"

    def start(self, host: HostSpec, script: str, **kw: Any) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.argv(host, script), **kw)

    # -- dblp.runs.launch.Runner -------------------------------------------------------
    def popen(self, host: str, argv: Sequence[str], *, env: dict | None = None, **kw: Any) -> subprocess.Popen:
        """Start ``argv`` on the host named ``host`` (in its workdir, ``env`` added)."""
        h = self.inv.host(host)
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**h.env, **(env or {})}.items())
        kw.pop("cwd", None)  # the remote side: the host's workdir
        return self.start(h, f"cd {shlex.quote(h.workdir)} && exec env {envs} {shlex.join(list(argv))}", **kw)

    def address(self, host: str) -> str:
        return self.data_address(self.inv.host(host))

    def run(self, host: HostSpec, script: str, *, input: str | bytes | None = None, timeout: float = 60.0,
            text: bool = True) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.argv(host, script), input=input, capture_output=True, text=text,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HostsError(f"host {host.name}: {script!r} took more than {timeout:g} s "
                             f"({'ssh to ' + host.address if self.name == 'ssh' else self.name})") from exc


class SshTransport(Transport):
    """``ssh [-p PORT] [-i KEY] [OPTIONS] user@address -- SCRIPT``; BatchMode, so a password prompt fails fast."""

    name = "ssh"

    def argv(self, host: HostSpec, script: str) -> list[str]:
        a = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15"]
        if host.ssh_port != 22:
            a += ["-p", str(host.ssh_port)]
        if host.identity:
            a += ["-i", os.path.expanduser(host.identity)]
        a += list(host.ssh_options)
        a += [f"{host.user}@{host.address}" if host.user else host.address, "--", script]
        return a

    def data_address(self, host: HostSpec) -> str:
        return host.data_address or host.address


class NetnsTransport(Transport):
    """Hosts as network namespaces on this machine (:class:`emulation.nshosts.NsNet`)."""

    name = "netns"

    def __init__(self, inv: Inventory) -> None:
        super().__init__(inv)
        from ..nshosts import NsNet
        from ..shaping import FRAME_BYTES, Shape

        shape = None
        if inv.network.bandwidth:
            shape = Shape.tbf(inv.network.bandwidth, queue_bytes=inv.network.queue_packets * FRAME_BYTES)
        self.net = NsNet([h.name for h in inv.hosts], shape=shape)
        self.net.start()

    def close(self) -> None:
        self.net.close()

    def argv(self, host: HostSpec, script: str) -> list[str]:
        return self.net[host.name].exec_args(["sh", "-c", script])

    def start(self, host: HostSpec, script: str, **kw: Any) -> subprocess.Popen:
        return self.net[host.name].popen(["sh", "-c", script], **kw)  # ended by NsNet.close too

    def data_address(self, host: HostSpec) -> str:
        return self.net[host.name].ip

    def namespaces(self) -> list[str]:
        return self.net.namespaces()


class LocalTransport(Transport):
    """Plain local processes on loopback (no root, no loss rules): for quick checks of the launcher."""

    name = "local"

    def argv(self, host: HostSpec, script: str) -> list[str]:
        return ["sh", "-c", script]

    def data_address(self, host: HostSpec) -> str:
        return "127.0.0.1"

    def bind_address(self, host: HostSpec) -> str:
        return "127.0.0.1"


def make_transport(inv: Inventory) -> Transport:
    if inv.run.transport == "ssh":
        if shutil.which("ssh") is None:
            raise HostsError("transport 'ssh' needs the ssh client (apt-get install openssh-client)")
        return SshTransport(inv)
    if inv.run.transport == "netns":
        if os.geteuid() != 0:
            raise HostsError("transport 'netns' needs root (network namespaces)")
        return NetnsTransport(inv)
    return LocalTransport(inv)

