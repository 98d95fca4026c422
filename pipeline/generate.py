"""Stage `generate`: write the test, validation and train Parquet files of every size of one task in the active
profile.

    python -m pipeline.generate --task lis              (dvc.yaml runs one of these per task, as a matrix)
    python -m pipeline.generate --task lis --workers 2  (the same bytes, made by two worker processes)

Every size is validated, and its sample counts compared with the space of distinct samples, before anything is
written. Samples come from the task's compiled generator in seeded chunks, so the bytes never depend on the workers;
with ``generate.unique`` (the default) test, validation and train hold no sample twice. The task's checker runs on
every sample (or ``generate.validate_samples`` of each file) as it is written; ``python -m pipeline.data.validate``
re-reads stored files. Files are written under ``<out>/.staging/<task>/`` and renamed to ``<out>/<task>/`` once all
are complete: an interrupted run leaves no file that looks complete. Details: docs/datasets.md, "How the files are
made".
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tasks
from pipeline.common.config import MAX_WORKERS, ROOT, Config, ConfigError, GenerateConfig, load_config, one_of
from pipeline.common.locks import remove_if_dead, try_lock
from pipeline.common.progress import hide_bars, progress
from pipeline.common.signals import exit_on_signals
from pipeline.data.datasets import DatasetError, ParquetSink, dataset_path
from pipeline.data.dedup import SeenSet, row_hashes
from pipeline.data.parallel import Pool
from pipeline.data.validate import WriteCheck, cached_task
from tasks import SPLITS

# The order the splits are drawn in: each kept sample is new to those before it, so train avoids both held-out splits.
ORDER = ("test", "val", "train")
MAX_DRAWS_PER_SAMPLE = 20  # give up when unique samples are this rare: the space is too small
# Staging lives inside the data directory, so it is on the outputs' filesystem and the final rename is atomic (a
# sibling of data/ need not be: data/ may be a mount), and .dvcignore hides it from DVC, which hashes data/ as the
# sweep's dependency: a run killed by SIGKILL leaves nothing DVC sees.
STAGING_DIR = ".staging"


def rng_for(seed: int, task: str, size: int, split: str, chunk: int) -> np.random.Generator:
    """Independent stream per (task, size, split, chunk): files do not depend on which other datasets exist."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), size, SPLITS.index(split), chunk])


@dataclass(frozen=True)
class Stream:
    """Everything a chunk of raw samples depends on (and so nothing about the process that makes it)."""

    task: str
    size: int
    params: str  # JSON, sorted keys
    split: str
    seed: int
    chunk_size: int
    planned: int  # samples wanted: later chunks only replace duplicates ("fill" draws)
    hashed: bool  # whether the kept samples must be distinct


def make_chunk(stream: Stream, index: int) -> tuple[tasks.Packed, np.ndarray | None]:
    """Chunk ``index`` of the stream, and its row hashes when samples must be distinct."""
    task = cached_task(stream.task, stream.size, stream.params)
    rng = rng_for(stream.seed, stream.task, stream.size, stream.split, index)
    batch = task.sample_batch(rng, stream.split, stream.chunk_size, fill=index * stream.chunk_size >= stream.planned)
    return batch, row_hashes(batch.values, batch.offsets) if stream.hashed else None


def write_split(
    task: tasks.Task,
    split: str,
    count: int,
    gen: GenerateConfig,
    seen: SeenSet | None,
    path: Path,
    pool: Pool,
    check: bool,
) -> tuple[dict, int]:
    """Write one split's file; its statistics and how many of its samples the checker ran on."""
    chunk = min(gen.chunk_size, count)
    stream = Stream(
        task.name, task.size, json.dumps(task.params, sort_keys=True), split, gen.seed, chunk, count, seen is not None
    )
    meta = {**task.metadata(), "split": split, "seed": gen.seed, "unique": gen.unique, "chunk_size": chunk}
    checker = WriteCheck(task, path, count, gen.validate_samples, gen.seed) if check else None
    sink = ParquetSink(path, meta, gen.row_group_size, inspect=checker)
    bar = progress(count, f"{task.name} {task.size} {split}", unit="samples")
    # this process pauses to write each row group (its main cost): queue that many chunks beyond the usual 2 per
    # worker, so the workers keep generating meanwhile (a few MB per chunk)
    ahead = 2 * pool.workers + gen.row_group_size // chunk
    chunks = pool.imap(make_chunk, ((stream, c) for c in itertools.count()), ahead)
    try:
        for c, (batch, hashes) in enumerate(chunks):
            need = count - sink.count
            keep = seen.add_new(hashes, need) if seen is not None else np.arange(len(batch)) < need
            sink.add(batch.select(keep))
            bar.update(int(keep.sum()))
            if sink.count == count:
                break
            if (c + 1) * chunk >= MAX_DRAWS_PER_SAMPLE * count:
                raise tasks.TaskError(
                    f"{task.name} size {task.size}: only {sink.count} distinct {split} samples after {(c + 1) * chunk} "
                    f"draws; the space of distinct samples is too small for {count}: lower generate.{split}_samples"
                )
        stats = sink.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        chunks.close()
        bar.close()
    return stats, checker.checked if checker else 0


