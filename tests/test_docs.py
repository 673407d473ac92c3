"""The documentation: the site builds strictly, and the README's quick commands run as printed.

The README is the first page a newcomer reads, so what it shows must be what the code does: its
no-root commands that take seconds are extracted from the README itself (not copied here) and run,
and the output it prints for the simulator run is compared with a fresh run's, timings aside.
Commands that need root or minutes (``sudo ...``, the setup script, the whole test suite, the
docs server) are named in :data:`NOT_QUICK` with the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: command prefixes of the README that this test does not run, and why
NOT_QUICK = {
    "sudo ": "needs root and minutes (the emulation tests run these scenarios)",
    "bash scripts/setup.sh": "installs system packages",
    ".venv/bin/python -m pytest": "the whole test suite",
    ".venv/bin/mkdocs serve": "a server; test_site_builds_strictly builds the same site",
    "python scenarios/": "a scenario run of half a minute or more (tests/test_scenarios_start.py starts them)",
    "bash scripts/gpu_check.sh": "trains the paper's models",
    "python -m dblp.results.analysis compare A B": "needs two runs (tests/test_analysis_compare.py)",
}


def _readme_commands() -> list[str]:
    """Every command the README shows: indented code lines, and backticked `python -m ...` in its map."""
    cmds: list[str] = []
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("    ") and not line.startswith("     "):
            cmds.append(line.strip().split("  #")[0].strip())
        for m in re.finditer(r"`((?:\.venv/bin/)?python -m [^`]+?--help)`", line):
            cmds.append(m.group(1))
    return cmds


def _quick(cmd: str) -> bool:
    return not any(cmd.startswith(p) or cmd.startswith(".venv/bin/" + p) for p in NOT_QUICK)


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(cmd)
    if argv[0] in (".venv/bin/python", "python", "python3"):
        argv[0] = sys.executable
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_readme_is_short_and_links_exist() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the manual belongs in docs/"
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("../shared/"):
            continue
        if not (ROOT / target).exists():
            missing.append(target)
    assert missing == [], f"README.md links to missing files: {missing}"


def test_readme_commands_are_classified() -> None:
    cmds = _readme_commands()
    quick = [c for c in cmds if _quick(c)]
    # the minute-one simulator run and the --help of the map's entry points
    assert any(c.startswith(".venv/bin/python -m dblp.sim run") for c in quick), quick
    assert sum(c.endswith("--help") for c in quick) >= 3, quick
    assert any(c.startswith("sudo python scenarios/microburst.py") for c in cmds), cmds


def test_readme_quick_commands_run(tmp_path: Path) -> None:
    """Each quick command exits 0; the simulator run prints what the README shows (timings aside)."""
    text = README.read_text(encoding="utf-8")
    for cmd in (c for c in _readme_commands() if _quick(c)):
        proc = _run(cmd, tmp_path)
        assert proc.returncode == 0, f"{cmd!r} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
        if " dblp.sim run " not in cmd:
            assert "usage:" in proc.stdout, cmd
            continue
        out = shlex.split(cmd)[shlex.split(cmd).index("--out") + 1]
        assert (tmp_path / out / "records-dblp.jsonl").stat().st_size > 0
        printed = [ln for ln in proc.stdout.splitlines() if " iterations (" in ln or ln.startswith("baseline/dblp")]
        assert len(printed) == 3, proc.stdout
        for ln in printed:
            shown = re.sub(r"in \d+\.\d+ s", "in T s", ln)
            documented = [re.sub(r"in \d+\.\d+ s", "in T s", d) for d in text.splitlines()]
            assert shown in documented, f"README.md shows a different line than the run prints:\n{ln}"


def test_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every page in the nav, no broken link or anchor, the API pages render."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "dblp.protocol.core" in api and "RoundRecord" in api and "DBLPComm" in api
    # the files mkdocs only sees through includes are on the site, whole
    fmt = (tmp_path / "site" / "traces-format" / "index.html").read_text(encoding="utf-8")
    assert "DBLP loss-trace format, version 1" in fmt
    results = (tmp_path / "site" / "results" / "phase-sensitivity" / "index.html").read_text(encoding="utf-8")
    assert "measured results" in results


#: a project path as the pages write it: a Python or shell file, or a folder (trailing slash)
_DOC_PATH = re.compile(r"(?<![\w/.-])((?:dblp|emulation|scenarios|traces|topologies|scripts|tests)/[\w/.-]*?"
                       r"(?:\.py|\.sh|/))(?!\w)")


def test_every_path_the_pages_name_exists() -> None:
    """A page that names a file no longer there (a module turned into a package, a file moved) sends
    a reader to nothing: every project file or folder written in docs/ exists (templates such as
    `scenarios/<name>.py` do not match)."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    named = {(page.relative_to(ROOT).as_posix(), m.group(1)) for page in pages
             for m in _DOC_PATH.finditer(page.read_text(encoding="utf-8"))}
    assert len(pages) > 20 and len(named) > 200, (len(pages), len(named))
    assert ("docs/layout.md", "dblp/protocol/core.py") in named  # the pattern finds what the pages write
    missing = sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).exists())
    assert not missing, "\n".join(missing)


def test_the_path_check_catches_a_stale_path() -> None:
    text = ("see `dblp/protocol/no_such_rule.py`, `dblp/protocol/`, dblp/cli/args.py, mydblp/x.py "
            "and `scenarios/<name>.py`")
    found = [m.group(1) for m in _DOC_PATH.finditer(text)]
    assert found == ["dblp/protocol/no_such_rule.py", "dblp/protocol/", "dblp/cli/args.py"]
    assert [(ROOT / f).exists() for f in found] == [False, True, True]


def _module_file(dotted: str) -> Path | None:
    """The file of a dotted module name of the tree (a package's ``__init__.py``), or None."""
    base = ROOT / dotted.replace(".", "/")
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def test_every_dotted_dblp_name_the_pages_write_is_in_the_source() -> None:
    """`dblp.x.y.name`: the longest prefix that is a module exists below `dblp` itself, and the
    next part, when there is one, is a name written in that module (a function, a class, a constant,
    or a re-export), so a page does not point at a name that moved."""
    stale, seen = [], 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for name in sorted(set(re.findall(r"(?<![\w/.])dblp(?:\.\w+)+", page.read_text(encoding="utf-8")))):
            parts = name.split(".")
            cut = next((i for i in range(len(parts), 1, -1) if _module_file(".".join(parts[:i]))), None)
            seen += 1
            if cut is None:
                stale.append(f"{page.relative_to(ROOT)}: {name} (no such module)")
            elif cut < len(parts):
                src = _module_file(".".join(parts[:cut])).read_text(encoding="utf-8")
                if not re.search(rf"\b{parts[cut]}\b", src):
                    stale.append(f"{page.relative_to(ROOT)}: {name} ({'.'.join(parts[:cut])} has no {parts[cut]})")
    assert seen > 100, seen
    assert not stale, "\n".join(stale)
