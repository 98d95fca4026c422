"""Successive halving of a cell's learning rates (``sweep.search.lr_search: halving``).

Every learning rate of a cell trains to the first rung (``sweep.search.halving_rungs[0]`` steps) and pauses there at a
validation, with its checkpoint; when all of them have paused or ended, the best ``sweep.search.halving_keep`` of them
go on to the next rung from their checkpoints, as if they had never stopped, and the rest are *dropped*. After the last
rung the leaders train to their verdicts under the usual rules (``pipeline.training.verdict``). A learning rate that
solves the cell ends the halving: the paused ones are dropped, since the cell's result is its best run and nothing ranks
above solved.

Ranking by accuracy at a rung drops late bloomers: on these tasks a rate that plateaus early often leads one that
solves later, after a jump. So a learning rate that solved one of the nearest solved cells of the same task,
architecture and depth (``favoured``: the searcher knows them) goes on whatever its rank, as the likeliest to solve
this cell too; and until a chain has a solved cell, nothing tells the two kinds of rate apart, so by default
(``sweep.search.halving_unguided: keep``) every rate of such a cell goes on to its verdict.

A dropped run is recorded as dropped with its reason, never as unsolved: it says which learning rate lost, not what
the model cannot do.

The same decision drives the sweep (``pipeline.search.searcher``) and the replay of recorded curves
(``pipeline.search.replay``). With no rungs (``lr_search: all``) nothing pauses and every run ends by its verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipeline.common.config import SearchSection
from pipeline.common.status import Status


@dataclass(frozen=True)
class Halving:
    rungs: tuple[int, ...] = ()  # steps, increasing; empty: every learning rate trains to its verdict
    keep: float = 0.5  # the fraction of a rung's learning rates that go on
    unguided: Literal["keep", "rank"] = "keep"  # a cell with no solved neighbour: every rate goes on, or by rank

    @classmethod
    def of(cls, search: SearchSection) -> Halving:
        """The sweep's halving; no rungs under ``lr_search: all`` (its rungs, if set, are left unused)."""
        if search.lr_search == "all":
            return cls()
        return cls(tuple(search.halving_rungs), search.halving_keep, search.halving_unguided)

    def params(self) -> dict[str, str | float]:
        """The settings as the sweep's MLflow parameters (none without rungs)."""
        if not self.rungs:
            return {}
        return {
            "halving_rungs": ",".join(map(str, self.rungs)),
            "halving_keep": self.keep,
            "halving_unguided": self.unguided,
        }

    def pause_at(self, rung: int) -> int | None:
        """The step at which an attempt at rung ``rung`` (0 first) pauses; None after the last rung."""
        return self.rungs[rung] if rung < len(self.rungs) else None

    def decide(
        self, runs: dict[float, dict], rung: int, favoured: frozenset[float] | None = frozenset()
    ) -> tuple[list[float], dict[float, str]]:
        """At the end of ``rung``, once every run of the cell trained in it has paused or ended: (the paused learning
        rates that go on, {dropped learning rate: why}). ``runs``: learning rate -> its run record (``status``,
        ``val_accuracy``, ``rung`` it last trained in); every learning rate of the cell, ended ones included;
        ``favoured``: learning rates kept whatever their rank (the neighbours' winners); None: no neighbour is
        solved yet (``unguided`` says what then)."""
        entered = {lr: run for lr, run in runs.items() if run.get("rung") == rung}
        paused = [lr for lr, run in entered.items() if run["status"] == Status.PAUSED]
        if not paused:
            return [], {}
        step = self.rungs[rung]
        solved = sorted(lr for lr, run in runs.items() if run["status"] == Status.SOLVED)
        if solved:
            return [], {lr: f"dropped at step {step}: learning rate {solved[0]:g} solved the cell" for lr in paused}
        ranked = sorted(entered, key=lambda lr: standing(entered[lr]) + (lr,))
        guided = favoured is not None or self.unguided == "rank"
        leaders = ranked[: max(1, math.ceil(len(ranked) * self.keep))] if guided else ranked
        floor = accuracy(entered[leaders[-1]])
        kept = leaders + [lr for lr in ranked if lr in (favoured or ()) and lr not in leaders]
        dropped = {
            lr: (
                f"dropped at rung {rung + 1} of {len(self.rungs)} (step {step}): validation accuracy "
                f"{accuracy(entered[lr]):.3f}, {len(leaders)} of {len(ranked)} learning rates kept by rank (the last "
                f"at {floor:.3f})"
                + (f" and {len(kept) - len(leaders)} that solved a neighbouring cell" if kept != leaders else "")
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
