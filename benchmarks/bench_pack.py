"""Many trials a GPU: what one GPU trains per second with one trial, with K trials fused in a step, with P trials as
processes, with graphed steps, and where a step's time goes; then the throughput the forecast reads.

    python -m benchmarks.bench_pack --out DIR             # a GPU: at most --budget-s (400 s), parts in this order
    python -m benchmarks.bench_pack --quick --out DIR     # a CPU: toy shapes in seconds (checks the script, CI)

Parts, in priority order, each until its share of the budget is spent (what an earlier part leaves is a later
one's; a row that would start past it is skipped, and says so; a row still running at its end is cut, so that a
long row, a graph's compile, cannot take a later part's time):
1. ``fused``: one trial alone against K = 7 fused (eager, then graphed) at the separations shape (widths 64 and
   128, depth 1, L = 102, batch 64), then at depth 6, L = 402, for transformer, mamba, lstm, linear_nofm, dss and
   retnet; one trial alone graphed too. A bare step (forward, loss, backward, Adam), bf16 on a
   GPU, both sides the same model under ``RECIPE`` (the separations recipe: no dropout), graphed as a trial runs it
   (alone: its forward, and so its backward, under reduce-overhead, ``StepForward``, the optimizer eager; K fused: the
   whole step, optimizer included, one CUDA graph, ``GraphedStep``); trial-steps/s = K x
   steps/s; each variant timed round by round beside one trial alone (the order turned every round), the ratio per
   round.
2. ``packing``: 1, 2, 4, 8 and 14 processes on one GPU, each a trial's real Lightning steps (the sweep's module,
   its memory capped to its share, ``pipeline.training.memory.memory_cap``), all timed together (a barrier before
   the timed steps): aggregate trial-steps/s, each size over one process in the same rounds (the sizes in turn,
   the order turned every round, in one pool of 14 processes, the others idle), and what a CUDA context holds
   outside the allocator.
3. ``lightning``: a trial's Lightning fit against a bare loop over the same module and batches, side by side.
4. ``profile``: torch.profiler over one trial's steps: kernels a step and the GPU-busy fraction (eager, graphed).
5. ``throughput``: what ``python -m pipeline.forecast --throughput`` reads (``pipeline.costs.rates``), for the
   separations profile (every architecture alone at three widths and two depths, the affine fit's shapes, then K
   fused as one fused trial's Lightning fit, graphed on a GPU, but for the architectures the sweep cannot fuse,
   then packed 8 a GPU, at the same shapes) and the paper profile (alone), written as each shape is measured to
   ``throughput-separations.json`` and ``throughput-paper.json`` in ``--out``.

Every row is a line of ``bench_pack.jsonl`` in ``--out``, appended and flushed as it is measured (the first line says
how: command, commit, date, device); a time guard (an alarm at each part's end, and at the budget's) stops a part
mid-row and writes a line saying so, every row before it kept. Figures are medians of ``--rounds`` rounds with their
spread (``benchmarks.results.figure``). docs/gpu.md gives the command for a lent GPU; the targets (issue 46):
trial-steps/s per GPU at widths up to 128 on the separations shape at least 5x one eager trial alone, 10x with
graphs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import NamedTuple

import lightning as L
import torch
import torch.nn.functional as F

import models
from benchmarks.repeats import ratios, side_by_side
from benchmarks.results import RESULTS, figure, provenance
from pipeline.common.cell import CellSpec
from pipeline.common.config import Config, load_config
from pipeline.costs.rates import Measurement, Throughput, packed
from pipeline.costs.throughput import (
    device_name,
    measure,
    measured_settings,
    on_trial_device,
    random_sequences,
    shapes_to_measure,
)
from pipeline.search.cells import defined_cells, unfusable
from pipeline.training import fused_step as stacked
from pipeline.training.batches import loader
from pipeline.training.memory import GB
from pipeline.training.settings import TrainSettings
from pipeline.training.steps import WARMUP, GraphedStep, StepForward
from pipeline.training.train import SequenceModel, TrialSpec

ARCHS = ("transformer", "mamba", "lstm", "linear_nofm", "dss", "retnet")
K = 7  # a separations cell's learning rates: the members of one fused trial
VOCAB = 32
# both sides of every comparison train under the separations profile's recipe: Adam, no dropout, clip or warm-up
RECIPE = TrainSettings().replaced(heads=4, dropout=0.0, optimizer="adam", grad_clip=None, warmup_fraction=0.0)
PARTS = {"fused": 0.40, "packing": 0.20, "lightning": 0.05, "profile": 0.05, "throughput": 0.30}  # budget shares
PAPER_LRS = (1e-2, 5e-3, 1e-3, 5e-4, 1e-4, 5e-5, 1e-6)  # the separations paper's rates: a fused trial's members


class Shape(NamedTuple):
    width: int
    depth: int
    length: int
    batch: int

    def __str__(self) -> str:
        return f"width {self.width}, depth {self.depth}, L {self.length}, batch {self.batch}"


class Measures(NamedTuple):
    """What a run measures: the full one on a GPU, toy sizes with --quick."""

    archs: tuple[str, ...]  # part fused's
    shapes: tuple[Shape, ...]  # part fused's: the first is also graphed alone, and is the shape of parts 2-4
    processes: tuple[int, ...]
    profile: str  # the profile of parts 2-4
    arch: str  # the architecture of parts 2-4
    throughput: tuple[str, ...]  # part 5's profiles
    throughput_archs: tuple[str, ...] | None  # part 5's architectures (None: each profile's)
    fit_shapes: tuple[tuple[int, int], ...] | None  # part 5's (width, depth)s (None: shapes_to_measure's)
    pack: int  # part 5's processes a GPU
    round_s: float  # seconds of timed steps a variant a round
    fit_steps: dict[str, int]  # timed steps of a Lightning measurement, by profile (a paper-shape step: seconds)


FULL = Measures(
    archs=ARCHS,
    shapes=(Shape(64, 1, 102, 64), Shape(128, 1, 102, 64), Shape(64, 6, 402, 64), Shape(128, 6, 402, 64)),
    processes=(1, 2, 4, 8, 14),
    profile="separations",
    arch="transformer",
    throughput=("separations", "paper"),
    throughput_archs=None,
    fit_shapes=None,
    pack=8,
    round_s=0.5,
    fit_steps={"separations": 20, "paper": 3},
)
QUICK = Measures(
    archs=("transformer", "mamba"),
    shapes=(Shape(16, 1, 16, 8),),
    processes=(1, 2),
    profile="tiny",
    arch="standard",
    throughput=("tiny",),
    throughput_archs=("standard", "lstm"),
    fit_shapes=((8, 1), (32, 1), (16, 1), (8, 2)),  # the affine fit's three widths and two depths
    pack=2,
    round_s=0.05,
    fit_steps={"tiny": 2},
)


class TimeUp(Exception):
    """The run's budget is spent."""


