"""The import layering of the project: one direction, no circles, thin scenarios.

Layers, low to high (the README's layout section says why)::

    traces < dblp < emulation < topologies < scenarios        (tests sit on top)

A module may import its own layer and the layers below, never one above
(a "back-up" import); no two files may import each other, directly or around
a longer loop; a scenario never imports another scenario (shared code lives
in a library layer); a test never imports a scenario (it tests the library,
or runs the scenario as a subprocess).

Every ``.py`` file under the six folders is parsed with :mod:`ast`; imports
count wherever they are - module level, inside functions, under
``if TYPE_CHECKING`` - since any of them runs (or is meant to run) and ties
the files together. Resolution follows how the code is run: packages by
their dotted names (relative imports resolved), scenarios and tests also by
bare names of files beside them (a script's folder, and pytest's rootdir
insertion, put their own folder on the module search path). Only the project's own
modules make edges; the standard library and third parties are ignored.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("traces", "dblp", "emulation", "topologies", "scenarios", "tests")  # low -> high
RANK = {name: i for i, name in enumerate(LAYERS)}
#: folders whose files import their neighbours by bare name (run as scripts / by pytest)
BARE_NAME_DIRS = ("scenarios", "tests")
#: calls that load a module from a name or a path
LOADERS = {"import_module", "__import__", "spec_from_file_location", "run_path", "run_module",
           "SourceFileLoader", "load_source"}


# -- the checker --------------------------------------------------------------------------------------
def module_name(path: str) -> str:
    """``dblp/sim/cli.py`` -> ``dblp.sim.cli``; ``dblp/__init__.py`` -> ``dblp``."""
    parts = Path(path).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_tree(root: Path = ROOT) -> dict[str, str]:
    """Source of every ``.py`` file of the layered folders, keyed by its path relative to ``root``."""
    out: dict[str, str] = {}
    for top in LAYERS:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            for f in filenames:
                if f.endswith(".py"):
                    p = Path(dirpath) / f
                    out[p.relative_to(root).as_posix()] = p.read_text(encoding="utf-8")
    return out


class Tree:
    """The parsed files and their import edges (``edges[a]`` = project modules ``a`` imports)."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.paths = {module_name(p): p for p in sources}
        self.trees: dict[str, ast.AST] = {}
        self.unparsable: list[str] = []
        for p, src in sources.items():
            try:
                self.trees[module_name(p)] = ast.parse(src, filename=p)
            except SyntaxError as exc:
                self.unparsable.append(f"{p}:{exc.lineno}: {exc.msg}")
        self.edges: dict[str, set[str]] = defaultdict(set)
        self.reaches_scenarios: set[str] = set()  # tests that put scenarios/ on the search path or load one by path
        for mod, tree in self.trees.items():
            self._scan(mod, tree)

    def _is_package(self, mod: str) -> bool:
        return self.paths[mod].endswith("__init__.py")

    def _resolve(self, importer: str, name: str, bare: bool = True) -> list[str]:
        """The project module an absolute dotted ``name`` means for ``importer``: the module itself,
        else the nearest package of it that exists; with ``bare``, a file beside a script or a test
        first. Empty for modules outside the project."""
        folder = importer.rsplit(".", 1)[0] if "." in importer else ""
        if bare and folder.split(".")[0] in BARE_NAME_DIRS and not self._is_package(importer):
            for cand in (f"{folder}.{name}", f"{folder}.{name.split('.')[0]}"):
                if cand in self.paths:
                    return [cand]
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            cand = ".".join(parts[:i])
            if cand in self.paths:
                return [cand]
        return []

    def _submodule(self, importer: str, name: str, bare: bool) -> str | None:
        """``name`` when it is a module file itself (``from pkg import module``)."""
        hit = self._resolve(importer, name, bare)
        if hit and (hit[0] == name or hit[0].endswith("." + name)):
            return hit[0]
        return None

    def _from_base(self, importer: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = importer.split(".") if self._is_package(importer) else importer.split(".")[:-1]
        base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
        return ".".join(base + ([node.module] if node.module else []))

    def _scan(self, mod: str, tree: ast.AST) -> None:
        is_test = mod.split(".")[0] == "tests"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for a in node.names:
                    targets += self._resolve(mod, a.name)
            elif isinstance(node, ast.ImportFrom):
                # ``from pkg import module`` imports that module; ``from mod import name`` imports mod
                base = self._from_base(mod, node)
                bare = not node.level
                for a in node.names:
                    sub = self._submodule(mod, f"{base}.{a.name}" if base else a.name, bare)
                    targets += [sub] if sub else self._resolve(mod, base, bare) if base else []
            elif isinstance(node, ast.Call):
                fn = node.func
                fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if fname in ("import_module", "__import__") and node.args \
                        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    targets += self._resolve(mod, node.args[0].value)
                if is_test and fname in ("insert", "append") and "path" in ast.unparse(fn) \
                        and "scenarios" in ast.unparse(node):  # the search path gets .../scenarios
                    self.reaches_scenarios.add(mod)
                if is_test and fname in LOADERS and ("scenarios" in ast.unparse(node) or self._mentions_scenarios(tree)):
                    self.reaches_scenarios.add(mod)
            for t in targets:
                if t != mod:
                    self.edges[mod].add(t)

    @staticmethod
    def _mentions_scenarios(tree: ast.AST) -> bool:
        """A path into scenarios/ spelt anywhere in the file (``ROOT / "scenarios" / "x.py"``)."""
        return any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and (c.value == "scenarios" or c.value.startswith("scenarios/"))
                   for c in ast.walk(tree))


