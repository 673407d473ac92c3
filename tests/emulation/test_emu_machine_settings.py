"""The machine's own sysctls come back through kill -9, a second run and a cleanup during it.

Before: a run killed with -9 left ``bridge-nf-call-{iptables,ip6tables,arptables}`` changed
1 -> 0; a second run started meanwhile recorded the 0 as its "before"; the cleanup, seeing a
live run, deleted the dead run's state file (the only record of the 1) and restored nothing,
and the second run restored 0 at its end: the machine stayed at 0 for good. Now the first run
records the machine's own values in ``/run/dblpem/machine.settings``, which outlives both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from emulation.runstate import machine_path, machine_sysctls, read_states
from emulation.sysutil import BRIDGE_NF_SYSCTLS, sysctl_get

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
from topologies.star import StarTopo
from emulation.net import EmuNet
import time
with EmuNet(StarTopo(n=1, bw=50)) as net:
    print("READY", net.run_id, flush=True)
    time.sleep(300)
"""


def _start(tmp_path: Path, name: str) -> tuple[subprocess.Popen, str]:
    script = tmp_path / f"{name}.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[1]


def _values() -> dict[str, str | None]:
    return {k: sysctl_get(k) for k in BRIDGE_NF_SYSCTLS}


def _originals() -> dict[str, str | None]:
    """The machine's own values: its record where a run (another developer's, say) holds them changed."""
    rec = machine_sysctls()
    return {k: rec.get(k, v) for k, v in _values().items()}


@pytest.mark.mininet
def test_kill9_a_second_run_and_a_cleanup_during_it_restore_the_machines_sysctls(tmp_path):
    before = _originals()
    if any(v is None for v in before.values()):
        pytest.skip(f"bridge netfilter sysctls absent (br_netfilter not loaded): {before}")
    first, run_a = _start(tmp_path, "a")
    second = None
    try:
        assert {k: machine_sysctls().get(k) for k in before} == before  # recorded before the run changed them
        first.kill()  # -9: no teardown
        first.wait(timeout=10)
        assert set(_values().values()) == {"0"}, _values()  # left changed by the killed run
        second, run_b = _start(tmp_path, "b")
        out = subprocess.run([sys.executable, "-m", "emulation.cleanup"], cwd=REPO, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"skipping live run {run_b}" in out.stdout, out.stdout
        assert "keeping the sysctls the dead runs changed" in out.stdout and "stay recorded in" in out.stdout
        assert not (machine_path().parent / f"{run_a}.json").exists()  # the dead run's state file went
        assert {k: machine_sysctls().get(k) for k in before} == before  # the machine's record did not
        assert set(_values().values()) == {"0"}  # the live run still needs them changed
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)  # an orderly end: its teardown restores (if it is the last)
                p.wait(timeout=60)
    others = read_states().live  # another developer's run on this machine keeps them changed, and the record
    if others:
        assert {k: machine_sysctls().get(k) for k in before} == before, others
        assert set(_values().values()) == {"0"}
    else:
        assert _values() == before  # the machine's own values, not the 0 the second run saw at its start
        assert not machine_path().exists()
