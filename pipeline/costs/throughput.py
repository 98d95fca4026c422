"""Training throughput, measured as a trial trains: real optimiser steps of the sweep's Lightning module, in the
micro-batches a trial would take, under the profile's precision (``measure``), or read from a file measured
elsewhere (``Throughput.load``), never an assumed constant."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, astuple, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, get_args

import lightning as L
import numpy as np
import torch

from pipeline.common.cell import Cell, CellSpec
from pipeline.common.config import Config, Precision, StepMode
from pipeline.data.datasets import Dataset
from pipeline.training.batches import loader
from pipeline.training.fused_trial import FusedSequenceModel, Members
from pipeline.training.settings import TrainSettings
from pipeline.training.train import SequenceModel, TrialSpec, micro_batches, trial_device, trial_trainer, trial_verdict
from tasks import EOS_ID


class ForecastError(ValueError):
    """A cluster, throughput file or measurement that cannot give a forecast; the message names the input."""


EVERY_WIDTH = 0  # the width key of a rate given for an architecture as one number


@dataclass(frozen=True)
class Mode:
    """How a device trains trials: ``models`` trials in one step (fused: their weights stacked), in each of
    ``processes`` processes sharing the device (packed), every step run ``step`` (eager, compiled, graphed)."""

    models: int = 1
    processes: int = 1
    step: str = "eager"

    @property
    def trials(self) -> int:
        """Trials the device trains at once."""
        return self.models * self.processes

    def __str__(self) -> str:
        at_once = [f"{self.models} fused a step"] * (self.models > 1) + [f"{self.processes} processes a GPU"] * (
            self.processes > 1
        )
        return f"{' x '.join(at_once) or 'one trial alone'}, {self.step}"


ALONE = Mode()  # one trial a device, eager: the throughput files before modes
STEP_MODES = get_args(StepMode)


@dataclass(frozen=True)
class Measurement:
    """One architecture's training throughput at one shape: model FLOP/s = 3 x exact forward FLOPs of every
    sequence x sequences per second, over ``steps`` real optimiser steps (after warm-up ones), of every trial the
    device trained at once: ``models`` fused in each step of each of ``processes`` processes (``seconds``: the wall
    time of the ``steps`` steps, the processes timed together)."""

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
    models: int = 1
    processes: int = 1
    step: str = "eager"

    @property
    def mode(self) -> Mode:
        return Mode(self.models, self.processes, self.step)

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.steps

    @property
    def trial_rate(self) -> float:
        """One trial's FLOP/s while the device trains ``mode.trials`` at once."""
        return self.flops_per_s / self.mode.trials

    @property
    def step_flops(self) -> float:
        """One trial's FLOPs a step."""
        return self.trial_rate * self.step_seconds


