"""Which cells to train: the whole grid (``GridPlan``), or a width-frontier search that trains as few cells as it
can (``FrontierPlan``, ``sweep.search.strategy: frontier``).

A *plan* hands out cells (``propose``), takes each one's verdict (``record``: solved, unsolved or undecided; a
diverged or failed cell counts as unsolved) and in the end says how every cell of the grid ended, measured or
inferred (``outcomes``). Plans know nothing of Ray or training: ``pipeline.search.searcher`` drives one, the tests
drive them with synthetic accuracy oracles.

The frontier finds each chain's (task, architecture, depth, seed) smallest solved width per size, taking it as
non-decreasing in width and in size: bisection at the smallest size, then each next size starts from the last
answer and the width below it (or, with ``sweep.search.predict``, from a predicted interval). An undecided cell bounds
nothing; a contradiction of the assumptions is reported and settled by training more; every answer rests on
measured trials at its boundary. Chains move on as their own trials end, not in waves. The rules in full, with
the predictions and the spare-slot proposals: docs/verdicts-and-search.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.common.cell import Cell
from pipeline.common.status import Status


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
    """What the searcher drives (``pipeline.search.searcher``) and the tests drive with synthetic oracles."""

    contradictions: list[str]  # results that broke the plan's monotonicity assumptions, in words

    @property
    def misses(self) -> list[str]:
        """Predictions a probe proved wrong, in words."""
        ...

    def propose(self, spare: int = 0) -> list[Cell]:
        """Cells to train now (may be empty while results are awaited); with ``spare`` > 0 slots that would
        otherwise idle, up to that many more that are useful but could wait."""
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
        self.misses: list[str] = []

    def propose(self, spare: int = 0) -> list[Cell]:
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
    predicted: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # size -> (lo, hi, source)
    begun: set[int] = field(default_factory=set)  # sizes predicted (or found unpredictable) already
    misses: list[str] = field(default_factory=list)

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

    def start(self) -> tuple[int, int] | None:
        """The interval [lo, hi] of width indices this size starts from: the prediction, or the last size's answer
        (the size bound) when there is none; lo = hi = len(widths) predicts that no width solves."""
        if self.size in self.predicted:
            lo, hi, _ = self.predicted[self.size]
            return lo, hi
        previous = self.size_bound()
        return None if previous is None else (previous, previous)

    def size_bound(self) -> int | None:
        """The last size's answer (a width index), while m(size) >= m(previous size) is trusted."""
        return self.answers.get(self.sizes[self.j - 1]) if self.j and self.trust_size_bound else None

    def next_widths(self, spare: bool = False) -> list[int]:
        """Width indices to train now at this size (none while a trial of this size is running, unless ``spare``:
        then the next width of the narrower half beside the running one)."""
        if self.finished:
            return []
        candidates = [i for i in self.candidates() if i not in self.waiting]
        if not candidates or (self.waiting and not spare):
            return []
        here = self.here()
        start = self.start()
        if start is not None and not here and not self.waiting:
            # the interval's ends: hi should solve, the width below lo should not; the boundary is then measured at
            # every size, and a size that needs less than the last one is seen
            lo, hi = start
            return [i for i in (hi, lo - 1) if 0 <= i < len(self.widths)]
        if self.waiting:  # spare: the narrower half's next width, in a bisection (not beside a prediction's probes)
            if start is not None:
                return []
            below = [i for i in candidates if i < min(self.waiting)]
            return [below[(len(below) - 1) // 2]] if below else []
        return [candidates[(len(candidates) - 1) // 2]]  # bisection: the lower middle of the candidates

    def record(self, width_index: int, status: Status) -> list[str]:
        """Take one result of this size; returns the contradictions it revealed."""
        self.waiting.discard(width_index)
        self.measured[self.size, width_index] = status
        if self.size in self.predicted:
            lo, hi, source = self.predicted[self.size]
            wrong = (width_index >= hi and status == Status.UNSOLVED) or (width_index < lo and status == Status.SOLVED)
            if wrong:
                predicted = "none" if lo == len(self.widths) else "-".join(str(self.widths[i]) for i in {lo, hi})
                self.misses.append(
                    f"{self.name()}: size {self.size} predicted from {source} to need width {predicted}, but width "
                    f"{self.widths[width_index]} is {status}: bisecting from what was measured"
                )
                del self.predicted[self.size]
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

    def answer_width(self, size: int) -> int | None:
        """The minimum width found at ``size`` (None: no width solves it)."""
        answer = self.answers[size]
        return None if answer is None else self.widths[answer]

    def interval(self, known: list[int | None]) -> tuple[int, int] | None:
        """[lo, hi] width indices spanning other models' minimum widths at this size (None: no width solved them;
        all None predicts that none solves here), kept at or above the last size's answer."""
        if not known:
            return None
        top = len(self.widths)
        index = [top if w is None else next((i for i, own in enumerate(self.widths) if own >= w), top) for w in known]
        lo, hi = min(index), max(index)
        return self.bounded(lo, min(hi, top - 1) if lo < top else top)

    def trend(self) -> tuple[int, int] | None:
        """[lo, hi] width indices around the line through the chain's earlier answers on log axes (least squares,
        never falling): the widths just below and above it. None with fewer than two answers."""
        points = [(math.log(n), math.log(self.widths[a])) for n, a in self.answers.items() if a is not None]
        if len(points) < 2 or not self.j:
            return None
        mx, my = (sum(p[k] for p in points) / len(points) for k in (0, 1))
        spread = sum((x - mx) ** 2 for x, _ in points)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / spread) if spread else 0.0
        width = math.exp(my + slope * (math.log(self.size) - mx))  # w = e^my (n / e^mx)^slope
        lo = max([i for i, w in enumerate(self.widths) if w <= width * (1 + 1e-9)], default=0)
        hi = next((i for i, w in enumerate(self.widths) if w >= width * (1 - 1e-9)), len(self.widths) - 1)
        return self.bounded(lo, hi)

    def bounded(self, lo: int, hi: int) -> tuple[int, int]:
        """A predicted interval kept at or above the last size's answer while the size bound holds."""
        previous = self.size_bound()
        if previous is not None:
            lo, hi = max(lo, previous), max(hi, previous)
        return lo, max(lo, hi)

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


PREDICTORS = (
    "seeds",
    "sizes",
    "neighbours",
)  # sweep.search.predict: the sources a frontier predicts from, most trusted first


class FrontierPlan:
    """Per chain, the smallest solved width at every size (see the module docstring)."""

    def __init__(self, cells: Iterable[Cell], predict: Sequence[str] = ()):
        unknown = set(predict) - set(PREDICTORS)
        if unknown:
            raise ValueError(f"unknown prediction sources {sorted(unknown)}; allowed: {', '.join(PREDICTORS)}")
        self.cells = list(cells)
        self.predict = [p for p in PREDICTORS if p in predict]
        grouped: dict[tuple, tuple[set, set]] = {}
        for c in self.cells:
            sizes, widths = grouped.setdefault(c.chain, (set(), set()))
            sizes.add(c.size)
            widths.add(c.width)
        self.chains = {key: Chain(key, sorted(s), sorted(w)) for key, (s, w) in grouped.items()}
        self.first_seed = {key[:3]: min(k[3] for k in self.chains if k[:3] == key[:3]) for key in self.chains}
        self.contradictions: list[str] = []

    @property
    def misses(self) -> list[str]:
        return [m for chain in self.chains.values() for m in chain.misses]

    def propose(self, spare: int = 0) -> list[Cell]:
        ready = []
        for chain in self.chains.values():
            chain.settle()
            if not self.awaits_first_seed(chain):
                ready += self.take(chain, self.begin(chain).next_widths())
        for chain in sorted(self.chains.values(), key=lambda c: bool(c.waiting)):  # idle chains first
            if len(ready) >= spare:
                break
            if self.awaits_first_seed(chain):
                ready += self.take(chain, self.begin(chain).next_widths())
            elif chain.waiting:
                ready += self.take(chain, chain.next_widths(spare=True))
        return ready

    def take(self, chain: Chain, widths: list[int]) -> list[Cell]:
        chain.waiting.update(widths)
        task, arch, depth, seed = chain.key
        return [Cell(task, chain.size, arch, chain.widths[i], depth, seed) for i in widths]

    def begin(self, chain: Chain) -> Chain:
        """Predicts the chain's size once, when it is first asked for trials of it."""
        if not chain.finished and chain.size not in chain.begun:
            chain.begun.add(chain.size)
            prediction = self.prediction(chain)
            if prediction is not None:
                chain.predicted[chain.size] = prediction
        return chain

    def awaits_first_seed(self, chain: Chain) -> bool:
        """A later seed's size that the first seed has not answered yet, not begun."""
        if "seeds" not in self.predict or chain.finished or chain.size in chain.begun:
            return False
        first = self.chains[(*chain.key[:3], self.first_seed[chain.key[:3]])]
        return first is not chain and chain.size not in first.answers

    def prediction(self, chain: Chain) -> tuple[int, int, str] | None:
        """(lo, hi, source) of this size's minimum width index, from the first source that knows something."""
        task, arch, depth, seed = chain.key
        for source in self.predict:
            if source == "seeds":
                interval = chain.interval(self.answers_at(chain, lambda k: k[:3] == chain.key[:3]))
            elif source == "sizes":
                interval = chain.trend()
            else:
                interval = chain.interval(
                    self.answers_at(chain, lambda k: k[0] == task and k[3] == seed and (k[1] == arch or k[2] == depth))
                )
            if interval is not None:
                return (*interval, source)
        return None

    def answers_at(self, chain: Chain, related: Callable[[tuple], bool]) -> list[int | None]:
        """The minimum widths the other related chains found at this chain's size."""
        return [
            c.answer_width(chain.size)
            for k, c in self.chains.items()
            if k != chain.key and related(k) and chain.size in c.answers
        ]

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


def make_plan(search: str, cells: Iterable[Cell], predict: Sequence[str] = ()) -> Plan:
    """The plan ``sweep.search.strategy`` names (grid or frontier; the config allows no other)."""
    return FrontierPlan(cells, predict) if search == "frontier" else GridPlan(cells)


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