def layer(mod: str) -> str:
    return mod.split(".")[0]


def is_scenario(mod: str) -> bool:
    """A runnable scenario (``scenarios/_bootstrap.py``, its venv re-exec helper, is not one)."""
    return layer(mod) == "scenarios" and not mod.rsplit(".", 1)[-1].startswith("_")


def back_up_imports(t: Tree) -> list[str]:
    """Imports of a higher layer than the importer's."""
    return sorted(f"{t.paths[a]} ({layer(a)}) imports {b} ({layer(b)})"
                  for a, bs in t.edges.items() for b in bs
                  if layer(a) in RANK and layer(b) in RANK and RANK[layer(b)] > RANK[layer(a)])


#: dblp's packages, low -> high: a module may import its own package and the ones before it.
#: ``dblp`` itself (the C helper's loader) sits below all; the ``__main__`` modules above their package.
PACKAGES = ("dblp.protocol", "dblp.transport", "dblp.runs", "dblp.cli", "dblp.results", "dblp.train",
            "dblp.sim.network", "dblp.sim.engines", "dblp.sim", "dblp.sim.convergence", "dblp.sim.studies",
            "dblp.sim.cli", "dblp.sim.__main__", "dblp.__main__")
#: imports that reach up on purpose, each with its reason
UPWARD = {
    ("dblp.cli.args", "dblp.train"): "--workload's check loads the workload when it runs (PyTorch is optional)",
    ("dblp.cli.args", "dblp.train.data"): "--workload's check names a missing data set",
}


def package_rank(mod: str) -> int:
    """Index in :data:`PACKAGES` of the longest entry that is ``mod`` or a package above it; -1 for
    ``dblp`` and ``dblp._fastpath``."""
    best, rank = "", -1
    for i, pkg in enumerate(PACKAGES):
        if (mod == pkg or mod.startswith(pkg + ".")) and len(pkg) > len(best):
            best, rank = pkg, i
    return rank


def package_back_ups(t: Tree) -> list[str]:
    """Imports inside dblp of a later package in :data:`PACKAGES` than the importer's."""
    return sorted(f"{t.paths[a]} ({PACKAGES[package_rank(a)]}) imports {b} ({PACKAGES[package_rank(b)]})"
                  for a, bs in t.edges.items() if layer(a) == "dblp" for b in bs
                  if layer(b) == "dblp" and package_rank(b) > package_rank(a) and (a, b) not in UPWARD)


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {w for ws in edges.values() for w in ws}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return sorted(comps)


def circles(t: Tree) -> list[str]:
    return [" <-> ".join(c) for c in strongly_connected(t.edges)]


def scenario_imports(t: Tree) -> list[str]:
    """Scenarios importing other scenarios."""
    return sorted(f"{t.paths[a]} imports {t.paths[b]}" for a, bs in t.edges.items() for b in bs
                  if is_scenario(a) and is_scenario(b))


def test_imports_of_scenarios(t: Tree) -> list[str]:
    """Tests importing a scenario, or reaching one through the module search path or a loader by path."""
    bad = [f"{t.paths[a]} imports {t.paths[b]}" for a, bs in t.edges.items() for b in bs
           if layer(a) == "tests" and layer(b) == "scenarios"]
    bad += [f"{t.paths[a]} puts scenarios/ on the search path or loads a scenario by path" for a in t.reaches_scenarios]
    return sorted(bad)


test_imports_of_scenarios.__test__ = False  # a checker, not a pytest test


# -- the project -------------------------------------------------------------------------------------
_TREE: Tree | None = None


def project() -> Tree:
    global _TREE
    if _TREE is None:
        _TREE = Tree(read_tree())
    return _TREE


def test_every_layer_is_found_and_every_file_parses():
    t = project()
    assert {layer(m) for m in t.paths} == set(LAYERS)
    assert not t.unparsable, "\n" + "\n".join(t.unparsable)


@pytest.mark.parametrize("rule", [back_up_imports, package_back_ups, circles, scenario_imports,
                                  test_imports_of_scenarios],
                         ids=["no_import_runs_back_up", "dblp_packages_import_downward", "no_import_circle_between_files",
                              "no_scenario_imports_a_scenario", "no_test_imports_a_scenario"])
