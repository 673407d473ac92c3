"""``python -m dblp.results.analysis compare`` on two microburst-style run folders made by real Mininet runs.

The folders have the microburst scenario's layout (``<run>/<policy>/records/``, ``bursts.jsonl``
and the merged, labelled ``rounds.jsonl``), built with the library calls the scenario makes
(tests never import scenarios): run A without bursts, run B with one 70% burst.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS, BURST = 12, 6


def _microburst_style_runs(root: Path) -> tuple[Path, Path]:
    from dblp.results.analysis import load
    from dblp.runs.launch import RunArgs
    from dblp.protocol.policy import run_policy
    from dblp.protocol.records import merge_runs
    from emulation.bursts import bursts_from_spec
    from emulation.launch import SCENARIO_PORT, run_with_bursts
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    burst = bursts_from_spec({"kind": "iteration_bursts", "at": [BURST], "loss": 0.7}, rounds=ITERATIONS)
    folders = {"calm": (root / "microburst-calm", []), "burst": (root / "microburst-burst", burst)}
    with EmuNet(StarTopo(n=2, bw=200, buffer_bytes=200_000), name="cmp") as net, LossController(net) as lc:
        for run, schedule in folders.values():
            runs = {}
            for name in ("baseline", "dblp"):
                args = RunArgs(workers=2, iterations=ITERATIONS, model=100_000, policy=run_policy(name).flags(),
                               port=SCENARIO_PORT, peer_timeout_s=30.0)
                d = run_with_bursts(net, lc, args, run / name, schedule, label=name, quiet=True,
                                    env={"PYTHONPATH": str(ROOT)}, timeout_s=120)
                runs[name] = load(d / "records")
            merge_runs(runs, run / "rounds.jsonl")
    return folders["calm"][0], folders["burst"][0]


@pytest.mark.mininet
def test_compare_two_microburst_runs(tmp_path):
    a, b = _microburst_style_runs(tmp_path)
    out = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "dblp.results.analysis", "compare", str(a), str(b), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for block in ("baseline / worker", "baseline / server", "dblp / worker", "dblp / server"):
        assert block in r.stdout, r.stdout
    with open(out / "compare.csv", newline="") as fh:
        rows = {(x["run"], x["role"], x["metric"]): x for x in csv.DictReader(fh)}
    calm, burst = a.name, b.name
    assert float(rows[("dblp", "worker", "rounds")][calm]) == ITERATIONS - 1  # round 0 is warm-up
    # the burst costs the reliable baseline retransmission passes that the calm run does not pay
    base = rows[("baseline", "worker", "passes max")]
    assert float(base[burst]) >= 5 > float(base[calm])
    for f in ("latency_send.png", "cdf_send.png", "latency_round.png", "cdf_round.png"):
        assert (out / f).stat().st_size > 0, f
