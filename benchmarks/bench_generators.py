"""Generator speed, measured side by side in one run on this machine: our compiled batch generators
(Task.sample_batch, one process) against plain per-sample reference generators written from the spec
(``Task.reference``), for every task and size of both papers, on the train split (what most of a dataset is);
and beside them, for the DP paper's datasets, the whole generate stage end to end: a fresh
``python -m pipeline.generate`` with 1 and with 2 workers (start-up, deduplication, Parquet writing and the
re-check of 2,000 samples per file, as the ``paper`` profile runs it), at ``--stage-samples`` train samples plus a
tenth as many test samples: first for each dataset alone (the workers make its chunks), then for each DP task with
all four of its sizes, as ``dvc repro`` runs the stage (each worker makes whole datasets).

    python -m benchmarks.bench_generators                     # every task and paper size (~20 minutes on 2 cores)
    python -m benchmarks.bench_generators --seconds 0.3 --stage-samples 0        # the kernel columns alone
    python -m benchmarks.bench_generators --tasks arithmetic ed ed_local lis --seconds 0.3 --stage-samples 1000000
    python -m benchmarks.bench_generators --suite-only --stage-samples 1000000   # the last table alone (~16 min)

The kernel columns include neither hashing nor Parquet writing; the stage columns include everything. The last
lines estimate the DP paper's suite, 16 datasets x 1.1M samples, at each side's rates, and (with the DP tasks in
``--tasks``) time the whole stage on the suite at ``--stage-samples``: 1000000 is the paper's suite itself. Before
and after that table, what this machine's two cores give at that moment: one generator kernel alone, then two
copies at once in separate processes (the most two workers can gain over one on a shared machine).

Every figure is the median of ``--rounds`` measurements (default 3), the two sides of each comparison alternating
which goes first; each ratio is taken round by round, both sides measured in the same round, and printed as
'median (min..max)'. A round of the last table times every DP task once each way, so its total is one suite.

The figures go to ``docs/benchmarks/bench_generators.json`` (``--out``): one section per task's kernel rows
(``kernel/<task>``), the suite estimate and the suite table, each with its command line, date and commit
(``benchmarks.results``); a run replaces only the sections it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import tasks  # noqa: E402
from benchmarks.repeats import ratios, side_by_side, spread  # noqa: E402
from benchmarks.results import Results, figure, out_option, out_path  # noqa: E402
from pipeline.common.config import load_config  # noqa: E402
from tasks.base import Task  # noqa: E402

SUITE_SAMPLES = 1_100_000  # 1M train + 100k test per dataset
ROOT = Path(__file__).resolve().parent.parent


def rate(step: Callable[[], int], seconds: float) -> float:
    """Samples per second of ``step()`` (which returns how many samples it made), run for at least ``seconds``."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or done == 0:
        done += step()
    return done / elapsed


def reference_rate(task: Task, rnd: random.Random, seconds: float) -> float:
    """The reference implementation's samples per second, one sample a call."""

    def one() -> int:
        task.reference_sample(rnd, "train")
        return 1

    return rate(one, seconds)


def kernel_rate(task: Task, rng: np.random.Generator, seconds: float) -> float:
    """Our kernel's samples per second, in batches of 4,096."""
    return rate(lambda: len(task.sample_batch(rng, "train", 4096)), seconds)


def stage_seconds(name: str, sizes: list[int], train_samples: int, workers: int) -> float:
    """Seconds of the whole generate stage for ``sizes`` of task ``name``, from the command's start to its exit."""
    samples = {"train_samples": train_samples, "test_samples": train_samples // 10}
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.yaml"
        params.write_text(json.dumps({  # JSON is YAML
            "profile": "paper", "tasks": sorted(tasks.TASKS), "sweep": {"grid": {"datasets": {name: sizes}}},
            "generate": {"datasets": {name: sizes}, **samples}}))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pipeline.generate", "--task", name, "--params", str(params), "--out",
                        str(Path(tmp) / "data"), "--workers", str(workers)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)})
        return time.perf_counter() - start


