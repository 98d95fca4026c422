"""Verdicts: why a trial stopped (solved, converged, diverged, budget), its budget's extensions, and which
learning-rate run a cell keeps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from pipeline.common import status
from pipeline.common.config import VerdictSection
from pipeline.training import verdict
from pipeline.training.train import TrialSpec, run_trial
from tests.helpers import dataset_fields, make_cell


def fake_trainer(budget: int = 1000):
    """What the stopping callbacks read of a Lightning Trainer, fitting on one process."""
    from lightning.pytorch.trainer.states import TrainerFn

    loop = SimpleNamespace(epoch_loop=SimpleNamespace(max_steps=budget), max_epochs=100)
    return SimpleNamespace(callback_metrics={}, global_step=0, current_epoch=0, should_stop=False,
                           sanity_checking=False, fast_dev_run=False, state=SimpleNamespace(fn=TrainerFn.FITTING),
                           strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision),
                           estimated_stepping_batches=budget, fit_loop=loop)


RULES = VerdictSection(convergence_window=0.5, convergence_tolerance=0.01, convergence_min_steps=200, min_delta=0.01)
RULE = verdict.Convergence.of(RULES)


def rules(patience=2, factor=8, stop=True) -> VerdictSection:
    return RULES.model_copy(update={"patience": patience, "max_budget_factor": factor, "stop_when_solved": stop})


def make(patience=2, factor=8, stop=True, budget=1000, target=None):
    cb = verdict.Verdict(0.9, rules(patience, factor, stop), target=target)
    trainer = fake_trainer(budget)
    cb.on_train_start(trainer, None)
    return cb, trainer


def validate(cb, trainer, accuracy, step, loss=1.0):
    trainer.global_step = step
    trainer.callback_metrics = {verdict.MONITOR: torch.tensor(accuracy), verdict.LOSS: torch.tensor(loss)}
    cb.on_validation_end(trainer, SimpleNamespace(train_flops=step * 1e12))


def train_to(cb, trainer, step):
    """Training steps up to ``step`` (or until the trainer stops or its budget ends)."""
    while trainer.global_step < min(step, trainer.fit_loop.epoch_loop.max_steps) and not trainer.should_stop:
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, 0)


def checks(points):
    return [verdict.Validation(step, loss, acc) for step, loss, acc in points]


def test_solved_needs_patience_consecutive_checks_at_the_threshold():
    cb, trainer = make(patience=2)
    for step, acc in [(10, 0.95), (20, 0.5), (30, 0.9), (40, 0.91)]:  # 0.9 is 0.8999999761 in float32
        assert not trainer.should_stop
        validate(cb, trainer, acc, step)
    assert trainer.should_stop and cb.outcome(trainer)[0] == "solved" and cb.solved_step == 40
    assert "2 consecutive checks (step 40)" in cb.outcome(trainer)[1]
    assert cb.solved_pflops == pytest.approx(40e12 / 1e15)


def test_a_trial_solved_at_the_threshold_trains_on_to_its_target_and_keeps_its_verdict():
    cb, trainer = make(patience=2, target=0.99)
    for step, acc in [(10, 0.92), (20, 0.95), (30, 0.99), (40, 0.97)]:
        validate(cb, trainer, acc, step)
    assert not trainer.should_stop and cb.status == "solved" and cb.solved_step == 20
    assert cb.sustained == pytest.approx(0.97, abs=1e-6)  # the best pair: (0.99, 0.97)
    for step, acc in [(50, 0.995), (60, 0.992)]:
        validate(cb, trainer, acc, step)
    status, reason = cb.outcome(trainer)
    assert trainer.should_stop and status == "solved" and cb.solved_step == 20 and cb.sustained >= 0.99
    assert "held the target 0.99 at step 60" in reason and not cb.converged


def test_a_trial_short_of_its_target_stops_when_converged_or_at_its_budget_solved_either_way():
    cb, trainer = make(patience=2, target=0.99, budget=100)
    for step in range(10, 301, 10):  # held 0.95 from step 10 on: converges after min_steps
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.95, step, loss=0.5)
        if trainer.should_stop:
            break
    status, reason = cb.outcome(trainer)
    assert status == "solved" and cb.converged and cb.sustained == pytest.approx(0.95, abs=1e-6) and cb.budget > 100
    assert "converged below the target 0.99" in reason
    cb, trainer = make(patience=2, target=0.99, budget=100, factor=2)
    for step in range(10, 201, 10):  # still improving when the doubled budget ends
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.9 + step / 10_000, step, loss=1.0 - step / 1000)
    status, reason = cb.outcome(trainer)
    assert status == "solved" and not cb.converged and cb.budget == 200
    assert "budget: still improving below the target 0.99 at step 200" in reason


def test_a_fixed_budget_records_the_solve_but_keeps_training():
    cb, trainer = make(patience=1, stop=False)
    validate(cb, trainer, 0.95, 10)
    validate(cb, trainer, 0.5, 20)
    assert not trainer.should_stop and cb.outcome(trainer)[0] == "solved" and cb.solved_step == 10


@pytest.mark.parametrize("points, converged", [
    # a flat plateau over the last half, past min_steps: converged
    ([(s, 2.0 - 0.001 * (s > 50), 0.05) for s in range(50, 401, 50)], True),
    # too early: the same plateau before min_steps
    ([(s, 2.0, 0.05) for s in range(50, 151, 50)], False),
    # a late jump: flat until step 350, then the loss falls inside the window
    ([(s, 2.0 if s <= 350 else 1.5, 0.05) for s in range(50, 401, 50)], False),
    # the accuracy alone still rising (the loss barely moves once the answer is mostly right)
    ([(s, 0.3, 0.5 + s / 4000) for s in range(50, 401, 50)], False),
    # the validation loss rising while the model memorises its training data: converged
    ([(s, 1.0 + s / 1000, 0.3) for s in range(50, 401, 50)], True),
    # a slow but steady fall, above the tolerance over the window: still improving
    ([(s, 2.0 - s / 1000, 0.05) for s in range(50, 401, 50)], False),
])
def test_convergence_is_no_gain_over_the_last_half_after_min_steps(points, converged):
    got, words = RULE.evidence(checks(points))
    assert got == converged, words
    if got:
        assert "validation loss" in words and "validation accuracy" in words


def test_the_window_grows_with_the_steps_trained():
    """A plateau of 150 steps ends a 250-step trial (window 125-250) but not a 400-step one that fell at 250."""
    points = [(s, 2.0 if s < 250 else 1.0, 0.0) for s in range(50, 401, 50)]
    assert RULE.evidence(checks(points[:5]))[0] is False  # steps 50..250: the fall at 250 is inside the window
    flat = [(s, 2.0, 0.0) for s in range(50, 251, 50)] + [(300, 2.0, 0.0)]
    assert RULE.evidence(checks(flat))[0] is True
    assert RULE.evidence(checks(points))[0] is False  # at 400 the window reaches back to 200: the fall is in it


def test_a_converged_trial_stops_unsolved_with_its_evidence():
    cb, trainer = make()
    for step in range(50, 1001, 50):
        train_to(cb, trainer, step)
        if trainer.should_stop:
            break
        validate(cb, trainer, 0.05, step, loss=2.0)
    status, reason = cb.outcome(trainer)
    assert trainer.should_stop and status == "unsolved" and trainer.global_step == 200  # min_steps
    assert reason.startswith("converged below 0.9: over steps 100-200 validation loss 2 -> 2 (gain 0.0%")


def test_a_trial_still_improving_at_its_budget_is_extended_then_undecided():
    """Budget 100, factor 8: doubled at 100, 200 and 400 while the loss keeps falling, then undecided at 800."""
    cb, trainer = make(budget=100)
    step = 0
    while not trainer.should_stop and trainer.global_step < trainer.fit_loop.epoch_loop.max_steps:
        step += 50
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.05, trainer.global_step, loss=2.0 - trainer.global_step / 1000)
    assert trainer.global_step == 800 and cb.budget == 800 and trainer.fit_loop.max_epochs == -1
    ended, reason = cb.outcome(trainer)
    assert ended == "undecided" and reason.startswith("budget: still improving at step 800 (8x the budget of 100)")
    assert not ended.decided and status.Status.UNSOLVED.decided


def test_a_converged_trial_is_not_extended():
    cb, trainer = make(budget=300)
    for step in range(50, 301, 50):
        validate(cb, trainer, 0.05, step, loss=2.0) if step < 300 else None
        train_to(cb, trainer, step)
    assert cb.budget == 300 and trainer.should_stop


def test_a_fixed_budget_is_never_extended_and_its_end_is_judged_by_the_same_rule():
    cb, trainer = make(budget=100, stop=False)
    for step in (50, 100):
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.05, step, loss=2.0 - step / 100)
    assert cb.budget == 100 and cb.outcome(trainer)[0] == "undecided"


def test_the_budget_survives_a_resume():
    cb, trainer = make(budget=100)
    for step in (50, 100, 150):
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.05, step, loss=2.0 - step / 1000)
    again, fresh = verdict.Verdict(0.9, rules()), fake_trainer(100)
    again.setup(fresh, None, "fit")
    again.load_state_dict(cb.state_dict())
    assert fresh.fit_loop.epoch_loop.max_steps == 200 and again.checks == cb.checks and again.base == 100


def test_a_solved_trial_paused_at_a_rung_resumes_from_a_weights_only_checkpoint(tmp_path):
    """A trial solved at the threshold but short of its target pauses at a halving rung; its checkpoint is loaded
    with weights_only=True (as the resume does), which refuses any class of ours: the status is saved as a string."""
    cb, trainer = make(target=0.99)
    for step in (50, 100):
        train_to(cb, trainer, step)
        validate(cb, trainer, 0.95, step)
    assert cb.status == status.Status.SOLVED
    torch.save({"callbacks": {"Verdict": cb.state_dict()}}, tmp_path / "c.ckpt")
    state = torch.load(tmp_path / "c.ckpt", weights_only=True)["callbacks"]["Verdict"]
    again = verdict.Verdict(0.9, rules(), target=0.99)
    again.setup(fake_trainer(1000), None, "fit")
    again.load_state_dict(state)
    assert again.status is status.Status.SOLVED and again.solved_step == cb.solved_step


def test_a_non_finite_loss_is_a_divergence_read_at_the_next_validation_or_at_the_end():
    """The training loss is watched on the device, never read back at a step: a loss not finite at step 7 stops the
    trial at the next validation (step 50, fewer than sweep.evaluation.val_every_steps later), its reason the step
    and loss of the divergence, and the validation's own metrics unread; at the end of training if none comes."""
    cb, trainer = make()
    for step, loss in ((6, 2.0), (7, float("nan")), (8, 2.0)):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, 0)
    assert not trainer.should_stop and cb.status is None  # nothing read back at a step
    validate(cb, trainer, 0.95, 50)
    assert trainer.should_stop and cb.outcome(trainer) == ("diverged", "training loss nan at step 7") and not cb.checks
    cb, trainer = make()
    trainer.global_step = 9
    cb.on_train_batch_end(trainer, None, {"loss": torch.tensor(float("inf"))}, None, 0)
    cb.on_train_end(trainer, None)
    assert cb.outcome(trainer) == ("diverged", "training loss inf at step 9")
    cb, trainer = make()
    validate(cb, trainer, 0.1, 50, loss=float("inf"))
    assert trainer.should_stop and cb.outcome(trainer) == ("diverged", "validation loss inf at step 50")


