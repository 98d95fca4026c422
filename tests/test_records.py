"""One typed record per concept: a trial's settings (strict, defaults from the config), the statuses' orders."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest

from pipeline.common.config import SweepConfig
from pipeline.reporting.claims import ClaimStatus
from pipeline.training.settings import TrainSettings
from pipeline.training.status import Status, best_run
from pipeline.training.train import TrialSpec
from tests.helpers import make_cell

CELL = make_cell()


def test_training_settings_are_the_sweep_sections_keys_with_its_defaults(tiny_cfg):
    derived = {"threshold", "targets", "threads", "use_gpu", "gpu_share", "workers"}
    for f in fields(TrainSettings):
        if f.name not in derived:
            assert f.name in SweepConfig.model_fields and f.default == SweepConfig.model_fields[f.name].default
    settings = TrainSettings.of(tiny_cfg)
    assert settings.batch_size == tiny_cfg.sweep.batch_size
    assert settings.threshold == tiny_cfg.report.accuracy_threshold and settings.targets == {}
    assert TrainSettings.of(tiny_cfg, {"dyck": 0.99}).targets == {"dyck": 0.99}


def test_a_trial_spec_takes_its_cell_and_settings_and_refuses_an_unknown_setting(tiny_cfg):
    train = asdict(TrainSettings.of(tiny_cfg)) | {"lr": 1e-3}
    spec = TrialSpec.for_cell(CELL, train)
    assert (spec.cell.arch, spec.lr, spec.settings.batch_size) == ("standard", 1e-3, tiny_cfg.sweep.batch_size)
    with pytest.raises(TypeError, match="warmup_steps"):
        TrialSpec.for_cell(CELL, train | {"warmup_steps": 10})
    with pytest.raises(TypeError, match="lr"):
        TrialSpec.for_cell(CELL, asdict(TrainSettings.of(tiny_cfg)))


def test_statuses_carry_their_order():
    assert [s.rank for s in Status] == list(range(7)) and Status.SOLVED == "solved"
    assert Status.DIVERGED.rank < Status.DROPPED.rank < Status.FAILED.rank  # a dropped rate ranks below any verdict
    runs = [{"status": s, "val_accuracy": 0.5, "lr": 1.0} for s in ("failed", "diverged", "unsolved")]
    assert best_run(runs)["status"] == "unsolved"
    assert best_run([*runs, {"status": "undecided", "val_accuracy": 0.1, "lr": 2.0}])["status"] == "undecided"
    assert [s for s in Status if s.decided] == ["solved", "unsolved"]
    assert [s for s in Status if s.verdict] == ["solved", "undecided", "unsolved", "diverged"]
    assert ClaimStatus.HOLDS.rank < ClaimStatus.NOT_TESTED.rank < ClaimStatus.FAILS.rank
