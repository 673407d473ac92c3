"""The network is a sweep axis: one row per topology, refused by name when unknown."""

import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dblp.sim", "sweep", "--p-high", "0.4", "--eta", "0.5",
                           "--burst-rate", "0.01", "--model", "100000", "--iterations", "20", "--jobs", "1",
                           "--no-cache", "-q", "--out", str(tmp_path / "sw"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_topology_axis_gives_a_row_per_network_and_the_wan_costs_time(tmp_path):
    r = sweep(tmp_path, "--topology", "star,twosites", "--local-workers", "1", "--wan-delay", "10ms")
    assert r.returncode == 0, r.stderr
    rows = {row["topology"]: row for row in csv.DictReader(open(tmp_path / "sw" / "sweep.csv"))}
    assert set(rows) == {"star", "twosites"}
    # two WAN crossings of 10 ms each way per round at least
    assert float(rows["twosites"]["dblp_mean_round_s"]) > float(rows["star"]["dblp_mean_round_s"]) + 0.02


def test_unknown_topology_is_refused_by_name(tmp_path):
    r = sweep(tmp_path, "--topology", "star,ring")
    assert r.returncode == 2 and "--topology" in r.stderr and "'ring'" in r.stderr and "Traceback" not in r.stderr
