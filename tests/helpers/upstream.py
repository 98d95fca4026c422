"""A bare "upstream" git repository of a checkout and fresh clones of it, as an operator's or a teammate's:
`upstream_and_clone`, `push_change` (a commit pushed upstream), `copy_kernels` (the numba kernels a clone reuses),
`git`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

VENV = Path(sys.executable).parent.parent  # this venv: a clone's .venv links to it
IDENTITY = ["-c", "user.name=t", "-c", "user.email=t@t"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def upstream_and_clone(src: Path, tmp: Path, venv: bool = True) -> tuple[Path, Path]:
    """A bare "upstream" of the git repository ``src``, and a fresh clone of it whose .venv is this venv."""
    upstream, clone = tmp / "upstream.git", tmp / "checkout"
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(upstream)], check=True)
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    if venv:
        (clone / ".venv").symlink_to(VENV)
    return upstream, clone


def push_change(upstream: Path, tmp: Path, changes: dict[str, str]) -> str:
    """Commits and pushes to ``upstream`` a change to each file (new text) from a clone of it; the new head."""
    work = tmp / "upstream-work"
    if not work.exists():
        subprocess.run(["git", "clone", "-q", str(upstream), str(work)], check=True)
    git(work, "pull", "-q")
    for name, text in changes.items():
        (work / name).write_text(text)
        git(work, "commit", "-qam", f"upstream changes {name}")
    git(work, "push", "-q")
    return git(work, "rev-parse", "HEAD")


def copy_kernels(src: Path, clone: Path) -> None:
    """The numba kernels ``copy_repo`` gave ``src`` into a git clone of it, with its sources' times (numba's index
    checks them): not compiled again in each stage."""
    kernels = list(src.glob("*/__pycache__/*.nb[ic]"))
    for cache in kernels:
        (clone / cache.parent.relative_to(src)).mkdir(exist_ok=True)
        shutil.copy2(cache, clone / cache.relative_to(src))
    for package in {cache.parent.parent for cache in kernels}:
        for source in package.glob("*.py"):
            shutil.copystat(source, clone / source.relative_to(src))
