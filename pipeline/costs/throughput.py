"""Training throughput, measured as a trial trains: real optimiser steps of the sweep's Lightning module, in the
micro-batches a trial would take, under the profile's precision (``measure``; every architecture of a grid at the
shapes the forecast needs, ``measure_all``), never an assumed constant. What is measured, and how the forecast prices
trials with it, is ``pipeline.costs.rates``'s."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import lightning as L
import numpy as np
import torch

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.config import Config, Precision, StepMode
from pipeline.costs.rates import Measurement, Throughput
from pipeline.data.datasets import Dataset
from pipeline.training.batches import loader
from pipeline.training.fused_trial import FusedSequenceModel, Members
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import WARMUP, effective
from pipeline.training.train import SequenceModel, TrialSpec, micro_batches, trial_device, trial_trainer, trial_verdict
from tasks import EOS_ID


def device_name(device: torch.device, threads: int, side_by_side: int = 1) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    name = names[0] if names else platform.processor() or "unknown"
    beside = f", {side_by_side} trials side by side" if side_by_side > 1 else ""
    return f"cpu ({name}, {threads} thread{'s' * (threads > 1)}{beside})"


class StepTimer(L.Callback):
    """Seconds and training FLOPs (the module's own count, as a trial's ``train_pflops``) of the loader batches from
    ``start`` on, the device synchronised at both ends."""

    def __init__(self, start: int, device: torch.device):
        self.first, self.device = start, device
        self.start = self.seconds = 0.0
        self.flops = 0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == self.first:
            self.start, self.flops = self.now(), -module.train_flops

    def on_train_end(self, trainer, module) -> None:
        self.seconds, self.flops = self.now() - self.start, self.flops + module.train_flops


def random_sequences(count: int, length: int, vocab_size: int, family: str = "cot") -> Dataset:
    """``count`` sequences of ``length`` random tokens (then <eos>), every one after the first predicted; a
    classification's (``family``) only its last two, its label and <eos>, so that its step computes those logits
    alone, as a classification's training step does (``Batch.at``)."""
    tokens = np.random.default_rng(0).integers(EOS_ID + 1, vocab_size, (count, length + 1), dtype=np.uint16)
    tokens[:, -1] = EOS_ID
    offsets = np.arange(count + 1, dtype=np.int64) * (length + 1)
    prompt = np.full(count, length - 1 if family == "classify" else 1, np.int32)
    return Dataset(Path("random"), {}, tokens.ravel(), offsets, prompt, np.ones(count, np.int32))


def measured_settings(
    cfg: Config,
    *,
    batch: int,
    steps: int,
    device: torch.device,
    precision: Precision,
    step: StepMode = "eager",
    share: float = 1.0,
) -> TrainSettings:
    """A measured trial's settings: the profile's but these, one worker, with the CPU threads a trial gets (at most
    this machine's)."""
    return TrainSettings.of(cfg).replaced(
        batch_size=batch,
        max_steps=steps,
        precision=precision,
        threads=min(cfg.sweep.resources.cpus_per_trial, os.cpu_count() or 1),
        use_gpu=device.type == "cuda",
        workers=1,
        step=step,
        gpu_share=share,
    )


@contextlib.contextmanager
def on_trial_device(settings: TrainSettings) -> Iterator[torch.device]:
    """The device ``settings`` trains on, set up as a trial's (``trial_device``); this process's CPU threads put
    back after."""
    threads = torch.get_num_threads()
    try:
        yield trial_device(settings)
    finally:
        torch.set_num_threads(threads)


