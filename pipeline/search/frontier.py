"""Which cells to train: the whole grid, or a width-frontier search that trains as few cells as it can.

A *plan* hands out cells to train (``propose``), takes each one's verdict (``record``: solved, unsolved or
undecided; a diverged or failed cell counts as unsolved), and in the end says for every cell of the grid how it
ended and whether that was measured or inferred (``outcomes``).
The plans know nothing of Ray or training: ``pipeline/search/searcher.py`` drives one as a Ray Tune ``Searcher``, and
the tests drive them with synthetic accuracy oracles.

``GridPlan`` proposes every cell at once.

``FrontierPlan`` finds, for every chain (task, architecture, depth, seed), the smallest solved width at each size
(``sweep.search: frontier``). It takes the minimum width m(size) as non-decreasing in width (a solved width means
every wider one solves) and in size (a longer input never needs a narrower model):
- the smallest size: bisection over the width list;
- each next size starts from the last size's answer a: it trains a and the width just below it, side by side.
  a solved and a-1 not: m = a, two trials. a unsolved: bisection above a. a-1 solved too: the size assumption is
  contradicted, the search says so and bisects below a-1 to settle it;
- a size no width solves: every larger size is inferred unsolved.
An undecided cell (its budget ran out while it was still improving) is never taken as unsolved: it bounds
nothing, the bisection goes on around it, and a size whose boundary it sits on is settled with the smallest
width that solved as an upper bound and the undecided cells named (``MinWidth``). Only a size every width is
decided unsolved at makes the larger sizes unsolved.
Every answer rests on measured trials at its boundary (m solved and, below m, a measured failure at this size or,
at the first size of a chain, the bisection's), so a contradiction at the boundary is seen, reported and
settled by training more; a cell the search never trained is marked ``inferred``.

Many chains run side by side: every chain with a trial to propose proposes it at once, so Ray's slots stay busy
while there are more open chains than slots. The plans are plain state machines rather than Ray Tune
``BasicVariantGenerator`` waves: a chain moves on as soon as its own trial ends, not when a whole wave does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from pipeline.training.status import Status


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
        return self.task, self.arch, self.depth, self.seed


@dataclass
class Outcome:
    status: Status  # solved, unsolved or undecided (a diverged or failed cell counts as unsolved)
    measured: bool
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.status == Status.SOLVED


@dataclass(frozen=True)
class MinWidth:
    """The smallest width every seed solved (None: some seed solved none) and the undecided cells that could make
    it narrower, or make a width solve where none did: while there are any, it is an upper bound, not a verdict."""

    width: int | None
    undecided: tuple[str, ...] = ()  # e.g. "seed 0 D=16"

    @property
    def decided(self) -> bool:
        return not self.undecided


class Plan(Protocol):
    """What the searcher drives (``pipeline/search/searcher.py``) and the tests drive with synthetic oracles."""

    contradictions: list[str]  # results that broke the plan's monotonicity assumptions, in words

    def propose(self) -> list[Cell]:
        """Cells to train now (may be empty while results are awaited)."""
        ...

    def record(self, cell: Cell, status: Status) -> None:
        """A trained cell's verdict (its best learning-rate run's status)."""
        ...

    def done(self) -> bool:
        """Nothing left to propose or await."""
        ...

    def outcomes(self) -> dict[Cell, Outcome]:
        """Every cell of the grid: passed, measured or inferred, and why."""
        ...


class GridPlan:
    """Every cell, all at once."""

    def __init__(self, cells: Iterable[Cell]):
        self.cells = list(cells)
        self.pending = list(self.cells)
        self.results: dict[Cell, Status] = {}
        self.contradictions: list[str] = []

    def propose(self) -> list[Cell]:
        ready, self.pending = self.pending, []
        return ready

    def record(self, cell: Cell, status: Status) -> None:
        self.results[cell] = searched(status)

    def done(self) -> bool:
        return not self.pending and len(self.results) == len(self.cells)

    def outcomes(self) -> dict[Cell, Outcome]:
        return {c: Outcome(self.results[c], True) for c in self.cells if c in self.results}


@dataclass
class Chain:
    """The search of one (task, architecture, depth, seed): sizes in order, each a bisection over widths."""

    key: tuple
    sizes: list[int]
    widths: list[int]
    j: int = 0  # index of the size being searched
    answers: dict[int, int | None] = field(default_factory=dict)  # size -> index of the smallest solved width
    floors: dict[int, int] = field(default_factory=dict)  # size -> index of the narrowest width not decided unsolved
    measured: dict[tuple[int, int], Status] = field(default_factory=dict)  # (size, width index) -> verdict
    waiting: set[int] = field(default_factory=set)  # width indices of this size in training
    trust_size_bound: bool = True  # m(size) >= m(previous size), until a result contradicts it
    reported: set[str] = field(default_factory=set)

    @property
    def size(self) -> int:
        return self.sizes[self.j]

    @property
    def finished(self) -> bool:
        return self.j >= len(self.sizes)

    def bounds(self) -> tuple[int, int]:
        """[lo, hi): the smallest solved width index lies in lo..hi, hi = len(widths) meaning none."""
        here = self.here()
        hi = min([i for i, st in here.items() if st == Status.SOLVED], default=len(self.widths))
        below = [i for i, st in here.items() if st == Status.UNSOLVED and i < hi]
        lo = max(below) + 1 if below else 0
        if self.trust_size_bound and self.j:
            lo = max(lo, min(self.floors[self.sizes[self.j - 1]], hi))
        return lo, hi

    def here(self) -> dict[int, Status]:
        """Width index -> verdict of the cells measured at this size."""
        return {i: st for (s, i), st in self.measured.items() if s == self.size}

    def candidates(self) -> list[int]:
        """Width indices that could still be the answer and are untrained (undecided ones are not retrained)."""
        lo, hi = self.bounds()
        return [i for i in range(lo, hi) if i not in self.here()]

    def next_widths(self) -> list[int]:
        """Width indices to train now at this size (none while a trial of this size is running)."""
        if self.finished or self.waiting:
            return []
        candidates = self.candidates()
        if not candidates:
            return []
        previous = self.answers.get(self.sizes[self.j - 1]) if self.j else None
        here = self.here()
        if previous is not None and self.trust_size_bound and previous not in here:
            # start from the last size's answer, and measure the width below it too: the boundary is then
            # measured at every size, and a size that needs less than the last one is seen
            return [i for i in (previous, previous - 1) if i >= 0 and i not in here]
        return [candidates[(len(candidates) - 1) // 2]]  # bisection: the lower middle of the candidates

    def record(self, width_index: int, status: Status) -> list[str]:
        """Take one result of this size; returns the contradictions it revealed."""
        self.waiting.discard(width_index)
        self.measured[self.size, width_index] = status
        notes = []
        floor = self.floors[self.sizes[self.j - 1]] if self.j else None
        if status == Status.SOLVED and floor is not None and width_index < floor and self.trust_size_bound:
            self.trust_size_bound = False
            notes.append(
                f"{self.name()}: width {self.widths[width_index]} solves size {self.size} but not the "
                f"smaller size {self.sizes[self.j - 1]}: minimum width is not monotone in size here; "
                f"searching the narrower widths of size {self.size}"
            )
        here = self.here()
        unsolved = [i for i, st in here.items() if st == Status.UNSOLVED]
        for i, st in here.items():
            if st == Status.SOLVED and any(i2 > i for i2 in unsolved):
                wider = min(i2 for i2 in unsolved if i2 > i)
                note = (
                    f"{self.name()}: size {self.size} is solved at width {self.widths[i]} but not at the wider "
                    f"{self.widths[wider]}: not monotone in width; the answer is the narrowest solved width "
                    f"after searching below it"
                )
                notes.append(note)
        new = [n for n in dict.fromkeys(notes) if n not in self.reported]
        self.reported.update(new)
        return new

    def settle(self) -> None:
        """Move to the next size once this one is decided (and on, while sizes are decided without training)."""
        while not self.finished and not self.waiting:
            if self.candidates():
                return
            lo, hi = self.bounds()
            self.answers[self.size] = hi if hi < len(self.widths) else None
            self.floors[self.size] = lo
            self.j += 1
            if lo == len(self.widths):  # every width decided unsolved here: nothing solves the larger ones
                for size in self.sizes[self.j :]:
                    self.answers[size], self.floors[size] = None, lo
                self.j = len(self.sizes)

    def name(self) -> str:
        task, arch, depth, seed = self.key
        return f"{task} {arch} depth {depth} seed {seed}"


class FrontierPlan:
    """Per chain, the smallest solved width at every size (see the module docstring)."""

    def __init__(self, cells: Iterable[Cell]):
        self.cells = list(cells)
        grouped: dict[tuple, tuple[set, set]] = {}
        for c in self.cells:
            sizes, widths = grouped.setdefault(c.chain, (set(), set()))
            sizes.add(c.size)
            widths.add(c.width)
        self.chains = {key: Chain(key, sorted(s), sorted(w)) for key, (s, w) in grouped.items()}
        self.contradictions: list[str] = []

    def propose(self) -> list[Cell]:
        ready = []
        for chain in self.chains.values():
            chain.settle()
            for i in chain.next_widths():
                chain.waiting.add(i)
                task, arch, depth, seed = chain.key
                ready.append(Cell(task, chain.size, arch, chain.widths[i], depth, seed))
        return ready

    def record(self, cell: Cell, status: Status) -> None:
        chain = self.chains[cell.chain]
        if cell.size != chain.size:
            raise ValueError(f"{cell} is not of the size its chain is searching ({chain.size})")
        self.contradictions += chain.record(chain.widths.index(cell.width), searched(status))
        chain.settle()

    def done(self) -> bool:
        for chain in self.chains.values():
            chain.settle()
        return all(c.finished for c in self.chains.values())

    def outcomes(self) -> dict[Cell, Outcome]:
        out = {}
        for c in self.cells:
            chain = self.chains[c.chain]
            i = chain.widths.index(c.width)
            if (c.size, i) in chain.measured:
                out[c] = Outcome(chain.measured[c.size, i], True)
            elif c.size in chain.answers:
                answer, floor = chain.answers[c.size], chain.floors[c.size]
                if floor == len(chain.widths):
                    first = min(s for s in chain.sizes if chain.floors.get(s) == floor)
                    reason = f"inferred: no width up to {chain.widths[-1]} solves size {first}"
                    out[c] = Outcome(Status.UNSOLVED, False, reason)
                elif answer is not None and i >= answer:
                    reason = f"inferred: width {chain.widths[answer]} solves size {c.size}"
                    out[c] = Outcome(Status.SOLVED, False, reason)
                elif answer is not None and floor == answer:
                    reason = f"inferred: the smallest width that solves size {c.size} is {chain.widths[answer]}"
                    out[c] = Outcome(Status.UNSOLVED, False, reason)
                else:  # below the narrowest width not decided unsolved
                    reason = f"inferred: no width below {chain.widths[floor]} solves size {c.size}"
                    out[c] = Outcome(Status.UNSOLVED, False, reason)
        return out


def searched(status: Status) -> Status:
    """What a verdict tells the search: a diverged or failed cell did not solve, and counts as unsolved."""
    return status if status in (Status.SOLVED, Status.UNDECIDED) else Status.UNSOLVED


PLANS: dict[str, Callable[[Iterable[Cell]], Plan]] = {
    "grid": GridPlan,
    "frontier": FrontierPlan,
}  # sweep.search: the plan it names


def make_plan(search: str, cells: Iterable[Cell]) -> Plan:
    return PLANS[search](cells)


def min_widths(outcomes: dict[Cell, Outcome]) -> dict[tuple, MinWidth]:
    """(task, size, arch, depth) -> the smallest width solved by every seed (the largest of the seeds' smallest
    solved widths; under monotonicity, the smallest width at which every seed solves; None if a seed solves
    none), with the undecided cells narrower than it (any undecided cell, when it is None). The same function of
    the outcomes in both plans, so the grid and the frontier give the same table."""
    per_seed: dict[tuple, dict[int, int | None]] = {}
    pending: dict[tuple, list[tuple[int, int]]] = {}  # key -> (seed, width) of its undecided cells
    for c, o in outcomes.items():
        key = (c.task, c.size, c.arch, c.depth)
        seeds = per_seed.setdefault(key, {})
        least = seeds.setdefault(c.seed, None)
        if o.passed and (least is None or c.width < least):
            seeds[c.seed] = c.width
        if o.status == Status.UNDECIDED:
            pending.setdefault(key, []).append((c.seed, c.width))
    table = {}
    for key, seeds in per_seed.items():
        width = None if any(w is None for w in seeds.values()) else max(w for w in seeds.values() if w is not None)
        undecided = sorted((seed, w) for seed, w in pending.get(key, []) if width is None or w < width)
        table[key] = MinWidth(width, tuple(f"seed {seed} D={w}" for seed, w in undecided))
    return table
