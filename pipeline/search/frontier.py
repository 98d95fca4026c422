"""Which cells to train: the whole grid, or a width-frontier search that trains as few cells as it can.

A *plan* hands out cells to train (``propose``), takes each one's outcome (``record``: solved or not), and in the
end says for every cell of the grid whether it passed and whether that was measured or inferred (``outcomes``).
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
    passed: bool
    measured: bool
    reason: str = ""


class Plan(Protocol):
    """What the searcher drives (``pipeline/search/searcher.py``) and the tests drive with synthetic oracles."""

    contradictions: list[str]  # results that broke the plan's monotonicity assumptions, in words

    def propose(self) -> list[Cell]:
        """Cells to train now (may be empty while results are awaited)."""
        ...

    def record(self, cell: Cell, passed: bool) -> None:
        """A trained cell's verdict: solved or not."""
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
        self.results: dict[Cell, bool] = {}
        self.contradictions: list[str] = []

    def propose(self) -> list[Cell]:
        ready, self.pending = self.pending, []
        return ready

    def record(self, cell: Cell, passed: bool) -> None:
        self.results[cell] = passed

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
    measured: dict[tuple[int, int], bool] = field(default_factory=dict)  # (size, width index) -> solved
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
        here = {i: ok for (s, i), ok in self.measured.items() if s == self.size}
        hi = min([i for i, ok in here.items() if ok], default=len(self.widths))
        below = [i for i, ok in here.items() if not ok and i < hi]
        lo = max(below) + 1 if below else 0
        previous = self.answers.get(self.sizes[self.j - 1]) if self.j else None
        if self.trust_size_bound and previous is not None:
            lo = max(lo, min(previous, hi))
        return lo, hi

    def next_widths(self) -> list[int]:
        """Width indices to train now at this size (none while a trial of this size is running)."""
        if self.finished or self.waiting:
            return []
        lo, hi = self.bounds()
        if lo >= hi:
            return []
        previous = self.answers.get(self.sizes[self.j - 1]) if self.j else None
        here = {i for (s, i) in self.measured if s == self.size}
        if previous is not None and self.trust_size_bound and previous not in here:
            # start from the last size's answer, and measure the width below it too: the boundary is then
            # measured at every size, and a size that needs less than the last one is seen
            return [i for i in (previous, previous - 1) if i >= 0 and i not in here]
        return [(lo + hi - 1) // 2]  # bisection: the lower middle of the candidates lo..hi-1

    def record(self, width_index: int, passed: bool) -> list[str]:
        """Take one result of this size; returns the contradictions it revealed."""
        self.waiting.discard(width_index)
        self.measured[self.size, width_index] = passed
        notes = []
        previous = self.answers.get(self.sizes[self.j - 1]) if self.j else None
        if passed and previous is not None and width_index < previous and self.trust_size_bound:
            self.trust_size_bound = False
            notes.append(
                f"{self.name()}: width {self.widths[width_index]} solves size {self.size} but not the "
                f"smaller size {self.sizes[self.j - 1]}: minimum width is not monotone in size here; "
                f"searching the narrower widths of size {self.size}"
            )
        here = {i: ok for (s, i), ok in self.measured.items() if s == self.size}
        for i, ok in here.items():
            if ok and any(not ok2 and i2 > i for i2, ok2 in here.items()):
                wider = min(i2 for i2, ok2 in here.items() if not ok2 and i2 > i)
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
            lo, hi = self.bounds()
            if lo < hi:
                return
            answer = hi if hi < len(self.widths) else None
            self.answers[self.size] = answer
            self.j += 1
            if answer is None:  # nothing solves this size: nothing solves the larger ones
                for size in self.sizes[self.j :]:
                    self.answers[size] = None
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

    def record(self, cell: Cell, passed: bool) -> None:
        chain = self.chains[cell.chain]
        if cell.size != chain.size:
            raise ValueError(f"{cell} is not of the size its chain is searching ({chain.size})")
        self.contradictions += chain.record(chain.widths.index(cell.width), passed)
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
                answer = chain.answers[c.size]
                if answer is None:
                    out[c] = Outcome(
                        False,
                        False,
                        f"inferred: no width up to {chain.widths[-1]} solves size "
                        f"{min(s for s in chain.sizes if chain.answers.get(s, 0) is None)}",
                    )
                elif i >= answer:
                    out[c] = Outcome(True, False, f"inferred: width {chain.widths[answer]} solves size {c.size}")
                else:
                    out[c] = Outcome(
                        False,
                        False,
                        f"inferred: the smallest width that solves size {c.size} is {chain.widths[answer]}",
                    )
        return out


PLANS: dict[str, Callable[[Iterable[Cell]], Plan]] = {
    "grid": GridPlan,
    "frontier": FrontierPlan,
}  # sweep.search: the plan it names


def make_plan(search: str, cells: Iterable[Cell]) -> Plan:
    return PLANS[search](cells)


def min_widths(outcomes: dict[Cell, Outcome]) -> dict[tuple, int | None]:
    """(task, size, arch, depth) -> the smallest width solved by every seed (the largest of the seeds' smallest
    solved widths; under monotonicity, the smallest width at which every seed solves); None if a seed solves none.
    The same function of the outcomes in both plans, so the grid and the frontier give the same table."""
    per_seed: dict[tuple, dict[int, int | None]] = {}
    for c, o in outcomes.items():
        seeds = per_seed.setdefault((c.task, c.size, c.arch, c.depth), {})
        least = seeds.setdefault(c.seed, None)
        if o.passed and (least is None or c.width < least):
            seeds[c.seed] = c.width
    return {
        key: (None if any(w is None for w in seeds.values()) else max(w for w in seeds.values() if w is not None))
        for key, seeds in per_seed.items()
    }
