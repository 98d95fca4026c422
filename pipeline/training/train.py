"""One trial: train an architecture on one dataset with Lightning, then score it.

Task families (``family`` in the dataset metadata):
- ``cot`` and ``classify``: next-token cross-entropy on every token after the prompt (chain of thought or the
  label, then <eos>). Final score: decode greedily from the prompt with the model's cache and compare the token
  just before the first <eos> with the answer (the DP paper's final-answer accuracy; for a classifier, the
  label read out after the input).
- ``ncp`` (next-character prediction, eq_ncp): at every prefix the target is the set of valid next tokens (any
  symbol or the separator before it, exactly the copied symbol after it), learned by a per-token sigmoid. Final
  score: a sequence counts only if every prefix's thresholded prediction (0.5) equals its target set.
Validation: the first ``val_samples`` samples of the dataset's validation file, drawn as the test set is (the
distribution the papers score; disjoint from train and test when the data is generated with ``unique``); the
training file is trained on whole. Every validation logs the teacher-forced loss and token accuracy and the
final-answer accuracy (``val_accuracy``, scored as the test set is), which decides when the trial is solved
(``pipeline/training/verdict.py``). The test set is scored once, at the end. Batches come from
``pipeline/training/batches.py``, greedy final answers from ``pipeline/training/evaluation.py``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader

import models
from pipeline.common.cell import CellSpec
from pipeline.common.config import StepMode, TrialResources
from pipeline.common.locks import scratch_dir
from pipeline.common.status import Status
from pipeline.data.datasets import Dataset, read_dataset
from pipeline.training import distributed
from pipeline.training.batches import IGNORE, Batch, LengthBuckets, loader
from pipeline.training.checkpoints import Resumable
from pipeline.training.evaluation import greedy_accuracies
from pipeline.training.memory import budget_bytes, fit_memory, memory_cap
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import StepForward, pad_to
from pipeline.training.verdict import Verdict


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One trial: a cell of the grid (its model and data), the sweep's training settings, and a learning rate. It
    crosses to a Ray worker as the searcher's plain dicts (``for_cell`` rebuilds it there), and to a data-parallel
    trial's other ranks pickled."""

    cell: CellSpec
    settings: TrainSettings
    lr: float
    pause_at: int | None = None  # successive halving: this attempt pauses at this step (a rung) without a verdict

    @classmethod
    def for_cell(cls, cell: CellSpec, train: dict, pause_at: int | None = None) -> TrialSpec:
        """A trial of ``cell`` with ``train``, as the searcher ships it to a Ray worker: ``TrainSettings`` as a dict,
        plus ``lr`` (``TrainSettings.params``). A key ``TrainSettings`` does not know is an error, not dropped."""
        if "lr" not in train:
            raise TypeError("a trial's settings lack its learning rate, lr")
        settings = TrainSettings.from_params({k: v for k, v in train.items() if k != "lr"})
        return cls(cell=cell, settings=settings, lr=train["lr"], pause_at=pause_at)


