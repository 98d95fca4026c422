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

With ``fuse`` (``sweep.resources.fuse: learning_rates``), the learning rates of a cell that are due together are one
Tune trial (``pipeline.training.fused_trial``): its config lists them as ``members`` (each with its trial key and the
checkpoint it continues from), its results report each one (``members``, a list: Tune passes lists through as they are),
and everything after is per learning rate as above: the runs, the rungs (the leaders continue as one smaller group), the
reuse. Learning rates continuing from checkpoints of different steps are separate groups, one per step.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.status import Status, best_run
from pipeline.search.frontier import Plan
from pipeline.search.halving import Halving
from pipeline.training.members import member_results

FINISHED = "FINISHED"  # what ``suggest`` returns once nothing is left: Tune's ``Searcher.FINISHED``
# (expected cost, cell, learning rates trained together (one unless fused), rung, each one's checkpoint to go on from)
Queued = tuple[float, Cell, tuple[float, ...], int, tuple[dict, ...]]


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
        fuse: Callable[[Cell], bool] = lambda cell: False,
    ):
        """``cells``: every cell of the grid, each with its learning rates (``lrs``); ``resumable``: trial key
        -> the checkpoint (``path``, ``step``) an earlier, interrupted sweep left for it; ``halving``: the rungs of
        successive halving (none: every learning rate to its verdict); ``dropped(run)``: a run halving dropped;
        ``fuse(cell)``: whether the cell's learning rates train as fused trials."""
        super().__init__()  # Tune's Searcher, where ``TuneSearcher`` puts it in the class hierarchy
        self.plan, self.cells, self.train = plan, cells, train
        self.reusable, self.cost, self.resumable = reusable, cost, resumable or {}
        self.halving, self.dropped, self.fuse = halving or Halving(), dropped, fuse
        self.queue: list[Queued] = []  # longest first
        self.live: dict[str, tuple[Cell, tuple[float, ...], int]] = {}  # Tune trial id -> (cell, lrs, rung)
        self.runs: dict[Cell, dict[float, dict]] = {}  # cell -> lr -> its run record, while no attempt of it is due
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
                due = {}
                for lr in self.cells[cell].lrs:
                    previous = self.reusable(self.cells[cell], lr)
                    if previous is not None:
                        key = trial_key(self.cells[cell], lr)
                        self.finish(cell, lr, previous | {"lr": lr, "trial_key": key, "rung": None})
                    else:
                        due[lr] = self.resumable.get(trial_key(self.cells[cell], lr), {})
                self.enqueue(cell, due, 0)

    def enqueue(self, cell: Cell, due: dict[float, dict], rung: int) -> None:
        """Learning rates of ``cell`` to train at ``rung``, each from its checkpoint (``path``, ``step``; empty: from
        the start): one trial each, or fused, one trial per step they continue from."""
        groups: dict[object, list[float]] = {}
        for lr, checkpoint in due.items():
            groups.setdefault(checkpoint.get("step") if self.fuse(cell) else lr, []).append(lr)
        cost = self.cost(self.cells[cell])
        for lrs in groups.values():
            item = (cost * len(lrs), cell, tuple(lrs), rung, tuple(due[lr] for lr in lrs))
            # after those of equal cost, as a stable sort would: in place, not a sort of the whole queue per trial
            bisect.insort(self.queue, item, key=lambda queued: -queued[0])

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
            leaders = {lr_: runs.pop(lr_) for lr_ in go_on}
            self.enqueue(
                cell, {lr_: {"path": p["checkpoint"], "step": p["step"]} for lr_, p in leaders.items()}, run["rung"] + 1
            )
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

    @property
    def queued(self) -> int:
        """Learning-rate runs waiting for a slot (a fused trial's each count)."""
        return sum(len(lrs) for _, _, lrs, _, _ in self.queue)

    @property
    def running(self) -> int:
        """Learning-rate runs training now."""
        return sum(len(lrs) for _, lrs, _ in self.live.values())

    def needs_training(self) -> bool:
        self.settle_reused()
        return bool(self.queue)

    # ---- Tune's side ----------------------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        self.settle_reused(spare=1)  # Tune asks when a slot is free
        if self.queue:
            _, cell, lrs, rung, resumes = self.queue.pop(0)
            self.live[trial_id] = (cell, lrs, rung)
            spec = self.cells[cell]
            pause_at = self.halving.pause_at(rung) if len(spec.lrs) > 1 else None
            runs = [
                {"lr": lr, "trial_key": trial_key(spec, lr), "resume": r.get("path"), "resume_step": r.get("step")}
                for lr, r in zip(lrs, resumes)
            ]
            config = {"cell": asdict(spec), "rung": rung, "pause_at": pause_at}
            if len(runs) > 1:  # fused: the learning rates apart, the settings they share
                return config | {"train": self.train, "members": runs}
            return config | {"train": self.train | {"lr": lrs[0]}} | {k: v for k, v in runs[0].items() if k != "lr"}
        return FINISHED if not self.live and self.plan.done() else None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Every validation, for the replay of other strategies (``results/curves.csv``)."""
        if result.get("final") or trial_id not in self.live:
            return
        cell, lrs, _ = self.live[trial_id]
        for lr, report in self.reported(trial_id, result):
            if "val_accuracy" in report:
                self.curves.setdefault((cell, lr), {})[int(report["step"])] = {
                    k: report.get(k) for k in ("val_accuracy", "val_loss", "train_pflops")
                }

    def reported(self, trial_id: str, result: dict) -> list[tuple[float, dict]]:
        """(learning rate, its report) of each learning-rate run a trial's result reports on."""
        cell, lrs, _ = self.live[trial_id]
        if len(lrs) == 1:
            return [(lrs[0], result)]
        by_key = {trial_key(self.cells[cell], lr): lr for lr in lrs}
        return [(by_key[r["trial_key"]], r) for r in member_results(result)]

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        cell, lrs, rung = self.live[trial_id]
        checkpoint = self.rung_checkpoints.pop(trial_id, None)
        reports = dict(self.reported(trial_id, result)) if result and result.get("final") and not error else {}
        del self.live[trial_id]
        for lr in lrs:
            key = trial_key(self.cells[cell], lr)
            report = reports.get(lr)
            if report is None:
                run = {
                    "status": Status.FAILED,
                    "reason": "the trial raised (see its MLflow run's error tag)",
                    "trial_id": trial_id,
                }
            elif report["status"] == Status.PAUSED and checkpoint is None:
                run = {"status": Status.FAILED, "reason": "paused at a rung without a checkpoint", "trial_id": trial_id}
            else:
                run = {k: v for k, v in report.items() if k not in ("config", "members")} | {"trial_id": trial_id}
                if checkpoint and report["status"] == Status.PAUSED:  # a fused trial's: the member's own directory
                    run["checkpoint"] = checkpoint if len(lrs) == 1 else f"{checkpoint.rstrip('/')}/{key}"
            self.finish(cell, lr, run | {"lr": lr, "trial_key": key, "rung": rung})

    # ---- results --------------------------------------------------------------------------------------------
    def best(self, cell: Cell) -> dict | None:
        runs = self.runs.get(cell)
        return best_run(list(runs.values())) if runs and len(runs) == len(self.cells[cell].lrs) else None