@dataclass(frozen=True)
class Affine:
    """A step's seconds modelled as a fixed cost, a cost per layer and the step's FLOPs at a rate:
    ``fixed + per_layer x depth + FLOPs / rate``, fitted (``fit``) on measured steps of one architecture and mode.
    A narrow model's step is bound by its kernel launches and host work (the fixed and per-layer costs: an H100
    took 5.5 ms for a 1-layer Transformer step at width 64 and 5.95 ms at 512), a wide one's by its FLOPs."""

    fixed: float  # seconds
    per_layer: float  # seconds
    rate: float  # FLOP/s of one trial's FLOPs
    widths: tuple[int, ...]
    depths: tuple[int, ...]
    lengths: tuple[int, ...]
    worst: float  # the largest relative error of the fit over the measured steps

    def step_seconds(self, depth: int, flops: float) -> float:
        """One step of a trial of ``depth`` layers and ``flops`` FLOPs a step (its trials': ``mode.trials`` at
        once)."""
        return self.fixed + self.per_layer * depth + flops / self.rate

    def __str__(self) -> str:
        return (
            f"{self.fixed * 1e3:.3g} ms + {self.per_layer * 1e3:.3g} ms a layer + FLOPs at "
            f"{self.rate / 1e12:.3g} TFLOP/s a trial, within {self.worst:.1%} of every step measured (widths "
            f"{' '.join(map(str, self.widths))}; depths {' '.join(map(str, self.depths))}; L "
            f"{' '.join(map(str, self.lengths))})"
        )

    @classmethod
    def fit(cls, measured: list[Measurement]) -> Affine | str:
        """The fit on ``measured`` (one architecture and mode): least relative squares with every coefficient at
        least 0 (each subset of them solved, the best that keeps them so), or why there is none: fewer than three
        widths, or fewer than two depths and lengths (a fixed cost and a rate need both a narrow and a wide step,
        and a per-layer cost two depths), or a step time that does not grow with FLOPs."""
        widths, depths, lengths = (sorted({getattr(m, k) for m in measured}) for k in ("width", "depth", "length"))
        if len(widths) < 3 or max(len(depths), len(lengths)) < 2:
            return (
                f"no affine fit (widths {' '.join(map(str, widths)) or '-'}, depths {' '.join(map(str, depths)) or '-'}"
                f", L {' '.join(map(str, lengths)) or '-'}: it needs 3 widths or more and 2 depths or lengths or more)"
            )
        t = np.array([m.step_seconds for m in measured])
        features = np.array([[1.0, m.depth, m.step_flops] for m in measured]) / t[:, None]  # relative errors
        usable = (0, 1, 2) if len(depths) > 1 else (0, 2)  # one depth: its per-layer cost is in the fixed one
        best: tuple[float, np.ndarray] | None = None
        for n in range(1, len(usable) + 1):
            for subset in itertools.combinations(usable, n):
                columns = features[:, subset]
                scale = np.abs(columns).max(0)  # seconds and FLOPs are 12 orders apart: solved on equal footing
                x, *_ = np.linalg.lstsq(columns / scale, np.ones(len(t)), rcond=None)
                if (x < 0).any():
                    continue
                coef = np.zeros(3)
                coef[list(subset)] = x / scale
                error = float(((features @ coef - 1) ** 2).sum())
                if best is None or error < best[0]:
                    best = (error, coef)
        if best is None or best[1][2] <= 0:
            return "no affine fit: the measured step times do not grow with the steps' FLOPs (measure a wider model)"
        fixed, per_layer, inverse = best[1]
        worst = float(np.abs(features @ best[1] - 1).max())
        return cls(fixed, per_layer, 1 / inverse, tuple(widths), tuple(depths), tuple(lengths), worst)


class Priced(NamedTuple):
    seconds: float  # a trial's wall seconds (with ``mode.trials`` trained at once)
    source: str  # how its rate was had: one of SOURCES


# how a trial's rate is had, from the most direct: its own shape measured (width, depth, L, batch); the affine fit;
# its width measured (at another depth or L: that FLOP/s taken as is); between two measured widths (log-log); one
# rate given for every width
SOURCES = ("measured", "affine", "width measured", "interpolated", "one rate")


