"""A verdict per trial that is a verdict of the model, not of its budget.

A trial ends at the first of:
- **solved**: the final-answer accuracy on the validation split (drawn as the test set is, never the test set) is at or
  above ``report.accuracy_threshold`` at ``sweep.verdict.patience`` consecutive validations, and at or above the trial's
  ``target`` too (the highest threshold a claim on its task reads, ``tasks.registry.training_targets``: 99% for the
  separations paper's "near-perfect"), or has converged short of the target: a trial solved at 90% trains on toward
  the target, with the same budget extensions, and its verdict at 90% stands whatever comes after;
- **unsolved**: training has converged below the threshold (``Convergence``: neither the validation loss nor the
  validation accuracy gained over the last ``convergence_window`` of the steps trained, after at least
  ``convergence_min_steps``), so more training would not solve it;
- **diverged**: the training loss or the validation loss is not finite. The training loss is watched on the device
  every step (``Divergence``: the first step whose loss is not finite, with that loss, kept without reading it back)
  and read at the next validation or when training ends, so a step never waits on the host: a diverged trial stops
  there, fewer than ``sweep.evaluation.val_every_steps`` steps after the step that diverged, which its reason names
  as before;
- **undecided**: the budget ran out while the model was still improving. The budget is ``sweep.optim.max_steps`` (or
  ``sweep.optim.epochs``); a trial still improving when it reaches it goes on with its budget doubled, up to
  ``sweep.verdict.max_budget_factor`` times the first, before it is called undecided. An undecided trial is no evidence
  of what the model cannot do: the tables, claims and the search never count it as unsolved.
Whichever way it ends, a trial records the highest accuracy its validation held at ``patience`` consecutive checks
(``sustained``) and whether it had converged: at any threshold t, it is solved if it held t, unsolved if it held
less and had converged, else undecided (``pipeline.reporting.tables.at_threshold`` reads a table at another t).
A trial that raised is **failed** (set by the sweep, which sees the error). Under successive halving a trial may
also be **paused** at a rung (``pause_at``: its step budget ends there, at a validation, with no verdict yet): the
sweep compares the cell's learning rates there and continues the leaders from that checkpoint, as if they had never
stopped, or **drops** the others (``pipeline.search.searcher``). These run inside the trial, in
Lightning, rather than as a Ray Tune stopper: a Tune stop kills the trial before it scores the test set, and the
test set is what the tables show. An extension continues the same fit (the same optimiser, schedule and data
order), so the trial's MLflow run holds one whole curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import lightning as L
import torch

from pipeline.common.config import VerdictSection
from pipeline.common.status import Status

MONITOR = "val_accuracy"  # final-answer accuracy on the validation split, logged by SequenceModel
LOSS = "val_loss"  # teacher-forced loss on the validation split, logged by SequenceModel


@dataclass(frozen=True)
class Validation:
    """One validation's evidence."""

    step: int
    loss: float
    accuracy: float