@pytest.mark.parametrize("accuracy, samples, near", [(0.9, 1000, True), (0.95, 1000, False), (0.88, 100, True),
                                                     (0.85, 1000, False), (0.5, 0, False), (math.nan, 100, False)])
def test_borderline_is_the_threshold_inside_the_95_percent_interval(accuracy, samples, near):
    assert status.borderline(accuracy, samples, 0.9) == near


def test_the_best_run_is_chosen_on_validation_never_on_test():
    runs = [{"lr": 1e-2, "status": "unsolved", "val_accuracy": 0.8, "final_accuracy": 0.99},
            {"lr": 1e-3, "status": "solved", "val_accuracy": 0.91, "final_accuracy": 0.88},
            {"lr": 1e-4, "status": "solved", "val_accuracy": 0.95, "final_accuracy": 0.5},
            {"lr": 1e-5, "status": "failed"}]
    assert status.best_run(runs)["lr"] == 1e-4
    assert status.best_run([runs[0], {"lr": 1, "status": "diverged", "val_accuracy": math.nan}])["lr"] == 1e-2
    assert status.best_run([{"lr": 1, "status": "failed"}])["status"] == "failed"
    # a run that might still solve the cell ranks above one that cannot
    assert status.best_run([runs[0], {"lr": 2, "status": "undecided", "val_accuracy": 0.5}])["lr"] == 2


