"""The import graph of django_rtq: no cycles (not even of types), a broker that stands alone,
surfaces kept apart, and the registry below the workflows.

The graph is read from the source with `ast`: an edge for every import of a django_rtq module,
at module level or inside a function (a lazy import ties two modules together all the same),
and, in the typing graph only, under `if TYPE_CHECKING:` (which never runs, but a circle of
types hidden there is a circle all the same). `from .pkg import name` is an edge to `pkg.name`
when that is a module, else to `pkg`.

Only the imports written are edges, not the implicit import of a module's parent packages. So
a package `__init__` that re-exports its submodules (pkg -> pkg.sub) is in no cycle on its own;
it is in one only if the submodule leads back to the package (pkg.sub -> ... -> pkg), and that
is a real cycle: the submodule needs the package, which is still busy importing it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections import deque
from functools import cache
from pathlib import Path

PACKAGE = "django_rtq"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE
#: What the broker may import from outside itself.
BROKER_MAY_IMPORT = {"django_rtq.exceptions", "django_rtq.defaults"}
#: The ways in, for people and programs, and the modules each is made of. None imports another.
SURFACES = {
    "admin": ("django_rtq.admin", "django_rtq.admin_views"),
    # The metrics endpoint is an HTTP view guarded like the API, with its access classes.
    "api": ("django_rtq.api", "django_rtq.metrics"),
    "management": ("django_rtq.management",),
    "backends": ("django_rtq.backends",),
}

Graph = dict[str, set[str]]


def is_within(module: str, prefix: str) -> bool:
    """Whether `module` is `prefix` or one of its submodules."""
    return module == prefix or module.startswith(prefix + ".")


def find_modules() -> dict[str, Path]:
    """Map the dotted name of each module of the package (but its migrations) to its file."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


class ImportCollector(ast.NodeVisitor):
    """Collect the known modules that one module's imports name (see the module docstring)."""

    def __init__(self, module: str, is_package: bool, known: set[str], *, typing: bool = False) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.typing = typing  # whether imports under `if TYPE_CHECKING:` count too
        self.imported: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if is_type_checking(node.test) and not self.typing:
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.absolute(node)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            self.add(submodule if submodule in self.known else base)

    def absolute(self, node: ast.ImportFrom) -> str:
        """The absolute name of the module an `from ... import` statement imports from."""
        if not node.level:
            return node.module or ""
        parts = self.package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        return f"{base}.{node.module}" if node.module else base

    def add(self, module: str) -> None:
        if module in self.known:
            self.imported.add(module)


def is_type_checking(test: ast.expr) -> bool:
    """Whether an `if` tests `TYPE_CHECKING` (or `typing.TYPE_CHECKING`)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    source: str, module: str, is_package: bool, known: set[str], *, typing: bool = False
) -> set[str]:
    """The modules of `known` that the source of `module` imports (for type checking too, with
    `typing`)."""
    collector = ImportCollector(module, is_package, known, typing=typing)
    collector.visit(ast.parse(source))
    return collector.imported - {module}


@cache
def import_graph(*, typing: bool = False) -> Graph:
    """Map each module of the package to the modules of the package it imports (for type
    checking too, with `typing`)."""
    modules = find_modules()
    known = set(modules)
    return {
        module: imports_of(path.read_text(), module, path.name == "__init__.py", known, typing=typing)
        for module, path in modules.items()
    }


def reachable(graph: Graph, start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def cycles(graph: Graph) -> list[list[str]]:
    """The groups of modules that import one another, directly or not (each group sorted)."""
    reach = {module: reachable(graph, module) for module in graph}
    groups = {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }
    return sorted(sorted(group) for group in groups)


def shortest_loop(graph: Graph, start: str) -> list[str]:
    """One shortest chain of imports from `start` back to itself (start must be in a cycle)."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        for imported in sorted(graph[module]):
            if imported == start:
                loop = [start, module]
                while loop[-1] != start:
                    loop.append(came_from[loop[-1]])
                return loop[::-1]
            if imported not in came_from:
                came_from[imported] = module
                todo.append(imported)
    raise ValueError(f"{start} is in no cycle.")


