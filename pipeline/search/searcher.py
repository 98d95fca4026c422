"""A plan of cells (``pipeline/search/frontier.py``) driven as a Ray Tune ``Searcher``: one trial per (cell,
learning rate).

Tune asks ``suggest`` for a trial whenever a slot is free; the searcher takes the cells its plan proposes, turns
each into one trial per learning rate, and hands them out longest-expected first (exact forward FLOPs at the
dataset's L times the step budget), so the longest trials do not start last and leave a slot idle at the end.
When every learning rate of a cell has ended, the cell's result is its best run (``verdict.best_run``), and the
plan learns the cell's verdict (solved, unsolved or undecided); a frontier plan may then propose more cells. A run
this MLflow experiment already finished with the same data, settings and code is taken as it is, without a trial
(``reusable(cell, lr)`` returns it), so a rerun or an extended grid trains only what is missing, and a sweep with
nothing left to train never starts Ray (``settle_reused``). A run an interrupted sweep left unfinished continues
from its last checkpoint (``resumable``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict

from ray.tune.search import Searcher

from pipeline.common.cell import CellSpec
from pipeline.search.frontier import Cell, Plan
from pipeline.training.status import Status, best_run


def trial_key(cell: CellSpec, lr: float) -> str:
    """Stable id of one learning-rate run of a cell."""
    return hashlib.sha256(json.dumps([cell.cell_id, repr(float(lr))]).encode()).hexdigest()[:16]


class CellSearcher(Searcher):
    def __init__(
        self,
        plan: Plan,
        cells: dict[Cell, CellSpec],
        train: dict,
        reusable: Callable[[CellSpec, float], dict | None],
        cost: Callable[[CellSpec], float],
        resumable: dict[str, dict] | None = None,
    ):
        """``cells``: every cell of the grid, each with its learning rates (``lrs``); ``resumable``: trial key
        -> the checkpoint (``path``, ``step``) an earlier, interrupted sweep left for it."""
        super().__init__()
        self.plan, self.cells, self.train = plan, cells, train
        self.reusable, self.cost, self.resumable = reusable, cost, resumable or {}
        self.queue: list[tuple[float, Cell, float]] = []  # (expected cost, cell, lr), longest first
        self.live: dict[str, tuple[Cell, float]] = {}  # Tune trial id -> (cell, lr)
        self.runs: dict[Cell, dict[float, dict]] = {}  # cell -> lr -> run record
        self.trial_ids: dict[str, str] = {}  # Tune trial id -> trial key

    # ---- the plan's side ------------------------------------------------------------------------------------
    def settle_reused(self) -> None:
        """Take the plan's proposals, resolving reused runs at once, until a trial must really be trained or the
        plan is done."""
        while not self.queue:
            proposed = self.plan.propose()
            if not proposed:
                return
            for cell in proposed:
                self.runs[cell] = {}
                for lr in self.cells[cell].lrs:
                    previous = self.reusable(self.cells[cell], lr)
                    if previous is not None:
                        self.finish(cell, lr, previous | {"lr": lr, "trial_key": trial_key(self.cells[cell], lr)})
                    else:
                        self.queue.append((self.cost(self.cells[cell]), cell, lr))
            self.queue.sort(key=lambda item: -item[0])

    def finish(self, cell: Cell, lr: float, run: dict) -> None:
        self.runs[cell][lr] = run
        if len(self.runs[cell]) == len(self.cells[cell].lrs):  # its last learning rate: the plan learns its verdict
            self.plan.record(cell, Status(best_run(list(self.runs[cell].values()))["status"]))

    def needs_training(self) -> bool:
        self.settle_reused()
        return bool(self.queue)

    # ---- Tune's side ----------------------------------------------------------------------------------------
    # Ray's annotation leaves out Searcher.FINISHED, which its docstring and SearchGenerator accept
    def suggest(self, trial_id: str) -> dict | str | None:  # type: ignore[override]
        self.settle_reused()
        if self.queue:
            _, cell, lr = self.queue.pop(0)
            self.live[trial_id] = (cell, lr)
            key = self.trial_ids[trial_id] = trial_key(self.cells[cell], lr)
            resume = self.resumable.get(key, {})
            return {
                "cell": asdict(self.cells[cell]),
                "train": self.train | {"lr": lr},
                "trial_key": key,
                "resume": resume.get("path"),
                "resume_step": resume.get("step"),
            }
        return Searcher.FINISHED if not self.live and self.plan.done() else None

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        cell, lr = self.live.pop(trial_id)
        if error or not result or not result.get("final"):
            run = {
                "status": Status.FAILED,
                "reason": "the trial raised (see its MLflow run's error tag)",
                "trial_id": trial_id,
            }
        else:
            run = {k: v for k, v in result.items() if k not in ("config",)} | {"trial_id": trial_id}
        self.finish(cell, lr, run | {"lr": lr, "trial_key": self.trial_ids[trial_id]})

    # ---- results --------------------------------------------------------------------------------------------
    def best(self, cell: Cell) -> dict | None:
        runs = self.runs.get(cell)
        return best_run(list(runs.values())) if runs and len(runs) == len(self.cells[cell].lrs) else None
