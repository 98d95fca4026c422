"""A data-parallel trial: ``sweep.resources.workers_per_trial`` processes on one node train one model with Lightning's
DDP (gloo on CPU, nccl on GPU), at the same global batch as one worker.

Why Lightning's DDP inside the Ray Tune trial, not Ray Train's TorchTrainer: the trial process itself is rank 0, so
reports, checkpoints and retries go through Tune exactly as for a one-worker trial, with no second layer of
fault tolerance. The other ranks are processes it spawns on its own node, inside the trial's Ray resources (one
bundle of workers x cpus_per_trial CPUs and workers x GPUs). The price: one trial spans one node, which is
what multi-GPU nodes give; several nodes per trial would need Ray Train.

Lightning is told the processes exist (``LOCAL_RANK`` set: a cluster environment that launches its own), so it
spawns nothing; each rank reads its share of every global batch (``train.Collate``), evaluates the whole
validation split (identical on every rank, so every rank reaches the same verdict), and only rank 0 scores
the test set and reports.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from pipeline.data.parallel import exit_with

# (spec, rank, port, checkpoints): one rank > 0 of a trial (``train.run_rank``)
RunRank = Callable[..., None]
ENV = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ranks_env(rank: int, world: int, port: int):
    """The variables Lightning's environment reads, for this process and this trial only (a reused Ray worker
    runs later trials alone)."""
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world)
    )
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def strategy(use_gpu: bool) -> DDPStrategy:
    # a worker that died leaves the others in a collective: give up after 10 minutes, not PyTorch's 30
    return DDPStrategy(process_group_backend="nccl" if use_gpu else "gloo", timeout=timedelta(minutes=10))


@contextlib.contextmanager
def other_ranks(spec, run_rank: RunRank, checkpoints):
    """Ranks 1..workers-1 of ``spec``'s trial, started before rank 0 (this process) trains and awaited after;
    yields the port rank 0 joins them on. Each rank runs ``run_rank`` (a module-level function, so that a spawned
    process can import it) with ``checkpoints``, the rank's ``Resumable``. A rank that fails makes rank 0 fail with
    its exit code."""
    port = free_port()
    ctx = multiprocessing.get_context("spawn")  # the parent holds torch and Ray threads: never fork them
    procs = [
        ctx.Process(target=rank_main, args=(run_rank, spec, rank, port, checkpoints, os.getpid()), daemon=True)
        for rank in range(1, spec.settings.resources.workers)
    ]
    for proc in procs:
        proc.start()
    try:
        yield port
    finally:
        for proc in procs:
            proc.join(timeout=600)
            if proc.is_alive():
                proc.kill()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"a data-parallel worker of this trial exited with code {failed[0]}")


def rank_main(run_rank: RunRank, spec, rank: int, port: int, checkpoints, parent: int) -> None:
    threading.Thread(target=exit_with, args=(parent,), daemon=True).start()  # rank 0 killed: so are we
    run_rank(spec, rank, port, checkpoints)
