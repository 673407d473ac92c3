"""Replicates and time to accuracy in the emulation, small: two seeds of real training in Mininet."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import pytest

from dblp.sim.convergence.runs import load_curves

ROOT = Path(__file__).resolve().parents[2]


def _two_seeds(script: str, tmp_path: Path, *args: str, tables: Sequence[str]) -> tuple[str, Path]:
    """scenarios/``script`` small: digits_mlp for 14 iterations, baseline and dblp, 2 seeds evaluated
    every 7 iterations against targets of 20% and 99%, ``args`` added. It ends 0 and prints each
    of ``tables``; its stdout and its run folder."""
    cmd = [sys.executable, str(ROOT / "scenarios" / script), "--workload", "digits_mlp", "--iterations", "14", *args,
           "--policies", "baseline,dblp", "--seeds", "2", "--eval-every", "7", "--target-accuracy", "0.2,0.99",
           "--no-weights", "--results", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for table in tables:
        assert table in out.stdout, table
    (run,) = list(tmp_path.glob(f"{Path(script).stem}-*"))
    return out.stdout, run


def _train_time_cell(run: Path, row: Callable[[str], bool], times: list[float]) -> dict[str, str]:
    """table_v_replicates.csv's train-time cell of the row that ``row`` picks, which holds the 2 seeds
    of ``times`` and their median."""
    cell = next(r for r in csv.DictReader(open(run / "table_v_replicates.csv"))
                if row(r["row"]) and r["column"] == "train time (s)")
    assert int(cell["n"]) == 2 and float(cell["median"]) == pytest.approx(sum(times) / 2)
    return cell


@pytest.mark.mininet
def test_two_seeds_give_intervals_and_time_to_each_target(tmp_path):
    stdout, run = _two_seeds("microburst.py", tmp_path, "--bursts", "none",
                             tables=("Table II (median over 2 seeds", "Table IV (2 seeds", "Table V (2 seeds"))
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
    times = [float(next(r for r in csv.DictReader(open(run / f"seed{s}" / "table_v.csv")) if r["run"] == "dblp")
                   ["train time (s)"]) for s in (0, 1)]
    cell = _train_time_cell(run, lambda row: row == "no bursts dblp", times)
    assert float(cell["ci95_lo"]) < min(times) and float(cell["ci95_hi"]) > max(times)
    assert "not reached" in stdout
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
    _, run = _two_seeds("trace_replay.py", tmp_path, tables=("Send latency over 2 seeds", "Table IV (2 seeds",
                                                             "Table V (2 seeds", "dblp - baseline ="))
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
    times = [float(per_seed[s]["dblp"]["train time (s)"]) for s in (0, 1)]
    _train_time_cell(run, lambda row: row.endswith(" dblp"), times)
    got = load_curves(run / "curves.csv")
    assert sorted(c.seed for c in got) == [0, 0, 1, 1] and all(c.iterations == [7, 14] for c in got)
    for f in ("accuracy.png", "training_time.png", "latency.png", "cdf.png"):
        assert (run / f).stat().st_size > 0
