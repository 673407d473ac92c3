"""The small breaks of a hostile run, each pinned: one-line refusals (exit 2), said-aloud retries,
capped logs, and reports that name only what they wrote."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import ROOT, env, free_port

PY = sys.executable


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *argv], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=timeout)


def test_a_bare_queue_size_is_refused_naming_both_readings():
    """Before: ``--queue 100`` meant 100 bytes (the dry run said "100-byte queues"), where Mininet's
    max_queue_size and tc read a bare queue size as packets."""
    from traces.units import parse_queue, queue_arg

    q = queue_arg()
    with pytest.raises(argparse.ArgumentTypeError, match=r"queue '100': a bare number is ambiguous \(tc and "
                                                         r"Mininet read packets\); give 100pkt .* or 100B \(bytes\)"):
        q("100")
    assert q("100pkt") == 100 * 1514 and q("100B") == 100 and q("150kB") == 150_000
    assert parse_queue("150000") == 150_000  # the function itself keeps its bytes, for code that means them
    out = _run("scenarios/microburst.py", "--queue", "100", "--dry-run", "--workload", "none", "--model", "100k")
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines()[-1].endswith(
        "argument --queue: queue '100': a bare number is ambiguous (tc and Mininet read packets); give 100pkt "
        "(packets of 1514 bytes) or 100B (bytes)"), out.stderr
    assert "Traceback" not in out.stderr
