"""What the claim rules read of a results table (results/sweep.csv, or a table of what a paper reports), at one
accuracy threshold: per (task, size, arch, depth) the smallest width every seed solved, per cell the mean test
accuracy over the measured seeds, its spread, and how the seeds ended.

A width counts as solved only when every seed was solved on validation *and* the cell's mean test accuracy is at the
threshold: a validation pass the test set does not confirm is read as not solved (``confirmed``), never silently as
solved. A cell *missed* the threshold only when every seed that did not solve had converged below it (unsolved); a
seed still improving when its budget ran out, diverged or failed is no verdict of the model: the cell is
*unsettled*, and a lookup whose answer it could change notes it (``Look.undecided``).

Each case a rule judges reads the evidence through a ``Look`` of its own, which records the cells the case read and
the unsettled cells its answer depends on; the rule returns its ``Decision``, and ``rules.judged`` makes the two one
``Case``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from pipeline.common.status import Status
from pipeline.reporting.tables import cell_means, smallest_widths

INF = math.inf
CellKey = tuple[str, int, str, int, int]  # (task, size, arch, width, depth)


class Reading(StrEnum):
    """How one case of a claim reads, for the paper's statement: the four ways a model at a length can read (held,
    missed, undecided, not run), and two a comparison may add."""

    HELD = "held"  # as the paper says
    MISSED = "missed"  # against it, on a verdict of the model (converged on the other side of the line)
    UNCONTROLLED = "fails, uncontrolled"  # a model the paper says fails did, where no control reached the line
    UNDECIDED = "undecided"  # it rests on a cell with no verdict yet (still improving, diverged, failed)
    NOT_RUN = "not run"  # a model it names did not run there
    SILENT = "tells nothing"  # ran, but the grid cannot tell (a tie at the narrowest width tried, neither solved)

    @property
    def decided(self) -> bool:
        return self in (Reading.HELD, Reading.MISSED)

    @property
    def result(self) -> bool | None:
        """True: as the paper says; False: against it; None: not decided."""
        return {Reading.HELD: True, Reading.MISSED: False}.get(self)


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
    unsolved: int  # seeds converged below the threshold
    lrs: str  # the learning rates its seeds kept ("": not recorded)


@dataclass(frozen=True)
class Unsettled:
    """A measured row with no verdict of the model at the threshold (one seed of a cell): still improving when its
    budget ran out, diverged, or failed."""

    arch: str
    depth: int
    width: int
    name: str
    why: str


@dataclass(frozen=True)
class Models:
    """The runs a claim names: an architecture at these depths (None: any; ``max_depth`` caps them) and this width
    (None: any; ``max_width`` and ``min_width`` bound them: a claim reads a model no wider than the paper ran it,
    or, for a claim about larger widths, wider than the one it compares)."""

    arch: str
    depths: tuple[int, ...] | None = None
    width: int | None = None
    max_width: int | None = None
    max_depth: int | None = None
    min_width: int | None = None

    def __str__(self) -> str:
        layers = f"{'/'.join(map(str, self.depths))}-layer " if self.depths else ""
        width = f" D={self.width}" if self.width else f" D<={self.max_width}" if self.max_width else ""
        width += f" D>={self.min_width}" if self.min_width else ""
        return f"{layers}{self.arch}{width}" + (f" (<={self.max_depth} layers)" if self.max_depth else "")

    def admits(self, r: CellRecord | Unsettled) -> bool:
        return (
            r.arch == self.arch
            and (self.depths is None or r.depth in self.depths)
            and (self.max_depth is None or r.depth <= self.max_depth)
            and (self.width is None or r.width == self.width)
            and (self.max_width is None or r.width <= self.max_width)
            and (self.min_width is None or r.width >= self.min_width)
        )


def accuracy_text(cells: list[CellRecord], line: float) -> str:
    """The best cell's mean test accuracy, with its seeds' range where two or more were measured ("n/a": none); to
    two decimals where one would round it onto ``line`` (the threshold): 98.95% is not 99.0%."""
    scored = [c for c in cells if not math.isnan(c.accuracy)]
    if not scored:
        return "n/a"
    best = max(scored, key=lambda c: c.accuracy)
    shown = functools.partial(percent, line=line)
    spread = f" ({best.measured} seeds: {shown(best.accuracy_min)}-{shown(best.accuracy_max)})" * (best.measured >= 2)
    return f"{shown(best.accuracy)}{spread}" + (f" at lr {best.lrs}" if best.lrs else "")


def percent(x: float, line: float) -> str:
    """``x`` as a percentage to one decimal, or to two where one would hide which side of ``line`` it lies on."""
    return f"{x:.2%}" if x != line and f"{x:.1%}" == f"{line:.1%}" else f"{x:.1%}"


class Evidence:
    """What the rules read, at ``threshold``: per (task, size) its cells (``tables.cell_means``) and unsettled rows,
    per (task, size, arch, depth) the smallest width solved (``tables.smallest_widths`` of the confirmed table). Its
    lookups are pure; a case reads it through a ``Look``."""

    def __init__(self, table: pd.DataFrame, threshold: float):
        self.threshold = threshold
        self.table = confirmed(table, threshold)
        self.cells: dict[tuple[str, int], list[CellRecord]] = {}
        keys = ["task", "size", "arch", "width", "depth"]
        # cells every seed of which held the threshold on validation, the test set not: stopped there, not converged
        flipped = self.table[(table.status == Status.SOLVED) & (self.table.status == Status.UNSOLVED)]
        self.unconfirmed: set[CellKey] = {
            (r.task, int(r.size), r.arch, int(r.width), int(r.depth)) for r in flipped.itertuples()
        }
        kept = self.table.get("lr", pd.Series(dtype=float)).dropna()
        rates = (
            kept.groupby([self.table.loc[kept.index, k] for k in keys])
            .agg(lambda v: ", ".join(f"{x:g}" for x in sorted(set(v))))
            .to_dict()
        )
        measured = self.table.measured.astype(bool)
        unsolved = (self.table.status == Status.UNSOLVED) & measured
        misses = unsolved.groupby([self.table[k] for k in keys]).sum().to_dict()  # dicts: a Series.get costs 40 us
        for r in cell_means(self.table).itertuples():
            key = (r.task, r.size, r.arch, r.width, r.depth)
            record = CellRecord(
                r.arch, int(r.depth), int(r.width), float(r.accuracy), float(r.accuracy_min), float(r.accuracy_max),
                int(r.measured), int(r.seeds), int(r.solved), int(misses.get(key, 0)), rates.get(key, ""),
            )  # fmt: skip
            self.cells.setdefault((r.task, int(r.size)), []).append(record)
        self.unsettled: dict[tuple[str, int], list[Unsettled]] = {}
        open_ = measured & ~self.table.status.isin([Status.SOLVED, Status.UNSOLVED])
        for r in self.table[open_].itertuples():
            name = f"{r.task} n={r.size} {r.arch} d{r.depth}: seed {r.seed} D={r.width}"
            why = f"{r.status}: {str(r.reason).split(';')[0]}" if r.status != Status.UNDECIDED else str(r.reason)
            self.unsettled.setdefault((r.task, int(r.size)), []).append(
                Unsettled(r.arch, int(r.depth), int(r.width), name, why.split(";")[0])
            )
        self.best = {
            (task, int(size), arch, int(depth)): INF if found.width is None else float(found.width)
            for (task, size, arch, depth), found in smallest_widths(self.table).items()
        }

    def sizes(self, task: str) -> list[int]:
        return sorted(s for t, s in self.cells if t == task)

    def of(self, task: str, size: int, models: Models) -> list[CellRecord]:
        """The measured cells of ``models`` at (task, size): an inferred cell has no test accuracy to read."""
        return [c for c in self.cells.get((task, size), []) if c.measured and models.admits(c)]

    def unsettled_of(self, task: str, size: int, models: Models) -> list[Unsettled]:
        return [p for p in self.unsettled.get((task, size), []) if models.admits(p)]

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

    def solved(self, cell: CellRecord) -> bool:
        """Every seed solved on validation and the mean test accuracy at the threshold."""
        return cell.solved == cell.seeds and cell.accuracy >= self.threshold - 1e-9

    def reached(self, task: str, size: int, models: Models) -> bool:
        """Some measured cell of ``models`` reached the threshold at (task, size), noting nothing."""
        return any(self.solved(c) for c in self.of(task, size, models))

    def top_accuracy(self, task: str, size: int, models: Models) -> float:
        """The best mean test accuracy of ``models`` (NaN: not run), noting nothing: for the text beside a verdict."""
        scored = [c.accuracy for c in self.of(task, size, models) if not math.isnan(c.accuracy)]
        return max(scored, default=math.nan)

    def accuracy(self, task: str, size: int, models: Models) -> str:
        """The best cell's test accuracy as text, its seeds' spread included."""
        return accuracy_text(self.of(task, size, models), self.threshold)

    def learned(self, task: str, size: int) -> bool:
        """Some model of any architecture reached the threshold on (task, size): the recipe learns it here."""
        return any(c.measured and self.solved(c) for c in self.cells.get((task, size), []))

    def failed_trials(self, tasks: Iterable[str]) -> int:
        return int(((self.table.status == Status.FAILED) & self.table.task.isin(list(tasks))).sum())


class Look:
    """One case's reading of ``ev``: each lookup notes the cells it read (``read``, the case's evidence) and the
    unsettled cells its answer depends on (``undecided``: cell -> why), which make the case undecided."""

    def __init__(self, ev: Evidence):
        self.ev = ev
        self.read: set[CellKey] = set()
        self.undecided: dict[str, str] = {}

    @property
    def threshold(self) -> float:
        return self.ev.threshold

    def of(self, task: str, size: int, models: Models) -> list[CellRecord]:
        cells = self.ev.of(task, size, models)
        self.read.update((task, size, c.arch, c.width, c.depth) for c in cells)
        return cells

    def consult(self, rows: Iterable[Unsettled]) -> None:
        """Note ``rows`` as unsettled ones the case depends on."""
        self.undecided.update((r.name, r.why) for r in rows)

    def reading(self, task: str, size: int, models: Models) -> Reading:
        """``models`` at (task, size) against the threshold: held (a cell reached it), else undecided (a cell had no
        verdict: noted), else missed (every cell converged below it), else not run."""
        cells = self.of(task, size, models)
        if not cells:
            return Reading.NOT_RUN
        if any(self.ev.solved(c) for c in cells):
            return Reading.HELD
        unsettled = self.ev.unsettled_of(task, size, models)
        if unsettled:
            self.consult(unsettled)
            return Reading.UNDECIDED
        return Reading.MISSED

    def stopped_on_validation(self, task: str, size: int, models: Models) -> bool:
        """Some missed cell of ``models`` at (task, size) had every seed hold the threshold on validation, where
        its trials stopped: below it on test, not converged."""
        return any((task, size, c.arch, c.width, c.depth) in self.ev.unconfirmed for c in self.of(task, size, models))

    def reaches(self, task: str, size: int, models: Models) -> bool:
        """Some cell of ``models`` reached the threshold; an unsettled one that might yet is noted when none did."""
        return self.reading(task, size, models) == Reading.HELD

    def best_accuracy(self, task: str, size: int, models: Models) -> float:
        """The best mean test accuracy of ``models`` (NaN: not run); depends on every unsettled cell of them."""
        self.of(task, size, models)
        self.consult(self.ev.unsettled_of(task, size, models))
        return self.ev.top_accuracy(task, size, models)

    def top_accuracy(self, task: str, size: int, models: Models) -> float:
        self.of(task, size, models)
        return self.ev.top_accuracy(task, size, models)

    def accuracy(self, task: str, size: int, models: Models) -> str:
        return accuracy_text(self.of(task, size, models), self.ev.threshold)

    def by_width(self, task: str, size: int, models: Models) -> list[tuple[int, float]]:
        """(width, best mean test accuracy) of ``models``' measured cells, narrowest first; depends on every
        unsettled cell of them."""
        best: dict[int, float] = {}
        for c in self.of(task, size, models):
            if not math.isnan(c.accuracy):
                best[c.width] = max(best.get(c.width, -1.0), c.accuracy)
        self.consult(self.ev.unsettled_of(task, size, models))
        return sorted(best.items())

    def min_width(self, task: str, size: int, arch: str, depth: int) -> float:
        """The smallest width every seed solved and the test set confirmed: inf where none did, NaN if not run.
        Depends on the unsettled cells narrower than it: any of them might solve."""
        width = self.ev.best.get((task, size, arch, depth), math.nan)
        model = Models(arch, (depth,))
        self.read.update((task, size, arch, c.width, depth) for c in self.ev.of(task, size, model))
        self.consult(p for p in self.ev.unsettled_of(task, size, model) if p.width < width)
        return width


def width_text(width: float) -> str:
    return "none" if width == INF else "not run" if math.isnan(width) else f"{width:.0f}"