def surface_of(module: str) -> str | None:
    """The surface `module` belongs to, if any."""
    for surface, prefixes in SURFACES.items():
        if any(is_within(module, prefix) for prefix in prefixes):
            return surface
    return None


def test_the_graph_reads_every_kind_of_import():
    known = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d", "p.sub.e", "p.typed"}
    source = """
from typing import TYPE_CHECKING
import os
from . import a
from .b import something
from .sub import d
if TYPE_CHECKING:
    from . import typed
else:
    from .sub import anything
def later():
    import p.c
    from .sub.e import name
"""
    assert imports_of(source, "p.x", False, known) == {"p.a", "p.b", "p.sub.d", "p.sub", "p.c", "p.sub.e"}
    assert imports_of(source, "p.x", False, known, typing=True) == {
        *imports_of(source, "p.x", False, known),
        "p.typed",
    }
    assert imports_of("from .. import VERSION\nfrom . import e", "p.sub", True, known) == {"p", "p.sub.e"}
    graph = import_graph()
    assert "django_rtq.api.views" in graph["django_rtq.api.urls"]  # `from . import views`
    assert "django_rtq.broker.keys" in graph["django_rtq.broker"]


def test_no_import_cycles():
    graph = import_graph()
    found = [
        f"{', '.join(group)} (e.g. {' -> '.join(shortest_loop(graph, group[0]))})" for group in cycles(graph)
    ]
    assert not found, "Modules in an import cycle with one another:\n" + "\n".join(found)


def test_no_cycle_hides_behind_imports_for_type_checking():
    graph = import_graph(typing=True)
    found = [
        f"{', '.join(group)} (e.g. {' -> '.join(shortest_loop(graph, group[0]))})" for group in cycles(graph)
    ]
    assert not found, "Modules in an import cycle, counting `if TYPE_CHECKING:`:\n" + "\n".join(found)


def test_the_registry_sits_below_the_workflows():
    """Workflows compose task types, so the registry and all it imports, even for type checking,
    know nothing of them: `task.s()` makes a step with no workflow module imported, and so with
    no hook that the workflows would set when imported."""
    reached = {"django_rtq.registry", *reachable(import_graph(typing=True), "django_rtq.registry")}
    assert not sorted(m for m in reached if is_within(m, "django_rtq.workflows"))
    done = subprocess.run(
        [sys.executable, "-c", STEPS_WITHOUT_WORKFLOWS],
        cwd=PACKAGE_DIR.parent,
        env={**os.environ, "PYTHONPATH": str(PACKAGE_DIR.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


STEPS_WITHOUT_WORKFLOWS = textwrap.dedent(
    """
    import sys
    from django.conf import settings

    settings.configure()
    from django_rtq.registry import Signature, task

    @task(name="steps.add")
    def add(a, b):
        return a + b

    step = add.s(1).using(queue="low")
    assert isinstance(step, Signature) and step.node()["queue"] == "low"
    assert add.si(2, 3).node()["immutable"]
    assert not [name for name in sys.modules if name.startswith("django_rtq.workflows")]
    print("ok")
    """
)


def test_the_broker_imports_only_itself_the_exceptions_and_the_defaults():
    outside = sorted(
        f"{module} imports {imported}"
        for module, imports in import_graph().items()
        if is_within(module, "django_rtq.broker")
        for imported in imports
        if not is_within(imported, "django_rtq.broker") and imported not in BROKER_MAY_IMPORT
    )
    assert not outside, "The broker imports from the rest of django_rtq:\n" + "\n".join(outside)


def test_the_surfaces_do_not_import_one_another():
    crossings = sorted(
        f"{module} ({surface_of(module)}) imports {imported} ({surface_of(imported)})"
        for module, imports in import_graph().items()
        for imported in imports
        if surface_of(module) and surface_of(imported) and surface_of(module) != surface_of(imported)
    )
    assert not crossings, "A surface imports another:\n" + "\n".join(crossings)