def measure(
    cfg: Config,
    cell: CellSpec,
    *,
    length: int,
    batch: int,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: Precision,
    step: StepMode = "eager",
    share: float = 1.0,
    models: int = 1,
    callbacks: Sequence[L.Callback] = (),
    validate: bool = True,
) -> Measurement:
    """``cell``'s model (architecture, width, depth, options, vocabulary) trained as a trial trains it: the sweep's
    Lightning module, optimiser, gradient clip, batches and the micro-batches that fit its memory, at the profile's
    settings but ``precision`` and ``step`` (how the step runs: the measurement says what ran), for ``warmup`` +
    ``steps`` steps on ``device`` over random sequences of ``length`` tokens, ``batch`` a step, with the CPU threads a
    trial gets (at most this machine's), on ``share`` of a GPU (its memory capped so, as a packed trial's);
    ``models`` above 1: that many learning rates as one fused trial (``sweep.resources.fuse``), as the sweep trains
    them, its FLOPs every member's; ``callbacks`` run before the timer's; ``validate``: then one validation
    (``timed_validation``)."""
    if models > 1 and effective(step, device)[0] == "graphed":  # the whole step records at its WARMUP + 1st: untimed
        warmup = max(warmup, WARMUP + 2)
    settings = measured_settings(
        cfg, batch=batch, steps=warmup + steps, device=device, precision=precision, step=step, share=share
    )
    # distinct rates, as a cell's are (a rate does not change a step's time)
    specs = [
        TrialSpec(cell=replace(cell, max_len=length), settings=settings, lr=cell.lrs[0] / 2**k) for k in range(models)
    ]
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # "GPU available: ...", as a trial does
    with on_trial_device(settings) as device:
        torch.manual_seed(0)
        module, fitted = measured_module(specs)
        parts = micro_batches(settings, module.model, length, device)
        timer = StepTimer(warmup * parts, device)
        trainer = trial_trainer(settings, parts, devices=1, limit_val_batches=0,
                                gradient_clip_val=module.lightning_clip(parts),
                                callbacks=[*callbacks, *fitted, timer])  # fmt: skip
        data = random_sequences(batch * (warmup + steps), length, cell.vocab_size, cell.family)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on loaders and logging intervals
            trainer.fit(module, loader(data, batch, cell.seed, shuffle=False, parts=parts))
            validated = timed_validation(trainer, module, settings, timer.now) if validate else (0, 0.0)
    ran = module.step_mode or step
    shape = (cell.arch, cell.width, cell.depth, length, batch)
    return Measurement(*shape, parts, precision, steps, timer.seconds, timer.flops / timer.seconds, models, 1, ran,
                       *validated)  # fmt: skip


def measured_module(specs: list[TrialSpec]) -> tuple[SequenceModel, list[L.Callback]]:
    """The Lightning module of one trial, or of several fused (``FusedSequenceModel``) with its members' callback."""
    if len(specs) == 1:
        return SequenceModel(specs[0]), []
    members = Members([trial_verdict(spec) for spec in specs])
    return FusedSequenceModel(specs, members), [members]


def timed_validation(
    trainer: L.Trainer, module: SequenceModel, settings: TrainSettings, now: Callable[[], float]
) -> tuple[int, float]:
    """One validation after ``module``'s fit, as a trial validates: the teacher-forced pass over its batches, then
    its final answers (``SequenceModel.on_validation_epoch_end``; a chain of thought's decoded from a one-token prompt
    to the end, as long as any real one's), on one evaluation batch of random sequences of the fit's length (at most
    ``val_samples``). Its sequences and seconds."""
    e, cell = settings.evaluation, module.spec.cell
    data = random_sequences(min(e.val_samples, e.eval_batch_size), cell.max_len, cell.vocab_size, cell.family)
    module.val_data = data
    trainer.limit_val_batches = 1.0  # the measured fit validated nothing
    start = now()
    trainer.validate(module, loader(data, e.eval_batch_size, 0, shuffle=False), verbose=False)
    return len(data), now() - start


class StartTogether(L.Callback):
    """Holds a measured fit before its first step until every process measuring beside it is there, so that their
    steps overlap."""

    def __init__(self, barrier) -> None:
        self.barrier = barrier

    def on_train_start(self, trainer, module) -> None:
        self.barrier.wait()


def measure_cells(cfg: Config, cells: list[CellSpec], settings: dict, barrier=None) -> list[Measurement]:
    """``measure`` of each of ``cells`` in turn (its length ``settings["length"]`` or its own), each started with the
    processes measuring beside this one at ``barrier`` (None: alone)."""
    callbacks = [] if barrier is None else [StartTogether(barrier)]
    return [
        measure(cfg, cell, **{**settings, "length": settings["length"] or cell.max_len}, callbacks=callbacks)
        for cell in cells
    ]


def measure_side_by_side(cfg: Config, cells: list[CellSpec], n: int, settings: dict) -> list[Measurement]:
    """``measure_cells`` in ``n`` processes at once, as ``n`` CPU trials train side by side on one machine: their
    cores share caches and memory bandwidth (a classification's 1-thread step at L = 402 took 50 ms side by side on a
    2-core VM, 46 ms alone). Each cell's slowest measurement."""
    ctx = mp.get_context("spawn")  # a fresh interpreter each: no fork of this one's threads
    with ctx.Manager() as manager, ctx.Pool(n) as pool:
        barrier = manager.Barrier(n)
        each = pool.starmap(measure_cells, [(cfg, cells, settings, barrier)] * n)
    return [min(ms, key=lambda m: m.flops_per_s) for ms in zip(*each)]


