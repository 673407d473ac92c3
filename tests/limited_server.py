"""A parameter server process under resource limits, for the pre-login flood tests.

Why a process: an open-file limit (RLIMIT_NOFILE) and a peak resident size are
per process, and the test process holds the flood's own sockets. Prints
``ready PORT`` once listening, then one JSON line when the run ends: rounds
served, refused connections by kind, peak RSS (KiB), or the error.

The peak is this process's own: VmHWM of /proc/self/status, the high-water mark of the
address space made at exec. Not getrusage's ru_maxrss: Linux keeps in it the high-water
mark of the address space the process had *before* exec (exec_mmap: setmax_mm_hiwater_rss)
- for a child started by subprocess (vfork + exec), that of its parent. Under a full test
run the pytest process had peaked at ~1.4 GB, and this server reported 1444052 KiB while
its own peak was ~60 MiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import traceback

from dblp.transport.server import ParameterServer, ServerConfig


def peak_rss_kib() -> int:
    """This process's peak resident size since exec (KiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (no /proc: may include the parent's)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of this process")
    ap.add_argument("--max-pending", type=int, default=64)
    ap.add_argument("--handshake-timeout", type=float, default=10.0)
    a = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (a.nofile, a.nofile))
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=a.workers, rounds=a.rounds,
                                       accept_timeout=60, peer_timeout=30, max_pending=a.max_pending,
                                       handshake_timeout=a.handshake_timeout))
    print(f"ready {srv.port}", flush=True)
    out: dict = {}
    try:
        out["rounds"] = srv.serve()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()  # (to the log the test shows when it fails)
    out["refused"] = srv.refused
    out["maxrss_kib"] = peak_rss_kib()
    out["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (for comparison; see above)
    print(json.dumps(out), flush=True)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
