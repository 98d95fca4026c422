"""A fused trial: a cell's learning rates trained as one model, each member to its own verdict and its own record.

The members are ``TrialSpec``s of one cell that differ only in ``lr`` (``check_members``). They share what a cell's
separate trials share: one initialisation (the cell's seed), one order of batches, one validation set. So they train
as one Lightning fit of ``FusedSequenceModel``: the cell's model built once and stacked K times (``models.fused``),
trained by ``FusedAdam`` at each member's rate with each member's own warm-up, step count and moments, its gradient
clipped on its own (``pipeline.training.fused_step``). Each member's loss, FLOPs and validation metrics are its own
(logged as ``m<k>/<metric>``), and so is its ``Verdict``: ``Members``, the fit's first callback, feeds each one its
member's training loss and validations as Lightning feeds a separate trial's, and a member that stops (solved,
converged, diverged, or at the end of its budget or rung) is frozen (``FusedAdam.freeze``: its parameters and
moments unchanged from then on) while the others go on. The fit trains to the furthest budget a member still
training has, and ends when none is, or, where dropping its frozen members pays (``Members.pays_to_restack``), at a
validation, after which the members still training go on as a fit of their own from that validation's checkpoints
(``run_fused``). A validation scores the members still training only, in one batched pass where
the family's answer is a forward or a short continuation (``member_accuracies``).

What leaves it is per member, what a separate trial of it writes (``pipeline.training.train.score``'s keys, with
``fused_members``, the members it trained with): each one is scored on the test set as a model of its own
(``Fused.member``), and each validation's checkpoint is split into one directory per member
(``MemberCheckpoints``), a separate trial's checkpoint of that member (``member_checkpoint``: its weights, its slice
of the optimizer as torch.optim.Adam(W)'s with its LambdaLR, its verdict, the sampler's place, the RNG, its time
and FLOPs). A member that has stopped keeps the checkpoint it saved when it last trained. So a member continues
alone, in another group, or in a group that shrank (successive halving's next rung), and ``latest`` finds it
under its own trial key; members resumed together must stand at one step (``join``), and ``run_fused`` trains
those at different steps, and those that do not fit the memory together, as fits one after another.

What differs from separate trials: float rounding (vmap's batched kernels; within 1e-5 relative in float32,
tests/test_fused.py), dropout masks (each member draws its own, from one stream), and a member that diverges at a
training step is not validated there (a separate trial runs one more validation, of non-finite weights, before it
stops): its record keeps its last validation's metrics. Its status and reason are the same.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.core.optimizer import LightningOptimizer

from models.fused import Fused, FusionError, member_state, stacked_state
from pipeline.common.config import StepMode
from pipeline.common.locks import scratch_dir
from pipeline.data.datasets import Dataset, read_dataset
from pipeline.training.batches import IGNORE, Batch
from pipeline.training.checkpoint_store import write_meta
from pipeline.training.checkpoints import FILE, Resumable
from pipeline.training.fused_step import FusedAdam, Stepped, fused_optimizer, member_losses, train_members
from pipeline.training.fused_step import member_state as optimizer_state
from pipeline.training.memory import DoesNotFit
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import GraphedStep
from pipeline.training.train import SequenceModel, TrialSpec, fit_module, scored, trial_verdict
from pipeline.training.verdict import LOSS, MONITOR, Divergence, Verdict

log = logging.getLogger(__name__)

# a member's checkpoint holds these of its own; the rest (the loops, the epoch and step) is the fit's
OWN = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "train_flops")
# a fit drops its frozen members once the steps left would cost more than this many times what starting it took
RESTACK = 2.0


def check_members(specs: Sequence[TrialSpec]) -> None:
    """Raises ``FusionError`` unless ``specs`` are learning rates of one cell: its cell, settings and rung, distinct
    learning rates, one process (data-parallel ranks train one model each)."""
    if not specs:
        raise FusionError("a fused trial needs at least one member")
    first = specs[0]
    for i, spec in enumerate(specs[1:], 1):
        for what in ("cell", "settings", "pause_at"):
            if getattr(spec, what) != getattr(first, what):
                raise FusionError(
                    f"members 0 and {i} of a fused trial differ in their {what}: a fused trial trains one cell's "
                    "learning rates, which share everything else"
                )
    lrs = [spec.lr for spec in specs]
    if len(set(lrs)) != len(lrs):
        raise FusionError(f"a fused trial's learning rates {lrs} repeat")
    if (workers := first.settings.resources.workers) > 1:
        raise FusionError(f"a fused trial trains in one process, not {workers} data-parallel workers")


class Members(L.Callback):
    """The members of a fused fit, each apart: its ``Verdict`` (fed its own training loss and validations), the step
    it stopped at (from then on it is frozen), its share of the training time (the fit's, split among the members
    still training), its last validation's metrics. Sets the fit's step budget to the furthest a member still
    training has, and stops the fit when none is. With ``restack``, ends the fit at a validation where dropping its
    frozen members pays (``pays_to_restack``), its members still training left to go on as a fit of their own
    (``restacked``)."""

    def __init__(self, verdicts: list[Verdict], restack: float | None = None):
        self.verdicts, self.restack = verdicts, restack
        self.stopped: list[int | None] = [None] * len(verdicts)
        self.seconds = [0.0] * len(verdicts)
        self.metrics: list[dict[str, float]] = [{} for _ in verdicts]
        self.clock = self.created = time.perf_counter()
        self.first_step: tuple[int, float] | None = None  # the fit's first step and when it ended
        self.restacked = False
        self.trainer: L.Trainer | None = None
        self.divergence = Divergence(len(verdicts))  # each member's training loss, watched on the device

    @property
    def active(self) -> list[int]:
        """The members still training."""
        return [k for k, step in enumerate(self.stopped) if step is None]

    def state_dict(self) -> dict:
        return {
            "verdicts": [v.state_dict() for v in self.verdicts],
            "stopped": list(self.stopped),
            "seconds": list(self.seconds),
            "metrics": [dict(m) for m in self.metrics],
        }

    def load_state_dict(self, state: dict) -> None:
        for verdict, saved in zip(self.verdicts, state["verdicts"], strict=True):
            verdict.load_state_dict(saved)
        self.stopped, self.seconds = list(state["stopped"]), list(state["seconds"])
        self.metrics = [dict(m) for m in state["metrics"]]
        if self.trainer is not None:  # before the fit loop decides whether the restored step ends training
            self.apply(self.trainer)

    def setup(self, trainer, module, stage):
        self.trainer = trainer  # Lightning calls setup before it restores a checkpoint

    def on_train_start(self, trainer, module):
        for verdict in self.verdicts:
            verdict.begin(int(trainer.estimated_stepping_batches))
        self.apply(trainer)
        self.clock = time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        for k in self.active:  # its budget (or rung) ended with the last step, after that step's validation
            if trainer.global_step >= self.verdicts[k].limit:
                self.stop(trainer, k, trainer.global_step)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.first_step is None:
            self.first_step = (step, time.perf_counter())
        self.divergence.watch(module.last_losses, step)  # nothing read back: read at the next validation
        for k in self.active:
            self.verdicts[k].extend(step)
        self.apply(trainer)

    def diverged(self, trainer: L.Trainer) -> None:
        """The members whose training loss was not finite since the last read diverge there, and stop."""
        for k, seen in enumerate(self.divergence.read()):
            if seen is not None and k in self.active:
                self.verdicts[k].diverge(f"training loss {seen[1]} at step {seen[0]}")
                self.stop(trainer, k, trainer.global_step)

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking:
            return
        self.diverged(trainer)  # before this validation, which is not of them
        step = trainer.global_step
        for k in self.active:
            prefix = f"m{k}/"
            metrics = {n[len(prefix) :]: float(v) for n, v in trainer.callback_metrics.items() if n.startswith(prefix)}
            self.metrics[k] = metrics
            loss, accuracy = metrics.get(LOSS, math.nan), metrics.get(MONITOR, math.nan)
            if self.verdicts[k].validated(step, loss, accuracy, module.member_flops[k] / 1e15):
                self.stop(trainer, k, step)
        self.apply(trainer)
        if self.pays_to_restack(step):  # ends after this validation, once its checkpoints are saved
            going = self.going(step)
            for k in self.active:  # at the end of their budget: stopped where the next step's start would stop them
                if k not in going:
                    self.stop(trainer, k, step)
            self.restacked = True
            trainer.fit_loop.epoch_loop.max_steps = step

    def going(self, step: int) -> list[int]:
        """The members that train past ``step``: the others are stopped at the next step's start, or were."""
        return [k for k in self.active if self.verdicts[k].limit > step]

    def pays_to_restack(self, step: int) -> bool:
        """At most half the stack still trains, and its steps left, at this fit's measured time a step, would cost
        for the frozen members more than ``restack`` times what this fit took to start (reading, building, loading,
        its first step: what the next fit pays again). The arithmetic of a compute-bound step, whose time is in
        proportion to the members it stacks; a launch-bound GPU step costs about as much for fewer, so there a
        restack saves less than this says, and at worst costs one start."""
        going = self.going(step)
        active, stacked = len(going), len(self.verdicts)
        if self.restack is None or not active or 2 * active > stacked or self.first_step is None:
            return False
        first, ended = self.first_step
        if step <= first:
            return False
        now = time.perf_counter()
        per_step = (now - ended) / (step - first)  # (s): validations included, as the steps left will have them
        left = max(self.verdicts[k].limit for k in going) - step
        return left * per_step * (stacked - active) / stacked > self.restack * (ended - self.created)

    def on_train_end(self, trainer, module):
        self.diverged(trainer)
        self.account()

    def stop(self, trainer: L.Trainer, k: int, step: int) -> None:
        """Member k stops training at ``step``: frozen from now on."""
        self.account()
        self.stopped[k] = step
        optimizer = trainer.optimizers[0]
        assert isinstance(optimizer, FusedAdam)  # FusedSequenceModel's
        optimizer.freeze([k])

    def apply(self, trainer: L.Trainer) -> None:
        active = self.active
        if not active:
            trainer.should_stop = True
            return
        trainer.fit_loop.epoch_loop.max_steps = max(self.verdicts[k].limit for k in active)
        if any(self.verdicts[k].extended for k in active):  # the epoch limit binds no member extended past it
            trainer.fit_loop.max_epochs = -1

    def account(self) -> None:
        """The time since the last call, split among the members training through it."""
        now, active = time.perf_counter(), self.active
        for k in active:
            self.seconds[k] += (now - self.clock) / len(active)
        self.clock = now


