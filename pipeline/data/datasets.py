"""Parquet datasets: one file per (task, size, split), written atomically, read back with their metadata.

Schema (one row per sample):
    tokens      list<uint16>  prompt + chain of thought + answer + <eos>, as vocabulary ids
    prompt_len  int32         tokens before the first generated one
    answer      int32         id of the final-answer token (the one just before <eos>)
    length      int32         len(tokens) - 1, the sequence length L as the DP paper counts it
File metadata key ``capacity_atlas``: JSON with task, family, size, split, seed, generator version and parameters,
vocabulary (list of token strings, id = index) and statistics (samples, max/mean length, length and answer counts,
the task's per-sample features such as the locality window).

Trials read a dataset through memory maps, not copies (``read_dataset``): on first use, each file's columns are
written once, uncompressed, as flat ``.npy`` arrays in ``<dir>/.mapped/<name>.<sha256 of the file>/`` beside it (DVC
ignores it: ``.dvcignore``). A trial's private memory then does not grow with the data, and the trials on one node
share one copy in the page cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.base import Packed

META_KEY = b"capacity_atlas"
MAPPED_DIR = ".mapped"  # beside the Parquet files, keyed by their content
SCHEMA = pa.schema(
    [("tokens", pa.list_(pa.uint16())), ("prompt_len", pa.int32()), ("answer", pa.int32()), ("length", pa.int32())]
)


class DatasetError(RuntimeError):
    """A dataset file that is missing, corrupt, or not one of ours."""


def dataset_path(data_dir: Path, task: str, size: int, split: str) -> Path:
    return Path(data_dir) / task / f"{task}_{size}_{split}.parquet"


class Stats:
    """Running distributions of one file: lengths, answers and the task's per-sample features (their maxima)."""

    def __init__(self):
        self.lengths = np.zeros(0, np.int64)  # lengths[L] = samples of length L
        self.answers = np.zeros(0, np.int64)
        self.features: dict[str, int] = {}

    def update(self, batch: Packed) -> None:
        self.lengths = add_counts(self.lengths, np.bincount(batch.lengths))
        self.answers = add_counts(self.answers, np.bincount(batch.answer))
        for name, values in batch.features.items():
            self.features[name] = max(self.features.get(name, 0), int(values.max(initial=0)))

    def summary(self) -> dict:
        samples = int(self.lengths.sum())
        return {
            "samples": samples,
            "max_length": int(np.flatnonzero(self.lengths).max(initial=0)),
            "mean_length": round(float(self.lengths @ np.arange(len(self.lengths))) / max(samples, 1), 3),
            "length_counts": nonzero_counts(self.lengths),
            "answer_counts": nonzero_counts(self.answers),
            **self.features,
        }


def add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(max(len(a), len(b)), np.int64)
    out[: len(a)] += a
    out[: len(b)] += b
    return out


def nonzero_counts(counts: np.ndarray) -> dict[str, int]:
    return {str(i): int(counts[i]) for i in np.flatnonzero(counts)}


def to_table(batch: Packed) -> pa.Table:
    offsets = pa.array(batch.offsets.astype(np.int32))
    return pa.table(
        {
            "tokens": pa.ListArray.from_arrays(offsets, pa.array(batch.values.astype(np.uint16, copy=False))),
            "prompt_len": pa.array(batch.prompt_len, pa.int32()),
            "answer": pa.array(batch.answer, pa.int32()),
            "length": pa.array(batch.lengths.astype(np.int32), pa.int32()),
        },
        schema=SCHEMA,
    )


class ParquetSink:
    """Append batches to ``path.tmp`` in row groups of exactly ``row_group_size`` samples (the last one shorter), so
    memory stays bounded and the bytes depend only on the samples; ``close`` renames it into place when complete."""

    def __init__(
        self, path: Path, metadata: dict, row_group_size: int, inspect: Callable[[pa.Table, int], None] | None = None
    ):
        self.path, self.tmp = Path(path), Path(f"{path}.tmp")
        self.metadata, self.row_group_size = metadata, row_group_size
        self.inspect = inspect  # sees each table just before it is written, with the index of its first row
        self.pending: list[pa.Table] = []
        self.pending_rows = self.count = self.written = 0
        self.stats = Stats()
        self.writer: pq.ParquetWriter | None = None

    def add(self, batch: Packed) -> None:
        if not len(batch):
            return
        self.stats.update(batch)
        self.pending.append(to_table(batch))
        self.pending_rows += len(batch)
        self.count += len(batch)
        if self.pending_rows >= self.row_group_size:
            self.flush(self.pending_rows - self.pending_rows % self.row_group_size)

    def flush(self, rows: int) -> None:
        """Write the first ``rows`` pending samples as full row groups (and the rest too, if it is the end)."""
        if not rows:
            return
        table = pa.concat_tables(self.pending)
        if self.writer is None:
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.tmp, SCHEMA, compression="zstd")
        head = table.slice(0, rows)  # what is written now; the rest waits for the next row group
        if self.inspect is not None:
            self.inspect(head, self.written)
        self.writer.write_table(head, row_group_size=self.row_group_size)
        self.written += rows
        self.pending = [table.slice(rows)] if rows < len(table) else []
        self.pending_rows = len(table) - rows

    def close(self) -> dict:
        """Write the footer with metadata and statistics, then move the file into place. Returns the stats."""
        self.flush(self.pending_rows)
        if self.writer is None:
            raise DatasetError(f"{self.path}: no samples to write")
        stats = self.stats.summary()
        self.writer.add_key_value_metadata({META_KEY.decode(): json.dumps({**self.metadata, "stats": stats})})
        self.writer.close()
        os.replace(self.tmp, self.path)
        return stats

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