class PartUp(TimeUp):
    """The current part's share of the budget is spent: it stops mid-row, and the next part starts."""


class RowLog:
    """``bench_pack.jsonl``: a JSON line a row, appended and flushed as it is measured, and printed."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **row) -> None:
        with self.path.open("a") as sink:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
        shown = {k: (v["median"] if isinstance(v, dict) and "median" in v else v) for k, v in row.items()}
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), flush=True)


class Clock:
    """The budget: each of the ``parts`` run has until its share (``PARTS``, over theirs) of the budget, counted from
    the run's start, is spent (time an earlier part left over is a later one's): it starts no row after, and an alarm
    at its end raises PartUp wherever it is, so that a long row (a graph's compile) cannot take a later part's time;
    the alarm at the budget's end raises TimeUp."""

    def __init__(self, budget_s: float, parts: list[str]):
        self.start, self.budget = time.monotonic(), budget_s
        self.shares = {p: PARTS[p] / sum(PARTS[q] for q in parts) for p in parts}
        self.until = 0.0  # the current part's end, seconds from the start
        self.name, self.last = "", True  # the current part, and whether its alarm is the budget's

    def __enter__(self) -> Clock:
        def up(signum, frame):
            if not self.last:
                raise PartUp(f"the {self.name} part's share of the budget ({self.until:.0f} s from the start) is spent")
            raise TimeUp(f"the budget of {self.budget:g} s is spent")

        self.before = signal.signal(signal.SIGALRM, up)
        signal.setitimer(signal.ITIMER_REAL, self.budget)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.before)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def part(self, name: str) -> None:
        """Part ``name`` starts: its alarm set at its end (the budget's, for the last part)."""
        self.name = name
        self.until += self.shares[name] * self.budget
        self.last = self.until >= self.budget - 1e-6
        signal.setitimer(signal.ITIMER_REAL, max(0.01, (self.budget if self.last else self.until) - self.elapsed()))

    def spent(self) -> bool:
        """The current part's share is spent: its next row is skipped."""
        return self.elapsed() > self.until


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    """bf16 on a GPU (the separations and paper profiles' precision), float32 on a CPU."""
    return torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def step_model(arch: str, shape: Shape) -> models.LanguageModel:
    """One trial's model at ``shape`` under ``RECIPE``, as ``stacked.fused_step`` builds each member."""
    return models.build_model(arch, vocab_size=VOCAB, width=shape.width, depth=shape.depth, heads=RECIPE.model.heads,
                              max_len=shape.length + 1, dropout=RECIPE.model.dropout)  # fmt: skip


