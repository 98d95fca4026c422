"""Training throughput, measured as a trial trains: real optimiser steps of the sweep's Lightning module, in the
micro-batches a trial would take, under the profile's precision (``measure``), or read from a file measured
elsewhere (``Throughput.load``), never an assumed constant."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import lightning as L
import numpy as np
import torch

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.config import Config, Precision
from pipeline.data.datasets import Dataset
from pipeline.training.batches import loader
from pipeline.training.settings import TrainSettings
from pipeline.training.train import SequenceModel, TrialSpec, micro_batches, trial_device, trial_trainer
from tasks import EOS_ID


class ForecastError(ValueError):
    """A cluster, throughput file or measurement that cannot give a forecast; the message names the input."""


@dataclass(frozen=True)
class Measurement:
    """One architecture's training throughput at one shape: model FLOP/s = 3 x exact forward FLOPs of every
    sequence x sequences per second, over ``steps`` real optimiser steps (after warm-up ones)."""

    arch: str
    width: int
    depth: int
    length: int
    batch: int
    micro_batches: int
    precision: str
    steps: int
    seconds: float
    flops_per_s: float


EVERY_WIDTH = 0  # the width key of a rate given for an architecture as one number


@dataclass(frozen=True)
class Throughput:
    """Training FLOP/s per architecture and width on one device (``device``: its name, as measured). A width
    between two measured ones takes the log-log interpolation of their rates; beyond them, the nearest one's."""

    device: str
    rates: dict[str, dict[int, float]]  # arch -> width (or EVERY_WIDTH) -> FLOP/s
    measured: tuple[Measurement, ...] = ()

    def rate(self, arch: str, width: int) -> float:
        points = sorted(self.rates[arch].items())
        below = [p for p in points if p[0] <= width] or points[:1]
        above = [p for p in points if p[0] >= width] or points[-1:]
        (w0, r0), (w1, r1) = below[-1], above[0]
        if w0 == w1:
            return r0
        t = math.log(width / w0) / math.log(w1 / w0)
        return math.exp(math.log(r0) + t * math.log(r1 / r0))

    def dump(self, path: Path) -> None:
        data = {
            "device": self.device,
            "flops_per_s": {arch: {str(w): r for w, r in widths.items()} for arch, widths in self.rates.items()},
            "measured": [asdict(m) for m in self.measured],
        }
        path.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path, archs: list[str]) -> Throughput:
        """A file written by ``dump`` or by hand: ``{"device": NAME, "flops_per_s": {ARCH: FLOP/s or {WIDTH:
        FLOP/s}}}`` (and, from ``dump``, how each rate was measured); it must hold every architecture in ``archs``."""
        if not path.is_file():
            raise ForecastError(f"--throughput {path}: no such file")
        try:
            data = json.loads(path.read_text())
            device, given = data["device"], data["flops_per_s"]
            rates = {
                arch: {int(w): float(r) for w, r in v.items()} if isinstance(v, dict) else {EVERY_WIDTH: float(v)}
                for arch, v in given.items()
            }
            measured = tuple(Measurement(**m) for m in data.get("measured", []))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ForecastError(
                f'--throughput {path}: not a throughput file ({type(err).__name__}: {err}); expected {{"device": '
                '"NAME", "flops_per_s": {"ARCH": FLOP/s, or {"WIDTH": FLOP/s, ...}}}'
            ) from None
        for arch, widths in rates.items():
            where = f"--throughput {path}: {arch}: {given[arch]!r}"
            if not widths or not all(0 < r < math.inf for r in widths.values()):
                raise ForecastError(f"{where}: a rate is a positive, finite FLOP/s")
            if isinstance(given[arch], dict) and min(widths) < 1:
                raise ForecastError(f"{where}: a width is a positive whole number")
        missing = [a for a in archs if a not in rates]
        if missing:
            raise ForecastError(
                f"--throughput {path} has no throughput for {', '.join(missing)} (it has {', '.join(sorted(rates))}); "
                "the profile trains them: measure them (python -m pipeline.forecast --save-throughput FILE), add them"
            )
        return cls(str(device), rates, measured)