# ---- model --------------------------------------------------------------------------------------------------
class NextCharacterTargets:
    """Target sets of next-character prediction: before the separator (in w1, or the separator itself) any
    symbol or the separator may come next; after it exactly the copied symbol (then <eos>)."""

    def __init__(self, vocab: tuple[str, ...]):
        self.sep = vocab.index("[sep]")
        self.free = torch.tensor([not (t.startswith("<") and t.endswith(">")) for t in vocab])  # (V,)
        self.ids = torch.arange(len(vocab))  # (V,)

    def targets(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(B, T) inputs and next tokens -> (B, T, V) multi-hot float targets."""
        if self.free.device != inputs.device:  # moved once, not copied over at every step
            self.free, self.ids = self.free.to(inputs.device), self.ids.to(inputs.device)
        before = (inputs == self.sep).cumsum(1) == 0  # (B, T): the separator is not among inputs[:t+1]
        # one-hot by comparison: F.one_hot reads its input's range back to the host to check it
        one_hot = targets.clamp(min=0)[..., None] == self.ids  # (B, T, V)
        return torch.where(before[..., None], self.free, one_hot).float()


class SequenceModel(L.LightningModule):
    """Wraps any registered architecture: next-token loss after the prompt, Adam(W) with linear warm-up.
    ``val_data``, when set, is scored for final-answer accuracy at every validation (``val_accuracy``)."""

    def __init__(self, spec: TrialSpec, val_data: Dataset | None = None):
        super().__init__()
        self.spec, self.val_data = spec, val_data
        self.model = models.build_model(
            spec.cell.arch,
            vocab_size=spec.cell.vocab_size,
            width=spec.cell.width,
            depth=spec.cell.depth,
            heads=spec.settings.model.heads,
            max_len=spec.cell.max_len,
            dropout=spec.settings.model.dropout,
            **spec.cell.arch_options,
        )
        # 3 x exact forward FLOPs of every sequence trained on (forward + backward), by every worker: the sum
        # over workers as of the last validation, and this worker's since
        self.synced_flops, self.unsynced_flops = 0, 0
        self.flops_by_length: dict[int, int] = {}  # sequence length -> exact forward FLOPs
        self.ncp = NextCharacterTargets(spec.cell.vocab) if spec.cell.family == "ncp" else None
        # the training forward as sweep.resources.step runs it (set up on its device by ``setup``); kept out of the
        # module's children, so that a checkpoint holds the model's weights once, under their own names
        self.__dict__["_step_forward"] = None
        self.last_loss: torch.Tensor | None = None  # the last training step's loss, logged at each validation

    @property
    def step_forward(self) -> StepForward | None:
        return self.__dict__["_step_forward"]

    @property
    def step_mode(self) -> StepMode | None:
        """How its training step ran (``sweep.resources.step``, or eager where that could not run); None before a
        fit."""
        return self.step_forward.mode if self.step_forward else None

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device  # where the model will train (it is moved there after setup)
        self.__dict__["_step_forward"] = StepForward(self.model, self.spec.settings.resources.step, device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    @property
    def train_flops(self) -> int:
        return self.synced_flops + self.unsynced_flops

    def sync_flops(self) -> None:
        """Adds every worker's FLOPs since the last call (a collective: every worker calls it, at each validation
        and at the end)."""
        if self.trainer.world_size > 1:
            total = self.trainer.strategy.reduce(
                torch.tensor(float(self.unsynced_flops), dtype=torch.float64, device=self.device), reduce_op="sum"
            )
            self.synced_flops, self.unsynced_flops = self.synced_flops + int(total.item()), 0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["train_flops"] = self.train_flops  # saved right after a validation: synced

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.synced_flops, self.unsynced_flops = checkpoint["train_flops"], 0

    def training_loss(self, batch: Batch) -> torch.Tensor:
        """The family's loss after the prompt; also adds the batch to the training-compute count (the model's FLOPs
        over every position, whatever the forward spares: ``predicted``)."""
        forward = self.step_forward or self.model  # the eager model outside a fit (tests, benchmarks)
        at, targets = self.predicted(batch)
        logits = forward(batch.inputs) if at is None else forward(batch.inputs, at=at)  # (B, T or R, V)
        self.unsynced_flops += 3 * self.batch_flops(batch.lengths)
        return self.loss(logits, batch.inputs, targets) * batch.share

    def predicted(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Where the training forward computes logits (None: everywhere) and the targets there. Where each row
        predicts a few tokens (``Batch.at``: a classification's answer and <eos>) only those, which the last block
        computes alone: the same loss and gradients for a fraction of the FLOPs. ncp reads every position."""
        if batch.at is None or self.ncp is not None:
            return None, batch.targets
        return batch.at, batch.targets.gather(1, batch.at)  # (B, R)

    def batch_flops(self, lengths: np.ndarray) -> int:
        """Exact forward FLOPs of sequences of ``lengths`` tokens: each distinct length's once, times its count (a
        batch holds few lengths: they are bucketed)."""
        distinct, counts = np.unique(lengths, return_counts=True)
        return sum(self.exact_flops(int(n)) * int(c) for n, c in zip(distinct, counts))

    def loss(self, logits, inputs, targets) -> torch.Tensor:
        if self.spec.cell.family != "ncp":
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        assert self.ncp is not None  # made for the ncp family
        mask = targets != IGNORE  # (B, T)
        bce = F.binary_cross_entropy_with_logits(logits, self.ncp.targets(inputs, targets), reduction="none")
        # summed over the vocabulary, averaged over predicted positions (a product, not a boolean index: no sync)
        return (bce.sum(-1) * mask).sum() / mask.sum()

    def correct(self, logits, inputs, targets) -> torch.Tensor:
        """(B, T) bool: the prediction at each position is right (argmax token, or the whole ncp target set)."""
        if self.spec.cell.family != "ncp":
            return logits.argmax(-1) == targets
        assert self.ncp is not None  # made for the ncp family
        return ((logits > 0) == self.ncp.targets(inputs, targets).bool()).all(-1)

    def final_accuracy(
        self, data: Dataset, batch_size: int, device, model: models.LanguageModel | None = None
    ) -> float:
        """The family's final score of ``model`` (default: this trial's), as the papers score it: greedy final answers
        (cot, classify) or, for ncp, the fraction of sequences right at every prefix (teacher-forced, one pass)."""
        model = model or self.model
        model.eval()
        return float(self.final_accuracies(data, batch_size, device, model.greedy, model)[0])

    @torch.no_grad()
    def final_accuracies(
        self, data: Dataset, batch_size: int, device, decode: Callable, run: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """(M,) final scores of one model (M = 1) or of M models at once, given their greedy decoding and their
        forward: (B, P) prompts -> (B, L) or (M, B, L) sequences; (B, T) tokens -> (B, T, V) or (M, B, T, V)."""
        if self.spec.cell.family != "ncp":
            return greedy_accuracies(decode, data, batch_size, device)
        right = torch.zeros((), dtype=torch.long, device=device)
        for batch in loader(data, batch_size, 0, shuffle=False):
            inputs, targets = batch.inputs.to(device), batch.targets.to(device)
            ok = self.correct(run(inputs), inputs, targets) | (targets == IGNORE)  # (B, T) or (M, B, T)
            right = right + ok.all(-1).sum(-1)
        return right.reshape(-1).double() / len(data)

    def lightning_clip(self, parts: int) -> float | None:
        """The gradient clip Lightning applies to this fit of ``parts`` micro-batches a step, deciding how it steps: a
        trial's is Lightning's automatic step (its forward as ``sweep.resources.step`` runs it) with the setting's clip;
        a fused trial's graphed step runs whole and clips its own (None)."""
        return self.spec.settings.optim.grad_clip

    def training_step(self, batch: Batch, batch_idx):
        loss = self.training_loss(batch)
        # logged at the next validation, where it is read (the runs' curves, the checkpoints): self.log at every step
        # costs host time, and a progress-bar metric a device synchronisation
        self.last_loss = loss.detach()
        return loss

    def exact_flops(self, length: int) -> int:
        if length not in self.flops_by_length:
            self.flops_by_length[length] = self.model.exact_flops(length)
        return self.flops_by_length[length]

    def validation_step(self, batch: Batch, batch_idx):
        at, targets = self.predicted(batch)  # a classification's answer alone, as it trains
        inputs = batch.inputs
        logits = self.model(inputs) if at is None else self.model(inputs, at=at)
        mask = targets != IGNORE
        loss = self.loss(logits, inputs, targets)
        correct = (self.correct(logits, inputs, targets) & mask).sum()
        self.log("val_loss", loss, batch_size=len(inputs))
        self.log("val_token_accuracy", correct / mask.sum(), batch_size=int(mask.sum()))

    def on_validation_epoch_end(self):
        self.sync_flops()
        if self.last_loss is not None:
            # the last training step's loss; data-parallel: the mean of the workers' weighted losses is the global
            # batch's loss
            self.log("train_loss", self.last_loss, sync_dist=self.spec.settings.resources.workers > 1)
        if self.val_data is not None:
            with self.trainer.precision_plugin.forward_context():  # scored under training's precision policy
                accuracy = self.final_accuracy(
                    self.val_data, self.spec.settings.evaluation.eval_batch_size, self.device
                )
            self.log("val_accuracy", accuracy)

    def configure_optimizers(self):
        return self.configure_optimizers_for(int(self.trainer.estimated_stepping_batches))

    def configure_optimizers_for(self, total_steps: int) -> dict:
        """AdamW (0.9, 0.999) with weight decay on matrices only (the DP paper), or plain Adam (the separations
        paper); linear warm-up over ``warmup_fraction`` of the first budget (``total_steps``), then constant.

        Constant, not decayed to 0 at the budget (the DP paper's schedule): a decay ties the verdict to the
        budget (the same cell measured 89.0% at step 800 of an 800-step budget and 85.9% at step 800 of a
        2,400-step one), and a trial still improving at its budget continues with a longer one
        (``verdict.Verdict``), which a constant rate continues as it was."""
        s = self.spec.settings
        if s.optim.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=self.spec.lr, betas=(0.9, 0.999))
        else:
            opt = torch.optim.AdamW(
                decay_groups(self.parameters(), s.optim.weight_decay), lr=self.spec.lr, betas=(0.9, 0.999)
            )
        warmup = warmup_steps(s, total_steps)

        def factor(step: int) -> float:
            return min(1.0, (step + 1) / warmup)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def decay_groups(params, weight_decay: float, matrix: int = 2) -> list[dict]:
    """AdamW's parameter groups: weight decay on matrices only (parameters of ``matrix`` dimensions or more; a fused
    trial's are stacked, one more)."""
    params = list(params)
    return [
        {"params": [p for p in params if p.dim() >= matrix], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < matrix], "weight_decay": 0.0},
    ]


