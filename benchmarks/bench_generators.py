"""Generator speed, measured side by side in one run on this machine: our compiled batch generators
(Task.sample_batch, one process) against plain per-sample reference generators written from the spec
(benchmarks/reference.py), for every task and size of both papers, on the train split (what most of a dataset is).

    python benchmarks/bench_generators.py                     # every task and paper size (~3 minutes on 2 cores)
    python benchmarks/bench_generators.py --tasks lis ed --seconds 0.3

Both sides produce token ids ready to store; neither includes hashing or Parquet writing (the generate stage's
own cost: see the README for the wall time of the whole suite). The last lines estimate the DP paper's suite,
16 datasets x 1.1M samples, at each side's rates.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import tasks  # noqa: E402
from benchmarks.reference import reference_sample  # noqa: E402
from pipeline import config as config_mod  # noqa: E402

SUITE_SAMPLES = 1_100_000  # 1M train + 100k test per dataset


def rate(step, seconds: float) -> float:
    """Samples per second of ``step()`` (which returns how many samples it made), run for at least ``seconds``."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done == 0:
        done += step()
    return done / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="*", default=sorted(tasks.TASKS), help="tasks to time (default: all)")
    ap.add_argument("--seconds", type=float, default=1.0, help="minimum time per measurement (default: %(default)s)")
    args = ap.parse_args(argv)
    paper = config_mod.load(profile="paper", architectures=False).generate.datasets
    sizes = {**paper, **config_mod.load(profile="separations", architectures=False).generate.datasets}
    print(f"{os.cpu_count()} CPUs; one process per side; train split; >= {args.seconds} s per measurement\n")
    print(f"{'task':<13}{'size':>5}{'reference/s':>14}{'ours/s':>12}{'ratio':>9}")
    suite = {"reference": 0.0, "ours": 0.0}
    for name in args.tasks:
        for size in sizes[name]:
            task = tasks.get_task(name, size)
            rnd, rng = random.Random(0), np.random.default_rng(0)
            task.sample_batch(rng, "train", 1)  # load (or compile) the kernel outside the timing
            ref = rate(lambda: reference_sample(task, rnd, "train") and 1, args.seconds)
            ours = rate(lambda: len(task.sample_batch(rng, "train", 4096)), args.seconds)
            print(f"{name:<13}{size:>5}{ref:>14,.0f}{ours:>12,.0f}{ours / ref:>8,.0f}x", flush=True)
            if size in paper.get(name, []):
                suite["reference"] += SUITE_SAMPLES / ref
                suite["ours"] += SUITE_SAMPLES / ours
    if all(name in args.tasks for name in paper):
        print(f"\nDP paper suite ({sum(map(len, paper.values()))} datasets x {SUITE_SAMPLES:,} samples), "
              f"generation alone, one core: reference {suite['reference'] / 3600:.1f} h, ours "
              f"{suite['ours'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
