"""Stage `generate`: write the train and test Parquet files of every size of one task in the active profile.

    python -m pipeline.generate --task lis          (dvc.yaml runs one of these per task, as a matrix)

Test samples are drawn first, then train samples that are unique and never equal a test sample (whole
sequences compared through 64-bit hashes). Every written sample is re-checked by the task's checker unless
``--no-check``. Files appear under their final name only once complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np

import tasks
from pipeline import config as config_mod
from pipeline.datasets import DatasetError, ParquetSink, dataset_path, read_dataset
from pipeline.progress import progress

SPLITS = ("test", "train")
MAX_DRAWS_PER_SAMPLE = 20  # give up when unique samples are this rare: the space is too small


def seq_hash(tokens: np.ndarray) -> int:
    """64-bit digest of a whole sequence; a collision can only drop a sample, never admit a duplicate."""
    return int.from_bytes(hashlib.blake2b(tokens.astype(np.int32).tobytes(), digest_size=8).digest(), "little")


def rng_for(seed: int, task: str, size: int, split: str) -> np.random.Generator:
    """Independent stream per (task, size, split): files do not depend on which other datasets exist."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), size, SPLITS.index(split)])


def write_split(task: tasks.Task, split: str, count: int, seed: int, seen: set[int], path: Path,
                row_group_size: int) -> dict:
    rng = rng_for(seed, task.name, task.size, split)
    meta = {**task.metadata(), "split": split, "seed": seed}
    sink = ParquetSink(path, meta, row_group_size)
    bar = progress(count, f"{task.name} {task.size} {split}", unit="samples")
    draws = 0
    try:
        while sink.count < count:
            draws += 1
            if draws > MAX_DRAWS_PER_SAMPLE * count:
                raise tasks.TaskError(
                    f"{task.name} size {task.size}: only {sink.count} distinct {split} samples after {draws - 1} "
                    f"draws; the space of distinct samples is too small for {count}: lower "
                    f"generate.{split}_samples")
            s = task.sample(rng, split)
            h = seq_hash(s.tokens)
            if h in seen:
                continue
            seen.add(h)
            sink.add(s.tokens, s.prompt_len, s.answer)
            bar.update(1)
        stats = sink.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
    return stats


def check_file(task: tasks.Task, path: Path) -> int:
    """Run the task's checker over every sample of a written file; returns the number checked."""
    data = read_dataset(path)
    for i in range(len(data)):
        try:
            task.check(data.sequence(i), int(data.prompt_len[i]), int(data.answer[i]))
        except tasks.TaskError as err:
            raise tasks.TaskError(f"{path} sample {i}: {err}") from None
    return len(data)


def generate_task(cfg: config_mod.Config, name: str, out_dir: Path, check: bool = True) -> dict:
    gen = cfg.generate
    sizes = gen.datasets.get(name, [])
    params = gen.task_params.get(name, {})
    built = [tasks.get_task(name, size, **params) for size in sizes]  # every size validated before writing
    task_dir = out_dir / name
    if task_dir.exists():
        shutil.rmtree(task_dir)  # never mix files of an earlier, possibly interrupted, run
    task_dir.mkdir(parents=True)
    manifest = {"task": name, "profile": cfg.profile, "datasets": []}
    for task in built:
        seen: set[int] = set()
        for split in SPLITS:
            count = gen.test_samples if split == "test" else gen.train_samples
            path = dataset_path(out_dir, name, task.size, split)
            stats = write_split(task, split, count, gen.seed, seen, path, gen.row_group_size)
            if check:
                check_file(task, path)
            manifest["datasets"].append({"size": task.size, "split": split, "file": path.name,
                                         "samples": stats["samples"], "max_length": stats["max_length"],
                                         "mean_length": stats["mean_length"], "checked": check})
    (task_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, help="registered task name (see params.yaml `tasks`)")
    ap.add_argument("--params", default=str(config_mod.ROOT / "params.yaml"), help="params file (default: %(default)s)")
    ap.add_argument("--out", default=str(config_mod.ROOT / "data"), help="data directory (default: %(default)s)")
    ap.add_argument("--no-check", action="store_true", help="skip re-checking every written sample")
    args = ap.parse_args(argv)
    try:
        cfg = config_mod.load(args.params)  # validates the whole config, sweep included, before any work
        if args.task not in cfg.tasks:
            raise config_mod.one_of("--task", args.task, cfg.tasks)
        manifest = generate_task(cfg, args.task, Path(args.out), check=not args.no_check)
    except (config_mod.ConfigError, tasks.TaskError, DatasetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for d in manifest["datasets"]:
        print(f"{args.task} size {d['size']} {d['split']}: {d['samples']} samples, max length {d['max_length']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
