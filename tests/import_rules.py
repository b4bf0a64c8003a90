"""Static analysis of the product's imports: which way the layers point, and what is declared.

Read by tests/test_packaging.py. Nothing here imports the modules it checks: a module that
would fail to import on a fresh install is exactly what these checks must catch.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

PRODUCT = ("gateway", "router_policies", "replica")
"""The packages of the base install (what the production image holds)."""
OWN = frozenset((*PRODUCT, "bench"))
TOOLING = frozenset({"bench", "demo"})

FORBIDDEN: Mapping[str, frozenset[str]] = {
    # Pure decisions: nothing of the project but themselves.
    "router_policies": frozenset({"gateway", "replica"}) | TOOLING,
    "replica": frozenset({"gateway"}) | TOOLING,
    "gateway": TOOLING,
}
"""Per package, the top-level names none of its modules may import, lazily or not."""


@dataclass(frozen=True, slots=True)
class Import:
    module: str
    """The absolute dotted name imported (relative imports resolved)."""
    path: Path
    line: int
    module_level: bool
    """Runs when the module is imported: not inside a function, not under TYPE_CHECKING."""

    @property
    def top(self) -> str:
        return self.module.partition(".")[0]

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _package_of(path: Path, root: Path) -> list[str]:
    # a/b/m.py and a/b/__init__.py both sit in package a.b: relative imports start there.
    return list(path.relative_to(root).parts[:-1])


class _Collector(ast.NodeVisitor):
    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self.package = _package_of(path, root)
        self.found: list[Import] = []
        self._depth = 0
        """Function bodies (and TYPE_CHECKING blocks) entered: their imports run later or never."""

    def _add(self, module: str, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        self.found.append(Import(module, self.path, line, self._depth == 0))

    def _deferred(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _deferred
    visit_AsyncFunctionDef = _deferred
    visit_Lambda = _deferred

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._depth += 1
        for child in node.body:
            self.visit(child)
        self._depth -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.package[: len(self.package) - node.level + 1] if node.level else []
        if node.module:
            self._add(".".join([*base, node.module]), node)
            return
        # `from .. import x`: each name is a module (or a name of the package itself).
        for alias in node.names:
            self._add(".".join([*base, alias.name]), node)

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("bench.x") and __import__("bench") name a module as a string.
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in {"import_module", "__import__"} and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, node)
        self.generic_visit(node)


def imports_of(path: Path, root: Path) -> list[Import]:
    collector = _Collector(path, root)
    collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return collector.found


def all_imports(root: Path, packages: tuple[str, ...] = PRODUCT) -> Iterator[Import]:
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            yield from imports_of(path, root)


def direction_violations(root: Path) -> list[str]:
    """Every import, anywhere in a file, that points the wrong way between the layers."""
    problems = []
    for package, forbidden in FORBIDDEN.items():
        for found in all_imports(root, (package,)):
            if found.top in forbidden:
                problems.append(f"{found.where(root)}: {package} imports {found.module}")
    return problems


def normalise(name: str) -> str:
    """PEP 503: distribution names compare case-insensitively, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def base_dependencies(pyproject: Path) -> frozenset[str]:
    """The normalised distribution names of [project] dependencies (extras not included)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project.get("dependencies", []):
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        assert match, f"unreadable requirement {requirement!r} in {pyproject}"
        names.add(normalise(match.group(1)))
    return frozenset(names)


def undeclared_imports(
    root: Path,
    declared: frozenset[str],
    providers: Mapping[str, list[str]] | None = None,
) -> list[str]:
    """Module-level imports of the product that neither the stdlib, the project itself nor a
    declared base dependency provides: a fresh `pip install .` would fail on them."""
    if providers is None:
        providers = packages_distributions()
    problems = []
    for found in all_imports(root):
        top = found.top
        if not found.module_level or top in sys.stdlib_module_names or top in OWN:
            continue
        dists = {normalise(d) for d in providers.get(top, [])}
        if not dists & declared:
            origin = ", ".join(sorted(dists)) or "no installed distribution"
            problems.append(
                f"{found.where(root)}: imports {found.module} (from {origin}), "
                "which pyproject.toml's base dependencies do not declare"
            )
    return problems


def module_graph(root: Path, packages: tuple[str, ...] = PRODUCT) -> dict[str, set[str]]:
    """Each product module's imports of other product modules, wherever they sit (module
    level, TYPE_CHECKING blocks, functions); `from pkg import name` counts as an import of
    pkg.name when that is a module."""
    paths: dict[str, Path] = {}
    for top in packages:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = _package_of(path, root)
        edges: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, node.module] if node.module else base)
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    edges.add(sub if sub in paths else known(module))
        graph[name] = {e for e in edges if e is not None and e != name}
    return graph


def import_circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The modules that reach each other through imports, group by group (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles
