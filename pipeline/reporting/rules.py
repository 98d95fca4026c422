"""The rules the claims are checked by: each reads the ``Evidence`` and returns its ``Case``s, one per comparison
the paper's claim makes (a model at a length, a chain of widths across sizes), each as the paper says (True),
against it (False) or not tested here (None) with why. ``pipeline.reporting.claims`` turns the cases into a verdict
and its coverage.

The rules state the papers' claims and no more:
- a claim that a model fails or degrades is judged at a length only where a positive control (a model the paper
  reports solving the task there) reached the threshold under the same recipe; a model "degrades" when its best
  test accuracy is at least ``DEGRADE_MARGIN`` below the control's (or, for a claim of chance level, within
  ``CHANCE_MARGIN`` of chance); it passes at a length only when every model the claim names ran there;
- a claim that a model is near-perfect fails only at a length where some model reached the threshold;
- a width comparison at a tie at the narrowest width tried, or where neither width solved, tells nothing;
- a case that consulted an undecided cell (still improving when its budget ran out) is not tested, naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from pipeline.reporting.evidence import INF, Evidence, Models, width_text
from pipeline.reporting.papers import TABLE2_LAYERS, table2_at
from tasks import TASKS

CHANCE_MARGIN = 0.05  # "no better than chance": best test accuracy within this of chance
DEGRADE_MARGIN = 0.05  # "degrades", "struggles": best test accuracy at least this far below the control's
SHOWN_UNDECIDED = 2  # a case names this many undecided cells, then counts the rest


@dataclass(frozen=True)
class Case:
    """One comparison of a claim: ``subject`` (a model, or an architecture's chain of widths) on ``task`` at
    ``sizes``; ``result`` True as the paper says, False against it, None not tested (``text`` says why);
    ``short_of``: what of the paper's setting a decided case lacks (a narrower model than the paper's);
    ``margin``: how far past the paper's line it landed, in accuracy (negative: on the other side)."""

    task: str
    sizes: tuple[int, ...]
    subject: str
    result: bool | None
    text: str
    short_of: str = ""
    margin: float | None = None


Rule = Callable[[Evidence], list[Case]]
Decision = tuple[bool | None, str] | tuple[bool | None, str, float | None]


def judged(ev: Evidence, task: str, sizes: tuple[int, ...], subject: str, decide: Callable[[], Decision]) -> Case:
    """The case ``decide`` returns, not tested if it consulted an undecided cell (the first few named)."""
    ev.undecided = {}
    result, text, *rest = decide()
    if ev.undecided:
        named = [f"{cell} undecided ({why})" for cell, why in list(ev.undecided.items())[:SHOWN_UNDECIDED]]
        more = len(ev.undecided) - len(named)
        text = "; ".join(named) + (f"; and {more} more undecided cells" if more else "")
        return Case(task, sizes, subject, None, text)
    return Case(task, sizes, subject, result, text, margin=rest[0] if rest else None)


NOT_RUN = "not run"


def not_run(task: str, size: int, models: Models) -> Case:
    """The case of a model the claim names that did not run at (task, size): not tested."""
    return Case(task, (size,), str(models), None, f"{task} N={size}: {models} {NOT_RUN}")


def lengths(ev: Evidence, task: str, keep: Callable[[int], bool]) -> list[int]:
    """The paper's sizes of ``task`` and those this table ran, that ``keep`` admits."""
    return sorted(s for s in {*TASKS[task].paper_sizes, *ev.sizes(task)} if keep(s))


def in_range(low: int | None, high: int | None) -> Callable[[int], bool]:
    return lambda s: (low is None or s > low) and (high is None or s <= high)


def short_of(ev: Evidence, task: str, size: int, models: Models, paper_width: int | None) -> str:
    """ "" when ``models`` ran at ``paper_width`` (or the claim names none), else what it ran instead."""
    widest = ev.widest(task, size, models)
    if paper_width is None or widest is None or widest >= paper_width:
        return ""
    return f"{models} ran at D<={widest}, narrower than the paper's {paper_width}"


