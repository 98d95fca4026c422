"""Command `validate`: re-derive every answer and chain-of-thought value of stored datasets from the prompts alone.

    python -m pipeline.data.validate --task lis                      every file in data/lis, every sample
    python -m pipeline.data.validate --task lis --samples 10000      a seeded random subset of each file
    python -m pipeline.data.validate data/lis/lis_250_train.parquet --workers 2

Each file's task is rebuilt from the file's own metadata (name, size, parameters) and must give the same
vocabulary; the footer's statistics must match the data (sample count, maximum length). Then the task's
independent checker (plain Python, none of the generator's code) runs on every chosen sample, one row group per
work unit, spread over worker processes, with a progress bar. The generate stage runs the same checker on the same
rows (``generate.validate_samples`` per file, the same seeded choice; null = every sample) while it writes each
file, on the tables it hands to the Parquet writer.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import tasks
from pipeline.common.config import ROOT
from pipeline.common.progress import progress
from pipeline.data.datasets import DatasetError, read_metadata
from pipeline.data.parallel import Pool


@functools.lru_cache(maxsize=8)
def cached_task(name: str, size: int, params: str) -> tasks.Task:
    """One task object per worker process and dataset (``params`` as sorted JSON, to be hashable)."""
    return tasks.get_task(name, size, **json.loads(params))


def task_key(meta: dict) -> tuple[str, int, str]:
    return meta["task"], meta["size"], json.dumps(meta["params"], sort_keys=True)


def check_rows(path: Path, key: tuple[str, int, str], group: int, first: int, rows: np.ndarray) -> int:
    """Run the checker on ``rows`` (indices inside row group ``group``, which starts at sample ``first``)."""
    table = pq.ParquetFile(path).read_row_group(group, columns=["tokens", "prompt_len", "answer"])
    return check_table(cached_task(*key), table, first, rows, path)


def check_table(task: tasks.Task, table: pa.Table, first: int, rows: np.ndarray, path: Path) -> int:
    """Run the checker on ``rows`` of ``table``, whose row 0 is sample ``first`` of file ``path``."""
    if not len(rows):
        return 0
    picked = table.take(pa.array(rows))  # copies the chosen rows only, not the whole row group
    tokens = picked.column("tokens").combine_chunks()
    offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
    prompt_len, answer = picked.column("prompt_len").to_numpy(), picked.column("answer").to_numpy()
    for i, r in enumerate(rows):
        try:
            task.check(values[offsets[i] : offsets[i + 1]], int(prompt_len[i]), int(answer[i]))  # offsets index .values
        except tasks.TaskError as err:
            raise tasks.TaskError(f"{path} sample {first + r}: {err}") from None
    return len(rows)


def chosen_rows(count: int, samples: int | None, seed: int) -> np.ndarray:
    """The rows a check covers, in order: all ``count`` (``samples`` None), or that many of them at random."""
    if samples is None or samples >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, samples, replace=False))


class WriteCheck:
    """The checker on the chosen rows of a file as it is written: called with each table handed to the Parquet
    writer and its first row's index (``ParquetSink``'s ``inspect``), so no file is read back."""

    def __init__(self, task: tasks.Task, path: Path, count: int, samples: int | None, seed: int):
        self.task, self.path = task, path
        self.rows = chosen_rows(count, samples, seed)
        self.checked = 0

    def __call__(self, table: pa.Table, first: int) -> None:
        rows = self.rows[(self.rows >= first) & (self.rows < first + len(table))] - first
        self.checked += check_table(self.task, table, first, rows, self.path)


def validate_file(path: Path, samples: int | None = None, seed: int = 0, pool: Pool | None = None) -> int:
    """Check ``samples`` random samples of one file (None: all of them); returns how many were checked."""
    path = Path(path)
    meta = read_metadata(path)
    try:
        task = tasks.get_task(meta["task"], meta["size"], **meta["params"])
    except (KeyError, tasks.TaskError) as err:
        raise DatasetError(f"{path}: metadata does not describe a valid task ({err})") from None
    if task.tokens != meta["vocab"]:
        raise DatasetError(f"{path}: the vocabulary in the metadata differs from the task's (generator changed?)")
    parquet = pq.ParquetFile(path)
    count = parquet.metadata.num_rows
    max_length = pc.max(parquet.read(columns=["length"]).column("length")).as_py()
    if (meta["stats"]["samples"], meta["stats"]["max_length"]) != (count, max_length):
        raise DatasetError(
            f"{path}: stats say {meta['stats']['samples']} samples of max length "
            f"{meta['stats']['max_length']}, the data has {count} of max length {max_length}"
        )
    chosen = chosen_rows(count, samples, seed)
    starts = np.cumsum([0] + [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])
    units = []
    for g in range(parquet.num_row_groups):
        rows = chosen[(chosen >= starts[g]) & (chosen < starts[g + 1])] - starts[g]
        if len(rows):
            units.append((path, task_key(meta), g, int(starts[g]), rows))
    pool = pool or Pool(1)
    with progress(len(chosen), f"validate {path.name}", unit="samples") as bar:
        for done in pool.imap(check_rows, units):
            bar.update(done)
    return len(chosen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.data.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="*", type=Path, help="Parquet files to check (or use --task)")
    ap.add_argument("--task", help="check every file in DATA/<task>/")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="data directory (default: %(default)s)")
    ap.add_argument("--samples", type=int, help="random samples per file (default: every sample)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random subset (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=1, help="checker processes (default: %(default)s)")
    args = ap.parse_args(argv)
    files = list(args.files) + (sorted((args.data / args.task).glob("*.parquet")) if args.task else [])
    if not files:
        ap.error("name Parquet files or --task (with its files in --data)")
    if args.samples is not None and args.samples < 1 or args.workers < 1:
        ap.error("--samples and --workers must be >= 1")
    try:
        with Pool(args.workers) as pool:
            for path in files:
                checked = validate_file(path, args.samples, args.seed, pool)
                print(f"{path}: {checked} samples re-derived from their prompts, all correct")
    except (DatasetError, tasks.TaskError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
