"""``python -m dblp.train.computetime``: a model's compute per iteration, as the GPU check measures it for
``dblp.sim predict`` (here on the CPU, tiny)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compute_per_iteration_measured_and_written(tmp_path):
    out = tmp_path / "compute.json"
    r = subprocess.run([sys.executable, "-m", "dblp.train.computetime", "--models", "efficientnet_b0", "--procs", "1",
                        "--device", "cpu", "--batch", "2", "--steps", "1", "--output", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["_device"] == "cpu" and got["_batch"] == 2
    assert 0.001 < got["efficientnet_b0"]["1"] < 60  # seconds per iteration, one process alone
    assert "efficientnet_b0  1 process(es) at once:" in r.stdout


def test_models_without_a_teacher_set_are_refused():
    r = subprocess.run([sys.executable, "-m", "dblp.train.computetime", "--models", "gpt2_s", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--models: gpt2_s: one of efficientnet_b0, resnet50, alexnet" in r.stderr