# ---- accuracy at a length ---------------------------------------------------------------------------------------
def near_perfect(task: str, named: Sequence[Models], *, above: int | None = None, upto: int | None = None) -> Rule:
    """Each model ``named`` reaches the threshold on ``task`` at every size in (above, upto]. A model that does not
    is against the claim only at a size where some model reached it (the recipe learns the task there)."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        for size in lengths(ev, task, in_range(above, upto)):
            for models in named:
                if not ev.ran(task, models, size):
                    cases.append(not_run(task, size, models))
                    continue

                def decide(size=size, models=models) -> Decision:
                    text = f"{models} N={size}: {ev.accuracy(task, size, models)}"
                    margin = ev.top_accuracy(task, size, models) - ev.threshold
                    if ev.reaches(task, size, models):
                        return True, text, margin
                    if ev.learned(task, size):
                        return False, text + f", where another model reached {ev.threshold:.0%}", margin
                    return None, f"{text}: no model reached {ev.threshold:.0%} (the recipe is not shown to learn it)"

                cases.append(judged(ev, task, (size,), str(models), decide))
        return cases

    return rule


def degrades(
    task: str,
    failing: Sequence[Models],
    controls: Sequence[Models],
    beyond: int,
    *,
    paper_width: int | None = None,
    chance: float | None = None,
) -> Rule:
    """At every size > ``beyond``, each model ``failing`` stays at least DEGRADE_MARGIN below the best control that
    reached the threshold there (with ``chance``: within CHANCE_MARGIN of chance). A size no control reached tests
    nothing; a model that does not degrade is against the claim wherever it ran, but the claim passes at a size only
    when every model it names ran there. ``paper_width``: the width the paper ran the failing models at (a narrower
    run decides, short of the paper's setting)."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        for size in lengths(ev, task, in_range(beyond, None)):
            absent = [str(m) for m in failing if not ev.ran(task, m, size)]
            for models in failing:
                if str(models) in absent:
                    cases.append(not_run(task, size, models))
                    continue

                def decide(size=size, models=models, absent=absent) -> Decision:
                    reached = [c for c in controls if ev.reaches(task, size, c)]
                    if not reached:
                        named = " or ".join(map(str, controls))
                        return None, f"N={size}: no control ({named}) reached {ev.threshold:.0%}"
                    control = max(reached, key=lambda c: ev.top_accuracy(task, size, c))
                    line = ev.top_accuracy(task, size, control) - DEGRADE_MARGIN
                    if chance is not None:
                        line = chance + CHANCE_MARGIN
                    top = ev.top_accuracy(task, size, models)
                    text = (
                        f"{models} N={size}: {ev.accuracy(task, size, models)} beside {control} "
                        f"{ev.accuracy(task, size, control)}"
                    )
                    if top >= line:  # already above the line: undecided cells could only raise it
                        return False, text, line - top
                    best = ev.best_accuracy(task, size, models)
                    if absent:
                        return None, text + f"; not every model the claim names ran at N={size} ({', '.join(absent)})"
                    return best < line, text, line - best

                case = judged(ev, task, (size,), str(models), decide)
                gap = short_of(ev, task, size, models, paper_width) if case.result is not None else ""
                cases.append(Case(case.task, case.sizes, case.subject, case.result, case.text, gap, case.margin))
        return cases

    return rule


def matches(tasks: Sequence[str], named: Sequence[Models], reference: Models) -> Rule:
    """At every size of ``tasks`` where ``reference`` reaches the threshold, every model ``named`` does too."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        for task in tasks:
            for size in lengths(ev, task, in_range(None, None)):
                for models in named:
                    if not ev.ran(task, models, size):
                        cases.append(not_run(task, size, models))
                        continue

                    def decide(task=task, size=size, models=models) -> Decision:
                        if not ev.reaches(task, size, reference):
                            return None, f"{task} N={size}: {reference} did not reach {ev.threshold:.0%}"
                        text = (
                            f"{task} N={size}: {models} {ev.accuracy(task, size, models)} beside {reference} "
                            f"{ev.accuracy(task, size, reference)}"
                        )
                        margin = ev.top_accuracy(task, size, models) - ev.threshold
                        return bool(ev.reaches(task, size, models)), text, margin

                    cases.append(judged(ev, task, (size,), str(models), decide))
        return cases

    return rule


# ---- minimum widths (the DP paper) -------------------------------------------------------------------------------
EFFICIENT = ("sparse", "linear")


def chain_sizes(ev: Evidence, task: str, arch: str, depth: int) -> tuple[int, ...]:
    return tuple(s for s in ev.sizes(task) if ev.swept(task, Models(arch, (depth,)), s))


def chain_text(task: str, arch: str, depth: int, sizes: tuple[int, ...], widths: list[float]) -> str:
    return f"{task} d{depth} {arch}: " + ", ".join(f"n={s} D={width_text(w)}" for s, w in zip(sizes, widths))


def width_grows(tasks: Sequence[str], depth: int) -> Rule:
    """Per task and efficient architecture at ``depth``: its minimum width never shrinks as n grows, and is wider
    at the largest size than at the smallest ("the required embedding dimension increases as the problem grows";
    a width no model tried solves counts as wider than all tried). Two sizes or more, not all unsolved and not all
    at the narrowest width tried (the grid could not show growth)."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        for task in tasks:
            for arch in EFFICIENT:

                def decide(task=task, arch=arch) -> Decision:
                    sizes = chain_sizes(ev, task, arch, depth)
                    widths = [ev.min_width(task, s, arch, depth) for s in sizes]
                    text = chain_text(task, arch, depth, sizes, widths)
                    if len(sizes) < 2:
                        ran = f"n={sizes[0]} only" if sizes else f"not run at {depth} layers"
                        return None, f"{task} d{depth} {arch}: needs two sizes or more ({ran})"
                    if all(w == INF for w in widths) or all(w == ev.narrowest(task, arch) for w in widths):
                        return None, text + ": no width tried shows a change"
                    grows = all(a <= b for a, b in zip(widths, widths[1:])) and widths[-1] > widths[0]
                    return grows, text

                cases.append(judged(ev, task, chain_sizes(ev, task, arch, depth), arch, decide))
        return cases

    return rule


def pairs(ev: Evidence, task: str, depth: int, arch: str) -> list[int]:
    both = Models("standard", (depth,)), Models(arch, (depth,))
    return [s for s in ev.sizes(task) if all(ev.swept(task, m, s) for m in both)]


def compare_widths(ev: Evidence, task: str, size: int, arch: str, depth: int) -> Decision:
    """Standard's minimum width against ``arch``'s at (task, size, depth): True when standard's is strictly smaller,
    None at a tie at the narrowest width tried or where neither solved."""
    base, other = ev.min_width(task, size, "standard", depth), ev.min_width(task, size, arch, depth)
    text = f"{task} n={size} d{depth}: standard D={width_text(base)}, {arch} D={width_text(other)}"
    if task == "arithmetic" and depth == TABLE2_LAYERS and (paper := table2_at(size)):
        text += f" (Table 2: standard D={paper['standard']}, {arch} D={paper[arch]})"
    if base == other == INF:
        return None, text + ": neither solved"
    if base == other == ev.narrowest(task, arch):
        return None, text + ": a tie at the narrowest width tried"
    return base < other, text


def standard_narrower(tasks: Sequence[str], depth: int) -> Rule:
    """At each (task, size) at ``depth``: sparse and linear each need a strictly wider model than standard. At one
    depth and length the paper's FLOP convention grows with the width alone, the same for the three models (Table 2
    back-solves all three with one formula), so on arithmetic this is also Table 2's "lowest number of flops"."""

    def rule(ev: Evidence) -> list[Case]:
        return [
            judged(ev, task, (size,), arch, partial(compare_widths, ev, task, size, arch, depth))
            for task in tasks
            for arch in EFFICIENT
            for size in pairs(ev, task, depth, arch)
        ]

    return rule


def standard_within(tasks: Sequence[str], depth: int, width: int) -> Rule:
    """At each size of ``tasks``, standard at ``depth`` solves at a width of at most ``width`` ("with fixed
    embedding dimensions of 128 or 256"); not solving there is against the claim only where a model of any
    architecture solved the size, and only when standard ran at ``width`` or wider."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        model = Models("standard", (depth,))
        for task in tasks:
            for size in [s for s in ev.sizes(task) if ev.swept(task, model, s)]:

                def decide(task=task, size=size) -> Decision:
                    found = ev.min_width(task, size, "standard", depth)
                    text = f"{task} n={size} d{depth}: standard D={width_text(found)}"
                    if found <= width:
                        return True, text
                    if found < INF:
                        return False, text
                    if (ev.widest(task, size, model, measured=False) or 0) < width:
                        return None, text + f": no width tried reaches {width}"
                    if not ev.learned(task, size):
                        return None, f"{text}: no model reached {ev.threshold:.0%} (the recipe is not shown to learn)"
                    return False, text + f", where another model reached {ev.threshold:.0%}"

                cases.append(judged(ev, task, (size,), "standard", decide))
        return cases

    return rule


def locality_reduces(depth: int) -> Rule:
    """Per efficient architecture at ``depth``: at every n both ed and ed_local ran, the minimum width on ed_local
    is at most ed's, and strictly smaller at one n at least ("a reduction in necessary embedding size"); an n where
    neither solved, or both tie at the narrowest width tried, tells nothing."""

    def rule(ev: Evidence) -> list[Case]:
        cases = []
        for arch in EFFICIENT:
            model = Models(arch, (depth,))
            sizes = tuple(s for s in ev.sizes("ed") if ev.swept("ed", model, s) and ev.swept("ed_local", model, s))

            def decide(arch=arch, sizes=sizes) -> Decision:
                told, texts = [], []
                for size in sizes:
                    plain, local = (ev.min_width(t, size, arch, depth) for t in ("ed", "ed_local"))
                    texts.append(f"n={size} ed_local D={width_text(local)}, ed D={width_text(plain)}")
                    if not (plain == local == INF or plain == local == ev.narrowest("ed", arch)):
                        told.append((local, plain))
                text = f"d{depth} {arch}: " + "; ".join(texts)
                if not told:
                    return None, text + ": no n shows a difference the grid can tell"
                return all(a <= b for a, b in told) and any(a < b for a, b in told), text

            cases.append(judged(ev, "ed_local", sizes, arch, decide))
        return cases

    return rule


def all_of(*rules: Rule) -> Rule:
    """A claim made of parts (one-layer Transformers near-perfect up to 100 *and* struggling beyond)."""
    return lambda ev: [case for r in rules for case in r(ev)]
