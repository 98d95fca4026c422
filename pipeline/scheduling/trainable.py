"""The Ray Tune trainable: one learning-rate run of a cell, in a Ray worker (``run_cell``).

It fetches the cell's datasets to the node, trains with Lightning (``pipeline/training/train.py``), reports to Tune and
checkpoints at every validation (with the worker's resource use, ``pipeline/training/system.py``), and reports the
final metrics with the verdict at the end. The driver
(``pipeline/sweep.py``) hands it to Tune by reference, so a worker imports this module and what it needs, not the
driver's stage module.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path

import lightning as L
import ray
import torch
from ray import tune

from pipeline.common.cell import CellSpec
from pipeline.data.storage import fetch
from pipeline.training.checkpoints import FILE, Resumable, write_meta
from pipeline.training.memory import DoesNotFit
from pipeline.training.status import Status
from pipeline.training.system import SystemSampler
from pipeline.training.train import SequenceModel, TrialSpec, run_trial
from pipeline.training.verdict import Verdict


class TuneCheckpoints(Resumable):
    """A trial's checkpoints in a Tune worker: each one goes to Tune with the trial's progress (Tune copies it to the
    storage), and a resumed checkpoint's validations are reported again."""

    def __init__(self, resume: Path | None, config: dict, where: dict, system: SystemSampler):
        super().__init__(resume, saving=True)
        self.trial_key, self.run_key = config["trial_key"], config["cell"]["run_key"]
        self.where, self.system = where, system

    def progress(self, trainer: L.Trainer, module: L.LightningModule, m: dict) -> dict:
        assert isinstance(module, SequenceModel)  # what run_trial trains
        return self.where | {
            "step": trainer.global_step,
            "train_pflops": module.train_flops / 1e15,
            "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0,
            **{k: float(m[k]) for k in ("train_loss", "val_loss", "val_token_accuracy", "val_accuracy") if k in m},
            **self.system.sample(),
        }

    def keep(self, trainer: L.Trainer, module: L.LightningModule, directory: Path) -> None:
        write_meta(directory, self.trial_key, self.run_key, trainer.global_step)
        tune.report(
            self.progress(trainer, module, trainer.callback_metrics),
            checkpoint=tune.Checkpoint.from_directory(directory),
        )

    def resumed(self, trainer: L.Trainer, module: L.LightningModule, metrics: dict) -> None:
        # the validations before the checkpoint, as the checkpoint holds them: the driver that logged them may
        # have died before its writes reached MLflow
        callbacks = trainer.callbacks  # type: ignore[attr-defined]  # set on the Trainer by its connector
        verdict = next(c for c in callbacks if isinstance(c, Verdict))
        tune.report(self.progress(trainer, module, metrics) | {"history": [vars(c) for c in verdict.checks]})


def run_cell(config: dict) -> None:
    """Ray Tune trainable (runs in a Ray worker): one learning-rate run of a cell, reporting and checkpointing
    at every validation, then the final metrics with the verdict. A retried trial continues from its last
    checkpoint (``tune.get_checkpoint``), a trial of a sweep that died, or one paused at a rung of successive
    halving (``config["pause_at"]``), from the checkpoint it left (``config["resume"]``)."""
    logging.getLogger("lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    node = ray.util.get_node_ip_address()
    cell = CellSpec(**config["cell"])
    cell = replace(
        cell,
        train_path=str(fetch(cell.train_path, node)),
        test_path=str(fetch(cell.test_path, node)),
        val_path=str(fetch(cell.val_path, node)),
    )
    spec = TrialSpec.for_cell(cell, config["train"], pause_at=config.get("pause_at"))
    if spec.settings.use_gpu and not torch.cuda.is_available():
        raise RuntimeError(f"the profile asks for GPUs (sweep.gpus_per_trial > 0) but Ray node {node} has none")
    where = {"node": node}
    system = SystemSampler(spec.settings.use_gpu)
    checkpoint = tune.get_checkpoint() or (tune.Checkpoint(config["resume"]) if config.get("resume") else None)
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as directory:
        resume = Path(directory) / FILE if directory else None
        try:
            result = run_trial(spec, checkpoints=TuneCheckpoints(resume, config, where, system))
        except DoesNotFit as err:  # recorded as failed with how much it needs: a retry would not fit either
            result = {"status": Status.FAILED, "reason": f"does not fit: {err}", "train_steps": 0}
    tune.report(where | result | {"step": result["train_steps"], "final": True})
