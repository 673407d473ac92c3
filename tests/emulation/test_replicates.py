"""Replicates and time to accuracy in the emulation, small: two seeds of real training in Mininet."""

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


@pytest.mark.mininet
def test_two_seeds_give_intervals_and_time_to_each_target(tmp_path):
    cmd = [sys.executable, str(ROOT / "scenarios" / "microburst.py"), "--workload", "digits_mlp", "--iterations", "14",
           "--bursts", "none", "--policies", "baseline,dblp", "--seeds", "2", "--eval-every", "7",
           "--target-accuracy", "0.2,0.99", "--no-weights", "--results", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for table in ("Table II (median over 2 seeds", "Table IV (2 seeds", "Table V (2 seeds"):
        assert table in out.stdout, table
    (run,) = list(tmp_path.glob("microburst-*"))
    curves = {}
    for seed in (0, 1):
        for policy in ("baseline", "dblp"):
            d = run / f"seed{seed}" / policy
            evals = [[json.loads(line) for line in open(d / f"w{i}" / "evals.jsonl")] for i in range(3)]
            for ev in evals:  # every 7 iterations; 14 is the epoch end, evaluated once
                assert [r["iteration"] for r in ev] == [7, 14]
            curves[(seed, policy)] = [float(sum(ev[j]["accuracy"] for ev in evals) / 3) for j in range(2)]
            # time to 20% from the evaluations themselves: the first mean >= 0.2, the slowest worker's clock
            j = next(j for j, acc in enumerate(curves[(seed, policy)]) if acc >= 0.2)
            want = max(ev[j]["train_s"] for ev in evals)
            t5 = {r["run"]: r for r in csv.DictReader(open(run / f"seed{seed}" / "table_v.csv"))}
            assert float(t5[policy]["to 20% (s)"]) == pytest.approx(want, rel=1e-9)
            assert int(t5[policy]["to 20% (iter)"]) == [7, 14][j]
            assert math.isinf(float(t5[policy]["to 99% (s)"]))  # never reached
    assert curves[(0, "dblp")] != curves[(1, "dblp")]  # the seeds differ (model init, data order)
    long = list(csv.DictReader(open(run / "table_v_replicates.csv")))
    cell = next(r for r in long if r["row"] == "no bursts dblp" and r["column"] == "train time (s)")
    times = [float(next(r for r in csv.DictReader(open(run / f"seed{s}" / "table_v.csv")) if r["run"] == "dblp")
                   ["train time (s)"]) for s in (0, 1)]
    assert int(cell["n"]) == 2 and float(cell["median"]) == pytest.approx(sum(times) / 2)
    assert float(cell["ci95_lo"]) < min(times) and float(cell["ci95_hi"]) > max(times)
    assert "not reached" in out.stdout
    got = load_curves(run / "curves.csv")  # the convergence model's reader: 2 seeds x 2 policies
    assert sorted((c.setting, c.seed) for c in got) == [("no bursts baseline", 0), ("no bursts baseline", 1),
                                                        ("no bursts dblp", 0), ("no bursts dblp", 1)]
    assert all(c.iterations == [7, 14] and len(c.fractions()) == 14 for c in got)
    for f in ("accuracy.png", "training_time.png", "table_ii_replicates.csv"):
        assert (run / f).stat().st_size > 0


@pytest.mark.mininet
def test_trace_replay_two_seeds_give_latency_intervals_and_training_tables(tmp_path):
    """scenarios/trace_replay.py --seeds 2 (the microburst test's size): the trace replayed from its start for
    every run, latency medians with intervals over the seeds, Tables IV/V over the seeds, the curve file."""
    cmd = [sys.executable, str(ROOT / "scenarios" / "trace_replay.py"), "--workload", "digits_mlp",
           "--iterations", "14", "--policies", "baseline,dblp", "--seeds", "2", "--eval-every", "7",
           "--target-accuracy", "0.2,0.99", "--no-weights", "--results", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for table in ("Send latency over 2 seeds", "Table IV (2 seeds", "Table V (2 seeds", "dblp - baseline ="):
        assert table in out.stdout, table
    (run,) = list(tmp_path.glob("trace_replay-*"))
    per_seed = {}
    for seed in (0, 1):
        for policy in ("baseline", "dblp"):
            d = run / f"seed{seed}" / policy
            summ = json.loads((d / "replay_summary.json").read_text())  # each run replayed the trace itself
            assert 0.0 < summ["requested_mean_loss"] < 0.05
            assert (d / "replay.jsonl").stat().st_size > 0
        per_seed[seed] = {r["run"]: r for r in csv.DictReader(open(run / f"seed{seed}" / "table_v.csv"))}
        assert math.isinf(float(per_seed[seed]["dblp"]["to 99% (s)"]))  # never reached
    long = list(csv.DictReader(open(run / "table_latency_replicates.csv")))
    cell = next(r for r in long if r["row"] == "dblp" and r["column"] == "average (s)")
    assert int(cell["n"]) == 2 and float(cell["ci95_lo"]) <= float(cell["median"]) <= float(cell["ci95_hi"])
    t5 = list(csv.DictReader(open(run / "table_v_replicates.csv")))
    cell = next(r for r in t5 if r["row"].endswith(" dblp") and r["column"] == "train time (s)")
    times = [float(per_seed[s]["dblp"]["train time (s)"]) for s in (0, 1)]
    assert int(cell["n"]) == 2 and float(cell["median"]) == pytest.approx(sum(times) / 2)
    got = load_curves(run / "curves.csv")
    assert sorted(c.seed for c in got) == [0, 0, 1, 1] and all(c.iterations == [7, 14] for c in got)
    for f in ("accuracy.png", "training_time.png", "latency.png", "cdf.png"):
        assert (run / f).stat().st_size > 0