@dataclass(frozen=True)
class Convergence:
    """When a trial below the threshold has converged: the same rule for every architecture, its parameters the
    ``sweep.verdict.convergence_*`` keys and ``sweep.verdict.min_delta`` (defaults in ``pipeline.common.config``).

    At step s (at least ``min_steps``), the window is the validations after step (1 - window) s, the reference
    those at or before it. Training has converged when, over the window,
    - the best validation loss is not below the reference's best by more than ``tolerance`` (relative), and
    - the best validation accuracy is not above the reference's best by more than ``min_delta``.
    The window grows with the steps trained, so a long flat stretch is needed before a trial is cut off, and
    any gain inside the window (a late jump, as index lookup makes after hundreds of flat steps) keeps it
    training; ``min_steps`` keeps the first, short windows from deciding anything. The loss and the accuracy are both
    watched because either can move alone: the loss falls long before the greedy answer is right, and once the
    answer is right the accuracy still climbs while the loss barely moves. Both are measured on the validation
    split, never trained on, so a model that only memorises its training data has converged.
    """

    window: float
    tolerance: float
    min_steps: int
    min_delta: float

    @classmethod
    def of(cls, rules: VerdictSection) -> Convergence:
        return cls(rules.convergence_window, rules.convergence_tolerance, rules.convergence_min_steps, rules.min_delta)

    def evidence(self, checks: list[Validation]) -> tuple[bool, str]:
        """(converged, the evidence in words) at the last check."""
        if not checks:
            return False, "no validation yet"
        step = checks[-1].step
        start = (1 - self.window) * step
        before = [c for c in checks if c.step <= start]
        inside = [c for c in checks if c.step > start]
        if step < self.min_steps or not before or len(inside) < 2:
            return False, f"step {step}: too early to tell (at least {self.min_steps} steps and 2 validations)"
        loss_before, loss_now = min(c.loss for c in before), min(c.loss for c in inside)
        acc_before, acc_now = max(c.accuracy for c in before), max(c.accuracy for c in inside)
        gain = (loss_before - loss_now) / loss_before if loss_before > 0 else 0.0
        words = (
            f"over steps {int(start)}-{step} validation loss {loss_before:.4g} -> {loss_now:.4g} "
            f"(gain {gain:.1%}, tolerance {self.tolerance:.1%}), validation accuracy {acc_before:.3f} -> "
            f"{acc_now:.3f} (min_delta {self.min_delta:g})"
        )
        return gain <= self.tolerance and acc_now - acc_before <= self.min_delta, words


