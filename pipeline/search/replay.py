"""Search strategies replayed on recorded trials: what a plan would have trained, at what cost and in what wall
time on N slots, without training anything.

A sweep that trained every (cell, learning rate) (``results/trials.csv`` of ``sweep.search: grid``) recorded each
trial's verdict, training FLOPs and seconds. ``replay`` drives a plan (``pipeline/search/frontier.py``) as
``CellSearcher`` does, and schedules its trials on ``slots`` slots as Ray Tune does: a trial starts when a slot is
free, the longest expected first (exact forward FLOPs: the searcher's order), and takes its recorded seconds; when
a cell's last learning rate ends, the plan learns the cell's verdict (its best run's, ``best_run``) and may propose
more. The minimum-width table is ``min_widths`` of the plan's outcomes, as the sweep's is.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.search.frontier import Cell, MinWidth, Plan, min_widths
from pipeline.training.status import Status, best_run

Recorded = dict[Cell, dict[float, dict]]  # cell -> learning rate -> a trial: lr, status, val_accuracy, costs


class ReplayError(ValueError):
    pass


@dataclass(frozen=True)
class Replay:
    trials: int  # (cell, learning rate) trials trained
    pflops: float  # their training PFLOPs
    wall: float  # seconds from the first trial's start to the last one's end, on the slots given
    table: dict[tuple, MinWidth]  # (task, size, arch, depth) -> the smallest width every seed solved


def load_trials(path: Path) -> Recorded:
    """A recorded grid: results/trials.csv of a sweep, every (cell, learning rate) with its verdict and costs."""
    frame = pd.read_csv(path)
    missing = {"task", "size", "arch", "width", "depth", "seed", "lr", "status", "train_pflops", "train_seconds"}
    missing -= set(frame.columns)
    if missing:
        raise ReplayError(f"{path}: not a sweep's trials.csv (no column {', '.join(sorted(missing))})")
    recorded: Recorded = {}
    for r in frame.itertuples():
        cell = Cell(str(r.task), int(r.size), str(r.arch), int(r.width), int(r.depth), int(r.seed))
        recorded.setdefault(cell, {})[float(r.lr)] = {  # what best_run reads, and the costs
            "lr": float(r.lr),
            "status": Status(r.status),
            "val_accuracy": zero_if_nan(getattr(r, "val_accuracy", math.nan)),
            "train_pflops": zero_if_nan(r.train_pflops),
            "seconds": zero_if_nan(r.train_seconds) + zero_if_nan(getattr(r, "eval_seconds", 0.0)),
            "cost": zero_if_nan(getattr(r, "exact_gflops", 0.0)),
        }
    return recorded


def zero_if_nan(value: float) -> float:
    return 0.0 if value is None or pd.isna(value) else float(value)


def replay(plan: Plan, recorded: Recorded, slots: int) -> Replay:
    """The plan run over the recorded trials on ``slots`` slots (see the module docstring)."""
    if slots < 1:
        raise ReplayError(f"slots must be at least 1, not {slots}")
    queue: list[tuple[float, Cell, float]] = []  # (expected cost, cell, lr), longest first
    running: list[tuple[float, int, Cell, float]] = []  # a heap of (end time, order, cell, lr)
    ended: dict[Cell, dict[float, dict]] = {}
    now, started, pflops = 0.0, 0, 0.0

    def take_proposals() -> None:
        for cell in plan.propose():
            if cell not in recorded:
                raise ReplayError(f"the plan asks for {cell}, which the recorded trials do not have")
            ended[cell] = {}
            queue.extend((run["cost"], cell, lr) for lr, run in recorded[cell].items())
        queue.sort(key=lambda item: -item[0])

    take_proposals()
    while queue or running:
        while queue and len(running) < slots:
            _, cell, lr = queue.pop(0)
            run = recorded[cell][lr]
            heapq.heappush(running, (now + run["seconds"], started, cell, lr))
            started += 1
            pflops += run["train_pflops"]
        now, _, cell, lr = heapq.heappop(running)
        ended[cell][lr] = recorded[cell][lr]
        if len(ended[cell]) == len(recorded[cell]):  # the cell's last learning rate: the plan learns its verdict
            plan.record(cell, Status(best_run(list(ended[cell].values()))["status"]))
            take_proposals()
    if not plan.done():
        raise ReplayError("the plan stopped proposing before it was done")
    return Replay(started, pflops, now, min_widths(plan.outcomes()))
