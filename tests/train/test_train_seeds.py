"""scenarios/train.py with --seeds 2 and targets: the seed-level tables and time to each target, small.

Two seeds of baseline and DBLP on loopback, 2 workers, 4 iterations of digits_mlp each (the run is
mostly process start-up). Time to a target is recomputed here from the workers' own evals.jsonl."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.sim.convergence.runs import load_curves

ROOT = Path(__file__).resolve().parents[2]


def _time_to(d: Path, workers: int, target: float) -> tuple[float, float]:
    """(iteration, seconds) of the first evaluation whose mean over the workers is >= target; inf if none."""
    evals = [[json.loads(line) for line in open(d / f"w{i}" / "evals.jsonl")] for i in range(workers)]
    for j in range(len(evals[0])):
        if sum(ev[j]["accuracy"] for ev in evals) / workers >= target:
            return float(evals[0][j]["iteration"]), max(float(ev[j]["train_s"]) for ev in evals)
    return math.inf, math.inf


@pytest.mark.slow
def test_train_two_seeds_give_intervals_and_time_to_each_target(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scenarios" / "train.py"), "--workload", "digits_mlp", "--workers", "2",
           "--epochs", "1", "--max-iters-per-epoch", "4", "--eval-every", "2", "--seeds", "2",
           "--target-accuracy", "0.15,0.99", "--out", str(out)]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    for table in ("Table IV (2 seeds", "Table V (2 seeds", "to 15% (s)", "to 99% (s)"):
        assert table in got.stdout, table
    assert "not reached (0/2 reached)" in got.stdout  # 99% after 4 iterations: never
    for seed in (0, 1):
        t5 = {r["run"]: r for r in csv.DictReader(open(out / f"seed{seed}" / "table_v.csv"))}
        assert sorted(t5) == ["baseline", "dblp"]
        for policy in ("baseline", "dblp"):
            d = out / f"seed{seed}" / policy
            assert [json.loads(line)["iteration"] for line in open(d / "w0" / "evals.jsonl")] == [2, 4]
            it, sec = _time_to(d, 2, 0.15)
            cell = float(t5[policy]["to 15% (s)"])
            assert cell == pytest.approx(sec, rel=1e-9) if math.isfinite(sec) else math.isinf(cell)
            assert float(t5[policy]["to 15% (iter)"]) == it
            assert math.isinf(float(t5[policy]["to 99% (s)"]))
            assert math.isfinite(float(t5[policy]["train time (s)"])) and float(t5[policy]["train time (s)"]) > 0
    long = list(csv.DictReader(open(out / "table_v_replicates.csv")))
    cell = next(r for r in long if r["row"] == "no loss dblp" and r["column"] == "train time (s)")
    times = [float(next(r for r in csv.DictReader(open(out / f"seed{s}" / "table_v.csv")) if r["run"] == "dblp")
                   ["train time (s)"]) for s in (0, 1)]
    assert int(cell["n"]) == 2 and float(cell["median"]) == pytest.approx(sum(times) / 2)
    curves = load_curves(out / "curves.csv")  # the convergence model's reader: 2 seeds x 2 policies
    assert sorted((c.setting, c.seed) for c in curves) == [("no loss baseline", 0), ("no loss baseline", 1),
                                                           ("no loss dblp", 0), ("no loss dblp", 1)]
    assert all(c.iterations == [2, 4] and len(c.fractions()) == 4 for c in curves)
    for f in ("accuracy.png", "training_time.png", "seed0/summary.csv"):  # per-round explanation: first seed
        assert (out / f).stat().st_size > 0