class FusedSequenceModel(SequenceModel):
    """A cell's learning rates (``specs``) as one Lightning module: the cell's model, built once (one initialisation,
    as each separate trial of the cell builds it), stacked K times (``Fused``), trained with ``FusedAdam`` and clipped
    per member. Each member's loss, FLOPs and validation metrics are its own: logged as ``m<k>/<metric>``, for the
    members still training (``members.active``)."""

    def __init__(self, specs: Sequence[TrialSpec], members: Members, val_data: Dataset | None = None):
        super().__init__(specs[0], val_data)
        self.specs = list(specs)
        self.model = Fused([self.model] * len(self.specs))
        self.members = members
        self.member_flops = [0] * len(self.specs)  # 3 x exact forward FLOPs of what each member trained on
        self.last_losses: torch.Tensor | None = None  # (K,): the last training step's
        self.whole: GraphedStep | None = None  # the whole step graphed (``graphs_whole``), made at the first step

    @property
    def train_flops(self) -> int:
        """Every member's training FLOPs: what the fused fit computed."""
        return sum(self.member_flops)

    @property
    def step_mode(self) -> StepMode | None:
        return self.whole.mode if self.whole is not None else super().step_mode

    def setup(self, stage: str) -> None:
        if self.automatic_optimization:  # a whole step runs the model eager inside its own program
            super().setup(stage)

    def lightning_clip(self, parts: int) -> float | None:
        """Where the step runs whole (``graphs_whole``), Lightning's optimization is manual and the step clips its own
        gradients (None); else as a trial's."""
        s = self.spec.settings
        self.automatic_optimization = not graphs_whole(s, parts)
        if self.automatic_optimization and s.resources.step == "graphed":
            log.warning("fused fit: its forward graphed, not its whole step (%d parts a step, %d workers; a whole step "
                        "is graphed in one part on one worker)", parts, s.resources.workers)  # fmt: skip
        return super().lightning_clip(parts) if self.automatic_optimization else None

    def training_step(self, batch: Batch, batch_idx):
        flops = 3 * self.batch_flops(batch.lengths)
        for k in self.members.active:
            self.member_flops[k] += flops
        at, targets = self.predicted(batch)
        if not self.automatic_optimization:
            self.last_losses = self.graphed_step(batch.inputs, targets, at)
            return None
        forward = self.step_forward or self.model
        logits = forward(batch.inputs) if at is None else forward(batch.inputs, at=at)  # (K, B, T or R, V)
        losses = self.member_losses(logits, batch.inputs, targets) * batch.share  # (K,)
        self.last_losses = losses.detach()
        # each member's gradient is its own loss's (no gradient crosses members); a stopped member's is computed
        # and discarded: the optimizer keeps its weights as they are (``FusedAdam.freeze``)
        return losses.sum()

    def graphed_step(self, inputs: torch.Tensor, targets: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
        """The members' losses (K,) of one step run whole (``train_step`` as ``GraphedStep`` runs it), as Lightning's
        optimizer step, which counts it; the closure steps the members (``Stepped``)."""
        optimizer = self.optimizers()
        assert isinstance(optimizer, LightningOptimizer)  # one: configure_optimizers'
        fused = self.fused_adam
        fused.flat()  # its buffers (a resumed fit's, loaded) before the step's program is read: a graph holds them
        if self.whole is None:
            self.whole = GraphedStep(self.train_step, self.device, lambda: fused.program)
            log.info("fused fit: %s", self.whole.why or "its whole step graphed (forward, backward, clip, optimizer)")
        whole = self.whole
        return optimizer.step(closure=lambda: Stepped(whole(inputs, targets, at)))

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
        """One step of every member (``train_members``): forward, each member's loss, backward, clip, update."""

        def losses() -> torch.Tensor:
            logits = self.model(inputs) if at is None else self.model(inputs, at=at)  # (K, B, T or R, V)
            return self.member_losses(logits, inputs, targets)

        return train_members(self.fused_adam, losses, self.spec.settings.optim.grad_clip)

    @property
    def fused_adam(self) -> FusedAdam:
        """The fit's optimizer."""
        optimizer = self.trainer.optimizers[0]
        assert isinstance(optimizer, FusedAdam)  # configure_optimizers'
        return optimizer

    def member_losses(self, logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(K, B, T, V) -> (K,): each member's ``SequenceModel.loss``, for all of them at once."""
        if self.spec.cell.family != "ncp":
            return member_losses(logits, targets)
        assert self.ncp is not None  # made for the ncp family
        mask = targets != IGNORE  # (B, T)
        wanted = self.ncp.targets(inputs, targets).expand_as(logits)  # (K, B, T, V)
        bce = F.binary_cross_entropy_with_logits(logits, wanted, reduction="none").sum(-1)  # (K, B, T)
        return (bce * mask).sum((1, 2)) / mask.sum()

    def validation_step(self, batch: Batch, batch_idx):
        inputs = batch.inputs
        active = self.members.active  # a frozen member's metrics stopped with it
        if not active:
            return
        at, targets = self.predicted(batch)  # a classification's answer alone, as it trains
        logits = self.fused(inputs, active) if at is None else self.fused(inputs, active, at=at)  # (M, B, T or R, V)
        mask = targets != IGNORE
        for m, k in enumerate(active):
            correct = (self.correct(logits[m], inputs, targets) & mask).sum()
            self.log(f"m{k}/val_loss", self.loss(logits[m], inputs, targets), batch_size=len(inputs))
            self.log(f"m{k}/val_token_accuracy", correct / mask.sum(), batch_size=int(mask.sum()))

    def on_validation_epoch_end(self):
        active = self.members.active
        for k in active:
            if self.last_losses is not None:
                self.log(f"m{k}/train_loss", self.last_losses[k])
        if self.val_data is not None and active:
            with self.trainer.precision_plugin.forward_context():  # scored under training's precision policy
                for k, accuracy in zip(active, self.member_accuracies(self.val_data, active), strict=True):
                    self.log(f"m{k}/val_accuracy", accuracy)

    def member_accuracies(self, data: Dataset, members: list[int]) -> list[float]:
        """The final scores of ``members`` (frozen ones need none): in one batched pass where a family's answer is a
        forward (ncp) or a short continuation (classify: its answer and <eos>, ``Fused.greedy``); a chain of thought,
        long, decodes member by member with each member's cache (batched without one, its prefix recomputed every
        token, it would cost more than the K decodes)."""
        batch_size, fused = self.spec.settings.evaluation.eval_batch_size, self.fused
        if self.spec.cell.family == "cot":
            return [self.final_accuracy(data, batch_size, self.device, fused.member(k)) for k in members]
        fused.eval()
        decode = functools.partial(fused.greedy, members=members)
        scores = self.final_accuracies(data, batch_size, self.device, decode, functools.partial(fused, members=members))
        return scores.tolist()

    @property
    def fused(self) -> Fused:
        assert isinstance(self.model, Fused)  # set in __init__
        return self.model

    def configure_optimizers(self):
        lrs = [spec.lr for spec in self.specs]
        return fused_optimizer(self.fused, lrs, self.spec.settings, int(self.trainer.estimated_stepping_batches))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if gradient_clip_val:  # sweep.optim.grad_clip: each member's norm over its own parameters
            assert isinstance(optimizer, FusedAdam)  # configure_optimizers'
            optimizer.clip_per_member(gradient_clip_val)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["train_flops"] = list(self.member_flops)
        both_counts(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.member_flops = list(checkpoint["train_flops"])
        both_counts(checkpoint)  # before Lightning restores its loops from it


def both_counts(checkpoint: dict) -> None:
    """The fit's optimizer steps under both of Lightning's counters, automatic optimization's and manual's (a whole
    step's fit is manual), so that its checkpoint, or a member's, resumes at its step in a fit of either kind."""
    loop = checkpoint["loops"]["fit_loop"]
    automatic = loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    manual = loop["epoch_loop.manual_optimization.optim_step_progress"]
    counted = max(automatic, manual, key=lambda progress: progress["total"]["completed"])
    loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = copy.deepcopy(counted)
    loop["epoch_loop.manual_optimization.optim_step_progress"] = copy.deepcopy(counted)


def graphs_whole(settings: TrainSettings, parts: int) -> bool:
    """Whether a fused fit runs its whole step as one program (``GraphedStep``: CUDA graphs on a GPU, elsewhere its
    eager twin, which says so): where ``sweep.resources.step`` is graphed, in one part a step (a graph holds no
    gradient accumulated across batches) on one worker (nor a collective)."""
    return settings.resources.step == "graphed" and parts == 1 and settings.resources.workers == 1


def member_checkpoint(fit: dict, k: int) -> dict:
    """Member k's checkpoint in a separate trial's format (``SequenceModel``'s Lightning checkpoint), from the fused
    fit's checkpoint ``fit``: its weights, its optimizer and schedule, its verdict, the fit's sampler place and RNG
    with its own time, stop and metrics, its FLOPs; the loops (step, epoch, batches) are the fit's."""
    optimizer, schedule = optimizer_state(fit["optimizer_states"][0], k)
    members, resumable = fit["callbacks"]["Members"], fit["callbacks"]["Resumable"]
    weights = member_state({name.removeprefix("model."): v for name, v in fit["state_dict"].items()}, k)
    own = {
        "state_dict": {f"model.{name}": value for name, value in weights.items()},
        "optimizer_states": [optimizer],
        "lr_schedulers": [schedule],
        "callbacks": {
            "Verdict": members["verdicts"][k],
            "Resumable": resumable
            | {
                "seconds": members["seconds"][k],
                "stop": members["stopped"][k] is not None,
                "metrics": members["metrics"][k],
            },
        },
        "train_flops": fit["train_flops"][k],
    }
    # a separate trial's LambdaLR steps with its optimizer, which Lightning counts apart; a fused fit has none
    loops = copy.deepcopy(fit["loops"])
    epoch_loop = {k: v for k, v in loops["fit_loop"].items() if k.startswith("epoch_loop.")}
    stepped = epoch_loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]
    loops["fit_loop"]["epoch_loop.scheduler_progress"] = copy.deepcopy(stepped)
    return {key: value for key, value in fit.items() if key not in OWN} | own | {"loops": loops}


def join(members: Sequence[dict]) -> dict:
    """``member_checkpoint``'s inverse: a fused fit's checkpoint from its members' (separate trials' checkpoints of
    one cell, at one step), member k the k-th. A member saved stopped is frozen from the start."""
    first = members[0]
    steps = [m["global_step"] for m in members]
    if len(set(steps)) > 1:
        raise FusionError(f"members saved at steps {steps} cannot continue as one fit: they must stand at one step")
    stop = [bool(m["callbacks"]["Resumable"]["stop"]) for m in members]
    resumables = [m["callbacks"]["Resumable"] for m in members]
    weights = stacked_state([{n.removeprefix("model."): v for n, v in m["state_dict"].items()} for m in members])
    own = {
        "state_dict": {f"model.{name}": value for name, value in weights.items()},
        "optimizer_states": [{"members": [m["optimizer_states"][0] for m in members], "active": [not s for s in stop]}],
        "lr_schedulers": [],
        "callbacks": {
            "Members": {
                "verdicts": [m["callbacks"]["Verdict"] for m in members],
                "stopped": [first["global_step"] if s else None for s in stop],
                "seconds": [r["seconds"] for r in resumables],
                "metrics": [r["metrics"] for r in resumables],
            },
            "Resumable": resumables[0] | {"stop": all(stop), "seconds": max(r["seconds"] for r in resumables)},
        },
        "train_flops": [m["train_flops"] for m in members],
    }
    return {key: value for key, value in first.items() if key not in OWN} | own


class MemberCheckpoints(Resumable):
    """A fused fit's checkpoints: each save is split into one directory per member, ``<directory>/<name>/``, a
    separate trial's checkpoint of that member (``member_checkpoint``; with ``run_key``, its ``meta.json`` under the
    member's name as trial key, for ``checkpoint_store.latest``). ``store`` keeps every member's newest, this fit's
    ``names`` and the trial's other members (``carried``, trained in another fit), and each save holds all of them
    (hard links): a member that stopped keeps the one it saved when it last trained. ``resume``: the fit's
    checkpoint to continue from (``join``)."""

    def __init__(
        self,
        names: Sequence[str],
        store: Path,
        resume: Path | None = None,
        saving: bool = False,
        carried: Sequence[str] = (),
        run_key: str | None = None,
    ):
        super().__init__(resume, saving)
        self.names, self.store, self.carried, self.run_key = list(names), store, list(carried), run_key
        self.member_saves = [0] * len(self.names)
        self.member_bytes = [0] * len(self.names)

    def write(self, trainer: L.Trainer, module: L.LightningModule, directory: Path) -> int:
        assert isinstance(module, FusedSequenceModel)  # attached to a fused fit
        # the fit's checkpoint as save_checkpoint builds it, split in memory: no file of the whole written and read
        fit = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        step, written = trainer.global_step, 0
        for k in self.saved_now(module, step):  # one stopped before keeps the checkpoint it saved then
            name = self.names[k]
            folder = self.store / name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            torch.save(member_checkpoint(fit, k), folder / FILE)
            if self.run_key is not None:
                write_meta(folder, name, self.run_key, step)
            self.member_saves[k] += 1
            self.member_bytes[k] = (folder / FILE).stat().st_size
            written += self.member_bytes[k]
        for name in [*self.names, *self.carried]:
            if (self.store / name).is_dir():
                shutil.copytree(self.store / name, directory / name, copy_function=os.link)
        return written

    def saved_now(self, module: FusedSequenceModel, step: int) -> list[int]:
        """The members this fit saved at ``step``: those that trained up to it."""
        return [k for k in range(len(self.names)) if module.members.stopped[k] in (None, step)]


# makes a fit's checkpoints: (this fit's names, the store, the checkpoint it resumes from, the trial's other members)
Checkpoints = Callable[..., MemberCheckpoints]


def run_fused(
    specs: Sequence[TrialSpec],
    names: Sequence[str],
    resumes: Sequence[Path | None] = (),
    checkpoints: Checkpoints = MemberCheckpoints,
    callbacks: Sequence[L.Callback] = (),
    log_every: int = 50,
    restack: float | None = RESTACK,
) -> list[dict]:
    """Trains the members ``specs`` (named ``names``: their checkpoints' directories) fused, each to its verdict;
    returns each one's record as ``run_trial`` returns a separate trial's, with ``fused_members``. ``resumes``: each
    member's checkpoint directory to continue from, or None. Members at different steps train as fits one after
    another, each of the members at one step; a fit whose members do not fit the memory together (``DoesNotFit``,
    measured before it trains) is halved, and said so; a member that does not fit alone is recorded as failed with
    how much it needs, as a separate trial is. ``checkpoints`` makes each fit's (``MemberCheckpoints``' arguments).
    A fit that drops its frozen members (``Members.pays_to_restack`` with ``restack``; None: never) is followed at
    once by a fit of those still training, from the checkpoints it saved at its last validation: their records
    count the checkpoints of both fits and keep the first one's ``resumed_step`` and ``fused_members``."""
    check_members(specs)
    if len(names) != len(specs) or len(set(names)) != len(names):
        raise FusionError(f"a fused trial's {len(specs)} members need as many distinct names, not {list(names)}")
    resumes = list(resumes) or [None] * len(specs)
    saved = [None if r is None else torch.load(r / FILE, weights_only=True) for r in resumes]
    results: list[dict] = [{} for _ in specs]
    continued: set[int] = set()  # members whose next fit goes on from a restacked one
    with scratch_dir() as store:
        for name, resume in zip(names, resumes):
            if resume is not None:
                shutil.copytree(resume, store / name)
        pending = fits_by_step(saved)
        if len(pending) > 1:
            log.warning("fused trial: its members stand at %d steps: trained as %d fits", len(pending), len(pending))
        while pending:
            fit = pending.pop(0)
            carried = [n for j, n in enumerate(names) if j not in fit]  # the other members' checkpoints, kept
            making = functools.partial(checkpoints, store=store, carried=carried)
            try:
                made = fit_members([specs[k] for k in fit], [names[k] for k in fit], [saved[k] for k in fit], making,
                                   callbacks, log_every, restack, continued=fit[0] in continued)  # fmt: skip
            except DoesNotFit as err:
                if len(fit) == 1:
                    results[fit[0]] = err.record()
                    continue
                half = (len(fit) + 1) // 2
                log.warning(
                    "fused trial: %d members do not fit together (%s): trained as fits of %d and %d",
                    len(fit), err, half, len(fit) - half,
                )  # fmt: skip
                pending[:0] = [fit[:half], fit[half:]]
                continue
            for k, result in zip(fit, made):
                results[k] = accrued(results[k], result)
            going_on = [k for k, result in zip(fit, made) if result.get("continues")]
            if going_on:
                log.info("fused trial: %d of %d members still training go on as a fit of their own",
                         len(going_on), len(fit))  # fmt: skip
                for k in going_on:
                    saved[k] = torch.load(store / names[k] / FILE, weights_only=True)
                continued.update(going_on)
                pending.insert(0, going_on)
    return results


def accrued(earlier: dict, later: dict) -> dict:
    """A member's record after one more fit: ``later``'s, with the checkpoints of every fit it trained in and the
    first fit's resumed step and fellow members (``earlier``: the record so far, if a restacked fit made one)."""
    if not earlier.get("continues"):
        return later
    kept = {k: earlier[k] for k in ("resumed_step", "fused_members")}
    summed = {k: earlier[k] + later[k] for k in ("checkpoints", "checkpoint_seconds")}
    return later | kept | summed


def fits_by_step(saved: Sequence[dict | None]) -> list[list[int]]:
    """The members (by index) in one fit for each step their checkpoints stand at (None: not started), in order."""
    steps: dict[int | None, list[int]] = {}
    for k, checkpoint in enumerate(saved):
        steps.setdefault(None if checkpoint is None else checkpoint["global_step"], []).append(k)
    return list(steps.values())


def fit_members(
    specs: Sequence[TrialSpec],
    names: Sequence[str],
    saved: Sequence[dict | None],
    checkpoints: Callable[..., MemberCheckpoints],
    callbacks: Sequence[L.Callback],
    log_every: int,
    restack: float | None = None,
    continued: bool = False,
) -> list[dict]:
    """One fused fit of members at one step (``saved``: their checkpoints, all or none), scored member by member; a
    member still training when the fit restacked is not scored: its record says it ``continues``. ``continued``: the
    fit goes on from a restacked one, whose validations were reported when they were saved."""
    with scratch_dir() as scratch:
        resume = None
        if saved[0] is not None:
            resume = scratch / "joined.ckpt"
            torch.save(join([s for s in saved if s is not None]), resume)
        saver = checkpoints(names=names, resume=resume)
        saver.heard = continued  # nothing to report again
        # a fit that saves nothing (outside Tune) leaves no checkpoint for the members still training to go on from
        members = Members([trial_verdict(spec) for spec in specs], restack if saver.saving else None)
        build = functools.partial(FusedSequenceModel, specs, members)
        trainer, module = fit_module(specs[0], build, members, saver, callbacks, log_every)
    assert isinstance(module, FusedSequenceModel)  # what build makes
    test = read_dataset(Path(specs[0].cell.test_path)).head(specs[0].settings.evaluation.eval_samples)
    results = []
    for k, spec in enumerate(specs):
        stopped = members.stopped[k]
        step = trainer.global_step if stopped is None else stopped
        own = {
            "resumed_step": math.nan if saver.resumed_step is None else saver.resumed_step,
            "checkpoints": saver.member_saves[k],
            "checkpoint_seconds": saver.save_seconds / len(specs),
            "checkpoint_bytes": saver.member_bytes[k],
            "fused_members": len(specs),
        }
        if members.restacked and stopped is None:
            results.append(own | {"continues": True})
            continue
        model = module.fused.member(k)
        metrics, seconds, flops = members.metrics[k], members.seconds[k], module.member_flops[k]
        results.append(
            scored(spec, trainer, module, model, members.verdicts[k], step, flops, metrics, seconds, test) | own
        )
    return results
