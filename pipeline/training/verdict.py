"""A verdict per trial, not a budget: why a trial stopped, and which of a cell's learning-rate runs counts.

A trial ends at the first of:
- solved: the final-answer accuracy on the validation split (held out from train, never the test set) is at or
  above ``report.accuracy_threshold`` at ``sweep.patience`` consecutive validations (``Verdict``);
- diverged: the training loss is not finite (``Verdict``, checked every step);
- plateau: no gain of ``sweep.min_delta`` in validation accuracy over ``sweep.plateau_checks`` validations
  (Lightning's ``EarlyStopping``, whose ``stopping_reason`` we read);
- budget: ``sweep.max_steps`` / ``sweep.epochs`` ran out (Lightning's own stop).
Plateau and budget are both ``unsolved``; a trial that raised is ``failed`` (set by the sweep, which sees the
error). These run inside the trial, in Lightning, rather than as a Ray Tune stopper: a Tune stop kills the trial
before it scores the test set, and the test set is what the tables show.
"""

from __future__ import annotations

import math
from enum import StrEnum

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason


class Status(StrEnum):
    """How a trial ended, best first: the order ranks a cell's learning-rate runs (``best_run``) and tells a
    nightly regression from an improvement. A ``str``, so tables and MLflow hold the plain word."""

    SOLVED = "solved"
    UNSOLVED = "unsolved"
    DIVERGED = "diverged"
    FAILED = "failed"  # the trial raised: set by the sweep, which sees the error

    @property
    def rank(self) -> int:
        """0 for the best (solved); a higher rank is a worse end."""
        return list(Status).index(self)


MONITOR = "val_accuracy"  # final-answer accuracy on the validation split, logged by SequenceModel


class Verdict(L.Callback):
    """Stops a trial once solved (``patience`` validations in a row at or above ``threshold``) or diverged
    (non-finite training loss), and says at the end why it stopped (``status``, ``reason``)."""

    def __init__(self, threshold: float, patience: int, plateau: EarlyStopping | None = None, stop: bool = True):
        self.threshold, self.patience, self.plateau, self.stop = threshold, patience, plateau, stop
        self.streak = 0
        self.status: Status | None = None
        self.reason = ""
        self.solved_step: int | None = None
        self.solved_pflops = float("nan")  # training compute spent until solved

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("streak", "status", "reason", "solved_step", "solved_pflops")}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        diverged = loss is not None and not math.isfinite(float(loss))
        # every data-parallel worker stops together, or the others wait for it forever
        if trainer.strategy.reduce_boolean_decision(diverged, all=False):
            self.status, self.reason = Status.DIVERGED, f"training loss {float(loss)} at step {trainer.global_step}"
            trainer.should_stop = True

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking or self.status in (Status.SOLVED, Status.DIVERGED):
            return
        accuracy = float(trainer.callback_metrics.get(MONITOR, float("nan")))
        # logged metrics are float32: 0.9 arrives as 0.8999999761, and must still count as reaching 0.9
        self.streak = self.streak + 1 if accuracy >= self.threshold - 1e-6 else 0
        if self.streak >= self.patience:
            self.status, self.solved_step = Status.SOLVED, trainer.global_step
            self.solved_pflops = getattr(module, "train_flops", 0) / 1e15
            self.reason = (
                f"validation accuracy >= {self.threshold:g} at {self.patience} consecutive checks "
                f"(step {trainer.global_step})"
            )
            trainer.should_stop = trainer.should_stop or self.stop

    def outcome(self, trainer) -> tuple[Status, str]:
        """(status, reason) once ``fit`` has returned."""
        if self.status:
            return self.status, self.reason
        plateau = self.plateau
        if plateau is not None and plateau.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
            return Status.UNSOLVED, (
                f"plateau: no gain of {plateau.min_delta:g} in validation accuracy over "
                f"{plateau.patience} checks (best {float(plateau.best_score):.3f}, step "
                f"{trainer.global_step})"
            )
        if plateau is not None and plateau.stopping_reason == EarlyStoppingReason.NON_FINITE_METRIC:
            return Status.DIVERGED, f"validation accuracy not finite at step {trainer.global_step}"
        return Status.UNSOLVED, f"budget: stopped at step {trainer.global_step} (epoch {trainer.current_epoch})"


def callbacks(
    threshold: float, patience: int, plateau_checks: int | None, min_delta: float, stop_when_solved: bool = True
) -> list[L.Callback]:
    """The stopping callbacks of one trial; the ``Verdict`` is first. Without ``stop_when_solved`` (a
    fixed-budget grid) only divergence ends a trial early, and the verdict still records when it was solved."""
    plateau = None
    if plateau_checks and stop_when_solved:
        plateau = EarlyStopping(
            monitor=MONITOR,
            mode="max",
            min_delta=min_delta,
            patience=plateau_checks,
            check_finite=True,
            check_on_train_epoch_end=False,
        )
    verdict = Verdict(threshold, patience, plateau, stop=stop_when_solved)
    return [verdict] + ([plateau] if plateau else [])


def best_run(runs: list[dict]) -> dict:
    """A cell's result among its learning-rate runs (the separations paper reports the best run): a solved run
    before an unsolved one before a diverged one, then the higher validation accuracy, then the less training
    compute. Failed runs count only when every run failed. Chosen on validation, never on test."""

    def key(run: dict):
        val = run.get("val_accuracy")
        val = -1.0 if val is None or not math.isfinite(val) else val
        return Status(run["status"]).rank, -val, run.get("train_pflops") or 0.0, run["lr"]

    return min(runs, key=key)