def warmup_steps(settings: TrainSettings, total_steps: int) -> int:
    """Steps of the learning rate's linear warm-up: ``warmup_fraction`` of the first budget, at least 1."""
    return max(1, int(settings.optim.warmup_fraction * max(1, total_steps)))


# ---- one trial ----------------------------------------------------------------------------------------------
def run_trial(
    spec: TrialSpec, callbacks: Sequence[L.Callback] = (), log_every: int = 50, checkpoints: Resumable | None = None
) -> dict:
    """Train until a verdict, then score the test set; returns the final metrics. Deterministic for a given spec
    on a given machine. ``checkpoints`` saves the whole state at every validation and resumes from a checkpoint,
    with the same result as a run never stopped (``pipeline/training/checkpoints.py``; by default none). With
    ``spec.settings.resources.workers`` > 1 this process is rank 0 of a data-parallel trial and starts the other ranks
    (``pipeline/training/distributed.py``)."""
    checkpoints = checkpoints or Resumable()
    if spec.settings.resources.workers == 1:
        return score(spec, *fit(spec, checkpoints, callbacks, log_every))
    with (
        distributed.other_ranks(spec, run_rank, checkpoints.for_rank()) as port,
        distributed.ranks_env(0, spec.settings.resources.workers, port),
    ):
        return score(spec, *fit(spec, checkpoints, callbacks, log_every))


