"""Successive halving of a cell's learning rates (``sweep.lr_search: halving``).

Every learning rate of a cell trains to the first rung (``sweep.halving_rungs[0]`` steps) and pauses there at a
validation, with its checkpoint; when all of them have paused or ended, the best ``sweep.halving_keep`` of them go
on to the next rung from their checkpoints, as if they had never stopped, and the rest are *dropped*. After the last
rung the leaders train to their verdicts under the usual rules (``pipeline/training/verdict.py``). A learning rate
that solves the cell ends the halving: the paused ones are dropped, since the cell's result is its best run and
nothing ranks above solved. A dropped run is recorded as dropped with its reason, never as unsolved: it says
which learning rate lost, not what the model cannot do.

The same decision drives the sweep (``pipeline/search/searcher.py``) and the replay of recorded curves
(``pipeline/search/replay.py``). With no rungs (``lr_search: all``) nothing pauses and every run ends by its verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.training.status import Status


@dataclass(frozen=True)
class Halving:
    rungs: tuple[int, ...] = ()  # steps, increasing; empty: every learning rate trains to its verdict
    keep: float = 0.5  # the fraction of a rung's learning rates that go on

    def pause_at(self, rung: int) -> int | None:
        """The step at which an attempt at rung ``rung`` (0 first) pauses; None after the last rung."""
        return self.rungs[rung] if rung < len(self.rungs) else None

    def decide(self, runs: dict[float, dict], rung: int) -> tuple[list[float], dict[float, str]]:
        """At the end of ``rung``, once every run of the cell trained in it has paused or ended: (the paused learning
        rates that go on, {dropped learning rate: why}). ``runs``: learning rate -> its run record (``status``,
        ``val_accuracy``, ``rung`` it last trained in); every learning rate of the cell, ended ones included."""
        entered = {lr: run for lr, run in runs.items() if run.get("rung") == rung}
        paused = [lr for lr, run in entered.items() if run["status"] == Status.PAUSED]
        if not paused:
            return [], {}
        step = self.rungs[rung]
        solved = sorted(lr for lr, run in runs.items() if run["status"] == Status.SOLVED)
        if solved:
            return [], {lr: f"dropped at step {step}: learning rate {solved[0]:g} solved the cell" for lr in paused}
        ranked = sorted(entered, key=lambda lr: standing(entered[lr]) + (lr,))
        kept = ranked[: max(1, math.ceil(len(ranked) * self.keep))]
        floor = accuracy(entered[kept[-1]])
        dropped = {
            lr: (
                f"dropped at rung {rung + 1} of {len(self.rungs)} (step {step}): validation accuracy "
                f"{accuracy(entered[lr]):.3f}, {len(kept)} of {len(ranked)} learning rates kept (the last at "
                f"{floor:.3f})"
            )
            for lr in paused
            if lr not in kept
        }
        return [lr for lr in kept if lr in paused], dropped


def standing(run: dict) -> tuple[int, float]:
    """A run's place at a rung, best first: a paused run still improves, so it ranks as undecided does (above a
    converged unsolved one); then the higher validation accuracy."""
    status = Status.UNDECIDED if run["status"] == Status.PAUSED else Status(run["status"])
    return status.rank, -accuracy(run)


def accuracy(run: dict) -> float:
    value = run.get("val_accuracy")
    return -1.0 if value is None or not math.isfinite(value) else float(value)
