"""Parquet datasets: one file per (task, size, split), written atomically, read back with their metadata.

Schema (one row per sample):
    tokens      list<uint16>  prompt + chain of thought + answer + <eos>, as vocabulary ids
    prompt_len  int32         tokens before the first generated one
    answer      int32         id of the final-answer token (the one just before <eos>)
    length      int32         len(tokens) - 1, the sequence length L as the DP paper counts it
File metadata key ``capacity_atlas``: JSON with task, size, split, seed, generator version and parameters,
vocabulary (list of token strings, id = index) and statistics (max/mean length, answer counts).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

META_KEY = b"capacity_atlas"
SCHEMA = pa.schema([("tokens", pa.list_(pa.uint16())), ("prompt_len", pa.int32()),
                    ("answer", pa.int32()), ("length", pa.int32())])


class DatasetError(RuntimeError):
    """A dataset file that is missing, corrupt, or not one of ours."""


def dataset_path(data_dir: Path, task: str, size: int, split: str) -> Path:
    return Path(data_dir) / task / f"{task}_{size}_{split}.parquet"


class ParquetSink:
    """Append samples in row groups to ``path.tmp``; ``close`` renames it into place only when complete."""

    def __init__(self, path: Path, metadata: dict, row_group_size: int):
        self.path, self.tmp = Path(path), Path(f"{path}.tmp")
        self.metadata, self.row_group_size = metadata, row_group_size
        self.rows: list[tuple] = []
        self.count, self.max_len, self.total_len = 0, 0, 0
        self.answers: dict[int, int] = {}
        self.writer = None

    def add(self, tokens: np.ndarray, prompt_len: int, answer: int) -> None:
        self.rows.append((tokens, prompt_len, answer))
        length = len(tokens) - 1
        self.count, self.total_len, self.max_len = self.count + 1, self.total_len + length, max(self.max_len, length)
        self.answers[answer] = self.answers.get(answer, 0) + 1
        if len(self.rows) >= self.row_group_size:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        tokens, prompt_len, answer = zip(*self.rows)
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int32)
        values = pa.array(np.concatenate(tokens).astype(np.uint16))
        table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values),
                          "prompt_len": pa.array(prompt_len, pa.int32()), "answer": pa.array(answer, pa.int32()),
                          "length": pa.array(np.diff(offsets) - 1, pa.int32())}, schema=SCHEMA)
        if self.writer is None:
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.tmp, SCHEMA, compression="zstd")
        self.writer.write_table(table)
        self.rows = []

    def close(self) -> dict:
        """Write the footer with metadata and statistics, then move the file into place. Returns the stats."""
        stats = {"samples": self.count, "max_length": self.max_len,
                 "mean_length": round(self.total_len / max(self.count, 1), 3),
                 "answer_counts": {str(k): v for k, v in sorted(self.answers.items())}}
        self.flush()
        if self.writer is None:
            raise DatasetError(f"{self.path}: no samples to write")
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
    """A dataset in memory: a flat token array with per-sample offsets (no padding)."""

    path: Path
    meta: dict
    values: np.ndarray  # (total tokens,) int64
    offsets: np.ndarray  # (N + 1,)
    prompt_len: np.ndarray  # (N,)
    answer: np.ndarray  # (N,)

    def __len__(self) -> int:
        return len(self.prompt_len)

    def sequence(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets) - 1  # without <eos>


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
    meta = read_metadata(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"dataset file {path} is corrupt: {err}") from None
    if table.schema.remove_metadata() != SCHEMA:
        raise DatasetError(f"dataset file {path} has schema {table.schema.remove_metadata()}, expected {SCHEMA}")
    if limit is not None:
        table = table.slice(0, limit)
    tokens = table.column("tokens").combine_chunks()
    offsets = tokens.offsets.to_numpy()
    values = tokens.values.to_numpy().astype(np.int64)
    return Dataset(Path(path), meta, values[offsets[0]:offsets[-1]], offsets - offsets[0],
                   table.column("prompt_len").to_numpy(), table.column("answer").to_numpy())


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes: part of every cell id, so new data means new cells."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
