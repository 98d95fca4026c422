"""Synthetic paper-shaped grids for the replay benchmark (``python -m benchmarks.bench_frontier --synthetic``).

A grid of recorded trials with the shape of the ``paper`` or ``separations`` profile (its tasks, sizes,
architectures, widths, depths, seeds and learning rates, its step budget and validation interval) whose outcomes are
drawn, not trained. Nothing here is a measurement: the frontiers are the shapes the papers report, drawn per seed
with noise, and the curves are made up so that a search can be replayed on them.

- Minimum width w*(task, size, arch, depth): ``paper``: the standard Transformer flat in n, sparse and linear
  attention doubling with each size (the DP paper's Figures 2-3), flat for all on ed_local; ``separations``: the
  separations paper's results (one-layer Transformers solve index lookup and string equality at width 64 at every
  N; recurrent and linear models need 2x per size and none solves index lookup or eq_random beyond N = 100; LSTMs
  solve Dyck at 64; one-layer Transformers fail Dyck beyond 100; DSS and Mamba need more than 64 on eq_ncp beyond
  400). A deeper model needs 1.5x less. Each seed multiplies w* by a log-normal draw (sigma 0.25).
- Learning rates: per (task, architecture) one best rate; a rate d places away needs 2^d times the width and
  solves 1 + d times slower; 3 or more places away it never solves; the largest rate diverges one time in three.
- Curves: a trial that solves crosses the threshold at a step that shrinks with width above w*; one that does not
  plateaus below it and converges (unsolved) after ``convergence_min_steps``; one whose solve step lies past the
  extended budget ends undecided. Its PFLOPs are 3 x the model's exact forward FLOPs at the task's length (the
  real model on the meta device) x batch x steps; its seconds those PFLOPs at ``--gpu-tflops``.
"""

from __future__ import annotations

import math
import random

import torch

import models
import tasks
from pipeline.common.cell import Cell
from pipeline.common.config import ROOT, load_config
from pipeline.common.status import Status
from pipeline.search.replay import Recorded, Recording

THRESHOLD = 0.9
RECURRENT = ("lstm", "dss", "mamba", "retnet", "linear_nofm")


def paper_width(task: str, n_index: int, arch: str) -> float | None:
    """The DP paper's shapes at the smallest depth: standard flat, sparse and linear growing with n."""
    if arch == "standard" or task == "ed_local":
        return 64.0
    return 64.0 * 2**n_index


def separations_width(task: str, size: int, arch: str, depth: int) -> float | None:
    """The separations paper's results at the smallest depth."""
    transformer = arch == "transformer"
    if task == "index_lookup":
        return 64.0 if transformer else (None if size > 100 else 64.0 * size / 20)
    if task == "dyck":
        if arch == "lstm":
            return 64.0
        return None if transformer and depth == 1 and size > 100 else 128.0 * max(1.0, size / 100)
    if task in ("eq_random", "eq_one"):
        if transformer:
            return 64.0
        return None if arch in ("lstm", "linear_nofm") and size > 100 else 128.0 * max(1.0, size / 100)
    if task == "eq_ncp":
        if transformer:
            return 64.0
        return 128.0 * max(1.0, size / 400) if arch in ("dss", "mamba") and size > 400 else 64.0 * max(1.0, size / 200)
    raise ValueError(task)


def minimum_width(profile: str, task: str, size: int, sizes: list[int], arch: str, depth: int, depths: list[int]):
    base = (
        paper_width(task, sizes.index(size), arch)
        if profile == "paper"
        else separations_width(task, size, arch, depth)
    )
    return None if base is None else base / 1.5 ** depths.index(depth)


def forward_flops(task: str, size: int, arch: str, width: int, depth: int, heads: int) -> float:
    """Exact forward FLOPs of one sequence of the task's length (the real model, shapes only)."""
    built = tasks.get_task(task, size)
    length = built.max_length()
    with torch.device("meta"):
        model = models.build_model(
            arch, vocab_size=built.vocab_size, width=width, depth=depth, heads=heads, max_len=length
        )
    return float(model.exact_flops(length))


