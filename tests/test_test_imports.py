"""The tests' own imports: no test module imports another (nor a conftest); what tests share
lives in tests/support/.

Read from the source with `ast`, like tests/test_import_graph.py: every import, at module level
or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a file under `root`'s parent (tests/test_x.py -> tests.test_x)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_module(name: str) -> bool:
    """Whether a dotted name is a test module (test_*.py) or a conftest."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module `path` imports (for `from x import y`, both x and x.y: y may be a module)."""
    package = (
        module_name(path, root).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path, root)
    )
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def imports_of_test_modules(root: Path = TESTS_DIR) -> list[str]:
    """Each `importer imports imported` where imported is a test module or a conftest."""
    return sorted(
        f"{path.relative_to(root.parent)} imports {imported}"
        for path in root.rglob("*.py")
        for imported in imported_modules(path, root)
        if imported.startswith(root.name + ".") and is_test_module(imported)
    )


def test_no_test_module_imports_another():
    found = imports_of_test_modules()
    assert not found, (
        "Test modules imported by other modules (move what they share to tests/support/):\n"
        + "\n".join(found)
    )
