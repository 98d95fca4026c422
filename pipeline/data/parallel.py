"""Worker processes for the data stages: results come back in submission order, so output never depends on how
many workers made it. ``workers = 1`` runs everything in this process (no start-up cost, for small data). On an
error or a signal the workers are killed, not awaited: a worker writing files must not outlive the clean-up."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed

WORKER_NICENESS = 5


def start_worker(parent: int) -> None:
    """Run at a lower priority, exit when ``parent`` dies (a parent killed by SIGKILL never shuts the pool down,
    and its spawned workers, blocked on a queue they also hold the writing end of, would wait forever), and exit
    at once when the pool shuts down."""
    os.nice(WORKER_NICENESS)
    threading.Thread(target=exit_with, args=(parent,), daemon=True).start()
    atexit.register(exit_now)


def exit_now() -> None:
    """A worker's last act, once multiprocessing has flushed its queues and the pool has its results: skip the
    interpreter's teardown, which after numba and pyarrow takes 0.5 s that the stage would wait for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
        self.executor = (
            ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(os.getpid(),),
            )
            if workers > 1
            else None
        )

    def imap(self, fn: Callable, args: Iterable[tuple], ahead: int | None = None) -> Generator:
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

    def map(self, fn: Callable, args: Iterable[tuple], done: Callable | None = None) -> list:
        """``fn(*a)`` for each ``a``, all queued at once and started in that order; the results in that order, each
        also passed to ``done`` as it comes. The first error raises as soon as it happens, not when the tasks queued
        before it are done."""
        if self.executor is None:
            results = []
            for a in args:
                results.append(fn(*a))
                if done:
                    done(results[-1])
            return results
        futures = [self.executor.submit(fn, *a) for a in args]
        try:
            for future in as_completed(futures):
                result = future.result()
                if done:
                    done(result)
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    def close(self, kill: bool = False) -> None:
        if self.executor is None:
            return
        if kill:  # Python 3.14 has executor.kill_workers(); before it, the processes are only in _processes
            processes = list((self.executor._processes or {}).values())
            for process in processes:
                process.kill()
            for process in processes:
                process.join(timeout=10)  # dead, not just signalled
            # A worker killed while it sent a result (a chunk is megabytes) leaves part of a message in the result
            # pipe; the executor's thread would wait for the rest for ever, and the interpreter's exit for that
            # thread. Once the workers are dead this process holds the last writing end of the pipe: closing it
            # turns that wait into an end of file, so the thread finds the pool broken and ends.
            # the queue's writing Connection: private, and missing from typeshed's SimpleQueue
            self.executor._result_queue._writer.close()  # type: ignore[attr-defined]
        # not awaited after a kill: the executor's threads may still be ending
        self.executor.shutdown(wait=not kill, cancel_futures=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, error: type[BaseException] | None, *exc) -> None:
        # on an error or a signal the caller cleans up (removes the files being written): the workers must be gone
        # first, and it need not wait for them to end the work in flight
        self.close(kill=error is not None)
