"""A cell of the grid: its coordinates (``Cell``, the key of every table of cells) and its record (``CellSpec``: the
cell with its data, learning rates and costs), built by the sweep (``pipeline.search.cells``), read by the searcher,
the MLflow runs and the trial itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

# The fields of CellSpec naming its dataset's files (the keys of its sha256): all published, fetched and hashed.
DATA_FILES = ("train_path", "test_path", "val_path")


class Cell(NamedTuple):
    """One cell of the grid."""

    task: str
    size: int
    arch: str
    width: int
    depth: int
    seed: int

    @property
    def chain(self) -> tuple:
        """The cells a width-frontier search walks together: one task, architecture, depth and seed."""
        return self.task, self.arch, self.depth, self.seed


@dataclass(frozen=True, kw_only=True)
class CellSpec:
    """A cell of the grid with its dataset, learning rates and costs: everything a trial of it needs, and every
    column the results tables take from it. Crosses to Ray as a dict (``dataclasses.asdict``; the cell stays a
    ``Cell``) and comes back through ``CellSpec(**d)``, which refuses a key it does not know."""

    cell: Cell
    arch_options: dict[str, Any]
    lrs: tuple[float, ...]
    # its dataset: the files (local, then as published to the storage every node reads) and their hashes
    train_path: str
    test_path: str
    val_path: str  # the validation split, drawn as test is: the verdicts are reached on it
    sha256: dict[str, str]  # "train_path" / "test_path" / "val_path" -> the file's sha256
    data_hash: str
    vocab_size: int
    family: str
    vocab: tuple[str, ...]
    train_samples: int
    max_len: int  # the dataset's L, over its train, test and validation files
    cell_id: str  # stable: the same cell on the same data has the same id in every rerun
    name: str  # task, size, arch, width, depth, seed in one word, for people
    # set by the sweep: the reuse key, and the model's costs (known without training, so inferred cells have them)
    run_key: str = ""
    params: int | None = None
    paper_gflops: float | None = None
    exact_gflops: float | None = None
    state_bytes: int | None = None

    # the coordinates, read as the cell's
    @property
    def task(self) -> str:
        return self.cell.task

    @property
    def size(self) -> int:
        return self.cell.size

    @property
    def arch(self) -> str:
        return self.cell.arch

    @property
    def width(self) -> int:
        return self.cell.width

    @property
    def depth(self) -> int:
        return self.cell.depth

    @property
    def seed(self) -> int:
        return self.cell.seed


def cell_id(task: str, size: int, arch: str, width: int, depth: int, seed: int, data_hash: str) -> str:
    """Stable id of a grid cell: the same cell on the same data gets the same id in every rerun."""
    key = {
        "task": task,
        "size": size,
        "arch": arch,
        "width": width,
        "depth": depth,
        "seed": seed,
        "data_hash": data_hash,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