def tiny_spec(tiny_cfg, tiny_data, **kw) -> TrialSpec:
    """A tiny trial of lis; ``kw``: its learning rate and settings, changed."""
    cell = make_cell("lis", 3, **dataset_fields(tiny_data, "lis", 3))
    return TrialSpec.for_cell(cell, {**dict(heads=2, dropout=0.0, batch_size=32, epochs=50, max_steps=40, lr=3e-3,
                                            weight_decay=0.0, warmup_fraction=0.0, grad_clip=None,
                                            precision="32-true", val_samples=32, val_every_steps=4, eval_samples=40,
                                            eval_batch_size=16, threads=1, use_gpu=False, max_budget_factor=1),
                                     **kw})


def test_a_trial_that_blows_up_is_diverged_and_not_scored(tiny_cfg, tiny_data):
    result = run_trial(tiny_spec(tiny_cfg, tiny_data, lr=1e12, optimizer="adam", max_steps=30))
    assert result["status"] == "diverged" and "training loss" in result["reason"]
    assert result["train_steps"] < 30 and math.isnan(result["final_accuracy"])


def test_a_real_trial_still_improving_goes_on_with_its_budget_doubled_then_is_undecided(tiny_cfg, tiny_data):
    result = run_trial(tiny_spec(tiny_cfg, tiny_data, max_steps=8, max_budget_factor=4, convergence_min_steps=10**6))
    assert result["status"] == "undecided" and result["train_steps"] == result["budget_steps"] == 32
    assert "(4x the budget of 8)" in result["reason"]


def test_the_learning_rate_is_constant_after_warm_up_whatever_the_budget(tiny_cfg, tiny_data):
    from pipeline.training.train import SequenceModel

    rates = []
    for budget in (800, 2400):
        module = SequenceModel(tiny_spec(tiny_cfg, tiny_data, warmup_fraction=0.1))
        sched = module.configure_optimizers_for(budget)["lr_scheduler"]["scheduler"]
        rates.append([sched.lr_lambdas[0](step) for step in (0, 79, 240, 799, 2399, 5000)])
    assert rates[0] == [1 / 80, 1.0, 1.0, 1.0, 1.0, 1.0] and rates[1][2:] == [1.0] * 4


def test_a_real_trial_stops_once_its_validation_reaches_the_threshold(tiny_cfg, tiny_data):
    """threshold 0.01 with patience 2: solved at a validation (every 4 steps) long before the budget."""
    result = run_trial(tiny_spec(tiny_cfg, tiny_data, threshold=0.01, patience=2, max_steps=400))
    assert result["status"] == "solved" and result["train_steps"] == result["solve_step"] < 400
    assert result["train_steps"] % 4 == 0
    assert result["val_accuracy"] >= 0.01 and 0 <= result["final_accuracy"] <= 1
