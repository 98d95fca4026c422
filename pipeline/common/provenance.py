"""Where a result came from: the git commit (and whether the tree was dirty), the code a stage runs, and the versions
of the libraries training runs on.

``code_files`` is what DVC's ``deps`` and the sweep's reuse key (``run_key``) must cover: the project modules a
stage's entry point can import, followed statically through every ``import`` statement (top-level or inside a
function) from the entry module down to ``tasks`` and ``models``. ``tests.test_layout`` checks dvc.yaml
against it, and against what a real import loads. ``library_versions`` is what the reuse key hashes besides the
code: a library bump retrains.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "tasks", "models")  # the project's own code; everything else is a pinned dependency
# the libraries a trial computes with (its kernels, its training loop, its workers); the others only move data and
# records (pyarrow reads files whose bytes the data hash covers, MLflow records): a bump of these retrains
TRAINING_LIBRARIES = ("torch", "lightning", "ray", "numpy", "numba", "triton")


@dataclass(frozen=True)
class Commit:
    """The checkout's commit, and whether tracked files differ from it (a result of uncommitted code)."""

    sha: str
    dirty: bool

    def __str__(self) -> str:
        return self.sha[:12] + ("-dirty" if self.dirty else "")


def git_commit(repo: Path = ROOT) -> Commit:
    """The commit ``CAPACITY_ATLAS_COMMIT`` names (``ops/gpu-proof run`` sets it: the lent machine's copy of the tree
    may hold a .git of another commit), else that of ``repo``, dirty when tracked files were changed, else "unknown"."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    if os.environ.get("CAPACITY_ATLAS_COMMIT"):
        recorded, _, dirty = os.environ["CAPACITY_ATLAS_COMMIT"].partition("+")
        return Commit(recorded, dirty == "dirty")
    sha = git("rev-parse", "HEAD")
    return Commit(sha or "unknown", bool(sha) and bool(git("status", "--porcelain", "--untracked-files=no")))


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file of a project module or package (``pipeline.search.cells``), or None if it is not the project's."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_names(path: Path, module: str) -> set[str]:
    """Every module an ``import`` in ``path`` may load (relative imports resolved against ``module``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in walk_run_time(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def walk_run_time(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never runs."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for orelse in node.orelse for n in [orelse, *walk_run_time(orelse)])
            continue
        yield node
        yield from walk_run_time(node)


@cache
def code_files(*entries: str, root: Path = ROOT) -> tuple[Path, ...]:
    """The project files that importing ``entries`` (module names) can execute, parent packages included."""
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_file(name, root)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # importing a.b.c runs a and a.b first
        todo.extend(imported_names(path, name))
    return tuple(sorted(set(seen.values())))


def code_hash(*entries: str, root: Path = ROOT) -> str:
    """A digest of the code ``entries`` run: their file names and bytes."""
    h = hashlib.sha256()
    for path in code_files(*entries, root=root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def library_versions(names: tuple[str, ...] = TRAINING_LIBRARIES) -> dict[str, str]:
    """The installed version of each library ``names`` (distributions, as ``importlib.metadata`` finds them first on
    ``sys.path``; "not installed" where absent) and Python's major.minor. Installed, not requirements.lock's: the
    venv may hold another build (torch's ``+cpu``) or a library installed by hand."""
    versions = {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
