"""Namespace hosts (emulation/nshosts.py): create, reach, shape, and leave nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 (ip) not installed"),
]

from emulation.nshosts import PREFIX, NsError, NsNet, Shape, cleanup_stale, list_namespaces  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_create_ping_run_popen_cleanup():
    before_links = root_links()
    with NsNet(["srv", "w1", "w2"]) as net:
        made = net.namespaces()
        assert len(made) == 4 and all(n.startswith(PREFIX) for n in made)
        assert set(made) <= set(list_namespaces())
        assert [h.ip for h in net] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
        assert net.ping_all()
        out = net["w1"].run("ip -4 -o addr show dev eth0").stdout
        assert "10.77.0.2/24" in out
        # the hosts see only their own link and loopback
        links = net["w2"].run(["ip", "-o", "link", "show"]).stdout
        assert sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()) == ["eth0", "lo"]
        sleeper = net["srv"].popen(["sleep", "300"])
        assert sleeper.poll() is None
        with pytest.raises(NsError):
            net["srv"].run(["false"])
        assert net["srv"].run(["false"], check=False).returncode == 1
        ours = {h.port for h in net} | {"br0"}
        # (other engineers' Mininet runs may add root interfaces meanwhile: look for ours only)
        assert not (root_links() - before_links) & ours, "the root namespace must not gain our interfaces"
    assert sleeper.poll() is not None, "popen'd processes end with the network"
    assert not set(made) & set(list_namespaces())
    assert not (root_links() - before_links) & ours


def test_cleanup_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with NsNet(2) as net:
            made = net.namespaces()
            net["h1"].popen(["sleep", "300"])
            raise RuntimeError("boom")
    assert not set(made) & set(list_namespaces())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cleanup_on_signal(sig):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from emulation.nshosts import NsNet
        with NsNet(2) as net:
            net["h1"].popen(["sleep", "300"])
            print(" ".join(net.namespaces()), flush=True)
            time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        names = p.stdout.readline().split()
        assert len(names) == 3, p.stderr.read()
        assert set(names) <= set(list_namespaces())
        p.send_signal(sig)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not set(names) & set(list_namespaces())


def test_stale_namespaces_of_a_killed_run_are_removed():
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from emulation.nshosts import NsNet
        net = NsNet(2).start()
        print(" ".join(net.namespaces()), flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    names = p.stdout.readline().split()
    p.kill()  # SIGKILL: no cleanup runs
    p.wait()
    assert len(names) == 3 and set(names) <= set(list_namespaces())
    gone = cleanup_stale()
    assert set(names) <= set(gone)
    assert not set(names) & set(list_namespaces())


def test_cleanup_keeps_live_runs():
    with NsNet(1) as net:
        cleanup_stale()  # our own process is alive: nothing of ours goes
        assert set(net.namespaces()) <= set(list_namespaces())


def test_tbf_shaping():
    with NsNet(["a", "b"], rate="100mbit") as net:
        for ns, dev in ((net["a"].ns, "eth0"), (net.bridge_ns, net["a"].port)):
            q = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev],
                               capture_output=True, text=True, check=True).stdout
            assert "tbf" in q and "100Mbit" in q
        if shutil.which("iperf3"):
            from emulation.sysutil import wait_listening

            srv = net["b"].popen(["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_listening(srv, 5201)  # (a 0.3 s sleep here: refused whenever iperf3 started later)
            import json
            out = net["a"].run(["iperf3", "-c", net["b"].ip, "-t", "1", "-J"], timeout=30).stdout
            bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
            assert 50e6 < bps < 110e6
            srv.wait(10)
        net["a"].shape(None)
        q = net["a"].run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "tbf" not in q


def test_bad_arguments():
    with pytest.raises(ValueError):
        NsNet(["Bad_Name"])
    with pytest.raises(ValueError):
        NsNet(["a", "a"])
    with pytest.raises(ValueError):
        NsNet(["a"], shape={"zz": Shape.tbf("1gbit")})
    with pytest.raises(ValueError):
        Shape.tbf("fast")


def test_wait_listening_sees_the_servers_own_socket_only():
    """emulation.sysutil.wait_listening, the barrier before a client connects to a server just started:
    a listener counts only when it is the server's own, and a server that exits first is named."""
    import socket

    from emulation.sysutil import CommandError, listening, wait_listening

    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        assert listening(os.getpid(), port) and not listening(os.getpid(), port + 1 if port < 65535 else 1)
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert not listening(other.pid, port)  # the port is listened on, but not by this process
            t = time.monotonic()
            with pytest.raises(CommandError, match=f"'sleep 30' was not listening on TCP port {port} after 0.2 s"):
                wait_listening(other, port, timeout_s=0.2)
            assert time.monotonic() - t >= 0.2
        finally:
            other.kill()
            other.wait()
    with pytest.raises(CommandError, match=r"'false' exited \(rc=1\) before listening on TCP port 5201"):
        wait_listening(subprocess.Popen(["false"]), 5201)
    six = "try:\n s = socket.create_server(('::', 0), family=socket.AF_INET6)\nexcept OSError:\n s = socket.create_server(('127.0.0.1', 0))\n"
    server = subprocess.Popen([sys.executable, "-c", "import socket, time\n" + six +
                               "print(s.getsockname()[1], flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        wait_listening(server, port, timeout_s=10)  # an IPv6 (dual-stack) listener where there is IPv6, as iperf3 -s makes
        assert listening(server.pid, port)
    finally:
        server.kill()
        server.wait()
