"""Teardown on normal exit, exception, SIGINT, SIGTERM; the cleanup command after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSCTL = "net.bridge.bridge-nf-call-iptables"

CHILD = r"""
import signal, sys, time
# Ctrl-C as in a terminal, also when the test run itself was started in the background (which
# leaves SIGINT ignored, and a child inherits that)
signal.signal(signal.SIGINT, signal.default_int_handler)
from topologies.star import StarTopo
from emulation.net import EmuNet
from emulation.loss import LossController, LossTarget
with EmuNet(StarTopo(n=2, bw=50)) as net:
    LossController(net).set_loss(LossTarget("srv"), 0.5)
    p = net.popen("w1", ["sleep", "300"])
    net.cmd("w2", ["bash", "-c", "sleep 300 >/dev/null 2>&1 &"])  # an untracked '&' job
    print("READY", p.pid, flush=True)
    time.sleep(300)
"""


def _sysctl() -> str | None:
    from emulation.sysutil import sysctl_get

    return sysctl_get(SYSCTL)


def _start_child(tmp_path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line.split()[1])


def _gone(pid: int) -> bool:
    from emulation.runstate import pid_alive

    return not pid_alive(pid)


def test_cleanup_help():
    out = subprocess.run([sys.executable, "-m", "emulation.cleanup", "--help"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0 and "kill -9" in out.stdout and "--dry-run" in out.stdout


@pytest.mark.mininet
def test_cleanup_command_when_clean():
    out = subprocess.run([sys.executable, "-m", "emulation.cleanup"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr


@pytest.mark.mininet
def test_exception_tears_down():
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    before = _sysctl()
    with pytest.raises(RuntimeError, match="boom"):
        with EmuNet(StarTopo(n=1)) as net:
            assert _sysctl() in (None, "0")  # bridged frames skip root netfilter during a run
            pid = net.popen("w1", ["sleep", "300"]).pid
            raise RuntimeError("boom")
    assert _gone(pid)
    assert _sysctl() == before
    # autouse fixture asserts no interfaces, bridges, shells, tables, netns are left


@pytest.mark.mininet
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_down(sig, tmp_path):
    """Ctrl-C / SIGTERM: the handler tears down, then the signal does what it did before."""
    before = _sysctl()
    proc, child = _start_child(tmp_path)
    proc.send_signal(sig)
    rc = proc.wait(timeout=20)
    err = proc.stderr.read()
    if sig == signal.SIGINT:
        # Python re-raises an uncaught KeyboardInterrupt as death by SIGINT
        assert "KeyboardInterrupt" in err and rc in (1, -signal.SIGINT)
    else:
        assert rc == -signal.SIGTERM
    assert _gone(child)
    assert _sysctl() == before


@pytest.mark.mininet
def test_kill9_then_cleanup_command(tmp_path):
    """After kill -9 things are left; ``python -m emulation.cleanup`` removes all of them."""
    from emulation.cleanup import leftovers

    before = _sysctl()
    proc, child = _start_child(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    time.sleep(0.2)
    left = leftovers()
    assert left["state_files"] and left["bridges"]
    assert not _gone(child)  # detached host processes outlive the run's process
    out = subprocess.run([sys.executable, "-m", "emulation.cleanup"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert "deleting" in out.stdout
    assert not any(leftovers().values())
    assert _gone(child)
    assert _sysctl() == before


@pytest.mark.mininet
def test_overlapping_runs(ready_file):
    """Two runs of the same topology at once: distinct bridges, and the sysctl is restored
    only when the last one stops (the first must not restore under the second's feet)."""
    from emu_helpers import udp_transfer
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    before = _sysctl()
    a = EmuNet(StarTopo(n=1), name="runa").start()
    try:
        with EmuNet(StarTopo(n=1), name="runb") as b:
            assert a.switch_port("srv") != b.switch_port("srv")
            assert b.switch("s1").name != "s1" or a.switch("s1").name != "s1"
            a.stop()
            assert _sysctl() in (None, "0")  # b still runs: bridged frames still skip netfilter
            assert udp_transfer(b, "w1", "srv", 9600, ready_file, count=50,
                                rate_mbps=5)["received"] == 50
    finally:
        a.stop()
    assert _sysctl() == before


# ------------------------------------------------------------------ only what the testbed made
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _bridge_with_port(bridge: str, port: str, peer: str, alias: str | None = None) -> None:
    _ip("link", "add", bridge, "type", "bridge")
    if alias:
        _ip("link", "set", "dev", bridge, "alias", alias)
    _ip("link", "add", port, "type", "veth", "peer", "name", peer)
    _ip("link", "set", "dev", port, "master", bridge)


@pytest.mark.mininet
def test_cleanup_leaves_a_plain_mininet_session_alone():
    """A plain ``mn`` session's shells, bridges and ``<node>-eth<N>`` veths survive the cleanup, even
    where a dead run had recorded the same names before it could create them; a testbed bridge
    whose creator died goes (with its ports); a live creator's stays."""
    import json

    from emulation.cleanup import cleanup
    from emulation.runstate import STATE_DIR, bridge_alias
    from emulation.sysutil import RUN_ENV

    dead = subprocess.Popen(["true"])
    dead.wait()
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    shell = subprocess.Popen(["mnexec", "-cdn", "bash", "--norc", "-is", "mininet:plain9"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    names = ["plainbr9", "plain9-eth1", "dblpst9", "st9-eth1", "dblplv9", "lv9-eth1"]
    try:
        _bridge_with_port("plainbr9", "plain9-eth1", "plain8-eth0")
        _bridge_with_port("dblpst9", "st9-eth1", "st8-eth0", alias=bridge_alias(dead.pid))
        _bridge_with_port("dblplv9", "lv9-eth1", "lv8-eth0", alias=bridge_alias(os.getpid()))
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = STATE_DIR / "plaintest-dead.json"  # killed before its build: names planned, not made
        state.write_text(json.dumps({"run_id": "plaintest-dead", "pid": dead.pid, "netns_inodes": [],
                                     "bridges": ["plainbr9"], "root_intfs": ["plain9-eth1"], "sysctls": {}}))
        time.sleep(0.2)
        done = cleanup(verbose=False)
        assert not state.exists()
        assert shell.poll() is None and shell.pid not in done["processes"]
        assert _exists("plainbr9") and _exists("plain9-eth1") and _exists("plain8-eth0")
        assert _exists("dblplv9") and _exists("lv9-eth1")
        assert not _exists("dblpst9") and not _exists("st9-eth1")
        assert done["bridges"] == ["dblpst9"]
    finally:
        shell.kill()
        shell.wait()
        for n in names:
            _ip("link", "del", n, check=False)


@pytest.mark.mininet
def test_bridge_never_deletes_a_same_named_bridge_it_did_not_make():
    """``--switch ipbr`` refuses a name in use; EmuNet picks a name that clashes with nothing."""
    from emulation.bridge import IPBridge
    from emulation.net import EmuNet
    from emulation.sysutil import CommandError
    from topologies.star import StarTopo

    if _ip("link", "add", "clash9", "type", "bridge", check=False).returncode:
        pytest.skip("could not create the test bridge")
    sw = None
    try:
        sw = IPBridge("clash9")
        with pytest.raises(CommandError, match="already exists, not made by this testbed"):
            sw.start([])
        sw.stop()
        assert _exists("clash9")
    finally:
        if sw is not None:
            sw.terminate()
        _ip("link", "del", "clash9", check=False)
    if _ip("link", "add", "s1", "type", "bridge", check=False).returncode:
        return  # another run holds s1 right now: the IPBridge half above is the test
    try:
        with EmuNet(StarTopo(n=1)) as net:
            assert net.switch("s1").name != "s1"
        assert _exists("s1")
    finally:
        _ip("link", "del", "s1", check=False)
