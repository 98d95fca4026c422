"""K models trained as one fused model (``models.fused``, ``pipeline.training.fused_step``) against the same K models
trained one step each, side by side on this machine's CPU.

    python -m benchmarks.bench_fused                   (K = 7 at the separations shape: depth 1, L = 102, batch 64)
    python -m benchmarks.bench_fused --quick           (toy sizes; checks the script)

For each architecture and width, one round times K separate training steps (each model with its own torch.optim.Adam,
as K trials of a cell's learning rates) and one fused step of the K models (``fused_step``: the same models, rates,
batch and Adam), alternating which goes first, each side the fastest of ``--best-of`` steps (the machine's other
jobs only ever add time); after a warm-up round, ``--rounds`` rounds. It prints each side's
time for the K models' step and their ratio (separate / fused: above 1, fusing is faster), median (min..max). The
figures go to ``docs/benchmarks/bench_fused.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

import models
from benchmarks.repeats import ratios, side_by_side, spread
from benchmarks.results import Results, figure, out_option, out_path
from pipeline.training.batches import IGNORE
from pipeline.training.fused_step import FusedStep, fused_step
from pipeline.training.settings import TrainSettings

ARCHS = ("transformer", "mamba", "lstm", "linear_nofm", "dss", "retnet")
VOCAB = 20  # the separations tasks' vocabularies are 10-30 tokens


def step_apart(trials: list, inputs: torch.Tensor, targets: torch.Tensor, best_of: int) -> float:
    """Seconds for one training step of each (model, optimizer) in turn: the fastest of ``best_of`` such steps."""
    times = []
    for _ in range(best_of):
        start = time.perf_counter()
        for model, opt in trials:
            opt.zero_grad(set_to_none=True)
            logits = model(inputs)
            F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE).backward()
            opt.step()
        times.append(time.perf_counter() - start)
    return min(times)


def step_fused(step: FusedStep, inputs: torch.Tensor, targets: torch.Tensor, best_of: int) -> float:
    """Seconds for one step of the fused models: the fastest of ``best_of``."""
    times = []
    for _ in range(best_of):
        start = time.perf_counter()
        step(inputs, targets)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_fused", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="K = 2, width 16, L = 20, batch 4, 1 round")
    ap.add_argument("--archs", nargs="+", default=list(ARCHS), choices=sorted(models.ARCHITECTURES))
    ap.add_argument("--widths", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--members", type=int, default=7, help="K, the models fused (default: %(default)s)")
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--length", type=int, default=102, help="L, tokens a sequence (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--best-of", type=int, default=3,
                    help="steps per side in a round, the fastest kept: other jobs on the machine only add time "
                         "(default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, a trial's CPUs (default: %(default)s)")
    out_option(ap, "bench_fused")
    args = ap.parse_args(argv)
    if args.quick:
        args.members, args.widths, args.length, args.batch, args.rounds, args.best_of = 2, [16], 20, 4, 1, 1
    torch.set_num_threads(args.threads)
    lrs = [10.0 ** -(2 + i / 2) for i in range(args.members)]  # the rates differ, as a cell's do
    settings = TrainSettings().replaced(heads=4, dropout=0.0, optimizer="adam", warmup_fraction=0.0, grad_clip=None)
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.batch, args.length + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    res = Results("bench_fused", argv)
    figures = res.section("cpu", {"members": args.members, "depth": args.depth, "length": args.length,
                                  "batch": args.batch, "rounds": args.rounds, "best_of": args.best_of,
                                  "threads": args.threads})
    print(f"K = {args.members} models, depth {args.depth}, L = {args.length}, batch {args.batch}, "
          f"{args.threads} thread(s), {args.rounds} rounds of the best of {args.best_of}: seconds for one step of all "
          "K models")
    for arch in args.archs:
        for width in args.widths:
            shape = dict(vocab_size=VOCAB, width=width, depth=args.depth, max_len=args.length)
            fused = fused_step(arch, lrs, settings, **shape)
            notes = fused.model.notes(torch.device("cpu"))
            trials = []
            for k, lr in enumerate(lrs):
                model = fused.model.member(k).train()
                trials.append((model, torch.optim.Adam(model.parameters(), lr=lr)))
            separate = functools.partial(step_apart, trials, inputs, targets, args.best_of)
            together = functools.partial(step_fused, fused, inputs, targets, args.best_of)
            side_by_side(separate, together, 1)  # warm-up: kernels compiled, allocations made
            apart, joint = side_by_side(separate, together, args.rounds)
            gain = ratios(apart, joint)
            print(f"{arch:12} D={width:<4} separate {spread(apart, '.3f', ' s')}  fused {spread(joint, '.3f', ' s')}  "
                  f"separate/fused {spread(gain, '.2f', 'x')}" + "".join(f"\n    ({note})" for note in notes))
            figures[f"{arch}_w{width}"] = {"separate_s": figure(apart, "s"), "fused_s": figure(joint, "s"),
                                           "ratio": figure(gain, "x"), "notes": notes}
    res.write(out_path(args, "bench_fused"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
