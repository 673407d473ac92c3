"""The paper's experiments as files (scenarios/experiments/*.toml): parsed into the paper's numbers by
the scenario's own flags (``--dry-run``: nothing started, no root), and bad files or values refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MICROBURST = str(ROOT / "scenarios" / "microburst.py")
EXPERIMENTS = ROOT / "scenarios" / "experiments"


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, MICROBURST, *args, "--dry-run", "--device", "cpu"], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("name, workload, epochs, bursts, p_low, p_high", [
    ("paper_efficientnet_b0", "efficientnet_b0", 10, [279, 651], 0.008, 0.408),
    ("paper_resnet50", "resnet50", 15, [372, 651, 1209], 0.024, 0.424),
])
def test_paper_configs_parse_into_the_papers_runs(name, workload, epochs, bursts, p_low, p_high):
    out = dry_run("--config", str(EXPERIMENTS / f"{name}.toml"))
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    t = plan["train"]
    assert (t["workload"], t["epochs"], t["iterations_per_epoch"], t["batch_size"]) == (workload, epochs, 93, 128)
    assert plan["iterations"] == 93 * epochs and plan["bursts"] == bursts and plan["burst_loss"] == 0.7
    assert (plan["p_low"], plan["p_high"], plan["workers"], plan["policies"]) == (p_low, p_high, 3, ["baseline", "dblp"])
    assert (t["data"], t["data_size"], t["device"]) == ("teacher", 35_712, "cpu")
    assert plan["bandwidth_bps"] == 2e9 and plan["queue_bytes"] == 1000 * 1514
    assert "teacher-labelled images" in out.stdout and "not CIFAR" in out.stdout  # the data's limits are said


@pytest.mark.parametrize("text, extra, message", [
    ('iteration = 5\nworkload = "none"\n', [], "unknown key 'iteration'"),
    ('workload = "digits_mlp"\ndata = "teacher"\n', [], "data teacher: only the image workloads"),
    ('workload = "none"\ndata-size = 100\n', [], "--data, --data-size and --device are for training workers"),
    ('workload = "digits_mlp"\ndata-size = 100\n', [], "--data-size: only with --data teacher"),
    ('workload = "none"\nhosts = "vm"\n', [], "--hosts 'vm': one of auto, mininet, netns"),
    ('workload = "digits_mlp"\ndevice = "gpu"\n', [], "--device 'gpu': one of auto, cpu, cuda"),
    ('workload = "none"\niterations = 100\nbursts = [279, 651]\n', [], "--bursts"),
])
def test_bad_experiment_files_are_refused_by_name(tmp_path, text, extra, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    out = subprocess.run([sys.executable, MICROBURST, "--config", str(f), "--dry-run", *extra], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stdout[-1000:] + out.stderr[-1000:]
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr[-1000:]


def test_cuda_is_refused_where_torch_sees_no_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run([sys.executable, MICROBURST, "--workload", "digits_mlp", "--device", "cuda", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--device: cuda, but torch sees no CUDA device" in out.stderr
