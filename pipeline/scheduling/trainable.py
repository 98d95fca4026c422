"""The Ray Tune trainable: one learning-rate run of a cell, or a fused trial of several (``sweep.resources.fuse``), in a
Ray worker (``run_cell``).

It fetches the cell's datasets to the node, trains with Lightning (``pipeline/training/train.py``; a fused trial's
members as one model, ``pipeline/training/fused_trial.py``), reports to Tune and checkpoints at every validation
(with the worker's resource use, ``pipeline/training/system.py``), and reports the final metrics with the verdict at
the end. A fused trial's reports list its members (``members``: each one's trial key, metrics, verdict) and its
checkpoints hold a directory per member, each a separate trial's checkpoint. The driver
(``pipeline/scheduling/driver.py``) hands it to Tune by reference, so a worker imports this module and what it needs,
not the driver's module.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import lightning as L
import ray
from ray import tune

from pipeline.common.cell import CellSpec
from pipeline.common.cuda import cuda_problem
from pipeline.data.storage import fetch
from pipeline.training.checkpoint_store import write_meta
from pipeline.training.checkpoints import FILE, Resumable
from pipeline.training.fused_trial import FusedSequenceModel, MemberCheckpoints, run_fused
from pipeline.training.members import members
from pipeline.training.memory import DoesNotFit
from pipeline.training.system import SystemSampler
from pipeline.training.train import SequenceModel, TrialSpec, run_trial
from pipeline.training.verdict import Verdict

VALIDATION = ("train_loss", "val_loss", "val_token_accuracy", "val_accuracy")  # what a validation reports


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
            **{k: float(m[k]) for k in VALIDATION if k in m},
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


class TuneMemberCheckpoints(MemberCheckpoints):
    """A fused trial's checkpoints in a Tune worker: each save (a directory per member) goes to Tune with each
    member's progress, and a resumed checkpoint's validations are reported again, member by member."""

    def __init__(
        self,
        names: Sequence[str],
        store: Path,
        resume: Path | None = None,
        carried: Sequence[str] = (),
        *,
        run_key: str,
        where: dict,
        system: SystemSampler,
    ):
        super().__init__(names, store, resume, saving=True, carried=carried, run_key=run_key)
        self.where, self.system = where, system

    def progress(self, trainer: L.Trainer, module: FusedSequenceModel, ks: list[int], history: bool) -> dict:
        rates = trainer.optimizers[0].rates() if trainer.optimizers else [0.0] * len(self.names)  # type: ignore
        reports = [
            {
                "trial_key": self.names[k],
                "step": trainer.global_step,
                "train_pflops": module.member_flops[k] / 1e15,
                "lr": rates[k],
                **{m: module.members.metrics[k][m] for m in VALIDATION if m in module.members.metrics[k]},
            }
            | ({"history": [vars(c) for c in module.members.verdicts[k].checks]} if history else {})
            for k in ks
        ]
        return self.where | {"step": trainer.global_step, "members": reports, **self.system.sample()}

    def keep(self, trainer: L.Trainer, module: L.LightningModule, directory: Path) -> None:
        assert isinstance(module, FusedSequenceModel)  # what run_fused trains
        step = trainer.global_step
        tune.report(
            self.progress(trainer, module, self.saved_now(module, step), history=False),
            checkpoint=tune.Checkpoint.from_directory(directory),
        )

    def resumed(self, trainer: L.Trainer, module: L.LightningModule, metrics: dict) -> None:
        # each member's validations before the checkpoint, as the checkpoint holds them
        assert isinstance(module, FusedSequenceModel)
        tune.report(self.progress(trainer, module, list(range(len(self.names))), history=True))


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
    specs = [
        TrialSpec.for_cell(cell, config["train"] | {"lr": m["lr"]}, pause_at=config.get("pause_at"))
        for m in members(config)
    ]
    if specs[0].settings.resources.use_gpu and (why := cuda_problem()):
        raise RuntimeError(
            f"the profile asks for GPUs (sweep.resources.gpus_per_trial > 0), but on Ray node {node} {why}"
        )
    where = {"node": node}
    system = SystemSampler(specs[0].settings.resources.use_gpu)
    if "members" in config:
        run_members(config, specs, where, system)
        return
    spec = specs[0]
    checkpoint = tune.get_checkpoint() or (tune.Checkpoint(config["resume"]) if config.get("resume") else None)
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as directory:
        resume = Path(directory) / FILE if directory else None
        try:
            result = run_trial(spec, checkpoints=TuneCheckpoints(resume, config, where, system))
        except DoesNotFit as err:  # recorded as failed with how much it needs: a retry would not fit either
            result = err.record()
    tune.report(where | result | {"step": result["train_steps"], "final": True})


def run_members(config: dict, specs: list[TrialSpec], where: dict, system: SystemSampler) -> None:
    """A fused trial (``config["members"]``), each member continuing from its directory of the trial's own last
    checkpoint (a retry), else from the checkpoint its config names (a rung's, or a dead sweep's), else from the
    start; its final report lists each member's record."""
    keys = [m["trial_key"] for m in members(config)]
    own = tune.get_checkpoint()
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(own.as_directory())) if own else None
        resumes: list[Path | None] = []
        for key, member in zip(keys, members(config)):
            if folder is not None and (folder / key / FILE).exists():
                resumes.append(folder / key)
            elif member.get("resume"):
                resumes.append(Path(stack.enter_context(tune.Checkpoint(member["resume"]).as_directory())))
            else:
                resumes.append(None)
        saver = functools.partial(TuneMemberCheckpoints, where=where, system=system, run_key=config["cell"]["run_key"])
        results = run_fused(specs, keys, resumes, checkpoints=saver)
    reports = [result | {"trial_key": key, "step": result["train_steps"]} for key, result in zip(keys, results)]
    tune.report(where | {"step": max(r["step"] for r in reports), "final": True, "members": reports})