CORE_PROBE = """
import sys, time, numpy as np, tasks
task, rng = tasks.get_task("ed", 20), np.random.default_rng(0)
task.sample_batch(rng, "train", 1)  # the compiled kernel, loaded from numba's cache
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # both copies start together
start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    task.sample_batch(rng, "train", 4096)
print(time.perf_counter() - start)
"""


def two_core_gain(batches: int, repeats: int = 3) -> list[float]:
    """How much more two processes make than one: ``2 t_alone / t_both`` (the slower of the pair), with one
    process alone and then two at once, ``repeats`` times."""
    def run(copies: int) -> float:
        start_at = str(time.time() + 3)  # after every copy's imports
        procs = [subprocess.Popen([sys.executable, "-c", CORE_PROBE, str(batches), start_at], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
                 for _ in range(copies)]
        return max(float(p.communicate()[0]) for p in procs)

    return [2 * run(1) / run(2) for _ in range(repeats)]


def bench_suite(paper: dict[str, list[int]], train_samples: int, rounds: int, res: Results) -> None:
    """The whole stage per DP task with 1 and 2 workers, ``rounds`` times, between two measures of what two cores
    give. Each round times every task, as ``dvc repro`` runs the suite, so a round's total is one suite's time."""
    probe = 150  # batches of 4,096 ed n=20 samples: about 3 s of kernel
    figures = res.section("suite", {"samples_per_dataset": train_samples + train_samples // 10, "rounds": rounds,
                                    "datasets": paper})
    figures["two_processes_before"] = figure(two_core_gain(probe), "x")
    print(f"\nTwo processes against one, same kernel (ed n=20), 3 times: "
          f"{spread(figures['two_processes_before']['values'], '.2f', 'x')}")
    print(f"The generate stage per DP task, all its paper sizes, as dvc repro runs it "
          f"({train_samples + train_samples // 10:,} samples a dataset; rounds: {rounds}):", flush=True)
    # task (and the whole suite) -> (1-worker seconds, 2-worker seconds), round by round
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in [*paper, "all four"]}
    for r in range(rounds):
        for name, task_sizes in paper.items():
            one, two = side_by_side(partial(stage_seconds, name, task_sizes, train_samples, 1),
                                    partial(stage_seconds, name, task_sizes, train_samples, 2), 1, start=r)
            times[name][0].extend(one)
            times[name][1].extend(two)
        for side in (0, 1):
            times["all four"][side].append(sum(times[name][side][r] for name in paper))
        print(f"  round {r + 1}: the suite in {times['all four'][0][r]:.1f} s with 1 worker, "
              f"{times['all four'][1][r]:.1f} s with 2", flush=True)
    print(f"{'task':<13}{'1 worker, s':>22}{'2 workers, s':>22}{'2w/1w':>22}")
    for name, (one, two) in times.items():
        print(f"{name:<13}{spread(one, '.1f'):>22}{spread(two, '.1f'):>22}{spread(ratios(one, two), '.2f', 'x'):>22}")
        figures[name] = {"1_worker_s": figure(one, "s"), "2_workers_s": figure(two, "s"),
                         "2w_over_1w": figure(ratios(one, two), "x")}
    figures["two_processes_after"] = figure(two_core_gain(probe), "x")
    after = spread(figures["two_processes_after"]["values"], ".2f", "x")
    print(f"Two processes against one, after the table: {after}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_generators", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="*", default=sorted(tasks.TASKS), help="tasks to time (default: all)")
    ap.add_argument("--seconds", type=float, default=1.0, help="minimum time per measurement (default: %(default)s)")
    ap.add_argument("--stage-samples", type=int, default=220_000,
                    help="train samples per end-to-end stage run, DP paper sizes only; 0 skips (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="repeats of every measurement, the sides alternating (default: %(default)s)")
    ap.add_argument("--suite-only", action="store_true",
                    help="only the whole stage per DP task (the DP tasks' kernels and single datasets are skipped)")
    out_option(ap, "bench_generators", quick_note=False)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.suite_only:
        args.tasks = []
    paper = load_config(profile="paper").sweep.grid.datasets  # the DP paper's grid
    assert paper is not None, "the paper profile names its grid's datasets"
    sizes = {**paper, **load_config(profile="separations").generate.datasets}
    print(f"{os.cpu_count()} CPUs; one process per side; train split; >= {args.seconds} s per measurement; "
          f"rounds: {args.rounds}, the sides alternating which goes first: medians, and each ratio taken round by "
          f"round as 'median (min..max)'")
    if args.tasks:
        print(f"\n{'':<18}{'------------ kernel, one process ------------':>47}   "
              f"{'-------- generate stage, end to end --------':>51}")
        print(f"{'task':<13}{'size':>5}{'reference/s':>14}{'ours/s':>12}{'ratio':>17}   {'1 worker/s':>12}"
              f"{'2 workers/s':>13}{'2w/1w':>19}{'2w/ours':>8}")
    suite = {"reference": 0.0, "ours": 0.0, "stage": 0.0}
    samples = args.stage_samples + args.stage_samples // 10  # train + test
    res = Results("bench_generators", argv)
    for name in args.tasks:
        figures = res.section(f"kernel/{name}", {"seconds": args.seconds, "rounds": args.rounds, "split": "train",
                                                 "stage_samples": args.stage_samples})
        for size in sizes[name]:
            task = tasks.get_task(name, size)
            rnd, rng = random.Random(0), np.random.default_rng(0)
            task.sample_batch(rng, "train", 1)  # load (or compile) the kernel outside the timing
            refs, ours = side_by_side(partial(reference_rate, task, rnd, args.seconds),
                                      partial(kernel_rate, task, rng, args.seconds), args.rounds)
            ref, our = statistics.median(refs), statistics.median(ours)
            line = f"{name:<13}{size:>5}{ref:>14,.0f}{our:>12,.0f}{spread(ratios(ours, refs), ',.0f', 'x'):>17}"
            row = figures[str(size)] = {"reference_per_s": figure(refs, "samples/s"),
                                        "ours_per_s": figure(ours, "samples/s"),
                                        "ratio": figure(ratios(ours, refs), "x")}
            if size in paper.get(name, []) and args.stage_samples:
                stage_s = side_by_side(partial(stage_seconds, name, [size], args.stage_samples, 1),
                                       partial(stage_seconds, name, [size], args.stage_samples, 2), args.rounds)
                ones, twos = ([samples / s for s in side] for side in stage_s)
                one, two = statistics.median(ones), statistics.median(twos)
                line += f"   {one:>12,.0f}{two:>13,.0f}{spread(ratios(twos, ones), '.2f', 'x'):>19}{two / our:>7.2f}x"
                row |= {"stage_1_worker_per_s": figure(ones, "samples/s"),
                        "stage_2_workers_per_s": figure(twos, "samples/s"),
                        "stage_2w_over_1w": figure(ratios(twos, ones), "x"),
                        "stage_2w_over_kernel": figure(two / our, "x")}
                suite["stage"] += SUITE_SAMPLES / two
            print(line, flush=True)
            if size in paper.get(name, []):
                suite["reference"] += SUITE_SAMPLES / ref
                suite["ours"] += SUITE_SAMPLES / our
    if all(name in args.tasks for name in paper) and not args.suite_only:
        estimate = res.section("estimate", {"datasets": sum(map(len, paper.values())), "samples": SUITE_SAMPLES,
                                            "stage_samples": args.stage_samples})
        estimate["reference_one_core_h"] = figure(suite["reference"] / 3600, "h")
        estimate["ours_one_core_min"] = figure(suite["ours"] / 60, "min")
        if args.stage_samples:
            estimate["stage_2_workers_one_dataset_at_a_time_min"] = figure(suite["stage"] / 60, "min")
        print(f"\nDP paper suite ({sum(map(len, paper.values()))} datasets x {SUITE_SAMPLES:,} samples), "
              f"generation alone, one core: reference {suite['reference'] / 3600:.1f} h, ours "
              f"{suite['ours'] / 60:.1f} min" + (f"; the whole stage one dataset at a time, 2 workers: "
                                                 f"{suite['stage'] / 60:.1f} min (at {args.stage_samples:,}-sample "
                                                 "runs: start-up weighs more)" if args.stage_samples else ""))
    if (args.suite_only or all(name in args.tasks for name in paper)) and args.stage_samples:
        bench_suite(paper, args.stage_samples, args.rounds, res)
    res.write(out_path(args, "bench_generators"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