def grid(profile: str, seed: int = 0, gpu_tflops: float = 100.0, seeds: int | None = None) -> Recorded:
    """The ``paper`` or ``separations`` profile's grid, its trials drawn (see the module docstring)."""
    cfg = load_config(ROOT / "params.yaml", profile=profile)  # the profile's shape
    s = cfg.sweep
    rng = random.Random(seed)
    steps_per_epoch = -(-1_000_000 // s.optim.batch_size)
    budget = s.optim.max_steps if s.optim.max_steps > 0 else s.optim.epochs * steps_per_epoch
    every = s.evaluation.val_every_steps or steps_per_epoch
    longest = budget * s.verdict.max_budget_factor
    recorded: Recorded = {}
    flops: dict[tuple, float] = {}
    for task, sizes in (s.grid.datasets or cfg.generate.datasets).items():
        for arch in s.grid.architectures_for(task):
            lrs = s.search.learning_rates(arch)
            best = min(len(lrs) - 1, len(lrs) // 2 - 1 if len(lrs) > 2 else 0)
            depths = s.grid.depths_for(arch)
            for seed_ in s.grid.seeds if seeds is None else range(seeds):
                noise = {(n, d): math.exp(rng.gauss(0, 0.25)) for n in sizes for d in depths}
                for size in sizes:
                    for depth in depths:
                        need = minimum_width(profile, task, size, sorted(sizes), arch, depth, depths)
                        for width in s.grid.widths_for(arch):
                            key = (task, size, arch, width, depth)
                            if key not in flops:
                                flops[key] = forward_flops(task, size, arch, width, depth, s.model.heads)
                            per_step = 3 * flops[key] * s.optim.batch_size / 1e15  # PFLOPs
                            cell = Cell(task, size, arch, width, depth, seed_)
                            recorded[cell] = {
                                lr: trial(rng, None if need is None else need * noise[size, depth], width,
                                          abs(i - best), i == 0 and len(lrs) > 2, per_step, budget, longest, every,
                                          s.verdict.convergence_min_steps, s.verdict.patience, gpu_tflops)
                                for i, lr in enumerate(lrs)
                            }
    return recorded


def trial(rng: random.Random, need: float | None, width: int, distance: int, largest: bool, per_step: float,
          budget: int, longest: int, every: int, min_steps: int, patience: int, gpu_tflops: float) -> Recording:
    """One learning-rate run's recording."""
    if largest and rng.random() < 1 / 3:
        steps = every * rng.randint(1, 5)
        return recording(Status.DIVERGED, [(t, 0.0) for t in range(every, steps + 1, every)], steps, per_step,
                         gpu_tflops)
    solves = need is not None and distance < 3 and width >= need * 2**distance
    if solves:
        assert need is not None
        solve = int(0.25 * budget * (1 + distance) * math.sqrt(need * 2**distance / width) * rng.uniform(0.7, 1.3))
        end = (solve // every + patience) * every
        if end > longest:
            return recording(Status.UNDECIDED, curve(rng, every, longest, solve, 1.0), longest, per_step, gpu_tflops)
        return recording(Status.SOLVED, curve(rng, every, end, solve, 1.0), end, per_step, gpu_tflops)
    plateau = min(0.85, 0.2 + 0.6 * (width / need if need else 0.3) / 2**distance)
    end = max(min_steps, 2 * every) // every * every + every * rng.randint(0, 3)
    return recording(Status.UNSOLVED, curve(rng, every, end, None, plateau), end, per_step, gpu_tflops)


def curve(rng: random.Random, every: int, end: int, solve: int | None, top: float) -> list[tuple[int, float]]:
    """Validation accuracies every ``every`` steps up to ``end``: a rise through the threshold at ``solve``, or a
    plateau at ``top``."""
    points = []
    for t in range(every, end + 1, every):
        if solve is None:
            value = top * (1 - math.exp(-3 * t / end))
        else:
            value = 1 / (1 + math.exp(-(t - solve) / (0.1 * solve + every))) * (1 - 0.1 * THRESHOLD) + 0.05
            value = max(value, THRESHOLD + 0.01) if t >= solve else min(value, THRESHOLD - 0.01)
        points.append((t, min(1.0, max(0.0, value + rng.gauss(0, 0.005)))))
    return points


def recording(status: Status, points: list[tuple[int, float]], steps: int, per_step: float,
              gpu_tflops: float) -> Recording:
    pflops = per_step * steps
    return Recording(
        status=status,
        val_accuracy=points[-1][1] if points else math.nan,
        train_pflops=pflops,
        seconds=pflops * 1e15 / (gpu_tflops * 1e12),
        steps=steps,
        cost=per_step,
        curve=[(t, a, per_step * t) for t, a in points],
    )
