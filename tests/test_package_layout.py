"""The package's shape: the library imports no course or benchmark code, no module imports another module's
private names, and no import cycle exists anywhere in ``mta`` (imports inside functions included)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mta"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def imports_of(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """``(imported module, names)`` for every import in the file, at any depth: names are those taken with
    ``from m import a, b`` (empty for ``import m``)."""
    module, is_package = module_name(path), path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = resolve(module, is_package, node.level, node.module) if node.level else node.module
            found.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
    return found


def package_graph() -> dict[str, set[str]]:
    """Module -> the ``mta`` modules it imports (``from mta import x`` counts as importing ``mta.x`` where ``x``
    is a module)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target, names in imports_of(path):
            if not target or not target.startswith("mta"):
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges.update(subs or ([target] if target in modules else []))
        graph[name] = edges - {name}
    return graph


def test_no_import_cycle():
    graph = package_graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt == "mta" or nxt.endswith(".__init__"):
                continue  # the package's own __init__ re-exports; it is not a step of the library's layering
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_no_private_names_across_modules():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for target, names in imports_of(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if target and target.startswith("mta") and private:
                offenders.append(f"{path.relative_to(ROOT)}: from {target} import {', '.join(private)}")
    assert not offenders, "\n".join(offenders)


def test_the_library_imports_no_course_or_benchmark_code():
    graph = package_graph()
    library = [m for m in graph if not m.startswith(("mta.course", "mta.bench"))]
    for module in library:
        wrong = sorted(m for m in graph[module] if m.startswith(("mta.course", "mta.bench")))
        assert not wrong, f"{module} imports {wrong}"


def test_import_mta_loads_no_plotting_benchmark_or_course_module():
    code = ("import sys, mta; bad = sorted(m for m in sys.modules if m.startswith(('mta.course', 'mta.bench', "
            "'matplotlib'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
