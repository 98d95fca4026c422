"""One typed record per concept: a trial's settings (strict, defaults from the config), the statuses' orders."""

from __future__ import annotations

import pytest

from pipeline.common.config import ResourcesSection, load_config, profiles
from pipeline.common.status import Status, best_run
from pipeline.reporting.claims import ClaimStatus
from pipeline.training.settings import SECTION_OF, SECTIONS, TrainSettings
from pipeline.training.train import TrialSpec
from tests.helpers import make_cell

CELL = make_cell()


def test_training_settings_are_the_sections_a_trial_reads_with_their_defaults(tiny_cfg):
    default = TrainSettings()
    for name, section in SECTIONS.items():
        assert isinstance(getattr(default, name), section) and getattr(default, name) == section()
    assert default.resources == ResourcesSection().in_trial()  # the trial's view, from the one set of defaults
    settings = TrainSettings.of(tiny_cfg)
    assert settings.optim is tiny_cfg.sweep.optim and settings.verdict is tiny_cfg.sweep.verdict
    assert settings.threshold == tiny_cfg.report.accuracy_threshold and settings.targets == {}
    assert TrainSettings.of(tiny_cfg, {"dyck": 0.99}).targets == {"dyck": 0.99}
    # flat for a trial and MLflow, and back: every setting a trial reads survives; the sweep's own keys stay out
    params = settings.params()
    assert TrainSettings.from_params(params).params() == params and params["batch_size"] == 32
    assert not {"lr", "lrs", "arch_lrs", "arch_options", "cpus_per_trial", "fuse"} & set(params)
    assert settings.replaced(max_steps=4).optim.max_steps == 4 and settings.optim.max_steps == 8
    # one flat name, one section: no key of a trial's sections is in two of them
    assert len(SECTION_OF) == sum(len(section.model_fields) for section in SECTIONS.values())


@pytest.mark.parametrize("profile", profiles())
def test_a_trial_rebuilds_every_setting_of_every_profile_as_the_profile_gives_it(profile):
    """The record a trial rebuilds from what it receives holds the profile's every key, none at a default the
    profile overrides: its sections are the config's, its resources the trial's view of them."""
    cfg = load_config(profile=profile)
    rebuilt = TrainSettings.from_params(TrainSettings.of(cfg).params())
    for name in SECTIONS.keys() - {"resources"}:
        assert getattr(rebuilt, name) == getattr(cfg.sweep, name), name
    assert rebuilt.resources == cfg.sweep.resources.in_trial()
    assert rebuilt.resources.threads == cfg.sweep.resources.cpus_per_trial
    assert rebuilt.resources.use_gpu == (cfg.sweep.resources.gpus_per_trial > 0)


def test_a_trial_spec_takes_its_cell_and_settings_and_refuses_an_unknown_setting(tiny_cfg):
    train = TrainSettings.of(tiny_cfg).params() | {"lr": 1e-3}
    spec = TrialSpec.for_cell(CELL, train)
    batch = tiny_cfg.sweep.optim.batch_size
    assert (spec.cell.arch, spec.lr, spec.settings.optim.batch_size) == ("standard", 1e-3, batch)
    with pytest.raises(TypeError, match="warmup_steps"):
        TrialSpec.for_cell(CELL, train | {"warmup_steps": 10})
    with pytest.raises(TypeError, match="fuse"):  # a key of a section that is the sweep's, not a trial's
        TrialSpec.for_cell(CELL, train | {"fuse": "off"})
    with pytest.raises(TypeError, match="lr"):
        TrialSpec.for_cell(CELL, TrainSettings.of(tiny_cfg).params())


def test_statuses_carry_their_order():
    assert [s.rank for s in Status] == list(range(7)) and Status.SOLVED == "solved"
    assert Status.DIVERGED.rank < Status.DROPPED.rank < Status.FAILED.rank  # a dropped rate ranks below any verdict
    runs = [{"status": s, "val_accuracy": 0.5, "lr": 1.0} for s in ("failed", "diverged", "unsolved")]
    assert best_run(runs)["status"] == "unsolved"
    assert best_run([*runs, {"status": "undecided", "val_accuracy": 0.1, "lr": 2.0}])["status"] == "undecided"
    assert [s for s in Status if s.decided] == ["solved", "unsolved"]
    assert [s for s in Status if s.verdict] == ["solved", "undecided", "unsolved", "diverged"]
    assert ClaimStatus.HOLDS.rank < ClaimStatus.NOT_TESTED.rank < ClaimStatus.FAILS.rank
