"""Training throughput as the forecast prices trials with it: what one device's steps measured (``Measurement``, each
in a ``Mode``: K models a step, P processes a device, eager or graphed), the affine model fitted on them (``Affine``),
and the rates a trial is priced at (``Throughput``), written to and read from a file (``dump``, ``load``). Measuring
them is ``pipeline.costs.throughput``'s; this module needs neither torch nor Lightning, so a forecast from a file
starts in seconds."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import asdict, astuple, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, get_args

import numpy as np

from pipeline.common.config import StepMode


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
    time of the ``steps`` steps, the processes timed together); and one validation as the trial validates, of
    ``validation_samples`` sequences in ``validation_seconds`` (0: none measured)."""

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
    validation_samples: int = 0
    validation_seconds: float = 0.0

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


class TrialPrice(NamedTuple):
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

    def price(self, arch: str, mode: Mode, shape: tuple[int, int, int, int], steps: int, flops: float) -> TrialPrice:
        """A trial's seconds under ``mode``: ``steps`` steps of ``shape`` (width, depth, L, batch), ``flops``
        training FLOPs in all. Its own shape measured under ``mode`` first, then the affine fit, then (trials alone
        only, or every width measured) its width's rate. Raises ForecastError where ``mode`` has none of them."""
        width, depth = shape[:2]
        mine = self.of(arch, mode)
        same = [m.trial_rate for m in mine if (m.width, m.depth, m.length, m.batch) == shape]
        if same:
            return TrialPrice(flops / statistics.median(same), "measured")
        affine = self.affine(arch, mode)
        if isinstance(affine, Affine):
            return TrialPrice(steps * affine.step_seconds(depth, flops / steps), "affine")
        at_width = [m.trial_rate for m in mine if m.width == width]
        if at_width:
            return TrialPrice(flops / statistics.median(at_width), "width measured")
        if mode != ALONE or arch not in self.rates:
            raise ForecastError(f"{arch} has no rate {mode} at width {width}")
        widths = self.rates[arch]
        source = "one rate" if EVERY_WIDTH in widths else "width measured" if width in widths else "interpolated"
        return TrialPrice(flops / self.rate(arch, width), source)

    def validation_seconds(self, arch: str, mode: Mode, shape: tuple[int, int, int, int], step: float) -> float | None:
        """Seconds a trial of ``shape`` (width, depth, L, batch) under ``mode``, whose step takes ``step`` seconds,
        spends validating one sequence: measured at its own shape, else at the measured shape of ``arch`` nearest in
        L, then width, scaled by the two steps' ratio (a validation is forward passes of the model a step trains);
        None where no validation of ``arch`` under ``mode`` was measured (a throughput file from before they were)."""
        mine = [m for m in self.of(arch, mode) if m.validation_samples]
        if not mine:
            return None
        width, _, length, _ = shape
        m = min(
            mine,
            key=lambda m: (
                (m.width, m.depth, m.length, m.batch) != shape,
                abs(math.log(m.length / length)),
                abs(math.log(m.width / width)),
            ),
        )
        return m.validation_seconds / m.validation_samples * step / m.step_seconds

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
        eager; before validations were measured, none). Every architecture in ``archs`` must have a rate of trials
        alone."""
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
            if min(m.validation_samples, m.validation_seconds) < 0 or (m.validation_samples > 0) != (
                m.validation_seconds > 0
            ):
                raise ForecastError(f"{where}: a validation measured has samples and seconds above 0, else neither")
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


def packed(measured: list[Measurement]) -> Measurement:
    """The measurements of processes that trained together on one device, each its own trial(s) of one shape, as
    one: their FLOP/s added, the slowest one's seconds, ``processes`` their number."""
    first = measured[0]
    shapes = {(m.arch, m.width, m.depth, m.length, m.batch, m.models, m.step) for m in measured}
    if len(shapes) > 1:
        raise ValueError(f"packed measurements of different shapes or modes: {sorted(shapes)}")
    seconds = max(m.seconds for m in measured)
    return replace(first, seconds=seconds, flops_per_s=sum(m.flops_per_s for m in measured), processes=len(measured))