@dataclass
class Dataset:
    """A dataset as flat arrays: the tokens of every sample back to back, with per-sample offsets (no padding).
    From ``read_dataset`` they are read-only memory maps."""

    path: Path
    meta: dict
    values: np.ndarray  # (total tokens,) uint16, as stored: 2 bytes a token in memory too
    offsets: np.ndarray  # (N + 1,) int64
    prompt_len: np.ndarray  # (N,)
    answer: np.ndarray  # (N,)

    def __len__(self) -> int:
        return len(self.prompt_len)

    def sequence(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets) - 1  # without <eos>

    def head(self, n: int | None) -> Dataset:
        """The first ``n`` samples (all if None), sharing this dataset's arrays: no second read of the file."""
        return self if n is None or n >= len(self) else self.slice(0, n)

    def slice(self, start: int, stop: int) -> Dataset:
        """Samples ``start:stop``, sharing this dataset's token array (offsets rebased, values not copied)."""
        start, stop = max(0, start), min(len(self), stop)
        lo, hi = self.offsets[start], self.offsets[stop]
        return Dataset(
            self.path,
            self.meta,
            self.values[lo:hi],
            self.offsets[start : stop + 1] - lo,
            self.prompt_len[start:stop],
            self.answer[start:stop],
        )


def read_metadata(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset file {path} is missing: run `dvc repro` (or the generate stage) first")
    try:
        meta = pq.read_metadata(path).metadata or {}
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"dataset file {path} is corrupt or not Parquet: {err}") from None
    if META_KEY not in meta:
        raise DatasetError(f"dataset file {path} has no {META_KEY.decode()} metadata: not written by this pipeline")
    return json.loads(meta[META_KEY])


def read_dataset(path: Path, limit: int | None = None) -> Dataset:
    """The first ``limit`` samples (None: all) as views of the file's memory-mapped copy (``mapped_copy``)."""
    meta = read_metadata(path)
    arrays = mapped_copy(Path(path))
    return Dataset(Path(path), meta, **arrays).head(limit)


ARRAYS = ("values", "offsets", "prompt_len", "answer")  # the Dataset fields a mapped copy holds, one .npy each


def mapped_copy(path: Path) -> dict[str, np.ndarray]:
    """Read-only memory maps of the file's columns, from ``<dir>/.mapped/<name>.<sha256>/``, which is built on
    first use. Keyed by the file's bytes, so a rewritten file never meets a stale copy, and the copy needs nothing
    but the file: any process that can read the Parquet file (another node, through shared storage) finds or
    builds the same one."""
    entry = path.parent / MAPPED_DIR / f"{path.name}.{file_hash(path)}"
    if not entry.exists():
        build_mapped_copy(path, entry)
    try:
        return {name: np.load(entry / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
    except (OSError, ValueError) as err:
        raise DatasetError(f"the mapped copy {entry} of {path} is corrupt ({err}): delete it to rebuild it") from None


def write_values(parquet: pq.ParquetFile, offsets: np.ndarray, out: Path, path: Path) -> None:
    """Every row's tokens of ``parquet`` (the file ``path``), end to end, as one .npy array at ``out``, a row group at
    a time; each row's length checked against ``offsets`` (the length column's)."""
    with open(out, "wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint16)), "fortran_order": False}
        np.lib.format.write_array_header_1_0(f, header | {"shape": (int(offsets[-1]),)})
        first = 0
        for g in range(parquet.num_row_groups):
            for tokens in parquet.read_row_group(g, columns=["tokens"]).column("tokens").chunks:
                rows = len(tokens)
                if not np.array_equal(np.diff(tokens.offsets.to_numpy()), np.diff(offsets[first : first + rows + 1])):
                    raise DatasetError(
                        f"dataset file {path}: the length column disagrees with the tokens in rows "
                        f"{first}..{first + rows - 1}"
                    )
                f.write(tokens.flatten().to_numpy())  # the values of these rows, zero-copy
                first += rows


def build_mapped_copy(path: Path, entry: Path) -> None:
    """Write the arrays into a private temporary directory, one row group at a time (the memory of one row group,
    whatever the file's size), then rename it into place: readers on any node see a complete copy or none.
    Copies of earlier contents of the same file are removed (a process still mapping one keeps its pages)."""
    tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.tmp")
    try:
        parquet = pq.ParquetFile(path)
        if parquet.schema_arrow.remove_metadata() != SCHEMA:
            raise DatasetError(
                f"dataset file {path} has schema {parquet.schema_arrow.remove_metadata()}, expected {SCHEMA}"
            )
        columns = parquet.read(columns=["length", "prompt_len", "answer"])
        offsets = np.concatenate([[0], np.cumsum(columns.column("length").to_numpy() + 1)])  # + 1: the <eos>
        tmp.mkdir(parents=True)
        np.save(tmp / "offsets.npy", offsets)
        for name in ("prompt_len", "answer"):
            np.save(tmp / f"{name}.npy", columns.column(name).to_numpy())
        write_values(parquet, offsets, tmp / "values.npy", path)
        try:
            tmp.rename(entry)
        except OSError:
            if not entry.exists():  # else another process built it first: use theirs
                raise
        for stale in entry.parent.glob(f"{path.name}.*"):
            if stale != entry:
                shutil.rmtree(stale, ignore_errors=True)
        pa.default_memory_pool().release_unused()  # the row groups' buffers: this process goes on to train
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(
            f"dataset file {path} is corrupt, or its mapped copy {entry} cannot be written: {err}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes: part of every cell id, so new data means new cells."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
