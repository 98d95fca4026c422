"""The habits that keep the code readable, run by the README's test command (and so by .ci/run), with the settings
in pyproject.toml: ruff's lint over pipeline/, tasks/, models/, benchmarks/, tests/ and docs/examples/ (the worked
examples of docs/contributing.md); ruff's format over pipeline/, tasks/, models/ and docs/examples/; mypy over
pipeline/, tasks/, models/ and benchmarks/ (whose GPU paths no CPU test runs: the types are what checks them here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

CODE = ["pipeline", "tasks", "models"]
EXAMPLES = ["docs/examples"]  # written as the code they show how to add
LINTED = [*CODE, "benchmarks", "tests", *EXAMPLES]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", *LINTED], ["ruff", "format", "--check", *CODE, *EXAMPLES], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_the_code_is_clean(command):
    done = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-5000:]}{done.stderr[-2000:]}"
