"""The tests' layout: shared helpers live in tests/helpers/, shared fixtures in tests/conftest.py, and no test module
(nor conftest, nor a helper) imports from a test module, and no test module from conftest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


def collected(*selections: tuple[str, ...]) -> list[set[str]]:
    """The test ids ``pytest --collect-only`` selects from UNMARKED with each selection's arguments. The collections
    run at once: each imports what the suite imports, about 8 s of one core."""
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                               *UNMARKED], cwd=TESTS.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in selections]
    found = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, 5), out[-3000:] + err[-3000:]  # 5: none selected
        found.append({line for line in out.splitlines() if "::" in line})
    return found


@pytest.mark.slow  # over 10 s on 2 cores (two collections): the fast tier stays a developer's loop
def test_integration_and_cluster_tests_are_slow_so_the_fast_tier_runs_none(request):
    """`integration` and `cluster` imply `slow` (tests/conftest.py): every such test of this run is slow, and `-m "not
    slow"` selects none of them from files that do not mark them slow themselves."""
    heavy = [item for item in request.session.items
             if item.get_closest_marker("integration") or item.get_closest_marker("cluster")]
    assert all(item.get_closest_marker("slow") for item in heavy), [i.nodeid for i in heavy]
    marked, fast = collected(("-m", "integration or cluster"), ("-m", "not slow"))
    assert marked and {f.split("::")[0] for f in marked} == set(UNMARKED)
    assert fast and not marked & fast


def test_the_slow_tiers_order_has_a_figure_for_each_module_with_slow_tests_and_no_other():
    """tests/durations.json orders the slow tier, longest module first (tests/conftest.py): a module it lacks would
    start last whatever its length. A new module of slow tests: `pytest -n 2 -m slow --store-durations`."""
    import json
    import re

    marked = {f"tests/{path.name}" for path in TESTS.glob("test_*.py")
              if re.search(r"mark\.(slow|integration|cluster)\b", path.read_text())}
    recorded = json.loads((TESTS / "durations.json").read_text())
    assert set(recorded) == marked and all(seconds > 0 for seconds in recorded.values())
