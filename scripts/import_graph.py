#!/usr/bin/env python3
"""Print the project's import graph, read from the source (nothing is imported or run).

    python scripts/import_graph.py                      # packages, as a mermaid graph (docs/architecture.md)
    python scripts/import_graph.py --counts             # the same, each edge labelled with its count
    python scripts/import_graph.py --format text        # packages, one "a -> b (n imports)" line each
    python scripts/import_graph.py --modules dblp.sim   # the modules at or under a package, and their imports

A package is a folder with an ``__init__.py`` under traces/, dblp/, emulation/, topologies/ (e.g.
``dblp.protocol``, ``dblp.sim.engines``, ``emulation.hosts``); ``scenarios`` counts as one. Inside
``dblp`` the packages are the units of ``tests/test_layering.py``'s ``PACKAGES`` (read from that file,
the one home of their order), so an entry point such as ``dblp.sim.cli`` or ``dblp.__main__`` is a
node of its own, above the package it sits in; ``dblp`` itself is the C helper's loader. An edge
``a -> b`` says that modules of ``a`` import modules of ``b`` (at module level or inside functions:
any import statement, relative ones resolved); ``n`` is how many module pairs do. Imports of the
standard library and third parties are left out. ``tests/test_layering.py`` holds the direction of
these edges; this script only draws them, dblp's packages in their order, inside a box per folder.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("traces", "dblp", "emulation", "topologies", "scenarios")
#: the file whose ``PACKAGES`` tuple orders dblp's packages, low -> high
LAYERING = ROOT / "tests" / "test_layering.py"


def dblp_packages(path: Path = LAYERING) -> tuple[str, ...]:
    """``PACKAGES`` of the layering test, read with :mod:`ast` (the test is not imported)."""
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PACKAGES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise SystemExit(f"import_graph: {path} has no PACKAGES tuple (dblp's package order)")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the project's folders."""
    out: dict[str, Path] = {}
    for top in TOPS:
        for p in sorted((root / top).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def package_of(mod: str, mods: dict[str, Path], order: tuple[str, ...] = ()) -> str:
    """The package a module belongs to: inside dblp the longest entry of ``order`` that is the module
    or a package above it (``dblp`` when none is); elsewhere its own name for a package, else its folder's."""
    if mod.split(".")[0] == "scenarios":
        return "scenarios"
    if mod.split(".")[0] == "dblp" and order:
        inside = [pkg for pkg in order if mod == pkg or mod.startswith(pkg + ".")]
        return max(inside, key=len) if inside else "dblp"
    if mods[mod].name == "__init__.py":
        return mod
    return mod.rsplit(".", 1)[0] if "." in mod else mod


def imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules ``mod`` imports (the longest dotted prefix that is a module of the tree)."""
    is_pkg = path.name == "__init__.py"
    here = mod.split(".") if is_pkg else mod.split(".")[:-1]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                base = ".".join(up + ([node.module] if node.module else []))
            names += [f"{base}.{a.name}" if base else a.name for a in node.names]
    found: set[str] = set()
    for name in names:
        if mod.startswith("scenarios.") and name.split(".")[0] not in TOPS:
            name = "scenarios." + name  # a scenario's bare import of a file beside it
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            cand = ".".join(parts[:i])
            if cand in mods:
                if cand != mod:
                    found.add(cand)
                break
    return found


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {m: imports(m, p, mods) for m, p in mods.items()}


def package_edges(mods: dict[str, Path], g: dict[str, set[str]], order: tuple[str, ...] = ()) -> Counter:
    """(package a, package b) -> module pairs of a importing b (a != b)."""
    c: Counter = Counter()
    for a, bs in g.items():
        for b in bs:
            pa, pb = package_of(a, mods, order), package_of(b, mods, order)
            if pa != pb:
                c[(pa, pb)] += 1
    return c


def node_id(name: str) -> str:
    return name.replace(".", "_")


def _node(name: str) -> str:
    return f"{node_id(name)}[{name}]"


def mermaid_packages(edges: Counter, order: tuple[str, ...], counts: bool = False) -> list[str]:
    """The package graph as mermaid lines: dblp's packages in a box (dblp.sim's in a box inside it),
    each box listing its nodes in ``order``, then every edge."""
    nodes = sorted({n for e in edges for n in e})
    rank = {pkg: i for i, pkg in enumerate(("dblp", *order))}
    dblp_nodes = sorted((n for n in nodes if n in rank), key=rank.__getitem__)
    sim = [n for n in dblp_nodes if n == "dblp.sim" or n.startswith("dblp.sim.")]
    lines = ["graph BT", "  subgraph dblp_box [dblp]"]
    lines += [f"    {_node(n)}" for n in dblp_nodes if n not in sim]
    lines += ["    subgraph dblp_sim_box [dblp.sim]"] + [f"      {_node(n)}" for n in sim] + ["    end", "  end"]
    lines += [f"  {_node(n)}" for n in nodes if n not in rank]
    for (a, b), n in sorted(edges.items()):
        label = f"|{n}| " if counts else " "
        lines.append(f"  {node_id(a)} -->{label}{node_id(b)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print the project's import graph (packages, or the modules under one).")
    ap.add_argument("--format", choices=["mermaid", "text"], default="mermaid", help="output form")
    ap.add_argument("--counts", action="store_true", help="label each package edge with its module pairs")
    ap.add_argument("--modules", metavar="PACKAGE", default=None,
                    help="the modules of a package and of the packages under it (e.g. dblp.protocol, dblp.sim, "
                         "dblp: all of it) and the imports among them")
    args = ap.parse_args(argv)
    mods = modules()
    order = dblp_packages()
    g = graph(mods)
    if args.modules:
        top = args.modules
        inside = sorted(m for m in mods if (pkg := package_of(m, mods, order)) == top or pkg.startswith(top + "."))
        if not inside:
            ap.error(f"--modules: no package {top!r}")
        edges = sorted((a, b) for a in inside for b in g[a] if b in inside)
        if args.format == "text":
            for a in inside:
                print(f"{a} -> {', '.join(sorted(b for b in g[a] if b in inside)) or '-'}")
        else:
            print("graph LR")
            for a, b in edges:
                print(f"  {_node(a)} --> {_node(b)}")
        return 0
    edges = package_edges(mods, g, order)
    if args.format == "text":
        for (a, b), n in sorted(edges.items()):
            print(f"{a} -> {b} ({n} imports)")
        return 0
    print("\n".join(mermaid_packages(edges, order, args.counts)))
    return 0

if __name__ == "__main__":
    sys.exit(main())
