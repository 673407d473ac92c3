"""A run whose Mininet hosts are killed from outside (``sudo mn -c``) says so in one line.

Before, the first thing that failed in a dead host - a worker's LaunchError, an nft call into a
namespace that was gone - ended the scenario with its traceback, and nothing said why or what to do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from emulation.net import EmuNet
from topologies.star import StarTopo

with EmuNet(StarTopo(n=1, bw=10), name="killtest") as net:
    assert net.killed_hosts() == []
    os.kill(net.pid("w1"), signal.SIGKILL)  # what `mn -c` does to every Mininet shell
    net.cmd("w1", ["true"])  # fails: its host is gone
    raise RuntimeError("worker0 on w1 exited with -9")  # as a LaunchError would, if the call above did not
"""


@pytest.mark.mininet
def test_killed_hosts_end_the_run_with_one_line_naming_the_cleanup(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr[-3000:]
    assert "were killed from outside (w1 gone; `mn -c`?)" in lines[0]
    assert lines[0].endswith("sudo .venv/bin/python -m emulation.cleanup")
