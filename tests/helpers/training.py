"""Training helpers: `Curve`, a trial's (step, training loss, validation accuracy) at each validation; `Copies`, its
checkpoints as a test keeps them (`MemberCopies`, a fused trial's); `with_settings`, a trial under other settings;
`short_trial`, a 20-step trial on the tiny profile; `needs_cpu_bf16`, a skip where this CPU cannot train an
architecture in bf16."""

import dataclasses
import shutil

import lightning as L
import pytest

import models
from pipeline.training.checkpoints import Resumable
from pipeline.training.fused_trial import MemberCheckpoints


class Curve(L.Callback):
    """(step, training loss, validation accuracy) at every validation."""

    def __init__(self):
        self.points = []

    def on_validation_end(self, trainer, module):
        m = trainer.callback_metrics
        self.points.append((trainer.global_step, float(m["train_loss"]), float(m["val_accuracy"])))


class Copies(Resumable):
    """A trial's checkpoints, resumed from ``resume``; with ``folder``, each one saved is copied there (``saved``:
    step -> its copy). ``told``: what the resumed checkpoint said, (step, training loss, validation accuracy)."""

    def __init__(self, resume=None, folder=None):
        super().__init__(resume, saving=folder is not None)
        self.folder, self.saved, self.told = folder, {}, []

    def keep(self, trainer, module, directory):
        step = trainer.global_step
        self.saved[step] = shutil.copytree(directory, self.folder / f"step-{step}")

    def resumed(self, trainer, module, metrics):
        self.told.append((trainer.global_step, metrics["train_loss"], metrics["val_accuracy"]))


class MemberCopies(MemberCheckpoints):
    """A fused trial's checkpoints (``run_fused``'s ``checkpoints``, with ``folder`` bound): each save, a directory
    per member, copied to ``folder``/step-N. ``told``: each step a resumed checkpoint reported again, if given."""

    def __init__(self, *args, folder, told=None, **kwargs):
        super().__init__(*args, saving=True, **kwargs)
        self.folder, self.told = folder, told

    def keep(self, trainer, module, directory):
        shutil.copytree(directory, self.folder / f"step-{trainer.global_step}")

    def resumed(self, trainer, module, metrics):
        if self.told is not None:
            self.told.append(trainer.global_step)


def with_settings(spec, **settings):
    """The trial ``spec`` with ``settings`` (``TrainSettings.params`` names) changed."""
    return dataclasses.replace(spec, settings=spec.settings.replaced(**settings))


def short_trial(cfg, data, **settings) -> dict:
    """A 20-step trial of the standard Transformer on the tiny profile's lis, validated every 10 steps (``settings``
    override the profile's): its result, as ``run_trial`` returns it. The GPU tests run it on CUDA in bf16; the
    kit's test runs it on the CPU without Ray, MLflow and DVC."""
    from pipeline.training.settings import TrainSettings
    from pipeline.training.train import TrialSpec, run_trial
    from tests.helpers import dataset_fields, make_cell

    size = cfg.generate.datasets["lis"][0]
    cell = make_cell("lis", size, "standard", 32, 2, 0, **dataset_fields(data, "lis", size))
    # epochs enough that max_steps, not the tiny profile's one epoch of 9 steps, ends the budget, never extended
    base = TrainSettings.of(cfg).params() | {"max_steps": 20, "epochs": 10, "val_every_steps": 10,
                                             "max_budget_factor": 1}
    return run_trial(TrialSpec.for_cell(cell, base | settings | {"lr": 3e-3}))


def needs_cpu_bf16(arch: str) -> None:
    """Skips the test, saying why, where this machine's CPU cannot train ``arch`` in bf16 (``models.bf16_on_cpu``:
    the LSTM without AVX-512), which the product refuses before compute (tests/test_precision.py)."""
    if why := models.bf16_on_cpu(arch):
        pytest.skip(why)

