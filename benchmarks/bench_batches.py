"""Building a training batch: the vectorised collate (one gather from the flat token array) against the loop over
samples it replaced, side by side on the same batches.

    python -m benchmarks.bench_batches                 (lis n=110, L~450: the paper profile's second size)
    python -m benchmarks.bench_batches --quick         (lis n=10; checks the script)

Generates one lis training file (``--samples``, default 4,096) in a scratch directory, takes its length-bucketed
batches of ``--batch`` samples (the paper profile's 512) and times building every batch with each collate, both
in every round, alternating which goes first; prints batches per second of each and their ratio, median
(min..max) over ``--rounds``. The figures go to ``docs/benchmarks/bench_batches.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from benchmarks.repeats import ratios, side_by_side, spread
from benchmarks.results import Results, figure, out_option, out_path
from pipeline.common.config import load_config
from pipeline.data.datasets import Dataset, dataset_path, read_dataset
from pipeline.generate import generate_task
from pipeline.training.batches import LengthBuckets, collate, collate_reference


def make_data(work: Path, n: int, samples: int) -> Dataset:
    params = {"profile": "tiny", "tasks": ["lis"], "generate": {"train_samples": samples, "test_samples": 16,
                                                               "datasets": {"lis": [n]}}}
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    generate_task(load_config(work / "params.yaml"), "lis", work / "data", check=False)
    return read_dataset(dataset_path(work / "data", "lis", n, "train"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_batches", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="lis n=10, 3 rounds: checks the script")
    ap.add_argument("--n", type=int, default=110, help="lis size (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    out_option(ap, "bench_batches")
    args = ap.parse_args(argv)
    n, rounds = (10, 3) if args.quick else (args.n, args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-batches-") as tmp:
        data = make_data(Path(tmp), n, args.samples)
        batches = [np.asarray(b) for b in LengthBuckets(data.lengths, args.batch, seed=0)]

        def rate(build) -> float:  # batches per second over the epoch's batches
            start = time.perf_counter()
            for rows in batches:
                build(data, rows)
            return len(batches) / (time.perf_counter() - start)

        fast, plain = side_by_side(lambda: rate(collate), lambda: rate(collate_reference), rounds)
    speedup = ratios(fast, plain)
    tokens = int(data.lengths.mean()) + 1
    print(f"lis n={n} (mean length {tokens} tokens), {len(batches)} batches of {args.batch}, {rounds} rounds")
    print(f"vectorised   {spread(fast, '.0f')} batches/s")
    print(f"per sample   {spread(plain, '.0f')} batches/s")
    print(f"ratio        {spread(speedup, '.1f', 'x')}")
    res = Results("bench_batches", argv)
    figures = res.section(f"collate_lis{n}", {"lis_n": n, "mean_length": tokens, "batch": args.batch,
                                      "batches": len(batches), "rounds": rounds})
    figures |= {"vectorised_batches_per_s": figure(fast, "batches/s"),
                "per_sample_batches_per_s": figure(plain, "batches/s"), "ratio": figure(speedup, "x")}
    res.write(out_path(args, "bench_batches"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
