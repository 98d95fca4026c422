"""What the claim rules read of a results table (results/sweep.csv, or a table of what a paper reports), at one
accuracy threshold: per (task, size, arch, depth) the smallest width every seed solved, per cell the mean test
accuracy over the measured seeds, its spread, and how the seeds ended.

A width counts as solved only when every seed was solved on validation *and* the cell's mean test accuracy is at the
threshold: a validation pass the test set does not confirm is read as not solved (``confirmed``), never silently as
solved. A lookup that an undecided cell could change (a narrower width still improving; a model that might yet
reach the threshold) notes that cell in ``Evidence.undecided``: a rule's case that consulted one is not tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from pipeline.reporting.tables import cell_means, min_gflops
from pipeline.training.status import Status

INF = math.inf


def confirmed(table: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """``table`` with every measured cell that all its seeds solved on validation but whose mean test accuracy is
    below ``threshold`` read as unsolved at that width, its reason saying so."""
    solved = table.status.eq(Status.SOLVED) & table.measured.astype(bool)
    keys = ["task", "size", "arch", "width", "depth"]
    mean = table.final_accuracy.where(table.measured.astype(bool)).groupby([table[k] for k in keys]).transform("mean")
    below = solved & (mean < threshold - 1e-9)
    if not below.any():
        return table
    out = table.copy()
    out["reason"] = out.get("reason", pd.Series("", index=out.index)).astype(object)
    out.loc[below, "status"] = Status.UNSOLVED
    out.loc[below, "reason"] = [f"solved on validation, {m:.1%} on test: below {threshold:.0%}" for m in mean[below]]
    return out


@dataclass(frozen=True)
class CellRecord:
    """One cell of ``tables.cell_means``, as the rules read it."""

    arch: str
    depth: int
    width: int
    accuracy: float  # mean test accuracy over the measured seeds (NaN: every seed inferred)
    accuracy_min: float
    accuracy_max: float
    measured: int
    seeds: int
    solved: int
    lrs: str  # the learning rates its seeds kept ("": not recorded)


@dataclass(frozen=True)
class Pending:
    """An undecided row (one seed of a cell)."""

    arch: str
    depth: int
    width: int
    name: str
    why: str


@dataclass(frozen=True)
class Models:
    """The runs a claim names: an architecture at these depths (None: any; ``max_depth`` caps them) and this width
    (None: any; ``max_width`` caps them: a claim reads a model no wider than the paper ran it)."""

    arch: str
    depths: tuple[int, ...] | None = None
    width: int | None = None
    max_width: int | None = None
    max_depth: int | None = None

    def __str__(self) -> str:
        layers = f"{'/'.join(map(str, self.depths))}-layer " if self.depths else ""
        width = f" D={self.width}" if self.width else f" D<={self.max_width}" if self.max_width else ""
        return f"{layers}{self.arch}{width}" + (f" (<={self.max_depth} layers)" if self.max_depth else "")

    def admits(self, r: CellRecord | Pending) -> bool:
        return (
            r.arch == self.arch
            and (self.depths is None or r.depth in self.depths)
            and (self.max_depth is None or r.depth <= self.max_depth)
            and (self.width is None or r.width == self.width)
            and (self.max_width is None or r.width <= self.max_width)
        )


def accuracy_text(cells: list[CellRecord]) -> str:
    """The best cell's mean test accuracy, with its seeds' range where two or more were measured ("n/a": none)."""
    scored = [c for c in cells if not math.isnan(c.accuracy)]
    if not scored:
        return "n/a"
    best = max(scored, key=lambda c: c.accuracy)
    spread = f" ({best.measured} seeds: {best.accuracy_min:.1%}-{best.accuracy_max:.1%})" if best.measured >= 2 else ""
    return f"{best.accuracy:.1%}{spread}" + (f" at lr {best.lrs}" if best.lrs else "")


class Evidence:
    """What the rules read, at ``threshold``: per (task, size) its cells (``tables.cell_means``) and undecided rows,
    per (task, size, arch, depth) the smallest width solved (``tables.min_gflops`` of the confirmed table); the
    lookups note the undecided cells their answer depends on in ``undecided`` (cell -> why), which a rule empties
    before each case it judges."""

    def __init__(self, table: pd.DataFrame, threshold: float):
        self.threshold = threshold
        self.table = confirmed(table, threshold)
        self.cells: dict[tuple[str, int], list[CellRecord]] = {}
        keys = ["task", "size", "arch", "width", "depth"]
        kept = self.table.get("lr", pd.Series(dtype=float)).dropna()
        rates = kept.groupby([self.table.loc[kept.index, k] for k in keys]).agg(
            lambda v: ", ".join(f"{x:g}" for x in sorted(set(v)))
        )
        for r in cell_means(self.table).itertuples():
            record = CellRecord(
                r.arch, int(r.depth), int(r.width), float(r.accuracy), float(r.accuracy_min), float(r.accuracy_max),
                int(r.measured), int(r.seeds), int(r.solved), rates.get((r.task, r.size, r.arch, r.width, r.depth), ""),
            )  # fmt: skip
            self.cells.setdefault((r.task, int(r.size)), []).append(record)
        self.pending: dict[tuple[str, int], list[Pending]] = {}
        for r in self.table[self.table.status == Status.UNDECIDED].itertuples():
            name = f"{r.task} n={r.size} {r.arch} d{r.depth}: seed {r.seed} D={r.width}"
            why = str(r.reason).split(";")[0]  # the verdict's words, not the curve's
            self.pending.setdefault((r.task, int(r.size)), []).append(
                Pending(r.arch, int(r.depth), int(r.width), name, why)
            )
        self.best = {
            (r.task, int(r.size), r.arch, int(r.depth)): INF if pd.isna(r.width) else float(r.width)
            for r in min_gflops(self.table).itertuples()
        }
        self.undecided: dict[str, str] = {}

    def consult(self, rows: Iterable[Pending]) -> None:
        """Note ``rows`` as undecided ones the case depends on."""
        self.undecided.update((r.name, r.why) for r in rows)

    def sizes(self, task: str) -> list[int]:
        return sorted(s for t, s in self.cells if t == task)

    def of(self, task: str, size: int, models: Models) -> list[CellRecord]:
        """The measured cells of ``models`` at (task, size): an inferred cell has no test accuracy to read."""
        return [c for c in self.cells.get((task, size), []) if c.measured and models.admits(c)]

    def undecided_of(self, task: str, size: int, models: Models) -> list[Pending]:
        return [p for p in self.pending.get((task, size), []) if models.admits(p)]

    def ran(self, task: str, models: Models, size: int) -> bool:
        """Some cell of ``models`` was measured at (task, size)."""
        return bool(self.of(task, size, models))

    def swept(self, task: str, models: Models, size: int) -> bool:
        """Some cell of ``models`` is in the grid at (task, size), measured or inferred (its width verdict counts)."""
        return any(models.admits(c) for c in self.cells.get((task, size), []))

    def widest(self, task: str, size: int, models: Models, measured: bool = True) -> int | None:
        """The widest cell of ``models`` at (task, size): measured, or with ``measured`` false any in the grid."""
        cells = (
            self.of(task, size, models)
            if measured
            else [c for c in self.cells.get((task, size), []) if models.admits(c)]
        )
        return max((c.width for c in cells), default=None)

    def narrowest(self, task: str, arch: str) -> int:
        return min(c.width for (t, _), cells in self.cells.items() if t == task for c in cells if c.arch == arch)

    def min_width(self, task: str, size: int, arch: str, depth: int) -> float:
        """The smallest width every seed solved and the test set confirmed: inf where none did, NaN if not run.
        Depends on the undecided cells narrower than it: any of them might solve."""
        width = self.best.get((task, size, arch, depth), math.nan)
        self.consult(p for p in self.undecided_of(task, size, Models(arch, (depth,))) if p.width < width)
        return width

    def solved(self, cell: CellRecord) -> bool:
        """Every seed solved on validation and the mean test accuracy at the threshold."""
        return cell.solved == cell.seeds and cell.accuracy >= self.threshold - 1e-9

    def reaches(self, task: str, size: int, models: Models) -> bool | None:
        """Some cell of ``models`` reached the threshold (None: not run). An undecided cell cannot say: noted when
        nothing reached it."""
        cells = self.of(task, size, models)
        if not cells:
            return None
        if any(self.solved(c) for c in cells):
            return True
        self.consult(self.undecided_of(task, size, models))
        return False

    def best_accuracy(self, task: str, size: int, models: Models) -> float:
        """The best mean test accuracy of ``models`` (NaN: not run); depends on every undecided cell of them."""
        self.consult(self.undecided_of(task, size, models))
        return self.top_accuracy(task, size, models)

    def top_accuracy(self, task: str, size: int, models: Models) -> float:
        """``best_accuracy`` without noting anything: for the text beside a verdict decided otherwise."""
        scored = [c.accuracy for c in self.of(task, size, models) if not math.isnan(c.accuracy)]
        return max(scored, default=math.nan)

    def accuracy(self, task: str, size: int, models: Models) -> str:
        """The best cell's test accuracy as text, its seeds' spread included."""
        return accuracy_text(self.of(task, size, models))

    def learned(self, task: str, size: int) -> bool:
        """Some model of any architecture reached the threshold on (task, size): the recipe learns it here."""
        return any(c.measured and self.solved(c) for c in self.cells.get((task, size), []))

    def failed_trials(self, tasks: Iterable[str]) -> int:
        return int(((self.table.status == Status.FAILED) & self.table.task.isin(list(tasks))).sum())


def width_text(width: float) -> str:
    return "none" if width == INF else "not run" if math.isnan(width) else f"{width:.0f}"
