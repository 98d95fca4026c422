"""A fused trial whose members mostly stop early, with its frozen members dropped from the stack
(``Members.pays_to_restack``) and kept, side by side on this machine's CPU.

    python -m benchmarks.bench_restack            (K = 7, five members diverging at once, two training 400 steps)
    python -m benchmarks.bench_restack --quick    (K = 5, 40 steps, restacked whatever it costs; checks the script)

One round trains the fused trial (``run_fused``, Lightning, checkpoints saved at every validation, as a Tune worker's
are) twice on the tiny profile's lis data: its five highest learning rates diverge at their first steps and stop, the
other two train their whole budget (no stop when solved or converged). Once with the rule the sweep uses, once never
restacking (``--restack``: the rule's factor, default the sweep's); which goes first alternates; after a warm-up round,
``--rounds`` rounds. It prints each side's seconds and their ratio (kept / dropped: above 1, dropping the frozen members
is faster), median (min..max), and checks that both give every member the same record. The figures go to
``docs/benchmarks/bench_restack.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import yaml

from benchmarks.repeats import ratios, side_by_side, spread
from benchmarks.results import Results, figure, out_option, out_path
from pipeline.common.config import load_config
from pipeline.generate import generate_task
from pipeline.search.cells import build_cells
from pipeline.training.fused_trial import RESTACK, MemberCheckpoints, run_fused
from pipeline.training.settings import TrainSettings
from pipeline.training.train import TrialSpec

DIVERGING = (1e6, 3e5, 1e5, 3e4, 1e4)  # each distinct, as a cell's rates are: not finite within a few steps
TRAINING = (3e-3, 1e-3)
SAME = ("status", "reason", "train_steps", "train_pflops", "final_accuracy", "val_accuracy", "checkpoints")


def trial(work: Path, members: int, steps: int, width: int) -> list[TrialSpec]:
    """The fused trial's members on freshly generated tiny lis data: ``members`` rates, two of them training
    ``steps`` steps (validated every tenth of them), the rest diverging."""
    params = {"profile": "tiny", "tasks": ["lis"], "generate": {"datasets": {"lis": [4]}},
              "sweep": {"grid": {"architectures": ["standard"], "widths": [width], "depths": [2],
                                 "datasets": {"lis": [4]}}}}  # fmt: skip
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = load_config(work / "params.yaml")
    generate_task(cfg, "lis", work / "data", check=False)
    cell = next(iter(build_cells(cfg, work / "data").values()))
    train = TrainSettings.of(cfg).params() | {
        "max_steps": steps, "epochs": 10_000, "val_every_steps": max(1, steps // 10), "max_budget_factor": 1,
        "stop_when_solved": False, "convergence_min_steps": steps, "dropout": 0.0,
    }  # fmt: skip
    lrs = [*DIVERGING[: members - len(TRAINING)], *TRAINING]
    return [TrialSpec.for_cell(cell, train | {"lr": lr}) for lr in lrs]


class Fits(L.Callback):
    """How many fits trained the trial: 1, or 1 more for each restack."""

    def __init__(self):
        self.count = 0

    def on_fit_start(self, trainer, module):
        self.count += 1


def timed(specs: list[TrialSpec], restack: float | None) -> tuple[float, list[dict], int]:
    """Seconds for the whole fused trial, its members' records and how many fits it took."""
    names = [f"m{k}" for k in range(len(specs))]
    saving = functools.partial(MemberCheckpoints, saving=True)  # as a Tune worker's: restacking resumes from them
    fits = Fits()
    start = time.perf_counter()
    records = run_fused(specs, names, checkpoints=saving, callbacks=[fits], restack=restack)
    return time.perf_counter() - start, records, fits.count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_restack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="K = 5, 40 steps, width 16, --restack 0, 1 round")
    ap.add_argument("--members", type=int, default=7, help="K, the members fused (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=400, help="the training members' budget (default: %(default)s)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--restack", type=float, default=RESTACK,
                    help="restack where the steps left would cost over this many fit starts (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, a trial's CPUs (default: %(default)s)")
    out_option(ap, "bench_restack")
    args = ap.parse_args(argv)
    if args.quick:
        args.members, args.steps, args.width, args.rounds, args.restack = 5, 40, 16, 1, 0.0
    if not len(TRAINING) < args.members <= len(TRAINING) + len(DIVERGING):
        ap.error(f"--members must be {len(TRAINING) + 1} to {len(TRAINING) + len(DIVERGING)}, not {args.members}")
    torch.set_num_threads(args.threads)
    res = Results("bench_restack", argv)
    figures = res.section("cpu", {"members": args.members, "training": len(TRAINING), "steps": args.steps,
                                  "width": args.width, "rounds": args.rounds, "threads": args.threads,
                                  "restack": args.restack})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        specs = trial(Path(tmp), args.members, args.steps, args.width)
        dropped = functools.partial(timed, specs, args.restack)
        kept = functools.partial(timed, specs, None)
        side_by_side(dropped, kept, 1)  # warm-up: kernels compiled, the data read once
        with_restack, without = side_by_side(dropped, kept, args.rounds)
    differ = [(k, key) for (_, a, _), (_, b, _) in zip(with_restack, without) for k, (x, y) in enumerate(zip(a, b))
              for key in SAME if x[key] != y[key] and x[key] == x[key]]  # fmt: skip
    if differ:
        raise SystemExit(f"bench_restack: the members' records differ with and without restacking: {differ}")
    dropped_s, kept_s = [s for s, _, _ in with_restack], [s for s, _, _ in without]
    fits = [n for _, _, n in with_restack]
    gain = ratios(kept_s, dropped_s)
    print(f"K = {args.members} ({len(TRAINING)} training {args.steps} steps, the rest diverging), width {args.width}, "
          f"{args.threads} thread(s), {args.rounds} rounds: seconds for the whole fused trial")
    print(f"frozen members dropped {spread(dropped_s, '.1f', ' s')} (fits: {fits})  kept {spread(kept_s, '.1f', ' s')}"
          f"  kept/dropped {spread(gain, '.2f', 'x')}")
    figures["trial"] = {"dropped_s": figure(dropped_s, "s"), "kept_s": figure(kept_s, "s"), "ratio": figure(gain, "x"),
                        "fits_dropped": fits}  # fmt: skip
    res.write(out_path(args, "bench_restack"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
