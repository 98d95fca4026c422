"""How a trial ended, as the search, the sweep and the report read it: plain Python, so that those read it without
loading Lightning (``pipeline.training.verdict`` decides it, inside the trial).

- ``Status``: the verdicts, best first, with their order;
- ``best_run``: which of a cell's learning-rate runs is the cell's result;
- ``borderline``: whether a verdict's test accuracy is within noise of the threshold.
"""

from __future__ import annotations

import math
from enum import StrEnum

import pandas as pd


class Status(StrEnum):
    """How a trial ended, best first: the order ranks a cell's learning-rate runs (``best_run``: a run that could
    still solve it ranks above one that cannot) and tells a nightly regression from an improvement. A ``str``, so
    tables and MLflow hold the plain word."""

    SOLVED = "solved"
    UNDECIDED = "undecided"  # the budget ran out while the model was still improving
    UNSOLVED = "unsolved"  # converged below the threshold
    DIVERGED = "diverged"
    DROPPED = "dropped"  # successive halving stopped it at a rung: the cell's other learning rates led
    FAILED = "failed"  # the trial raised: set by the sweep, which sees the error
    PAUSED = "paused"  # at a rung of successive halving, waiting for the cell's other learning rates: not an end

    @property
    def rank(self) -> int:
        """0 for the best (solved); a higher rank is a worse end."""
        return list(Status).index(self)

    @property
    def decided(self) -> bool:
        """A verdict of the model's capacity: solved, or converged below the threshold."""
        return self in (Status.SOLVED, Status.UNSOLVED)

    @property
    def verdict(self) -> bool:
        """How a trained run ended on its own (not failed, not stopped by the search): what a later sweep may
        reuse."""
        return self in (Status.SOLVED, Status.UNDECIDED, Status.UNSOLVED, Status.DIVERGED)


def borderline(accuracy: float, samples: int, threshold: float) -> bool:
    """The threshold lies within the 95% Wilson interval of a test accuracy measured on ``samples`` samples: the
    verdict could flip on another draw of the test set."""
    if not samples or not math.isfinite(accuracy):
        return False
    z = 1.959964
    centre = (accuracy + z * z / (2 * samples)) / (1 + z * z / samples)
    half = z * math.sqrt(accuracy * (1 - accuracy) / samples + z * z / (4 * samples * samples)) / (1 + z * z / samples)
    return centre - half <= threshold <= centre + half


def borderline_rows(table: pd.DataFrame, threshold: float) -> pd.Series:
    """Per row of a results table: a measured cell, solved or unsolved, whose test accuracy is ``borderline`` at
    ``threshold``."""
    decided = table.measured.astype(bool) & table.status.isin([Status.SOLVED, Status.UNSOLVED])
    samples = table.eval_samples.fillna(0).astype(int)
    near = [borderline(a, n, threshold) for a, n in zip(table.final_accuracy, samples)]
    return decided & pd.Series(near, index=table.index, dtype=bool)


def best_run(runs: list[dict]) -> dict:
    """A cell's result among its learning-rate runs (the separations paper reports the best run): a solved run
    before an undecided one (it might still solve) before an unsolved one before a diverged one, then the higher
    validation accuracy, then the less training compute. A run dropped by successive halving counts only when no
    run ended on its own, a failed one only when every run failed. Chosen on validation, never on test."""

    def key(run: dict):
        val = run.get("val_accuracy")
        val = -1.0 if val is None or not math.isfinite(val) else val
        return Status(run["status"]).rank, -val, run.get("train_pflops") or 0.0, run["lr"]

    return min(runs, key=key)