class Step(NamedTuple):
    """A variant's step, and what it runs compiled or graphed, its forward or its whole step (a graphed one that fell
    back to eager is not measured as graphed)."""

    run: Callable[[], None]
    forward: StepForward | GraphedStep | None


def alone_step(arch: str, shape: Shape, device: torch.device, step: str) -> Step:
    """One trial's optimiser step on a fixed batch: the forward as ``sweep.resources.step`` runs it (``StepForward``),
    the loss, backward and Adam (the separations paper's optimiser, no clip)."""
    torch.manual_seed(0)  # the initialisation fused_step gives its members
    model = step_model(arch, shape).to(device)
    forward = StepForward(model, step, device)  # type: ignore[arg-type]
    if forward.why:
        raise NotImplementedError(forward.why)
    tokens = torch.randint(2, VOCAB, (shape.batch, shape.length + 1), device=device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def run() -> None:
        with autocast(device):
            logits = forward(tokens[:, :-1])  # (B, L, V)
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Step(run, forward)


def fused_step(arch: str, shape: Shape, k: int, device: torch.device, graphed: bool) -> Step:
    """K trials of ``arch`` at ``shape`` in one step, with stacked weights (``pipeline.training.fused_step``): forward,
    each member's loss, backward, Adam at each member's rate (the paper's, in turn), no clip, as ``alone_step``;
    graphed as a fused trial runs it: the whole step, optimizer included, as one CUDA graph (``GraphedStep``)."""
    if graphed and device.type != "cuda":
        raise NotImplementedError("graphed needs a GPU: CUDA graphs")
    lrs = [PAPER_LRS[i % len(PAPER_LRS)] for i in range(k)]
    step = stacked.fused_step(arch, lrs, RECIPE, vocab_size=VOCAB, width=shape.width, depth=shape.depth,
                            max_len=shape.length + 1, device=device,
                            step="graphed" if graphed else "eager")  # fmt: skip
    tokens = torch.randint(2, VOCAB, (shape.batch, shape.length + 1), device=device)

    def run() -> None:
        with autocast(device):
            step(tokens[:, :-1], tokens[:, 1:])

    return Step(run, step.whole or step.forward)


def calibrated(run: Callable[[], None], device: torch.device, round_s: float) -> int:
    """Steps that take about ``round_s``, after warm-up steps (compilation and graph recording happen there: a whole
    step graphed records at its shape's ``WARMUP`` + 1st step)."""
    for _ in range(WARMUP + 2):
        run()
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return max(3, min(200, int(round_s / max(time.perf_counter() - start, 1e-6))))


def steps_per_s(run: Callable[[], None], steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        run()
    synchronize(device)
    return steps / (time.perf_counter() - start)


def rounds(variants: dict[str, tuple[Callable[[], None], int]], n: int, device) -> dict[str, list[float]]:
    """Steps/s of every variant (its step, its steps a round), ``n`` rounds, the order turned every round so that a
    drift of the machine favours none."""
    names = list(variants)
    got: dict[str, list[float]] = {name: [] for name in names}
    for r in range(n):
        for name in names[r % len(names):] + names[: r % len(names)]:
            got[name].append(steps_per_s(*variants[name], device))
    return got


# ---- 1. one trial alone against K fused --------------------------------------------------------------------------
def part_fused(plan: Measures, device: torch.device, clock: Clock, rows: RowLog, n: int) -> None:
    """A depth and length at a time (the separations shape first: its widths are what issue 46's targets read), its
    widths and architectures eager, one trial alone against K fused; then graphed (a graph records, and compiles,
    once a shape: the costliest rows), one trial alone and K fused graphed against one trial alone eager, measured
    again beside them. The next depth and length as the part's share allows."""
    clock.part("fused")
    for _, same in itertools.groupby(plan.shapes, key=lambda shape: (shape.depth, shape.length)):
        for graphed, shape in itertools.product((False, True), same):
            for arch in plan.archs:
                where = {"part": "fused", "arch": arch, **shape._asdict()}
                # (trials a step, graphed): the yardstick first
                wanted = [(K, True), (1, True)] if graphed else [(1, False), (K, False)]
                if clock.spent():
                    for k, g in wanted:
                        rows.write(**where, variant=variant_name(k, g),
                                   status="skipped: the part's share of the budget is spent")  # fmt: skip
                    continue
                variants = built(wanted, arch, shape, plan, device, rows, where)
                if not variants:
                    continue
                if graphed:
                    variants = built([(1, False)], arch, shape, plan, device, rows, where) | variants
                if variant_name(1, False) not in variants:
                    continue
                got = rounds({name: v[:2] for name, v in variants.items()}, n, device)
                alone = got[variant_name(1, False)]
                for name, rates in got.items():
                    per_s = [r * variants[name][2] for r in rates]
                    rows.write(**where, variant=name, status="measured", steps=variants[name][1],
                               graph_breaks=variants[name][3], trial_steps_per_s=figure(per_s, "trial-steps/s"),
                               x_alone=figure(ratios(per_s, alone), "x"))  # fmt: skip


def variant_name(k: int, graphed: bool) -> str:
    return f"{'alone' if k == 1 else f'{k} fused'}, {'graphed' if graphed else 'eager'}"


def built(wanted: list[tuple[int, bool]], arch: str, shape: Shape, plan: Measures, device: torch.device, rows: RowLog,
          where: dict) -> dict[str, tuple[Callable[[], None], int, int, int]]:  # fmt: skip
    """The variants of ``wanted`` that run here, each (its step, its steps a round, its trials a step, its graph
    breaks: a graphed step compiled in pieces says so), warmed up; a row for each that does not, saying why."""
    variants = {}
    for k, graphed in wanted:
        name = variant_name(k, graphed)
        try:
            made = (
                alone_step(arch, shape, device, "graphed" if graphed else "eager")
                if k == 1
                else fused_step(arch, shape, k, device, graphed)
            )
            steps = calibrated(made.run, device, plan.round_s)  # its warm-up compiles it
            if made.forward is not None and made.forward.why:  # it could not compile: it ran eager
                rows.write(**where, variant=name, status=f"failed: {made.forward.why}")
                continue
            variants[name] = (made.run, steps, k, made.forward.graph_breaks if made.forward else 0)
        except TimeUp:
            raise
        except NotImplementedError as why:
            rows.write(**where, variant=name, status=f"not measured: {why}")
        except Exception as err:  # noqa: BLE001 (compilation, memory, a kernel): the row says which
            rows.write(**where, variant=name, status=f"failed: {type(err).__name__}: {str(err)[:300]}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return variants


# ---- 2. trials as processes on one GPU -----------------------------------------------------------------------------
class AtBarrier(L.Callback):
    """Every packed process starts its timed steps together: it waits for the others at the first timed batch."""

    def __init__(self, barrier, first: int):
        self.barrier, self.first = barrier, first

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == self.first:
            self.barrier.wait()


def packed_worker(conn, barriers: dict, threads: int) -> None:
    """A process of a packed GPU: measures what it is sent (the pack's size and ``measure``'s arguments) on its share
    of the GPU, at that size's barrier with the others; answers with the measurement and the bytes its allocator
    holds (None on a CPU)."""
    torch.set_num_threads(threads)
    while (job := conn.recv()) is not None:
        size, profile, cell, kwargs = job
        try:
            cfg = load_config(profile=profile)
            at = AtBarrier(barriers[size], kwargs["warmup"])
            m = measure(cfg, cell, share=1 / size, callbacks=[at], **kwargs)
            conn.send((m, torch.cuda.memory_reserved() if torch.cuda.is_available() else None))
        except Exception as err:  # noqa: BLE001 (the parent writes it as the row's status)
            barriers[size].abort()
            conn.send(f"{type(err).__name__}: {str(err)[:300]}")


class Pack:
    """``processes`` worker processes on one device; a measurement of size P takes the first P, each on 1 / P of the
    device, the others idle (so that packs of every size in ``sizes`` are timed in turn, round by round)."""

    def __init__(self, processes: int, threads: int, sizes: tuple[int, ...] = ()):
        ctx = mp.get_context("spawn")  # a CUDA context each
        # the device's free memory before them: what they take beyond their allocators' is their contexts
        self.free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
        self.barriers = {size: ctx.Barrier(size) for size in {*sizes, processes}}
        self.conns, self.procs = [], []
        try:
            for _ in range(processes):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=packed_worker, args=(there, self.barriers, threads), daemon=True)
                proc.start()
                self.conns.append(here)
                self.procs.append(proc)
        except BaseException:  # cut while starting (a part's deadline): none left holding a CUDA context
            self.close(kill=True)
            raise

    def measure(
        self, profile: str, cell: CellSpec, size: int | None = None, **kwargs
    ) -> tuple[Measurement, float | None]:
        """``size`` processes (default: all) measure ``cell`` together: one packed measurement, and the bytes a process
        holds outside its allocator (its CUDA context; measured when every process took part, else None)."""
        size = size or len(self.conns)
        self.barriers[size].reset()
        for conn in self.conns[:size]:
            conn.send((size, profile, cell, kwargs))
        answers = [conn.recv() for conn in self.conns[:size]]
        errors = [a for a in answers if isinstance(a, str)]
        if errors:
            raise RuntimeError(errors[0])
        context = None
        if self.free is not None and size == len(self.conns):
            taken = self.free - torch.cuda.mem_get_info()[0]
            context = taken / size - sum(r for _, r in answers) / size
        return packed([m for m, _ in answers]), context

    def close(self, kill: bool = False) -> None:
        """Each process told to end (``kill``: ended at once, as when the budget is spent)."""
        for conn in self.conns if not kill else []:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=0 if kill else 10)
            if proc.is_alive():
                proc.kill()
                proc.join()


@contextlib.contextmanager
def pack(processes: int, threads: int, sizes: tuple[int, ...] = ()) -> Iterator[Pack]:
    p = Pack(processes, threads, sizes)
    try:
        yield p
    except BaseException:
        p.close(kill=True)
        raise
    p.close()


def profile_cell(profile: str, arch: str, shape: Shape) -> tuple[Config, CellSpec]:
    """A cell of ``profile`` for ``arch``, at ``shape`` (no data needed: the forecast's cells)."""
    cfg = load_config(profile=profile)
    base = next(c for c in defined_cells(cfg).values() if c.arch == arch)
    cell = replace(base, cell=base.cell._replace(width=shape.width, depth=shape.depth), max_len=shape.length)
    return cfg, cell


def fit_kwargs(plan: Measures, profile: str, shape: Shape, device: torch.device) -> dict:
    """``measure``'s arguments: the profile's precision on a GPU (both bf16), float32 on a CPU."""
    precision = load_config(profile=profile).sweep.optim.precision if device.type == "cuda" else "32-true"
    return dict(length=shape.length, batch=shape.batch, steps=plan.fit_steps[profile], warmup=2, device=device,
                precision=precision)  # fmt: skip


def part_packing(plan: Measures, device: torch.device, clock: Clock, rows: RowLog, n: int) -> None:
    """Every pack size in turn, round by round (the order turned every round), in one pool of the largest size: each
    size's trial-steps/s over one process's in the same rounds. A row a size once its rounds are done, or when the
    part stops early (the budget, a failure), with the rounds it has."""
    clock.part("packing")
    shape = plan.shapes[0]
    _, cell = profile_cell(plan.profile, plan.arch, shape)
    where = {"part": "packing", "arch": plan.arch, **shape._asdict(), "step": "eager"}
    threads = 1 if device.type == "cpu" else max(1, (os.cpu_count() or 1) // max(plan.processes))
    kwargs = fit_kwargs(plan, plan.profile, shape, device)
    per_s: dict[int, dict[int, float]] = {size: {} for size in plan.processes}  # trial-steps/s of the device by round
    contexts: list[float] = []
    failed: dict[int, str] = {}
    try:
        with pack(max(plan.processes), threads, plan.processes) as p:
            for round_ in range(n):
                for size in plan.processes[:: -1 if round_ % 2 else 1]:
                    if size in failed or clock.spent():
                        continue
                    try:
                        m, context = p.measure(plan.profile, cell, size, **kwargs)
                    except TimeUp:
                        raise
                    except Exception as err:  # noqa: BLE001 (a size that fails is a row)
                        failed[size] = f"failed: {type(err).__name__}: {str(err)[:300]}"
                        continue
                    per_s[size][round_] = m.flops_per_s / m.step_flops
                    contexts += [context] if context is not None else []
    except TimeUp:
        raise
    except Exception as err:  # noqa: BLE001 (the pool did not start or stop): the sizes not measured say why
        failed |= {size: f"failed: {type(err).__name__}: {str(err)[:300]}" for size, got in per_s.items() if not got}
    finally:
        for size, got in per_s.items():
            if not got:
                status = failed.get(size, "skipped: the part's share of the budget is spent")
                rows.write(**where, processes=size, status=status)
                continue
            one = per_s.get(1, {})
            both = [r for r in got if r in one]  # the rounds that measured one process too
            rows.write(**where, processes=size, status="measured", share=round(1 / size, 4),
                       trial_steps_per_s=figure(list(got.values()), "trial-steps/s"),
                       x_one=figure(ratios([got[r] for r in both], [one[r] for r in both]), "x") if both else None,
                       rounds=len(got), stopped=failed.get(size),
                       cuda_context_gb=max(contexts) / GB if contexts else None)  # fmt: skip


# ---- 3. Lightning against a bare loop -----------------------------------------------------------------------------
def part_lightning(plan: Measures, device: torch.device, clock: Clock, rows: RowLog, n: int) -> None:
    clock.part("lightning")
    shape = plan.shapes[0]
    where = {"part": "lightning", "arch": plan.arch, **shape._asdict()}
    if clock.spent():
        rows.write(**where, status="skipped: the part's share of the budget is spent")
        return
    cfg, cell = profile_cell(plan.profile, plan.arch, shape)
    kwargs = fit_kwargs(plan, plan.profile, shape, device)
    lightning, bare = side_by_side(partial(measure, cfg, cell, **kwargs), partial(bare_measure, cfg, cell, **kwargs), n)
    per_s = {name: [m.flops_per_s / m.step_flops for m in ms] for name, ms in (("lightning", lightning),
                                                                               ("bare", bare))}  # fmt: skip
    rows.write(**where, status="measured", lightning_steps_per_s=figure(per_s["lightning"], "steps/s"),
               bare_steps_per_s=figure(per_s["bare"], "steps/s"),
               bare_x_lightning=figure(ratios(per_s["bare"], per_s["lightning"]), "x"))  # fmt: skip


def bare_measure(cfg: Config, cell: CellSpec, *, length, batch, steps, warmup, device, precision) -> Measurement:
    """``measure`` without Lightning: the same settings, module, batches, optimiser, clip and CPU threads, in a plain
    loop."""
    settings = measured_settings(cfg, batch=batch, steps=warmup + steps, device=device, precision=precision)
    with on_trial_device(settings) as device:
        torch.manual_seed(0)
        spec = TrialSpec(cell=replace(cell, max_len=length), settings=settings, lr=cell.lrs[0])
        module = SequenceModel(spec).to(device)
        opt = module.configure_optimizers_for(warmup + steps)["optimizer"]
        data = random_sequences(batch * (warmup + steps), length, cell.vocab_size, cell.family)
        context = autocast(device) if precision != "32-true" else contextlib.nullcontext()
        start, flops = 0.0, 0
        for i, b in enumerate(loader(data, batch, cell.seed, shuffle=False)):
            if i == warmup:
                synchronize(device)
                start, flops = time.perf_counter(), module.train_flops
            with context:
                loss = module.training_loss(b._replace(inputs=b.inputs.to(device), targets=b.targets.to(device),
                                                       share=b.share.to(device)))  # fmt: skip
            loss.backward()
            if settings.optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), settings.optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        synchronize(device)
        seconds = time.perf_counter() - start
    return Measurement(cell.arch, cell.width, cell.depth, length, batch, 1, precision, steps, seconds,
                       (module.train_flops - flops) / seconds)  # fmt: skip


# ---- 4. where a step's time goes ----------------------------------------------------------------------------------
def part_profile(plan: Measures, device: torch.device, clock: Clock, rows: RowLog) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    clock.part("profile")
    shape = plan.shapes[0]
    for step in ("eager", "graphed"):
        where = {"part": "profile", "arch": plan.arch, **shape._asdict(), "step": step}
        if clock.spent():
            rows.write(**where, status="skipped: the part's share of the budget is spent")
            continue
        try:
            made = alone_step(plan.arch, shape, device, step)
        except NotImplementedError as why:
            rows.write(**where, status=f"not measured: {why}")
            continue
        run = made.run
        steps = calibrated(run, device, plan.round_s)
        if made.forward is not None and made.forward.why:  # it could not compile: it ran eager
            rows.write(**where, status=f"failed: {made.forward.why}")
            continue
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
        synchronize(device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                run()
            synchronize(device)
            wall = time.perf_counter() - start
        events = prof.events()
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
        cpu_ops = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
        breaks = made.forward.graph_breaks if made.forward else 0
        rows.write(**where, status="measured", steps=steps, graph_breaks=breaks, step_ms=1e3 * wall / steps,
                   kernels_a_step=len(kernels) / steps, gpu_busy=min(1.0, busy / wall) if kernels else None,
                   top_level_cpu_ops_a_step=len(cpu_ops) / steps)  # fmt: skip


# ---- 5. the forecast's throughput ---------------------------------------------------------------------------------
def part_throughput(plan: Measures, device: torch.device, clock: Clock, rows: RowLog, out: Path) -> None:
    """Each profile's architectures at the affine fit's shapes (``shapes_to_measure`` on a GPU), round by round:
    alone; then, for the first profile, K fused (one fused trial's Lightning fit, as ``sweep.resources.fuse`` trains
    a cell's learning rates; graphed on a GPU) and packed ``plan.pack`` a GPU (--quick: on the CPU) at the same
    shapes; the file rewritten after each shape."""
    clock.part("throughput")
    threads = 1 if device.type == "cpu" else max(1, (os.cpu_count() or 1) // plan.pack)
    name, graphed = device_name(device, threads), device.type == "cuda"
    for profile in plan.throughput:
        cfg = load_config(profile=profile)
        cells = defined_cells(cfg)
        cannot = unfusable(cells, cfg.sweep.model.heads)  # the sweep trains their learning rates apart
        archs = plan.throughput_archs or list(dict.fromkeys(c.arch for c in cells.values()))
        plans = {}
        for arch in archs:
            mine = [c for c in cells.values() if c.arch == arch]
            datasets = sorted({(c.max_len, c.task, c.size): c for c in mine}.items())
            shapes = list(plan.fit_shapes or shapes_to_measure(mine, None, None, gpu=True))
            plans[arch] = (datasets[(len(datasets) - 1) // 2][1], shapes)
        path = out / f"throughput-{profile}.json"
        done: list[Measurement] = []
        ways = ["alone"] + ["fused", "packed"] * (profile == plan.throughput[0])
        for way in ways:
            processes = plan.pack if way == "packed" else 1
            if clock.spent():
                rows.write(part="throughput", profile=profile, way=way, processes=processes,
                           status="skipped: the part's share of the budget is spent")  # fmt: skip
                continue
            with pack(processes, threads) if processes > 1 else contextlib.nullcontext() as p:
                for round_ in range(max(len(s) for _, s in plans.values())):
                    for arch, (base, shapes) in plans.items():
                        if round_ >= len(shapes):
                            continue
                        width, depth = shapes[round_]
                        batch = cfg.sweep.optim.batch_size if device.type == "cuda" else 8
                        shape = Shape(width, depth, base.max_len, batch)
                        where = {"part": "throughput", "profile": profile, "arch": arch, "way": way,
                                 "processes": processes, **shape._asdict()}  # fmt: skip
                        if clock.spent():
                            rows.write(**where, status="skipped: the part's share of the budget is spent")
                            continue
                        if way == "fused" and arch in cannot:
                            rows.write(**where, status=f"not measured: the sweep cannot fuse {arch} ({cannot[arch]})")
                            continue
                        cell = replace(base, cell=base.cell._replace(width=width, depth=depth))
                        kwargs = fit_kwargs(plan, profile, shape, device)
                        try:
                            if way == "fused":  # a fused trial as the sweep trains it, graphed where it can be
                                m = measure(cfg, cell, **kwargs, models=K, step="graphed" if graphed else "eager")
                            else:
                                m = p.measure(profile, cell, **kwargs)[0] if p else measure(cfg, cell, **kwargs)
                        except TimeUp:
                            raise
                        except Exception as err:  # noqa: BLE001 (out of memory at a paper shape): a row
                            rows.write(**where, status=f"failed: {type(err).__name__}: {str(err)[:300]}")
                            continue
                        done.append(m)
                        Throughput.of_measured(name, done).dump(path)
                        rows.write(**where, status="measured", file=path.name, flops_per_s=m.flops_per_s,
                                   step_ms=1e3 * m.step_seconds, mode=str(m.mode))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_pack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="toy shapes on any device, in seconds (CI)")
    ap.add_argument("--out", type=Path, default=None, help="folder of bench_pack.jsonl and throughput-*.json "
                                                           "(default: docs/benchmarks; none with --quick)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop after this many seconds, rows so far kept "
                                                                 "(default: 400; --quick 120)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each timed figure (default: 3)")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="parts to run (default: all)")
    args = ap.parse_args(argv)
    if args.quick and args.out is None:
        ap.error("--quick writes toy figures: give --out (not docs/benchmarks)")
    if args.rounds < 1 or (args.budget_s is not None and args.budget_s <= 0):
        ap.error("--rounds must be at least 1 and --budget-s above 0")
    out = args.out or RESULTS
    plan = QUICK if args.quick else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_num_threads(1)
    budget = args.budget_s or (120.0 if args.quick else 400.0)  # with imports and start: 7 minutes
    rows = RowLog(out / "bench_pack.jsonl")
    name = device_name(device, torch.get_num_threads())
    how = provenance("benchmarks.bench_pack", argv)
    rows.write(part="run", **how, device=name, budget_s=budget, plan=plan._asdict())
    stopped = None
    with Clock(budget, [p for p in PARTS if p in args.parts]) as clock:
        try:
            for part in PARTS:
                if part not in args.parts:
                    continue
                try:
                    if part == "fused":
                        part_fused(plan, device, clock, rows, args.rounds)
                    elif part == "packing":
                        part_packing(plan, device, clock, rows, args.rounds)
                    elif part == "lightning":
                        part_lightning(plan, device, clock, rows, args.rounds)
                    elif part == "profile":
                        part_profile(plan, device, clock, rows)
                    else:
                        part_throughput(plan, device, clock, rows, out)
                except PartUp as up:  # its rows so far kept; the row it was measuring is not
                    rows.write(part=part, status=f"cut: {up}: the row it was measuring and the rest not measured")
                    gc.collect()  # the cut row's models and graphs, before the next part's
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        except TimeUp as up:
            stopped = str(up)
    rows.write(part="end", seconds=round(clock.elapsed(), 1), stopped=stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
