"""Search strategies replayed on recorded trials: what a strategy would have trained, at what cost and in what wall
time on N slots, without training anything.

A sweep that trained every (cell, learning rate) to its verdict (``sweep.search.strategy: grid``, ``lr_search: all``)
recorded each trial's verdict, training FLOPs and seconds (``results/trials.csv``) and its validations
(``results/curves.csv``: step, validation accuracy, training PFLOPs so far). ``replay`` drives the sweep's own
``CellSearcher`` over a plan (``pipeline.search.frontier``) and a successive halving (``pipeline.search.halving``)
as Ray Tune does: whenever a slot is free it asks for a trial; a trial's outcome is read off its recording: the
verdict where it ended, or, if the trial is to pause at a rung before that, its validation accuracy there, and it
costs the FLOPs (and, in proportion, the seconds) between the step it starts from and the step it ends at. This is
exact because a trial continued from a checkpoint follows the same steps as one never stopped
(``pipeline.training.checkpoints``). The minimum-width table is ``min_widths`` of the plan's outcomes, as the
sweep's is.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.status import Status
from pipeline.search.frontier import MinWidth, Plan, min_widths
from pipeline.search.halving import Halving
from pipeline.search.searcher import CellSearcher


@dataclass
class Recording:
    """One recorded (cell, learning rate) trial, run to its verdict."""

    status: Status
    val_accuracy: float
    train_pflops: float
    seconds: float
    steps: int  # where it ended
    cost: float  # expected cost, the searcher's order (exact forward GFLOPs)
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, val accuracy, PFLOPs so far)

    def at(self, step: int) -> tuple[float, float]:
        """(validation accuracy, training PFLOPs) at ``step`` (the last validation at or before it)."""
        before = [point for point in self.curve if point[0] <= step]
        if not before:
            return math.nan, self.train_pflops * step / max(self.steps, 1)
        return before[-1][1], before[-1][2]


Recorded = dict[Cell, dict[float, Recording]]  # cell -> learning rate -> its recorded trial


class ReplayError(ValueError):
    pass


@dataclass(frozen=True)
class Replay:
    trials: int  # (cell, learning rate) runs started
    attempts: int  # trials Tune would start: a run continued past a rung is a trial more
    pflops: float  # their training PFLOPs
    wall: float  # seconds from the first trial's start to the last one's end, on the slots given
    busy: float  # slot-seconds: every trial's seconds
    table: dict[tuple, MinWidth]  # (task, size, arch, depth) -> the smallest width every seed solved
    misses: int  # predictions a probe proved wrong
    dropped: int  # learning-rate runs halving dropped


KEYS = ["task", "size", "arch", "width", "depth", "seed"]


def load_trials(path: Path, curves: Path | None = None) -> Recorded:
    """A recorded grid: a sweep's results/trials.csv (every (cell, learning rate) with its verdict and costs) and,
    if there (``curves``, default: curves.csv beside it), its validations."""
    frame = pd.read_csv(path)
    missing = {*KEYS, "lr", "status", "train_pflops", "train_seconds", "train_steps"} - set(frame.columns)
    if missing:
        raise ReplayError(f"{path}: not a sweep's trials.csv (no column {', '.join(sorted(missing))})")
    unended = sorted(set(frame.status) - {s for s in Status if s.verdict} - {Status.FAILED})
    if unended:
        raise ReplayError(
            f"{path}: trials that did not run to their verdicts ({', '.join(unended)}): replay needs "
            "a sweep with lr_search: all"
        )
    recorded: Recorded = {}
    for r in frame.itertuples():
        cell = Cell(str(r.task), int(r.size), str(r.arch), int(r.width), int(r.depth), int(r.seed))
        recorded.setdefault(cell, {})[float(r.lr)] = Recording(
            status=Status(r.status),
            val_accuracy=zero_if_nan(getattr(r, "val_accuracy", math.nan)),
            train_pflops=zero_if_nan(r.train_pflops),
            seconds=zero_if_nan(r.train_seconds) + zero_if_nan(getattr(r, "eval_seconds", 0.0)),
            steps=int(zero_if_nan(r.train_steps)),
            cost=zero_if_nan(getattr(r, "exact_gflops", 0.0)),
        )
    curves = curves or path.with_name("curves.csv")
    if curves.exists():
        for keys, points in pd.read_csv(curves).groupby([*KEYS, "lr"]):
            task, size, arch, width, depth, seed, lr = keys
            cell = Cell(str(task), int(size), str(arch), int(width), int(depth), int(seed))
            if cell in recorded and float(lr) in recorded[cell]:
                points = points.sort_values("step")
                recorded[cell][float(lr)].curve = list(
                    zip(points.step.astype(int), points.val_accuracy.astype(float), points.train_pflops.astype(float))
                )
    return recorded


def zero_if_nan(value: float) -> float:
    return 0.0 if value is None or pd.isna(value) else float(value)


def spec(cell: Cell, lrs: tuple[float, ...]) -> CellSpec:
    """The cell record the searcher needs: the cell and its learning rates (no data behind it)."""
    name = f"{cell.task}{cell.size}-{cell.arch}-w{cell.width}-d{cell.depth}-s{cell.seed}"
    return CellSpec(
        cell=cell,
        arch_options={},
        lrs=lrs,
        train_path="",
        test_path="",
        val_path="",
        sha256={},
        data_hash="",
        vocab_size=0,
        family="",
        vocab=(),
        train_samples=0,
        max_len=0,
        cell_id=name,
        name=name,
    )


def outcome(run: Recording, start: int, pause_at: int | None) -> tuple[dict, float, float]:
    """(the trial's last report, its PFLOPs, its seconds) when it starts at step ``start`` and pauses at
    ``pause_at`` unless its verdict comes first."""
    _, before = run.at(start) if start else (math.nan, 0.0)
    if pause_at is not None and run.steps > pause_at and run.status != Status.FAILED:
        if not run.curve:
            raise ReplayError("successive halving needs the recorded validations (curves.csv)")
        accuracy, pflops = run.at(pause_at)
        report = {
            "final": True,
            "status": Status.PAUSED,
            "val_accuracy": accuracy,
            "train_pflops": pflops,
            "step": pause_at,
        }
    else:
        pflops = run.train_pflops
        report = {
            "final": True,
            "status": run.status,
            "val_accuracy": run.val_accuracy,
            "train_pflops": pflops,
            "step": run.steps,
        }
    spent = max(0.0, pflops - before)
    return report, spent, run.seconds * spent / run.train_pflops if run.train_pflops else 0.0


def replay(plan: Plan, recorded: Recorded, slots: int, halving: Halving | None = None) -> Replay:
    """The plan, with ``halving`` of the learning rates, run over the recorded trials on ``slots`` slots (see the
    module docstring)."""
    if slots < 1:
        raise ReplayError(f"slots must be at least 1, not {slots}")
    specs = {cell: spec(cell, tuple(sorted(runs))) for cell, runs in recorded.items()}
    dropped: list[dict] = []
    searcher = ReplaySearcher(
        plan,
        specs,
        {},
        lambda cell, lr: None,
        lambda s: max(r.cost for r in recorded[cell_of(s)].values()),
        halving=halving,
        dropped=dropped.append,
    )
    running: list[tuple[float, int, str, dict]] = []  # a heap of (end time, order, trial id, its last report)
    now, attempts, pflops, busy, runs = 0.0, 0, 0.0, 0.0, set()

    def fill() -> None:
        nonlocal attempts, pflops, busy
        while len(running) < slots:
            trial_id = f"t{attempts}"
            config = searcher.suggest(trial_id)
            if not isinstance(config, dict):  # None: nothing to start now; or Searcher.FINISHED
                return
            cell, lr = cell_of(CellSpec(**config["cell"])), config["train"]["lr"]
            report, spent, seconds = outcome(recorded[cell][lr], config["resume_step"] or 0, config["pause_at"])
            heapq.heappush(running, (now + seconds, attempts, trial_id, report))
            attempts, pflops, busy = attempts + 1, pflops + spent, busy + seconds
            runs.add((cell, lr))

    fill()
    while running:
        now, _, trial_id, report = heapq.heappop(running)
        if report["status"] == Status.PAUSED:
            searcher.rung_checkpoints[trial_id] = "(replayed)"
        searcher.on_trial_complete(trial_id, report)
        fill()
    if not plan.done():
        raise ReplayError("the plan stopped proposing before it was done")
    return Replay(len(runs), attempts, pflops, now, busy, min_widths(plan.outcomes()), len(plan.misses), len(dropped))


def verified(recorded: Recorded) -> float:
    """Training PFLOPs of an oracle that knows every answer and only verifies it: per (task, size, architecture,
    depth, seed), the cheapest run that solves the narrowest solved width and every run of the width below it (or,
    where no width solves, every run of the widest, unless a smaller size of the chain already solved none). A
    search whose table must equal the grid's spends about this much at least; with successive halving the width
    below can cost less, so it is a reference there, not a bound."""
    chains: dict[tuple, dict[int, dict[int, dict[float, Recording]]]] = {}
    for cell, runs in recorded.items():
        chains.setdefault((cell.task, cell.arch, cell.depth, cell.seed), {}).setdefault(cell.size, {})[cell.width] = (
            runs
        )
    total = 0.0
    for sizes in chains.values():
        for size in sorted(sizes):
            widths = sorted(sizes[size])
            solving = [w for w in widths if any(r.status == Status.SOLVED for r in sizes[size][w].values())]
            if solving:
                w = solving[0]
                total += min(r.train_pflops for r in sizes[size][w].values() if r.status == Status.SOLVED)
                below = [v for v in widths if v < w]
                total += sum(r.train_pflops for r in sizes[size][below[-1]].values()) if below else 0.0
            else:
                total += sum(r.train_pflops for r in sizes[size][widths[-1]].values())
                break  # the larger sizes are inferred unsolved
    return total


def cell_of(s: CellSpec) -> Cell:
    return Cell(s.task, s.size, s.arch, s.width, s.depth, s.seed)


class ReplaySearcher(CellSearcher):
    """The sweep's searcher, whose proposals must be recorded trials."""

    def settle_reused(self, spare: int = 0) -> None:
        try:
            super().settle_reused(spare)
        except KeyError as err:  # a cell without a record
            raise ReplayError(f"the plan asks for {err.args[0]}, which the recorded trials do not have") from None
