"""docs/architecture.md against the source: its package picture is scripts/import_graph.py's output,
pasted, whose edges follow the layers and dblp's package order; its round's data path names real
modules and every arrow of it is a real import; its "where do I put X" table answers the common
changes with paths that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_graph.py"
DOC = ROOT / "docs" / "architecture.md"
LAYERS = ("traces", "dblp", "emulation", "topologies", "scenarios")
#: the one import up dblp's package order the layering test allows (--workload's check)
UPWARD = {("dblp.cli", "dblp.train")}


def _run(*args: str) -> str:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _module_graph() -> dict[str, set[str]]:
    """Every module of dblp -> the dblp modules it imports (the script's ``--modules dblp``)."""
    g: dict[str, set[str]] = {}
    for line in _run("--modules", "dblp", "--format", "text").splitlines():
        a, bs = line.split(" -> ")
        g[a] = set() if bs == "-" else set(bs.split(", "))
    return g


def _module_of(name: str, mods: set[str]) -> str | None:
    """The longest dotted prefix of ``name`` that is a module, unless that is only the bare package."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in mods:
            return ".".join(parts[:i])
    return None


def test_the_pictured_package_graph_is_the_scripts_output():
    blocks = re.findall(r"```mermaid\n(graph BT\n.*?)```", _doc(), flags=re.S)
    assert blocks, "docs/architecture.md has no package graph"
    assert blocks[0] == _run(), "the package picture is stale: paste `python scripts/import_graph.py`'s output"
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_picture_shows_every_dblp_package_and_the_simulators():
    picture = _run()
    for pkg in ("dblp.protocol", "dblp.transport", "dblp.runs", "dblp.cli", "dblp.results", "dblp.train",
                "dblp.sim.network", "dblp.sim.engines", "dblp.sim", "dblp.sim.convergence", "dblp.sim.studies",
                "dblp.sim.cli"):
        assert f"{pkg.replace('.', '_')}[{pkg}]" in picture, pkg
    assert "subgraph dblp_box [dblp]" in picture and "subgraph dblp_sim_box [dblp.sim]" in picture


def test_package_edges_point_down_the_layers():
    for line in _run("--format", "text").splitlines():
        a, b = re.match(r"(\S+) -> (\S+) \(\d+ imports\)", line).groups()
        assert LAYERS.index(a.split(".")[0]) >= LAYERS.index(b.split(".")[0]), line


def test_dblp_packages_import_only_those_listed_before_them():
    """The dblp box lists its packages low to high (the layering test's order); every edge between
    two of them points to an earlier one, save the stated exception."""
    box = _run().split("  subgraph dblp_box [dblp]\n", 1)[1].split("\n  end\n", 1)[0]
    order = re.findall(r"^\s+\w+\[([\w.]+)\]$", box, flags=re.M)
    assert order[:3] == ["dblp", "dblp.protocol", "dblp.transport"] and order[-1] == "dblp.sim.__main__"
    rank = {p: i for i, p in enumerate(order)}
    seen = set()
    for line in _run("--format", "text").splitlines():
        a, b = re.match(r"(\S+) -> (\S+) ", line).groups()
        if a in rank and b in rank:
            seen.add((a, b))
            assert rank[a] > rank[b] or (a, b) in UPWARD, line
    assert UPWARD <= seen and ("dblp.transport", "dblp.protocol") in seen


def test_one_packages_modules():
    out = _run("--modules", "dblp.sim", "--format", "text")
    assert any(ln.startswith("dblp.sim.engines.fast -> ") and "dblp.sim.engines.roundflow" in ln for ln in out.splitlines())
    protocol = _run("--modules", "dblp.protocol", "--format", "text").splitlines()
    assert all(ln.startswith("dblp.protocol") for ln in protocol) and len(protocol) >= 15
    assert "dblp.protocol.core -> dblp.protocol.receiver, dblp.protocol.sender" in protocol
    r = subprocess.run([sys.executable, str(SCRIPT), "--modules", "dblp.nothing"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--modules: no package 'dblp.nothing'" in r.stderr


def test_the_rounds_path_is_real_imports():
    """Each participant of the round's sequence diagram is a set of modules; each arrow joins two
    participants one of which holds a module importing a module of the other."""
    g = _module_graph()
    mods = set(g)
    diagram = re.search(r"```mermaid\nsequenceDiagram\n(.*?)```", _doc(), flags=re.S)
    assert diagram, "docs/architecture.md has no round's data path"
    assert not set(";#") & set(diagram.group(1)), "mermaid reads ';' as a line break and '#' as an entity"
    parts: dict[str, set[str]] = {}
    arrows: list[tuple[str, str, str]] = []
    for line in diagram.group(1).splitlines():
        if m := re.match(r"\s+participant (\w+) as (.+)$", line):
            names = [n.strip() for n in m.group(2).split("+")]
            parts[m.group(1)] = {n for n in names if n in mods}
            assert len(parts[m.group(1)]) == len(names), f"not a module: {line.strip()}"
        elif m := re.match(r"\s+(\w+)->>(\w+): (.+)$", line):
            arrows.append(m.groups())
    assert len(parts) == 8 and len(arrows) >= 12
    for a, b, what in arrows:
        joined = any(y in g[x] for x in parts[a] for y in parts[b]) or any(x in g[y] for x in parts[a] for y in parts[b])
        assert joined, f"{a}->>{b} ({what}): no import between {sorted(parts[a])} and {sorted(parts[b])}"
    # the path the page promises: gradient -> staging -> session/sender -> wire/udp -> login/session/receiver
    # -> reduce/compensation -> broadcast -> worker
    covered = set().union(*parts.values())
    for m in ("dblp.transport.worker", "dblp.transport.staging", "dblp.protocol.worker_session", "dblp.protocol.sender",
              "dblp.protocol.wire", "dblp.transport.udp", "dblp.transport.login", "dblp.protocol.session",
              "dblp.protocol.receiver", "dblp.protocol.reduce", "dblp.protocol.compensation", "dblp.transport.server"):
        assert m in covered, m
    assert arrows[-2][:2] == ("WS", "W") and "begin_broadcast" in " ".join(w for *_, w in arrows)


def test_every_dotted_dblp_name_on_the_page_is_a_module():
    mods = set(_module_graph())
    names = set(re.findall(r"\bdblp(?:\.\w+)+", _doc()))
    assert len(names) > 30
    stale = sorted(n for n in names if _module_of(n, mods) is None)
    assert not stale, stale


def test_where_do_i_put_x_answers_the_common_changes_with_real_paths():
    table = _doc().split("## Where do I put X", 1)[1]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| the change")]
    asked = {row.split(" | ")[0][2:] for row in rows}
    for change in ("a protocol rule", "a tolerance policy", "a loss-compensation mode", "a flag", "a simulator engine",
                   "a training workload", "a new scenario", "an analysis, a table or a plot", "a tc rule",
                   "an nft rule"):
        assert any(a.startswith(change) for a in asked), change
    paths = set(re.findall(r"`((?:dblp|emulation|scenarios|traces|topologies|tests|docs|scripts)/[^`\s]*)`", table))
    assert len(paths) > 40
    missing = sorted(p for p in paths if "<" not in p and not (ROOT / p).exists())
    assert not missing, missing
    for p in (p for p in paths if "<" in p):  # a template: its folder exists
        assert (ROOT / p.split("<")[0]).is_dir(), p
