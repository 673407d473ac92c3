"""scenarios/phase_sensitivity.py runs end to end at a tiny size and writes its outputs
(as a subprocess, the way a user runs it: tests do not import scenarios)."""

import csv
import json
import subprocess
import sys
from pathlib import Path

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "phase_sensitivity.py"


def test_phase_sensitivity_scenario_tiny_run(tmp_path):
    r = subprocess.run([sys.executable, str(SCENARIO), "--seeds", "2", "--epochs", "2", "--early-epochs", "1",
                        "--drops", "0.5", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in ("runs.csv", "summary.csv", "summary.json", "phase_sensitivity.png"):
        assert (tmp_path / name).is_file(), name
    with open(tmp_path / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 2 * 3  # settings x seeds x (epochs + the epoch-0 evaluation)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["setting"] for s in summary["settings"]] == ["no drop", "late 50%", "early 50%"]
    v = summary["verdicts"][0]
    assert set(v) == {"drop", "final_accuracy", "mean_accuracy_over_epochs"}
    out = r.stdout
    assert "late - early" in out and "no drop" in out