def generate_task(cfg: Config, name: str, out_dir: Path, check: bool = True, workers: int | None = None) -> dict:
    """Write every size of task ``name`` under ``out_dir/name`` (``workers``: default generate.workers)."""
    gen = cfg.generate.for_task(name)
    params = gen.task_params.get(name, {})
    built = [tasks.get_task(name, size, **params) for size in gen.datasets.get(name, [])]  # all validated first
    for task in built:
        if gen.unique:
            task.check_space(gen.test_samples, gen.train_samples, gen.val_samples)
    final = out_dir / name
    manifest: dict[str, Any] = {"task": name, "profile": cfg.profile, "datasets": []}
    with staging_dir(out_dir, name) as staging:
        if final.exists():  # never mix files of an earlier run
            shutil.rmtree(final)
        with Pool(workers or gen.workers) as pool:
            if by_dataset(built, pool.workers):
                # a whole dataset per worker, the costliest first: no chunk crosses a pipe, no one process writes
                # every file (the critical path of the other way)
                order = sorted(built, key=cost, reverse=True)
                with progress(len(built), f"{name}: datasets, {pool.workers} at a time", unit="datasets") as bar:
                    made = pool.map(
                        make_dataset,
                        [(t.name, t.size, json.dumps(t.params, sort_keys=True), gen, staging, check) for t in order],
                        done=lambda _: bar.update(),
                    )
                entries = dict(zip((t.size for t in order), made))
                for task in built:
                    manifest["datasets"] += entries[task.size]
            else:
                for task in built:
                    manifest["datasets"] += write_dataset(task, gen, staging, check, pool)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        staging.rename(final)  # the task's files appear together, and only when all are complete
    return manifest


def cost(task: tasks.Task) -> int:
    """A dataset's expected cost, up to a factor shared by the task's sizes: its longest sequence."""
    return task.max_length()


def by_dataset(built: list[tasks.Task], workers: int) -> bool:
    """Whether to give each worker whole datasets: when there are several workers and no dataset is more than an
    even share of the work, so they can end together. Otherwise the workers make chunks of one dataset at a time,
    which this process writes."""
    return workers > 1 and len(built) >= workers and max(map(cost, built)) <= sum(map(cost, built)) / workers


def write_dataset(task: tasks.Task, gen: GenerateConfig, staging: Path, check: bool, pool: Pool) -> list:
    """The test, validation and train files of one size of a task (with ``gen.unique``, each unique and disjoint
    from those before it), each checked while written unless ``check`` is false; their manifest entries."""
    counts = {"test": gen.test_samples, "val": gen.val_samples, "train": gen.train_samples}
    seen = SeenSet(sum(counts.values())) if gen.unique else None
    entries = []
    for split in ORDER:
        count = counts[split]
        path = staging / dataset_path(staging, task.name, task.size, split).name
        stats, checked = write_split(task, split, count, gen, seen, path, pool, check)
        entries.append(
            {
                "size": task.size,
                "split": split,
                "file": path.name,
                "samples": stats["samples"],
                "max_length": stats["max_length"],
                "mean_length": stats["mean_length"],
                "checked": checked,
            }
        )
    return entries


def make_dataset(name: str, size: int, params: str, gen: GenerateConfig, staging: Path, check: bool) -> list:
    """``write_dataset`` alone in a worker process, beside the other workers' datasets."""
    hide_bars()  # the parent shows one bar for all the workers
    return write_dataset(cached_task(name, size, params), gen, staging, check, Pool(1))


@contextlib.contextmanager
def staging_dir(out_dir: Path, name: str) -> Iterator[Path]:
    """A new ``out_dir/.staging/<name>/``, whose lock file ``<name>.lock`` beside it this process holds while it
    writes there; removed on any error or interruption (renamed away by the caller on success). First removes the
    staging directories of dead runs (of any task: a dvc matrix runs the tasks one after another) and leaves those
    of live runs alone; a live run of the same task is an error (the two would delete each other's files)."""
    root = out_dir / STAGING_DIR
    root.mkdir(parents=True, exist_ok=True)
    staging = root / name
    guard = try_lock(root / ".lock", wait=True)  # one process at a time scans and creates: none sees a new dir
    try:
        lock = try_lock(root / f"{name}.lock")
        if lock is None:
            raise DatasetError(f"another generate of task {name} is writing {staging}: wait for it to end")
        try:
            for entry in sorted(root.iterdir()):
                if entry.is_dir() and entry != staging:
                    remove_if_dead(entry)
            if staging.exists():  # this task's, and we hold its lock: a dead run's
                shutil.rmtree(staging)
            staging.mkdir()
        except BaseException:
            os.close(lock)
            raise
    finally:
        os.close(guard)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--task", required=True, help="registered task name (see params.yaml `tasks`)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "data"), help="data directory (default: %(default)s)")
    ap.add_argument("--workers", type=int, help="generator processes (default: generate.workers); same output")
    ap.add_argument("--no-check", action="store_true", help="skip checking the samples as they are written")
    args = ap.parse_args(argv)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        ap.error(f"--workers {args.workers}: allowed 1 to {MAX_WORKERS} (generate.workers' range)")
    try:
        # validates the whole config before any work, sweep included, but the architecture names (torch's
        # import alone costs more than small datasets: the sweep stage checks them)
        cfg = load_config(args.params)
        if args.task not in cfg.tasks:
            raise one_of("--task", args.task, cfg.tasks)
        with exit_on_signals():
            manifest = generate_task(cfg, args.task, Path(args.out), check=not args.no_check, workers=args.workers)
    except (ConfigError, tasks.TaskError, DatasetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for d in manifest["datasets"]:
        print(
            f"{args.task} size {d['size']} {d['split']}: {d['samples']} samples, max length {d['max_length']}, "
            f"{d['checked']} checked"
        )
    if not manifest["datasets"]:
        print(f"{args.task}: no sizes in profile {manifest['profile']!r}; wrote only the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