def shapes_to_measure(
    cells: list[CellSpec], widths: list[int] | None, depths: list[int] | None, gpu: bool
) -> list[tuple[int, int]]:
    """(width, depth) to measure an architecture's ``cells`` at, in the order measured: ``widths`` x ``depths``;
    by default on a GPU its narrowest and widest width at its shallowest depth, then a middle width, then its
    narrowest and widest at its deepest (the affine fit needs three widths and two depths: a narrow model's step is
    launch-bound, a wide one's FLOP-bound, a deep one pays its launches a layer; the fifth shape checks the fit); on a
    CPU, its narrowest at its shallowest (FLOP-bound there, and seconds a step)."""
    all_widths = sorted({c.width for c in cells})
    all_depths = sorted({c.depth for c in cells})
    if widths or depths:
        return [(w, d) for d in depths or all_depths[:1] for w in widths or all_widths[:1]]
    if not gpu:
        return [(all_widths[0], all_depths[0])]
    middle = all_widths[len(all_widths) // 2]
    shapes = [(all_widths[0], all_depths[0]), (all_widths[-1], all_depths[0]), (middle, all_depths[0])]
    return list(dict.fromkeys([*shapes, (all_widths[0], all_depths[-1]), (all_widths[-1], all_depths[-1])]))


def measuring_rounds(
    cells: dict[Cell, CellSpec], widths: list[int] | None, depths: list[int] | None, gpu: bool, every_length: bool
) -> list[list[CellSpec]]:
    """The cells ``measure_all`` measures, round by round: each architecture's r-th shape (``shapes_to_measure``) in
    round r, on its dataset of median L or on each of its datasets (``every_length``)."""
    plans = {}
    for arch in dict.fromkeys(c.arch for c in cells):
        mine = [c for c in cells.values() if c.arch == arch]
        datasets = [c for _, c in sorted({(c.max_len, c.task, c.size): c for c in mine}.items())]
        bases = datasets if every_length else [datasets[(len(datasets) - 1) // 2]]  # else the dataset of median L
        plans[arch] = [(base, shape) for shape in shapes_to_measure(mine, widths, depths, gpu) for base in bases]
    return [
        [
            replace(base, cell=base.cell._replace(width=w, depth=d))
            for base, (w, d) in (p[r] for p in plans.values() if r < len(p))
        ]
        for r in range(max(len(plan) for plan in plans.values()))
    ]


def measure_all(
    cfg: Config,
    cells: dict[Cell, CellSpec],
    *,
    widths: list[int] | None,
    depths: list[int] | None,
    length: int | None,
    batch: int | None,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: Precision,
    step: StepMode = "eager",
    deadline: float | None = None,
    measured: Callable[[Throughput], None] | None = None,
    every_length: bool = False,
    side_by_side: int = 1,
) -> Throughput:
    """Every architecture of the grid measured (``measure``) on the shape of one of its cells, at the widths and
    depths of ``shapes_to_measure`` (an H100 ran the paper grid's standard Transformer at 0.5% of its peak at width
    32 and 24% at 512: one width's rate cannot stand for the others), with the vocabulary and L (``length`` overrides
    it) of the dataset of median L among those it trains on, or of each of them (``every_length``: a classification's
    step computes its answer's logits alone, so its cost grows with L more slowly than the model's FLOPs); ``batch``
    default: the profile's. Round by round: every architecture's first shape, then every one's second, and so on;
    past ``deadline`` (time.monotonic()) no new round starts, once every architecture has one. ``measured`` hears the
    throughput so far after each measurement. ``side_by_side`` trials measured at once (a CPU machine's trial slots:
    ``measure_side_by_side``; every shape, then the throughput whole)."""
    threads = min(cfg.sweep.resources.cpus_per_trial, os.cpu_count() or 1)
    name = device_name(device, threads, side_by_side)
    rounds = measuring_rounds(cells, widths, depths, device.type == "cuda", every_length)
    settings = dict(length=length, batch=batch or cfg.sweep.optim.batch_size, steps=steps, warmup=warmup, device=device,
                    precision=precision, step=step)  # fmt: skip
    if side_by_side > 1:
        if deadline is not None:
            raise ValueError("a measuring budget (deadline) is for trials measured alone")
        whole = Throughput.of_measured(
            name, measure_side_by_side(cfg, [c for r in rounds for c in r], side_by_side, settings)
        )
        if measured:
            measured(whole)
        return whole
    done: list[Measurement] = []
    for round_, cells_ in enumerate(rounds):
        if round_ and deadline is not None and time.monotonic() > deadline:
            break
        for cell in cells_:
            done += measure_cells(cfg, [cell], settings)
            if measured:
                measured(Throughput.of_measured(name, done))
    return Throughput.of_measured(name, done)
