"""The tests' layout: shared helpers live in tests/helpers/, shared fixtures in tests/conftest.py, and no test module
(nor conftest, nor a helper) imports from a test module, and no test module from conftest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# files whose integration or cluster tests carry no `slow` mark of their own: the implication must add it
UNMARKED = ["tests/test_halving.py", "tests/test_memory.py", "tests/test_train.py", "tests/test_jobs.py"]


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


def collected(*args: str) -> set[str]:
    """The test ids ``pytest --collect-only`` selects from UNMARKED with ``args``."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                           *UNMARKED], cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]  # 5: none selected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_integration_and_cluster_tests_are_slow_so_the_fast_tier_runs_none(request):
    """`integration` and `cluster` imply `slow` (tests/conftest.py): every such test of this run is slow, and `-m "not
    slow"` selects none of them from files that do not mark them slow themselves."""
    heavy = [item for item in request.session.items
             if item.get_closest_marker("integration") or item.get_closest_marker("cluster")]
    assert all(item.get_closest_marker("slow") for item in heavy), [i.nodeid for i in heavy]
    marked = collected("-m", "integration or cluster")
    assert marked and {f.split("::")[0] for f in marked} == set(UNMARKED)
    assert collected("-m", "not slow") and not marked & collected("-m", "not slow")
