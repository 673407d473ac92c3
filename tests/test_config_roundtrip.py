"""A run's config.json reruns it: parse -> write -> parse gives the same flags, for every command.

Why: ``--config results/X/config.json`` is the promise that an experiment is one file. Before, the
file held argparse's dests and converted values (``"bandwidth": 500000000.0``, read back as Mbit/s:
5e14 bit/s) and derived keys that ``--config`` refused. Now its top level is the flags as given, keyed
by long flag name, and the rest is kept apart (``derived``, ``_run``). No run is started here: every
scenario is asked for ``--print-config`` twice, the second time from the first's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.cli.args import parser
from dblp.cli.provenance import run_values, write_config
from traces.units import duration_arg, rate_arg

ROOT = Path(__file__).resolve().parent.parent
#: every user-facing scenario (gloo_allreduce.py is one rank commanded over stdin by benchmark.py)
SCENARIOS = sorted(p.name for p in (ROOT / "scenarios").glob("*.py")
                   if not p.name.startswith("_") and p.name != "gloo_allreduce.py")
#: flags a scenario needs before it can parse at all
NEEDS = {"gpu_hosts.py": ["hosts.toml"]}
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def demo_parser():
    ap = parser(prog="demo")
    ap.add_argument("--bandwidth", type=rate_arg(), default="500M", help="link rate; a bare number is Mbit/s")
    ap.add_argument("--compute", type=duration_arg(), default="5ms", help="compute time")
    ap.add_argument("--iterations", dest="rounds", type=int, default=150, help="iterations")
    ap.add_argument("--p-high", type=float, default=None, help="tolerance")
    ap.add_argument("--gso", action="store_true", help="GSO")
    ap.add_argument("--loss", action="append", default=None, help="a loss process (repeatable)")
    return ap


def _parse_again(path: Path):
    a = demo_parser().parse_args(["--config", str(path)])
    del a.config
    return a


@pytest.mark.parametrize("argv", [
    [],
    ["--bandwidth", "2.5Gbit", "--compute", "20ms", "--iterations", "30", "--p-high", "0.3", "--gso",
     "--loss", "0.01", "--loss", "iteration_bursts:at=5:loss=0.7"],
])
def test_parse_write_parse_gives_the_same_namespace(tmp_path, argv):
    a = demo_parser().parse_args(argv)
    a.elements = 993_930  # what a run derives: written apart, never read back as a flag
    write_config(tmp_path, a)
    d = json.loads((tmp_path / "config.json").read_text())
    b = _parse_again(tmp_path / "config.json")
    del a.config, a.elements
    assert vars(b) == vars(a)
    assert d["derived"]["elements"] == 993_930 and "elements" not in d
    # the flags as given, under their long names, units in the values
    if argv:
        assert (d["bandwidth"], d["compute"], d["iterations"], d["p-high"]) == ("2.5Gbit", "20ms", "30", "0.3")
        assert d["derived"]["bandwidth"] == 2.5e9 and d["derived"]["rounds"] == 30
        assert run_values(d)["bandwidth"] == 2.5e9  # what readers of a run (calibrate) take
    else:
        assert d["bandwidth"] == "500M" and d["iterations"] == 150


def test_keys_are_long_flag_names_with_dashes_or_underscores_and_old_dests(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('iterations = 20\np_high = 0.2\n')
    a = demo_parser().parse_args(["--config", str(f)])
    assert (a.rounds, a.p_high) == (20, 0.2)
    f.write_text('rounds = 21\n"p-high" = 0.25\n')  # the dest, as config.json held it before
    a = demo_parser().parse_args(["--config", str(f)])
    assert (a.rounds, a.p_high) == (21, 0.25)


def test_a_run_changed_after_parsing_keeps_its_flag_and_records_the_change(tmp_path):
    a = demo_parser().parse_args(["--iterations", "150"])
    a.rounds = 154  # e.g. rounded up to whole epochs
    write_config(tmp_path, a)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["iterations"] == "150" and d["derived"]["rounds"] == 154
    assert _parse_again(tmp_path / "config.json").rounds == 150  # the rerun rounds again, as the run did


def test_unknown_key_says_did_you_mean(tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"bandwith": "1G"}))
    with pytest.raises(SystemExit) as exc:
        demo_parser().parse_args(["--config", str(f)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unknown key 'bandwith'; did you mean 'bandwidth'?" in err


def _print_config(cmd: list[str], cwd: Path) -> dict:
    out = subprocess.run([sys.executable, *cmd, "--print-config"], capture_output=True, text=True, timeout=120,
                         cwd=cwd, env=ENV)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _command_cases() -> list[tuple[str, list[str]]]:
    cases = [(s, [str(ROOT / "scenarios" / s), *NEEDS.get(s, [])]) for s in SCENARIOS]
    cases += [("dblp.sim run", ["-m", "dblp.sim", "run", "--bandwidth", "10G", "--compute", "5ms"]),
              ("dblp.sim sweep", ["-m", "dblp.sim", "sweep", "--p-high", "0.1,0.4", "--iterations", "20"])]
    return cases


@pytest.mark.parametrize("name, cmd", _command_cases(), ids=[c[0] for c in _command_cases()])
def test_every_command_reads_back_the_config_it_writes(tmp_path, name, cmd):
    first = _print_config(cmd, tmp_path)
    assert first and "derived" not in first and "_run" not in first
    (tmp_path / "config.json").write_text(json.dumps({**first, "derived": {"elements": 1}, "_run": {}}))
    base = [c for c in cmd if c not in NEEDS.get(name, [])]
    again = _print_config([*base, "--config", str(tmp_path / "config.json")], tmp_path)
    assert again == first
    helptext = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env=ENV).stdout
    for key in first:  # every key is a long flag of the command (a positional goes by its name)
        assert f"--{key}" in helptext or key in NEEDS_POSITIONAL.get(name, ()), (name, key)


NEEDS_POSITIONAL = {"gpu_hosts.py": ("inventory",)}


def test_the_issue_case_bandwidth_in_bits_is_not_read_as_megabits(tmp_path):
    """A config.json of the old form held ``"bandwidth": 500000000.0`` (bit/s); the new one holds the
    flag as given, and the simulator's rate is the same after the round trip."""
    first = _print_config(["-m", "dblp.sim", "run", "--bandwidth", "500Mbit"], tmp_path)
    assert first["bandwidth"] == "500Mbit"
    (tmp_path / "c.json").write_text(json.dumps(first))
    again = _print_config(["-m", "dblp.sim", "run", "--config", str(tmp_path / "c.json")], tmp_path)
    assert again["bandwidth"] == "500Mbit"
