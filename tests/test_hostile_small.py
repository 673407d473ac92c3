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


def _mb(*argv: str) -> subprocess.CompletedProcess:
    return _run("scenarios/microburst.py", *argv)


def _one_line_refusal(out: subprocess.CompletedProcess, want: str) -> None:
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines()[-1] == f"microburst.py: error: {want}", out.stderr
    assert "Traceback" not in out.stderr and "{" not in out.stdout  # no config printed


def test_print_config_checks_what_it_prints():
    """Before: ``--bursts 10,abc --print-config`` printed the bad value with exit 0 (only --dry-run
    refused it), so --print-config could emit a config that --config then refused; so did
    ``--policies reliable,fast``."""
    _one_line_refusal(_mb("--bursts", "10,abc", "--print-config", "--workload", "none", "--model", "100k"),
                      "argument --bursts: '10,abc' is not a comma-separated list of integers "
                      "(iterations of a run of --iterations 150)")
    _one_line_refusal(_mb("--policies", "reliable,fast", "--print-config"),
                      "--policies: unknown run 'fast': use a comma list of reliable, baseline, dblp")
    ok = _mb("--bursts", "10,20", "--print-config", "--workload", "none", "--model", "100k")
    assert ok.returncode == 0 and '"bursts": "10,20"' in ok.stdout, ok


def test_too_few_iterations_names_iterations_not_the_bursts_never_given():
    _one_line_refusal(_mb("--iterations", "2", "--dry-run", "--workload", "none", "--model", "100k"),
                      "argument --iterations: the bursts at 50,110 (--bursts' default, not given) do not fit a run "
                      "of 2 iterations; give --bursts within 0..1, or --bursts none")
    _one_line_refusal(_mb("--iterations", "2", "--bursts", "5", "--dry-run", "--workload", "none", "--model", "100k"),
                      "argument --bursts: '5': 5 is not in [0, 1] (iterations of a run of --iterations 2)")


def test_an_unusable_results_path_is_refused_by_the_dry_run():
    _one_line_refusal(_mb("--results", "/proc/version", "--dry-run", "--workload", "none", "--model", "100k"),
                      "argument --results: /proc/version: /proc/version is not a folder")
    _one_line_refusal(_mb("--out", "/proc/version/run", "--dry-run", "--workload", "none", "--model", "100k"),
                      "argument --out: /proc/version/run: /proc/version is not a folder")


@pytest.mark.parametrize("cmd", ["server", "worker"])
def test_a_records_path_in_a_missing_folder_is_refused_and_makes_no_folder(tmp_path, cmd):
    """Before: a worker's (and the server's) ``--records`` with a missing parent made the folders,
    even under / (a typo made folders)."""
    path = tmp_path / "typo" / "deeper" / "r.jsonl"
    args = ["--server", "127.0.0.1:9"] if cmd == "worker" else ["--port", "0", "--workers", "1"]
    out = _run("-m", "dblp", cmd, *args, "--insecure", "--records", str(path))
    assert out.returncode == 2, out
    assert out.stderr.strip() == (f"dblp {cmd}: error: --records {path}: the folder {path.parent} does not exist "
                                  "(make it first)"), out.stderr
    assert not (tmp_path / "typo").exists()


def test_a_worker_with_no_server_says_at_once_that_it_retries_and_for_how_long():
    """Before: silent for 60 s, then "Connection refused"."""
    port = free_port()
    p = subprocess.Popen([PY, "-m", "dblp", "worker", "--server", f"127.0.0.1:{port}", "--insecure"],
                         stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    t0 = time.monotonic()
    try:
        line = p.stderr.readline()
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    assert line.rstrip().endswith(f"the server at 127.0.0.1:{port} not reachable yet (Connection refused); "
                                  "retrying every 0.2 s for up to 60 s"), line
    assert took < 10, took  # (the interpreter's start; the line comes with the first refusal)


def test_the_norm_hub_logs_at_most_20_closed_connections(caplog):
    """Before: one line per shed connection (303 lines for 301 connections); now 20, then a count."""
    import logging
    import socket
    import threading

    from dblp.transport.shard import NormExchange

    secret = bytes(range(32))
    hub = NormExchange(0, 2, ("127.0.0.1", 0), secret, timeout=30, connect_timeout=20, login_timeout=5)
    caplog.set_level(logging.WARNING, logger="dblp.transport.shard")
    for _ in range(50):  # connect and go: each is closed "before its introduction"
        socket.create_connection(("127.0.0.1", hub.port), timeout=10).close()
    good = NormExchange(1, 2, ("127.0.0.1", hub.port), secret, timeout=30, connect_timeout=5)
    got: list[float] = []
    t = threading.Thread(target=lambda: got.append(good.total(0, 1.5)))
    t.start()
    try:
        assert hub.total(0, 2.0) == 3.5
        t.join(10)
        assert got == [3.5]
    finally:
        hub.close()
        good.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "dblp.transport.shard"]
    per_connection = [m for m in lines if m.startswith("shard hub: connection from")]
    assert hub.refused == 50 and len(per_connection) == 20, (hub.refused, len(lines))
    assert per_connection[-1].endswith("(further ones are counted, not logged)")
    assert "shard hub: closed 50 connections that were no shard server's" in lines


@pytest.mark.parametrize("content, want", [
    (b'\xef\xbb\xbf{"out": "caf\xe9"}', "is not UTF-8 text (byte 0xe9 at offset 15)"),  # after a BOM: 12 before
    (b'{\x00"out": 1}', "cannot read"),  # valid UTF-8 with a NUL: json.loads(bytes) took it for UTF-16
])
def test_a_json_config_that_is_not_utf8_names_the_real_byte_and_offset(tmp_path, content, want):
    bad = tmp_path / "c.json"
    bad.write_bytes(content)
    out = _mb("--config", str(bad), "--dry-run")
    assert out.returncode == 2 and want in out.stderr.strip().splitlines()[-1], out.stderr
    if want == "cannot read":
        assert "0x7d" not in out.stderr and "Expecting property name" in out.stderr


def test_the_report_names_only_the_files_it_wrote(tmp_path, capsys, monkeypatch):
    """Before: ``--policies baseline`` ended "wrote .../table_ii.csv" though Table II needs dblp too."""
    monkeypatch.syspath_prepend(str(ROOT / "scenarios"))
    import microburst
    from dblp.protocol.records import RoundRecord

    a = microburst.parse_args(["--policies", "baseline", "--workload", "none", "--model", "100k",
                               "--iterations", "4", "--bursts", "2", "--results", str(tmp_path)])
    recs = [RoundRecord(source="emulation", role="worker", worker=0, round=k, policy="baseline", chunks=10,
                        up_latency_s=0.1, round_latency_s=0.2, up_passes=1, up_received=10) for k in range(4)]
    microburst.report(a, {"baseline": recs}, tmp_path, {0: {"baseline": recs}})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote {tmp_path}/summary.csv, summary_runs.json, rounds.jsonl, latency.png, cdf.png", last
    assert not (tmp_path / "table_ii.csv").exists() and (tmp_path / "summary.csv").exists()
