"""The rules the claims are checked by: each reads the ``Evidence`` and returns its ``Case``s, one per comparison the
paper's claim makes (a model at a length, a chain of widths across sizes), each read one way (``Reading``): held (as
the paper says), missed (against it, on a verdict of the model), undecided (it rests on a cell with no verdict yet),
not run, and for some comparisons "fails, uncontrolled" or "tells nothing". ``pipeline.reporting.claims`` turns the
cases into a verdict and its coverage.

The rules state the papers' claims and no more:
- a claim that a model is near-perfect (or solves) is refuted by that model's own converged miss at a length of the
  paper's: it needs no other model to have succeeded; a miss still open (the model still improving, diverged,
  failed) is undecided at that length, never dropped;
- a claim that a model fails or degrades is held at a length only with a positive control: a model the paper reports
  solving the task there, or the same model at a shorter length, reached the threshold under the same recipe;
  without one, the model's converged miss reads "fails, uncontrolled". A model "degrades" when its best test
  accuracy is at least ``DEGRADE_MARGIN`` below the control's (below the threshold less the margin where the
  control is the model itself), or, for a claim of chance level, within ``CHANCE_MARGIN`` of chance; one above
  that line is against the claim wherever it ran. The claim is held at a length only when every model it names ran
  there;
- a comparison compares: "matches" is the model within ``MATCH_MARGIN`` of the reference at every length both ran,
  whatever the threshold (whether each reached it is said beside);
- a width comparison at a tie at the narrowest width tried, or where neither width solved, tells nothing; a chain of
  widths across sizes reads only the sizes within the paper's range, and says which it set aside.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from pipeline.reporting.evidence import INF, CellKey, Evidence, Look, Models, Reading, width_text
from pipeline.reporting.findings import TABLE2_LAYERS, table2_at
from tasks import TASKS

CHANCE_MARGIN = 0.05  # "no better than chance": best test accuracy within this of chance
DEGRADE_MARGIN = 0.05  # "degrades", "struggles": best test accuracy at least this far below the control's
MATCH_MARGIN = DEGRADE_MARGIN  # "match": not degraded, i.e. less than this below the reference
RISE_TOLERANCE = 0.02  # "accuracy increases with width": a narrower width may be this far above a wider one
SHOWN_UNDECIDED = 2  # a case names this many undecided cells, then counts the rest


@dataclass(frozen=True)
class Case:
    """One comparison of a claim: ``subject`` (a model, or an architecture's chain of widths) on ``task`` at
    ``sizes``, its ``reading`` with ``text`` saying why; ``short_of``: what of the paper's setting a decided case
    lacks (a narrower model than the paper's); ``margin``: how far past the paper's line it landed, in accuracy
    (negative: on the other side); ``read``: the cells it read."""

    task: str
    sizes: tuple[int, ...]
    subject: str
    reading: Reading
    text: str
    short_of: str = ""
    margin: float | None = None
    read: frozenset[CellKey] = field(default=frozenset(), compare=False)

    @property
    def result(self) -> bool | None:
        return self.reading.result


@dataclass(frozen=True)
class Decision:
    """What a rule decides of one case, before the undecided cells it consulted are weighed."""

    reading: Reading
    text: str
    margin: float | None = None


def judged(ev: Evidence, task: str, sizes: tuple[int, ...], subject: str, decide: Callable[[Look], Decision]) -> Case:
    """The case ``decide`` returns reading the evidence through a ``Look`` of its own: undecided if it consulted an
    unsettled cell (the first few named) and would otherwise have decided it or read it uncontrolled."""
    look = Look(ev)
    d = decide(look)
    read = frozenset(look.read)
    if look.undecided and d.reading in (Reading.HELD, Reading.MISSED, Reading.UNCONTROLLED, Reading.UNDECIDED):
        named = [f"{cell} undecided ({why})" for cell, why in list(look.undecided.items())[:SHOWN_UNDECIDED]]
        more = len(look.undecided) - len(named)
        text = f"{d.text}: " + "; ".join(named) + (f"; and {more} more undecided cells" if more else "")
        return Case(task, sizes, subject, Reading.UNDECIDED, text, read=read)
    return Case(task, sizes, subject, d.reading, d.text, margin=d.margin, read=read)


def size_name(task: str) -> str:
    """How the task's paper names its size: n for the DP paper's problem size, N for the separations paper's length."""
    return "n" if TASKS[task].paper == "dp" else "N"


def not_run(task: str, size: int, models: Models) -> Case:
    """The case of a model the claim names that did not run at (task, size)."""
    text = f"{task} {size_name(task)}={size}: {models} {Reading.NOT_RUN}"
    return Case(task, (size,), str(models), Reading.NOT_RUN, text)


def lengths(ev: Evidence, task: str, keep: Callable[[int], bool]) -> list[int]:
    """The paper's sizes of ``task`` and those this table ran, that ``keep`` admits."""
    return sorted(s for s in {*TASKS[task].paper_sizes, *ev.sizes(task)} if keep(s))


def in_range(low: int | None, high: int | None) -> Callable[[int], bool]:
    return lambda s: (low is None or s > low) and (high is None or s <= high)


def paper_range(task: str) -> tuple[int, int]:
    sizes = TASKS[task].paper_sizes
    return sizes[0], sizes[-1]


def short_of(ev: Evidence, task: str, size: int, models: Models, paper_width: int | None) -> str:
    """ "" when ``models`` ran at ``paper_width`` (or the claim names none), else what it ran instead."""
    widest = ev.widest(task, size, models)
    if paper_width is None or widest is None or widest >= paper_width:
        return ""
    return f"{models} ran at D<={widest}, narrower than the paper's {paper_width}"


class Rule(ABC):
    """A claim's rule: called on the evidence, its cases; ``models``: every model it reads (subjects and
    controls), each checked against the registry when the report loads."""

    @abstractmethod
    def __call__(self, ev: Evidence) -> list[Case]: ...

    @abstractmethod
    def models(self) -> tuple[Models, ...]: ...


# ---- accuracy at a length ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NearPerfect(Rule):
    """Each model ``named`` reaches the threshold on ``task`` at every size in (above, upto]; its own converged
    miss at a size refutes it there."""

    task: str
    subjects: tuple[Models, ...]
    above: int | None = None
    upto: int | None = None

    def models(self) -> tuple[Models, ...]:
        return self.subjects

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for size in lengths(ev, self.task, in_range(self.above, self.upto)):
            for models in self.subjects:
                if not ev.ran(self.task, models, size):
                    cases.append(not_run(self.task, size, models))
                    continue

                cases.append(
                    judged(ev, self.task, (size,), str(models), partial(self.decide, size=size, models=models))
                )
        return cases

    def decide(self, look: Look, size: int, models: Models) -> Decision:
        text = f"{models} {size_name(self.task)}={size}: {look.accuracy(self.task, size, models)}"
        margin = look.top_accuracy(self.task, size, models) - look.threshold
        reading = look.reading(self.task, size, models)
        if reading == Reading.MISSED and look.stopped_on_validation(self.task, size, models):
            text += f", below {look.threshold:.0%} on test where every seed had held it on validation and stopped"
        elif reading == Reading.MISSED:
            text += f", converged below {look.threshold:.0%}"
        return Decision(reading, text, margin)


@dataclass(frozen=True)
class Degrades(Rule):
    """At every size > ``beyond``, each model ``failing`` stays at least DEGRADE_MARGIN below the best control that
    reached the threshold there (with ``chance``: within CHANCE_MARGIN of chance). A control is one of ``controls``
    at that size or the failing model itself at a shorter size; without one, a converged miss reads "fails,
    uncontrolled". ``paper_width``: the width the paper ran the failing models at (a narrower run decides, short
    of the paper's setting)."""

    task: str
    failing: tuple[Models, ...]
    controls: tuple[Models, ...]
    beyond: int
    paper_width: int | None = None
    chance: float | None = None

    def models(self) -> tuple[Models, ...]:
        return self.failing + self.controls

    def control(self, look: Look, size: int, models: Models) -> tuple[float, str] | None:
        """(the accuracy the model must stay a margin below, in words) from the best control that reached the
        threshold at ``size``, else from the model itself at the longest shorter size where it did; None: neither."""
        reached = [c for c in self.controls if look.reaches(self.task, size, c)]
        if reached:
            best = max(reached, key=lambda c: look.top_accuracy(self.task, size, c))
            return look.top_accuracy(self.task, size, best), f"beside {best} {look.accuracy(self.task, size, best)}"
        shorter = [s for s in look.ev.sizes(self.task) if s < size and look.ev.reached(self.task, s, models)]
        if shorter:
            return look.threshold, f"beside itself at N={shorter[-1]} {look.accuracy(self.task, shorter[-1], models)}"
        return None

    def decide(self, look: Look, size: int, models: Models, absent: list[str]) -> Decision:
        top = look.top_accuracy(self.task, size, models)
        text = f"{models} N={size}: {look.accuracy(self.task, size, models)}"
        if self.chance is not None and top >= self.chance + CHANCE_MARGIN:  # above chance: no control can help it
            return Decision(Reading.MISSED, text, self.chance + CHANCE_MARGIN - top)
        control = self.control(look, size, models)
        text += f" {control[1]}" if control else ""
        if self.chance is not None:
            line = self.chance + CHANCE_MARGIN
        else:
            line = (control[0] if control else look.threshold) - DEGRADE_MARGIN
        if top >= line:  # above the line: it did not fail, whatever the control
            return Decision(Reading.MISSED, text, line - top)
        best = look.best_accuracy(self.task, size, models)
        if absent:
            why = f"; not every model the claim names ran at N={size} ({', '.join(absent)})"
            return Decision(Reading.SILENT, text + why)
        if control is None:
            named = " or ".join(map(str, self.controls))
            why = f"; no control ({named}, or itself at a shorter N) reached {look.threshold:.0%}"
            return Decision(Reading.UNCONTROLLED, text + why)
        return Decision(Reading.HELD, text, line - best)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for size in lengths(ev, self.task, in_range(self.beyond, None)):
            absent = [str(m) for m in self.failing if not ev.ran(self.task, m, size)]
            for models in self.failing:
                if str(models) in absent:
                    cases.append(not_run(self.task, size, models))
                    continue

                decide = partial(self.decide, size=size, models=models, absent=absent)
                case = judged(ev, self.task, (size,), str(models), decide)
                gap = short_of(ev, self.task, size, models, self.paper_width) if case.reading.decided else ""
                cases.append(
                    Case(case.task, case.sizes, case.subject, case.reading, case.text, gap, case.margin, case.read)
                )
        return cases


@dataclass(frozen=True)
class Matches(Rule):
    """At every size of ``tasks`` where ``reference`` ran, each model ``named`` is within MATCH_MARGIN of it (best
    mean test accuracy), whatever the threshold; whether each reached the threshold is said beside."""

    tasks: tuple[str, ...]
    subjects: tuple[Models, ...]
    reference: Models

    def models(self) -> tuple[Models, ...]:
        return self.subjects + (self.reference,)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for task in self.tasks:
            for size in [s for s in lengths(ev, task, in_range(None, None)) if ev.ran(task, self.reference, s)]:
                for models in self.subjects:
                    if not ev.ran(task, models, size):
                        cases.append(not_run(task, size, models))
                        continue
                    cases.append(
                        judged(
                            ev,
                            task,
                            (size,),
                            str(models),
                            partial(self.decide, task=task, size=size, models=models),
                        )
                    )
        return cases

    def decide(self, look: Look, task: str, size: int, models: Models) -> Decision:
        ref, top = look.top_accuracy(task, size, self.reference), look.top_accuracy(task, size, models)
        at = ", ".join(
            f"{m} {'reached' if look.ev.reached(task, size, m) else 'did not reach'} {look.threshold:.0%}"
            for m in (self.reference, models)
        )
        text = (
            f"{task} N={size}: {models} {look.accuracy(task, size, models)} beside {self.reference} "
            f"{look.accuracy(task, size, self.reference)} ({at})"
        )
        line = ref - MATCH_MARGIN
        if top >= line:  # matched: the reference still improving could pull away
            look.consult(look.ev.unsettled_of(task, size, self.reference))
            return Decision(Reading.HELD, text, top - line)
        look.consult(look.ev.unsettled_of(task, size, models))  # below: it could still catch up
        return Decision(Reading.MISSED, text, top - line)


# ---- accuracy across widths ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccuracyRises(Rule):
    """At each size of ``task`` (in (above, upto]), the best test accuracy of ``models`` never falls by more than
    RISE_TOLERANCE from a narrower width to a wider one, and the widest is above the narrowest by more than it.
    Every width at the threshold tells nothing (no room to rise); one width, nothing."""

    task: str
    subject: Models
    above: int | None = None
    upto: int | None = None

    def models(self) -> tuple[Models, ...]:
        return (self.subject,)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for size in lengths(ev, self.task, in_range(self.above, self.upto)):
            if not ev.ran(self.task, self.subject, size):
                cases.append(not_run(self.task, size, self.subject))
                continue
            cases.append(judged(ev, self.task, (size,), str(self.subject), partial(self.decide, size=size)))
        return cases

    def decide(self, look: Look, size: int) -> Decision:
        points = look.by_width(self.task, size, self.subject)
        text = f"{self.subject} {size_name(self.task)}={size}: " + ", ".join(f"D={w} {a:.1%}" for w, a in points)
        if len(points) < 2:
            return Decision(Reading.SILENT, text + ": one width, no trend")
        accuracies = [a for _, a in points]
        if min(accuracies) >= look.threshold - 1e-9:
            return Decision(Reading.SILENT, text + f": every width at {look.threshold:.0%}, no room to rise")
        rises = all(b >= a - RISE_TOLERANCE for a, b in zip(accuracies, accuracies[1:]))
        rises = rises and accuracies[-1] > accuracies[0] + RISE_TOLERANCE
        return Decision(Reading.HELD if rises else Reading.MISSED, text)


# ---- minimum widths (the DP paper) -------------------------------------------------------------------------------
EFFICIENT = ("sparse", "linear")


def chain_sizes(ev: Evidence, task: str, arch: str, depth: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes of ``arch``'s chain at ``depth`` on ``task`` within the paper's range, and those set aside."""
    swept = [s for s in ev.sizes(task) if ev.swept(task, Models(arch, (depth,)), s)]
    low, high = paper_range(task)
    return tuple(s for s in swept if low <= s <= high), tuple(s for s in swept if not low <= s <= high)


def set_aside(task: str, sizes: tuple[int, ...]) -> str:
    if not sizes:
        return ""
    low, high = paper_range(task)
    return f" (n = {', '.join(map(str, sizes))} set aside: outside the paper's {low}-{high})"


def no_chain(depth: int) -> str:
    """What a chain with no size says: the model never ran at ``depth`` layers within the paper's sizes."""
    return f"not run at {depth} layers within the paper's sizes"


def chain_text(task: str, arch: str, depth: int, sizes: tuple[int, ...], widths: list[float]) -> str:
    chain = ", ".join(f"n={s} D={width_text(w)}" for s, w in zip(sizes, widths))
    return f"{task} d{depth} {arch}: " + (chain or no_chain(depth))


def doublings(widths: list[float]) -> float:
    """How many times the minimum width doubled from the chain's first size to its last (inf: the last unsolved)."""
    return INF if widths[-1] == INF else math.log2(widths[-1] / widths[0])


@dataclass(frozen=True)
class WidthGrows(Rule):
    """Per task and efficient architecture at ``depth``: its minimum width never shrinks as n grows, and is wider
    at the largest size than at the smallest ("the required embedding dimension increases as the problem grows";
    a width no model tried solves counts as wider than all tried). Two sizes or more within the paper's range, not
    all unsolved and not all at the narrowest width tried (the grid could not show growth)."""

    tasks: tuple[str, ...]
    depth: int

    def models(self) -> tuple[Models, ...]:
        return tuple(Models(a, (self.depth,)) for a in EFFICIENT)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for task in self.tasks:
            for arch in EFFICIENT:
                sizes, aside = chain_sizes(ev, task, arch, self.depth)
                kept, loose = controlled(ev, task, arch, self.depth, sizes)
                chain = judged(
                    ev, task, kept, arch, partial(self.decide, task=task, arch=arch, sizes=kept, aside=aside)
                )
                cases.append(chain)
                if loose:
                    text = (
                        f"{task} d{self.depth} {arch}: n = {', '.join(map(str, loose))} unsolved, where no model "
                        f"reached {ev.threshold:.0%} (the recipe is not shown to learn it)"
                    )
                    cases.append(Case(task, loose, arch, Reading.UNCONTROLLED, text))
        return cases

    def decide(self, look: Look, task: str, arch: str, sizes: tuple[int, ...], aside: tuple[int, ...]) -> Decision:
        widths = [look.min_width(task, s, arch, self.depth) for s in sizes]
        text = chain_text(task, arch, self.depth, sizes, widths) + set_aside(task, aside)
        if len(sizes) < 2:
            ran = f"n={sizes[0]} only" if sizes else no_chain(self.depth)
            why = f"{task} d{self.depth} {arch}: needs two sizes or more where a model learned it ({ran})"
            return Decision(Reading.SILENT, why + set_aside(task, aside))
        if all(w == INF for w in widths) or all(w == look.ev.narrowest(task, arch) for w in widths):
            return Decision(Reading.SILENT, text + ": no width tried shows a change")
        grows = all(a <= b for a, b in zip(widths, widths[1:])) and widths[-1] > widths[0]
        return Decision(Reading.HELD if grows else Reading.MISSED, text)


def controlled(
    ev: Evidence, task: str, arch: str, depth: int, sizes: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``sizes`` split into those a chain of minimum widths may read (``arch`` solved there, or some model did: an
    unsolved size then counts as wider than every width tried) and those where no model reached the threshold,
    which show nothing about ``arch``'s width."""
    solved = [s for s in sizes if ev.best.get((task, s, arch, depth), INF) < INF or ev.learned(task, s)]
    return tuple(solved), tuple(s for s in sizes if s not in solved)


def pairs(ev: Evidence, task: str, depth: int, arch: str) -> list[int]:
    both = Models("standard", (depth,)), Models(arch, (depth,))
    return [s for s in ev.sizes(task) if all(ev.swept(task, m, s) for m in both)]


def compare_widths(look: Look, task: str, size: int, arch: str, depth: int) -> Decision:
    """Standard's minimum width against ``arch``'s at (task, size, depth): held when standard's is strictly smaller,
    silent at a tie at the narrowest width tried or where neither solved."""
    base, other = look.min_width(task, size, "standard", depth), look.min_width(task, size, arch, depth)
    text = f"{task} n={size} d{depth}: standard D={width_text(base)}, {arch} D={width_text(other)}"
    if task == "arithmetic" and depth == TABLE2_LAYERS and (paper := table2_at(size)):
        text += f" (Table 2: standard D={paper['standard']}, {arch} D={paper[arch]})"
    if base == other == INF:
        return Decision(Reading.SILENT, text + ": neither solved")
    if base == other == look.ev.narrowest(task, arch):
        return Decision(Reading.SILENT, text + ": a tie at the narrowest width tried")
    return Decision(Reading.HELD if base < other else Reading.MISSED, text)


@dataclass(frozen=True)
class StandardNarrower(Rule):
    """At each (task, size) at ``depth``: sparse and linear each need a strictly wider model than standard. At one
    depth and length the paper's FLOP convention grows with the width alone, the same for the three models (Table 2
    back-solves all three with one formula), so on arithmetic this is also Table 2's "lowest number of flops"."""

    tasks: tuple[str, ...]
    depth: int

    def models(self) -> tuple[Models, ...]:
        return tuple(Models(a, (self.depth,)) for a in ("standard", *EFFICIENT))

    def __call__(self, ev: Evidence) -> list[Case]:
        return [
            judged(ev, task, (size,), arch, partial(compare_widths, task=task, size=size, arch=arch, depth=self.depth))
            for task in self.tasks
            for arch in EFFICIENT
            for size in pairs(ev, task, self.depth, arch)
        ]


@dataclass(frozen=True)
class StandardWithin(Rule):
    """At each size of ``tasks``, standard at ``depth`` solves at a width of at most ``width`` ("with fixed
    embedding dimensions of 128 or 256"): its own converged miss at every width up to ``width`` refutes it; a size
    it solves only wider is against it too; where it ran narrower than ``width`` only, nothing is told."""

    tasks: tuple[str, ...]
    depth: int
    width: int

    def models(self) -> tuple[Models, ...]:
        return (Models("standard", (self.depth,)),)

    def __call__(self, ev: Evidence) -> list[Case]:
        model = Models("standard", (self.depth,))
        return [
            judged(ev, task, (size,), "standard", partial(self.decide, task=task, size=size))
            for task in self.tasks
            for size in ev.sizes(task)
            if ev.swept(task, model, size)
        ]

    def decide(self, look: Look, task: str, size: int) -> Decision:
        found = look.min_width(task, size, "standard", self.depth)
        text = f"{task} n={size} d{self.depth}: standard D={width_text(found)}"
        if found <= self.width:
            return Decision(Reading.HELD, text)
        if found < INF:
            return Decision(Reading.MISSED, text)
        if (look.ev.widest(task, size, Models("standard", (self.depth,)), measured=False) or 0) < self.width:
            return Decision(Reading.SILENT, text + f": no width tried reaches {self.width}")
        return Decision(
            Reading.MISSED, text + f", converged below {look.threshold:.0%} at every width up to {self.width}"
        )


@dataclass(frozen=True)
class LocalityReduces(Rule):
    """Per efficient architecture at ``depth``: at every n both ed and ed_local ran (within the paper's range), the
    minimum width on ed_local is at most ed's, and strictly smaller at one n at least ("a reduction in necessary
    embedding size"); an n where neither solved, or both tie at the narrowest width tried, tells nothing."""

    depth: int

    def models(self) -> tuple[Models, ...]:
        return tuple(Models(a, (self.depth,)) for a in EFFICIENT)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for arch in EFFICIENT:
            model = Models(arch, (self.depth,))
            both = [s for s in ev.sizes("ed") if ev.swept("ed", model, s) and ev.swept("ed_local", model, s)]
            low, high = paper_range("ed_local")
            sizes = tuple(s for s in both if low <= s <= high)
            aside = tuple(s for s in both if not low <= s <= high)
            told = tuple(s for s in sizes if self.tells(ev, arch, s))
            silent = tuple(s for s in sizes if s not in told)
            cases.append(judged(ev, "ed_local", told, arch, partial(self.decide, arch=arch, sizes=told, aside=aside)))
            if silent and told:
                widths = "; ".join(self.pair(ev, arch, s) for s in silent)
                text = f"d{self.depth} {arch}: {widths}: neither solved, or a tie at the narrowest width tried"
                cases.append(Case("ed_local", silent, arch, Reading.SILENT, text))
        return cases

    def tells(self, ev: Evidence, arch: str, size: int) -> bool:
        """ed and ed_local differ at ``size`` as far as the grid can tell: not both unsolved, not both at the
        narrowest width tried."""
        plain, local = (ev.best.get((t, size, arch, self.depth), math.nan) for t in ("ed", "ed_local"))
        return not (plain == local == INF or plain == local == ev.narrowest("ed", arch))

    def pair(self, ev: Evidence, arch: str, size: int) -> str:
        plain, local = (ev.best.get((t, size, arch, self.depth), math.nan) for t in ("ed", "ed_local"))
        return f"n={size} ed_local D={width_text(local)}, ed D={width_text(plain)}"

    def decide(self, look: Look, arch: str, sizes: tuple[int, ...], aside: tuple[int, ...]) -> Decision:
        """Over the sizes the grid can tell (``tells``): ed_local's width at most ed's at each, smaller at one."""
        pairs = [tuple(look.min_width(t, s, arch, self.depth) for t in ("ed_local", "ed")) for s in sizes]
        shown = "; ".join(self.pair(look.ev, arch, s) for s in sizes)
        text = f"d{self.depth} {arch}" + (f": {shown}" if shown else "") + set_aside("ed_local", aside)
        if not pairs:
            return Decision(Reading.SILENT, text + ": no n shows a difference the grid can tell")
        reduces = all(a <= b for a, b in pairs) and any(a < b for a, b in pairs)
        return Decision(Reading.HELD if reduces else Reading.MISSED, text)


@dataclass(frozen=True)
class SteeperWithLessLocality(Rule):
    """Per efficient architecture at ``depth``: its minimum width grows more (doublings from the chain's first size
    to its last, within the paper's range) on the least local task, ``general``, than on each of ``local`` ("the
    growth in required embedding dimension ... becomes more pronounced as the locality decreases"). A chain with
    fewer than two sizes, or two chains unsolved at their largest size, tells nothing."""

    general: str
    local: tuple[str, ...]
    depth: int

    def models(self) -> tuple[Models, ...]:
        return tuple(Models(a, (self.depth,)) for a in EFFICIENT)

    def __call__(self, ev: Evidence) -> list[Case]:
        cases = []
        for arch in EFFICIENT:
            for other in self.local:
                sizes = chain_sizes(ev, self.general, arch, self.depth)[0]
                cases.append(judged(ev, self.general, sizes, arch, partial(self.decide, arch=arch, other=other)))
        return cases

    def decide(self, look: Look, arch: str, other: str) -> Decision:
        growth, texts = [], []
        for task in (self.general, other):
            sizes = chain_sizes(look.ev, task, arch, self.depth)[0]
            widths = [look.min_width(task, s, arch, self.depth) for s in sizes]
            texts.append(chain_text(task, arch, self.depth, sizes, widths))
            low, high = paper_range(task)
            kept = controlled(look.ev, task, arch, self.depth, sizes)[0]
            spans = bool(kept) and kept[0] == low and kept[-1] == high and len(kept) == len(sizes)
            if not spans or widths[0] == INF or any(math.isnan(w) for w in widths):
                why = f"{task} needs a chain from n={low} to n={high}, solved at the first, where a model learned each"
                return Decision(Reading.SILENT, "; ".join(texts) + f" ({why})")
            growth.append(doublings(widths))
        text = "; ".join(texts) + f": {growth[0]:g} doublings against {growth[1]:g}"
        if growth[0] == growth[1] == INF:
            return Decision(Reading.SILENT, text + ": both unsolved at their largest size")
        return Decision(Reading.HELD if growth[0] > growth[1] else Reading.MISSED, text)


@dataclass(frozen=True)
class FailsSomewhere(Rule):
    """An exception the paper names ("except for the LIS task with the Sparse Transformer"): at some size of
    ``task``, ``subject`` converged below the threshold at every width it ran, where one of ``controls`` reached
    it. One case for the whole task: held at the first such size; missed where the subject reached the threshold at
    every size of the paper's; else undecided, uncontrolled or silent, saying why."""

    task: str
    subject: Models
    controls: tuple[Models, ...]

    def models(self) -> tuple[Models, ...]:
        return (self.subject, *self.controls)

    def __call__(self, ev: Evidence) -> list[Case]:
        low, high = paper_range(self.task)
        sizes = tuple(s for s in ev.sizes(self.task) if low <= s <= high and ev.ran(self.task, self.subject, s))
        if not sizes:
            return [not_run(self.task, TASKS[self.task].paper_sizes[0], self.subject)]
        return [judged(ev, self.task, sizes, str(self.subject), partial(self.decide, sizes=sizes))]

    def decide(self, look: Look, sizes: tuple[int, ...]) -> Decision:
        texts, uncontrolled = [], False
        for size in sizes:
            reading = look.reading(self.task, size, self.subject)
            texts.append(f"n={size} {look.accuracy(self.task, size, self.subject)}")
            if reading == Reading.MISSED:
                if any(look.reaches(self.task, size, c) for c in self.controls):
                    return Decision(
                        Reading.HELD,
                        f"{self.subject} on {self.task}: "
                        + ", ".join(texts)
                        + f", converged below {look.threshold:.0%} where a control reached it",
                    )
                uncontrolled = True
        text = f"{self.subject} on {self.task}: " + ", ".join(texts)
        if uncontrolled:
            return Decision(
                Reading.UNCONTROLLED,
                text
                + f"; no control ({' or '.join(map(str, self.controls))}) reached {look.threshold:.0%} where it missed",
            )
        if look.undecided:
            return Decision(Reading.UNDECIDED, text)
        if set(TASKS[self.task].paper_sizes) <= set(sizes):
            return Decision(Reading.MISSED, text + f": it reached {look.threshold:.0%} at every n of the paper's")
        return Decision(
            Reading.SILENT, text + ": it reached the threshold wherever it ran, not at every n of the paper's"
        )


@dataclass(frozen=True)
class AllOf(Rule):
    """A claim made of parts (one-layer Transformers near-perfect up to 100 *and* struggling beyond)."""

    parts: tuple[Rule, ...]

    def models(self) -> tuple[Models, ...]:
        return tuple(m for r in self.parts for m in r.models())

    def __call__(self, ev: Evidence) -> list[Case]:
        return [case for r in self.parts for case in r(ev)]


def all_of(*rules: Rule) -> Rule:
    return AllOf(tuple(rules))


def near_perfect(task: str, named: Sequence[Models], *, above: int | None = None, upto: int | None = None) -> Rule:
    return NearPerfect(task, tuple(named), above, upto)


def degrades(
    task: str,
    failing: Sequence[Models],
    controls: Sequence[Models],
    beyond: int,
    *,
    paper_width: int | None = None,
    chance: float | None = None,
) -> Rule:
    return Degrades(task, tuple(failing), tuple(controls), beyond, paper_width, chance)


def matches(tasks: Sequence[str], named: Sequence[Models], reference: Models) -> Rule:
    return Matches(tuple(tasks), tuple(named), reference)
