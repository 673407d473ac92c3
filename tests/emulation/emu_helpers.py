"""Helpers shared by the emulation tests: timed UDP loss measurement between two hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PY = sys.executable


def udp_transfer(net, src: str, dst: str, port: int, ready_file: str, count: int = 2000,
                 size: int = 1000, rate_mbps: float = 20.0, idle: float = 0.5,
                 deadline: float = 20.0) -> dict:
    """Send ``count`` numbered datagrams src -> dst, return the receiver's JSON counts."""
    if os.path.exists(ready_file):
        os.unlink(ready_file)
    rx = net.popen(dst, [PY, "-m", "emulation.udptool", "recv", "--port", str(port),
                         "--idle", str(idle), "--deadline", str(deadline), "--ready-file", ready_file],
                   stdout=subprocess.PIPE, text=True)
    t_end = time.monotonic() + 10
    while not os.path.exists(ready_file):
        assert time.monotonic() < t_end, "receiver did not bind"
        time.sleep(0.01)
    sent = json.loads(net.cmd(src, [PY, "-m", "emulation.udptool", "send", "--dst", net.ip(dst),
                                    "--port", str(port), "--count", str(count), "--size",
                                    str(size), "--pace", f"{rate_mbps}M"]))
    out, _ = rx.communicate(timeout=30)
    res = json.loads(out)
    res["sent"] = sent["sent"]
    res["send_errors"] = sent["errors"]
    return res
