"""Every command speaks one flag vocabulary.

Walks the parser of every command - the library CLIs through their
``build_parser()``, the scenarios as subprocesses (tests never import a
scenario: the child runs the script with argparse patched to print its
parser instead of parsing) - and checks that every visible option has help,
that a default worth showing is shown, that a rate flag says the unit of a
bare number, and that no command names a concept of
:data:`dblp.cli.args.VOCABULARY` by another name.
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.cli.args import MEANINGS, UNIT_SUFFIXES, VOCABULARY

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.py") if not p.name.startswith("_"))

# Runs in a child process: patch argparse so that parsing prints the parser tree and exits,
# then run the scenario as ``python scenarios/X.py`` would (its folder first on the search path:
# PYTHONPATH below, as Python puts a script's own folder).
def _walk(p: argparse.ArgumentParser, path: list[str]) -> list[dict]:
    out: list[dict] = []
    fmt = p._get_formatter()
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                out += _walk(sp, path + [name])
            continue
        if isinstance(a, argparse._HelpAction):
            continue
        shown = a.help != argparse.SUPPRESS
        out.append({"cmd": " ".join(path), "opts": list(a.option_strings), "help": a.help if shown else None,
                    "hidden": not shown, "text": fmt._expand_help(a) if shown and a.help else "",
                    "default": None if a.default is None or a.default is False or a.default == argparse.SUPPRESS
                    else repr(a.default), "type": getattr(a.type, "__name__", None), "nargs0": a.nargs == 0})
    return out


#: run in a scenario's process (tests never import a scenario): every parser it builds is walked by
#: the very :func:`_walk` above, printed as JSON, and the scenario stops before it runs
_DUMP = "import argparse, json, runpy, sys\n\n" + inspect.getsource(_walk) + r'''
def dump(self, *a, **k):
    print("ARGDUMP" + json.dumps(_walk(self, [self.prog])))
    raise SystemExit(0)

argparse.ArgumentParser.parse_args = dump
argparse.ArgumentParser.parse_known_args = dump
path = sys.argv[1]
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
'''


def _library_parsers() -> dict[str, argparse.ArgumentParser]:
    from dblp.results.analysis import build_parser as analysis_parser
    from dblp.cli.commands import build_parser as dblp_parser
    from dblp.sim.cli import build_parser as sim_parser
    from dblp.train.__main__ import build_parser as train_parser
    from dblp.train.computetime import build_parser as computetime_parser
    from dblp.results.traceimport import build_parser as traceimport_parser
    from emulation.cleanup import build_parser as cleanup_parser
    from emulation.hosts.cli import build_parser as hosts_parser
    from emulation.nshosts import build_parser as nshosts_parser
    from emulation.udptool import build_parser as udptool_parser
    from traces.cli import build_parser as traces_parser

    return {"python -m dblp": dblp_parser(), "python -m dblp.sim": sim_parser(), "python -m dblp.results.analysis": analysis_parser(),
            "python -m dblp.train": train_parser(), "python -m dblp.results.traceimport": traceimport_parser(),
            "python -m dblp.train.computetime": computetime_parser(),
            "python -m emulation.cleanup": cleanup_parser(), "python -m emulation.hosts": hosts_parser(),
            "python -m emulation.nshosts": nshosts_parser(), "python -m emulation.udptool": udptool_parser(),
            "python -m traces": traces_parser()}


def _scenario_options(script: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", _DUMP, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={"PATH": "/usr/bin:/bin", "DBLP_NO_REEXEC": "1",
                                      "PYTHONPATH": f"{script.parent}:{ROOT}"})
    line = next((x for x in r.stdout.splitlines() if x.startswith("ARGDUMP")), None)
    assert line, f"{script.name}: no parser dumped\n{r.stderr[-2000:]}"
    return json.loads(line[len("ARGDUMP"):])


@pytest.fixture(scope="module")
def options() -> list[dict]:
    opts = []
    for name, p in _library_parsers().items():
        opts += [dict(o, command=name) for o in _walk(p, [name])]
    for script in SCENARIOS:
        opts += [dict(o, command=f"scenarios/{script.name}") for o in _scenario_options(script)]
    return opts


def _visible(options: list[dict]) -> list[dict]:
    return [o for o in options if o["opts"] and not o["hidden"]]


def test_every_scenario_has_help():
    for script in SCENARIOS:
        r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
        assert r.returncode == 0 and "usage:" in r.stdout, f"{script.name}: {r.stderr[-1000:]}"


def test_every_option_has_help_and_shows_its_default(options):
    no_help = [f"{o['cmd']} {o['opts'][0]}" for o in options if not o["hidden"] and not (o["help"] or "").strip()]
    assert not no_help, f"options without help: {no_help}"
    hidden_default = [f"{o['cmd']} {o['opts'][0]}" for o in _visible(options)
                      if o["default"] is not None and not o["nargs0"] and "default" not in o["text"].lower()]
    assert not hidden_default, f"options whose --help does not show the default: {hidden_default}"


def test_rate_flags_say_the_unit_of_a_bare_number(options):
    bad = [f"{o['cmd']} {o['opts'][0]}" for o in _visible(options) if o["type"] == "rate" and "Mbit/s" not in o["text"]]
    assert not bad, f"rate flags that do not say a bare number is Mbit/s: {bad}"


def test_one_name_per_concept(options):
    names = {n: o for o in _visible(options) for n in o["opts"]}
    wrong = [f"{o['cmd']} uses {n} for {concept!r}: say {one}"
             for concept, (one, banned) in VOCABULARY.items() for n in banned if n in names
             for o in [names[n]]]
    assert not wrong, "\n".join(wrong)
    # --results is always the parent folder of a run's own folder; --out the folder itself
    results = [f"{o['cmd']}: {o['help']}" for o in _visible(options) if "--results" in o["opts"]
               and "parent" not in o["help"]]
    assert not results, f"--results must be the parent folder: {results}"


def test_a_quiet_switch_is_always_spelt_quiet(options):
    bad = [f"{o['cmd']} {o['opts']}" for o in _visible(options) if "-q" in o["opts"] and "--quiet" not in o["opts"]]
    assert not bad, bad


def test_one_meaning_per_name(options):
    bad = [f"{o['cmd']} {flag}: {o['help']!r} (should say {word!r})" for o in _visible(options)
           for flag, word in MEANINGS.items() if flag in o["opts"] and word.lower() not in o["help"].lower()]
    assert not bad, "\n".join(bad)


def test_units_go_in_values_not_in_names(options):
    bad = sorted({n for o in _visible(options) for n in o["opts"] if n.endswith(UNIT_SUFFIXES)})
    assert not bad, f"flags with a unit in the name (give it in the value: --compute 5ms): {bad}"


# -- one name per policy, one folder flag, --version everywhere, completion ----------------------------
def test_every_entry_point_answers_version(options):
    commands = {o["command"] for o in options}
    answering = {o["command"] for o in options if "--version" in o["opts"]}
    assert commands - answering == set(), f"entry points without --version: {sorted(commands - answering)}"
    r = subprocess.run([sys.executable, "-m", "dblp", "--version"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("dblp 0.1.0"), r.stdout + r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "scenarios" / "sweep.py"), "--version"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "0.1.0" in r.stdout, r.stdout + r.stderr


def test_one_name_per_policy_and_the_old_name_still_reads():
    """``baseline`` everywhere: flags, the policy object, records; ``fixed`` (the old name) accepted and
    read back as ``baseline``."""
    from dblp.cli.commands import build_parser as dblp_parser
    from dblp.protocol.policy import POLICIES, FixedPolicy, make_policy, parse_runs, run_policy
    from dblp.protocol.records import RoundRecord
    from dblp.sim.cli import build_parser as sim_parser
    from dblp.sim.config import SimConfig

    assert POLICIES == ("reliable", "baseline", "dblp")
    for name in ("baseline", "fixed"):
        assert dblp_parser().parse_args(["server", "--policy", name]).policy == "baseline"
        assert sim_parser().parse_args(["run", "--policy", name]).policy == "baseline"
        assert run_policy(name, 0.01).flags() == ["--policy", "baseline", "--p", "0.01"]
        assert make_policy(name, p=0.01).name == "baseline"
        assert SimConfig(policy=name, p=0.01).policy == "baseline"
    assert FixedPolicy(0.01).name == "baseline" and parse_runs("reliable,fixed,dblp") == list(POLICIES)
    old = RoundRecord(source="emulation", role="worker", worker=0, round=1, policy="fixed").to_dict()
    assert RoundRecord.from_dict(old).policy == "baseline"


def test_policy_flags_name_the_alias(options):
    bad = [f"{o['cmd']}: {o['text']!r}" for o in _visible(options) if "--policy" in o["opts"]
           and "fixed is accepted as the old name of baseline" not in o["text"]]
    assert not bad, bad


def test_output_flags_one_per_meaning(options):
    """A run's folder is ``--out``, the parent of timestamped run folders ``--results``, a file ``--output``
    (``-o``): never another spelling, and ``-o`` never a folder."""
    short_o = [f"{o['cmd']} {o['opts']}: {o['help']!r}" for o in _visible(options) if "-o" in o["opts"]
               and ("--output" not in o["opts"] or "file" not in o["help"].lower())]
    assert not short_o, short_o
    outs = [o for o in _visible(options) if "--out" in o["opts"]]
    assert len(outs) >= 8 and all("folder" in o["help"].lower() for o in outs), [o["help"] for o in outs]


def test_shell_completion_scripts_come_from_the_parsers():
    """``shtab --shell=bash dblp.sim.cli.build_parser`` (docs/protocol.md): every library entry point's
    parser gives a completion script that knows its flags."""
    import shtab

    for name, p in _library_parsers().items():
        script = shtab.complete(p, shell="bash")
        assert "--version" in script and "complete -o" in script, name
    from dblp.sim.cli import build_parser as sim_parser

    script = shtab.complete(sim_parser(), shell="zsh")
    assert "--bandwidth" in script and "--print-config" in script


# -- one verbosity flag ------------------------------------------------------------------------------------
def test_every_entry_point_takes_quiet_and_verbose_with_one_meaning(options):
    """``-q/--quiet`` and ``-v/--verbose`` on every command and subcommand (library and scenarios), each
    with the one help text of :func:`traces.argtypes.add_verbosity`; ``--progress`` only as the alias."""
    from traces.argtypes import PROGRESS_HELP, QUIET_HELP, VERBOSE_HELP

    cmds = {o["cmd"] for o in options}
    for flag, text in (("-q", QUIET_HELP), ("-v", VERBOSE_HELP)):
        having = [o for o in _visible(options) if flag in o["opts"]]
        assert cmds - {o["cmd"] for o in having} == set(), f"commands without {flag}"
        assert {o["help"] for o in having} == {text}, {o["cmd"]: o["help"] for o in having if o["help"] != text}
    assert len(cmds) >= 45
    progress = sorted(o["cmd"] for o in _visible(options) if "--progress" in o["opts"])
    assert progress == ["python -m dblp worker", "python -m dblp.train worker"], progress
    assert all(o["help"] == PROGRESS_HELP and "deprecated" in o["help"] for o in _visible(options)
               if "--progress" in o["opts"])


def test_verbosity_levels_and_quiet_with_verbose_refused(capsys):
    from dblp.cli.commands import build_parser as dblp_parser
    from dblp.sim.cli import build_parser as sim_parser
    from traces.argtypes import log_level, verbosity

    p = dblp_parser()
    w = ["worker", "--server", "127.0.0.1:1"]
    levels = {" ".join(extra): verbosity(p.parse_args(w + extra)) for extra in ([], ["-q"], ["--quiet"], ["-v"],
                                                                                  ["-vv"], ["-v", "--verbose"])}
    assert levels == {"": 0, "-q": -1, "--quiet": -1, "-v": 1, "-vv": 2, "-v --verbose": 2}
    # given before the subcommand: not overwritten by the subcommand's default
    assert verbosity(p.parse_args(["-v"] + w)) == 1 and verbosity(p.parse_args(["-q", "server"])) == -1
    assert [log_level(p.parse_args(w + x)) for x in ([], ["-q"], ["-v"], ["-vv"])] == [30, 30, 20, 10]
    # -q with -v: refused with a message naming both, on every library entry point and on a subcommand
    cases = [(name, pr, ["-q", "-v"]) for name, pr in _library_parsers().items()]
    cases += [("dblp server", p, ["server", "-v", "-q"]), ("dblp.sim run", sim_parser(), ["run", "-q", "-v"])]
    for name, pr, argv in cases:
        with pytest.raises(SystemExit) as exc:
            pr.parse_args(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "-q/--quiet and -v/--verbose contradict" in err, (name, err)


def test_quiet_with_verbose_refused_by_a_scenario():
    r = subprocess.run([sys.executable, str(ROOT / "scenarios" / "sweep.py"), "-q", "-v"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "contradict" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_progress_still_means_verbose_where_it_existed():
    """``--progress`` (deprecated alias of ``-v``) on the two workers, as :func:`dblp.runs.launch.train_worker_argv`
    still passes it; ``-q --progress`` is refused like ``-q -v``."""
    from dblp.cli.commands import build_parser as dblp_parser
    from dblp.runs.launch import RunArgs, train_worker_argv
    from dblp.train.__main__ import build_parser as train_parser
    from traces.argtypes import verbosity

    a = dblp_parser().parse_args(["worker", "--server", "127.0.0.1:1", "--progress"])
    assert verbosity(a) == 1
    argv = train_worker_argv(RunArgs(workers=2, iterations=3, model="1e3", policy=[]),
                             {"workload": "small_cnn", "epochs": 1, "progress": True}, 0, "127.0.0.1:1", "r.jsonl",
                             "out")
    assert argv[1:4] == ["-m", "dblp.train", "worker"] and "--progress" in argv
    assert verbosity(train_parser().parse_args(argv[3:])) == 1
    with pytest.raises(SystemExit):
        train_parser().parse_args(argv[3:] + ["-q"])


def test_a_config_file_sets_verbosity(tmp_path):
    """``verbose = 2`` in a ``--config`` file is ``-vv``; ``quiet = true`` still reads (older config.json)."""
    from dblp.sim.studies.sweep import add_sweep_args
    from dblp.cli.args import parser
    from traces.argtypes import verbosity

    def parse(text: str) -> int:
        (tmp_path / "c.toml").write_text(text)
        p = parser(prog="t")
        add_sweep_args(p)
        return verbosity(p.parse_args(["--config", str(tmp_path / "c.toml")]))

    assert parse("verbose = 2\n") == 2 and parse("quiet = true\n") == -1
    with pytest.raises(SystemExit):
        parse("verbose = true\n")
