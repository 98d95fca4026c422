"""Checkpoint and resume of one trial: a trial killed at step s continues from its last validation before s,
as if it had never stopped.

``Resumable``, a Lightning callback: at every validation, Lightning's own checkpoint of the whole fit (weights,
optimiser, learning-rate schedule, loop counters, the stopping callbacks' state) plus what Lightning leaves out:
torch's RNG, the CPU's and the GPU's (dropout), the training sampler's place in its epoch, the compute and time
spent so far. The Tune worker's ``Resumable`` hands the directory to ``tune.report(..., checkpoint=...)``, which
copies it to ``cluster.storage_path`` and keeps the newest ``sweep.runs.checkpoints_to_keep``. Resuming is
Lightning's ``fit(ckpt_path=..., weights_only=True)``: the file holds tensors and plain values only. What the
storage holds of them, as the driver finds and deletes them: ``pipeline.training.checkpoint_store``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import lightning as L
import torch

from pipeline.training.batches import LengthBuckets

FILE = "trial.ckpt"  # Lightning's checkpoint of the fit


class Resumable(L.Callback):
    """A trial's checkpoints, the one callback that saves and resumes its fit. ``resume``: the checkpoint file to
    continue from, if any. With ``saving``, saves the fit at every validation and hands the directory to ``keep``,
    then deletes it; a resumed checkpoint's validation metrics go to ``resumed``, once. On resume, puts back what
    Lightning does not (RNG, the sampler's place, compute and time so far).

    As is, it keeps nothing and tells no one: a trial outside Tune (``saving`` off), or a data-parallel rank > 0,
    which saves beside rank 0 (a collective) and leaves the checkpoint to it. The Tune worker's subclass
    (``pipeline/scheduling/trainable.py``) hands each checkpoint to Tune."""

    def __init__(self, resume: Path | None = None, saving: bool = False):
        self.resume, self.saving = resume, saving
        self.sampler: LengthBuckets | None = None  # of the fit it is attached to
        self.scratch: Path | None = None
        self.trainer: L.Trainer | None = None
        self.rng: torch.Tensor | None = None  # to restore once training restarts
        self.seconds_before = 0.0  # training time of earlier attempts
        self.started = 0.0  # when this attempt's fit was attached, then when its training started
        self.resumed_step: int | None = None
        self.heard = False  # ``resumed`` was told
        self.stop = False  # the fit had decided to stop when it was saved (killed while scoring the test set)
        self.metrics: dict[str, float] = {}  # the last validation's metrics, as saved
        self.saves, self.save_seconds, self.save_bytes = 0, 0.0, 0

    def for_rank(self) -> Resumable:
        """What a data-parallel rank > 0 of this trial runs: the same resume and saving, nothing kept or told (a
        plain ``Resumable``, so that it pickles into the rank's process)."""
        return Resumable(self.resume, self.saving)

    def attach(self, sampler: LengthBuckets, scratch: Path) -> None:
        """The fit this callback saves and restores: its training sampler, and where its checkpoints are written
        before ``keep`` takes them."""
        self.sampler, self.scratch, self.started = sampler, scratch, time.perf_counter()

    def keep(self, trainer: L.Trainer, module: L.LightningModule, directory: Path) -> None:
        """A checkpoint just saved in ``directory``, deleted on return."""

    def resumed(self, trainer: L.Trainer, module: L.LightningModule, metrics: dict) -> None:
        """The resumed checkpoint's validation metrics, which its sweep may not have recorded before it died."""

    @property
    def state_key(self) -> str:
        # Lightning's default is the class's name: rank 0 saves the state of its subclass, which the other ranks'
        # plain Resumable must find
        return "Resumable"

    def setup(self, trainer, module, stage):
        self.trainer = trainer

    def elapsed(self) -> float:
        """Training seconds over every attempt of this trial."""
        return self.seconds_before + time.perf_counter() - self.started

    def state_dict(self) -> dict:
        trainer = self.trainer
        sampler = self.sampler
        assert trainer is not None and sampler is not None  # attached, and set up before Lightning saves
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed  # batches of this epoch trained
        # every data-parallel worker's RNG (their dropout draws differ), gathered: only the first one writes; on a
        # GPU its generator too, which draws the dropout masks there
        device = trainer.strategy.root_device
        state = torch.get_rng_state()
        if device.type == "cuda":
            state = torch.cat([state, torch.cuda.get_rng_state(device)])
        rng = trainer.strategy.all_gather(state.to(device))
        return {
            "rng": rng.reshape(trainer.world_size, -1).cpu(),
            "epoch": sampler.epoch - 1,
            "batches_done": done,
            "seconds": self.elapsed(),
            "step": trainer.global_step,
            "stop": trainer.should_stop,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        assert self.trainer is not None and self.sampler is not None  # attached, and set up before it restores
        self.rng = state["rng"][self.trainer.global_rank].clone()  # its own storage: torch reads from offset 0
        self.seconds_before, self.resumed_step = state["seconds"], state["step"]
        self.stop, self.metrics = state["stop"], state["metrics"]
        self.sampler.resume(state["epoch"], state["batches_done"])

    def on_train_start(self, trainer, module):
        # after Lightning has opened the training loader (which draws a seed from torch's RNG): from here on the
        # resumed run draws exactly what the uninterrupted one drew
        if self.rng is not None:
            cpu = torch.get_rng_state().numel()
            torch.set_rng_state(self.rng[:cpu])
            if len(self.rng) > cpu:
                torch.cuda.set_rng_state(self.rng[cpu:], trainer.strategy.root_device)
            self.rng = None
        trainer.should_stop = trainer.should_stop or self.stop
        self.started = time.perf_counter()
        self.hear_resumed(trainer, module)

    def on_fit_end(self, trainer, module):
        self.hear_resumed(trainer, module)  # a checkpoint at the end of its budget trains no more steps

    def hear_resumed(self, trainer, module) -> None:
        """Once: the checkpoint's metrics, which its sweep may not have recorded before it died."""
        if self.resumed_step is not None and not self.heard:
            self.heard = True
            self.resumed(trainer, module, self.metrics)

    def last_metrics(self) -> dict[str, float]:
        """The newest validation's metrics, this attempt's or (if it validated no more) the checkpoint's."""
        assert self.trainer is not None  # asked after the fit, which called setup
        return self.metrics | {k: float(v) for k, v in self.trainer.callback_metrics.items()}

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking or not self.saving:
            return
        assert self.scratch is not None  # attached before the fit
        start = time.perf_counter()
        directory = self.scratch / f"step-{trainer.global_step}"
        directory.mkdir(parents=True, exist_ok=True)
        self.save_bytes = self.write(trainer, module, directory)
        self.keep(trainer, module, directory)
        shutil.rmtree(directory)  # kept: Tune has copied it to storage
        self.saves += 1
        self.save_seconds += time.perf_counter() - start

    def write(self, trainer: L.Trainer, module: L.LightningModule, directory: Path) -> int:
        """Saves the fit into ``directory``; returns the bytes written. A fused trial's writes one checkpoint per
        member (``pipeline.training.fused_trial.MemberCheckpoints``)."""
        trainer.save_checkpoint(directory / FILE, weights_only=False)  # the whole fit, not just weights
        # a data-parallel rank > 0 saves with rank 0 (a collective), which alone writes the file
        return sum(f.stat().st_size for f in directory.iterdir())