@dataclass(frozen=True)
class Throughput:
    """Training FLOP/s per architecture and width on one device (``device``: its name, as measured), trials alone
    (``rates``, given by hand or from ``measured``), and the steps measured, alone or many trials at once
    (``measured``). ``price`` turns them into a trial's seconds: its own shape measured, else the affine fit of its
    architecture and mode (``Affine``), else, for trials alone, its width's measured rate or the log-log
    interpolation between two measured widths (beyond them, the nearest one's)."""

    device: str
    rates: dict[str, dict[int, float]]  # arch -> width (or EVERY_WIDTH) -> FLOP/s of one trial alone
    measured: tuple[Measurement, ...] = ()
    fits: dict[tuple[str, Mode], Affine | str] = field(default_factory=dict, compare=False, repr=False)  # a cache

    def rate(self, arch: str, width: int) -> float:
        points = sorted(self.rates[arch].items())
        below = [p for p in points if p[0] <= width] or points[:1]
        above = [p for p in points if p[0] >= width] or points[-1:]
        (w0, r0), (w1, r1) = below[-1], above[0]
        if w0 == w1:
            return r0
        t = math.log(width / w0) / math.log(w1 / w0)
        return math.exp(math.log(r0) + t * math.log(r1 / r0))

    def modes(self) -> list[Mode]:
        """Every mode measured, trials alone first."""
        return list(dict.fromkeys([ALONE, *sorted({m.mode for m in self.measured}, key=astuple)]))

    def of(self, arch: str, mode: Mode) -> list[Measurement]:
        return [m for m in self.measured if m.arch == arch and m.mode == mode]

    def affine(self, arch: str, mode: Mode) -> Affine | str:
        """The affine fit of ``arch`` under ``mode``, or why there is none."""
        if (arch, mode) not in self.fits:
            self.fits[arch, mode] = Affine.fit(self.of(arch, mode))
        return self.fits[arch, mode]

    def basis(self, arch: str, mode: Mode, widths: list[int]) -> str | None:
        """What ``arch``'s trials at ``widths`` are priced from under ``mode``: "affine", "every width" (each of
        ``widths`` measured), and for trials alone the rates per width ("rates"); None: nothing."""
        if isinstance(self.affine(arch, mode), Affine):
            return "affine"
        if {m.width for m in self.of(arch, mode)} >= set(widths):
            return "every width"
        return "rates" if mode == ALONE and arch in self.rates else None

    def price(self, arch: str, mode: Mode, shape: tuple[int, int, int, int], steps: int, flops: float) -> Priced:
        """A trial's seconds under ``mode``: ``steps`` steps of ``shape`` (width, depth, L, batch), ``flops``
        training FLOPs in all. Its own shape measured under ``mode`` first, then the affine fit, then (trials alone
        only, or every width measured) its width's rate. Raises ForecastError where ``mode`` has none of them."""
        width, depth = shape[:2]
        mine = self.of(arch, mode)
        same = [m.trial_rate for m in mine if (m.width, m.depth, m.length, m.batch) == shape]
        if same:
            return Priced(flops / statistics.median(same), "measured")
        affine = self.affine(arch, mode)
        if isinstance(affine, Affine):
            return Priced(steps * affine.step_seconds(depth, flops / steps), "affine")
        at_width = [m.trial_rate for m in mine if m.width == width]
        if at_width:
            return Priced(flops / statistics.median(at_width), "width measured")
        if mode != ALONE or arch not in self.rates:
            raise ForecastError(f"{arch} has no rate {mode} at width {width}")
        widths = self.rates[arch]
        source = "one rate" if EVERY_WIDTH in widths else "width measured" if width in widths else "interpolated"
        return Priced(flops / self.rate(arch, width), source)

    def dump(self, path: Path) -> None:
        """Written whole, then moved into place: a reader never sees half a file."""
        data = {
            "device": self.device,
            "flops_per_s": {arch: {str(w): r for w, r in widths.items()} for arch, widths in self.rates.items()},
            "measured": [asdict(m) for m in self.measured],
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def of_measured(cls, device: str, measured: list[Measurement]) -> Throughput:
        """The throughput of ``measured``: the rates of trials alone, eager, per width (the median where a width
        was measured at several shapes), and every measurement."""
        alone: dict[str, dict[int, list[float]]] = {}
        for m in measured:
            if m.mode == ALONE:
                alone.setdefault(m.arch, {}).setdefault(m.width, []).append(m.flops_per_s)
        rates = {a: {w: statistics.median(r) for w, r in sorted(ws.items())} for a, ws in alone.items()}
        return cls(device, rates, tuple(measured))

    @classmethod
    def load(cls, path: Path, archs: list[str]) -> Throughput:
        """A file written by ``dump`` or by hand: ``{"device": NAME, "flops_per_s": {ARCH: FLOP/s or {WIDTH:
        FLOP/s}}}`` (and, from ``dump``, how each rate was measured, ``measured``: a list of ``Measurement``'s
        fields; before modes a measurement had no ``models``, ``processes`` or ``step``, and is of trials alone,
        eager). Every architecture in ``archs`` must have a rate of trials alone."""
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
                '"NAME", "flops_per_s": {"ARCH": FLOP/s, or {"WIDTH": FLOP/s, ...}}, "measured": [{"arch": ARCH, '
                '"width": W, ...}, ...]}'
            ) from None
        for arch, widths in rates.items():
            where = f"--throughput {path}: {arch}: {given[arch]!r}"
            if not widths or not all(0 < r < math.inf for r in widths.values()):
                raise ForecastError(f"{where}: a rate is a positive, finite FLOP/s")
            if isinstance(given[arch], dict) and min(widths) < 1:
                raise ForecastError(f"{where}: a width is a positive whole number")
        for i, m in enumerate(measured):
            where = f"--throughput {path}: measured[{i}] ({m.arch}, width {m.width})"
            if not (m.seconds > 0 and m.steps > 0 and 0 < m.flops_per_s < math.inf):
                raise ForecastError(f"{where}: its seconds, steps and flops_per_s must be positive and finite")
            if m.models < 1 or m.processes < 1 or m.step not in STEP_MODES:
                raise ForecastError(
                    f"{where}: models {m.models!r} and processes {m.processes!r} are at least 1, step {m.step!r} "
                    f"one of {', '.join(STEP_MODES)}"
                )
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
) -> Measurement:
    """``cell``'s model (architecture, width, depth, options, vocabulary) trained as a trial trains it: the sweep's
    Lightning module, optimiser, gradient clip, batches and the micro-batches that fit its memory, at the profile's
    settings but ``precision`` and ``step`` (how the step runs: the measurement says what ran), for ``warmup`` +
    ``steps`` steps on ``device`` over random sequences of ``length`` tokens, ``batch`` a step, with the CPU threads a
    trial gets (at most this machine's), on ``share`` of a GPU (its memory capped so, as a packed trial's);
    ``models`` above 1: that many learning rates as one fused trial (``sweep.resources.fuse``), as the sweep trains
    them, its FLOPs every member's; ``callbacks`` run before the timer's."""
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
        fitted: list[L.Callback] = []
        if models == 1:
            module = SequenceModel(specs[0])
        else:
            members = Members([trial_verdict(spec) for spec in specs])
            module, fitted = FusedSequenceModel(specs, members), [members]
        parts = micro_batches(settings, module.model, length, device)
        timer = StepTimer(warmup * parts, device)
        trainer = trial_trainer(settings, parts, devices=1, limit_val_batches=0, callbacks=[*callbacks, *fitted, timer])
        data = random_sequences(batch * (warmup + steps), length, cell.vocab_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on loaders and logging intervals
            trainer.fit(module, loader(data, batch, cell.seed, shuffle=False, parts=parts))
    ran = module.step_forward.mode if module.step_forward else step
    rate = timer.flops / timer.seconds
    shape = (cell.arch, cell.width, cell.depth, length, batch)
    return Measurement(*shape, parts, precision, steps, timer.seconds, rate, models=models, step=ran)


def packed(measured: list[Measurement]) -> Measurement:
    """The measurements of processes that trained together on one device, each its own trial(s) of one shape, as
    one: their FLOP/s added, the slowest one's seconds, ``processes`` their number."""
    first = measured[0]
    shapes = {(m.arch, m.width, m.depth, m.length, m.batch, m.models, m.step) for m in measured}
    if len(shapes) > 1:
        raise ValueError(f"packed measurements of different shapes or modes: {sorted(shapes)}")
    seconds = max(m.seconds for m in measured)
    return replace(first, seconds=seconds, flops_per_s=sum(m.flops_per_s for m in measured), processes=len(measured))


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
) -> Throughput:
    """Every architecture of the grid measured (``measure``) on the shape of one of its cells, at the widths and
    depths of ``shapes_to_measure`` (an H100 ran the paper grid's standard Transformer at 0.5% of its peak at width
    32 and 24% at 512: one width's rate cannot stand for the others), with the vocabulary and L (``length`` overrides
    it) of the dataset of median L among those it trains on; ``batch`` default: the profile's. Round by round: every
    architecture's first shape, then every one's second, and so on; past ``deadline`` (time.monotonic()) no new round
    starts, once every architecture has one. ``measured`` hears the throughput so far after each measurement."""
    threads = min(cfg.sweep.resources.cpus_per_trial, os.cpu_count() or 1)
    name = device_name(device, threads)
    plans = {}
    for arch in dict.fromkeys(c.arch for c in cells):
        mine = [c for c in cells.values() if c.arch == arch]
        datasets = sorted({(c.max_len, c.task, c.size): c for c in mine}.items())
        base = datasets[(len(datasets) - 1) // 2][1]  # the dataset of median L
        plans[arch] = (base, shapes_to_measure(mine, widths, depths, device.type == "cuda"))
    done: list[Measurement] = []
    for round_ in range(max(len(shapes) for _, shapes in plans.values())):
        if round_ and deadline is not None and time.monotonic() > deadline:
            break
        for base, shapes in plans.values():
            if round_ >= len(shapes):
                continue
            width, depth = shapes[round_]
            cell = replace(base, cell=base.cell._replace(width=width, depth=depth))
            done.append(
                measure(
                    cfg,
                    cell,
                    length=length or cell.max_len,
                    batch=batch or cfg.sweep.optim.batch_size,
                    steps=steps,
                    warmup=warmup,
                    device=device,
                    precision=precision,
                    step=step,
                )
            )
            if measured:
                measured(Throughput.of_measured(name, done))
    return Throughput.of_measured(name, done)