def device_name(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"cpu ({names[0] if names else platform.processor() or 'unknown'}, {threads} thread{'s' * (threads > 1)})"


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


def random_sequences(count: int, length: int, vocab_size: int) -> Dataset:
    """``count`` sequences of ``length`` random tokens (then <eos>), every one after the first predicted."""
    tokens = np.random.default_rng(0).integers(EOS_ID + 1, vocab_size, (count, length + 1), dtype=np.uint16)
    tokens[:, -1] = EOS_ID
    offsets = np.arange(count + 1, dtype=np.int64) * (length + 1)
    ones = np.ones(count, np.int32)
    return Dataset(Path("random"), {}, tokens.ravel(), offsets, ones, ones)


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
) -> Measurement:
    """``cell``'s model (architecture, width, depth, options, vocabulary) trained as a trial trains it: the sweep's
    Lightning module, optimiser, gradient clip, batches and the micro-batches that fit its memory, at the profile's
    settings but ``precision``, for ``warmup`` + ``steps`` steps on ``device`` over random sequences of ``length``
    tokens, ``batch`` a step, with the CPU threads a trial gets (at most this machine's)."""
    settings = replace(
        TrainSettings.of(cfg),
        batch_size=batch,
        max_steps=warmup + steps,
        precision=precision,
        threads=min(cfg.sweep.cpus_per_trial, os.cpu_count() or 1),
        use_gpu=device.type == "cuda",
        workers=1,
    )
    spec = TrialSpec(cell=replace(cell, max_len=length), settings=settings, lr=cell.lrs[0])
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # "GPU available: ...", as a trial does
    threads = torch.get_num_threads()
    try:
        device = trial_device(settings)
        torch.manual_seed(0)
        module = SequenceModel(spec)
        parts = micro_batches(settings, module.model, length, device)
        timer = StepTimer(warmup * parts, device)
        trainer = trial_trainer(settings, parts, devices=1, limit_val_batches=0, callbacks=[timer])
        data = random_sequences(batch * (warmup + steps), length, cell.vocab_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on loaders and logging intervals
            trainer.fit(module, loader(data, batch, cell.seed, False, parts=parts))
    finally:
        torch.set_num_threads(threads)
    return Measurement(
        cell.arch,
        cell.width,
        cell.depth,
        length,
        batch,
        parts,
        precision,
        steps,
        timer.seconds,
        timer.flops / timer.seconds,
    )


def measure_all(
    cfg: Config,
    cells: dict[Cell, CellSpec],
    *,
    widths: list[int] | None,
    depth: int | None,
    length: int | None,
    batch: int | None,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: Precision,
) -> Throughput:
    """Every architecture of the grid measured (``measure``) on the shape of one of its cells: at ``widths``
    (default: its narrowest, and on a GPU its widest too: an H100 ran the paper grid's standard Transformer at 0.5%
    of its peak at width 32 and 24% at 512, so one width's rate cannot stand for the others), ``depth`` (default: its
    shallowest), and the vocabulary and L (``length`` overrides it) of the dataset of median L among those it trains
    on; ``batch`` default: the profile's."""
    rates: dict[str, dict[int, float]] = {}
    done = []
    for arch in dict.fromkeys(c.arch for c in cells):
        mine = [c for c in cells.values() if c.arch == arch]
        datasets = sorted({(c.max_len, c.task, c.size): c for c in mine}.items())
        base = datasets[(len(datasets) - 1) // 2][1]  # the dataset of median L
        ends = sorted({min(c.width for c in mine), max(c.width for c in mine)})
        for width in widths or (ends if device.type == "cuda" else ends[:1]):
            cell = replace(base, cell=base.cell._replace(width=width, depth=depth or min(c.depth for c in mine)))
            m = measure(
                cfg,
                cell,
                length=length or cell.max_len,
                batch=batch or cfg.sweep.batch_size,
                steps=steps,
                warmup=warmup,
                device=device,
                precision=precision,
            )
            rates.setdefault(arch, {})[width] = m.flops_per_s
            done.append(m)
    threads = min(cfg.sweep.cpus_per_trial, os.cpu_count() or 1)
    return Throughput(device_name(device, threads), rates, tuple(done))
