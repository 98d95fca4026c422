"""A plan of cells (``pipeline.search.frontier``) driven as Ray Tune drives a ``Searcher``: one trial per (cell,
learning rate). Ray itself is not imported here (``pipeline.scheduling.tuning.TuneSearcher`` gives it Tune's base
class), so the forecast and the replay run where Ray is not installed.

Tune asks ``suggest`` for a trial whenever a slot is free; the searcher takes the cells its plan proposes, turns
each into one trial per learning rate, and hands them out longest-expected first (exact forward FLOPs at the
dataset's L times the step budget), so the longest trials do not start last and leave a slot idle at the end.
When every learning rate of a cell has ended, the cell's result is its best run (``verdict.best_run``), and the
plan learns the cell's verdict (solved, unsolved or undecided); a frontier plan may then propose more cells. A run
this MLflow experiment already finished with the same data, settings and code is taken as it is, without a trial
(``reusable(cell, lr)`` returns it), so a rerun or an extended grid trains only what is missing, and a sweep with
nothing left to train never starts Ray (``settle_reused``). A run an interrupted sweep left unfinished continues
from its last checkpoint (``resumable``).

Under successive halving (``pipeline.search.halving``) a cell's learning rates pause at each rung; once all of
them have paused or ended, the leaders (and the learning rates that solved the nearest solved cells of the same
chain, ``favoured``) are suggested again as trials that continue from their rung's checkpoint
(``tuning.RungCheckpoints`` learns where Tune stored it) and the others are dropped (``dropped`` hears of each, so
that the sweep tags its MLflow run and deletes its checkpoints).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict

from pipeline.common.cell import Cell, CellSpec
from pipeline.search.frontier import Plan
from pipeline.search.halving import Halving
from pipeline.training.status import Status, best_run

FINISHED = "FINISHED"  # what ``suggest`` returns once nothing is left: Tune's ``Searcher.FINISHED``
Queued = tuple[float, Cell, float, int, dict]  # (expected cost, cell, lr, rung, checkpoint to continue from)


def trial_key(cell: CellSpec, lr: float) -> str:
    """Stable id of one learning-rate run of a cell."""
    return hashlib.sha256(json.dumps([cell.cell_id, repr(float(lr))]).encode()).hexdigest()[:16]


class CellSearcher:
    def __init__(
        self,
        plan: Plan,
        cells: dict[Cell, CellSpec],
        train: dict,
        reusable: Callable[[CellSpec, float], dict | None],
        cost: Callable[[CellSpec], float],
        resumable: dict[str, dict] | None = None,
        halving: Halving | None = None,
        dropped: Callable[[dict], None] = lambda run: None,
    ):
        """``cells``: every cell of the grid, each with its learning rates (``lrs``); ``resumable``: trial key
        -> the checkpoint (``path``, ``step``) an earlier, interrupted sweep left for it; ``halving``: the rungs of
        successive halving (none: every learning rate to its verdict); ``dropped(run)``: a run halving dropped."""
        super().__init__()  # Tune's Searcher, where ``TuneSearcher`` puts it in the class hierarchy
        self.plan, self.cells, self.train = plan, cells, train
        self.reusable, self.cost, self.resumable = reusable, cost, resumable or {}
        self.halving, self.dropped = halving or Halving(), dropped
        self.queue: list[Queued] = []  # longest first
        self.live: dict[str, tuple[Cell, float, int]] = {}  # Tune trial id -> (cell, lr, rung)
        self.runs: dict[Cell, dict[float, dict]] = {}  # cell -> lr -> its run record, while no attempt of it is due
        self.trial_ids: dict[str, str] = {}  # Tune trial id -> trial key
        self.rung_checkpoints: dict[str, str] = {}  # Tune trial id -> where a paused trial's checkpoint is
        self.curves: dict[tuple[Cell, float], dict[int, dict]] = {}  # (cell, lr) -> step -> its validation

    # ---- the plan's side ------------------------------------------------------------------------------------
    def settle_reused(self, spare: int = 0) -> None:
        """Take the plan's proposals, resolving reused runs at once, until a trial must really be trained or the
        plan is done; ``spare``: slots free now, for which the plan may propose what could otherwise wait."""
        while not self.queue:
            proposed = self.plan.propose(spare)
            if not proposed:
                return
            for cell in proposed:
                self.runs[cell] = {}
                for lr in self.cells[cell].lrs:
                    previous = self.reusable(self.cells[cell], lr)
                    if previous is not None:
                        key = trial_key(self.cells[cell], lr)
                        self.finish(cell, lr, previous | {"lr": lr, "trial_key": key, "rung": None})
                    else:
                        self.enqueue(cell, lr, 0, self.resumable.get(trial_key(self.cells[cell], lr), {}))

    def enqueue(self, cell: Cell, lr: float, rung: int, checkpoint: dict) -> None:
        # after those of equal cost, as a stable sort would: in place, not a sort of the whole queue per trial
        bisect.insort(self.queue, (self.cost(self.cells[cell]), cell, lr, rung, checkpoint), key=lambda item: -item[0])

    def finish(self, cell: Cell, lr: float, run: dict) -> None:
        """One attempt of (cell, lr) ended (or was reused). Once every learning rate of the cell has paused or
        ended, halving decides which go on; once none goes on, the plan learns the cell's verdict."""
        runs = self.runs[cell]
        runs[lr] = run
        if len(runs) < len(self.cells[cell].lrs):
            return
        if run["rung"] is not None:
            go_on, dropped = self.halving.decide(runs, run["rung"], self.favoured(cell))
            for lr_, reason in dropped.items():
                runs[lr_] = runs[lr_] | {"status": Status.DROPPED, "reason": reason}
                self.dropped(runs[lr_])
            for lr_ in go_on:
                paused = runs.pop(lr_)
                self.enqueue(cell, lr_, paused["rung"] + 1, {"path": paused["checkpoint"], "step": paused["step"]})
            if go_on:
                return
        self.plan.record(cell, Status(best_run(list(runs.values()))["status"]))

    def favoured(self, cell: Cell) -> frozenset[float] | None:
        """Every learning rate that solved one of the nearest solved cells of the same task, architecture and depth
        (any seed; nearest on log2 axes of size and width): halving keeps them whatever their rank. Every one, not
        just the best: a wider neighbour is solved by rates that fail at this width as well as by the one that
        solves here."""
        near: dict[float, set[float]] = {}
        for other, runs in self.runs.items():
            if other == cell or other.chain[:3] != cell.chain[:3] or len(runs) < len(self.cells[other].lrs):
                continue
            solved = {lr for lr, run in runs.items() if run["status"] == Status.SOLVED}
            if solved:
                distance = abs(math.log2(other.size / cell.size)) + abs(math.log2(other.width / cell.width))
                near.setdefault(distance, set()).update(solved)
        return frozenset(near[min(near)]) if near else None

    def needs_training(self) -> bool:
        self.settle_reused()
        return bool(self.queue)

    # ---- Tune's side ----------------------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        self.settle_reused(spare=1)  # Tune asks when a slot is free
        if self.queue:
            _, cell, lr, rung, resume = self.queue.pop(0)
            self.live[trial_id] = (cell, lr, rung)
            key = self.trial_ids[trial_id] = trial_key(self.cells[cell], lr)
            return {
                "cell": asdict(self.cells[cell]),
                "train": self.train | {"lr": lr},
                "trial_key": key,
                "resume": resume.get("path"),
                "resume_step": resume.get("step"),
                "rung": rung,
                "pause_at": self.halving.pause_at(rung) if len(self.cells[cell].lrs) > 1 else None,
            }
        return FINISHED if not self.live and self.plan.done() else None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Every validation, for the replay of other strategies (``results/curves.csv``)."""
        if "val_accuracy" in result and not result.get("final") and trial_id in self.live:
            cell, lr, _ = self.live[trial_id]
            self.curves.setdefault((cell, lr), {})[int(result["step"])] = {
                k: result.get(k) for k in ("val_accuracy", "val_loss", "train_pflops")
            }

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        cell, lr, rung = self.live.pop(trial_id)
        checkpoint = self.rung_checkpoints.pop(trial_id, None)
        if error or not result or not result.get("final"):
            run = {
                "status": Status.FAILED,
                "reason": "the trial raised (see its MLflow run's error tag)",
                "trial_id": trial_id,
            }
        elif result["status"] == Status.PAUSED and checkpoint is None:
            run = {"status": Status.FAILED, "reason": "paused at a rung without a checkpoint", "trial_id": trial_id}
        else:
            run = {k: v for k, v in result.items() if k not in ("config",)} | {"trial_id": trial_id}
            run |= {"checkpoint": checkpoint} if checkpoint else {}
        self.finish(cell, lr, run | {"lr": lr, "trial_key": self.trial_ids[trial_id], "rung": rung})

    # ---- results --------------------------------------------------------------------------------------------
    def best(self, cell: Cell) -> dict | None:
        runs = self.runs.get(cell)
        return best_run(list(runs.values())) if runs and len(runs) == len(self.cells[cell].lrs) else None