class Divergence:
    """Whether a training loss was not finite since the last ``read``, at which step first, and what it was, kept on
    the loss's device: ``watch`` is three tensor operations a step and reads nothing back, so that a step never waits
    for the host; ``read`` (at a validation, where the host reads anyway) says what it saw. Each of ``size`` members
    apart (a fused trial's (K,) losses), or one (a trial's scalar loss, ``size`` None).

        total <- total + loss            (losses are not negative: the total is finite until one is not, then stays
        finite <- finite + (total < inf)  NaN or inf; ``finite`` counts the steps before it)"""

    def __init__(self, size: int | None = None):
        self.size = size
        self.first: int | None = None  # the step of the first watch since the last read
        self.total: torch.Tensor | None = None  # () or (K,)
        self.finite: torch.Tensor | None = None

    def watch(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach()
        if self.total is None or self.finite is None:
            self.first, self.total = step, torch.zeros_like(loss)
            self.finite = torch.zeros(loss.shape, dtype=torch.long, device=loss.device)
        self.total = self.total + loss
        self.finite = self.finite + (self.total < math.inf)

    def read(self) -> list[tuple[int, float] | None]:
        """Per member (one for a trial), (the step, the loss's total since the last read: nan or inf) of its first
        non-finite loss since the last read, else None; forgets them."""
        if self.total is None or self.finite is None or self.first is None:
            return [None] * (self.size or 1)
        totals, finite = self.total.reshape(-1).tolist(), self.finite.reshape(-1).tolist()
        first, self.total, self.finite = self.first, None, None
        return [None if math.isfinite(t) else (first + n, t) for t, n in zip(totals, finite)]


class Verdict(L.Callback):
    """Solves a trial at ``threshold`` (``rules.patience`` validations in a row at or above it) and stops it once it
    also holds ``target`` (default: the threshold), converges (below the threshold: unsolved; ``Convergence``) or
    diverges; extends its step budget while it is still improving (doubling, up to ``rules.max_budget_factor`` times
    the first), and says at the end why it stopped (``outcome``). Without ``rules.stop_when_solved`` (a fixed-budget
    grid) only divergence ends a trial early and the budget is never extended; the verdict still records when it was
    solved and whether it had converged."""

    def __init__(
        self, threshold: float, rules: VerdictSection, pause_at: int | None = None, target: float | None = None
    ):
        stop = rules.stop_when_solved
        self.threshold, self.patience, self.convergence, self.stop = (
            threshold,
            rules.patience,
            Convergence.of(rules),
            stop,
        )
        self.target = max(threshold, target or threshold)
        self.sustained = 0.0  # the highest accuracy held at ``patience`` consecutive validations
        self.converged = False  # training had converged when it stopped
        self.done = False  # solved and at the target, or converged after solving: nothing left to learn here
        self.pause_at = pause_at  # this attempt ends at this step, a rung, unless a verdict comes first
        self.max_budget_factor = rules.max_budget_factor if stop else 1
        self.streak = 0
        self.status: Status | None = None
        self.reason = ""
        self.solved_step: int | None = None
        self.solved_pflops = float("nan")  # training compute spent until solved
        self.checks: list[Validation] = []
        self.base = 0  # the first step budget, set at the start of training
        self.budget = 0  # the budget now (base doubled at each extension)
        self.trainer: L.Trainer | None = None
        self.divergence = Divergence()  # the training loss, watched on the device

    def state_dict(self) -> dict:
        keys = (
            "streak",
            "status",
            "reason",
            "solved_step",
            "solved_pflops",
            "base",
            "budget",
            "sustained",
            "converged",
            "done",
        )
        state = {k: getattr(self, k) for k in keys} | {"checks": [vars(c) for c in self.checks]}
        # plain values only: a resume loads the checkpoint with weights_only=True, which refuses any class of ours
        return state | {"status": None if self.status is None else str(self.status)}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k not in ("checks", "status")})
        self.status = None if state["status"] is None else Status(state["status"])
        self.checks = [Validation(**c) for c in state["checks"]]
        if self.trainer is not None:  # before the fit loop decides whether the restored step ends training
            self.apply_budget(self.trainer)

    def setup(self, trainer, module, stage):
        self.trainer = trainer  # Lightning calls setup before it restores a checkpoint

    def on_train_start(self, trainer, module):
        if self.begin(int(trainer.estimated_stepping_batches)):
            self.apply_budget(trainer)

    def apply_budget(self, trainer) -> None:
        """The budget in steps (a pause before it ends this attempt there); the epoch limit no longer binds once
        the budget is extended. A pause is not a stop: the checkpoint saved there continues the same fit."""
        trainer.fit_loop.epoch_loop.max_steps = self.limit
        if self.extended:
            trainer.fit_loop.max_epochs = -1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.divergence.watch(loss, trainer.global_step)
        if self.extend(trainer.global_step):
            self.apply_budget(trainer)

    def diverged(self, trainer) -> bool:
        """What ``divergence`` saw since the last read, read now; every data-parallel worker stops together, or the
        others wait for it forever."""
        (seen,) = self.divergence.read()
        if trainer.strategy.reduce_boolean_decision(seen is not None, all=False):
            self.diverge(f"training loss {seen[1] if seen else 'not finite'} at step {seen[0] if seen else '?'}")
            return True
        return False

    def on_train_end(self, trainer, module):
        if self.status != Status.DIVERGED:  # between the last validation and the end of training
            self.diverged(trainer)

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking:
            return
        if self.status != Status.DIVERGED and self.diverged(trainer):  # trained past it: this validation is of it
            trainer.should_stop = True
            return
        metrics = trainer.callback_metrics
        accuracy = float(metrics.get(MONITOR, float("nan")))
        loss = float(metrics.get(LOSS, float("nan")))
        if self.validated(trainer.global_step, loss, accuracy, getattr(module, "train_flops", 0) / 1e15):
            trainer.should_stop = True

    # ---- the rules, without a Trainer: a fused trial keeps one Verdict per member (pipeline.training.fused_trial)
    def begin(self, budget: int) -> bool:
        """At the start of training: ``budget`` steps the first budget; False for a resumed trial, which keeps its
        own (extensions included)."""
        if self.base:
            return False
        self.base = self.budget = budget
        return True

    @property
    def limit(self) -> int:
        """The step this attempt trains to: the budget, or the pause before it."""
        return min(self.budget, self.pause_at or self.budget)

    @property
    def extended(self) -> bool:
        return self.budget > self.base

    def diverge(self, reason: str) -> None:
        self.status, self.reason = Status.DIVERGED, reason

    def extend(self, step: int) -> bool:
        """After training step ``step``: at the budget, doubles it (up to ``max_budget_factor`` times the first)
        while the trial is still learning and the evidence does not say it has converged. True if it did."""
        at_budget = step >= self.budget
        learning = self.status is None or (self.status == Status.SOLVED and not self.done)
        if at_budget and learning and self.budget < self.max_budget_factor * self.base:
            converged, _ = self.convergence.evidence(self.checks)
            if not converged:  # still improving (or too early to tell): the evidence, not the budget, decides
                self.budget = min(2 * self.budget, self.max_budget_factor * self.base)
                return True
        return False

    def validated(self, step: int, loss: float, accuracy: float, pflops: float) -> bool:
        """A validation at ``step`` (teacher-forced loss, final-answer accuracy; ``pflops`` the training compute so
        far): True if the trial stops here."""
        if self.done or self.status in (Status.DIVERGED, Status.UNSOLVED):
            return False
        if not (math.isfinite(loss) and math.isfinite(accuracy)):
            self.diverge(f"validation loss {loss} at step {step}")
            return True
        self.checks.append(Validation(step, loss, accuracy))
        if len(self.checks) >= self.patience:
            held = min(c.accuracy for c in self.checks[-self.patience :])
            self.sustained = max(self.sustained, held)
        # logged metrics are float32: 0.9 arrives as 0.8999999761, and must still count as reaching 0.9
        self.streak = self.streak + 1 if accuracy >= self.threshold - 1e-6 else 0
        if self.status is None and self.streak >= self.patience:
            self.status, self.solved_step, self.solved_pflops = Status.SOLVED, step, pflops
            self.reason = (
                f"validation accuracy >= {self.threshold:g} at {self.patience} consecutive checks (step {step})"
            )
        if self.status == Status.SOLVED and self.sustained >= self.target - 1e-6:
            if self.target > self.threshold:
                self.reason += f"; held the target {self.target:g} at step {step}"
            self.done = True
            return self.stop
        converged, evidence = self.convergence.evidence(self.checks)
        if converged and self.stop:
            self.converged = True
            if self.status == Status.SOLVED:
                self.done = True
                self.reason += f"; converged below the target {self.target:g}: {evidence}"
            else:
                self.status, self.reason = Status.UNSOLVED, f"converged below {self.threshold:g}: {evidence}"
            return True
        return False

    def outcome(self, trainer) -> tuple[Status, str]:
        """(status, reason) once ``fit`` has returned; ``converged`` is final then too."""
        return self.outcome_at(trainer.global_step)

    def outcome_at(self, step: int) -> tuple[Status, str]:
        """(status, reason) of a trial that stopped training at ``step``; ``converged`` is final then too."""
        if self.status is not None and (self.status in (Status.DIVERGED, Status.UNSOLVED) or self.done):
            return self.status, self.reason
        if self.pause_at is not None and step >= self.pause_at:
            return Status.PAUSED, f"rung at step {step}: awaiting the other learning rates"
        converged, evidence = self.convergence.evidence(self.checks)
        self.converged = converged
        if self.status == Status.SOLVED:  # the budget ended, or a fixed-budget trial, short of the target
            short = "converged" if converged else "budget: still improving"
            target = f" below the target {self.target:g}" if self.target > self.threshold else ""
            return self.status, f"{self.reason}; {short}{target} at step {step}: {evidence}"
        if converged:  # a fixed-budget trial, which never stops early
            return Status.UNSOLVED, f"converged below {self.threshold:g}: {evidence}"
        extended = f" ({self.budget // self.base}x the budget of {self.base})" if self.budget > self.base else ""
        return Status.UNDECIDED, f"budget: still improving at step {step}{extended}; {evidence}"
