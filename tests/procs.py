"""Start a real server and real worker processes for transport tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = f"{ROOT}:{ROOT / 'tests'}:" + e.get("PYTHONPATH", "")
    return e


def prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def start_server(port: int, *args: str, netns: str | None = None, records: str | None = None) -> subprocess.Popen:
    cmd = prefix(netns) + [PY, "-m", "dblp", "server", "--host", "127.0.0.1", "--port", str(port), *args]
    if records:
        cmd += ["--records", records]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)


def start_verify_workers(port: int, n: int, elements: int, rounds: int, *extra: str,
                         netns: str | None = None) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            prefix(netns) + [PY, str(ROOT / "tests" / "verify_worker.py"), "--port", str(port), "--id", str(i),
                             "--workers", str(n), "--elements", str(elements), "--rounds", str(rounds), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT,
        )
        for i in range(n)
    ]


def reports(procs: list[subprocess.Popen], timeout: float) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"worker failed: {stderr[-2000:]}"
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out
