"""Teardown is idempotent and signal-safe.

A Ctrl-C reaches the whole process group, and ``sudo`` without a terminal
forwards a copy too: a second SIGINT arrives while the first one's teardown
runs. It once cut that teardown short (bridge, state file and sysctls left,
after "the emulated network was torn down" was printed). And a run started in
the background (SIGINT ignored) and sent SIGINT went on without its network
and died with a LaunchError traceback.

Each case here runs a small star in a subprocess with a process group of its
own, signals the group, and checks by the kernel's and the registry's own word
that nothing is left: no bridge, no state file, no process in the run's
namespaces, the sysctls as they were. These tests do not use the ``mininet``
marker on purpose: its fixture runs the machine-wide cleanup, and other runs
may be live on a shared machine; they check exactly what their own run made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(t) is None for t in ("mnexec", "ip", "tc"))
    or __import__("importlib.util").util.find_spec("mininet") is None,
    reason="needs root, Mininet (mnexec and the Python package), ip and tc")

CHILD = r"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == "ignored" else signal.default_int_handler)
from topologies.star import StarTopo
from emulation.net import EmuNet
from emulation.runstate import teardown_summary
try:
    with EmuNet(StarTopo(n=1, bw=50), name="sigtest") as net:
        p = net.popen("w1", ["sleep", "300"])
        print("READY", net.run_id, net.switch("s1").name, p.pid, flush=True)
        time.sleep(300)
        raise SystemExit("the run went on without its network")
except KeyboardInterrupt:
    print(f"sigtest: interrupted; {teardown_summary()}", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.parametrize("mode,second", [("default", "at-once"), ("default", "in-teardown"),
                                         ("ignored", "in-teardown")])
def test_a_second_sigint_never_cuts_teardown_short(mode, second, tmp_path):
    """``second``: the copy comes at once (the two may merge), or once teardown has begun
    (the run's first process is seen ending: its bridge, ports and state file are still there)."""
    from emulation.runstate import STATE_DIR, pid_alive, read_states
    from emulation.sysutil import pids_by_netns, sysctl_get

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), mode], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "READY", proc.stderr.read() if proc.poll() is not None else line
        run_id, bridge, first = line[1], line[2], int(line[3])
        state = json.loads((STATE_DIR / f"{run_id}.json").read_text())
        netns = state["netns_inodes"]
        assert netns and Path("/sys/class/net", bridge).exists()
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        deadline = time.monotonic() + 20
        while second == "in-teardown" and pid_alive(first) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert Path("/sys/class/net", bridge).exists()  # the copy comes before teardown is done
        os.killpg(proc.pid, signal.SIGINT)  # sudo's forwarded copy, while the first is handled
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read().strip()
    assert rc == 130 and "Traceback" not in err, err
    assert err.splitlines() and len(err.splitlines()) == 1, err  # one line
    assert "interrupted; the emulated network was torn down (" in err and "NOT" not in err, err
    assert not Path("/sys/class/net", bridge).exists()
    assert not (STATE_DIR / f"{run_id}.json").exists()
    assert not pids_by_netns(netns)  # no process left in any of the run's namespaces: they are gone
    if not read_states().live:  # with another run live, the originals stay changed for it (its own record)
        assert {k: sysctl_get(k) for k in state["sysctls"]} == state["sysctls"]