def run_rank(spec: TrialSpec, rank: int, port: int, checkpoints: Resumable) -> None:
    """Rank ``rank`` > 0 of a data-parallel trial: trains beside rank 0 (and saves with it, a collective)."""
    with distributed.ranks_env(rank, spec.settings.resources.workers, port):
        fit(spec, checkpoints, rank=rank)


def fit(
    spec: TrialSpec, checkpoints: Resumable, callbacks: Sequence[L.Callback] = (), log_every: int = 50, rank: int = 0
):
    verdict = trial_verdict(spec)
    build = functools.partial(SequenceModel, spec)
    trainer, module = fit_module(spec, build, verdict, checkpoints, callbacks, log_every, rank)
    return trainer, module, checkpoints, verdict


def trial_verdict(spec: TrialSpec) -> Verdict:
    """The trial's ``Verdict`` under its settings, its task's target and its pause."""
    s = spec.settings
    return Verdict(s.threshold, s.verdict, spec.pause_at, s.targets.get(spec.cell.task, s.threshold))


def training_loader(spec: TrialSpec, train: Dataset, parts: int, device: torch.device, rank: int) -> DataLoader:
    """The trial's training batches: in its cell's seed's order, this rank's share of each, in ``parts``
    micro-batches, padded to the longest sequence where a graphed step needs one shape."""
    s = spec.settings
    return loader(
        train,
        s.optim.batch_size,
        spec.cell.seed,
        shuffle=True,
        rank=rank,
        world=s.resources.workers,
        parts=parts,
        processes=s.resources.loader_workers,
        pad_to=pad_to(s.resources.step, device, int(train.lengths.max())),
    )


