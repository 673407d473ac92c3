"""Experiments as files: ``--config FILE.toml`` sets a command's flags; runs write them back with provenance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.cli.args import parser
from dblp.cli.provenance import provenance, write_config
from traces.units import rate_arg

ROOT = Path(__file__).resolve().parent.parent


def demo_parser():
    ap = parser(prog="demo")
    ap.add_argument("--bandwidth", type=rate_arg(), default="500M", help="link rate; a bare number is Mbit/s")
    ap.add_argument("--bursts", default="50,110", help="burst iterations")
    ap.add_argument("--iterations", type=int, default=150, help="iterations")
    ap.add_argument("--gso", action="store_true", help="GSO")
    return ap


def test_config_sets_defaults_through_the_same_converters_and_the_command_line_wins(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('bandwidth = "1G"\nbursts = [10, 20]\niterations = 30\ngso = true\n')
    a = demo_parser().parse_args(["--config", str(f)])
    assert (a.bandwidth, a.bursts, a.iterations, a.gso) == (1e9, "10,20", 30, True)
    a = demo_parser().parse_args(["--config", str(f), "--iterations", "7"])
    assert a.iterations == 7 and a.bandwidth == 1e9


@pytest.mark.parametrize("text, message", [
    ("speed = 3\n", "unknown key 'speed'"),
    ("gso = 1\n", "gso must be true or false"),
    ("iterations = \n", "cannot read"),
])
def test_bad_config_files_are_refused_by_name(tmp_path, capsys, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SystemExit) as exc:
        demo_parser().parse_args(["--config", str(f)])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_written_config_carries_commit_dirty_flag_and_versions(tmp_path):
    p = provenance()
    assert p["packages"]["numpy"] and "git_dirty" in p
    path = write_config(tmp_path, {"iterations": 3, "out": tmp_path, "nan": float("nan")})
    d = json.loads(path.read_text())
    assert d["iterations"] == 3 and d["out"] == str(tmp_path) and d["nan"] is None
    assert set(d["_run"]) >= {"git_commit", "git_dirty", "packages", "python", "host"}


def test_a_scenario_takes_its_flags_from_a_file_before_anything_starts(tmp_path):
    f = tmp_path / "mb.toml"
    f.write_text('iterations = 40\nbursts = [5, 39]\nworkload = "none"\nmodel = "2e5"\n')
    out = subprocess.run([sys.executable, str(ROOT / "scenarios" / "microburst.py"), "--config", str(f), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "(default: 40)" in out.stdout and "(default: 5,39)" in out.stdout
    f.write_text("bursts = [500]\n")  # past the run's end: refused by the flag's own check, before Mininet
    out = subprocess.run([sys.executable, str(ROOT / "scenarios" / "microburst.py"), "--config", str(f),
                          "--workload", "none"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--bursts" in out.stderr and "500" in out.stderr
