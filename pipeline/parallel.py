"""Worker processes for the data stages: results come back in submission order, so output never depends on how
many workers made it. ``workers = 1`` runs everything in this process (no start-up cost, for small data)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

WORKER_NICENESS = 5


def start_worker(parent: int) -> None:
    """Run at a lower priority, and exit when ``parent`` dies: a parent killed by SIGKILL never shuts the pool down,
    and its spawned workers, blocked on a queue they also hold the writing end of, would wait forever."""
    os.nice(WORKER_NICENESS)
    threading.Thread(target=exit_with, args=(parent,), daemon=True).start()


def exit_with(parent: int) -> None:
    while os.getppid() == parent:  # orphans are re-parented: polling works on every POSIX system (prctl is Linux's)
        time.sleep(1)
    os._exit(1)


class Pool:
    def __init__(self, workers: int):
        self.workers = workers
        # spawn, not fork: the parent holds pyarrow and numba thread pools, which a forked child must not inherit.
        # Workers run at a lower priority: the parent's own work (writing the file) is the stage's critical path,
        # so it should never wait for a core; the workers take whatever it leaves.
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=start_worker, initargs=(os.getpid(),)) if workers > 1 else None

    def imap(self, fn: Callable, args: Iterable[tuple], ahead: int | None = None) -> Iterator:
        """``fn(*a)`` for each ``a`` in ``args`` (which may be endless), in order, with ``ahead`` tasks in flight
        (default 2 per worker) so memory stays bounded: more when the caller pauses between results, so that the
        workers still have work queued meanwhile. Closing the iterator early drops the tasks still queued."""
        if self.executor is None:
            yield from (fn(*a) for a in args)
            return
        pending: deque = deque()
        todo = iter(args)
        try:
            while True:
                while len(pending) < (ahead or 2 * self.workers) and (a := next(todo, None)) is not None:
                    pending.append(self.executor.submit(fn, *a))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()

    def close(self, wait: bool = True) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, error: type[BaseException] | None, *exc) -> None:
        # on an error or a signal, the caller's clean-up need not wait for the workers to end their chunks in flight
        self.close(wait=error is None)
