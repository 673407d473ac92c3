#!/usr/bin/env python3
"""Print the project's import graph, read from the source (nothing is imported or run).

    python scripts/import_graph.py                      # packages, as a mermaid graph (docs/architecture.md)
    python scripts/import_graph.py --counts             # the same, each edge labelled with its count
    python scripts/import_graph.py --format text        # packages, one "a -> b (n imports)" line each
    python scripts/import_graph.py --modules dblp       # the modules of one package and their imports

A package is a folder with an ``__init__.py`` under traces/, dblp/, emulation/, topologies/ (e.g.
``dblp``, ``dblp.sim``, ``emulation.hosts``); ``scenarios`` counts as one. An edge ``a -> b`` says
that modules of ``a`` import modules of ``b`` (at module level or inside functions: any import
statement, relative ones resolved); ``n`` is how many module pairs do. Imports of the standard
library and third parties are left out. ``tests/test_layering.py`` holds the direction of these
edges; this script only draws them.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("traces", "dblp", "emulation", "topologies", "scenarios")


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


def package_of(mod: str, mods: dict[str, Path]) -> str:
    """The package a module belongs to: its own name for a package, else its folder's."""
    if mod.split(".")[0] == "scenarios":
        return "scenarios"
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


def package_edges(mods: dict[str, Path], g: dict[str, set[str]]) -> Counter:
    """(package a, package b) -> module pairs of a importing b (a != b)."""
    c: Counter = Counter()
    for a, bs in g.items():
        for b in bs:
            pa, pb = package_of(a, mods), package_of(b, mods)
            if pa != pb:
                c[(pa, pb)] += 1
    return c


def node_id(name: str) -> str:
    return name.replace(".", "_")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print the project's import graph (packages, or one package's modules).")
    ap.add_argument("--format", choices=["mermaid", "text"], default="mermaid", help="output form")
    ap.add_argument("--counts", action="store_true", help="label each package edge with its module pairs")
    ap.add_argument("--modules", metavar="PACKAGE", default=None,
                    help="the modules of one package (e.g. dblp, dblp.sim) and the imports among them")
    args = ap.parse_args(argv)
    mods = modules()
    g = graph(mods)
    if args.modules:
        inside = sorted(m for m in mods if package_of(m, mods) == args.modules)
        if not inside:
            ap.error(f"--modules: no package {args.modules!r}")
        edges = sorted((a, b) for a in inside for b in g[a] if b in inside)
        if args.format == "text":
            for a in inside:
                print(f"{a} -> {', '.join(sorted(b for b in g[a] if b in inside)) or '-'}")
        else:
            print("graph LR")
            for a, b in edges:
                print(f"  {node_id(a)}[{a}] --> {node_id(b)}[{b}]")
        return 0
    edges = package_edges(mods, g)
    if args.format == "text":
        for (a, b), n in sorted(edges.items()):
            print(f"{a} -> {b} ({n} imports)")
        return 0
    print("graph BT")
    for (a, b), n in sorted(edges.items()):
        label = f"|{n}| " if args.counts else " "
        print(f"  {node_id(a)}[{a}] -->{label}{node_id(b)}[{b}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