def parallelism(resources: TrialResources) -> dict[str, Any]:
    """Lightning's devices for a trial's data-parallel workers, and their strategy."""
    if resources.workers == 1:
        return dict(devices=1)
    return dict(
        devices=resources.workers, strategy=distributed.strategy(resources.use_gpu), use_distributed_sampler=False
    )


def fit_module(
    spec: TrialSpec,
    build: Callable[[Dataset], SequenceModel],
    stopping: L.Callback,
    checkpoints: Resumable,
    callbacks: Sequence[L.Callback] = (),
    log_every: int = 50,
    rank: int = 0,
) -> tuple[L.Trainer, SequenceModel]:
    """Fits the module ``build(validation data)`` makes, after seeding as the cell's trials are (one initialisation,
    one order of batches: ``spec``'s cell and settings), with ``stopping`` (the verdict) first among its callbacks
    and ``checkpoints`` last (it saves what the others decided)."""
    s = spec.settings
    device = trial_device(s, rank)
    L.seed_everything(spec.cell.seed, workers=True, verbose=False)
    train = read_dataset(Path(spec.cell.train_path))
    val = read_dataset(Path(spec.cell.val_path)).head(s.evaluation.val_samples)
    module = build(val)
    parts = micro_batches(s, module.model, int(train.lengths.max()), device)
    train_loader = training_loader(spec, train, parts, device, rank)
    with scratch_dir() as scratch:  # a killed trial's is removed by the node's next trial
        assert isinstance(train_loader.batch_sampler, LengthBuckets)  # loader's
        checkpoints.attach(train_loader.batch_sampler, scratch)
        trainer = trial_trainer(
            s,
            parts,
            **parallelism(s.resources),
            gradient_clip_val=module.lightning_clip(parts),
            max_epochs=s.optim.epochs,
            # in loader batches, which are micro-batches: every val_every_steps optimiser steps
            val_check_interval=s.evaluation.val_every_steps and s.evaluation.val_every_steps * parts,
            check_val_every_n_epoch=None if s.evaluation.val_every_steps else 1,
            num_sanity_val_steps=0,
            log_every_n_steps=log_every,
            callbacks=[stopping, *callbacks, checkpoints],
            deterministic=False,
        )
        with warnings.catch_warnings():
            # Lightning cannot see that the sampler resumes mid-epoch (Resumable puts it back in place)
            warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before the epoch ended")
            trainer.fit(
                module,
                train_loader,
                loader(val, s.evaluation.eval_batch_size, 0, shuffle=False),
                ckpt_path=checkpoints.resume,
                weights_only=True,
            )
    module.sync_flops()  # the steps after the last validation
    return trainer, module


def trial_device(settings: TrainSettings, rank: int = 0) -> torch.device:
    """The device of worker ``rank``, set up as a trial's: its CPU threads; on a GPU TF32 for float32 products and,
    on a share of one, the allocator capped to that share."""
    torch.set_num_threads(settings.resources.threads)
    device = torch.device("cuda", rank) if settings.resources.use_gpu else torch.device("cpu")
    if settings.resources.use_gpu:
        torch.set_float32_matmul_precision("high")  # TF32 for float32 matmuls: Ampere and later, ~1e-3 relative
        # on a fractional GPU its allocator capped to the trial's share, less a context; else uncapped (set either
        # way: a process may train trials of other shares in turn, as bench_pack's packs do)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(memory_cap(settings.resources.gpu_share, total), device)
    return device


