"""Locks held with flock, which the kernel drops when the holder dies, however it dies.

``owned``: one process at a time does a job (a sweep per results directory, a nightly run per history, the sweep
training against a project's stores); a second one stops at once with a ``LockBusy`` that names the holder, or
waits.

Directories owned by a live process: each has a lock file beside it (``<dir>.lock``) that its owner holds with
flock. The kernel drops the lock when the owner dies, however it dies, so a directory whose lock nobody holds is
a dead run's leftovers (after a SIGKILL no clean-up code runs) and the next run can remove it.

Used by the generate stage (``data/.staging/<task>/``) and by every trial for its checkpoints' scratch space
(``scratch_dir``).

The locks that runs in progress hold in a checkout (``CHECKOUT_LOCKS``), which ``ops/nightly`` waits for before it
changes the checkout, as the standard library alone reads them (so that the script needs nothing else):

    python -m pipeline.common.locks           # each lock file, one a line, from the checkout's root
    python -m pipeline.common.locks --held    # those that a live process holds now
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

NIGHTLY_LOCK = ".lock"  # in the nights' directory (``nightly.history``): one nightly run at a time records there
SWEEP_LOCK = ".sweep.lock"  # in a results directory: one sweep at a time writes it
STORES_LOCK = ".dvc/tmp/capacity-atlas-sweep.lock"  # in a project: the sweep training against its stores
DVC_LOCK = ".dvc/tmp/lock"  # DVC 3's repo lock: zc.lockfile flocks it (a hardlink lock with core.hardlink_lock)
# from a checkout's root, the nights' and the results' directories where they are by default
CHECKOUT_LOCKS = (f"nightly/{NIGHTLY_LOCK}", DVC_LOCK, f"results/{SWEEP_LOCK}", STORES_LOCK)


class LockBusy(RuntimeError):
    """Another live process holds the lock; the message names it and what to do."""


@overload
def try_lock(path: Path, wait: Literal[True]) -> int: ...
@overload
def try_lock(path: Path, wait: bool = False) -> int | None: ...


def try_lock(path: Path, wait: bool = False) -> int | None:
    """A descriptor of lock file ``path`` (created if missing) holding its exclusive flock, or None when another
    process holds it. A regular file opened for writing, not the directory it guards: NFS emulates flock with POSIX
    locks, which need that."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def owned(path: Path, busy: str, wait: bool = False, waiting: str | None = None) -> Iterator[None]:
    """Holds lock file ``path`` while the block runs, with this process's pid and start time written in it.
    When another process holds it: waits if ``wait`` (first printing ``waiting``, if given), else raises
    ``LockBusy(busy)``; ``{holder}`` in either is replaced by what the holder wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = try_lock(path)
    if fd is None:
        holder = path.read_text().strip() or "unknown"
        if not wait:
            raise LockBusy(busy.format(holder=holder))
        if waiting:
            print(waiting.format(holder=holder), flush=True)
        fd = try_lock(path, wait=True)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def held(path: Path) -> bool:
    """Whether another process holds lock file ``path`` (a missing one nobody does): probed with a shared flock,
    let go at once, and the file never created."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # lets go of the shared lock, if it got it
    return False


def lock_of(directory: Path) -> Path:
    return directory.with_name(f"{directory.name}.lock")


def remove_if_dead(directory: Path, unlink_lock: bool = False) -> None:
    """Remove ``directory`` if its lock nobody holds: its owner died (or has just finished with it). With
    ``unlink_lock`` the lock file goes too: only safe while the caller holds the guard under which owners create
    their directories and take their locks."""
    held = try_lock(lock_of(directory))
    if held is None:
        return
    try:
        if directory.exists():
            shutil.rmtree(directory)
        if unlink_lock:
            lock_of(directory).unlink()
    finally:
        os.close(held)


SCRATCH = "capacity-atlas-trials"  # under the node's temporary directory


@contextlib.contextmanager
def scratch_dir(root: Path | None = None) -> Iterator[Path]:
    """A new private directory under ``root`` (default: ``<tmp>/capacity-atlas-trials/``), held while the caller
    uses it and removed afterwards. First removes what killed owners left there (a trial's newest checkpoint,
    as big as its model and optimizer state)."""
    root = Path(root or Path(tempfile.gettempdir()) / SCRATCH)
    root.mkdir(parents=True, exist_ok=True)
    guard = try_lock(root / ".lock", wait=True)  # no owner is between creating its directory and locking it
    try:
        for entry in root.iterdir():
            if entry.is_dir():
                remove_if_dead(entry, unlink_lock=True)
        path = Path(tempfile.mkdtemp(prefix="trial-", dir=root))
        lock = try_lock(lock_of(path))
        assert lock is not None  # a directory just made, under the guard: no other process knows its lock yet
    finally:
        os.close(guard)
    try:
        yield path
    finally:
        guard = try_lock(root / ".lock", wait=True)  # no other owner is scanning while the lock file goes
        try:
            shutil.rmtree(path, ignore_errors=True)
            lock_of(path).unlink(missing_ok=True)
        finally:
            os.close(lock)
            os.close(guard)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.common.locks",
        description="The lock files that runs in progress hold in a checkout, one a line, from its root (run there).",
    )
    ap.add_argument("--held", action="store_true", help="only those that a live process holds now")
    args = ap.parse_args(argv)
    for path in CHECKOUT_LOCKS:
        if not args.held or held(Path(path)):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
