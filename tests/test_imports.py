"""The package's import graph has no cycle: no module imports one that imports it back.

A subpackage counts as one unit with all its modules (``heatinv.train`` importing the doctor
while ``heatinv/doctor/__main__.py`` imports ``heatinv.train`` is a cycle).

Read from the source with ``ast`` (every ``import heatinv...`` and ``from heatinv... import``,
at the top or inside a function), so a cycle hidden behind a lazy import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "heatinv"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The heatinv modules ``path`` imports (``from heatinv.x import y`` counts ``heatinv.x.y`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("heatinv"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return found - {module_name(path)}


def unit(module: str) -> str:
    """``heatinv.doctor.checks`` -> ``heatinv.doctor``; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def graph() -> dict[str, set[str]]:
    """Which unit imports which (a subpackage with all its modules is one unit)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = {unit(target) for target in imports_of(path, modules)}
        edges.setdefault(unit(name), set()).update(targets - {unit(name), "heatinv"})
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_one_that_imports_it_back():
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def names_bound(init: Path) -> set[str]:
    """The names a package's ``__init__.py`` binds at its top level to something other than its own submodules."""
    bound, package = set(), module_name(init)
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module == package:
            continue  # `from heatinv.doctor import checks` binds the submodule itself
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return bound


def test_no_package_hides_a_module_behind_a_name_of_its_own():
    # `from heatinv.lrp.canonize import canonize` in heatinv/lrp/__init__.py made
    # `import heatinv.lrp.canonize as m` give the function, and the module unreachable by its name.
    clashes = []
    for init in PACKAGE.rglob("__init__.py"):
        submodules = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()}
        clashes += [f"{module_name(init)}.{name}" for name in sorted(names_bound(init) & (submodules - {"__init__"}))]
    assert not clashes, f"a package binds the name of its own submodule: {clashes}"
