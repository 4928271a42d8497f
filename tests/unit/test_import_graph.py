"""The import graph of the whole ``tidelog`` package has no cycles (type-only imports aside).

Built statically from the source of every module of every folder that pyproject.toml's
``[tool.tidelog.package-folders]`` maps into the package (tidelog/, model/, backends/,
adapters/, conformance/, bench/): every ``import`` and ``from ... import`` counts, at module
level or inside a function alike (a lazy import that closes a cycle is a cycle the first call
walks into), and so does ``__import__`` / ``importlib.import_module`` of names that literals in
the same scope spell, except under ``if TYPE_CHECKING:``, which never runs. An edge goes to the
most specific module an import names (``from a.b import c`` -> ``a.b.c`` when that is a module,
else ``a.b``); the implicit import of parent packages is not an edge (every module would then
be in a cycle with ``tidelog/__init__.py``).
"""

from __future__ import annotations

import ast
import itertools
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
with open(REPO / "pyproject.toml", "rb") as _f:
    ROOTS: dict[str, str] = tomllib.load(_f)["tool"]["tidelog"]["package-folders"]


def package_modules(roots: dict[str, str], repo: Path) -> dict[str, Path]:
    """Module name -> source file, for every module the folder map puts in the package (a
    folder without ``__init__.py`` is not a package, so its files are not modules of it)."""
    out: dict[str, Path] = {}
    for pkg, folder in roots.items():
        base = repo / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            dirs = [base.joinpath(*parts[:i]) for i in range(len(parts))]
            if not all((d / "__init__.py").is_file() for d in dirs):
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_DYNAMIC = {"__import__", "import_module"}  # also as importlib.import_module


def _strings(node: ast.expr, bound: dict[str, list[ast.expr]]) -> list[str]:
    """The module names an expression can evaluate to, as far as literals tell: a string, a
    conditional of them, or a name assigned or looped over such literals in the same scope."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _strings(node.body, bound) + _strings(node.orelse, bound)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e, bound)]
    if isinstance(node, ast.Name):
        return [s for value in bound.get(node.id, []) for s in _strings(value, {})]
    return []


def _imports(tree: ast.AST) -> Iterator[tuple[int, list[str], int]]:
    """(line, absolute-or-relative names, relative level) of every import that can run:
    statements anywhere in the tree, and ``__import__`` / ``importlib.import_module`` calls
    whose argument literals name, except under ``if TYPE_CHECKING:`` (its ``else:`` runs)."""
    scopes: list[tuple[ast.AST, dict[str, list[ast.expr]]]] = [(tree, {})]
    while scopes:
        scope, bound = scopes.pop()
        body = list(ast.iter_child_nodes(scope))
        calls: list[ast.Call] = []
        while body:
            node = body.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                scopes.append((node, {}))
                continue
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                body.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                yield node.lineno, [a.name for a in node.names], 0
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [f"{base}.{a.name}" if base else a.name for a in node.names]
                yield node.lineno, names, node.level
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                bound.setdefault(node.target.id, []).append(node.iter)
            elif isinstance(node, ast.Call) and node.args:
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in _DYNAMIC:
                    calls.append(node)
            body.extend(ast.iter_child_nodes(node))
        for call in calls:  # after the scope's assignments are all known
            yield call.lineno, _strings(call.args[0], bound), 0


def _closest(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the innermost package module containing it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, package modules only."""
    graph: dict[str, dict[str, int]] = {}
    for mod, path in modules.items():
        edges: dict[str, int] = {}
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for line, names, level in _imports(ast.parse(path.read_text(), str(path))):
            if level:
                parts = package.split(".")
                up = ".".join(parts[: len(parts) - level + 1])
                names = [f"{up}.{n}" for n in names]
            for name in names:
                to = _closest(name, modules)
                if to is not None and to != mod:
                    edges[to] = min(line, edges.get(to, line))
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (first module repeated at its end) per strongly connected component of more
    than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: dict[str, dict[str, int]], members: set[str]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected component."""
    start = min(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    return [*paths[node], start]
                if child in members and child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    steps = [
        f"{a} ({modules[a].relative_to(REPO)}:{graph[a][b]}) imports {b}"
        for a, b in itertools.pairwise(cycle)
    ]
    return "\n  ".join(steps)


def test_the_map_covers_every_layer_folder() -> None:
    """The graph is over the whole package: each folder of the map holds modules of it."""
    modules = package_modules(ROOTS, REPO)
    assert set(ROOTS.values()) >= {
        "tidelog", "model", "backends", "adapters", "conformance", "bench"
    }  # fmt: skip
    for pkg in ROOTS:
        assert pkg in modules, f"{pkg}: no __init__.py in {ROOTS[pkg]}/"
        assert any(m.startswith(pkg + ".") for m in modules), f"{pkg} holds no module"


def test_the_import_graph_has_no_cycles() -> None:
    modules = package_modules(ROOTS, REPO)
    graph = import_graph(modules)
    found = cycles(graph)
    assert not found, "import cycles (type-only imports under TYPE_CHECKING aside):\n" + "\n".join(
        f"- {' -> '.join(c)}\n  {_describe(c, graph, modules)}" for c in found
    )


def test_the_checker_sees_lazy_imports_and_skips_type_only_ones(tmp_path: Path) -> None:
    """The checker itself: a cycle closed by an import inside a function is found; one closed
    only under ``if TYPE_CHECKING:`` is not; relative imports resolve to modules."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from pkg.b import f\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nimport pkg.c\nif TYPE_CHECKING:\n    from .e import y\n"
    )
    (pkg / "e.py").write_text("from .d import z\n")
    (pkg / "f.py").write_text(
        "def load():\n    for m in ('pkg.g', 'json'):\n        __import__(m)\n"
    )
    (pkg / "g.py").write_text("import importlib\nimportlib.import_module('pkg.f')\n")
    modules = package_modules({"pkg": "pkg"}, tmp_path)
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.b": 1}
    assert graph["pkg.d"] == {"pkg.c": 2}  # .e is only for type checkers
    assert graph["pkg.f"] == {"pkg.g": 3}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.f", "pkg.g", "pkg.f"]]
