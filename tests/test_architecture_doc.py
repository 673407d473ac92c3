"""docs/architecture.md's package picture is the real import graph: scripts/import_graph.py's output,
pasted; and the script's edges follow the layers tests/test_layering.py holds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_graph.py"
LAYERS = ("traces", "dblp", "emulation", "topologies", "scenarios")


def _run(*args: str) -> str:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_pictured_package_graph_is_the_scripts_output():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```mermaid\n(graph BT\n.*?)```", doc, flags=re.S)
    assert blocks, "docs/architecture.md has no package graph"
    assert blocks[0] == _run(), "the package picture is stale: paste `python scripts/import_graph.py`'s output"
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_package_edges_point_down_the_layers():
    for line in _run("--format", "text").splitlines():
        a, b = re.match(r"(\S+) -> (\S+) \(\d+ imports\)", line).groups()
        assert LAYERS.index(a.split(".")[0]) >= LAYERS.index(b.split(".")[0]), line


def test_one_packages_modules():
    out = _run("--modules", "dblp.sim", "--format", "text")
    assert any(ln.startswith("dblp.sim.engines.fast -> ") and "dblp.sim.engines.roundflow" in ln for ln in out.splitlines())
