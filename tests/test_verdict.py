"""Verdicts: why a trial stopped (solved, plateau, budget, diverged) and which learning-rate run a cell keeps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.training import verdict
from pipeline.data.datasets import dataset_path, read_dataset
from pipeline.training.train import TrialSpec, run_trial, split_validation


def fake_trainer():
    """What the stopping callbacks read of a Lightning Trainer, fitting on one process."""
    from lightning.pytorch.trainer.states import TrainerFn

    return SimpleNamespace(callback_metrics={}, global_step=0, current_epoch=0, should_stop=False,
                           sanity_checking=False, fast_dev_run=False, state=SimpleNamespace(fn=TrainerFn.FITTING),
                           strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision))


def validate(cbs, trainer, accuracy, step):
    trainer.global_step = step
    trainer.callback_metrics = {verdict.MONITOR: torch.tensor(accuracy)}
    for cb in cbs:
        cb.on_validation_end(trainer, SimpleNamespace(train_flops=step * 1e12))


def test_solved_needs_patience_consecutive_checks_at_the_threshold():
    cbs = verdict.callbacks(threshold=0.9, patience=2, plateau_checks=None, min_delta=0.01)
    trainer = fake_trainer()
    for step, acc in [(10, 0.95), (20, 0.5), (30, 0.9), (40, 0.91)]:  # 0.9 is 0.8999999761 in float32
        assert not trainer.should_stop
        validate(cbs, trainer, acc, step)
    assert trainer.should_stop and cbs[0].outcome(trainer)[0] == "solved" and cbs[0].solved_step == 40
    assert "2 consecutive checks (step 40)" in cbs[0].outcome(trainer)[1]
    assert cbs[0].solved_pflops == pytest.approx(40e12 / 1e15)


def test_a_fixed_budget_records_the_solve_but_keeps_training():
    cbs = verdict.callbacks(threshold=0.9, patience=1, plateau_checks=3, min_delta=0.01, stop_when_solved=False)
    assert len(cbs) == 1  # no plateau stop either: the grid runs every step
    trainer = fake_trainer()
    validate(cbs, trainer, 0.95, 10)
    validate(cbs, trainer, 0.5, 20)
    assert not trainer.should_stop and cbs[0].outcome(trainer)[0] == "solved" and cbs[0].solved_step == 10


def test_a_plateau_ends_unsolved_with_its_reason():
    cbs = verdict.callbacks(threshold=0.9, patience=1, plateau_checks=3, min_delta=0.05)
    trainer = fake_trainer()
    for i, acc in enumerate([0.3, 0.32, 0.33, 0.34, 0.2]):
        if trainer.should_stop:
            break
        validate(cbs, trainer, acc, 10 * (i + 1))
    status, reason = cbs[0].outcome(trainer)
    assert trainer.should_stop and status == "unsolved" and reason.startswith("plateau: no gain of 0.05")
    assert "over 3 checks" in reason


def test_without_a_stop_the_budget_is_the_reason():
    cbs = verdict.callbacks(threshold=0.9, patience=1, plateau_checks=None, min_delta=0.01)
    trainer = fake_trainer()
    validate(cbs, trainer, 0.2, 100)
    assert cbs[0].outcome(trainer) == ("unsolved", "budget: stopped at step 100 (epoch 0)")


def test_a_non_finite_loss_is_a_divergence():
    cbs = verdict.callbacks(threshold=0.9, patience=1, plateau_checks=None, min_delta=0.01)
    trainer = fake_trainer()
    trainer.global_step = 7
    cbs[0].on_train_batch_end(trainer, None, {"loss": torch.tensor(float("nan"))}, None, 0)
    assert trainer.should_stop and cbs[0].outcome(trainer)[0] == "diverged"


def test_the_best_run_is_chosen_on_validation_never_on_test():
    runs = [{"lr": 1e-2, "status": "unsolved", "val_accuracy": 0.8, "final_accuracy": 0.99},
            {"lr": 1e-3, "status": "solved", "val_accuracy": 0.91, "final_accuracy": 0.88},
            {"lr": 1e-4, "status": "solved", "val_accuracy": 0.95, "final_accuracy": 0.5},
            {"lr": 1e-5, "status": "failed"}]
    assert verdict.best_run(runs)["lr"] == 1e-4
    assert verdict.best_run([runs[0], {"lr": 1, "status": "diverged", "val_accuracy": math.nan}])["lr"] == 1e-2
    assert verdict.best_run([{"lr": 1, "status": "failed"}])["status"] == "failed"


def test_validation_is_held_out_of_train(tiny_data):
    data = read_dataset(dataset_path(tiny_data, "lis", 3, "train"))
    train, val = split_validation(data, 32)
    assert len(train) + len(val) == len(data) and len(val) == 32
    seen = {tuple(train.sequence(i)) for i in range(len(train))}
    assert not any(tuple(val.sequence(i)) in seen for i in range(len(val)))
    assert np.array_equal(val.sequence(0), data.sequence(len(data) - 32))
    assert len(split_validation(data, 10_000)[1]) == len(data) // 2  # never more than half the file


def tiny_spec(tiny_cfg, tiny_data, **kw) -> TrialSpec:
    train, test = (dataset_path(tiny_data, "lis", 3, s) for s in ("train", "test"))
    meta = read_dataset(train).meta
    return TrialSpec(**{**dict(arch="standard", width=16, depth=1, seed=0, train_path=str(train),
                                 test_path=str(test), max_len=meta["stats"]["max_length"],
                                 vocab_size=len(meta["vocab"]), heads=2, dropout=0.0, arch_options={},
                                 batch_size=32, epochs=50, max_steps=40, lr=3e-3, weight_decay=0.0,
                                 warmup_fraction=0.0, grad_clip=None, precision="32-true", val_samples=32,
                                 val_every_steps=4, eval_samples=40, eval_batch_size=16, threads=1, use_gpu=False),
                        **kw})


def test_a_trial_that_blows_up_is_diverged_and_not_scored(tiny_cfg, tiny_data):
    result = run_trial(tiny_spec(tiny_cfg, tiny_data, lr=1e12, optimizer="adam", max_steps=30))
    assert result["status"] == "diverged" and "training loss" in result["reason"]
    assert result["train_steps"] < 30 and math.isnan(result["final_accuracy"])


def test_a_real_trial_stops_once_its_validation_reaches_the_threshold(tiny_cfg, tiny_data):
    """threshold 0.01 with patience 2: solved at a validation (every 4 steps) long before the budget."""
    result = run_trial(tiny_spec(tiny_cfg, tiny_data, threshold=0.01, patience=2, max_steps=400))
    assert result["status"] == "solved" and result["train_steps"] == result["solve_step"] < 400
    assert result["train_steps"] % 4 == 0
    assert result["val_accuracy"] >= 0.01 and 0 <= result["final_accuracy"] <= 1
