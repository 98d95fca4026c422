"""Runs a module as ``python -m`` would, with some packages made impossible to import: what the GPU proof kit meets
on a machine whose image lacks them (``ops/gpu-proof``).

    python -m tests.helpers.without ray,mlflow,dvc -m pipeline.forecast --profile tiny ...
"""

from __future__ import annotations

import importlib.abc
import runpy
import subprocess
import sys

from tests.helpers import ROOT

LENT_LACKS = "ray,mlflow,dvc"  # what the lent GPU machine's image has not


class Blocked(importlib.abc.MetaPathFinder):
    """Refuses ``packages`` and everything under them, as an absent package is refused."""

    def __init__(self, packages: set[str]):
        self.packages = packages

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.packages:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by tests.helpers.without)", name=name)
        return None


def run_without(
    module: str, *args: str, blocked: str = LENT_LACKS, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m module args`` in this checkout, the ``blocked`` packages (comma-separated; by default those the lent
    GPU machine lacks) refused as an absent package is refused."""
    return subprocess.run([sys.executable, "-m", "tests.helpers.without", blocked, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit("usage: python -m tests.helpers.without PKG[,PKG...] -m MODULE [ARGS...]")
    blocked = {p for p in argv[0].split(",") if p}
    loaded = sorted(p for p in blocked if p in sys.modules)
    if loaded:  # already imported by this interpreter's start-up: blocking now would prove nothing
        raise SystemExit(f"tests.helpers.without: {', '.join(loaded)} imported before the block")
    sys.meta_path.insert(0, Blocked(blocked))
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
