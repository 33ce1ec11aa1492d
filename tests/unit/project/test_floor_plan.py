"""The rooms stay small and their doors point one way: packages only at the top, at most 15 modules a folder, no
import circle among the modules or rooms of any package, no function over 80 lines, no module over 600, and a first
docstring line for every package (the generated module map is made of them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "recipekit"
#: A folder holds at most this many modules (``__init__`` not counted): more, and it wants inner rooms.
MAX_MODULES = 15
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
#: Functions still over the limit, each with why (kept short: a new entry needs a reason a reviewer accepts).
LONG_FUNCTIONS: dict[str, str] = {}
#: Modules still over the limit, each with why (the same rule).
LONG_MODULES: set[str] = set()


def folders() -> Iterator[Path]:
    yield PACKAGE
    yield from (p for p in sorted(PACKAGE.rglob("*")) if p.is_dir() and p.name != "__pycache__" and "." not in p.name)


def modules() -> Iterator[Path]:
    yield from (p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts)


def test_the_top_holds_packages_only() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules at the top of src/recipekit, each belongs in a package: {loose}"


@pytest.mark.parametrize("folder", list(folders()), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_folder_holds_more_than_15_modules(folder: Path) -> None:
    count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
    assert count <= MAX_MODULES, f"{folder} holds {count} modules (at most {MAX_MODULES}): give it inner rooms"


@pytest.mark.parametrize("folder", [f for f in folders() if f != PACKAGE], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_package_says_what_it_holds(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder} is not a package (no __init__.py)"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and doc.splitlines()[0].strip(), f"{init}: no first docstring line saying what the package holds"


def test_no_module_over_600_lines() -> None:
    long = {
        name: n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
        and (name := str(p.relative_to(PACKAGE))) not in LONG_MODULES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                name = f"{path.relative_to(PACKAGE)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS:
                    long[name] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_circle_inside_any_package() -> None:
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    graph = grimp.build_graph("recipekit")
    circles = []
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        children = sorted(graph.find_children(package))
        edges = {child: set() for child in children}
        for child in children:
            for module in {child, *graph.find_descendants(child)}:
                for imported in graph.find_modules_directly_imported_by(module):
                    for other in children:
                        if other != child and (imported == other or imported.startswith(other + ".")):
                            edges[child].add(other)
        circles += [f"{package}: {' -> '.join(c)}" for c in _circles(edges)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected part of more than one node (depth-first search, iterative)."""
    found, state = [], dict.fromkeys(edges, 0)  # 0 new, 1 on the path, 2 done
    for start in edges:
        if state[start]:
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
            elif state[step] == 1:
                found.append([*path[path.index(step) :], step])
            elif state[step] == 0:
                state[step] = 1
                path.append(step)
                stack.append(iter(sorted(edges[step])))
    return found


def test_a_circle_is_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