def test_the_project_keeps_the_rule(rule: Callable[[Tree], list[str]]) -> None:
    """Each rule of the layering over the whole tree: what breaks it, one line each."""
    bad = rule(project())
    assert not bad, "\n" + "\n".join(bad)


def test_every_dblp_module_is_in_a_package_of_the_order():
    """A new folder has to take its place in PACKAGES; only the C helper's loader is outside."""
    outside = sorted(m for m in project().paths if layer(m) == "dblp" and package_rank(m) < 0)
    assert outside == ["dblp"]
    stale = [pkg for pkg in PACKAGES if pkg not in project().paths]
    assert not stale, stale
    assert all(b in project().edges.get(a, ()) for a, b in UPWARD), "an UPWARD exception no longer happens"


def test_checker_catches_a_package_importing_up():
    t = Tree({"dblp/__init__.py": "", "dblp/protocol/__init__.py": "", "dblp/results/__init__.py": "",
              "dblp/results/tta.py": "",
              "dblp/protocol/session.py": "def f():\n    from dblp.results import tta\n"})
    assert package_back_ups(t) == ["dblp/protocol/session.py (dblp.protocol) imports dblp.results.tta (dblp.results)"]


# -- the checker catches what it should -----------------------------------------------------------
def test_checker_catches_a_back_up_import_at_any_depth():
    t = Tree({
        "traces/__init__.py": "",
        "traces/a.py": "def f():\n    from dblp.protocol.wire import MAGIC\n    return MAGIC\n",
        "dblp/__init__.py": "",
        "dblp/protocol/wire.py": "MAGIC = 1\n",
        "dblp/ok.py": "from traces import a\nimport traces.a\n",
        "emulation/__init__.py": "",
        "emulation/net.py": "",
        "dblp/up.py": "if True:\n    import emulation.net\n",
    })
    assert back_up_imports(t) == ["dblp/up.py (dblp) imports emulation.net (emulation)",
                                  "traces/a.py (traces) imports dblp.protocol.wire (dblp)"]


def test_checker_catches_circles_through_relative_and_function_imports():
    t = Tree({
        "dblp/__init__.py": "from . import a\n",
        "dblp/sim/__init__.py": "",
        "dblp/sim/a.py": "from .b import x\n",
        "dblp/sim/b.py": "def x():\n    from . import c\n",
        "dblp/sim/c.py": "from dblp.sim.a import x\n",
        "dblp/sim/d.py": "from .a import x\n",  # imports into the circle, not part of it
        "dblp/a.py": "",
    })
    assert circles(t) == ["dblp.sim.a <-> dblp.sim.b <-> dblp.sim.c"]
    assert strongly_connected({"x": ["y"], "y": ["x", "z"], "z": []}) == [["x", "y"]]


def test_checker_catches_scenarios_importing_scenarios_and_tests_reaching_them():
    t = Tree({
        "scenarios/_bootstrap.py": "",
        "scenarios/one.py": "import _bootstrap\ndef f():\n    import two\n",
        "scenarios/two.py": "import _bootstrap\nfrom dblp import x\n",
        "dblp/__init__.py": "",
        "dblp/x.py": "",
        "tests/test_a.py": "import sys\nsys." "path.insert(0, str(ROOT / 'scenarios'))\n",
        "tests/test_b.py": "import scenarios.two\n",
        "tests/test_c.py": "import importlib.util\nP = ROOT / 'scenarios' / 'two.py'\n"
                           "spec = importlib.util.spec_from_file_location('two', P)\n",
        "tests/test_d.py": "import subprocess, sys\n"
                           "subprocess.run([sys.executable, str(ROOT / 'scenarios' / 'two.py')])\n",
        "tests/helpers.py": "",
        "tests/test_e.py": "from helpers import thing\n",
    })
    assert scenario_imports(t) == ["scenarios/one.py imports scenarios/two.py"]
    assert test_imports_of_scenarios(t) == [
        "tests/test_a.py puts scenarios/ on the search path or loads a scenario by path",
        "tests/test_b.py imports scenarios/two.py",
        "tests/test_c.py puts scenarios/ on the search path or loads a scenario by path",
    ]
    assert t.edges["tests.test_e"] == {"tests.helpers"}


def test_checker_would_fail_the_project_on_a_back_up_import_or_circle():
    """The real tree plus one bad file: the checks above would go red."""
    src = read_tree()
    t = Tree({**src, "traces/_probe.py": "def f():\n    from dblp.protocol import wire\n"})
    assert "traces/_probe.py (traces) imports dblp.protocol.wire (dblp)" in back_up_imports(t)
    t = Tree({**src, "dblp/protocol/_probe.py": "from dblp.protocol import wire\n",
              "dblp/protocol/wire.py": src["dblp/protocol/wire.py"] + "\ndef _probe():\n    from . import _probe\n"})
    assert "dblp.protocol._probe <-> dblp.protocol.wire" in circles(t)