def trial_trainer(settings: TrainSettings, parts: int, **options) -> L.Trainer:
    """A Lightning Trainer as every fit of a trial's model has it (``options``: what this fit adds or changes): its
    device and precision, ``parts`` micro-batches a step, its step budget and gradient clip, nothing written."""
    return L.Trainer(
        **dict(
            accelerator="gpu" if settings.resources.use_gpu else "cpu",
            # the ranks this trial starts itself (LOCAL_RANK, distributed.py), never a SLURM or other scheduler's
            # environment that the Ray worker happens to inherit
            plugins=[LightningEnvironment()],
            precision=settings.optim.precision,
            max_steps=settings.optim.max_steps,
            accumulate_grad_batches=parts,
            gradient_clip_val=settings.optim.grad_clip,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        | options
    )


def micro_batches(settings: TrainSettings, model: torch.nn.Module, length: int, device: torch.device) -> int:
    """How many parts each worker's batch trains in: ``sweep.resources.micro_batches``, else the fewest that fit the
    trial's memory (``pipeline/training/memory.py``; raises ``DoesNotFit``), else 1. The measurement draws no random
    numbers from the trial's generators."""
    if settings.resources.micro_batches is not None:
        return settings.resources.micro_batches
    budget = budget_bytes(settings.resources.memory_gb_per_trial, settings.resources.gpu_share, device)
    if budget is None:
        return 1
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        fit = fit_memory(
            model.to(device),
            length,
            settings.optim.batch_size // settings.resources.workers,
            budget,
            device,
            functools.partial(autocast, settings, device),
        )
    return fit.micro_batches


def autocast(settings: TrainSettings, device: torch.device):
    """The forward context Lightning's precision plugin trains under (``sweep.optim.precision``)."""
    if settings.optim.precision == "32-true":
        return contextlib.nullcontext()
    return MixedPrecision(settings.optim.precision, device.type).forward_context()


def score(spec: TrialSpec, trainer: L.Trainer, module: SequenceModel, resumable: Resumable, verdict: Verdict) -> dict:
    """The verdict and the test set's score of a fitted trial (rank 0 only), with its costs."""
    test = read_dataset(Path(spec.cell.test_path)).head(spec.settings.evaluation.eval_samples)
    metrics, seconds = resumable.last_metrics(), resumable.elapsed()
    return scored(
        spec, trainer, module, module.model, verdict, trainer.global_step, module.train_flops, metrics, seconds, test
    ) | {
        "resumed_step": math.nan if resumable.resumed_step is None else resumable.resumed_step,
        "checkpoints": resumable.saves,
        "checkpoint_seconds": resumable.save_seconds,
        "checkpoint_bytes": resumable.save_bytes,
        "fused_members": 1,
    }


def scored(
    spec: TrialSpec,
    trainer: L.Trainer,
    module: SequenceModel,
    model: models.LanguageModel,
    verdict: Verdict,
    step: int,
    train_flops: int,
    metrics: dict[str, float],
    train_seconds: float,
    test: Dataset,
) -> dict:
    """``metrics.CELL_METRICS``, status and reason of ``model``, trained by ``module``'s fit to ``step`` with
    ``train_flops`` FLOPs in ``train_seconds``: its verdict, its last validation's ``metrics`` and its score on
    ``test``."""
    status, reason = verdict.outcome_at(step)
    start = time.perf_counter()
    device = torch.device("cuda") if spec.settings.resources.use_gpu else torch.device("cpu")
    module.to(device)
    # a diverged model's weights are not finite, a paused one is not done: neither is scored (NaN); the status
    # says why
    accuracy = math.nan
    if status not in (Status.DIVERGED, Status.PAUSED):
        with trainer.precision_plugin.forward_context():  # the test set under the policy validation used
            accuracy = module.final_accuracy(test, spec.settings.evaluation.eval_batch_size, device, model)
    return {
        "status": status,
        "reason": reason,
        "final_accuracy": accuracy,
        "val_accuracy": float(metrics.get("val_accuracy", float("nan"))),
        "eval_samples": len(test),
        "token_accuracy": float(metrics.get("val_token_accuracy", float("nan"))),
        "train_steps": step,
        "budget_steps": verdict.budget,
        "train_seconds": train_seconds,
        "eval_seconds": time.perf_counter() - start,
        "params": model.num_params(),
        "paper_gflops": model.paper_flops(spec.cell.max_len) / 1e9,
        "exact_gflops": model.exact_flops(spec.cell.max_len) / 1e9,
        "train_pflops": train_flops / 1e15,
        "solve_step": math.nan if verdict.solved_step is None else verdict.solved_step,
        "solve_pflops": verdict.solved_pflops,
        # what decides the trial at any other threshold (tables.at_threshold)
        "target": verdict.target,
        "sustained_accuracy": verdict.sustained,
        "converged": float(verdict.converged),
        "state_bytes": model.state_size(spec.cell.max_len),
    }
