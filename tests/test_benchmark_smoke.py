"""Smoke test of scenarios/benchmark.py at its smallest size (a benchmark, not a timed test:
only the < 60 s bound of the smallest run and the CSV's shape are checked), and of its cost
model, :mod:`dblp.results.passcost`. The scenario runs as a subprocess (tests do not import scenarios)."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dblp.results.passcost import fit_pass_model

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, str(ROOT / "scenarios" / "benchmark.py")]


def dry_run(*argv: str) -> dict:
    """The settings the scenario parses from ``argv`` (``--dry-run``: no root, nothing run)."""
    r = subprocess.run([*BENCH, *argv, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_help_and_argument_errors():
    r = subprocess.run([*BENCH, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--models" in r.stdout and "--plain" in r.stdout
    assert dry_run("--models", "61M", "200000")["config"]["sizes"] == [61_000_000, 200_000]
    a = dry_run("--models", "5M,25M", "61M", "--plain")["config"]
    assert a["sizes"] == [5_000_000, 25_000_000, 61_000_000] and a["paths"] == ["plain"]
    default = dry_run()["config"]
    assert default["paths"] == ["gso", "gso-seg", "plain", "sharded"]
    assert dry_run("--paths", "gso,gso-seg")["config"]["paths"] == ["gso", "gso-seg"]
    for bad in (["--models", "lots"], ["--p", "1.5"], ["--p", "0"], ["--gso", "--plain"], ["--paths", "gso,fast"]):
        r = subprocess.run([*BENCH, *bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, bad
    assert default["calib_loss"] == [0.3, 0.5, 0.6]
    assert dry_run("--calib-loss", "0")["config"]["calib_loss"] == []
    r = subprocess.run([*BENCH, "--calib-loss", "0.3,x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--calib-loss" in r.stderr


def _calib(a: float, o: float, S0: float, losses, passes, unit: float = 0.2) -> list[dict]:
    """Calibration rounds a model with sender share ``a`` and per-pass overhead ``o`` would give."""
    out = []
    for loss, k in zip(losses, passes):
        data = unit * ((1 - 0.008) / (1 - loss) - 1)
        out.append({"loss": loss, "round_s": S0 + a * data + 2 * (k - 1) * o, "passes_up": k, "passes_down": k,
                    "extra_passes": 2 * (k - 1), "data_term_s": data})
    return out


def test_pass_model_fit_recovers_known_share_and_overhead():
    S0 = 0.3
    a, o, o_r = fit_pass_model(_calib(0.4, 0.002, S0, [0.3, 0.5], [5, 7]), S0)
    assert a == pytest.approx(0.4) and o == pytest.approx(0.002)
    # receiver-bound extreme: everything beyond S0 is charged to the extra passes
    c = _calib(0.4, 0.002, S0, [0.3, 0.5], [5, 7])
    e = np.array([x["extra_passes"] for x in c]); y = np.array([x["round_s"] - S0 for x in c])
    assert o_r == pytest.approx(float(y @ e / (e @ e)))
    # one round (or one loss twice): the sender-bound model, a = 1
    a1, o1, _ = fit_pass_model(_calib(1.0, 0.003, S0, [0.5], [7]), S0)
    assert a1 == 1.0 and o1 == pytest.approx(0.003)
    # a share outside [0, 1] is clipped and o refitted
    a2, o2, _ = fit_pass_model(_calib(1.6, 0.001, S0, [0.3, 0.5], [5, 7]), S0)
    assert a2 == 1.0 and math.isfinite(o2)
    assert all(math.isnan(v) for v in fit_pass_model([], S0))


POSITIVE = ["dblp_round_s", "dblp_up_s", "dblp_down_s", "gloo_allreduce_s", "ratio_dblp_vs_gloo",
            "dblp_goodput_gbps", "dblp_aggregate_goodput_gbps", "iperf3_gbps", "iperf3_3flows_gbps",
            "ratio_goodput_vs_iperf3", "ratio_aggregate_vs_iperf3_3flows", "calib_round_s", "burst_round_s",
            "burst_pred_s", "burst_passes_up", "burst_pred_passes"]


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root")
@pytest.mark.skipif(not (shutil.which("ip") and shutil.which("nft") and shutil.which("iperf3")),
                    reason="needs iproute2, nftables and iperf3")
def test_smallest_benchmark_end_to_end(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "bench"
    t0 = time.monotonic()
    columns = dry_run()["csv_columns"]
    p = subprocess.Popen([*BENCH, "--models", "200000", "--paths", "gso,gso-seg,sharded",
                          "--iterations", "3", "--iperf-duration", "1s", "--gloo-timeout", "20s", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.terminate()  # SIGTERM: the benchmark removes its namespaces
            p.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert elapsed < 90, f"smallest benchmark took {elapsed:.1f} s"
    assert "DBLP/gloo" in stdout
    with open(out / "benchmark.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == columns
        rows = list(reader)
    assert [row["path"] for row in rows] == ["gso", "gso-seg", "sharded"]  # plain: the transport's own tests
    assert "target for gso-seg" in stdout
    assert float(rows[0]["ratio_vs_gso_round"]) == 1.0 and float(rows[1]["ratio_vs_gso_round"]) > 0
    sharded = rows.pop()  # a shard server per worker host: lossless rounds only (srv's loss rule is not on its path)
    assert sharded["aggregation"] == "sharded" and float(sharded["dblp_round_s"]) > 0
    assert float(sharded["ratio_dblp_vs_gloo"]) > 0 and sharded["burst_round_s"] in ("", "nan")
    assert (out / "size-200K" / "dblp-sharded" / "server.shard2.jsonl").exists()
    for row in rows:
        assert int(row["elements"]) == 200_000
        for col in POSITIVE:
            v = float(row[col])
            assert math.isfinite(v) and v > 0, (row["path"], col, row[col])
        assert float(row["burst_dropped_pkts"]) > 0
        assert 0.0 <= float(row["sender_share"]) <= 1.0  # fitted to two calibration rounds
        gb = float(row["gloo_burst_s"])
        assert row["gloo_burst_timed_out"] == "True" or (math.isfinite(gb) and gb > 0)
    assert (out / "benchmark.json").exists()
    assert (out / "size-200K" / "dblp-gso" / "worker0.jsonl").exists()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"dblpns-{p.pid}-" not in left, "the benchmark left namespaces behind"
