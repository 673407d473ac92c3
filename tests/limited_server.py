"""A parameter server process under resource limits, for the pre-login flood tests.

Why a process: an open-file limit (RLIMIT_NOFILE) and a peak resident size are
per process, and the test process holds the flood's own sockets. Prints
``ready PORT`` once listening, then one JSON line when the run ends: rounds
served, refused connections by kind, peak RSS (KiB), or the error.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

from dblp.server import ParameterServer, ServerConfig


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
    out["refused"] = srv.refused
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out), flush=True)
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
