"""``python -m dblp.sim predict``: the paper's full-length runs simulated from a calibration, beside the paper's
figures; the compute's source said; a calibration of another model without --compute refused by name."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from dblp.sim import SimConfig

ROOT = Path(__file__).resolve().parents[2]


def predict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dblp.sim", "predict", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_efficientnet_b0_paper_run_predicted_beside_the_papers_figures(tmp_path):
    out = predict("--models", "efficientnet_b0", "--compute", "30ms", "--no-calm", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "930 iterations, 70% bursts at [279, 651], P_low 0.008, P_high 0.408" in out.stdout
    assert "30.00 ms, stated on the command line (--compute), not measured" in out.stdout
    rows = {r[0]: r[1:] for r in csv.reader(open(tmp_path / "efficientnet_b0-table_ii.csv"))}
    assert rows["Latency (s)"] == ["Burst 1 (iter 279)", "Burst 2 (iter 651)", "Tail (max)", "Average"]
    assert [float(x) for x in rows["Paper: speedup (x)"]] == [4.68, 5.88, 1.91, 1.56]
    dblp, base = [float(x) for x in rows["DBLP"]], [float(x) for x in rows["Baseline"]]
    # the baseline (p = 0.8%) needs ~14 passes at a 70% burst, DBLP at P_high 3: slower at both bursts
    assert base[0] > 1.2 * dblp[0] and base[1] > 1.2 * dblp[1]
    assert all(abs(float(s) - b / d) < 1e-6 for s, b, d in zip(rows["Speedup (x)"], base, dblp))
    t5 = list(csv.reader(open(tmp_path / "efficientnet_b0-table_v.csv")))
    assert [r[:2] for r in t5[1:]] == [["with bursts at 279,651", "baseline"], ["with bursts at 279,651", "dblp"]]
    assert float(t5[1][3]) > 1.0 and float(t5[1][5]) == 23.86 and float(t5[2][3]) == 1.0
    assert (tmp_path / "efficientnet_b0-latency.png").stat().st_size > 0


def test_a_calibration_of_another_model_needs_a_stated_compute(tmp_path):
    params = tmp_path / "cal.json"
    SimConfig().with_(model=993_930, compute_s=0.015).to_json(params)
    out = predict("--params", str(params), "--models", "resnet50")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "993,930-float model, not resnet50 (23,712,932 floats): give --compute" in out.stderr
    out = predict("--models", "vgg16", "--compute", "1ms")
    assert out.returncode == 2 and "'vgg16' is not one of the paper's microburst runs" in out.stderr
