"""The tests' layout: shared helpers live in tests/helpers/, shared fixtures in tests/conftest.py, and no test module
(nor conftest, nor a helper) imports from a test module, and no test module from conftest."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth (a function's own imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            if node.module == "tests":  # `from tests import test_x` / `from tests import conftest`
                found += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
    return found


def test_no_test_module_imports_from_another_test_module_or_conftest():
    modules = sorted(TESTS.glob("test_*.py"))
    assert modules
    others = [TESTS / "conftest.py", *sorted((TESTS / "helpers").rglob("*.py"))]
    offending = [f"{path.relative_to(TESTS)}:{line}: {name}" for path in modules + others
                 for line, name in imported_modules(path)
                 if name in ("tests.conftest", "conftest") or name.split(".")[-1].startswith("test_")]
    assert not offending, "import shared helpers from tests.helpers instead:\n" + "\n".join(offending)
